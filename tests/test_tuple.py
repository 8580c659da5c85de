"""DTS Entries <-> DataHub Tuple rows: tables, meta columns, update pairing, errors, the round-trip
laws (docs/tuple.md, "The laws"), pydatahub's own validation and serializers, and the file formats."""
from __future__ import annotations

import glob
import io
import json
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge import pb
from bridge.errors import BridgeError, ConversionError, TupleFormatError
from bridge.options import Options
from bridge.stream import ErrorPolicy, dts_records_to_entries
from bridge.tuple import (
    ARROW_TYPES,
    CSV_READERS,
    CSV_WRITERS,
    FIELD_CHECKS,
    FIELD_COLUMNS,
    FIELD_TYPES,
    FROM_TUPLE,
    OP_IMAGES,
    ROW_IMAGES,
    TIMESTAMP_RANGE,
    TO_TUPLE,
    TUPLE_TYPES,
    TupleDecoder,
    TupleEncoder,
    entry_to_tuples,
    load_record_schema,
    read_tuple_csv,
    read_tuple_jsonl,
    read_tuple_parquet,
    record_schema,
    tuple_type,
    tuples_to_entries,
    write_tuple_csv,
    write_tuple_jsonl,
    write_tuple_parquet,
)
from bridge.values import BOOLEAN_PROPERTY, FAMILIES, parse_column_type
from bridge.wire.framing import read_pb
from support.strategies import (
    column_names,
    data_for,
    dml_entries,
    entries,
    mysql_columns,
    parse_mysql_type,
)
from support.tuple_form import ascii_, dml, holdable, holdable_micros, text, tuple_normal_form

SAMPLES = sorted(glob.glob(str(Path(__file__).resolve().parent.parent / "samples" / "*.pb")))
META = ["_sequence_id_", "_operation_type_", "_execute_time_", "_before_image_", "_after_image_"]


# ---- helpers -------------------------------------------------------------------------------------

def i64(v):
    return pb.Data(dataType=pb.INT64, sv=str(v))


def meta(seq, op, before, after, time=1605339932000, **extra):
    return {"_sequence_id_": seq, "_operation_type_": op, "_execute_time_": time, "_before_image_": before,
            "_after_image_": after, **extra}


COLUMNS = [("id", "bigint(20)"), ("name", "varchar(20)")]
SCHEMA = record_schema([pb.Column(name=n, originalType=t) for n, t in COLUMNS])


# ---- tables --------------------------------------------------------------------------------------

def test_every_kind_has_a_tuple_type_and_converters_both_ways():
    assert set(FAMILIES.values()) == set(TUPLE_TYPES) == set(TO_TUPLE) == set(FROM_TUPLE)


def test_every_field_type_has_a_check_a_dts_column_and_csv_cells():
    for table in (FIELD_CHECKS, FIELD_COLUMNS, CSV_WRITERS, CSV_READERS, ARROW_TYPES):
        assert set(table) == set(FIELD_TYPES)
    for ftype, (original_type, props) in FIELD_COLUMNS.items():
        boolean = any(k == BOOLEAN_PROPERTY and v == "BOOLEAN" for k, v in props)
        assert tuple_type(parse_column_type(original_type, boolean)) == ftype


def test_every_dml_type_has_rows_and_every_row_kind_reads_back():
    assert set(ROW_IMAGES) == set(pb.DMLType.values())
    assert {(op, b, a): (t, "before" if img == "old" else "after")
            for t, rows in ROW_IMAGES.items() for op, b, a, img in rows} == OP_IMAGES


@pytest.mark.parametrize("type_text, expected", [
    ("tinyint(4)", "TINYINT"), ("tinyint(1)", "TINYINT"), ("tinyint(3) unsigned", "SMALLINT"),
    ("smallint(6)", "SMALLINT"), ("smallint(5) unsigned", "INTEGER"), ("mediumint(9)", "INTEGER"),
    ("mediumint(8) unsigned", "INTEGER"), ("int(11)", "INTEGER"), ("int(10) unsigned", "BIGINT"),
    ("bigint(20)", "BIGINT"), ("bigint(20) unsigned", "DECIMAL"), ("bit(1)", "BIGINT"), ("bit(63)", "BIGINT"),
    ("bit(64)", "DECIMAL"), ("year(4)", "SMALLINT"), ("float", "FLOAT"), ("double", "DOUBLE"),
    ("decimal(30,9)", "DECIMAL"), ("varchar(64)", "STRING"), ("enum('a','b')", "STRING"), ("set('x')", "STRING"),
    ("json", "STRING"), ("time(3)", "STRING"), ("binary(16)", "STRING"), ("longblob", "STRING"),
    ("geometry", "STRING"), ("date", "TIMESTAMP"), ("datetime(6)", "TIMESTAMP"), ("timestamp(3)", "TIMESTAMP"),
])
def test_field_types(type_text, expected):
    assert tuple_type(parse_column_type(type_text)) == expected


