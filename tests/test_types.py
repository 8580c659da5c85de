"""The type table (bridge/values/types.py): one row per MySQL type family, complete, every column
filled, and every face (Blob, Tuple, Spark, the C plans) giving what the row says, checked through
the faces' own public functions; a registered row is all a new type needs. Also the one op ->
image table (values.DML_IMAGES) against what the converters write."""
from __future__ import annotations

import doctest
import re
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

import bridge
from bridge import pb
from bridge.blob.rows import NATIVE, native_plan
from bridge.errors import ConversionError, OptionsError
from bridge.native.contract import Kind, SinkOp
from bridge.options import Options
from bridge.spark import tuple_schema
from bridge.tuple import ARROW_TYPES, FIELD_TYPES, TupleDecoder, TupleEncoder, record_schema, tuples_to_entries
from bridge.values import (
    BLOB_TYPES,
    BOOLEAN_PROPERTY,
    DML_IMAGES,
    FAMILIES,
    OP_IMAGES,
    TYPES,
    NativeKind,
    TypeRow,
    blob_type,
    codec_for,
    native_kind,
    parse_column_type,
    spark_type,
    tuple_type,
    type_row,
)
from bridge.values import types as type_table
from bridge.values.plans import native_tuple_plan, plan_column

ROOT = Path(__file__).resolve().parent.parent

# One sample type per family and shape, with what docs/mapping.md says it becomes,
# restated here: (type text, marked BOOLEAN, kind, Blob type, Tuple field type, Spark type, C kind)
SAMPLES = [
    ("tinyint(4)", False, "integer", "LONG", "TINYINT", "tinyint", "LONG"),
    ("smallint(5) unsigned", False, "integer", "LONG", "INTEGER", "int", "LONG"),
    ("int(11)", False, "integer", "LONG", "INTEGER", "int", "LONG"),
    ("int(10) unsigned", False, "integer", "LONG", "BIGINT", "bigint", "LONG"),
    ("bigint(20)", False, "integer", "LONG", "BIGINT", "bigint", "LONG"),
    ("bigint(20) unsigned", False, "integer", "STRING", "DECIMAL", "decimal(20,0)", "DIGITS"),
    ("tinyint(1)", True, "boolean", "BOOLEAN", "BOOLEAN", "boolean", "BOOL"),
    ("bit(8)", False, "bit", "LONG", "BIGINT", "bigint", "LONG"),
    ("bit(64)", False, "bit", "STRING", "DECIMAL", "decimal(20,0)", None),
    ("year(4)", False, "year", "LONG", "SMALLINT", "smallint", "LONG"),
    ("float", False, "float", "DOUBLE", "FLOAT", "float", "DOUBLE"),
    ("double", False, "float", "DOUBLE", "DOUBLE", "double", "DOUBLE"),
    ("decimal(12,2)", False, "decimal", "STRING", "DECIMAL", "decimal(12,2)", "DECIMAL"),
    ("decimal(65,30)", False, "decimal", "STRING", "DECIMAL", "decimal(38,3)", "DECIMAL"),
    ("varchar(64)", False, "text", "STRING", "STRING", "string", "TEXT"),
    ("enum('NEW','PAID')", False, "text", "STRING", "STRING", "string", "TEXT"),
    ("binary(16)", False, "binary", "BYTES", "STRING", "string", "BASE64"),
    ("longblob", False, "bytes", "BYTES", "STRING", "string", "BASE64"),
    ("geometry", False, "bytes", "BYTES", "STRING", "string", "BASE64"),
    ("json", False, "json", "STRING", "STRING", "string", "UTF8"),
    ("date", False, "date", "DATE", "TIMESTAMP", "timestamp", "DATE"),
    ("datetime(6)", False, "datetime", "DATE", "TIMESTAMP", "timestamp", "DATETIME"),
    ("timestamp(3)", False, "timestamp", "DATE", "TIMESTAMP", "timestamp", "TIMESTAMP"),
    ("time(3)", False, "time", "STRING", "STRING", "string", "UTF8"),
]


def _column(name: str, type_text: str, boolean: bool = False) -> pb.Column:
    column = pb.Column(name=name, originalType=type_text)
    if boolean:
        column.properties.add(key=BOOLEAN_PROPERTY, value="BOOLEAN")
    return column


def _entry(columns, images, dml_type=pb.INSERT) -> pb.Entry:
    """A DML Entry of one table, one row change per image (old and new the same for an update)."""
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1621236162,
                                  seqId=16, schemaName="shop", tableName="t"))
    dml = e.event.dmlEvent
    dml.dmlEventType = dml_type
    dml.columns.extend(columns)
    for image in images:
        row = dml.rows.add()
        if dml_type != pb.INSERT:
            row.oldColumns.extend(image)
        if dml_type != pb.DELETE:
            row.newColumns.extend(image)
    return e


# ---- the table is complete ----------------------------------------------------------------------

