"""Each MySQL type mapped once, all the way (issue 30, point 4; docs/decisions.md, "Each type
mapped once, all the way").

- Every row of the type table (`TYPES`, and any row registered since) has a generator in the
  property-test strategies (tests/support/strategies.py's `TYPE_STRATEGIES`, keyed by row), or is
  reached by the Blob strategies' foreign columns (`ROWS_FROM_ELSEWHERE`); every generator makes
  columns of the row it is filed under. A planted row without a generator is caught.
- No face keeps a table keyed by the C value kind: a row's `c_kind` is a `NativeKind`, which says
  what each face does beside C.
- The table's shapes live below its converters: no import circle between the modules of
  bridge/values, even counting imports under `if TYPE_CHECKING:`.
"""
from __future__ import annotations

import ast
import pathlib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.native.contract import Kind
from bridge.values import FOREIGN_COLUMN_TYPES, TYPES, NativeKind, parse_column_type
from bridge.values import types as type_table
from support.blob_strategies import FOREIGN_VALUES
from support.import_graph import find_modules, import_cycles, import_records, read_facts
from support.strategies import ROWS_FROM_ELSEWHERE, TYPE_STRATEGIES

ROOT = pathlib.Path(__file__).resolve().parents[1]


def rows_without_a_generator(strategies: dict = TYPE_STRATEGIES, elsewhere: dict = ROWS_FROM_ELSEWHERE) -> list[str]:
    """The kinds of the rows in use (`TYPES` and the registered ones) that no strategy generates."""
    kinds = {row.kind for row in type_table.TYPES} | {row.kind for row in type_table.rows()}
    return sorted(kinds - set(strategies) - set(elsewhere))


# ---- every row has a generator ------------------------------------------------------------------

def test_every_row_has_a_generator():
    assert rows_without_a_generator() == []
    # and every generator is for a row (a row taken out of the table leaves no stale key)
    assert set(TYPE_STRATEGIES) | set(ROWS_FROM_ELSEWHERE) == {row.kind for row in TYPES}
    assert not set(TYPE_STRATEGIES) & set(ROWS_FROM_ELSEWHERE)


def test_a_row_without_a_generator_fails(monkeypatch):
    """The check catches a planted row: one more in `TYPES`, or one registered."""
    money = replace(type_table.type_row("decimal"), kind="money", mysql_types=("money",))
    monkeypatch.setattr(type_table, "TYPES", (*TYPES, money))
    assert rows_without_a_generator() == ["money"]
    monkeypatch.undo()
    assert rows_without_a_generator() == []
    type_table.register(replace(money, kind="cash", mysql_types=("cash",)))
    try:
        assert rows_without_a_generator() == ["cash"]
        with pytest.raises(AssertionError):
            test_every_row_has_a_generator()
    finally:
        type_table.unregister("cash")
    assert rows_without_a_generator() == []
    # a generator taken out of the strategies' table is caught the same way
    assert rows_without_a_generator({k: v for k, v in TYPE_STRATEGIES.items() if k != "json"}) == ["json"]


_FILED = sorted((kind, family) for kind, families in TYPE_STRATEGIES.items() for family in families)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_FILED).flatmap(lambda kf: st.tuples(st.just(kf[0]), TYPE_STRATEGIES[kf[0]][kf[1]])))
def test_every_generator_makes_columns_of_its_row(filed):
    kind, type_text = filed
    assert parse_column_type(type_text).kind == kind


@pytest.mark.parametrize("kind, blob", sorted(ROWS_FROM_ELSEWHERE.items()))
def test_rows_from_elsewhere_are_reached_by_foreign_columns(kind, blob):
    assert blob in FOREIGN_VALUES
    type_text, properties = FOREIGN_COLUMN_TYPES[blob]
    assert parse_column_type(type_text, boolean=bool(properties)).kind == kind


# ---- no table keyed by the C kind outside the type table ------------------------------------------

@pytest.mark.parametrize("row", TYPES, ids=lambda r: r.kind)
def test_a_rows_c_kind_says_what_each_face_does(row):
    samples = {"integer": ["int(11)", "bigint(20) unsigned"], "bit": ["bit(1)", "bit(64)"]}
    for text in samples.get(row.kind, [None]):
        native = row.c_kind(parse_column_type(text)) if callable(row.c_kind) else row.c_kind
        if native is None:
            continue
        assert isinstance(native, NativeKind) and isinstance(native.kind, Kind)
        assert native.blob_type in type_table.BLOB_TYPES
        assert native.image is None or "values[name{n}] = " in native.image
        assert native.from_tuple is None or callable(native.from_tuple)


def _kind_tables(tree: ast.AST) -> list[int]:
    """Lines of dict literals keyed by `Kind.X`, and of tuple/list/set literals of two `Kind.X` or more."""
    def is_kind(node) -> bool:
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Kind"
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(is_kind(k) for k in node.keys if k is not None):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and sum(map(is_kind, node.elts)) >= 2:
            lines.append(node.lineno)
    return lines


def test_no_face_keeps_a_table_keyed_by_the_c_kind():
    """Only the contract (bridge/native/contract.py, which defines the kinds) and the type table
    name C kinds in a table; before, bridge/blob/rows.py and bridge/tuple/decode.py had their own."""
    allowed = {"bridge.native.contract", "bridge.values.types"}
    found = {name: _kind_tables(ast.parse(path.read_bytes()))
             for name, path in find_modules(ROOT / "bridge").items() if name not in allowed}
    assert {name: lines for name, lines in found.items() if lines} == {}
    assert _kind_tables(ast.parse("X = {Kind.LONG: 'LONG'}\nY = (Kind.DATE, Kind.DATETIME)\n")) == [1, 2]


# ---- the table's shapes below its converters ---------------------------------------------------

def test_no_import_circle_in_values_counting_type_checking_imports():
    modules = find_modules(ROOT / "bridge")
    facts = read_facts(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, fact in facts.items():
        edges = graph.setdefault(name, {})
        for line, target, _, _ in import_records(name, fact, modules, typing=True):
            if target != name:
                edges.setdefault(target, line)
    assert [c for c in import_cycles(graph) if any(m.startswith("bridge.values") for m in c)] == []
    # the graph does see annotation-only imports: the converters' ColumnType comes from below them
    for converter in ("bridge.values.codecs", "bridge.values.temporal", "bridge.values.tuples"):
        assert "bridge.values.columns" in graph[converter]
        assert "bridge.values.types" not in graph[converter]