def test_boolean_property_gives_boolean():
    column = pb.Column(name="b", originalType="tinyint(1)")
    column.properties.add(key=BOOLEAN_PROPERTY, value="BOOLEAN")
    assert record_schema([column])["fields"][0] == {"name": "b", "type": "BOOLEAN"}


# ---- RecordSchema --------------------------------------------------------------------------------

def test_record_schema_data_then_meta_columns():
    names = [f["name"] for f in record_schema([pb.Column(name="id", originalType="int")],
                                              Options(source_table=True))["fields"]]
    assert names == ["id", *META, "_source_table_"]
    assert [f["type"] for f in SCHEMA["fields"]] == ["BIGINT", "STRING", "STRING", "STRING", "BIGINT",
                                                     "STRING", "STRING"]


def test_load_record_schema_accepts_json_and_lower_case():
    text = json.dumps({"fields": [{"name": "id", "type": "bigint", "comment": ""}]})
    assert load_record_schema(text) == {"fields": [{"name": "id", "type": "BIGINT"}]}
    assert load_record_schema(SCHEMA) == SCHEMA


@pytest.mark.parametrize("bad", [
    "{not json", [], {"fields": {}}, {"fields": [{"name": "", "type": "BIGINT"}]},
    {"fields": [{"name": "a", "type": "LONG"}]}, {"fields": [{"name": "a", "type": "BIGINT", "size": 3}]},
    {"fields": [{"name": "a", "type": "BIGINT"}, {"name": "A", "type": "STRING"}]},
    {"fields": [{"name": "_execute_time_", "type": "STRING"}]},
])
def test_load_record_schema_rejects(bad):
    with pytest.raises(TupleFormatError):
        load_record_schema(bad)


@given(mysql_columns(), st.booleans())
def test_every_column_set_gets_a_valid_record_schema(columns, source_table):
    options = Options(source_table=source_table)
    schema = record_schema([pb.Column(name=n, originalType=t, isKey=k) for n, t, k in columns], options)
    assert load_record_schema(json.dumps(schema)) == schema
    assert [f["name"] for f in schema["fields"]] == [n for n, _, _ in columns] + META + (
        ["_source_table_"] if source_table else [])
    assert [f["type"] for f in schema["fields"][:len(columns)]] == [
        tuple_type(parse_column_type(t)) for _, t, _ in columns]


@pytest.mark.parametrize("columns", [[("a", "int"), ("A", "int")], [("_sequence_id_", "int")]])
def test_record_schema_rejects_column_names(columns):
    with pytest.raises(ConversionError):
        record_schema([pb.Column(name=n, originalType=t) for n, t in columns])


# ---- DTS -> Tuple: meta columns ------------------------------------------------------------------

def test_insert_row():
    entry = dml(COLUMNS, pb.INSERT, [([], [i64(1), text("a")])])
    assert entry_to_tuples(entry) == [{"id": 1, "name": "a", **meta("7000000", "I", "N", "Y")}]


def test_delete_row():
    entry = dml(COLUMNS, pb.DELETE, [([i64(1), text("a")], [])])
    assert entry_to_tuples(entry) == [{"id": 1, "name": "a", **meta("7000000", "D", "Y", "N")}]


def test_update_gives_two_rows_sharing_sequence_id_and_time():
    entry = dml(COLUMNS, pb.UPDATE, [([i64(1), text("a")], [i64(1), text("b")])])
    assert entry_to_tuples(entry) == [{"id": 1, "name": "a", **meta("7000000", "U", "Y", "N")},
                                      {"id": 1, "name": "b", **meta("7000000", "U", "N", "Y")}]


def test_rows_of_one_event_take_their_index_in_the_sequence_id():
    entry = dml(COLUMNS, pb.INSERT, [([], [i64(i), text("x")]) for i in range(3)])
    assert [r["_sequence_id_"] for r in entry_to_tuples(entry)] == ["7000000", "7000001", "7000002"]


def test_source_table_option():
    entry = dml(COLUMNS, pb.INSERT, [([], [i64(1), text("a")])])
    [row] = entry_to_tuples(entry, Options(source_table=True))
    assert row["_source_table_"] == "shop.orders"


def test_datahub_facts_override_sequence_id_and_time():
    """Where and as the bridge writes them (row properties, agreeing with the header); a header's
    are the Entry's own properties, which a Tuple row cannot carry (tests/test_hostile_round2_tuple.py)."""
    entry = dml(COLUMNS, pb.INSERT, [([], [i64(1), text("a")])])
    entry.event.dmlEvent.rows[0].properties.add(key="datahub:eventTime", value="1605339932123")
    entry.event.dmlEvent.rows[0].properties.add(key="datahub:sequenceId", value="7000042")
    [row] = entry_to_tuples(entry)
    assert (row["_sequence_id_"], row["_execute_time_"]) == ("7000042", 1605339932123)


