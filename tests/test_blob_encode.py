"""DTS Entry -> DataHub Blob messages (docs/mapping.md).

* Golden files: every committed sample stream (`samples/*.pb`) converted in lossless and strict
  mode, rendered one line per message in the compact expected-row style of Flink's CDC formats
  (`tests/golden/NAME.lossless.txt`, `NAME.strict.txt`), plus the exact bytes of every lossless
  message (`NAME.blob.jsonl`, for every sample but `large`, whose bytes are mostly base64 blobs);
  tests/test_blob_decode.py decodes those files back to the samples. Regenerate with `UPDATE_GOLDEN=1`, then review the diff against the
  SPEC by hand: the files are expectations, not recordings.
* One test per value rule of docs/mapping.md, on edge values.
* Every op, and the errors an Entry the converter cannot handle raises.

Golden line format (values are JSON):

    SCHEMA db.table [col BLOBTYPE (originalType) PK, ...]     when a table's column set first
                                                             appears or changes
    +I db.table seq=... t=eventTime {col=value, ...}         INSERT
    -U / +U db.table seq=... t=... {...}                     UPDATE_BEFOR / UPDATE_AFTER
    -D db.table seq=... t=... {...}                          DELETE
    BEGIN / COMMIT seq=... t=...                             TRANSACTION_BEGIN / TRANSACTION_END
    DDL <op> db.table seq=... t=... "sql"                    CREATE, ALTER, ... QUERY
    HB seq=... t=...                                         MHEARTBEAT
    GTID / ROLLBACK seq=... t=...                            checkpoint / rollback (lossless only)
    NOT EMITTED <MessageType> seqId=...                      strict: dropped and counted
    REJECT seqId=... <reason>                                strict: ConversionError

A value carried exactly in the lossless extension shows its raw Data after it,
`col=null ~raw(STRING "0000-00-00")`; text whose charset travels shows it, `col="中文" ~gbk`; a
column absent from the image (NA) is left out, as in the message. Lossless non-DML lines end with
the extension's event fields.
"""
from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge import ConversionError, Options, OptionsError, pb
from bridge.blob import rows as blob_rows
from bridge.blob.encode import sequence_id
from bridge.stream import ErrorPolicy, dts_records_to_entries
from bridge.values import ddl_op
from support.blob_strategies import blob_dml_entries, blob_entries
from support.native_paths import assert_same
from support.strategies import ddl_statements

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
SAMPLE_NAMES = sorted(p.name[:-3] for p in SAMPLES.glob("*.pb"))
STRICT = Options(strict=True)

FLINK = {"INSERT": "+I", "UPDATE_BEFOR": "-U", "UPDATE_AFTER": "+U", "DELETE": "-D", "UPDATE": "±U"}
NAMES = {"TRANSACTION_BEGIN": "BEGIN", "TRANSACTION_END": "COMMIT", "MHEARTBEAT": "HB", "GTID": "GTID",
         "XAROLLBACK": "ROLLBACK", "XACOMMIT": "XACOMMIT"}


# ---- rendering -------------------------------------------------------------------------------

def _json(value) -> str:
    text = orjson.dumps(value).decode()
    if len(text) > 120:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        text = f"{text[:60]}...({len(text)} chars, sha256 {digest})"
    return text


def _raw(raw: dict) -> str:
    name = pb.DataType.Name(raw["dataType"]) if raw["dataType"] in pb.DataType.values() else str(raw["dataType"])
    parts = [name]
    if "charset" in raw:
        parts.append(raw["charset"])
    if "sv" in raw:
        parts.append(_json(raw["sv"]))
    if "bv" in raw:
        data = base64.b64decode(raw["bv"])
        try:
            text = data.decode("ascii")
            parts.append(_json(text) if text.isprintable() else "b64:" + raw["bv"])
        except UnicodeDecodeError:
            parts.append("b64:" + raw["bv"])
    return f" ~raw({' '.join(parts)})"


def _table(msg: dict) -> str:
    source = (msg.get("schema") or {}).get("source")
    return f" {source['dbName']}.{source['tableName']}" if source else ""


def _head(msg: dict) -> str:
    payload = msg["payload"]
    stamp = payload["timestamp"]
    text = f"seq={payload['sequenceId']} t={stamp['eventTime']}"
    if "systemTime" in stamp:
        text += f" sys={stamp['systemTime']}"
    if stamp.get("checkpointTime") != stamp["eventTime"]:
        text += f" cp={stamp.get('checkpointTime')}"
    return text


def render(messages, lines=None, schemas=None) -> list[str]:
    """Compact expected rows for a list of Blob messages (see the module docstring)."""
    lines = [] if lines is None else lines
    schemas = {} if schemas is None else schemas
    for msg in messages:
        payload, schema, ext = msg["payload"], msg.get("schema") or {}, msg.get("dts") or {}
        op = payload["op"]
        if op in FLINK:
            columns = schema["dataColumn"]
            types = (ext.get("columns") or {}).get("types") or [None] * len(columns)
            keys = schema.get("primaryKey", [])
            shape = [f"{c['name']} {c['type']}" + (f" ({t})" if t else "") + (" PK" if c["name"] in keys else "")
                     for c, t in zip(columns, types)]
            table = _table(msg)
            if schemas.get(table) != shape:
                schemas[table] = shape
                lines.append(f"SCHEMA{table} [{', '.join(shape)}]")
            raws, charsets = ext.get("values") or {}, ext.get("charsets") or {}
            for image in ("before", "after"):
                if image not in payload or payload[image] is None:
                    continue
                values = payload[image]["dataColumn"]
                cells = []
                for i, column in enumerate(columns):
                    name = column["name"]
                    if name in values:
                        cell = f"{name}={_json(values[name])}"
                    elif str(i) in raws:
                        cell = f"{name}=<absent>"
                    else:
                        continue
                    if str(i) in raws:
                        cell += _raw(raws[str(i)])
                    if str(i) in charsets:
                        cell += f" ~{charsets[str(i)]}"
                    cells.append(cell)
                sign = FLINK[op] if op != "UPDATE" else ("-U" if image == "before" else "+U")
                lines.append(f"{sign}{table} {_head(msg)} {{{', '.join(cells)}}}")
            continue
        if op in NAMES:
            line = f"{NAMES[op]}{_table(msg)} {_head(msg)}"
        else:
            line = f"DDL {op}{_table(msg)} {_head(msg)} {_json(payload['ddl']['text'])}"
            if payload["ddl"].get("ddlMeta"):
                line += f" meta={payload['ddl']['ddlMeta']}"
        if ext.get("event"):
            line += f" {_json(ext['event'])}"
        lines.append(line)
    return lines


def sample_entries(name: str) -> list[pb.Entry]:
    policy = ErrorPolicy("fail")
    records = ((0, number, raw) for number, _, raw in bridge.read_pb(SAMPLES / f"{name}.pb"))
    return [entry for _, entry in dts_records_to_entries(records, policy)]


