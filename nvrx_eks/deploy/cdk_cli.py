"""The CDK CLI's environment and command line, stated once for every way the project runs the CDK.

`make synth` (through `python -m nvrx_eks.deploy.cdk_cli synth ...`), `nvrx-eks teardown`
(`cdk destroy`) and app.py itself (the CDK's Python bindings, jsii) all start Node.js programs
that would otherwise call home or print banners:
- the CDK CLI checks npm for a newer version and sends telemetry; both are off, so an offline
  synth stays offline and quiet;
- jsii prints an eleven-line banner, as raw Python byte strings, every time it starts on a
  Node.js release past its support window (Node 20 since 2026-10-30). The pinned aws-cdk-lib still
  runs on Node 20 (the whole test suite passes there), so the banner is swapped for one plain
  line that says what to do. The jsii process inherits the environment, so the variable must be
  set before the first `import aws_cdk`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path

from nvrx_eks.facts.checkout import checkout_root
from nvrx_eks.facts.errors import ConfigError
from nvrx_eks.facts.exit_codes import EXIT_CONFIG_ERROR

#: The oldest Node.js major that jsii supports without the end-of-life banner.
OLDEST_SUPPORTED_NODE = 22
#: jsii reads it as a comma-separated list of Node.js majors whose banner to skip.
SILENCE_VARIABLE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"
#: No npm version check and no telemetry: `cdk` runs offline here.
CLI_ENVIRONMENT = {"CDK_DISABLE_VERSION_CHECK": "1", "CDK_DISABLE_CLI_TELEMETRY": "true"}


def node_major() -> int | None:
    node = shutil.which("node")
    if node is None:
        return None
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
        return int(version.strip().lstrip("v").split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def silence_end_of_life_banner(environ: MutableMapping[str, str]) -> str | None:
    """Set the silence variable in `environ` for an out-of-support Node.js; returns the one-line
    note to show instead (None when Node.js is supported or the variable is set already)."""
    if SILENCE_VARIABLE in environ:
        return None
    major = node_major()
    if major is None or major >= OLDEST_SUPPORTED_NODE:
        return None
    environ[SILENCE_VARIABLE] = str(major)
    return (
        f"note: Node.js {major} is past jsii's support window; the pinned CDK works with it, "
        f"but install Node.js {OLDEST_SUPPORTED_NODE} or newer before upgrading aws-cdk-lib"
    )


def quiet_end_of_life_banner() -> str | None:
    """For this process, before `import aws_cdk`: see silence_end_of_life_banner."""
    return silence_end_of_life_banner(os.environ)


def cdk_environment() -> dict[str, str]:
    """The environment of a `cdk` process: ours plus CLI_ENVIRONMENT and the jsii silence, with
    this interpreter's bin directory first on PATH, because cdk.json runs `python3 app.py`."""
    env = {**os.environ, **CLI_ENVIRONMENT}
    silence_end_of_life_banner(env)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def cdk_argv(*args: str) -> list[str]:
    """`cdk ARGS...` with the CDK CLI that `make setup` installed into the checkout."""
    return [str(checkout_root() / "node_modules" / ".bin" / "cdk"), *args]


def run_command(argv: list[str]) -> int:
    """Run a `cdk` command line from the checkout in the CDK environment; returns its exit status."""
    return subprocess.call(argv, cwd=checkout_root(), env=cdk_environment())


def main() -> int:
    """`python -m nvrx_eks.deploy.cdk_cli ARGS...`: `cdk ARGS...` as the project runs it."""
    try:
        return run_command(cdk_argv(*sys.argv[1:]))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR


if __name__ == "__main__":
    sys.exit(main())
