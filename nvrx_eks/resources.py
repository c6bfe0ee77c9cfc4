"""Where the project's files are: the Jinja templates (package data) and the checkout.

The templates are the package nvrx_eks.templates (pyproject maps it onto the repository's
templates/ folder), so `nvrx-eks render` finds them the same way from a wheel and from the
editable checkout install. A few commands drive the CDK app and need the checkout itself (cdk.json,
node_modules, the Dockerfile's build context): they find it with `checkout_root()`, which says how
to fix it when absent.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from nvrx_eks.facts.errors import ConfigError

#: The repository root when running from a checkout (editable install or PYTHONPATH); the
#: site-packages folder when installed from a wheel, which has no cdk.json.
_SOURCE_ROOT = Path(__file__).resolve().parents[1]


def templates_dir() -> Path:
    """The folder of Jinja templates for the job manifests."""
    folder = importlib.resources.files("nvrx_eks.templates")
    # Wheels and editable installs both keep package data as plain files; Jinja's FileSystemLoader
    # needs a folder on disk, which a zipped install would not have.
    if not isinstance(folder, Path):
        raise RuntimeError(f"nvrx_eks.templates is not a folder on disk ({folder!r}); install the wheel unzipped")
    return folder


def checkout_root() -> Path:
    """The repository checkout that holds cdk.json, for commands that run the CDK app."""
    if not (_SOURCE_ROOT / "cdk.json").is_file():
        raise ConfigError(
            f"this command needs the nvrx-eks repository checkout (cdk.json, app.py, node_modules), "
            f"but this nvrx-eks is installed in {_SOURCE_ROOT}; run the one of a repository clone "
            f"instead (`make setup` there, then `.venv/bin/nvrx-eks`)"
        )
    return _SOURCE_ROOT
