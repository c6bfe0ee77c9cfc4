"""The project's imports as its source states them (read with ast, nothing imported): every import
statement of a module, including those inside functions and under TYPE_CHECKING, which hide
circles and layer crossings from a run but not from a reader.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO_ROOT

#: Our own top-level packages: never third-party.
OWN = ("nvrx_eks", "infra", "workloads")


@dataclass(frozen=True)
class Import:
    """One import statement of one module."""

    importer: str
    #: The module named, made absolute (`from . import x` in a.b gives a.b or a).
    module: str
    #: The names a `from` import takes (each may be a submodule).
    names: tuple[str, ...]
    line: int
    #: Runs when the importer is imported: not inside a function, not under `if TYPE_CHECKING`.
    at_import_time: bool
    #: Inside a `try` that catches ImportError (or ModuleNotFoundError): a missing package is handled.
    guarded: bool

    @property
    def top_level_package(self) -> str:
        return self.module.split(".")[0]

    def resolve(self, modules: dict[str, Path]) -> set[str]:
        """The modules among `modules` this statement loads: a `from` import's names that are
        submodules, else the deepest module the dotted name reaches."""
        submodules = {f"{self.module}.{name}" for name in self.names} & modules.keys()
        if submodules:
            return submodules
        name = self.module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return {name} if name else set()


def python_files(relative: str) -> list[Path]:
    """The .py files of a path relative to the checkout (one file, or a folder's, recursively)."""
    path = REPO_ROOT / relative
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def own_modules() -> dict[str, Path]:
    """Every module of our packages, by dotted name."""
    return {module_name(path): path for package in OWN for path in python_files(package)}


def imports_in(path: Path, importer: str | None = None) -> list[Import]:
    """The import statements of the module at `path` (named `importer`, by default its dotted name
    in the checkout)."""
    importer = importer or module_name(path)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, deferred: bool, guarded: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(importer, alias.name, (), node.lineno, not deferred, guarded))
            return
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            names = tuple(alias.name for alias in node.names)
            found.append(Import(importer, module, names, node.lineno, not deferred, guarded))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            deferred = True
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True, guarded)
            for child in node.orelse:
                visit(child, deferred, guarded)
            return
        if isinstance(node, (ast.Try, ast.TryStar)) and any(_catches_import_error(h) for h in node.handlers):
            for child in node.body:
                visit(child, deferred, True)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, deferred, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, deferred, guarded)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError") for t in caught)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the other modules of ours it imports}, every import statement counted."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for statement in imports_in(path):
            if statement.top_level_package in OWN:
                targets |= statement.resolve(modules)
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found
