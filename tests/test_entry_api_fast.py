"""The pure-function API's fast path (issue 18, point 2): `entry_to_blob(entry)` goes straight to the
C messages of a plain DML Entry (`BlobEncoder._convert_serialised`), and the dict writer in C keeps
each non-ASCII str's UTF-8 (`keep_utf8` in bridge/native/src/writers.c), reads short decimal
doubles itself (`short_decimal`) and decodes UTF-8 and table charsets in one writer (`utf8_str`,
C_TABLE). Each is held here to the Python path (the reference): the same messages, the same JSON
bytes, the same errors and counts, and a str whose kept UTF-8 is its own."""
from __future__ import annotations

import math
import struct

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge.blob import rows as blob_rows
from bridge.samples.values import REAL_ORDERS, REAL_SUPPLIERS, realistic_entries
from support.native_paths import assert_outcomes, outcome
from support.strategies import dml_entries

needs_native = pytest.mark.skipif(not blob_rows.NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")
OPTIONS = [bridge.DEFAULT_OPTIONS, bridge.Options(strict=True)]
OPTION_IDS = ["lossless", "strict"]


def _strings(obj):
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield key
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)
    elif isinstance(obj, str):
        yield obj


def _fresh(text: str) -> str:
    """A new str of the same text, made by Python (no UTF-8 kept in it yet)."""
    return (text + "\x00")[:-1]


def assert_like_python(entry: pb.Entry, options) -> list:
    """entry_to_blob(entry) against BlobEncoder(options).convert(entry) in pure Python: the same
    outcome, the same JSON lines, the same counts; every str's UTF-8 (what str.encode and orjson
    read, from the kept form when there is one) that of the same text made fresh. Returns the messages."""
    raw = entry.SerializeToString()
    python = bridge.BlobEncoder(options)
    expected = outcome(lambda: python.convert(pb.Entry.FromString(raw)))
    shared = bridge.blob.encode._encoder(options)
    before = (shared.entries, shared.emitted)
    got = outcome(lambda: bridge.entry_to_blob(pb.Entry.FromString(raw), options))
    assert_outcomes(got, expected, "entry_to_blob(entry)")
    if isinstance(got, tuple):
        return []
    assert (shared.entries - before[0], shared.emitted - before[1]) == (python.entries, python.emitted)
    assert [orjson.dumps(m) for m in got] == [orjson.dumps(m) for m in expected]
    for text in _strings(got):
        assert text.encode("utf-8", "surrogatepass") == _fresh(text).encode("utf-8", "surrogatepass"), text
    return got


@needs_native
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(entry=dml_entries())
def test_entry_to_blob_is_the_python_path_on_generated_entries(entry, options):
    """Every MySQL type and charset, properties anywhere (Entries C leaves to Python: the fallback
    `_convert_rest` must give what `convert` gives, errors included)."""
    assert_like_python(entry, options)


def _text_entry(charset: str, datas: list[pb.Data]) -> pb.Entry:
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                      schemaName="s", tableName="t", seqId=7))
    dml = entry.event.dmlEvent
    dml.dmlEventType = pb.INSERT
    dml.columns.add(name="id", originalType="bigint(20)", isKey=True)
    dml.columns.add(name="t", originalType="varchar(255)")
    dml.columns.add(name="d", originalType="double")
    for index, data in enumerate(datas):
        row = dml.rows.add()
        row.newColumns.add(dataType=pb.INT64, sv=str(index))
        row.newColumns.add().CopyFrom(data)
        row.newColumns.add(dataType=pb.FLOAT64, sv="1.5")
    return entry


# text of every plane: ASCII, Latin-1, the BMP, astral characters (each str width), and bytes
# that are not UTF-8 (C gives way, Python decides)
_TEXT = st.one_of(st.text(max_size=40), st.text(st.characters(max_codepoint=0xFF), max_size=40),
                  st.text(st.characters(min_codepoint=0x10000), max_size=8))


@needs_native
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(texts=st.lists(st.one_of(_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=12)),
                      min_size=1, max_size=4),
       charset=st.sampled_from(["utf8mb4", "utf8", "", "gbk", "latin1", "big5", "GBK"]))
def test_text_in_c_is_the_python_text(texts, charset, options):
    """UTF-8 text (one pass for ASCII, two for the rest, each str width) and text of a table charset
    (gbk, latin1, big5: one pass over its units) come out of C as Python decodes them."""
    datas = [pb.Data(dataType=pb.STRING, charset=charset, bv=b) for b in texts]
    got = assert_like_python(_text_entry(charset, datas), options)
    for msg in got:
        value = msg["payload"]["after"]["dataColumn"]["t"]
        if isinstance(value, str) and not value.isascii():
            assert orjson.dumps(value) == orjson.dumps(_fresh(value))


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


