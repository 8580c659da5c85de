"""The C fast path (bridge/native/src/, built as bridge.native._speedups) against the Python path, the reference.

`BlobEncoder.convert(entry)` is the Python path; `convert(entry, raw)` reads plain row images off
the wire in C (`Plan.rows`), and `convert_lines(entry, raw)` writes whole JSON lines in C
(`Plan.lines`). Both must give exactly what the Python path gives, for every Entry: the same
messages, the same bytes, the same errors, the same counts.
"""
from __future__ import annotations

import base64
import copy
import glob
import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge import values as values_table
from bridge.blob import rows as blob_rows
from bridge.errors import BridgeError
from bridge.samples.values import REAL_ORDERS, REAL_SUPPLIERS, realistic_entries
from bridge.values import SUBSTITUTION_NOTES
from bridge.wire.framing import encode_varint
from support.native_paths import assert_outcomes, assert_same
from support.native_paths import is_error as _is_error
from support.native_paths import outcome as _outcome
from support.strategies import dml_entries, mysql_columns, with_unknown_fields

OPTIONS = [bridge.DEFAULT_OPTIONS, bridge.Options(strict=True), bridge.Options(timezone="Asia/Shanghai"),
           bridge.Options(decimal="double"), bridge.Options(db_version="8.0.32", control_events="drop")]
OPTION_IDS = ["lossless", "strict", "shanghai", "decimal-double", "db-version"]

needs_native = pytest.mark.skipif(not blob_rows.NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")


def test_extension_is_built():
    """`make install` builds the extension; without it every figure in docs/performance.md is wrong."""
    if os.environ.get("BRIDGE_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("BRIDGE_PURE_PYTHON switches the C path off on purpose")
    from bridge.native import _speedups  # noqa: F401  (ImportError fails the test)
    assert blob_rows.NATIVE


# ---- adversarial values ---------------------------------------------------------------------------

_TEXTS = ["", "0", "-0", "007", "1", "-1", "127", "128", "-128", "-129", "255", "256", "65535", "2147483647",
          "2147483648", "-2147483648", "-2147483649", "4294967295", "9223372036854775807",
          "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "18446744073709551615",
          "18446744073709551616", "99999999999999999999999", " 1", "1 ", "+1", "1_0", "0x10", "１",
          "0.0", "-0.0", "1.0", "0.1", "1.5", "1e+16", "1e16", "1e-05", "0.0001", "1.7976931348623157e+308",
          "5e-324", "nan", "NaN", "inf", "-inf", "1.", ".5", "-", "1.2.3", "123456789012345.6", "0.30000000000000004",
          "2024-02-29", "2023-02-29", "0000-00-00", "0001-01-01", "9999-12-31", "2024-13-01", "2024-00-10",
          "2024-02-29 12:00:00", "2024-02-29 24:00:00", "2024-02-29 23:59:60", "1969-12-31 23:59:59",
          "2024-02-29 12:00:00.5", "2024-02-29 12:00:00.123", "2024-02-29 12:00:00.123456",
          "2024-02-29 12:00:00.123000", "2024-02-29 12:00:00 +00:00", "2024-02-29 12:00:00.120 +00:00",
          "2024-02-29 12:00:00 +08:00", "2024-2-9 1:2:3", "12:34:56", "-838:59:59", "true", "false"]
_BYTES = [b"", b"a", b"ab", b"abc", b"abcd", b"abcde", b"\x00", b"\x00\x01\x1f\x7f", b"\"\\/\b\f\n\r\t",
          "caf\u00e9 \u5317\u4eac \U0001f600 \u2028".encode(), b"\xff", b"\xc0\x80", b"\xed\xa0\x80",
          b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xc3", b"\xe4\xb8",
          b"{\"a\":[1,2]}", b"\x80abc"] + [t.encode() for t in _TEXTS]
_CHARSETS = ["", "utf8mb4", "binary", "latin1", "utf8", "gbk"]

adversarial_data = st.builds(
    pb.Data,
    dataType=st.sampled_from(list(range(16))),
    charset=st.sampled_from(_CHARSETS),
    sv=st.sampled_from(_TEXTS),
    bv=st.sampled_from(_BYTES) | st.binary(max_size=12),
)


@st.composite
def plain_entries(draw):
    """DML Entries, most of them plain (no properties anywhere) so that the C path takes them,
    some of their values replaced by adversarial Data (non-canonical, wrong type, bad UTF-8...)."""
    entry = draw(dml_entries(columns=draw(mysql_columns(max_size=6))))
    if draw(st.integers(0, 3)):
        entry.header.ClearField("properties")
        entry.event.ClearField("properties")
        for row in entry.event.dmlEvent.rows:
            row.ClearField("properties")
    if draw(st.booleans()):
        for column in entry.event.dmlEvent.columns:
            column.ClearField("properties")
    for row in entry.event.dmlEvent.rows:
        for image in (row.oldColumns, row.newColumns):
            for i in range(len(image)):
                if draw(st.integers(0, 5)) == 0:
                    image[i].CopyFrom(draw(adversarial_data))
    return entry


@needs_native
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entry=plain_entries())
def test_c_path_matches_python(entry, options):
    assert_same(entry.SerializeToString(), options)


@needs_native
@given(data=adversarial_data, type_text=st.sampled_from(
    ["bigint(20)", "int(11)", "tinyint(4)", "tinyint(1)", "smallint(5) unsigned", "bigint(20) unsigned",
     "mediumint(8)", "int(10) unsigned", "year(4)", "double", "float", "decimal(10,2)", "varchar(32)", "text",
     "char(4)", "binary(4)", "varbinary(8)", "blob", "json", "time", "time(3)", "date", "datetime",
     "datetime(3)", "datetime(6)", "datetime(1)", "timestamp", "timestamp(3)", "timestamp(6)", "bit(8)",
     "enum('a','b')", "set('a','b')"]), dml_type=st.sampled_from([0, 1, 2]), boolean=st.booleans())
def test_one_value_of_every_kind(data, type_text, dml_type, boolean):
    """Each adversarial Data in a one-column table of each type: the C checks decide as the codecs do."""
    column = pb.Column(name="c", originalType=type_text)
    if boolean:
        column.properties.add(key="datahub:type", value="BOOLEAN")
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                      schemaName="s", tableName="t", seqId=5))
    dml = entry.event.dmlEvent
    dml.dmlEventType = dml_type
    dml.columns.append(column)
    row = dml.rows.add()
    for image in ((row.oldColumns,) if dml_type == 2 else (row.newColumns,) if dml_type == 0
                  else (row.oldColumns, row.newColumns)):
        image.append(data)
    for options in OPTIONS[:3]:
        assert_same(entry.SerializeToString(), options)
    for options in TUPLE_OPTIONS:
        assert_same_tuples(entry.SerializeToString(), options)


@needs_native
@pytest.mark.parametrize("path", sorted(glob.glob("samples/*.pb")))
def test_samples(path):
    encoders = [bridge.BlobEncoder() for _ in range(4)]
    for _, _, value in bridge.read_pb(path):
        env = pb.Envelope.FromString(value)
        if env.total != 1:
            continue
        items = blob_rows.split_items(env.data)
        # each Entry's own bytes, as sent: DTS may spell a default out (NIL as `08 00`)
        assert [pb.Entry.FromString(i) for i in items] == list(pb.Entries.FromString(env.data).items)
        for raw in items:
            assert_same(raw, encoders=encoders)


# ---- the wire: encodings protobuf merges or tolerates ---------------------------------------------

