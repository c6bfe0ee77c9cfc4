"""Every third-party package the code imports is a declared dependency: the trainer's in the
`trainer` extra (all the image installs), the operator side's in the project's dependencies; and
what the image copies imports no project code beyond what it copies, and no package beyond what
it installs."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

from nvrx_eks.facts.image_contents import CODE
from scripts.trainer_requirements import trainer_requirements
from tests.support import REPO_ROOT
from tests.support.import_graph import OWN, Import, imports_in, module_name, own_modules, python_files

#: The operator side: the CLI and its commands, the CDK app and its entry point.
OPERATOR_CODE = ("nvrx_eks", "infra", "app.py")
#: The Python modules the image copies (nvrx_eks/facts/image_contents.py).
IMAGE_FILES = tuple(path for entry in CODE for path in python_files(entry))
#: Packages the trainer extra does not install that image modules import inside functions the
#: image never calls, each with the path that does call them.
NOT_IN_THE_IMAGE = {
    "matplotlib": "the PNGs of `nvrx-eks report` (nvrx_eks/local/report.py, throughput_chart.py), "
    "drawn on the operator's machine; the GPU smoke prints tables",
}


def _imports(code: tuple[str, ...] | tuple[Path, ...]) -> list[Import]:
    """Every import statement of the code (paths relative to the checkout, or files)."""
    files = [f for part in code for f in (python_files(part) if isinstance(part, str) else [part])]
    return [statement for path in files for statement in imports_in(path)]


def _imported_modules(code: tuple[str, ...] | tuple[Path, ...]) -> set[str]:
    """Every absolute import in the code, including those inside functions (imported lazily)."""
    return {statement.module for statement in _imports(code)}


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


def _undeclared_modules(modules: set[str], requirements: list[str]) -> dict[str, list[str]]:
    """The third-party top-level modules among `modules` whose distribution is not among the requirements."""
    declared = {_requirement_name(r) for r in requirements}
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted({name.split(".")[0] for name in modules} - set(OWN) - set(sys.stdlib_module_names)):
        owners = {d.lower() for d in distributions.get(module, [])}
        if not owners & declared:
            missing[module] = sorted(owners) or ["(not installed)"]
    return missing


def _undeclared_imports(code: tuple[str, ...], requirements: list[str]) -> dict[str, list[str]]:
    """Third-party modules the code imports whose distribution is not among the requirements."""
    return _undeclared_modules(_imported_modules(code), requirements)


def test_the_image_imports_only_packages_the_trainer_extra_installs():
    """The image installs only the trainer extra: a module it copies importing another package
    when it is imported (numpy was one, for the trainer) fails in the pod. Inside a function,
    another package is allowed where a failed import is handled, or named in NOT_IN_THE_IMAGE."""
    statements = _imports(IMAGE_FILES)
    missing = _undeclared_modules({s.module for s in statements}, trainer_requirements())
    unhandled = sorted(
        f"{s.importer}:{s.line} imports {s.module}"
        for s in statements
        if s.top_level_package in missing
        and not s.guarded
        and (s.at_import_time or s.top_level_package not in NOT_IN_THE_IMAGE)
    )
    assert not unhandled, f"the image does not install what these import: {unhandled}"


def test_every_package_named_not_in_the_image_is_still_imported_by_it():
    imported = {s.top_level_package for s in _imports(IMAGE_FILES)}
    assert set(NOT_IN_THE_IMAGE) <= imported
    assert not set(NOT_IN_THE_IMAGE) & {_requirement_name(r) for r in trainer_requirements()}


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


def test_what_the_image_copies_imports_only_project_code_the_image_copies():
    """The trainer, the GPU smoke and the local runner it drives, importing any other part of
    nvrx_eks or infra (the operator side, with its CDK and Kubernetes dependencies), or a module
    whose package's __init__ the image lacks, would fail in the pod. Imports inside functions
    and under TYPE_CHECKING count: the smoke takes most of its paths lazily."""
    modules = own_modules()
    in_image = {module_name(path) for path in IMAGE_FILES}
    outside = set()
    for statement in _imports(IMAGE_FILES):
        if statement.top_level_package not in OWN:
            continue
        for module in statement.resolve(modules):
            parts = module.split(".")
            needed = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
            outside |= {(statement.importer, missing) for missing in needed - in_image}
    assert not outside, f"imports of project code the image does not copy: {sorted(outside)}"