@needs_native
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(values=st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                 st.integers(-10 ** 15, 10 ** 15).map(lambda n: n / 10 ** 6),
                                 st.decimals(allow_nan=False, allow_infinity=False, places=4,
                                             min_value=-10 ** 11, max_value=10 ** 11).map(float)),
                       min_size=1, max_size=4))
def test_doubles_read_in_c_are_the_doubles_python_reads(values, options):
    """A double's text (its repr, as DTS sends it) read by C's short-decimal path or by Python's
    reader: the same double, bit for bit (-0.0 included), as float(text) gives."""
    texts = [repr(v) for v in values]
    entry = _text_entry("utf8mb4", [pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"x")] * len(texts))
    for row, text in zip(entry.event.dmlEvent.rows, texts):
        row.newColumns[2].sv = text
    got = assert_like_python(entry, options)
    for msg, text in zip(got, texts):
        value = msg["payload"]["after"]["dataColumn"]["d"]
        assert _bits(value) == _bits(float(text)), text


@needs_native
@pytest.mark.parametrize("text", ["0.1", "-0.0", "0.0", "165.576", "999999999999999.0", "123456789012345.6",
                                  "1234567890123456.0", "0.1234567890123456", "1e-05", "1.5e+300", "5e-324",
                                  "0.0001", "1e-22", "9007199254740992.0", "0.3333333333333333",
                                  "-123.456", "1.0", "2.2250738585072014e-308", "12345678901234.5",
                                  "0.000123456789012345", "9.87654321098765"])
def test_doubles_at_the_edges_of_the_short_path(text):
    """15 significant digits and 22 after the point are the short path's limits; past them, and for
    exponents, Python's reader decides. Every one is float(text) exactly."""
    assert repr(float(text)) == text  # DTS sends a double's repr; C leaves other spellings to Python
    entry = _text_entry("utf8mb4", [pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"x")])
    entry.event.dmlEvent.rows[0].newColumns[2].sv = text
    got = assert_like_python(entry, bridge.DEFAULT_OPTIONS)
    value = got[0]["payload"]["after"]["dataColumn"]["d"]
    assert _bits(value) == _bits(float(text))
    assert math.copysign(1, value) == math.copysign(1, float(text))


@needs_native
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_the_realistic_shapes_through_entry_to_blob(options):
    """DTS's bytes as the samples write them (charsets on text and temporals, gbk, zero dates,
    DATETIME(6), header properties): entry_to_blob gives the Python path's messages, and the
    C path took the plain Entries (the fast route is the one measured)."""
    raws = (realistic_entries(12, seed=3) + realistic_entries(6, seed=4, rows_per_entry=3)
            + realistic_entries(6, seed=5, table=REAL_SUPPLIERS))
    assert REAL_ORDERS.name and raws
    taken = 0
    for raw in raws:
        entry = pb.Entry.FromString(raw)
        assert_like_python(entry, options)
        encoder = bridge.BlobEncoder(options)
        taken += encoder._plain(entry, entry.header, entry.SerializeToString()) is not None
    assert taken > len(raws) // 2


@needs_native
def test_messages_a_user_changes_do_not_change_the_next_ones():
    """The dicts entry_to_blob gives are the caller's: changing a value, a payload or a list of one
    message leaves the next call's messages as the Python path gives them."""
    entry = _text_entry("utf8mb4", [pb.Data(dataType=pb.STRING, charset="utf8mb4", bv="Zürich 北京".encode())])
    first = bridge.entry_to_blob(entry)
    first[0]["payload"]["after"]["dataColumn"]["t"] = "changed"
    first[0]["payload"]["op"] = "DELETE"
    first[0]["dts"]["row"].append(9)
    again = assert_like_python(entry, bridge.DEFAULT_OPTIONS)
    assert again[0]["payload"]["after"]["dataColumn"]["t"] == "Zürich 北京"
    assert again[0]["dts"]["row"] == [0, 1]


# ---- dts.header read in C (Plan.messages given (props,)) ------------------------------------------

_HEADER_FIELDS = dict(
    version=st.one_of(st.sampled_from([0, 1, 2]), st.integers(-2 ** 31, 2 ** 31 - 1)),
    serverId=st.one_of(st.just(0), st.integers(-2 ** 63, 2 ** 63 - 1)),
    fileName=st.one_of(st.just(""), st.text(max_size=8)),
    position=st.one_of(st.just(0), st.integers(0, 2 ** 64 - 1)),
    gtid=st.one_of(st.just(""), st.text(max_size=8)),
    eventIndex=st.one_of(st.just(0), st.integers(0, 2 ** 64 - 1)),
    isLast=st.booleans(),
    timestamp=st.one_of(st.just(0), st.integers(0, 2 ** 32 - 1), st.just(999_999_999), st.just(10 ** 9)),
    seqId=st.one_of(st.just(0), st.integers(0, 2 ** 64 - 1), st.integers(0, 10 ** 6)),
)