def _field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def _plain_entry(rows=2, dml_type=pb.INSERT) -> pb.Entry:
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                      serverId=7, schemaName="s", tableName="t", seqId=42))
    dml = entry.event.dmlEvent
    dml.dmlEventType = dml_type
    dml.columns.add(name="id", originalType="bigint(20)", isKey=True)
    dml.columns.add(name="name", originalType="varchar(8)")
    for i in range(rows):
        row = dml.rows.add()
        for image in ((row.oldColumns, row.newColumns) if dml_type == pb.UPDATE else
                      (row.newColumns,) if dml_type == pb.INSERT else (row.oldColumns,)):
            image.add(dataType=pb.INT64, sv=str(i))
            image.add(dataType=pb.STRING, charset="utf8mb4", bv=f"n{i}\n\"".encode())
    return entry


def _wire_variants() -> dict:
    entry = _plain_entry()
    header, event = entry.header.SerializeToString(), entry.event.SerializeToString()
    dml = entry.event.dmlEvent
    columns = b"".join(_field(2, c.SerializeToString()) for c in dml.columns)
    rows = [_field(3, r.SerializeToString()) for r in dml.rows]
    row = dml.rows[0]
    data = [d.SerializeToString() for d in row.newColumns]

    def entry_with(dml_bytes: bytes, event_extra: bytes = b"") -> bytes:
        return _field(1, header) + _field(2, _field(2, dml_bytes) + event_extra)

    def row_with(datas: list[bytes], extra: bytes = b"") -> bytes:
        return _field(3, b"".join(_field(2, d) for d in datas) + extra)

    return {
        "plain": entry_with(columns + b"".join(rows)),
        "event twice (merged)": _field(1, header) + _field(2, event) + _field(2, event),
        "dmlEvent twice (merged)": _field(1, header) + _field(2, _field(2, columns + rows[0]) + _field(2, rows[1])),
        "columns after rows": entry_with(b"".join(rows) + columns),
        "columns split by a row": entry_with(_field(2, dml.columns[0].SerializeToString()) + rows[0]
                                             + _field(2, dml.columns[1].SerializeToString()) + rows[1]),
        "event properties": entry_with(columns + b"".join(rows), _field(15, _field(1, b"k"))),
        "row properties": entry_with(columns + row_with(data, _field(15, _field(1, b"k")))),
        "Data field twice": entry_with(columns + row_with([data[0] + b"\x1a\x01" + b"7", data[1]])),
        "Data with empty sv": entry_with(columns + row_with([data[0], data[1] + b"\x1a\x00"])),
        "Data with dataType 0": entry_with(columns + row_with([b"\x08\x00" + data[0], data[1]])),
        "Data unknown field": entry_with(columns + row_with([data[0] + b"\x28\x01", data[1]])),
        "NIL with unknown field": entry_with(columns + row_with([data[0], b"\x28\x01"])),
        "NA with unknown field": entry_with(columns + row_with([data[0], b"\x08\x0e\x28\x01"])),
        "bare NA": entry_with(columns + row_with([data[0], b"\x08\x0e"])),
        "NIL": entry_with(columns + row_with([data[0], b""])),
        "dataType as 10-byte varint": entry_with(columns + row_with(
            [data[0], b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])),
        "too few values": entry_with(columns + row_with([data[0]])),
        "too many values": entry_with(columns + row_with(data + [data[0]])),
        "INSERT with before image": entry_with(columns + _field(3, _field(1, data[0]) + _field(1, data[1])
                                                                + _field(2, data[0]) + _field(2, data[1]))),
        "images interleaved": entry_with(columns + _field(3, _field(2, data[0]) + _field(15, _field(1, b""))
                                                          + _field(2, data[1]))),
        "dmlEventType twice": entry_with(b"\x08\x00" + b"\x08\x02" + columns + b"".join(rows)),
        "unknown DML type": entry_with(b"\x08\x07" + columns + b"".join(rows)),
        "no rows": entry_with(columns),
        "unknown fields everywhere": _field(1, header) + b"\x30\x05" + _field(2, _field(2, columns + b"".join(rows)
                                                                                  + b"\x45\x00\x00\x00\x00")),
    }


WIRE = _wire_variants()


@needs_native
@pytest.mark.parametrize("name", list(WIRE))
@pytest.mark.parametrize("options", OPTIONS[:2], ids=OPTION_IDS[:2])
def test_wire_variants(name, options):
    assert_same(WIRE[name], options)


@needs_native
def test_the_c_path_is_taken():
    """The plain Entry goes through C (a test that the fast path does not silently fall back)."""
    encoder = bridge.BlobEncoder()
    raw = WIRE["plain"]
    assert encoder._dml_lines(pb.Entry.FromString(raw), pb.Entry.FromString(raw).header, raw) is not None
    table = next(iter(encoder._wire_tables.values())).table
    assert table.native.rows(raw, pb.INSERT) == [{"id": 0, "name": "n0\n\""}, {"id": 1, "name": "n1\n\""}]
    assert table.native.rows(WIRE["row properties"], pb.INSERT) is None
    assert table.native.rows(WIRE["NIL"], pb.INSERT) == [{"id": 0, "name": None}]
    assert table.native.rows(WIRE["bare NA"], pb.INSERT) == [{"id": 0}]
    # a field spelt out with its default reads as absent, as protobuf reads it (DTS writes NIL as 08 00)
    assert table.native.rows(WIRE["Data with empty sv"], pb.INSERT) == [{"id": 0, "name": "n0\n\""}]
    assert table.native.rows(WIRE["Data with dataType 0"], pb.INSERT) == [None]  # dataType twice: Python decides
    assert pb.RowChange.FromString(table.native.encode({"id": 3, "name": "x"}, 2)) == pb.RowChange(newColumns=[
        pb.Data(dataType=pb.INT64, sv="3"), pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"x")])
    assert table.native.encode({"id": "3"}, 1) is None  # a string for a LONG: the codec names the error
    entry = pb.Entry.FromString(raw)
    seqs, ops, _, _, shards, _, lines = encoder._dml_columns(entry, entry.header, raw)
    assert list(zip(seqs, ops, shards)) == [("42000000", "INSERT", "[0]"), ("42000001", "INSERT", "[1]")]
    assert lines == encoder.convert_lines(entry, raw)


@needs_native
def test_exponent_floats_and_escapes_come_out_as_orjson_writes_them():
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                      schemaName="s", tableName="t\"\n", seqId=0))
    dml = entry.event.dmlEvent
    dml.columns.add(name="d", originalType="double")
    dml.columns.add(name="t\u00e9\"\x01", originalType="text")
    dml.columns.add(name="b", originalType="varbinary(9)")
    for sv in ["1e+16", "1e-05", "0.1", "-0.0", "123456789012345.6"]:
        row = dml.rows.add()
        row.newColumns.add(dataType=pb.FLOAT64, sv=sv)
        row.newColumns.add(dataType=pb.STRING, charset="utf8mb4", bv="\x00\x1f\x7f\u2028\"\\/é😀".encode())
        row.newColumns.add(dataType=pb.BYTES, bv=bytes(range(len(sv))))
    messages = assert_same(entry.SerializeToString())
    assert [m["payload"]["after"]["dataColumn"]["d"] for m in messages] == [1e16, 1e-05, 0.1, -0.0, 123456789012345.6]
    assert [m["payload"]["sequenceId"] for m in messages] == ["0", "1", "2", "3", "4"]
    assert messages[2]["payload"]["after"]["dataColumn"]["b"] == base64.b64encode(bytes(range(3))).decode()


def test_split_items_of_malformed_bytes_is_none():
    if not blob_rows.NATIVE:
        assert blob_rows.split_items(b"\x0a\x00") is None
        return
    assert blob_rows.split_items(b"") == []
    assert blob_rows.split_items(b"\x0a\x02\x08\x01\x0a\x00") == [b"\x08\x01", b""]
    assert blob_rows.split_items(b"\x0a\x05\x08") is None  # truncated
    assert blob_rows.split_items(b"\x0b") is None  # group wire type
    assert blob_rows.split_items(b"\x10\x01\x0a\x00") == [b""]  # an unknown field is skipped


