"""The Node.js runtime under the CDK's Python bindings (jsii).

jsii prints an eleven-line banner, as raw Python byte strings, every time it starts on a Node.js
release past its support window (Node 20 since 2026-10-30). The pinned aws-cdk-lib still runs on
Node 20 (the whole test suite passes there), so the banner is swapped for one plain line that says
what to do. Call before the first `import aws_cdk`; the jsii process inherits the environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess

# The oldest Node.js major that jsii supports without the end-of-life banner.
OLDEST_SUPPORTED_NODE = 22
SILENCE_VARIABLE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"


def node_major() -> int | None:
    node = shutil.which("node")
    if node is None:
        return None
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
        return int(version.strip().lstrip("v").split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def quiet_end_of_life_banner() -> str | None:
    """Silence jsii's banner for an out-of-support Node.js; returns the one-line note to show
    instead (None when Node.js is supported or the user set the variable already)."""
    if SILENCE_VARIABLE in os.environ:
        return None
    major = node_major()
    if major is None or major >= OLDEST_SUPPORTED_NODE:
        return None
    os.environ[SILENCE_VARIABLE] = str(major)
    return (
        f"note: Node.js {major} is past jsii's support window; the pinned CDK works with it, "
        f"but install Node.js {OLDEST_SUPPORTED_NODE} or newer before upgrading aws-cdk-lib"
    )