def test_na_becomes_null():
    entry = dml(COLUMNS, pb.UPDATE, [([i64(1), pb.Data(dataType=pb.NA)], [i64(1), pb.Data()])])
    assert [r["name"] for r in entry_to_tuples(entry)] == [None, None]


def test_non_dml_entries_are_counted_not_emitted():
    encoder = TupleEncoder()
    entry = pb.Entry(header=pb.Header(messageType=pb.BEGIN, seqId=1))
    entry.event.beginEvent.SetInParent()
    assert encoder.convert(entry) == []
    assert encoder.convert(dml(COLUMNS, pb.INSERT, [])) == []
    assert encoder.not_emitted == {"BEGIN": 1, "DML without rows": 1}
    assert (encoder.entries, encoder.emitted) == (0, 0)


def test_values_by_type():
    columns = [("u", "bigint(20) unsigned"), ("f", "float"), ("d", "decimal(10,2)"), ("b", "blob"),
               ("bin", "binary(2)"), ("j", "json"), ("t", "time"), ("dt", "datetime(6)"), ("ts", "timestamp"),
               ("dd", "date"), ("y", "year"), ("g", "varchar(8)")]
    values = [pb.Data(dataType=pb.UINT64, sv=str(2**64 - 1)), pb.Data(dataType=pb.FLOAT32, sv="0.5"),
              pb.Data(dataType=pb.DECIMAL, sv="-1.50"), pb.Data(dataType=pb.BYTES, bv=b"\x00\xff"),
              pb.Data(dataType=pb.STRING, charset="binary", bv=b"ab"), pb.Data(dataType=pb.BYTES, bv=b'{"a": 1}'),
              ascii_("-838:59:59"), ascii_("2021-05-17 07:22:42.123456"), ascii_("2021-05-17 07:22:42 +08:00"),
              ascii_("2021-05-17"), i64(2155), pb.Data(dataType=pb.STRING, charset="gbk", bv="中文".encode("gbk"))]
    [row] = entry_to_tuples(dml(columns, pb.INSERT, [([], values)]))
    assert {k: row[k] for k, _ in columns} == {
        "u": Decimal(2**64 - 1), "f": 0.5, "d": Decimal("-1.50"), "b": "AP8=", "bin": "YWI=", "j": '{"a": 1}',
        "t": "-838:59:59", "dt": 1621236162123456, "ts": 1621207362000000, "dd": 1621209600000000, "y": 2155,
        "g": "中文"}
    [row] = entry_to_tuples(dml(columns, pb.INSERT, [([], values)]), Options(tuple_binary="hex"))
    assert (row["b"], row["bin"]) == ("00ff", "6162")


def test_datetime_is_read_in_the_time_zone():
    entry = dml([("dt", "datetime")], pb.INSERT, [([], [ascii_("2021-05-17 08:00:00")])])
    [row] = entry_to_tuples(entry, Options(timezone="Asia/Shanghai"))
    assert row["dt"] == 1621209600000000
    [back] = tuples_to_entries([row], record_schema(entry.event.dmlEvent.columns), Options(timezone="Asia/Shanghai"),
                               table="shop.orders", columns=list(entry.event.dmlEvent.columns))
    assert back.event.dmlEvent.rows[0].newColumns[0] == ascii_("2021-05-17 08:00:00")


@pytest.mark.parametrize("type_text, data, reason", [
    ("date", ascii_("0000-00-00"), "zero or invalid date"),
    ("datetime", ascii_("0000-00-00 00:00:00"), "zero or invalid date"),
    ("date", ascii_("2021-02-30"), "zero or invalid date"),
    ("datetime", ascii_("9999-12-31 23:59:59"), "TIMESTAMP range"),
    ("double", pb.Data(dataType=pb.FLOAT64, sv="nan"), "finite"),
    ("float", pb.Data(dataType=pb.FLOAT32, sv="1e39"), "range of FLOAT"),
    ("tinyint(4)", pb.Data(dataType=pb.INT8, sv="300"), "range"),
    ("varchar(4)", pb.Data(dataType=pb.STRING, charset="utf8", bv=b"\xff\xfe"), "decode"),
    ("varchar(4)", pb.Data(dataType=pb.STRING, charset="binary", bv=b"x"), "no text decoding"),
    ("json", pb.Data(dataType=pb.BYTES, bv=b"\xff"), "UTF-8"),
])
def test_values_a_tuple_field_cannot_hold(type_text, data, reason):
    entry = dml([("id", "int"), ("c", type_text)], pb.INSERT, [([], [i64(1), data])], seq=31)
    with pytest.raises(ConversionError) as info:
        entry_to_tuples(entry, Options(zero_dates="error"))
    err = info.value
    assert reason in err.reason
    assert err.where == {"seq_id": 31, "table": "shop.orders", "column": "c"}
    assert err.value