@needs_native
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("dml_type", [pb.INSERT, pb.UPDATE, pb.DELETE])
def test_sequence_ids_and_row_counts(rows, dml_type):
    entry = _plain_entry(rows, dml_type)
    for seq_id in (0, 1, 42, 2**64 - 1):
        entry.header.seqId = seq_id
        messages = assert_same(entry.SerializeToString())
        halves = 2 if dml_type == pb.UPDATE else 1
        assert [m["payload"]["sequenceId"] for m in messages] == [
            str(seq_id * 10**6 + i) for i in range(rows) for _ in range(halves)]


def test_pure_python_switch(tmp_path):
    """BRIDGE_PURE_PYTHON=1 gives the same lines without the extension (a fresh interpreter)."""
    import subprocess
    import sys
    raw = WIRE["plain"]
    (tmp_path / "e.pb").write_bytes(raw)
    code = ("import sys, bridge; from bridge import pb; from bridge.blob import rows as blob_rows; raw = open(sys.argv[1], 'rb').read(); "
            "print(blob_rows.NATIVE, bridge.BlobEncoder().convert_lines(pb.Entry.FromString(raw), raw))")
    outs = [subprocess.run([sys.executable, "-c", code, str(tmp_path / "e.pb")], capture_output=True, text=True,
                           env={**os.environ, "BRIDGE_PURE_PYTHON": flag}, check=True).stdout.split(" ", 1)
            for flag in ("1", "0")]
    assert outs[0][0] == "False"
    assert outs[0][1] == outs[1][1]


# ---- Blob -> DTS: Plan.encode against the codecs' from_blob -----------------------------------------

_BLOB_VALUES = [None, True, False, 0, -1, 1, 127, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 1.5, -0.0,
                0.1, 1e300, 1e-7, 3.0, "", "abc", "0", "007", "-0", "-007", "12.50", "-1.5", "1.", ".5", "1e5",
                "\ud800", "caf\u00e9", "\u5317\u4eac\U0001f600", "\x00\n\"", "YWJj", "YWI=", "YQ==", "YR==", "YWJ=",
                "Y===", "====", "YQ", "a b", "////", "+/+/", [], {}, [1], 1700000000000, 1700000000123, -1, -999,
                -62135596800000, -62135596800001, 253402300799999, 253402300800000, 86399999, 951782400000,
                "9" * 45, "-" + "9" * 30, "0000", "18446744073709551615", "18446744073709551616"]


def _messages(entry: pb.Entry, options) -> list[dict] | None:
    try:
        return bridge.BlobEncoder(options).convert(entry)
    except BridgeError:
        return None


def _feed_all(decoder, messages) -> list:
    out = []
    for msg in messages:
        out.append(_outcome(lambda: [e.SerializeToString() for e in decoder.feed(msg)]))
    out.append([(type(e).__name__, str(e)) for e in decoder.finish()])
    return out


def assert_decoders_agree(messages, options=bridge.DEFAULT_OPTIONS) -> list:
    """Blob -> DTS with the C image encoder and without it: message by message the same Entries
    or the same error (a one-sided error named as such), then the same end-of-input reports."""
    c_path, python = bridge.BlobDecoder(options), bridge.BlobDecoder(options)
    python._native = False
    got, expected = _feed_all(c_path, copy.deepcopy(messages)), _feed_all(python, copy.deepcopy(messages))
    for index, (g, e) in enumerate(zip(got, expected)):
        assert_outcomes(g, e, f"message {index}" if index < len(messages) else "finish()")
    return expected


@needs_native
@pytest.mark.parametrize("options", OPTIONS[:4], ids=OPTION_IDS[:4])
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entry=plain_entries(), data=st.data())
def test_c_encoder_matches_python(entry, options, data):
    """Blob -> DTS with the C image encoder gives the Entries (and errors) the Python codecs give,
    on the bridge's own messages with some values replaced by values of every JSON type."""
    messages = _messages(entry, options)
    if messages is None:  # an Entry the encoder rejects has no messages to decode
        return
    for msg in messages:
        for image in ("before", "after"):
            values = msg["payload"].get(image, {}).get("dataColumn")
            if values is None:
                continue
            for name in list(values):
                roll = data.draw(st.integers(0, 9))
                if roll == 0:
                    values[name] = data.draw(st.sampled_from(_BLOB_VALUES))
                elif roll == 1:
                    del values[name]
            if data.draw(st.integers(0, 20)) == 0:
                values["not a column"] = 1
    assert_decoders_agree(messages, options)


@needs_native
@given(value=st.sampled_from(_BLOB_VALUES) | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False,
       allow_infinity=False) | st.integers(-62135596800000 - 10, 253402300799999 + 10) | st.text(max_size=8),
       type_text=st.sampled_from(["bigint(20)", "int(11)", "tinyint(1)", "bigint(20) unsigned", "year(4)", "double",
                                  "float", "decimal(10,2)", "varchar(32)", "binary(4)", "blob", "json", "time",
                                  "date", "datetime", "datetime(3)", "datetime(6)", "datetime(2)", "timestamp",
                                  "timestamp(4)"]),
       boolean=st.booleans(), present=st.booleans())
def test_every_kind_encodes_as_its_codec(value, type_text, boolean, present):
    column = pb.Column(name="c", originalType=type_text)
    if boolean:
        column.properties.add(key="datahub:type", value="BOOLEAN")
    codec = bridge.values.codec_for(column)
    plan = blob_rows.native_plan(["c"], [codec], True)
    values = {"c": value} if present else {}
    wire = plan.encode(values, 2)
    if wire is None:  # C leaves it to the codec: one it rejects, or one of the kinds C does not take
        try:
            codec.from_blob(value)
        except (BridgeError, ValueError, OverflowError):
            return
        wide_int = isinstance(value, int) and not -(2**63) <= value < 2**63
        assert wide_int or len(str(value)) > 40 or (codec.blob_type == "DOUBLE" and isinstance(value, int)), value
        return
    row = pb.RowChange.FromString(wire)
    expected = pb.Data(dataType=pb.NA) if not present else pb.Data() if value is None else codec.from_blob(value)
    assert list(row.newColumns) == [expected]


_DOUBLE_TEXTS = (st.floats(allow_nan=False, allow_infinity=False).map(repr)
                 | st.from_regex(r"-?(0|[1-9][0-9]{0,17})\.[0-9]{1,18}", fullmatch=True)
                 | st.from_regex(r"-?0\.0{0,6}[1-9][0-9]{0,16}", fullmatch=True)
                 | st.integers(0, 12).flatmap(lambda places: st.decimals(allow_nan=False, allow_infinity=False,
                                                                          places=places)).map(str))


@needs_native
@given(texts=st.lists(_DOUBLE_TEXTS, min_size=1, max_size=4), float_column=st.booleans())
def test_double_texts(texts, float_column):
    """The C check of a double's text (a shortcut for the common spellings, repr for the rest)
    agrees with the codec's `repr(float(sv)) == sv` on every spelling."""
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                      schemaName="s", tableName="t", seqId=1))
    dml = entry.event.dmlEvent
    dml.columns.add(name="d", originalType="float" if float_column else "double")
    for sv in texts:
        dml.rows.add().newColumns.add(dataType=pb.FLOAT32 if float_column else pb.FLOAT64, sv=sv)
    for options in OPTIONS[:2]:
        assert_same(entry.SerializeToString(), options)


# ---- DTS -> Tuple: the UTC temporal shortcut against parse_temporal ---------------------------------

