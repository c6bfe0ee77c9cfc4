"""Where the repository checkout is, for the commands that need it rather than the installed
package: the CDK app (cdk.json, app.py, node_modules) and the trainer image's build context.
Ground floor, so the CDK app's image construct and the operator's commands read one answer.
"""

from __future__ import annotations

from pathlib import Path

from nvrx_eks.facts.errors import ConfigError

#: The repository root when running from a checkout (editable install or PYTHONPATH); the
#: site-packages folder when installed from a wheel, which has no cdk.json.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def checkout_root() -> Path:
    """The repository checkout that holds cdk.json, for commands that run the CDK app."""
    if not (_SOURCE_ROOT / "cdk.json").is_file():
        raise ConfigError(
            f"this command needs the nvrx-eks repository checkout (cdk.json, app.py, node_modules), "
            f"but this nvrx-eks is installed in {_SOURCE_ROOT}; run the one of a repository clone "
            f"instead (`make setup` there, then `.venv/bin/nvrx-eks`)"
        )
    return _SOURCE_ROOT
