"""The package's layering, enforced (docs/decisions.md, "The layout").

Four checks run on `bridge/`: the import-linter contract in `.importlinter` (layers: each layer
imports only the layers below it), ruff (configured in pyproject.toml), no import circle between
any two modules (imports inside functions count: they are where circles hide) and no `_private`
name of one package used by another. A last group plants one bad import of each kind in a copy
of the package and checks that the checker catches it, so none of them can pass silently.
"""
from __future__ import annotations

import pathlib
import shutil

import pytest

from support.import_graph import (  # noqa: E402
    PACKAGE,
    ROOT,
    cycle_problems,
    find_modules,
    import_graph,
    lint_imports,
    private_name_problems,
    read_facts,
    root_import_problems,
    ruff,
)


def test_the_layers_contract_is_kept():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "broken" in run.stdout and " 0 broken" in run.stdout  # it did check (an empty run says neither)


def test_ruff_is_clean():
    run = ruff("bridge", "tests", "benchmarks", "tools")
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_import_circles():
    assert cycle_problems(ROOT / PACKAGE) == []


def test_no_import_circles_in_the_benchmarks():
    """The house, not only the package: benchmarks/run.py and spark_streaming_bench.py were one."""
    assert cycle_problems(ROOT / "benchmarks") == []


def test_nothing_imports_the_package_root():
    assert root_import_problems(ROOT / PACKAGE) == []


def test_no_private_names_across_packages():
    assert private_name_problems(ROOT / PACKAGE) == []


def test_the_graph_sees_lazy_imports():
    """The graph holds imports made inside functions (bridge.spark imports its sinks
    only in `register`), and every module of the package."""
    modules = find_modules(ROOT / PACKAGE)
    graph = import_graph(modules, read_facts(modules))
    assert {"bridge.spark.sink", "bridge.spark.kafka_sink"} <= set(graph["bridge.spark"])
    assert {"bridge.cli.main", "bridge.wire.framing", "bridge.native"} <= set(graph)


# ---- each checker catches a planted violation ---------------------------------------------------

@pytest.fixture(scope="module")
def copy_tree(tmp_path_factory):
    """Returns a function making a fresh copy of the package's Python sources (and the contract)."""
    def make() -> pathlib.Path:
        where = tmp_path_factory.mktemp("layout")
        shutil.copytree(ROOT / PACKAGE, where / PACKAGE, ignore=shutil.ignore_patterns(
            "__pycache__", "*.so", "*.c", "*.h", "*.json", "*.pyi", "py.typed"))
        shutil.copy(ROOT / ".importlinter", where / ".importlinter")
        shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
        return where
    return make


def _plant(tree: pathlib.Path, module: str, code: str) -> None:
    """`code` appended to the module's file in the copy (a new module if there is none)."""
    path = tree / (module.replace(".", "/") + ".py")
    if not path.exists() and (path.with_suffix("") / "__init__.py").exists():
        path = path.with_suffix("") / "__init__.py"
    path.write_text((path.read_text() if path.exists() else "") + "\n\n" + code + "\n")


@pytest.mark.parametrize("module, code, expected", [
    ("bridge.values", "def planted():\n    from bridge.stream import Tally\n    return Tally",
     "bridge.values -> bridge.stream"),  # upward, from inside a function
    ("bridge.datahub.sink", "from bridge.kafka import KafkaError", "bridge.datahub.sink -> bridge.kafka"),  # siblings
    ("bridge.helpers", "X = 1", "bridge.helpers"),  # a module given no layer
    ("bridge.wire.framing", "def planted():\n    import pyspark\n    return pyspark",
     "bridge.wire.framing -> pyspark"),  # the core importing pyspark
])
def test_lint_imports_catches_a_planted_import(copy_tree, module, code, expected):
    tree = copy_tree()
    _plant(tree, module, code)
    run = lint_imports(tree)
    assert run.returncode != 0
    assert expected in run.stdout + run.stderr