_TEMPORAL_TEXTS = (st.datetimes(min_value=__import__("datetime").datetime(1, 1, 1),
                                max_value=__import__("datetime").datetime(9999, 12, 31, 23, 59, 59, 999999))
                   .flatmap(lambda m: st.sampled_from([
                       m.strftime("%Y-%m-%d"), m.strftime("%Y-%m-%d %H:%M:%S"),
                       m.strftime("%Y-%m-%d %H:%M:%S.%f"), m.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                       m.strftime("%Y-%m-%d %H:%M:%S.%f")[:-5], m.strftime("%Y-%m-%d %H:%M:%S +00:00"),
                       m.strftime("%Y-%m-%d %H:%M:%S.%f +00:00"), m.strftime("%Y-%m-%d %H:%M:%S +08:00")]))
                   | st.sampled_from(_TEXTS) | st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}( [0-9]{2}:[0-9]{2}:[0-9]{2})?",
                                                             fullmatch=True))


@given(text=_TEMPORAL_TEXTS, type_text=st.sampled_from(["date", "datetime", "datetime(6)", "timestamp(3)"]))
def test_tuple_temporal_shortcut(text, type_text):
    """UTC text read with datetime.fromisoformat gives the microseconds (or the error) that the
    general parse gives (the same converter with the shortcut's pattern matching nothing)."""
    import re

    from bridge.values import tuples as tuple_encode
    ct = bridge.values.parse_column_type(type_text)
    data = pb.Data(dataType=pb.STRING, bv=text.encode())
    convert = bridge.values.TO_TUPLE[ct.kind](ct, bridge.Options(timezone="UTC", zero_dates="error"))  # null: a Substituted
    outcomes = []
    shortcut = tuple_encode._UTC_TEXT
    for pattern in (shortcut, re.compile(r"(?!)")):
        tuple_encode._UTC_TEXT = pattern
        try:
            outcomes.append(convert(data))
        except BridgeError as exc:
            outcomes.append((type(exc).__name__, str(exc)))
        finally:
            tuple_encode._UTC_TEXT = shortcut
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("path", sorted(glob.glob("samples/*.pb")))
def test_stream_gives_each_entrys_own_bytes(path):
    """dts_records_to_entries(raw=True): each Entry with its own bytes (split Envelopes too)."""
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    records = [(0, number, value) for number, _, value in bridge.read_pb(path)]
    items = list(dts_records_to_entries(records, ErrorPolicy("fail"), raw=True))
    assert items and all(len(item) == 3 for item in items)
    for _, entry, raw in items:
        if blob_rows.NATIVE:
            assert pb.Entry.FromString(raw) == entry  # its own bytes, not protobuf's re-encoding
        else:
            assert raw is None


# ---- what fuzzing the C path against the Python path found (docs/decisions.md, "The C fast path") ---

_SOURCE = {"dbType": "MySQL", "dbName": "d", "schemaName": "d", "tableName": "t"}
_STAMP = {"eventTime": 1_700_000_000_000, "checkpointTime": 1_700_000_000_000}


def _repeated_name_message(op: str, image: dict) -> dict:
    """A Blob message whose schema.dataColumn names `k` twice (the issue's seed)."""
    images = {"INSERT": ("after",), "UPDATE_AFTER": ("after",), "DELETE": ("before",), "UPDATE_BEFOR": ("before",),
              "UPDATE": ("before", "after")}[op]
    payload = {name: {"dataColumn": dict(image)} for name in images}
    payload.update(op=op, sequenceId="5000000", timestamp=dict(_STAMP))
    return {"schema": {"dataColumn": [{"name": "k", "type": "LONG"}, {"name": "k", "type": "LONG"}], "primaryKey": [],
                       "source": dict(_SOURCE)}, "payload": payload, "version": "0.0.1"}


@needs_native
@pytest.mark.parametrize("op", ["INSERT", "DELETE", "UPDATE", "UPDATE_BEFOR", "UPDATE_AFTER"])
def test_a_repeated_column_name_does_not_hide_a_key_the_schema_lacks(op):
    """Issue 21, 1: with `k` twice in schema.dataColumn, `Plan.encode` counted the image's `k` as
    two of its keys, so `hidden` (a key no column has) went unnoticed and was dropped; an update
    half was held and reported later as unpaired. Now both paths reject the message at once."""
    outcomes = assert_decoders_agree([_repeated_name_message(op, {"k": 1, "hidden": 42})])
    assert outcomes[0][:2] == ("error", "BlobFormatError")
    assert "image names columns not in schema.dataColumn" in outcomes[0][2] and "hidden" in outcomes[0][2]
    assert outcomes[1] == []  # nothing held back
    outcomes = assert_decoders_agree([_repeated_name_message(op, {"k": 1})])  # both columns get k
    if op not in ("UPDATE_BEFOR", "UPDATE_AFTER"):
        [entry] = [pb.Entry.FromString(raw) for raw in outcomes[0]]
        row = entry.event.dmlEvent.rows[0]
        for image in (row.oldColumns, row.newColumns):
            assert [d.sv for d in image] in ([], ["1", "1"])
    codec = bridge.values.codec_for(pb.Column(name="k", originalType="bigint(20)"))
    plan = blob_rows.native_plan(["k", "k"], [codec, codec], True)
    assert plan.encode({"k": 1, "hidden": 42}, 2) is None
    assert pb.RowChange.FromString(plan.encode({"k": 1}, 2)).newColumns == [pb.Data(dataType=pb.INT64, sv="1")] * 2


def _with_wrong_image(dml_type: int) -> pb.Entry:
    """Two rows, the second an INSERT with a before image or a DELETE with an after image."""
    entry = _plain_entry(2, dml_type)
    row = entry.event.dmlEvent.rows[1]
    if dml_type == pb.INSERT:
        row.oldColumns.extend(row.newColumns)
    else:
        row.newColumns.extend(row.oldColumns)
    return entry


_SECOND_DEFECTS = {
    "timestamp": (lambda e: setattr(e.header, "timestamp", 5), "no 13-digit eventTime"),
    "SourceType": (lambda e: setattr(e.header, "sourceType", 9), "unknown SourceType 9"),
    "column type": (lambda e: setattr(e.event.dmlEvent.columns[1], "originalType", "frobnicate(3)"),
                    "unknown MySQL column type"),
    "column type arguments": (lambda e: setattr(e.event.dmlEvent.columns[1], "originalType", "varchar(x)"),
                              "unparsable MySQL column type"),
}


@needs_native
@pytest.mark.parametrize("dml_type", [pb.INSERT, pb.DELETE], ids=["INSERT+before", "DELETE+after"])
@pytest.mark.parametrize("defect", list(_SECOND_DEFECTS))
def test_one_order_of_errors_on_both_paths(dml_type, defect):
    """Issue 21, 3: an image the op must not carry plus an Entry-level defect was reported as the
    image by Python and as the other defect by C. The order is now one (docs/decisions.md): what
    the Entry says once (columns, SourceType, timestamp) before the rows (images, then values)."""
    entry = _with_wrong_image(dml_type)
    change, words = _SECOND_DEFECTS[defect]
    change(entry)
    for options in OPTIONS[:3]:
        outcome = assert_same(entry.SerializeToString(), options)
        assert _is_error(outcome) and words in outcome[2], outcome
    mended = _with_wrong_image(dml_type)  # the image alone: reported the same way on both paths
    outcome = assert_same(mended.SerializeToString())
    assert _is_error(outcome) and "row change 1 carries a" in outcome[2]
    if defect.startswith("column"):  # DTS -> Tuple checks in the same order
        with pytest.raises(BridgeError, match=words):
            bridge.TupleEncoder().convert(entry)


