"""Every third-party package the code imports is a declared dependency: the trainer's in the
`trainer` extra (all the image installs), the operator side's in the project's dependencies; and
the trainer imports no project code beyond what the image copies."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

from scripts.trainer_requirements import trainer_requirements
from tests.support import REPO_ROOT

#: Our own top-level packages: never third-party.
OWN = ("nvrx_eks", "infra", "workloads")
#: What the image copies of the project itself (workloads/Dockerfile): the trainer and the ground
#: floor of facts it reads.
IMAGE_PACKAGES = ("workloads", "nvrx_eks.facts")
#: The operator side: the CLI and its commands, the CDK app and its entry point.
OPERATOR_CODE = ("nvrx_eks", "infra", "app.py")


def _python_files(relative: str) -> list[Path]:
    path = REPO_ROOT.joinpath(*relative.split(".")) if not relative.endswith(".py") else REPO_ROOT / relative
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _imported_modules(relative: str) -> set[str]:
    """Every absolute import in the code, including those inside functions (imported lazily)."""
    names = set()
    for path in _python_files(relative):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return names


def _requirement_name(requirement: str) -> str:
    return re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0].lower()


def _project_requirements() -> list[str]:
    """The dependencies a plain `pip install nvrx-eks` brings, with the extras they name."""
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    requirements = []
    for requirement in project["dependencies"]:
        if _requirement_name(requirement) == project["name"]:
            extras = re.search(r"\[(.*)\]", requirement)
            for extra in extras.group(1).split(",") if extras else []:
                requirements += project["optional-dependencies"][extra.strip()]
        else:
            requirements.append(requirement)
    return requirements


def _undeclared_imports(code: tuple[str, ...], requirements: list[str]) -> dict[str, list[str]]:
    """Third-party modules the code imports whose distribution is not among the requirements."""
    declared = {_requirement_name(r) for r in requirements}
    distributions = importlib.metadata.packages_distributions()
    modules = {name.split(".")[0] for part in code for name in _imported_modules(part)}
    missing = {}
    for module in sorted(modules - set(OWN) - set(sys.stdlib_module_names)):
        owners = {d.lower() for d in distributions.get(module, [])}
        if not owners & declared:
            missing[module] = sorted(owners) or ["(not installed)"]
    return missing


def test_trainer_extra_declares_every_package_the_trainer_imports():
    """The image installs only the trainer extra: a module workloads/ imports from a package it
    does not declare would be missing there (numpy was)."""
    missing = _undeclared_imports(IMAGE_PACKAGES, trainer_requirements())
    assert not missing, f"the trainer imports packages the trainer extra does not declare: {missing}"


def test_project_dependencies_declare_every_package_the_operator_side_imports():
    """A wheel installed elsewhere brings only what pyproject declares: a module the CLI or the CDK
    app imports only because another package happens to pull it in (botocore, urllib3) is declared."""
    missing = _undeclared_imports(OPERATOR_CODE, _project_requirements())
    assert not missing, f"the operator side imports packages pyproject does not declare: {missing}"


@pytest.mark.parametrize("module", ["torch", "kubernetes"])
def test_the_import_check_sees_an_undeclared_package(module):
    """The check is live: without the requirement that declares it, an imported package is reported."""
    requirements = [r for r in _project_requirements() if _requirement_name(r) != module]
    assert module in _undeclared_imports(OPERATOR_CODE, requirements)


def test_the_trainer_imports_only_project_code_the_image_copies():
    """The image copies workloads/ and nvrx_eks/facts/ only: the trainer importing any other part of
    nvrx_eks or infra (the operator side, with its CDK and Kubernetes dependencies) would fail in the pod."""
    for package in IMAGE_PACKAGES:
        own = {n for n in _imported_modules(package) if n.split(".")[0] in OWN}
        outside = {n for n in own if not any(n == p or n.startswith(p + ".") for p in IMAGE_PACKAGES)}
        assert not outside, f"{package} imports project code the image does not copy: {sorted(outside)}"
