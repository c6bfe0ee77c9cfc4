"""No module over 600 lines and no function over 100 without a reason stated here: a newcomer
reads a module in one sitting and a function on one screen or two."""

from __future__ import annotations

import ast

from tests.support import REPO_ROOT
from tests.support.import_graph import own_modules

MODULE_LINES = 600
FUNCTION_LINES = 100
#: path (or path:function) -> why it may be longer.
REASONS: dict[str, str] = {}


def _paths() -> list:
    return sorted(set(own_modules().values()) | {REPO_ROOT / "app.py"})


def test_no_module_over_600_lines_without_a_reason():
    long = {
        str(path.relative_to(REPO_ROOT)): n
        for path in _paths()
        if (n := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert {name: n for name, n in long.items() if name not in REASONS} == {}


def test_no_function_over_100_lines_without_a_reason():
    long = {}
    for path in _paths():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    long[f"{path.relative_to(REPO_ROOT)}:{node.name}"] = length
    assert {name: n for name, n in long.items() if name not in REASONS} == {}