def render_stream(entries, options) -> list[str]:
    """Render a stream converted entry by entry; strict-mode rejects and drops get lines too."""
    encoder = bridge.BlobEncoder(options)
    lines, schemas = [], {}
    for entry in entries:
        dropped = sum(encoder.not_emitted.values())
        try:
            messages = encoder.convert(entry)
        except ConversionError as err:
            lines.append(f"REJECT seqId={entry.header.seqId} {err.reason}: {err.where.get('column')}="
                         f"{bridge.errors.shorten(err.value)}")
            continue
        if not messages and sum(encoder.not_emitted.values()) > dropped:
            lines.append(f"NOT EMITTED {pb.MessageType.Name(entry.header.messageType)} seqId={entry.header.seqId}")
        render(messages, lines, schemas)
    return lines


def check_golden(path: Path, actual: str) -> None:
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"{path.name} is missing: run with UPDATE_GOLDEN=1 and review it")
        path.parent.mkdir(exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        for number, (a, e) in enumerate(zip(actual.splitlines(), expected.splitlines()), 1):
            assert a == e, f"{path.name} line {number} differs (UPDATE_GOLDEN=1 rewrites it; review the diff)"
        assert actual == expected, f"{path.name}: different number of lines"


# ---- golden tests over the committed samples ---------------------------------------------------

def test_there_are_samples():
    assert {"types", "mixed", "mariadb", "large"} <= set(SAMPLE_NAMES)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_golden_lossless_rows(name):
    check_golden(GOLDEN / f"{name}.lossless.txt", "\n".join(render_stream(sample_entries(name), Options())) + "\n")


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_golden_strict_rows(name):
    check_golden(GOLDEN / f"{name}.strict.txt", "\n".join(render_stream(sample_entries(name), STRICT)) + "\n")


# Exact bytes for the streams with every op and every value edge (large's are mostly base64).
BYTES_GOLDEN = [name for name in SAMPLE_NAMES if name != "large"]


@pytest.mark.parametrize("name", BYTES_GOLDEN)
def test_golden_lossless_bytes(name):
    """The exact bytes (compact JSON, stable key order) of every lossless message of a sample."""
    messages = bridge.entries_to_blob(sample_entries(name))
    check_golden(GOLDEN / f"{name}.blob.jsonl", "".join(bridge.encode_blob(m).decode() + "\n" for m in messages))


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_samples_validate_and_sequence_ids_increase(name):
    for options in (Options(), STRICT):
        encoder = bridge.BlobEncoder(options)
        previous = None
        for entry in sample_entries(name):
            try:
                messages = encoder.convert(entry)
            except ConversionError:
                assert options.strict
                continue
            for msg in messages:
                bridge.validate_blob(msg)
                seq = int(msg["payload"]["sequenceId"])
                if msg["payload"]["op"] == "UPDATE_AFTER":
                    assert seq == previous, "an update's halves share one sequenceId"
                else:
                    assert previous is None or seq > previous
                previous = seq


def test_golden_files_cover_every_op_and_type_family():
    text = "".join((GOLDEN / f"{name}.lossless.txt").read_text(encoding="utf-8") for name in SAMPLE_NAMES)
    for marker in ("+I ", "-U ", "+U ", "-D ", "BEGIN ", "COMMIT ", "HB ", "GTID ", "ROLLBACK ", "DDL CREATE ",
                   "DDL ALTER ", "DDL ERASE ", "DDL TRUNCATE ", "DDL RENAME ", "DDL CINDEX ", "DDL DINDEX ",
                   "DDL QUERY ", "~raw(", " ~gbk", " ~latin1", " ~big5", " ~gb18030"):
        assert marker in text, marker
    for blob_type in ("LONG", "DOUBLE", "DATE", "BYTES", "STRING"):
        assert f" {blob_type} (" in text, blob_type


# ---- helpers for hand-built Entries ---------------------------------------------------------------

def header(message_type, seq_id=5, timestamp=1621322567, **fields) -> pb.Header:
    return pb.Header(version=1, sourceType=fields.pop("sourceType", pb.MYSQL), messageType=message_type,
                     timestamp=timestamp, seqId=seq_id, **fields)


def dml(columns, rows, kind=pb.INSERT, seq_id=5, **fields) -> pb.Entry:
    """columns: [(name, originalType[, isKey])]; rows: [(old image, new image)] of Data lists."""
    e = pb.Entry(header=header(pb.DML, seq_id, schemaName=fields.pop("schemaName", "shop"),
                               tableName=fields.pop("tableName", "t"), **fields))
    e.event.dmlEvent.dmlEventType = kind
    for column in columns:
        name, type_text, *key = column
        e.event.dmlEvent.columns.add(name=name, originalType=type_text, isKey=bool(key and key[0]))
    for old, new in rows:
        row = e.event.dmlEvent.rows.add()
        row.oldColumns.extend(old)
        row.newColumns.extend(new)
    return e


def insert(columns, *images, **fields) -> pb.Entry:
    return dml(columns, [([], image) for image in images], **fields)


def one_value(type_text: str, data: pb.Data, options: Options = Options()):
    """(Blob value or <absent>, message) of a one-column insert."""
    [msg] = bridge.entry_to_blob(insert([("c", type_text)], [data]), options)
    return msg["payload"]["after"]["dataColumn"].get("c", "<absent>"), msg


def round_trip(entry: pb.Entry, options: Options = Options()) -> list[pb.Entry]:
    messages = [bridge.decode_blob(bridge.encode_blob(m)) for m in bridge.entry_to_blob(entry, options)]
    for msg in messages:
        bridge.validate_blob(msg)
    return list(bridge.blob_to_entries(messages, options))


def D(data_type, sv="", bv=b"", charset="") -> pb.Data:
    return pb.Data(dataType=data_type, sv=sv, bv=bv, charset=charset)


def S(text: str, charset="") -> pb.Data:
    return pb.Data(dataType=pb.STRING, bv=text.encode("ascii"), charset=charset)


# ---- docs/mapping.md, one rule at a time ---------------------------------------------------------

def test_nil_is_null_and_na_is_left_out():
    e = insert([("id", "int(11)", True), ("a", "varchar(8)"), ("b", "varchar(8)"), ("c", "datetime")],
               [D(pb.INT32, "1"), pb.Data(), D(pb.NA), pb.Data()])
    for options in (Options(), STRICT):
        [msg] = bridge.entry_to_blob(e, options)
        assert msg["payload"]["after"]["dataColumn"] == {"id": 1, "a": None, "c": None}
        assert [c["name"] for c in msg["schema"]["dataColumn"]] == ["id", "a", "b", "c"]
    [back] = round_trip(e)
    assert [d.dataType for d in back.event.dmlEvent.rows[0].newColumns] == [pb.INT32, pb.NIL, pb.NA, pb.NIL]
    assert back == e
    [back] = round_trip(e, STRICT)
    assert [d.dataType for d in back.event.dmlEvent.rows[0].newColumns] == [pb.INT64, pb.NIL, pb.NA, pb.NIL]


@pytest.mark.parametrize("type_text, data, blob_type, value", [
    ("bigint(20) unsigned", D(pb.UINT64, "18446744073709551615"), "STRING", "18446744073709551615"),
    ("bigint(20) unsigned", D(pb.UINT64, "9223372036854775808"), "STRING", "9223372036854775808"),
    ("bigint(20) unsigned", D(pb.UINT64, "0"), "STRING", "0"),
    ("bigint(20)", D(pb.INT64, "9223372036854775807"), "LONG", 9223372036854775807),
    ("bigint(20)", D(pb.INT64, "-9223372036854775808"), "LONG", -9223372036854775808),
    ("int(10) unsigned", D(pb.UINT32, "4294967295"), "LONG", 4294967295),
    ("mediumint(8) unsigned", D(pb.UINT32, "16777215"), "LONG", 16777215),
    ("smallint(6)", D(pb.INT16, "-32768"), "LONG", -32768),
    ("tinyint(4)", D(pb.INT8, "-128"), "LONG", -128),
    ("tinyint(3) unsigned", D(pb.UINT8, "255"), "LONG", 255),
    ("tinyint(1)", D(pb.INT8, "1"), "LONG", 1),
])
def test_integers_are_long_and_uint64_never_wraps(type_text, data, blob_type, value):
    for options in (Options(), STRICT):
        got, msg = one_value(type_text, data, options)
        assert msg["schema"]["dataColumn"] == [{"name": "c", "type": blob_type}]
        assert got == value and type(got) is type(value)
        assert "values" not in msg.get("dts", {}), "an exact value needs no raw copy"
    text = bridge.encode_blob(msg).decode()
    assert (f'"c":"{value}"' if blob_type == "STRING" else f'"c":{value}') in text
    [back] = round_trip(insert([("c", type_text)], [data]))
    assert back.event.dmlEvent.rows[0].newColumns[0] == data


def test_integer_outside_its_column_is_never_wrapped():
    """int(11) holding 2**40: LONG can say it, but the value travels raw too so DTS gets it back."""
    e = insert([("c", "int(11)")], [D(pb.INT32, str(2**40))])
    got, msg = one_value("int(11)", D(pb.INT32, str(2**40)))
    assert got == 2**40 and msg["dts"]["values"]["0"] == {"dataType": pb.INT32, "sv": str(2**40)}
    assert round_trip(e) == [e]
    e = insert([("c", "bigint(20)")], [D(pb.INT64, str(2**64))])
    got, msg = one_value("bigint(20)", D(pb.INT64, str(2**64)))
    assert got is None and msg["dts"]["values"]["0"]["sv"] == str(2**64)  # no LONG can hold it
    assert round_trip(e) == [e]
    with pytest.raises(ConversionError):
        bridge.entry_to_blob(e, STRICT)


@pytest.mark.parametrize("type_text, sv", [
    ("decimal(30,9)", "123456789012345678901.123456789"),
    ("decimal(30,9)", "-999999999999999999999.999999999"),
    ("decimal(30,9)", "-0.000000001"),
    ("decimal(10,2)", "0.00"),
    ("decimal(65,0)", "9" * 65),
])
def test_decimal_is_an_exact_string_by_default(type_text, sv):
    for options in (Options(), STRICT):
        got, msg = one_value(type_text, D(pb.DECIMAL, sv), options)
        assert (got, msg["schema"]["dataColumn"][0]["type"]) == (sv, "STRING")
    e = insert([("c", type_text)], [D(pb.DECIMAL, sv)])
    assert round_trip(e) == [e]


def test_decimal_as_double_on_request():
    double = Options(decimal="double")
    got, msg = one_value("decimal(10,2)", D(pb.DECIMAL, "12.34"), double)
    assert (got, msg["schema"]["dataColumn"][0]["type"]) == (12.34, "DOUBLE")
    assert "values" not in msg.get("dts", {})
    # 30 significant digits do not fit a double: lossless keeps the digits, strict reports
    exact = "123456789012345678901.123456789"
    got, msg = one_value("decimal(30,9)", D(pb.DECIMAL, exact), double)
    assert got == float(exact) and msg["dts"]["values"]["0"]["sv"] == exact
    e = insert([("c", "decimal(30,9)")], [D(pb.DECIMAL, exact)])
    assert round_trip(e, double) == [e]
    with pytest.raises(ConversionError) as info:
        bridge.entry_to_blob(e, Options(decimal="double", strict=True))
    assert info.value.where["column"] == "c" and exact in str(info.value)
    e = insert([("c", "decimal(10,2)")], [D(pb.DECIMAL, "-0.50")])
    assert round_trip(e, Options(decimal="double", strict=True))[0].event.dmlEvent.rows[0].newColumns[0] == \
        pb.Data(dataType=pb.FLOAT64, sv="-0.5")


def test_datetime_is_read_in_the_configured_time_zone():
    text = "2021-05-17 15:22:42"
    assert one_value("datetime", S(text))[0] == 1621264962000  # UTC by default
    shanghai = Options(timezone="Asia/Shanghai")
    got, msg = one_value("datetime", S(text), shanghai)
    assert got == 1621236162000 and "values" not in msg.get("dts", {})
    e = insert([("c", "datetime")], [S(text)])
    assert round_trip(e, shanghai) == [e]
    # decoding in the same zone gives the wall-clock text back, in strict mode as datetime(3)
    [back] = round_trip(e, Options(timezone="Asia/Shanghai", strict=True))
    assert back.event.dmlEvent.rows[0].newColumns[0].bv == b"2021-05-17 15:22:42.000"
    assert one_value("date", S("2021-05-17"), shanghai)[0] == 1621180800000  # local midnight


def test_datetime_in_a_dst_gap_is_not_silently_moved():
    """02:30 did not exist in New York on 2021-03-14; no epoch instant reads back as that text."""
    new_york = Options(timezone="America/New_York")
    e = insert([("c", "datetime")], [S("2021-03-14 02:30:00")])
    assert round_trip(e, new_york) == [e]  # lossless: the text travels raw
    with pytest.raises(ConversionError):
        bridge.entry_to_blob(e, Options(timezone="America/New_York", strict=True))
    ambiguous = insert([("c", "datetime")], [S("2021-11-07 01:30:00")])  # first (EDT) reading
    assert one_value("datetime", S("2021-11-07 01:30:00"), new_york)[0] == 1636263000000
    assert round_trip(ambiguous, new_york) == [ambiguous]


@pytest.mark.parametrize("options", [Options(), Options(timezone="Asia/Shanghai"), STRICT])
@pytest.mark.parametrize("type_text, text, ms", [
    ("timestamp", "2021-05-17 12:52:42 +05:30", 1621236162000),
    ("timestamp", "2021-05-17 07:22:42 +00:00", 1621236162000),
    ("timestamp(3)", "2021-05-17 00:22:42.123 -07:00", 1621236162123),
    ("timestamp(3)", "2038-01-19 11:14:07.999 +08:00", 2147483647999),
    ("timestamp", "1970-01-01 00:00:01 +00:00", 1000),
])
def test_timestamp_is_read_by_its_own_offset(type_text, text, ms, options):
    got, msg = one_value(type_text, S(text), options)
    assert got == ms and msg["schema"]["dataColumn"][0]["type"] == "DATE"
    if options.lossless:
        e = insert([("c", type_text)], [S(text)])
        assert round_trip(e, options) == [e]


@pytest.mark.parametrize("type_text, text", [
    ("date", "0000-00-00"), ("datetime", "0000-00-00 00:00:00"), ("datetime(6)", "0000-00-00 00:00:00.000000"),
    ("timestamp", "0000-00-00 00:00:00 +00:00"), ("date", "2021-00-17"), ("date", "2021-02-30"),
])
def test_zero_dates(type_text, text):
    got, msg = one_value(type_text, S(text))
    assert got is None
    assert msg["dts"]["values"]["0"] == {"dataType": pb.STRING, "bv": base64.b64encode(text.encode()).decode()}
    e = insert([("id", "int(11)", True), ("c", type_text)], [D(pb.INT32, "1"), S(text)], seq_id=77)
    assert round_trip(e) == [e]
    with pytest.raises(ConversionError) as info:
        bridge.entry_to_blob(e, STRICT.replace(zero_dates="error"))  # the default writes null: test_temporal_policies.py
    err = info.value
    assert (err.where["seq_id"], err.where["table"], err.where["column"]) == (77, "shop.t", "c")
    assert text in str(err) and "seqId 77" in str(err) and "shop.t" in str(err)


@pytest.mark.parametrize("type_text, text", [
    ("time", "838:59:59"), ("time", "-838:59:59"), ("time(3)", "-838:59:59.000"), ("time", "-00:00:01"),
    ("time(6)", "100:00:00.000001"), ("time", "00:00:00"),
])
def test_time_is_a_string_even_beyond_24_hours(type_text, text):
    for options in (Options(), STRICT):
        got, msg = one_value(type_text, S(text), options)
        assert (got, msg["schema"]["dataColumn"][0]["type"]) == (text, "STRING")
    e = insert([("c", type_text)], [S(text)])
    assert round_trip(e) == [e]


@pytest.mark.parametrize("type_text, text, ms, exact", [
    ("datetime(6)", "2021-05-17 07:22:42.123000", 1621236162123, True),
    ("datetime(3)", "2021-05-17 07:22:42.123", 1621236162123, True),
    ("datetime(6)", "2021-05-17 07:22:42.123456", 1621236162123, False),
    ("datetime(6)", "2021-05-17 07:22:42.000001", 1621236162000, False),
    ("datetime(4)", "2021-05-17 07:22:42.9999", 1621236162999, False),
    ("timestamp(6)", "2021-05-17 07:22:42.000500 +00:00", 1621236162000, False),
])
def test_fractional_seconds_below_a_millisecond_are_not_dropped(type_text, text, ms, exact):
    got, msg = one_value(type_text, S(text))
    assert got == ms
    assert ("values" not in msg.get("dts", {})) == exact
    e = insert([("c", type_text)], [S(text)])
    assert round_trip(e) == [e]
    if exact:
        assert one_value(type_text, S(text), STRICT)[0] == ms
    else:
        with pytest.raises(ConversionError, match="sub-millisecond"):  # the default truncates: test_temporal_policies.py
            bridge.entry_to_blob(e, STRICT.replace(temporal_precision="exact"))


@pytest.mark.parametrize("doc", [b'{"id": 1, "name": "\xe5\xbc\xa0\xe4\xb8\x89 \xf0\x9f\x98\x80"}', b"null",
                                 b'"a JSON string"', b"[1, 2.5, -3]", b"{}"])
def test_json_columns_are_strings_of_their_text(doc):
    for options in (Options(), STRICT):
        got, msg = one_value("json", D(pb.BYTES, bv=doc), options)
        assert got == doc.decode("utf-8") and msg["schema"]["dataColumn"][0]["type"] == "STRING"
    e = insert([("c", "json")], [D(pb.BYTES, bv=doc)])
    assert round_trip(e) == [e]


@pytest.mark.parametrize("type_text, data, blob_type, value", [
    ("bit(1)", D(pb.INT64, "1"), "LONG", 1),
    ("bit(8)", D(pb.INT64, "255"), "LONG", 255),
    ("bit(63)", D(pb.INT64, str(2**63 - 1)), "LONG", 2**63 - 1),
    ("bit(64)", D(pb.UINT64, "18446744073709551615"), "STRING", "18446744073709551615"),
    ("bit(64)", D(pb.INT64, "5"), "STRING", "5"),
    ("year(4)", D(pb.INT64, "2021"), "LONG", 2021),
    ("year", D(pb.INT64, "0"), "LONG", 0),
    ("year(4)", D(pb.INT64, "1901"), "LONG", 1901),
])
def test_bit_and_year_are_integers(type_text, data, blob_type, value):
    for options in (Options(), STRICT):
        got, msg = one_value(type_text, data, options)
        assert (got, msg["schema"]["dataColumn"][0]["type"]) == (value, blob_type)
    e = insert([("c", type_text)], [data])
    assert round_trip(e) == [e]


@pytest.mark.parametrize("charset, text", [
    ("utf8mb4", "emoji 👍🏽 𝄞 中文"), ("utf8", "Ünïcödé ☃"), ("utf8mb3", "日本語"),
    ("latin1", "€ 5 Ÿ œ ß é ‰ “quoted”"), ("gbk", "中文汉字 ＡＢＣ"), ("gb18030", "𠀀 😀 € 中文"),
    ("big5", "繁體中文 臺灣"), ("ascii", "plain"), ("", "no charset means utf8"),
])
def test_text_is_decoded_with_its_charset(charset, text):
    codec = {"latin1": "cp1252", "": "utf-8"}.get(charset, charset.replace("utf8mb4", "utf-8").replace(
        "utf8mb3", "utf-8").replace("utf8", "utf-8"))
    data = pb.Data(dataType=pb.STRING, charset=charset, bv=text.encode(codec))
    for options in (Options(), STRICT):
        got, msg = one_value("varchar(64)", data, options)
        assert got == text and msg["schema"]["dataColumn"][0]["type"] == "STRING"
        assert "values" not in msg.get("dts", {})
    e = insert([("c", "varchar(64)")], [data])
    assert round_trip(e) == [e], "the charset and the exact bytes come back"


def test_latin1_is_mysqls_cp1252_with_every_byte_defined():
    raw = bytes(range(256))
    got, msg = one_value("text", pb.Data(dataType=pb.STRING, charset="latin1", bv=raw))
    assert len(got) == 256 and got[0x80] == "€" and got[0x81] == "\x81" and "values" not in msg.get("dts", {})
    e = insert([("c", "text")], [pb.Data(dataType=pb.STRING, charset="latin1", bv=raw)])
    assert round_trip(e) == [e]


def test_text_that_does_not_decode_is_never_changed():
    bad = pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"ok \xff\xfe")
    got, msg = one_value("varchar(8)", bad)
    assert got is None and msg["dts"]["values"]["0"]["bv"] == base64.b64encode(bad.bv).decode()
    e = insert([("c", "varchar(8)")], [bad])
    assert round_trip(e) == [e]
    with pytest.raises(ConversionError) as info:
        bridge.entry_to_blob(e, STRICT)
    assert info.value.where["column"] == "c"
    unknown = insert([("c", "varchar(8)")], [pb.Data(dataType=pb.STRING, charset="armscii8", bv=b"abc")])
    assert round_trip(unknown) == [unknown]  # no Python codec: carried raw, never guessed


