"""Where the Jinja templates are: the package nvrx_eks.templates (pyproject maps it onto the
repository's templates/ folder), so `nvrx-eks render` finds them the same way from a wheel and
from the editable checkout install. The checkout itself, which only some commands need, is
nvrx_eks/facts/checkout.py's.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path


def templates_dir() -> Path:
    """The folder of Jinja templates for the job manifests."""
    folder = importlib.resources.files("nvrx_eks.templates")
    # Wheels and editable installs both keep package data as plain files; Jinja's FileSystemLoader
    # needs a folder on disk, which a zipped install would not have.
    if not isinstance(folder, Path):
        raise RuntimeError(f"nvrx_eks.templates is not a folder on disk ({folder!r}); install the wheel unzipped")
    return folder