def test_datetime_in_a_dst_gap_is_an_error():
    entry = dml([("dt", "datetime")], pb.INSERT, [([], [ascii_("2021-03-14 02:30:00")])])
    with pytest.raises(ConversionError, match="does not exist"):
        entry_to_tuples(entry, Options(timezone="America/New_York"))


def test_unknown_datatype_and_message_type_are_errors():
    with pytest.raises(ConversionError, match="unknown DataType"):
        entry_to_tuples(dml(COLUMNS, pb.INSERT, [([], [i64(1), pb.Data(dataType=99)])]))
    with pytest.raises(ConversionError, match="unknown MessageType"):
        entry_to_tuples(pb.Entry(header=pb.Header(messageType=42)))


@given(st.sampled_from(["date", "datetime", "datetime(3)", "timestamp"]).flatmap(
    lambda t: st.tuples(st.just(t), data_for(t, nullable=False, absent=False))))
def test_zero_dates_follow_the_policy_and_others_convert(case):
    """zero_dates: null (the default) writes NULL, error raises, string makes the field STRING."""
    type_text, data = case
    entry = dml([("c", type_text)], pb.INSERT, [([], [data])])
    text_ = data.bv.decode()
    micros = holdable_micros(parse_mysql_type(type_text).family, text_)
    assert entry_to_tuples(entry, Options(zero_dates="string"))[0]["c"] == text_
    if text_.startswith("0000-00-00"):
        assert entry_to_tuples(entry)[0]["c"] is None
        with pytest.raises(ConversionError, match="zero or invalid date"):
            entry_to_tuples(entry, Options(zero_dates="error"))
    elif micros is None:  # beyond DataHub's TIMESTAMP range: NULL under null, an error under error
        assert entry_to_tuples(entry)[0]["c"] is None
        with pytest.raises(ConversionError, match="TIMESTAMP range"):
            entry_to_tuples(entry, Options(zero_dates="error"))
    else:
        assert entry_to_tuples(entry)[0]["c"] == micros


# ---- Tuple -> DTS: pairing, meta columns, bad rows -----------------------------------------------

def test_update_halves_pair_into_one_row_change():
    rows = [{"id": 1, "name": "a", **meta("7000000", "U", "Y", "N")},
            {"id": 1, "name": "b", **meta("7000000", "U", "N", "Y")}]
    decoder = TupleDecoder(SCHEMA, table="shop.orders")
    assert decoder.feed(rows[0]) == []
    assert decoder.pending_rows == 1
    [entry] = decoder.feed(rows[1])
    assert entry == dml([("id", "bigint(20)"), ("name", "longtext")], pb.UPDATE,
                        [([i64(1), text("a")], [i64(1), text("b")])])
    assert decoder.finish() == []
    assert entry_to_tuples(entry) == rows


def test_after_half_first_pairs_too():
    rows = [{"id": 1, "name": "b", **meta("7000000", "U", "N", "Y")},
            {"id": 1, "name": "a", **meta("7000000", "U", "Y", "N")}]
    [entry] = tuples_to_entries(rows, SCHEMA)
    assert entry.event.dmlEvent.rows[0].oldColumns[1] == text("a")


def test_insert_and_delete_rows():
    rows = [{"id": 1, "name": None, **meta("7000000", "I", "N", "Y")},
            {"id": 2, "name": "x", **meta("8000000", "D", "Y", "N", time=1605339933000)}]
    inserted, deleted = tuples_to_entries(rows, SCHEMA, table=("shop", "orders"))
    assert inserted == dml([("id", "bigint(20)"), ("name", "longtext")], pb.INSERT, [([], [i64(1), pb.Data()])])
    assert deleted == dml([("id", "bigint(20)"), ("name", "longtext")], pb.DELETE, [([i64(2), text("x")], [])],
                          seq=8, ts=1605339933)


def test_older_excute_time_spelling_is_accepted():
    schema = {"fields": [f if f["name"] != "_execute_time_" else {"name": "_excute_time_", "type": "BIGINT"}
                         for f in SCHEMA["fields"]]}
    row = {"id": 1, "name": "a", **meta("7000000", "I", "N", "Y")}
    row["_excute_time_"] = row.pop("_execute_time_")
    [entry] = tuples_to_entries([row], schema)
    assert entry.header.timestamp == 1605339932


def test_source_table_names_the_table_and_facts_keep_what_the_header_cannot():
    schema = record_schema([pb.Column(name="id", originalType="bigint(20)")], Options(source_table=True))
    rows = [{"id": 1, **meta("7000003", "I", "N", "Y", time=1605339932123, _source_table_="db.t.x")},
            {"id": 2, **meta("9000000", "I", "N", "Y", _source_table_="plain")}]
    first, second = tuples_to_entries(rows, schema, Options(source_table=True))
    assert (first.header.schemaName, first.header.tableName, first.header.seqId) == ("db", "t.x", 7)
    assert {p.key: p.value for p in first.event.dmlEvent.rows[0].properties} == {
        "datahub:sequenceId": "7000003", "datahub:eventTime": "1605339932123"}
    assert {p.key: p.value for p in second.event.dmlEvent.rows[0].properties} == {"datahub:sourceTable": "plain"}
    encoder = TupleEncoder(Options(source_table=True))
    assert [r for e in (first, second) for r in encoder.convert(e)] == rows
    strict = list(tuples_to_entries(rows, schema, Options(strict=True, source_table=True)))
    assert all(not e.event.dmlEvent.rows[0].properties for e in strict)