@needs_native
def test_the_sink_writes_entries_with_seq_id_0():
    """Issue 21, 5: the sink's sequenceId prefix of a seqId 0 is empty, and appending it did
    memcpy(NULL, src, 0) into a column still without a buffer (UBSan; `make sanitize` runs this
    test under it). The lines are convert_lines', the sequenceIds the row indexes."""
    from array import array

    from bridge.native import speedups
    entries = []
    for seq_id, dml_type in ((0, pb.INSERT), (0, pb.UPDATE), (7, pb.DELETE), (0, pb.DELETE)):
        entry = _plain_entry(2, dml_type)
        entry.header.seqId = seq_id
        entries.append(entry)
    raws = [e.SerializeToString() for e in entries]
    encoder, tables = bridge.BlobEncoder(), {}
    for entry, raw in zip(entries, raws):
        tables.setdefault(speedups.table_key(raw), encoder.sink_table(entry, raw))
    sink = speedups.Sink()
    assert sink.entries(raws, 0, tables, 0, 0, True, bridge.blob.encode.FORMAT_VERSION.encode())[:2] == (4, 4)
    taken = sink.take()

    def strings(offsets: bytes, data: bytes) -> list[bytes]:
        ends = array("i", offsets)
        return [data[ends[i]:ends[i + 1]] for i in range(len(ends) - 1)]
    expected = [line for e, raw in zip(entries, raws) for line in bridge.BlobEncoder().convert_lines(e, raw)]
    assert taken[0] == len(expected)
    assert strings(taken[1], taken[2]) == expected
    assert strings(taken[5], taken[6]) == [orjson.loads(line)["payload"]["sequenceId"].encode() for line in expected]


@needs_native
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entry=with_unknown_fields(plain_entries()), data=st.data())
def test_unknown_fields_take_the_python_path_and_travel(entry, data):
    """Issue 21, 6: an Entry with unknown fields anywhere is one C leaves to Python (which carries
    them in `dts.unknown`); the four faces agree, the sink does not take it, and Blob -> DTS gives
    the Entry back byte for byte with the C image encoder and without it."""
    raw = entry.SerializeToString()
    assert not blob_rows.known_fields(raw)
    assert blob_rows.wire_scan(raw) is None
    from bridge.native import speedups
    assert speedups.table_key(raw) is None
    messages = assert_same(raw)
    if _is_error(messages) or not messages:
        return
    assert any("unknown" in m.get("dts", {}) for m in messages)
    outcomes = assert_decoders_agree(messages)
    assert [pb.Entry.FromString(e).SerializeToString() for out in outcomes[:-1] for e in out] == [raw]


def _streamed(encoder, entry, raw):
    """stream_lines' result taken whole (iterating a streamed one converts it again)."""
    out = encoder.stream_lines(entry, raw)
    lines = list(out)
    assert len(out) == len(lines)
    return lines


@pytest.mark.parametrize("options", OPTIONS[:3], ids=OPTION_IDS[:3])
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entry=plain_entries(), with_raw=st.booleans(), piece=st.sampled_from([1, 300, 1 << 22]),
       budget=st.sampled_from([0, 2000, 1 << 26]))
def test_stream_lines_gives_convert_lines_piece_by_piece(entry, options, with_raw, piece, budget):
    """Issue 21, 4: `stream_lines` (the CLI's) converts a large Entry in pieces of rows, C where
    it takes a piece (from a resume point) and Python from the first piece it does not, checks it
    whole first and keeps the lines only under its budget: the same lines, error and counts as
    `convert_lines`, whatever the piece size and budget."""
    from bridge.blob import encode as blob_encode
    raw = entry.SerializeToString() if with_raw else None
    saved = blob_encode._PIECE_BYTES, blob_encode._FIRST_PIECE
    blob_encode._PIECE_BYTES, blob_encode._FIRST_PIECE = piece, 1
    try:
        expected_encoder = bridge.BlobEncoder(options)
        expected = _outcome(lambda: expected_encoder.convert_lines(pb.Entry.FromString(entry.SerializeToString()), raw))
        encoder = bridge.BlobEncoder(options, line_budget=budget)
        got = _outcome(lambda: _streamed(encoder, pb.Entry.FromString(entry.SerializeToString()), raw))
    finally:
        blob_encode._PIECE_BYTES, blob_encode._FIRST_PIECE = saved
    assert_outcomes(got, expected, "stream_lines")
    assert (encoder.entries, encoder.emitted) == (expected_encoder.entries, expected_encoder.emitted)


@needs_native
def test_plan_lines_resumes_where_it_stopped():
    """`Plan.lines` from a resume point up to a stop row gives the slice of the whole call's lines,
    and the point to go on from; None once the event is read to its end."""
    encoder = bridge.BlobEncoder()
    entry = _plain_entry(5, pb.UPDATE)
    raw = entry.SerializeToString()
    cached, _, _, args = encoder._wire_layout(entry, entry.header, raw)
    plan = cached.table.native
    whole = plan.lines(*args)
    assert len(whole) == 10
    pieces, resume = [], None
    for stop in (2, 3, 5):
        lines, resume = plan.lines(*args, None, resume, stop)
        pieces.append(lines)
    assert resume is None and [len(p) for p in pieces] == [4, 2, 4] and sum(pieces, []) == whole
    lines, resume = plan.lines(*args, None, None, -1)
    assert lines == whole and resume is None
    with pytest.raises(ValueError):
        plan.lines(*args, None, (0, len(raw) + 1), 1)


@needs_native
def test_a_streamed_entry_goes_from_c_to_python_at_the_first_row_c_is_not_sure_of():
    from bridge.blob import encode as blob_encode
    entry = _plain_entry(6)
    entry.event.dmlEvent.rows[3].newColumns[0].sv = "007"  # not canonical: the Python codecs decide
    raw = entry.SerializeToString()
    firsts = []
    encoder = bridge.BlobEncoder(line_budget=0)
    convert = encoder._convert

    def watched(entry, header, raw, rows=None):
        firsts.append(None if rows is None else rows.first)
        return convert(entry, header, raw, rows)
    encoder._convert = watched
    saved = blob_encode._PIECE_BYTES, blob_encode._FIRST_PIECE
    blob_encode._PIECE_BYTES, blob_encode._FIRST_PIECE = 1, 1
    try:
        assert _streamed(encoder, entry, raw) == bridge.BlobEncoder().convert_lines(entry, raw)
    finally:
        blob_encode._PIECE_BYTES, blob_encode._FIRST_PIECE = saved
    assert firsts and firsts[0] == 3  # rows 0..2 from C, then Python (twice over: check, then write)


# ---- the fuzz seeds (tests/fuzz_seeds/README.md), through both paths -----------------------------

SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_seeds")
_SEED_ROWS = 20  # a seed's Entry of more rows is compared on its first rows (they repeat one another)


def _seed_entries(path: str) -> list[bytes]:
    """The bytes of each Entry of a `.pb` seed, as the readers hand them to the converters."""
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    records = [(0, number, value) for number, _, value in bridge.read_pb(path)]
    out = []
    for _, entry, raw in dts_records_to_entries(records, ErrorPolicy("fail"), raw=True):
        if len(entry.event.dmlEvent.rows) > _SEED_ROWS:
            del entry.event.dmlEvent.rows[_SEED_ROWS:]
            raw = entry.SerializeToString()
        out.append(raw)
    return out


def _sink_lines(raw: bytes) -> list[bytes] | None:
    """The Blob lines `_speedups.Sink` writes for one Entry, or None when it leaves it to Python."""
    from array import array

    from bridge.native import speedups
    key = speedups.table_key(raw)
    if key is None:
        return None
    entry = pb.Entry.FromString(raw)
    try:
        record = bridge.BlobEncoder().sink_table(entry, raw)
    except BridgeError:
        return None
    if record is None:
        return None
    sink = speedups.Sink()
    if sink.entries([raw], 0, {key: record}, 0, 0, True, bridge.blob.encode.FORMAT_VERSION.encode())[1] != 1:
        return None
    taken = sink.take()
    ends = array("i", taken[1])
    return [taken[2][ends[i]:ends[i + 1]] for i in range(len(ends) - 1)]


