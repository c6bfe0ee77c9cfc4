"""What the CLI says of itself, and the licence the package declares, shipped beside it."""

from __future__ import annotations

import tomllib
from importlib.metadata import version

from tests.support import REPO_ROOT
from tests.support.cli_harness import run_cli


def test_version_prints_the_package_version():
    result = run_cli("--version")
    assert result.code == 0 and result.stdout.strip() == f"nvrx-eks {version('nvrx-eks')}"


def test_the_licence_file_is_the_one_pyproject_declares():
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert declared == "Apache-2.0"
    text = (REPO_ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