def test_unpaired_update_half_is_reported_at_finish():
    decoder = TupleDecoder(SCHEMA)
    decoder.feed({"id": 1, "name": "a", **meta("7000000", "U", "Y", "N")})
    decoder.feed({"id": 1, "name": "a", **meta("7000001", "I", "N", "Y")})
    [err] = decoder.finish()
    assert isinstance(err, ConversionError) and err.count == 1
    assert err.where == {"sequence_id": "7000000", "row": 1} and "after row missing" in err.reason
    with pytest.raises(ConversionError):
        list(tuples_to_entries([{"id": 1, "name": "a", **meta("7000000", "U", "N", "Y")}], SCHEMA))


def test_pending_halves_beyond_the_limit_are_reported():
    decoder = TupleDecoder(SCHEMA, max_pending=2)
    for i in range(3):
        assert decoder.feed({"id": i, "name": "a", **meta(str(i), "U", "Y", "N")}) == []
    assert decoder.pending_rows == 2
    errors = decoder.finish()
    assert [e.where["sequence_id"] for e in errors] == ["0", "1", "2"]
    assert "within 2 rows" in errors[0].reason


@pytest.mark.parametrize("change, reason", [
    ({"id": "1"}, "BIGINT value must be an integer"),
    ({"id": True}, "BIGINT value must be an integer"),
    ({"name": 5}, "STRING value must be text"),
    ({"color": "red"}, "fields not in the RecordSchema"),
    ({"_operation_type_": "X"}, "_operation_type_ must be I, U or D"),
    ({"_operation_type_": "insert"}, "_operation_type_ must be I, U or D"),
    ({"_after_image_": "N"}, "do not fit"),
    ({"_sequence_id_": 7000000}, "_sequence_id_ must be a string of digits"),
    ({"_sequence_id_": "7e6"}, "_sequence_id_ must be a string of digits"),
    ({"_execute_time_": -1}, "epoch milliseconds"),
    ({"_execute_time_": None}, "epoch milliseconds"),
])
def test_bad_rows_name_their_row_number(change, reason):
    good = {"id": 1, "name": "a", **meta("7000000", "I", "N", "Y")}
    decoder = TupleDecoder(SCHEMA)
    decoder.feed(good)
    with pytest.raises(TupleFormatError) as info:
        decoder.feed({**good, **change})
    assert reason in info.value.reason
    assert info.value.where["row"] == 2
    with pytest.raises(TupleFormatError) as info:
        decoder.feed({**good, **change}, number=17)
    assert info.value.where["row"] == 17


def test_two_halves_of_one_kind_and_disagreeing_times_are_errors():
    before = {"id": 1, "name": "a", **meta("7000000", "U", "Y", "N")}
    decoder = TupleDecoder(SCHEMA)
    decoder.feed(before)
    with pytest.raises(TupleFormatError, match="share"):
        decoder.feed(before)
    with pytest.raises(TupleFormatError, match="disagree"):
        decoder.feed({**before, "_before_image_": "N", "_after_image_": "Y", "_execute_time_": 1})


def test_schema_without_meta_columns_and_mismatched_columns_are_rejected():
    with pytest.raises(TupleFormatError, match="meta columns"):
        TupleDecoder({"fields": [{"name": "id", "type": "BIGINT"}]})
    with pytest.raises(TupleFormatError, match="does not match"):
        TupleDecoder(SCHEMA, columns=[pb.Column(name="id", originalType="int"), pb.Column(name="name",
                                                                                         originalType="text")])
    with pytest.raises(TupleFormatError, match="do not match"):
        TupleDecoder(SCHEMA, columns=[pb.Column(name="id", originalType="bigint")])


def test_values_the_dts_column_cannot_hold_are_conversion_errors():
    columns = [pb.Column(name="id", originalType="int(10) unsigned"), pb.Column(name="name", originalType="blob")]
    schema = record_schema(columns)
    for value, reason in (({"id": -1}, "range"), ({"name": "not base64!"}, "base64")):
        row = {"id": 1, "name": "", **meta("7000000", "I", "N", "Y"), **value}
        with pytest.raises(ConversionError, match=reason):
            list(tuples_to_entries([row], schema, columns=columns))