@needs_native
@pytest.mark.parametrize("name", sorted(n for n in os.listdir(SEEDS) if n.endswith(".pb")))
def test_every_seed_gives_the_same_on_both_paths(name):
    """Each `.pb` seed, Entry by Entry: the four faces of the encoder (C vs Python), stream_lines,
    the sink (where it takes the Entry) and Blob -> DTS with and without C give the same output
    and the same error, in lossless and strict mode."""
    for raw in _seed_entries(os.path.join(SEEDS, name)):
        for options in OPTIONS[:2]:
            messages = assert_same(raw, options)
            expected = messages if _is_error(messages) else [orjson.dumps(m) for m in messages]
            streamed = _outcome(lambda: _streamed(bridge.BlobEncoder(options, line_budget=0), pb.Entry.FromString(raw),
                                                  raw))
            assert_outcomes(streamed, expected, "stream_lines")
            if options is OPTIONS[0]:
                sunk = _sink_lines(raw)
                assert sunk is None or sunk == expected
            if not _is_error(messages):
                outcomes = assert_decoders_agree(messages, options)
                if options.lossless and messages:
                    back = [e for out in outcomes[:-1] for e in out]
                    assert back == [pb.Entry.FromString(raw).SerializeToString()]


@needs_native
@pytest.mark.parametrize("name", sorted(n for n in os.listdir(SEEDS) if n.endswith(".blob.jsonl")))
def test_every_blob_seed_gives_the_same_on_both_paths(name):
    with open(os.path.join(SEEDS, name), "rb") as fh:
        messages = [orjson.loads(line) for line in fh if line.strip()]
    for options in OPTIONS[:2]:
        outcomes = assert_decoders_agree(messages, options)
        assert _is_error(outcomes[0]) and "not in schema.dataColumn" in outcomes[0][2]


def test_the_long_line_seed_is_one_rejected_record_read_past():
    import gzip

    from bridge.stream import ErrorPolicy, Tally, blob_lines_to_entries
    from bridge.wire.framing import read_lines
    tally = Tally()
    policy = ErrorPolicy("skip", tally=tally)
    with gzip.open(os.path.join(SEEDS, "long-line.blob.jsonl.gz"), "rb") as fh:
        assert list(blob_lines_to_entries(read_lines(fh, source="seed"), policy)) == []
    assert (tally.input, tally.rejected) == (1, 1)
    [record] = policy.rejects
    assert record["kind"] == "LineTooLongError" and record["line"] == 1 and record["raw_truncated_from"] == 100_000_001


# ---- the shapes DTS really sends (docs/decisions.md, "The C fast path on what DTS really sends") take the C path and give what Python gives ---

_SHAPE_CHARSETS = sorted(cs for cs, codec in values_table.CHARSETS.items() if codec is not None)
_TEMPORALS = {"date": 0, "datetime": 0, "datetime(3)": 3, "datetime(6)": 6, "timestamp": 0, "timestamp(3)": 3,
              "timestamp(6)": 6}


def _text_data(text: str, charset: str) -> pb.Data | None:
    """`text` as DTS sends it in `charset`, or None when the charset cannot write it."""
    try:
        raw = values_table.charset_codec(charset)[1](text)[0]
    except UnicodeError:
        return None
    return pb.Data(dataType=pb.STRING, charset=charset, bv=raw)


@st.composite
def _temporal_text(draw, type_text: str) -> str:
    kind, fsp = type_text.split("(")[0], _TEMPORALS[type_text]
    if draw(st.integers(0, 5)) == 0:  # a zero date, or a day that does not exist
        day = draw(st.sampled_from(["0000-00-00", "2021-00-17", "2021-02-30", "2020-13-01", "0000-01-01"]))
    else:
        day = f"{draw(st.integers(1, 9999)):04d}-{draw(st.integers(1, 12)):02d}-{draw(st.integers(1, 28)):02d}"
    if kind == "date":
        return day
    hh = draw(st.integers(0, 24 if draw(st.integers(0, 20)) == 0 else 23))
    text = f"{day} {hh:02d}:{draw(st.integers(0, 59)):02d}:{draw(st.integers(0, 59)):02d}"
    if fsp:
        micros = draw(st.sampled_from([0, 123000, 999999, 1, 500]) | st.integers(0, 999999))
        text += "." + f"{micros:06d}"[:fsp]
    return text + (" +00:00" if kind == "timestamp" else "")


# column type -> strategy of one Data as DTS writes it (the shapes, each on its own column)
def _shape_values(type_text: str):
    if type_text.startswith("varchar"):
        return st.builds(_text_data, st.text(max_size=8), st.sampled_from(_SHAPE_CHARSETS)) | st.builds(
            pb.Data, dataType=st.just(pb.STRING), charset=st.sampled_from(["gbk", "big5", "utf16", "ascii"]),
            bv=st.binary(max_size=6))  # bytes the charset may refuse: the C path must give way
    if type_text in _TEMPORALS:
        return st.builds(lambda text, cs: pb.Data(dataType=pb.STRING, charset=cs, bv=text.encode()),
                         _temporal_text(type_text), st.sampled_from(["", "", "utf8mb4", "binary", "utf8"]))
    if type_text == "time":  # time text: a charset on it is a label, as on the temporals
        return st.builds(lambda text, cs: pb.Data(dataType=pb.STRING, charset=cs, bv=text.encode()),
                         st.sampled_from(["20:12:22", "-838:59:59", "100:00:00", "00:00:00.5"]),
                         st.sampled_from(["", "", "utf8mb4", "binary", "gbk"]))
    if type_text == "json":  # BYTES: a charset on them is not canonical (raw Data)
        return st.builds(lambda text, cs: pb.Data(dataType=pb.BYTES, charset=cs, bv=text.encode()),
                         st.sampled_from(['{"a": 1}', "[]", '"\u00e9"']), st.sampled_from(["", "", "utf8mb4"]))
    if type_text == "double":
        return st.builds(lambda x, whole: pb.Data(dataType=pb.FLOAT64, sv=str(int(x)) if whole else repr(x)),
                         st.floats(-1e15, 1e15, allow_nan=False), st.booleans()) | st.sampled_from(
            [pb.Data(dataType=pb.FLOAT64, sv=t) for t in ("1", "12", "-0", "1.50", "+2", "1e3", "1E-7", ".5", "7.")])
    if type_text.startswith("bit"):
        bits = int(type_text[4:-1])
        return st.integers(0, (1 << bits) - 1).map(lambda v: pb.Data(dataType=pb.INT64, sv=str(v)))
    return st.integers(1901, 2155).map(lambda v: pb.Data(dataType=pb.INT64, sv=str(v)))  # year


_SHAPE_TYPES = ["varchar(32)", *_TEMPORALS, "time", "json", "double", "bit(1)", "bit(8)", "bit(63)", "year(4)"]


@st.composite
def shaped_entries(draw):
    """DML Entries of the shapes the issue lists: text in every charset of the table, temporals with
    and without a charset (sub-millisecond digits, zero dates), doubles spelt '1', BIT and YEAR,
    NULL as NIL, header properties; with the ids and the op of a real event."""
    types = draw(st.lists(st.sampled_from(_SHAPE_TYPES), min_size=1, max_size=6))
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                      serverId=3306, schemaName="mall", tableName="orders",
                                      seqId=draw(st.integers(0, 10 ** 6))))
    for key, value in draw(st.lists(st.tuples(st.sampled_from(["subscribe_id", "region", "x"]), st.text(max_size=5)),
                                    max_size=2)):
        entry.header.properties.add(key=key, value=value)
    dml = entry.event.dmlEvent
    dml.dmlEventType = draw(st.sampled_from([pb.INSERT, pb.UPDATE, pb.DELETE]))
    dml.columns.add(name="id", originalType="bigint(20)", isKey=True)
    for i, type_text in enumerate(types):
        dml.columns.add(name=f"c{i}", originalType=type_text)
    for index in range(draw(st.integers(1, 3))):
        row = dml.rows.add()
        images = {pb.INSERT: (row.newColumns,), pb.UPDATE: (row.oldColumns, row.newColumns),
                  pb.DELETE: (row.oldColumns,)}[dml.dmlEventType]
        for image in images:
            image.add(dataType=pb.INT64, sv=str(index))
            for type_text in types:
                value = None if draw(st.integers(0, 6)) == 0 else draw(_shape_values(type_text))
                image.add().CopyFrom(value or pb.Data(dataType=pb.NIL))
    return entry


