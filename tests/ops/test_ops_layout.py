"""The shape of preflight, teardown and the GPU smoke: their modules import each other one way
(lazy and TYPE_CHECKING imports count: a reader follows them too, and the smoke's modules are
copied into the trainer image together), no module of theirs is over 600 lines, and no function
in nvrx_eks/ops over 100."""

from __future__ import annotations

import ast
from pathlib import Path

import nvrx_eks.ops

OPS = Path(nvrx_eks.ops.__file__).parent
#: The modules of preflight, teardown and the GPU smoke, by the start of their names.
OWNED = ("preflight", "teardown", "still_billed", "gpu_smoke", "gpu_env", "smoke_")


def _owned() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in OPS.glob("*.py") if path.stem.startswith(OWNED)}


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The modules of `modules` (names in nvrx_eks.ops) that `tree` imports, anywhere in it."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "nvrx_eks.ops":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nvrx_eks.ops."):
            found.add(node.module.removeprefix("nvrx_eks.ops.").split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("nvrx_eks.ops.").split(".")[0] for a in node.names}
    return found & modules


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The sets of modules that reach each other (strongly connected, more than one)."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        return seen

    reached = {module: reach(module) for module in graph}
    circles = {frozenset({m} | {o for o in reached[m] if m in reached[o]}) for m in graph}
    return [set(c) for c in circles if len(c) > 1]


def test_the_modules_of_preflight_teardown_and_the_smoke_import_each_other_one_way():
    trees = _owned()
    graph = {name: _imports(tree, set(trees)) - {name} for name, tree in trees.items()}
    assert {"gpu_smoke", "smoke_report", "preflight", "teardown"} <= set(graph)
    assert _circles(graph) == []


def test_the_circle_check_sees_a_lazy_import_back():
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]
    tree = ast.parse("def f():\n    from nvrx_eks.ops.b import x\n")
    assert _imports(tree, {"b", "c"}) == {"b"}


def test_no_module_of_theirs_is_over_600_lines_and_no_function_in_ops_over_100():
    long_modules = [name for name in _owned() if len((OPS / f"{name}.py").read_text().splitlines()) > 600]
    assert long_modules == []
    long_functions = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(OPS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 100
    ]
    assert long_functions == []
