"""Every numba-compiled function of harness/ and systems/ says what it computes and names
the test in this folder that holds it to its plain twin; that test calls it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

KERNELS_DIR = Path(__file__).resolve().parent


def compiled_functions() -> list[tuple[str, ast.FunctionDef]]:
    """(file, function) of every function decorated with numba's njit or jit."""
    found = []
    for package in ("harness", "systems"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and any(_is_numba(d) for d in node.decorator_list):
                    found.append((str(path.relative_to(REPO)), node))
    return found


def _is_numba(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name in ("njit", "jit")


def test_every_compiled_function_has_a_docstring_naming_a_twin_test_that_calls_it() -> None:
    kernels = compiled_functions()
    assert len(kernels) >= 23  # the 23 kernels this folder was written for, and any added since
    problems = []
    for path, node in kernels:
        doc = ast.get_docstring(node) or ""
        named = re.search(r"Twin: tests/kernels/(test_\w+\.py)", doc)
        if not named:
            problems.append(f"{path} {node.name}: no docstring line 'Twin: tests/kernels/<test file>'")
            continue
        test_file = KERNELS_DIR / named.group(1)
        if not test_file.exists() or not re.search(rf"\b{node.name}\b", test_file.read_text()):
            problems.append(f"{path} {node.name}: {named.group(1)} does not call it")
    assert not problems, "\n".join(problems)