@pytest.mark.parametrize("type_text, data", [
    ("varbinary(16)", pb.Data(dataType=pb.STRING, charset="binary", bv=b"\x00\xff\xfe")),
    ("binary(4)", pb.Data(dataType=pb.STRING, charset="binary", bv=b"\x00\x00\x00\x01")),
    ("blob", pb.Data(dataType=pb.BYTES, bv=bytes(range(256)))),
    ("longblob", pb.Data(dataType=pb.BYTES, bv=b"")),
    ("geometry", pb.Data(dataType=pb.BYTES, bv=bytes.fromhex("e6100000010100000000000000008066c0000000000080"
                                                             "56c0"))),
])
def test_binary_is_standard_base64_bytes(type_text, data):
    for options in (Options(), STRICT):
        got, msg = one_value(type_text, data, options)
        assert got == base64.b64encode(data.bv).decode("ascii")
        assert msg["schema"]["dataColumn"][0]["type"] == "BYTES"
    e = insert([("c", type_text)], [data])
    assert round_trip(e) == [e]


@pytest.mark.parametrize("type_text, data, value", [
    ("float", D(pb.FLOAT32, "3.4028235e+38"), 3.4028235e+38),
    ("float", D(pb.FLOAT32, "1e-45"), 1e-45),
    ("float", D(pb.FLOAT32, "-0.0"), -0.0),
    ("double", D(pb.FLOAT64, "1.7976931348623157e+308"), 1.7976931348623157e+308),
    ("double", D(pb.FLOAT64, "5e-324"), 5e-324),
    ("double", D(pb.FLOAT64, "0.1"), 0.1),
    ("double", D(pb.FLOAT64, "-0.0"), -0.0),
])
def test_floats_are_doubles(type_text, data, value):
    for options in (Options(), STRICT):
        got, msg = one_value(type_text, data, options)
        assert got == value and repr(got) == repr(value)
        assert msg["schema"]["dataColumn"][0]["type"] == "DOUBLE"
    e = insert([("c", type_text)], [data])
    assert round_trip(e) == [e]
    assert repr(orjson.loads(bridge.encode_blob(msg))["payload"]["after"]["dataColumn"]["c"]) == repr(value)