def _mapping_md_types() -> set[str]:
    """The MySQL type names of docs/mapping.md's "Column types" table (first column)."""
    doc = (ROOT / "docs" / "mapping.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Column types"):doc.index("### Charset -> codec")]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            for token in re.findall(r"`([^`]+)`", first):
                names.add(re.sub(r"\s+unsigned$", "", re.match(r"[a-z ]+", token).group().strip()))
    return names


def test_every_mysql_type_of_the_mapping_has_a_row():
    shipped = {name for row in TYPES for name in row.mysql_types}
    assert _mapping_md_types() == shipped - {"boolean-from-datahub"}
    assert set(FAMILIES) == shipped
    assert len({row.kind for row in TYPES}) == len(TYPES)
    # docs/mapping.md's families ("Column types"), each a row
    assert {"integer", "boolean", "bit", "year", "float", "decimal", "text", "binary", "bytes", "json", "date",
            "datetime", "timestamp", "time"} == {row.kind for row in TYPES}


@pytest.mark.parametrize("row", TYPES, ids=lambda r: r.kind)
def test_every_row_has_every_column(row: TypeRow):
    assert type_table.ROW_COLUMNS == ("kind", "mysql_types", "datatype", "charset", "blob_type", "codec",
                                      "tuple_type", "to_tuple", "from_tuple", "spark_type", "c_kind", "need_bv")
    assert row.mysql_types and all(isinstance(name, str) and name for name in row.mysql_types)
    assert row.datatype is None or 0 < row.datatype < pb.NA
    assert row.charset in ("", "utf8mb4", "binary")
    assert row.blob_type in BLOB_TYPES or callable(row.blob_type)
    assert row.tuple_type in FIELD_TYPES or callable(row.tuple_type)
    assert isinstance(row.spark_type, str) or callable(row.spark_type)
    assert isinstance(row.c_kind, NativeKind) or callable(row.c_kind)  # a C kind and what the faces do beside it
    for factory in (row.codec, row.to_tuple, row.from_tuple):
        assert callable(factory)
    assert isinstance(row.need_bv, bool)
    assert type_row(row.kind) is row


def test_every_sample_family_is_sampled():
    assert {kind for _, _, kind, *_ in SAMPLES} == {row.kind for row in TYPES}


# ---- every face gives what the row says ----------------------------------------------------------

@pytest.mark.parametrize("type_text, boolean, kind, blob, field, spark, c_kind", SAMPLES)
def test_every_face_agrees_with_the_row(type_text, boolean, kind, blob, field, spark, c_kind):
    column = _column("v", type_text, boolean)
    ct = parse_column_type(type_text, boolean)
    assert ct.kind == kind and ct.row is type_row(kind)
    # the row's lookups say what docs/mapping.md says
    assert (blob_type(ct), tuple_type(ct), spark_type(ct)) == (blob, field, spark)
    assert (native_kind(ct).name if native_kind(ct) is not None else None) == c_kind
    # Blob: the codec and the schema of a message
    assert codec_for(column).blob_type == blob
    msg = bridge.entry_to_blob(_entry([column], [[pb.Data(dataType=pb.NIL)]]), Options(strict=True))[0]
    assert msg["schema"]["dataColumn"] == [{"name": "v", "type": blob}]
    # Tuple: the RecordSchema; Spark: the output DDL of dts_to_tuple
    schema = record_schema([column])
    assert schema["fields"][0] == {"name": "v", "type": field}
    assert tuple_schema(schema, [column]).startswith(f"`v` {spark.upper()}, ")
    # Spark -> Tuple and Arrow: the Spark type gives the field type back, and Parquet's Arrow type of
    # the field is the Spark type's (a DECIMAL's scale comes from the values in Parquet)
    assert type_table.field_type_of_spark("v", spark) == field
    arrow = type_table.arrow_type(spark, pa)
    if field == "DECIMAL":
        assert (arrow.precision, arrow.scale) == tuple(int(n) for n in spark[len("decimal("):-1].split(","))
        assert ARROW_TYPES[field](pa) == type_table.arrow_type("decimal", pa) == pa.decimal128(38, 0)
    else:
        assert ARROW_TYPES[field](pa) == arrow
    # C: the Plan column both plans start from, and whether each plan takes the column
    planned = plan_column("v", ct, utc=True)
    assert (planned.kind.name if planned is not None else None) == c_kind
    if planned is not None:
        assert (planned.datatype, planned.charset) == (ct.canonical_datatype(), type_row(kind).charset)
    if NATIVE:
        assert (native_plan(["v"], [codec_for(column)], True) is None) == (c_kind is None)
        assert (native_tuple_plan(["v"], [ct], [field], True, False) is None) == (c_kind is None)


def test_every_field_type_has_a_spark_and_an_arrow_type():
    """SPARK_TYPES and ARROW_TYPES_OF_SPARK are the one Spark and Arrow map: every field type's Spark
    type has an Arrow type, and the Spark type gives the field type back."""
    assert set(type_table.SPARK_TYPES) == set(FIELD_TYPES)
    for field, spark in type_table.SPARK_TYPES.items():
        assert spark in type_table.ARROW_TYPES_OF_SPARK
        assert type_table.field_type_of_spark("v", spark) == field
    with pytest.raises(OptionsError, match=r"column 'tags' has Spark type array<string>, which no "
                       r"DataHub field type matches; pass schema="):
        type_table.field_type_of_spark("tags", "array<string>", "; pass schema=")


