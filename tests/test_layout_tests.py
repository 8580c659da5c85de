"""The test suite's own layout: test modules share code only through tests/support/ and the fixtures
of tests/conftest.py, never by importing each other (an import of a test module runs its module-level
code, collects its tests twice under some import modes, and hides which helpers are shared).

Checked with `ast` on every Python file under tests/, imports inside functions included.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every module an `import` or `from ... import` may load: `import a.b` gives
    a.b; `from a import b` gives a.b (b may be a module), relative ones keep their dots."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found += [(node.lineno, f"{base}.{alias.name}" if node.module else base + alias.name)
                      for alias in node.names]
    return sorted(found)


def imports_of_test_modules(source: str) -> list[str]:
    """The imports of `source` that reach a test module (test_*) or conftest, as 'line N: name'."""
    bad = []
    for line, name in imported_modules(source):
        parts = name.lstrip(".").split(".")
        if any(part.startswith("test_") or part == "conftest" for part in parts if part):
            bad.append(f"line {line}: {name}")
    return bad


def test_no_test_module_imports_another():
    offences = {}
    for path in sorted(TESTS.rglob("*.py")):
        found = imports_of_test_modules(path.read_text(encoding="utf-8"))
        if found:
            offences[str(path.relative_to(TESTS))] = found
    assert not offences, ("move what these import into tests/support/ (fixtures into tests/conftest.py): "
                          f"{offences}")


def test_shared_code_lives_in_support():
    """tests/ itself holds test modules and conftest.py only; shared code is a tests/support/ module."""
    loose = sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py")
    assert not loose, f"move {loose} into tests/support/"


def test_the_check_finds_each_form_of_import():
    source = "\n".join([
        "import test_sync",
        "from test_sync_tables import build_stream",
        "import os, test_laws as laws",
        "def f():",
        "    from test_spark_pipeline import kill_loop",
        "from support.strategies import entries",
        "from . import conftest",
        "import bridge.tuple",
    ])
    assert imports_of_test_modules(source) == ["line 1: test_sync", "line 2: test_sync_tables.build_stream",
                                           "line 3: test_laws", "line 5: test_spark_pipeline.kill_loop",
                                           "line 7: .conftest"]