@pytest.mark.parametrize("sv", ["nan", "NaN", "inf", "-Infinity", "1e999"])
def test_non_finite_floats_are_carried_or_reported(sv):
    got, msg = one_value("double", D(pb.FLOAT64, sv))
    assert got is None and msg["dts"]["values"]["0"]["sv"] == sv
    bridge.validate_blob(msg)
    e = insert([("c", "double")], [D(pb.FLOAT64, sv)])
    assert round_trip(e) == [e]
    with pytest.raises(ConversionError):
        bridge.entry_to_blob(e, STRICT)


def test_non_canonical_spellings_travel_raw_and_strict_keeps_the_value():
    for type_text, data, value in [("double", D(pb.FLOAT64, "1.50"), 1.5), ("int(11)", D(pb.INT32, "007"), 7),
                                   ("int(11)", D(pb.INT64, "7"), 7)]:
        got, msg = one_value(type_text, data)
        assert got == value and "0" in msg["dts"]["values"]
        e = insert([("c", type_text)], [data])
        assert round_trip(e) == [e]
        assert one_value(type_text, data, STRICT)[0] == value


# Column definition -> Blob type (docs/mapping.md, "Column types"), for every MySQL type family.
SCHEMA_TYPES = [
    ("tinyint(4)", "LONG"), ("tinyint(1)", "LONG"), ("smallint(5) unsigned", "LONG"), ("mediumint(9)", "LONG"),
    ("int(11)", "LONG"), ("int(10) unsigned", "LONG"), ("bigint(20)", "LONG"), ("bigint(20) unsigned", "STRING"),
    ("bit(1)", "LONG"), ("bit(64)", "STRING"), ("year(4)", "LONG"), ("float", "DOUBLE"), ("double", "DOUBLE"),
    ("decimal(10,2)", "STRING"), ("char(3)", "STRING"), ("varchar(64)", "STRING"), ("tinytext", "STRING"),
    ("text", "STRING"), ("mediumtext", "STRING"), ("longtext", "STRING"), ("enum('a','b')", "STRING"),
    ("set('x','y')", "STRING"), ("binary(16)", "BYTES"), ("varbinary(255)", "BYTES"), ("tinyblob", "BYTES"),
    ("blob", "BYTES"), ("mediumblob", "BYTES"), ("longblob", "BYTES"), ("geometry", "BYTES"), ("json", "STRING"),
    ("date", "DATE"), ("datetime", "DATE"), ("datetime(6)", "DATE"), ("timestamp", "DATE"),
    ("timestamp(3)", "DATE"), ("time", "STRING"), ("time(3)", "STRING"),
]


