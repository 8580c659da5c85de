"""The Python <-> C contract: bridge/native/contract.py against the C build and the protobuf schema.

The C units define the shared numbers once in bridge/native/src/speedups.h and export them as
`_speedups.CONTRACT` (with the tuple layouts as `LAYOUTS` and the protobuf schema C walks as
`SCHEMA`); contract.py defines them once for Python. Each side is checked against the other and
against subscribe_pb2's descriptors, so a .proto change that C misses fails here. The stub
`_speedups.pyi` is checked against the built module's names.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from bridge.native import contract
from bridge.tuple import TIMESTAMP_RANGE
from bridge.values import OP_IMAGES
from bridge.wire import subscribe_pb2

speedups = pytest.importorskip("bridge.native._speedups")
STUB = Path(contract.__file__).with_name("_speedups.pyi")
MESSAGES = subscribe_pb2.DESCRIPTOR.message_types_by_name
ENUMS = subscribe_pb2.DESCRIPTOR.enum_types_by_name

_VARINT_TYPES = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
                 FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM}


def test_the_c_build_exports_contract_py_numbers():
    c_side, py_side = speedups.CONTRACT, contract.c_constants()
    assert {k: c_side.get(k) for k in py_side if c_side.get(k) != py_side[k]} == {}
    assert sorted(set(c_side) - set(py_side)) == []  # a C number contract.py does not know


def test_the_c_build_reads_tuples_as_contract_py_lays_them_out():
    assert speedups.LAYOUTS == contract.LAYOUTS


def test_plan_columns_and_charset_entries_are_what_c_parses():
    """A PlanColumn is what Plan() takes (one field more is refused), the charset table rows are
    CharsetEntries, and the Sink op codes are the DML ops of values.OP_IMAGES in order (the names
    bridge/spark/jobs.py's op column takes by code)."""
    from bridge.values.plans import charset_table
    column = contract.PlanColumn("id", contract.Kind.LONG, subscribe_pb2.INT64, -9, 9, "", 0, False)
    assert speedups.Plan([column]).columns() == 1
    with pytest.raises(TypeError):
        speedups.Plan([(*column, contract.Out.SAME, 0)])
    with pytest.raises(ValueError):  # a Blob plan's column says no Tuple output
        speedups.Plan([column._replace(out=contract.Out.HEX)])
    assert speedups.Plan([column._replace(out=contract.Out.DECIMAL, kind=contract.Kind.DIGITS)], False,
                         __import__("decimal").Decimal).columns() == 1
    rows = [contract.CharsetEntry(*row) for row in charset_table()]
    assert {row.mode for row in rows} <= set(contract.CharsetMode)
    assert [op.name for op in contract.SinkOp] == list(OP_IMAGES)


@pytest.mark.parametrize("path", sorted(contract.PROTO_FIELDS))
def test_field_numbers_are_subscribe_protos(path):
    message, field = path.split(".")
    assert MESSAGES[message].fields_by_name[field].number == contract.PROTO_FIELDS[path]


def test_enum_numbers_are_subscribe_protos():
    datatypes = ENUMS["DataType"].values_by_name
    assert (datatypes["NIL"].number, datatypes["NA"].number) == (contract.NIL, contract.NA)
    assert max(v.number for v in datatypes.values()) == contract.NA  # C reads a larger dataType as unknown
    assert {v.name: v.number for v in ENUMS["DMLType"].values} == {m.name: int(m) for m in contract.DmlType}
    assert ENUMS["MessageType"].values_by_name["DML"].number == contract.MT_DML
    assert TIMESTAMP_RANGE[1] == contract.TUPLE_TS_HI


def _kind(field) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return field.message_type.name
    if field.type == FieldDescriptor.TYPE_STRING:
        return "string"
    if field.type == FieldDescriptor.TYPE_BYTES:
        return "bytes"
    assert field.type in _VARINT_TYPES, f"{field.full_name}: a wire type C does not model"
    return "varint"


def test_the_schema_c_walks_is_subscribe_protos():
    """Every message C knows (all but the framing's Envelope), field for field, with its kind: a
    field added to the .proto and not to wire.c's table makes known_fields() wrong, and fails here."""
    protobuf = {name: tuple(sorted((f.number, _kind(f)) for f in message.fields))
                for name, message in MESSAGES.items() if name != "Envelope"}
    assert {name: tuple(sorted(fields)) for name, fields in speedups.SCHEMA.items()} == protobuf


# ---- the stub ----------------------------------------------------------------------------------------

def _stub() -> tuple[dict[str, ast.AST], dict[str, set[str]]]:
    tree = ast.parse(STUB.read_text())
    names, members = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)
                                  and not n.name.startswith("__")}
            members[node.name] |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                                   and isinstance(n.target, ast.Name)}
    return names, members


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_the_stub_names_what_the_module_has():
    names, members = _stub()
    assert {n for n in names if not n.startswith("_")} == _public(speedups)
    for cls in ("Plan", "Sink", "TupleSink", "Merge"):
        assert members[cls] == _public(getattr(speedups, cls)) - _public(object), cls


def _doc_parameters(doc: str, name: str) -> list[str] | None:
    """The parameter names a C docstring's `name(a, b[, c])` line gives, or None (no signature)."""
    match = re.match(rf"{name}\(([^)]*)\)", doc or "")
    if match is None:
        return None
    return [re.match(r"\w+", p.strip(" []")).group(0) for p in match.group(1).replace("[", ",").split(",")
            if p.strip(" []")]


def _stub_parameters(node: ast.FunctionDef) -> list[str]:
    args = node.args.posonlyargs + node.args.args
    return [a.arg for a in args if a.arg != "self"]


def test_the_stub_takes_the_arguments_the_docstrings_name():
    names, _ = _stub()
    tree = {n.name: n for n in ast.parse(STUB.read_text()).body if isinstance(n, ast.ClassDef)}
    functions = [(speedups, names[n]) for n in _public(speedups) if isinstance(names[n], ast.FunctionDef)]
    for cls in ("Plan", "Sink", "TupleSink", "Merge"):
        functions += [(getattr(speedups, cls), f) for f in tree[cls].body
                      if isinstance(f, ast.FunctionDef) and not f.name.startswith("__")]
    checked = 0
    for owner, node in functions:
        expected = _doc_parameters(getattr(owner, node.name).__doc__, node.name)
        if expected is not None:
            assert _stub_parameters(node) == expected, node.name
            checked += 1
    assert checked >= 12