def test_default_decimal_columns_take_the_shape_of_their_values():
    schema = {"fields": [{"name": "d", "type": "DECIMAL"}, *SCHEMA["fields"][2:]]}
    rows = [{"d": Decimal("1.5"), **meta("1", "U", "Y", "N")}, {"d": Decimal("-123.25"), **meta("1", "U", "N", "Y")},
            {"d": None, **meta("2", "I", "N", "Y")}]
    update, insert = tuples_to_entries(rows, schema)
    assert update.event.dmlEvent.columns[0].originalType == "decimal(5,2)"
    assert [r.sv for r in (update.event.dmlEvent.rows[0].oldColumns[0], update.event.dmlEvent.rows[0].newColumns[0])] \
        == ["1.50", "-123.25"]
    assert insert.event.dmlEvent.columns[0].originalType == "decimal(65,30)"
    with pytest.raises(ConversionError, match="decimal"):
        list(tuples_to_entries([{"d": Decimal("1E-31"), **meta("1", "I", "N", "Y")}], schema))


# ---- the laws ------------------------------------------------------------------------------------

tuple_options = st.builds(Options, strict=st.booleans(), source_table=st.booleans(),
                          tuple_binary=st.sampled_from(["base64", "hex"]))


@given(entries(), tuple_options)
def test_law_dts_tuple_dts(entry, options):
    entry = holdable(entry)
    rows = TupleEncoder(options).convert(entry)
    columns = list(entry.event.dmlEvent.columns)
    table = None if options.source_table else (entry.header.schemaName, entry.header.tableName)
    back = list(tuples_to_entries(rows, record_schema(columns, options), options, table=table, columns=columns))
    assert back == tuple_normal_form(entry, options, by_source=options.source_table)