def test_schema_types_come_from_column_definitions_even_when_the_first_row_is_null():
    columns = [(f"c{i}", t) for i, (t, _) in enumerate(SCHEMA_TYPES)]
    nulls = [pb.Data() for _ in columns]
    absent = [D(pb.NA) for _ in columns]
    e = insert(columns, nulls, absent, nulls)
    for options in (Options(), STRICT):
        messages = bridge.entry_to_blob(e, options)
        assert len(messages) == 3
        for msg in messages:
            assert [c["type"] for c in msg["schema"]["dataColumn"]] == [b for _, b in SCHEMA_TYPES]
        assert messages[1]["payload"]["after"]["dataColumn"] == {}
    assert round_trip(e) == [e]


def test_decimal_option_changes_only_decimal_columns():
    columns = [(f"c{i}", t) for i, (t, _) in enumerate(SCHEMA_TYPES)]
    [msg] = bridge.entry_to_blob(insert(columns, [pb.Data() for _ in columns]), Options(decimal="double"))
    assert [c["type"] for c in msg["schema"]["dataColumn"]] == [
        "DOUBLE" if t.startswith("decimal") else b for t, b in SCHEMA_TYPES]


# ---- every op ----------------------------------------------------------------------------------

COLUMNS = [("id", "int(11)", True), ("name", "varchar(16)")]


def row(i: int, name: str) -> list[pb.Data]:
    return [D(pb.INT32, str(i)), pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=name.encode())]


def test_insert_one_message_per_row_with_the_after_image():
    e = dml(COLUMNS, [([], row(1, "a")), ([], row(2, "b"))], pb.INSERT, seq_id=12)
    messages = bridge.entry_to_blob(e)
    assert [m["payload"]["op"] for m in messages] == ["INSERT", "INSERT"]
    assert [m["payload"]["sequenceId"] for m in messages] == ["12000000", "12000001"]
    assert [m["payload"]["after"]["dataColumn"] for m in messages] == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert all("before" not in m["payload"] for m in messages)
    assert messages[0]["schema"] == {"dataColumn": [{"name": "id", "type": "LONG"}, {"name": "name", "type": "STRING"}],
                                     "primaryKey": ["id"],
                                     "source": {"dbType": "MySQL", "dbName": "shop", "schemaName": "shop",
                                                "tableName": "t"}}
    assert messages[0]["payload"]["timestamp"] == {"eventTime": 1621322567000, "checkpointTime": 1621322567000}
    assert round_trip(e) == [e]


def test_update_gives_before_then_after_sharing_a_sequence_id():
    e = dml(COLUMNS, [(row(1, "a"), row(1, "b")), (row(2, "c"), row(3, "c"))], pb.UPDATE, seq_id=7)
    for options in (Options(), STRICT):
        messages = bridge.entry_to_blob(e, options)
        assert [(m["payload"]["op"], m["payload"]["sequenceId"]) for m in messages] == [
            ("UPDATE_BEFOR", "7000000"), ("UPDATE_AFTER", "7000000"),
            ("UPDATE_BEFOR", "7000001"), ("UPDATE_AFTER", "7000001")]
        assert messages[0]["payload"]["before"]["dataColumn"] == {"id": 1, "name": "a"}
        assert "after" not in messages[0]["payload"] and "before" not in messages[1]["payload"]
        assert messages[3]["payload"]["after"]["dataColumn"] == {"id": 3, "name": "c"}
        assert messages[0]["payload"]["timestamp"] == messages[1]["payload"]["timestamp"]
    assert round_trip(e) == [e]