def test_faces_follow_the_options_the_row_reads():
    ct = parse_column_type("decimal(12,2)")
    assert blob_type(ct, Options(decimal="double")) == "DOUBLE"
    assert codec_for(_column("v", "decimal(12,2)"), Options(decimal="double")).blob_type == "DOUBLE"
    if NATIVE:  # C writes decimals as digits only: a DOUBLE decimal column is the codec's
        assert native_plan(["v"], [codec_for(_column("v", "decimal(12,2)"), Options(decimal="double"))], True) is None
        assert native_plan(["v"], [codec_for(_column("v", "datetime(3)"))], False) is None  # C reads UTC only
    assert plan_column("v", parse_column_type("datetime(3)"), utc=False) is None


# ---- adding a type is one row ----------------------------------------------------------------------

def test_a_registered_row_is_all_a_new_type_needs():
    """A made-up MySQL type `money`, mapped by one row (a copy of decimal's), is converted by every
    face as a decimal(10,2) column is: Blob (C and Python), Tuple, Spark and the C plan choice."""
    money = replace(type_row("decimal"), kind="money", mysql_types=("money",))
    with pytest.raises(ConversionError, match="unknown MySQL column type"):
        parse_column_type("money(10,2)")
    type_table.register(money)
    try:
        ct = parse_column_type("money(10,2)")
        assert ct.kind == "money" and ct.row is money
        column, twin = _column("m", "money(10,2)"), _column("m", "decimal(10,2)")
        assert codec_for(column).blob_type == "STRING"
        assert codec_for(column).to_blob(pb.Data(dataType=pb.DECIMAL, sv="4553.10")) == "4553.10"
        assert record_schema([column]) == record_schema([twin])
        assert tuple_schema(record_schema([column]), [column]).startswith("`m` DECIMAL(10,2), ")
        assert plan_column("m", ct, utc=True).kind == Kind.DECIMAL
        images = [[pb.Data(dataType=pb.DECIMAL, sv="4553.10")], [pb.Data(dataType=pb.DECIMAL, sv="-0.5")],
                  [pb.Data(dataType=pb.NIL)]]
        for options in (Options(), Options(strict=True)):
            got = bridge.BlobEncoder(options).convert_lines(_entry([column], images), _entry([column], images)
                                                            .SerializeToString())
            want = bridge.BlobEncoder(options).convert_lines(_entry([twin], images))
            assert [line.replace(b"money(10,2)", b"decimal(10,2)") for line in got] == want
        rows = TupleEncoder().convert(_entry([column], images))
        assert rows == TupleEncoder().convert(_entry([twin], images))
        [back] = tuples_to_entries(rows[:1], record_schema([column]), table="shop.t", columns=[column])
        assert back.event.dmlEvent.rows[0].newColumns[0] == images[0][0]
    finally:
        type_table.unregister("money")
    with pytest.raises(ConversionError, match="unknown MySQL column type"):
        parse_column_type("money(10,2)")
    assert type_row("decimal").mysql_types == ("decimal", "numeric", "dec", "fixed")


# ---- the op -> image table ---------------------------------------------------------------------

@pytest.mark.parametrize("dml_type", sorted(DML_IMAGES))
def test_every_converter_writes_the_ops_and_images_of_the_table(dml_type):
    images = DML_IMAGES[dml_type]
    column = _column("id", "bigint(20)")
    entry = _entry([column], [[pb.Data(dataType=pb.INT64, sv="7")]], dml_type)
    messages = bridge.entry_to_blob(entry)
    assert [(m["payload"]["op"], [k for k in ("before", "after") if k in m["payload"]]) for m in messages] \
        == [(i.op, [i.image]) for i in images]
    [back] = bridge.blob_to_entries(messages)
    assert back.event.dmlEvent.dmlEventType == dml_type
    rows = TupleEncoder().convert(entry)
    assert [(r["_operation_type_"], r["_before_image_"], r["_after_image_"]) for r in rows] \
        == [(i.tuple_op, i.before_flag, i.after_flag) for i in images]
    decoder = TupleDecoder(record_schema([column]), table="shop.t")
    [again] = [e for row in rows for e in decoder.feed(row)]
    assert again.event.dmlEvent.dmlEventType == dml_type
    assert [bool(getattr(again.event.dmlEvent.rows[0], i.field)) for i in images] == [True] * len(images)


def test_the_ops_are_in_the_order_of_the_c_sinks_op_codes():
    assert list(OP_IMAGES) == [op.name for op in SinkOp]


# ---- the docstrings' examples ---------------------------------------------------------------------

@pytest.mark.parametrize("module", ["bridge.values", "bridge.values.types", "bridge.values.ops",
                                    "bridge.values.events", "bridge.values.temporal", "bridge.values.charsets",
                                    "bridge.values.plans", "bridge.blob.rows"])
def test_doctests(module):
    import importlib
    assert doctest.testmod(importlib.import_module(module)).failed == 0