def _clean(entry: pb.Entry) -> bool:
    """Whether every value is one the C path must take in lossless mode (well-formed for its shape)."""
    for row in entry.event.dmlEvent.rows:
        for image in (row.oldColumns, row.newColumns):
            for data, column in zip(image, entry.event.dmlEvent.columns):
                if data.dataType == pb.FLOAT64 and "e" in repr(float(data.sv)):
                    return False  # orjson writes exponents its own way: documented as Python's
                if data.dataType != pb.STRING or column.originalType in _TEMPORALS or column.originalType == "time":
                    continue
                codec = values_table.charset_codec(data.charset)
                try:
                    text = codec[0](data.bv)[0]
                except UnicodeError:
                    return False
                if codec[2] and codec[1](text)[0] != data.bv or any("\ud800" <= ch <= "\udfff" for ch in text):
                    return False
                if data.charset not in ("", "utf8", "utf8mb3", "utf8mb4") and any(
                        len(codec[1](ch)[0]) > 2 for ch in text):
                    return False  # C knows units of one and two bytes; longer ones are Python's
    return True


@needs_native
@pytest.mark.parametrize("options", OPTIONS[:2], ids=OPTION_IDS[:2])
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entry=shaped_entries())
def test_the_shapes_dts_sends_match_python(entry, options):
    """Every face (dicts, lines, columns, entry_to_blob, entries_to_blob_lines) gives the Python
    path's messages on the issue's shapes; in lossless mode well-formed values never leave C."""
    raw = entry.SerializeToString()
    expected = assert_same(raw, options)
    if _is_error(expected):
        return
    assert bridge.entry_to_blob(pb.Entry.FromString(raw), options) == expected
    lines = [orjson.dumps(m) for m in expected]
    assert bridge.entries_to_blob_lines([raw], options) == lines
    assert bridge.entries_to_blob_lines(pb.Entries(items=[entry]).SerializeToString(), options) == lines
    if options.lossless and _clean(entry):
        encoder = bridge.BlobEncoder(options)
        assert encoder._dml_lines(pb.Entry.FromString(raw), entry.header, raw) is not None, "C gave way"


@needs_native
def test_header_properties_travel_in_the_c_lines():
    entry = _plain_entry(rows=1)
    entry.header.properties.add(key="subscribe_id", value="subs-1")
    raw = entry.SerializeToString()
    encoder = bridge.BlobEncoder()
    lines = encoder._dml_lines(entry, entry.header, raw)
    assert lines is not None
    assert orjson.loads(lines[0])["dts"]["header"]["properties"] == [["subscribe_id", "subs-1"]]
    assert lines == [orjson.dumps(m) for m in bridge.BlobEncoder().convert(entry)]
    entry.header.properties.add(key="datahub:op", value="UPDATE")  # a DataHub fact: Python's to apply
    assert encoder._dml_lines(entry, entry.header, entry.SerializeToString()) is None


def test_entries_to_blob_lines_names_what_does_not_parse():
    with pytest.raises(bridge.DecodeError, match="Entries"):
        bridge.entries_to_blob_lines(b"\x0a\x05\x01")
    with pytest.raises(bridge.DecodeError, match="Entry 1 does not parse"):
        bridge.entries_to_blob_lines([_plain_entry().SerializeToString(), b"\x0a\x05\x01"])


@needs_native
@pytest.mark.parametrize("options", OPTIONS[:2], ids=OPTION_IDS[:2])
def test_an_extension_left_out_comes_back_when_an_image_needs_it(options):
    """A one-row Entry of DataWorks' default columns and header has no `dts` extension, unless a
    value needs one (a charset, a temporal with sub-ms digits): then C writes it whole, as Python."""
    entry = pb.Entry(header=pb.Header(version=1, messageType=pb.DML, timestamp=1_700_000_000, seqId=3,
                                      schemaName="s", tableName="t"))
    dml = entry.event.dmlEvent
    dml.columns.add(name="note", originalType="longtext")
    dml.columns.add(name="at", originalType="datetime(3)")
    for note, at in ((_text_data("plain", "utf8mb4"), b"2021-05-17 07:22:42.123"),
                     (_text_data("中文", "gbk"), b"2021-05-17 07:22:42.123"),
                     (_text_data("plain", "utf8mb4"), b"0000-00-00 00:00:00.000")):
        dml.ClearField("rows")
        dml.rows.add(newColumns=[note, pb.Data(dataType=pb.STRING, bv=at)])
        raw = entry.SerializeToString()
        expected = assert_same(raw, options)
        encoder = bridge.BlobEncoder(options)
        if options.lossless:
            assert encoder._dml_lines(entry, entry.header, raw) is not None  # C took it, extension or not
            assert ("dts" in expected[0]) == (note.charset == "gbk" or at.startswith(b"0000"))


# ---- DTS -> Tuple: the C plan (Plan.tuples) against the Python converters (TO_TUPLE) ----------------

TUPLE_OPTIONS = [bridge.DEFAULT_OPTIONS, bridge.Options(zero_dates="error"), bridge.Options(zero_dates="string"),
                 bridge.Options(tuple_binary="hex", source_table=True), bridge.Options(timezone="Asia/Shanghai")]
TUPLE_OPTION_IDS = ["default", "zero-dates-error", "zero-dates-string", "hex-source-table", "shanghai"]


def _typed(rows: list[dict]) -> list:
    """Each row's fields in order with each value's type and repr (1 and 1.0, 0.0 and -0.0, Decimal
    1.0 and 1.00 differ)."""
    return [[(k, type(v).__name__, repr(v)) for k, v in row.items()] for row in rows]


def _tuple_run(encoder, entry: pb.Entry, raw: bytes | None) -> tuple:
    """(typed rows or the error, the substitutions noted, the encoder's counts) of one convert."""
    outer, notes = SUBSTITUTION_NOTES.notes, []
    SUBSTITUTION_NOTES.notes = notes
    try:
        got = _outcome(lambda: _typed(encoder.convert(entry) if raw is None else encoder.convert(entry, raw)))
    finally:
        SUBSTITUTION_NOTES.notes = outer
    return got, notes, (encoder.entries, encoder.emitted, dict(encoder.not_emitted))


def assert_same_tuples(raw: bytes, options=bridge.DEFAULT_OPTIONS) -> tuple:
    """The C path (with the Entry's bytes, and serialising the Entry itself) gives the Python path's
    rows (values and types), error, substitutions and counts; returns the Python path's run."""
    expected = _tuple_run(bridge.TupleEncoder(options, native=False), pb.Entry.FromString(raw), None)
    for face, given_raw in (("convert(entry, raw)", raw), ("convert(entry)", None)):
        got = _tuple_run(bridge.TupleEncoder(options), pb.Entry.FromString(raw), given_raw)
        assert_outcomes(got[0], expected[0], f"Tuple {face}")
        assert got[1:] == expected[1:], f"Tuple {face}: substitutions or counts"
    if not _is_error(expected[0]):
        assert _typed(bridge.entry_to_tuples(pb.Entry.FromString(raw), options)) == expected[0]
    return expected