def test_delete_gives_the_before_image():
    e = dml(COLUMNS, [(row(1, "a"), [])], pb.DELETE, seq_id=8)
    [msg] = bridge.entry_to_blob(e)
    assert msg["payload"]["op"] == "DELETE" and msg["payload"]["before"]["dataColumn"] == {"id": 1, "name": "a"}
    assert "after" not in msg["payload"]
    assert round_trip(e) == [e]


def control(message_type, field, seq_id=9, **event) -> pb.Entry:
    e = pb.Entry(header=header(message_type, seq_id))
    getattr(e.event, field).SetInParent()
    for key, value in event.items():
        setattr(getattr(e.event, field), key, value)
    return e


@pytest.mark.parametrize("message_type, field, op, event", [
    (pb.BEGIN, "beginEvent", "TRANSACTION_BEGIN", {"transactionId": "1621322567:1", "threadId": 4107}),
    (pb.COMMIT, "commitEvent", "TRANSACTION_END", {"transactionId": "1621322567:1"}),
    (pb.HEARTBEAT, "heartbeatEvent", "MHEARTBEAT", {"epoch": 1621322572}),
])
def test_begin_commit_and_heartbeat(message_type, field, op, event):
    e = control(message_type, field, **event)
    for options in (Options(), STRICT):
        [msg] = bridge.entry_to_blob(e, options)
        assert msg["schema"] == {}
        assert {k: v for k, v in msg["payload"].items()} == {
            "op": op, "sequenceId": "9000000",
            "timestamp": {"eventTime": 1621322567000, "checkpointTime": 1621322567000}}
        assert msg["version"] == "0.0.1"
    assert round_trip(e) == [e]


DDL_CASES = [
    ("CREATE TABLE `t` (id INT)", "CREATE"),
    ("create table if not exists t like u", "CREATE"),
    ("CREATE TEMPORARY TABLE t (a int)", "CREATE"),
    ("/* ApplicationName=DBeaver */ ALTER TABLE `shop`.`orders` ADD COLUMN note varchar(255)", "ALTER"),
    ("alter table t add index i (a)", "ALTER"),
    ("/*!40000 ALTER TABLE `t` DISABLE KEYS */", "ALTER"),
    ("DROP TABLE IF EXISTS `orders_archive_2020` /* generated by server */", "ERASE"),
    ("drop temporary table t", "ERASE"),
    ("/* sql-audit */\n-- rotate\n  TrUnCaTe TABLE `logs`.`access_log`", "TRUNCATE"),
    ("truncate t", "TRUNCATE"),
    ("RENAME TABLE `a` TO `b`, `b` TO `a`", "RENAME"),
    ("-- ticket OPS-1234\nCREATE INDEX idx ON shop.orders (customer_id)", "CINDEX"),
    ("create UNIQUE index `uk` ON `c` (`email`)", "CINDEX"),
    ("CREATE FULLTEXT INDEX f ON t (body)", "CINDEX"),
    ("  \n\tdrop index idx on `shop`.`orders`", "DINDEX"),
    ("# deploy\nDROP INDEX i ON t", "DINDEX"),
    ("CREATE DATABASE IF NOT EXISTS `shop`", "QUERY"),
    ("GRANT SELECT ON `shop`.* TO 'report'@'%'", "QUERY"),
    ("CREATE OR REPLACE VIEW v AS SELECT 1", "QUERY"),
    ("CREATE TABLESPACE ts ADD DATAFILE 'x.ibd'", "QUERY"),
    ("DROP TABLESPACE ts", "QUERY"),
    ("CREATE TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET @x = 1", "QUERY"),
    ("", "QUERY"),
    ("CREATE OR REPLACE TABLE t (a int)", "CREATE"),  # MariaDB
    ("create or replace temporary table t (a int)", "CREATE"),
    ("CREATE OR REPLACE INDEX i ON t (a)", "CINDEX"),  # MariaDB 10.1.4+
    ("CREATE OR REPLACE UNIQUE INDEX i ON t (a)", "CINDEX"),
]


@pytest.mark.parametrize("sql, op", DDL_CASES)
def test_ddl_op_from_leading_keywords(sql, op):
    e = pb.Entry(header=header(pb.DDL, 10, schemaName="shop", tableName="orders"))
    e.event.ddlEvent.SetInParent()
    e.event.ddlEvent.sql = sql
    e.event.ddlEvent.schemaName = "shop"
    for options in (Options(), STRICT):
        [msg] = bridge.entry_to_blob(e, options)
        assert msg["payload"]["op"] == op
        assert msg["payload"]["ddl"] == {"text": sql}
        assert msg["schema"] == {"source": {"dbType": "MySQL", "dbName": "shop", "schemaName": "shop",
                                            "tableName": "orders"}}
    assert round_trip(e) == [e]


@given(ddl_statements())
def test_ddl_op_of_generated_statements(statement):
    sql, op = statement
    assert ddl_op(sql) == op


@pytest.mark.parametrize("message_type, field, op, event", [
    (pb.CHECKPOINT, "checkpointEvent", "GTID", {"syncedGtid": "f1f2:1-7", "fileName": "mysql-bin.000007",
                                                "position": 16945, "fakeGtid": True}),
    (pb.ROLLBACK, "rollbackEvent", "XAROLLBACK", {}),
])
def test_checkpoint_and_rollback_travel_only_in_lossless_mode(message_type, field, op, event):
    e = control(message_type, field, **event)
    [msg] = bridge.entry_to_blob(e)
    assert msg["payload"]["op"] == op and msg["schema"] == {}
    # the extension is left out when it holds only what a message without one decodes to
    assert msg.get("dts", {}).get("event", {}) == event
    assert ("dts" in msg) == bool(event or e.header.gtid or e.header.fileName)
    bridge.validate_blob(msg)
    assert round_trip(e) == [e]
    for options in (STRICT, Options(control_events="drop")):
        encoder = bridge.BlobEncoder(options)
        assert encoder.convert(e) == []
        assert encoder.not_emitted == {pb.MessageType.Name(message_type): 1}
        assert encoder.emitted == 0
    with pytest.raises(OptionsError, match="control_events"):
        Options(strict=True, control_events="emit")


def test_sequence_id_is_seq_id_times_a_million_plus_the_row():
    assert sequence_id(0) == "0" and sequence_id(3, 2) == "3000002"
    top = 2**64 - 1
    e = dml(COLUMNS, [([], row(1, "a")), ([], row(2, "b"))], seq_id=top)
    messages = bridge.entry_to_blob(e)
    assert [m["payload"]["sequenceId"] for m in messages] == [str(top * 10**6), str(top * 10**6 + 1)]
    assert round_trip(e) == [e]