def test_ruff_catches_an_unused_import(copy_tree):
    tree = copy_tree()
    _plant(tree, "bridge.errors", "import json")
    run = ruff("bridge", cwd=tree)
    assert run.returncode != 0
    assert "bridge/errors.py" in run.stdout and "F401" in run.stdout


def test_the_circle_check_catches_a_lazy_circle(copy_tree):
    tree = copy_tree()
    _plant(tree, "bridge.cli.base", "def planted():\n    from bridge.cli.main import main\n    return main")
    problems = _new(cycle_problems(tree / PACKAGE), tree, cycle_problems)
    assert len(problems) == 1
    assert "bridge.cli.base -> bridge.cli.main (bridge/cli/base.py:" in problems[0]
    assert "bridge.cli.main -> bridge.cli.base (bridge/cli/main.py:" in problems[0]


def test_the_root_check_catches_an_import_from_the_root(copy_tree):
    tree = copy_tree()
    _plant(tree, "bridge.kafka", "from bridge import Options")
    _plant(tree, "bridge.cli.observe", "def planted():\n    import bridge\n    return bridge.pb")
    assert sorted(_new(root_import_problems(tree / PACKAGE), tree, root_import_problems)) == [
        "bridge.cli.observe imports the package from the package root bridge; import it from the module that "
        "defines it",
        "bridge.kafka imports the name Options from the package root bridge; import it from the module that "
        "defines it"]


def _new(problems: list[str], top: pathlib.Path, check) -> list[str]:
    """The problems a planted line adds to those of the package as it is (the ones
    test_no_private_names_across_packages reports)."""
    before = {p.split(": ", 1)[1] for p in check(ROOT / PACKAGE)}
    return [p.split(": ", 1)[1] for p in problems if p.split(": ", 1)[1] not in before]


@pytest.mark.parametrize("module, code, expected", [
    ("bridge.sync", "from bridge.cli.base import _one_line",
     "bridge.sync imports _one_line from bridge.cli.base, private to bridge.cli"),
    ("bridge.kafka", "from bridge.wire.framing import _Buffer",
     "bridge.kafka imports _Buffer from bridge.wire.framing, private to bridge.wire"),
    ("bridge.spark.tables", "from bridge.datahub.sink import DataHubWriter\nX = DataHubWriter._read",
     "bridge.spark.tables uses DataHubWriter._read, private to bridge.datahub"),
    ("bridge.cli.kafka", "def planted(writer):\n    return writer._raise_pending()",
     "bridge.cli.kafka uses ._raise_pending, which only bridge.datahub defines (private there)"),
    ("bridge.stream", "from bridge.native import _speedups",
     "bridge.stream imports _speedups from bridge.native, private to bridge.native"),
])
def test_the_private_name_check_catches_a_planted_use(copy_tree, module, code, expected):
    tree = copy_tree()
    _plant(tree, module, code)
    assert _new(private_name_problems(tree / PACKAGE), tree, private_name_problems) == [expected]


def test_a_private_name_within_one_package_is_allowed(copy_tree):
    tree = copy_tree()
    _plant(tree, "bridge.spark.tables", "from bridge.spark.jobs import _ddl as _planted_ddl\nX = _planted_ddl")
    assert _new(private_name_problems(tree / PACKAGE), tree, private_name_problems) == []


def test_an_import_for_annotations_only_is_no_circle(copy_tree):
    """`if TYPE_CHECKING:` imports never run: annotations may name a module that imports this one."""
    tree = copy_tree()
    _plant(tree, "bridge.cli.base", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bridge.cli.main import main")
    assert _new(cycle_problems(tree / PACKAGE), tree, cycle_problems) == []


@pytest.mark.parametrize("name", ["bridge.tuple.files", "bridge.spark.task", "bridge.stream.files", "bridge.stream.pipeline"])
def test_the_examples_of_the_modules_the_layout_added(name):
    import doctest
    import importlib
    module = importlib.import_module(name)
    result = doctest.testmod(module)
    assert result.attempted and result.failed == 0