def _tuple_holes(raw: bytes, options=bridge.DEFAULT_OPTIONS) -> int | None:
    """How many values C left to Python in a plain DML Entry (None: an image or the whole Entry)."""
    entry = pb.Entry.FromString(raw)
    dml = entry.event.dmlEvent
    encoder = bridge.TupleEncoder(options)
    plan = encoder._tables.get(dml.columns).native
    assert plan is not None, "no C plan for the column set"
    images = tuple({} for _ in range(2 if dml.dmlEventType == pb.UPDATE else 1))
    rows = plan.tuples(raw, dml.dmlEventType, "_sequence_id_", entry.header.seqId * 10 ** 6, images)
    if rows is None or None in rows:
        return None
    return sum(len(row[1]) for row in rows if isinstance(row, tuple))


@needs_native
@pytest.mark.parametrize("options", TUPLE_OPTIONS, ids=TUPLE_OPTION_IDS)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entry=plain_entries())
def test_tuple_c_path_matches_python(entry, options):
    """Generated Entries of every column type, some values adversarial (non-canonical, wrong type,
    bad UTF-8, unknown DataType), headers and rows with and without properties."""
    assert_same_tuples(entry.SerializeToString(), options)


@needs_native
@pytest.mark.parametrize("options", TUPLE_OPTIONS[:3], ids=TUPLE_OPTION_IDS[:3])
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entry=shaped_entries())
def test_tuple_shapes_dts_sends_match_python(entry, options):
    """The issue's shapes (charsets on text and temporals, fractional seconds, zero and invalid
    dates, doubles spelt '1', BIT, YEAR, NIL, header properties); under the default options a
    well-formed value leaves C only when a temporal policy substitutes it (so Python counts it)."""
    raw = entry.SerializeToString()
    rows, notes, _ = assert_same_tuples(raw, options)
    if options is bridge.DEFAULT_OPTIONS and not _is_error(rows) and _clean(entry):
        assert _tuple_holes(raw) == len(notes), "C gave way on a value no policy substitutes"


@needs_native
@pytest.mark.parametrize("table", [REAL_ORDERS, REAL_SUPPLIERS], ids=["orders", "suppliers"])
@pytest.mark.parametrize("options", TUPLE_OPTIONS, ids=TUPLE_OPTION_IDS)
def test_tuple_realistic_entries_match_python(table, options):
    """The benchmarks' realistic mix (samples/realistic.pb's shapes), 1 and 3 rows an Entry; every
    value C leaves to Python under zero_dates=null (the default) is a substituted zero date."""
    raws = realistic_entries(30, seed=7, table=table) + realistic_entries(10, seed=8, rows_per_entry=3, table=table)
    substituted = holes = 0
    for raw in raws:
        rows, notes, _ = assert_same_tuples(raw, options)
        assert not _is_error(rows) or options.zero_dates == "error"
        if options.zero_dates == "null" and options.timezone == "UTC":
            holes += _tuple_holes(raw, options)
            substituted += len(notes)
    assert holes == substituted


@needs_native
@pytest.mark.parametrize("path", sorted(glob.glob("samples/*.pb")))
def test_tuple_samples(path):
    for _, _, value in bridge.read_pb(path):
        env = pb.Envelope.FromString(value)
        if env.total == 1:
            for raw in blob_rows.split_items(env.data):
                for options in TUPLE_OPTIONS[:2]:
                    assert_same_tuples(raw, options)


@needs_native
def test_tuple_c_path_is_taken():
    """The plain Entry's rows come from C, meta columns and all; row properties and DataHub facts
    leave the Entry to Python."""
    raw = WIRE["plain"]
    entry = pb.Entry.FromString(raw)
    encoder = bridge.TupleEncoder()
    plan = encoder._tables.get(entry.event.dmlEvent.columns).native
    meta = {"_operation_type_": "I"}
    assert plan.tuples(raw, pb.INSERT, "_sequence_id_", 42 * 10 ** 6, (meta,)) == [
        {"id": 0, "name": 'n0\n"', "_sequence_id_": "42000000", "_operation_type_": "I"},
        {"id": 1, "name": 'n1\n"', "_sequence_id_": "42000001", "_operation_type_": "I"}]
    assert plan.tuples(WIRE["row properties"], pb.INSERT, "_sequence_id_", 0, (meta,)) is None
    assert plan.tuples(raw, pb.INSERT, "_sequence_id_", 1 << 63, (meta,)) is None  # Python's big number
    assert plan.tuples(WIRE["NIL"], pb.INSERT, "s", 0, ({},)) == [{"id": 0, "name": None, "s": "0"}]
    assert plan.tuples(WIRE["bare NA"], pb.INSERT, "s", 0, ({},)) == [{"id": 0, "name": None, "s": "0"}]
    assert plan.tuples(WIRE["Data with dataType 0"], pb.INSERT, "s", 0, ({},)) == [
        ({"id": None, "name": 'n0\n"', "s": "0"}, [0])]  # dataType twice: Python decides that value
    assert encoder._native_rows(entry, entry.header, entry.event.dmlEvent, ((("I", "N", "Y", "new"),)),
                                encoder._tables.get(entry.event.dmlEvent.columns), raw) == encoder.convert(entry, raw)
    with pytest.raises(TypeError):
        bridge.BlobEncoder()._tables.get(entry.event.dmlEvent.columns).native.tuples(
            raw, pb.INSERT, "s", 0, ({},))


# column type -> values at the edges of what C takes (DataHub's TIMESTAMP range ends at 9999-12-31
# 15:59:59 UTC; FLOAT rounds to float32; unsigned BIGINT is a Decimal; spellings C leaves to Python)
_TUPLE_EDGES = {
    "datetime": ["9999-12-31 15:59:59", "9999-12-31 16:00:00", "9999-12-31 23:59:59", "0001-01-01 00:00:00",
                 "1970-01-01 00:00:00", "1969-12-31 23:59:59", "0000-00-00 00:00:00", "2021-02-29 00:00:00"],
    "datetime(6)": ["9999-12-31 15:59:59.999999", "9999-12-31 16:00:00.000000", "2021-01-01 00:00:00.000001"],
    "timestamp": ["9999-12-31 15:59:59 +00:00", "9999-12-31 16:00:00 +00:00", "2021-01-01 00:00:00 +08:00"],
    "date": ["9999-12-31", "0001-01-01", "0000-00-00", "2021-00-17"],
    "float": ["0.1", "1.1", "16777217.0", "3.4028234e+38", "1", "-0.0", "123456789012345.0"],
    "double": ["0.1", "1", "-0.0", "1e3", "123456789012345.6"],
    "bigint(20) unsigned": ["0", "18446744073709551615", "18446744073709551616", "-1", "007"],
    "decimal(30,9)": ["0.000000001", "-0", "1.10", "1e3", "12345678901234567890.123456789"],
    "tinyint(1)": ["0", "1", "2", "-1"],
}


@needs_native
@pytest.mark.parametrize("type_text", sorted(_TUPLE_EDGES))
def test_tuple_edges(type_text):
    column = pb.Column(name="c", originalType=type_text)
    if type_text == "tinyint(1)":
        column.properties.add(key="datahub:type", value="BOOLEAN")
    dt = values_table.parse_column_type(type_text).canonical_datatype()
    for text in _TUPLE_EDGES[type_text]:
        data = pb.Data(dataType=pb.STRING, bv=text.encode()) if dt == pb.STRING else pb.Data(dataType=dt, sv=text)
        entry = pb.Entry(header=pb.Header(messageType=pb.DML, timestamp=1_700_000_000, schemaName="s",
                                          tableName="t", seqId=5))
        entry.event.dmlEvent.columns.append(column)
        entry.event.dmlEvent.rows.add(newColumns=[data])
        for options in TUPLE_OPTIONS[:3]:
            assert_same_tuples(entry.SerializeToString(), options)