def test_source_names_the_db_type_and_version():
    for source_type, name in [(pb.MYSQL, "MySQL"), (pb.MARIADB, "MariaDB"), (pb.ORACLE, "Oracle"),
                              (pb.PGSQL, "PostgreSQL")]:
        e = dml(COLUMNS, [([], row(1, "a"))], sourceType=source_type)
        [msg] = bridge.entry_to_blob(e, Options(db_version="10.5.9"))
        assert list(msg["schema"]["source"].items()) == [
            ("dbType", name), ("dbVersion", "10.5.9"), ("dbName", "shop"), ("schemaName", "shop"), ("tableName", "t")]
        assert round_trip(e) == [e]


def test_system_time_only_when_asked_for():
    e = control(pb.HEARTBEAT, "heartbeatEvent")
    [msg] = bridge.entry_to_blob(e)
    assert "systemTime" not in msg["payload"]["timestamp"]
    [msg] = bridge.entry_to_blob(e, Options(system_time=True))
    stamp = msg["payload"]["timestamp"]
    assert list(stamp) == ["eventTime", "systemTime", "checkpointTime"]
    assert 10**12 <= stamp["systemTime"] < 10**13
    bridge.validate_blob(msg)


def test_primary_key_lists_the_key_columns_in_column_order():
    e = insert([("b", "int(11)", True), ("x", "text"), ("a", "int(11)", True)],
               [D(pb.INT32, "1"), pb.Data(), D(pb.INT32, "2")])
    [msg] = bridge.entry_to_blob(e)
    assert msg["schema"]["primaryKey"] == ["b", "a"]
    assert bridge.shard_key(msg) == "[1,2]"
    [msg] = bridge.entry_to_blob(insert([("x", "text")], [pb.Data()]))
    assert msg["schema"]["primaryKey"] == [] and bridge.shard_key(msg) == "shop.t"


# ---- encode_blob: compact, deterministic, stable key order ---------------------------------------

def test_encode_blob_is_compact_deterministic_and_ordered():
    e = dml(COLUMNS, [(row(1, "a"), row(1, "b"))], pb.UPDATE)
    first = [bridge.encode_blob(m) for m in bridge.entry_to_blob(e)]
    again = [bridge.encode_blob(m) for m in bridge.BlobEncoder().convert(e)]
    assert first == again
    for raw in first:
        assert b"\n" not in raw and b": " not in raw and b", " not in raw
        assert raw == orjson.dumps(orjson.loads(raw))
        assert raw.decode("utf-8")
    msg = orjson.loads(first[0])
    assert list(msg) == ["schema", "payload", "version", "dts"]
    assert list(msg["schema"]) == ["dataColumn", "primaryKey", "source"]
    assert list(msg["payload"]) == ["before", "op", "sequenceId", "timestamp"]
    assert list(orjson.loads(first[1])["payload"]) == ["after", "op", "sequenceId", "timestamp"]
    assert list(msg["payload"]["before"]["dataColumn"]) == ["id", "name"]
    ddl = pb.Entry(header=header(pb.DDL, schemaName="s", tableName="t"))
    ddl.event.ddlEvent.sql = "ALTER TABLE t ADD c INT"
    [msg] = bridge.entry_to_blob(ddl, STRICT)
    assert list(msg["payload"]) == ["op", "sequenceId", "timestamp", "ddl"]
    assert bridge.encode_blob(msg).startswith(b'{"schema":{"source":{"dbType":"MySQL","dbName":"s",')


@given(blob_entries())
def test_conversion_is_deterministic(entry):
    for options in (Options(), STRICT):
        try:
            first = [bridge.encode_blob(m) for m in bridge.BlobEncoder(options).convert(entry)]
        except ConversionError:
            continue
        assert [bridge.encode_blob(m) for m in bridge.BlobEncoder(options).convert(entry)] == first


# ---- errors ------------------------------------------------------------------------------------

def conversion_error(entry, options=Options()) -> ConversionError:
    with pytest.raises(ConversionError) as info:
        bridge.entry_to_blob(entry, options)
    return info.value


@pytest.mark.parametrize("data_type", [99, 15, -1])
def test_unknown_data_type_is_reported_with_seq_id_table_and_column(data_type):
    e = insert([("id", "int(11)", True), ("qty", "int(11)")], [D(pb.INT32, "1"), D(data_type, "3")], seq_id=41)
    for options in (Options(), STRICT):
        err = conversion_error(e, options)
        assert (err.where.get("seq_id"), err.where.get("table"), err.where.get("column")) == (41, "shop.t", "qty")
        assert str(data_type) in str(err) and "seqId 41" in str(err) and "shop.t" in str(err) \
            and "column qty" in str(err)


def test_unknown_message_type_is_reported():
    e = pb.Entry(header=header(99, 42, schemaName="shop", tableName="t"))
    err = conversion_error(e)
    assert err.where == {"seq_id": 42, "table": "shop.t"} and "99" in str(err)


@pytest.mark.parametrize("mutate, words", [
    (lambda e: setattr(e.event.dmlEvent, "dmlEventType", 7), "DMLType 7"),
    (lambda e: setattr(e.header, "sourceType", 9), "SourceType 9"),
    (lambda e: e.event.beginEvent.SetInParent(), "beginEvent"),
    (lambda e: e.event.dmlEvent.rows[0].newColumns.pop(), "values for"),
    (lambda e: e.event.dmlEvent.rows[0].oldColumns.extend(row(1, "x")), "before"),
    (lambda e: setattr(e.header, "timestamp", 999_999_999), "eventTime"),
    (lambda e: e.event.dmlEvent.columns.add(name="id", originalType="int"), "duplicate"),
])
def test_malformed_entries_are_reported(mutate, words):
    e = dml(COLUMNS, [([], row(1, "a"))], seq_id=43)
    if words == "duplicate":
        e.event.dmlEvent.rows[0].newColumns.add(dataType=pb.INT32, sv="2")
    mutate(e)
    err = conversion_error(e)
    assert words in str(err) and err.where.get("seq_id") == 43 and err.where.get("table") == "shop.t"


@pytest.mark.parametrize("type_text", ["geography", "int(abc)", "", "varchar2(10)"])
def test_unknown_column_type_is_reported(type_text):
    e = insert([("id", "int(11)", True), ("g", type_text)], [D(pb.INT32, "1"), pb.Data()], seq_id=44)
    err = conversion_error(e)
    assert err.where == {"seq_id": 44, "table": "shop.t", "column": "g"}
    assert type_text in str(err) and "column g" in str(err)


def test_bad_integer_text_is_reported_in_strict_mode_with_the_value_shortened():
    text = "12x" * 100
    e = insert([("id", "int(11)", True), ("n", "bigint(20)")], [D(pb.INT32, "1"), D(pb.INT64, text)], seq_id=45)
    err = conversion_error(e, STRICT)
    assert err.where == {"seq_id": 45, "table": "shop.t", "column": "n"}
    message = str(err)
    assert text not in message and "12x12x" in message and "..." in message and len(message) < 200
    assert "seqId 45" in message and "column n" in message
    # lossless mode never changes it: the text travels raw and comes back
    [msg] = bridge.entry_to_blob(e)
    assert msg["payload"]["after"]["dataColumn"]["n"] is None and msg["dts"]["values"]["1"]["sv"] == text
    assert round_trip(e) == [e]