def _default_columns_entry(rows: int) -> pb.Entry:
    """DataWorks' default columns (the extension may be left out of a one-row Entry's messages)."""
    entry = pb.Entry(header=pb.Header(messageType=pb.DML, timestamp=1_700_000_000, seqId=3, schemaName="s",
                                      tableName="t"))
    dml = entry.event.dmlEvent
    dml.columns.add(name="note", originalType="longtext")
    for _ in range(rows):
        dml.rows.add(newColumns=[pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"plain")])
    return entry


@needs_native
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(fields=st.fixed_dictionaries({}, optional=_HEADER_FIELDS), default_columns=st.booleans(),
       rows=st.integers(1, 2),
       props=st.lists(st.tuples(st.sampled_from(["subscribe_id", "region", "datahub:op"]), st.text(max_size=4)),
                      max_size=2))
def test_dts_header_read_in_c_is_the_header_python_reads(fields, default_columns, rows, props, options):
    """Every Header field dts.header holds, set or left at its default (a negative int32 version,
    an int64 serverId, uint64 positions, isLast), with and without header properties, on columns
    whose extension may be left out (one row, the default header) and on others; the timestamp
    (13-digit eventTime or not: an error) and seqId (0 or any uint64) C reads for the payload."""
    entry = _default_columns_entry(rows) if default_columns else _text_entry(
        "utf8mb4", [pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"x")] * rows)
    for name, value in fields.items():
        setattr(entry.header, name, value)
    for key, value in props:
        entry.header.properties.add(key=key, value=value)
    got = assert_like_python(entry, options)
    said = {k: v for k, v in fields.items() if k not in ("timestamp", "seqId")}
    if got and options.lossless and default_columns and rows == 1 and said in ({"version": 1}, {}):
        assert ("dts" in got[0]) == (said == {} or bool(props))


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return bytes([number << 3 | wire]) + payload


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = b""
    while True:
        out += bytes([n & 0x7F | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def _length(data: bytes) -> bytes:
    return _varint(len(data)) + data


@needs_native
@pytest.mark.parametrize("extra", [
    _field(1, 0, _varint(7)),                      # version twice: the last one counts
    _field(1, 0, _varint(0)),                      # version spelt out as 0 after 1
    _field(5, 0, _varint(-5)),                     # serverId, negative
    _field(6, 2, _length(b"")),                    # fileName spelt out empty
    _field(13, 0, _varint(2)),                     # isLast as 2 (true)
    _field(1, 0, _varint(2 ** 32 + 1)),            # version past 32 bits (truncated)
    _field(8, 2, _length("gtid-ü".encode())),      # gtid
    _field(4, 0, _varint(1_600_000_000)),          # timestamp twice: the last one counts
    _field(11, 0, _varint(2 ** 64 - 1)),           # seqId twice
    _field(4, 0, _varint(2 ** 32 + 1_600_000_000)),  # timestamp past 32 bits (truncated)
], ids=["version-twice", "version-zero", "server-negative", "empty-file", "is-last-2", "version-wide", "gtid",
        "timestamp-twice", "seq-twice", "timestamp-wide"])
def test_dts_header_off_hand_made_bytes_is_what_protobuf_reads(extra):
    """Bytes protobuf would not write (a field twice, a default spelt out, a wide varint) but reads:
    convert(entry, raw) of them (C first, Python where C is not sure) is the Python path's."""
    entry = _default_columns_entry(1)
    entry.header.version = 1
    raw = entry.SerializeToString()
    header = entry.header.SerializeToString() + extra
    rest = raw[len(_field(1, 2, _length(entry.header.SerializeToString()))):]
    raw = _field(1, 2, _length(header)) + rest
    parsed = pb.Entry.FromString(raw)
    for options in OPTIONS:
        expected = outcome(lambda: bridge.BlobEncoder(options).convert(pb.Entry.FromString(raw)))
        got = outcome(lambda: bridge.BlobEncoder(options).convert(parsed, raw))
        assert_outcomes(got, expected, "convert(entry, raw)")
        assert got == expected
        if not isinstance(got, tuple):
            assert [orjson.dumps(m) for m in got] == [orjson.dumps(m) for m in expected]


@needs_native
def test_system_time_stamps_in_python_and_the_rest_is_the_same():
    """Under system_time the payload's timestamp is Python's (it stamps each Entry); the messages
    are otherwise the Python path's."""
    options = bridge.Options(system_time=True)
    entry = _default_columns_entry(2)
    entry.header.version = 1
    got = bridge.entry_to_blob(entry, options)
    expected = bridge.BlobEncoder(options).convert(pb.Entry.FromString(entry.SerializeToString()))
    assert all("systemTime" in m["payload"]["timestamp"] for m in got)
    for m in got + expected:
        m["payload"]["timestamp"].pop("systemTime", None)  # one dict an Entry's messages share
    assert got == expected