def strict_normal_rows(rows: list[dict]) -> list[dict]:
    """What Tuple -> DTS -> Tuple gives in strict mode, where no `datahub:` facts travel:
    `_sequence_id_` of its event's first row (seqId 0 past 64 bits), `_execute_time_` in whole
    seconds, `_source_table_` as `db.table` once split at the first dot."""
    out = []
    for row in rows:
        seq_id = int(row["_sequence_id_"]) // 10**6
        row = {**row, "_sequence_id_": str((seq_id if seq_id < 2**64 else 0) * 10**6),
               "_execute_time_": row["_execute_time_"] // 1000 * 1000}
        if "_source_table_" in row:
            db, _, table = row["_source_table_"].partition(".")
            row["_source_table_"] = f"{db}.{table}"
        out.append(row)
    return out


@given(dml_entries(), tuple_options)
def test_law_tuple_dts_tuple_from_dts_rows(entry, options):
    """Rows the encoder writes come back equal through default DTS columns and through the original ones."""
    rows = TupleEncoder(options).convert(holdable(entry))
    columns = list(entry.event.dmlEvent.columns)
    table = (entry.header.schemaName, entry.header.tableName)
    expected = strict_normal_rows(rows) if options.strict else rows
    for given_columns in (None, columns):
        back = tuples_to_entries(rows, record_schema(columns, options), options, table=table, columns=given_columns)
        assert [r for e in back for r in TupleEncoder(options).convert(e)] == expected


FIELD_VALUES = {
    "BIGINT": st.integers(-(2**63), 2**63 - 1), "INTEGER": st.integers(-(2**31), 2**31 - 1),
    "SMALLINT": st.integers(-(2**15), 2**15 - 1), "TINYINT": st.integers(-128, 127),
    "TIMESTAMP": st.integers(-62135596800000000, TIMESTAMP_RANGE[1]),
    "DOUBLE": st.floats(allow_nan=False, allow_infinity=False),
    "FLOAT": st.floats(width=32, allow_nan=False, allow_infinity=False),
    "DECIMAL": st.builds(lambda unscaled, exponent: Decimal(f"{unscaled}E{exponent}"),
                         st.integers(-(10**34), 10**34), st.integers(-30, 3)),
    "BOOLEAN": st.booleans(), "STRING": st.text(max_size=20),
}
_SEQ = st.one_of(st.integers(0, 2**64 * 10**6 - 1).map(str), st.from_regex(r"[0-9]{1,25}", fullmatch=True))


@st.composite
def tuple_streams(draw):
    """(schema, rows): a RecordSchema of any field types and a stream of DataWorks rows for it."""
    names = draw(st.lists(column_names(), min_size=1, max_size=6, unique_by=str.casefold))
    fields = [{"name": n, "type": draw(st.sampled_from(FIELD_TYPES))} for n in names]
    with_source = draw(st.booleans())
    meta_fields = META + (["_source_table_"] if with_source else [])
    schema = {"fields": fields + [{"name": n, "type": "BIGINT" if n == "_execute_time_" else "STRING"}
                                  for n in meta_fields]}
    rows = []
    for op in draw(st.lists(st.sampled_from("IUD"), max_size=5)):
        seq, time = draw(_SEQ), draw(st.integers(0, 2**32 * 1000 - 1))
        extra = {"_source_table_": draw(st.text(max_size=10))} if with_source else {}
        halves = {"I": [("N", "Y")], "D": [("Y", "N")], "U": [("Y", "N"), ("N", "Y")]}[op]
        for before, after in halves:
            values = {f["name"]: draw(st.none() | FIELD_VALUES[f["type"]]) for f in fields}
            rows.append({**values, **meta(seq, op, before, after, time=time, **extra)})
    return schema, rows


@given(tuple_streams(), st.booleans())
def test_law_tuple_dts_tuple(stream, strict):
    schema, rows = stream
    options = Options(strict=strict, source_table=any(f["name"] == "_source_table_" for f in schema["fields"]))
    back = [r for e in tuples_to_entries(rows, schema, options) for r in TupleEncoder(options).convert(e)]
    assert back == (strict_normal_rows(rows) if strict else rows)


# ---- pydatahub: its validation and its serializers ---------------------------------------------

def _sdk_round_trips(schema: dict, rows: list[dict]) -> None:
    models = pytest.importorskip("datahub.models")
    from datahub.batch.batch_binary_record import BatchBinaryRecord
    from datahub.batch.batch_serializer import BatchSerializer
    from datahub.batch.binary_record import BinaryRecord
    from datahub.batch.utils import SchemaObject
    from datahub.models.compress import CompressFormat
    from datahub.models.params import PutRecordsRequestParams
    from datahub.models.results import GetRecordsResult

    record_schema_ = models.RecordSchema.from_json_str(json.dumps(schema))
    names = [f.name for f in record_schema_.field_list]
    records = [models.TupleRecord(schema=record_schema_, values=[row[n] for n in names]) for row in rows]
    assert [dict(zip(names, r.values)) for r in records] == rows

    # the JSON body of PutRecords, read back as a GetRecords answer
    body = json.loads(PutRecordsRequestParams(records).content())
    answer = {"NextCursor": "", "RecordCount": len(rows), "StartSeq": 0,
              "Records": [{**r, "Sequence": i, "SystemTime": 0} for i, r in enumerate(body["Records"])]}
    got = GetRecordsResult.parse_content(json.dumps(answer).encode(), {}, record_schema=record_schema_)
    assert [dict(zip(names, r.values)) for r in got.records] == rows

    # the batch binary format. pydatahub 2.29 cannot write NULL (its record conversion writes
    # str(None), or fails for numbers), so the binary records are built here: a NULL keeps its null
    # bit clear and its 8-byte slot zeroed, as the format says (the SDK leaves the slot empty)
    batch = BatchBinaryRecord()
    for row in rows:
        binary = BinaryRecord(schema=record_schema_, version_id=0)
        for i, name in enumerate(names):
            if row[name] is None:
                binary._fields[i] = bytes(8)
            else:
                binary.set_field(i, row[name])
        batch.add_record(binary)
    data = batch.serialize(CompressFormat.LZ4)
    decoded = BatchSerializer.deserialize(record_schema_, SchemaObject("p", "t", None), data)
    assert [dict(zip(names, r.values)) for r in decoded] == rows


@pytest.mark.datahub
@given(st.one_of(tuple_streams().filter(lambda s: s[1]),
                 st.tuples(dml_entries(), tuple_options).map(lambda eo: (
                     record_schema(eo[0].event.dmlEvent.columns, eo[1]), TupleEncoder(eo[1]).convert(holdable(eo[0]))))))
def test_pydatahub_accepts_and_round_trips_rows(stream):
    pytest.importorskip("datahub")
    schema, rows = stream
    _sdk_round_trips(schema, rows)


# ---- files ---------------------------------------------------------------------------------------

def _files_round_trip(tmp_path: Path, schema: dict, rows: list[dict], name: str = "rows") -> None:
    buf = io.BytesIO()
    assert write_tuple_jsonl(rows, buf) == len(rows)
    assert [r for _, r in read_tuple_jsonl(io.BytesIO(buf.getvalue()), schema)] == rows
    text_buf = io.StringIO(newline="")
    write_tuple_csv(rows, schema, text_buf)
    assert [r for _, r in read_tuple_csv(io.StringIO(text_buf.getvalue(), newline=""), schema)] == rows
    path = tmp_path / f"{name}.parquet"
    write_tuple_parquet(rows, schema, path)
    assert [r for _, r in read_tuple_parquet(path)] == rows


@given(tuple_streams())
def test_files_round_trip(tmp_path_factory, stream):
    pytest.importorskip("pyarrow")
    _files_round_trip(tmp_path_factory.mktemp("tuple"), *stream)


def test_parquet_types(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    schema = {"fields": [{"name": t.lower(), "type": t} for t in FIELD_TYPES] + [{"name": "wide", "type": "DECIMAL"}]}
    row = {"bigint": 1, "integer": 2, "smallint": 3, "tinyint": 4, "double": 0.5, "float": 0.25,
           "decimal": Decimal("1.25"), "boolean": True, "timestamp": 1621236162123456, "string": "x",
           "wide": Decimal("1E+40")}
    write_tuple_parquet([row], schema, tmp_path / "t.parquet")
    types = {f.name: f.type for f in pq.read_schema(tmp_path / "t.parquet")}
    assert types == {"bigint": pa.int64(), "integer": pa.int32(), "smallint": pa.int16(), "tinyint": pa.int8(),
                     "double": pa.float64(), "float": pa.float32(), "decimal": pa.decimal128(38, 2),
                     "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"), "string": pa.string(),
                     "wide": pa.string()}
    assert [r for _, r in read_tuple_parquet(tmp_path / "t.parquet")] == [row]


def test_csv_null_and_backslashes():
    schema = {"fields": [{"name": "s", "type": "STRING"}, {"name": "n", "type": "BIGINT"}]}
    rows = [{"s": None, "n": None}, {"s": "", "n": 1}, {"s": "\\N", "n": 2}, {"s": "\\\\x", "n": 3}]
    buf = io.StringIO(newline="")
    write_tuple_csv(rows, schema, buf)
    assert buf.getvalue() == 's,n\r\n\\N,\\N\r\n,1\r\n\\\\N,2\r\n\\\\\\x,3\r\n'
    assert [r for _, r in read_tuple_csv(io.StringIO(buf.getvalue(), newline=""), schema)] == rows


def test_readers_report_bad_input():
    schema = {"fields": [{"name": "n", "type": "BIGINT"}]}
    with pytest.raises(TupleFormatError) as info:
        list(read_tuple_jsonl(io.BytesIO(b'{"n": 1}\n\n{"n": "x"}\n'), schema))
    assert info.value.where == {"line": 3, "column": "n"}
    with pytest.raises(TupleFormatError, match="invalid JSON"):
        list(read_tuple_jsonl(io.BytesIO(b"{"), schema))
    with pytest.raises(TupleFormatError, match="header"):
        list(read_tuple_csv(io.StringIO("m\r\n1\r\n"), schema))
    with pytest.raises(TupleFormatError) as info:
        list(read_tuple_csv(io.StringIO("n\r\n1\r\nx\r\n"), schema))
    assert info.value.where == {"column": "n", "row": 2}


def _sample_tables(path: str):
    """{(table, schema JSON): rows} of a sample's Tuple output, and the errors of entries it rejects."""
    encoder, tables, errors = TupleEncoder(Options(source_table=True)), {}, []
    for _, entry in dts_records_to_entries(read_pb(path), ErrorPolicy("skip")):
        try:
            rows = encoder.convert(entry)
        except BridgeError as err:
            errors.append(err)
            continue
        if rows:
            schema = encoder.schema(entry.event.dmlEvent.columns)
            key = (f"{entry.header.schemaName}.{entry.header.tableName}", json.dumps(schema))
            tables.setdefault(key, ([], list(entry.event.dmlEvent.columns)))[0].extend(rows)
    return tables, errors


@pytest.mark.parametrize("path", SAMPLES, ids=[Path(p).stem for p in SAMPLES])
def test_samples_as_tuple_files(tmp_path, path):
    pytest.importorskip("pyarrow")
    tables, errors = _sample_tables(path)
    assert tables
    # the default policies write every sample value a Tuple field cannot hold (zero dates, MySQL's
    # largest DATETIME past DataHub's range) as NULL: no Entry is rejected
    assert errors == []
    options = Options(source_table=True)
    for index, ((table, schema_json), (rows, columns)) in enumerate(sorted(tables.items())):
        schema = json.loads(schema_json)
        _files_round_trip(tmp_path, schema, rows, f"t{index}")
        back = tuples_to_entries(rows, schema, options, columns=columns)
        assert [r for e in back for r in TupleEncoder(options).convert(e)] == rows


@pytest.mark.datahub
@pytest.mark.parametrize("path", SAMPLES, ids=[Path(p).stem for p in SAMPLES])
def test_samples_pass_pydatahub(path):
    pytest.importorskip("datahub")
    for (_, schema_json), (rows, _) in _sample_tables(path)[0].items():
        _sdk_round_trips(json.loads(schema_json), rows)


def test_read_tuple_jsonl_stops_at_a_line_over_max_line_bytes():
    """Issue 21, 4: a line longer than the limit raises LineTooLongError naming it, read past."""
    from bridge.errors import LineTooLongError
    data = io.BytesIO(b'{"a": 1}\n\n' + b'{"b": "' + b"x" * 5000 + b'"}\n{"c": 3}\n')
    rows = read_tuple_jsonl(data, max_line_bytes=1000)
    assert next(rows) == (1, {"a": 1})
    with pytest.raises(LineTooLongError, match=r"line of 5009 bytes .* \(1000\) \(line 3\)"):
        next(rows)