_ANY_DATA = st.builds(pb.Data, dataType=st.integers(0, 17),  # negative numbers: see test_unknown_data_type_...
                      charset=st.sampled_from(["", "utf8mb4", "gbk", "binary"]),
                      sv=st.one_of(st.just(""), st.text(max_size=8), st.integers().map(str)), bv=st.binary(max_size=8))


@given(blob_dml_entries(), st.data())
def test_any_data_is_carried_exactly_or_reported(entry, data):
    """Replace one value by arbitrary Data: lossless mode carries any known DataType exactly; an
    unknown one, and anything strict mode cannot say, raises ConversionError, never another error."""
    dml_event = entry.event.dmlEvent
    row_change = data.draw(st.sampled_from(list(dml_event.rows)))
    image = row_change.newColumns or row_change.oldColumns
    index = data.draw(st.integers(0, len(image) - 1))
    image[index].CopyFrom(data.draw(_ANY_DATA))
    known = 0 <= image[index].dataType <= 14
    try:
        back = round_trip(entry)
    except ConversionError:
        assert not known
    else:
        assert known and back == [entry]
    try:
        for msg in bridge.entry_to_blob(entry, STRICT):
            bridge.validate_blob(msg)
    except ConversionError:
        pass


# ---- docs/mapping.md lists every table entry ------------------------------------------------------

def test_mapping_doc_names_every_table_entry():
    """A new op, DDL keyword, type family, charset or option cannot be added without docs."""
    from bridge import values
    from bridge.blob.decode import ALL_OPS, FOREIGN_COLUMN_TYPES
    from bridge.options import option_specs
    doc = (ROOT / "docs" / "mapping.md").read_text(encoding="utf-8")
    expected = (
        [f"`{op}`" for op in ALL_OPS]
        + [f"`{keywords}`" for keywords in values.DDL_OPS]
        + [f"`{family}`" for family in values.FAMILIES if family != "boolean-from-datahub"]
        + [f"`{charset}`" for charset in values.CHARSETS if charset]
        + [f"| `{name}` |" for name, *_ in option_specs()]
        + [f"| `{blob_type}` | `{original}`" for blob_type, (original, _) in FOREIGN_COLUMN_TYPES.items()]
        + [f"| {pb.SourceType.Name(number)} ({number}) | `{name}` |" for number, name in values.SOURCE_TYPES.items()]
        + [f"| {pb.MessageType.Name(number)} ({number})" for number in pb.MessageType.values()]
    )
    missing = [item for item in expected if item not in doc]
    assert not missing, f"docs/mapping.md does not mention {missing}"


# ---- a charset on temporal and time text is a label: it travels in dts.charsets -----------------

def _one_column_entry(type_text: str, data: pb.Data) -> pb.Entry:
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1621236162,
                                  seqId=7, schemaName="shop", tableName="t"))
    dml = e.event.dmlEvent
    dml.dmlEventType = pb.INSERT
    dml.columns.add(name="id", originalType="int(11)", isKey=True)
    dml.columns.add(name="c", originalType=type_text)
    dml.rows.add(newColumns=[pb.Data(dataType=pb.INT32, sv="1"), data])
    return e


_LABELLED = [("date", "2021-05-17", 1621209600000), ("datetime", "2021-05-17 07:22:42", 1621236162000),
             ("datetime(3)", "2021-05-17 07:22:42.123", 1621236162123),
             ("timestamp", "2021-05-17 07:22:42 +00:00", 1621236162000), ("time", "-838:59:59", "-838:59:59")]


@pytest.mark.parametrize("charset", ["utf8mb4", "binary", "latin1", "GBK", "no such charset"])
@pytest.mark.parametrize(("type_text", "text", "value"), _LABELLED, ids=[t for t, _, _ in _LABELLED])
def test_a_charset_on_temporal_and_time_text_travels_as_a_label(type_text, text, value, charset):
    """DTS may name a charset on temporal text (docs/mapping.md, "Charsets"): the value stays what
    the column makes of its text, the charset goes into dts.charsets (not the whole Data into
    dts.values), every face of the encoder agrees, and the way back gives the same bytes."""
    entry = _one_column_entry(type_text, pb.Data(dataType=pb.STRING, charset=charset, bv=text.encode()))
    raw = entry.SerializeToString()
    (msg,) = assert_same(raw)
    if blob_rows.NATIVE:  # C takes the value (it does not give way to Python)
        assert bridge.BlobEncoder()._dml_lines(entry, entry.header, raw) == [orjson.dumps(msg)]
    assert msg["payload"]["after"]["dataColumn"]["c"] == value
    assert msg["dts"]["charsets"] == {"1": charset}
    assert "values" not in msg["dts"]
    (back,) = bridge.blob_to_entries([orjson.loads(orjson.dumps(msg))])
    assert back.SerializeToString() == raw
    decoder = bridge.BlobDecoder()
    (line_back,) = decoder.feed_line(orjson.dumps(msg))  # the C lane's way
    assert line_back.SerializeToString() == raw
    (strict,) = assert_same(raw, Options(strict=True))
    assert strict["payload"]["after"]["dataColumn"]["c"] == value and "dts" not in strict


@pytest.mark.parametrize(("type_text", "text"), [("datetime(6)", "2021-05-17 07:22:42.123456"),
                                                 ("date", "0000-00-00"), ("datetime", "2021-05-17T07:22:42")])
def test_a_temporal_the_value_cannot_carry_keeps_its_charset_in_the_raw_data(type_text, text):
    """Sub-millisecond digits, a zero date or a non-canonical spelling: the Data travels whole
    (dts.values, with its charset), and no dts.charsets entry repeats it."""
    entry = _one_column_entry(type_text, pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=text.encode()))
    raw = entry.SerializeToString()
    (msg,) = assert_same(raw)
    assert msg["dts"]["values"]["1"]["charset"] == "utf8mb4"
    assert "charsets" not in msg["dts"]
    (back,) = bridge.blob_to_entries([msg])
    assert back.SerializeToString() == raw


def test_json_bytes_with_a_charset_travel_raw():
    """json is BYTES: a charset on them is not the canonical value, so the Data travels whole."""
    entry = _one_column_entry("json", pb.Data(dataType=pb.BYTES, charset="utf8mb4", bv=b'{"a": 1}'))
    raw = entry.SerializeToString()
    (msg,) = assert_same(raw)
    assert msg["payload"]["after"]["dataColumn"]["c"] == '{"a": 1}'
    assert msg["dts"]["values"] == {"1": {"dataType": pb.BYTES, "charset": "utf8mb4", "bv": "eyJhIjogMX0="}}
    (back,) = bridge.blob_to_entries([msg])
    assert back.SerializeToString() == raw


@pytest.mark.parametrize("label", [5, None, ["utf8mb4"], "\ud800"])
def test_a_charsets_entry_that_is_no_label_is_an_error_naming_the_column(label):
    entry = _one_column_entry("datetime", pb.Data(dataType=pb.STRING, charset="utf8mb4",
                                                   bv=b"2021-05-17 07:22:42"))
    (msg,) = bridge.entry_to_blob(entry)
    msg["dts"]["charsets"]["1"] = label
    with pytest.raises(ConversionError, match="charsets") as caught:
        list(bridge.blob_to_entries([msg]))
    assert caught.value.where["column"] == "c"
