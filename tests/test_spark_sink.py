"""Spark's `dts_to_blob` batch function with the C sink (`_speedups.Sink`) against the same function
without it, which converts Entry by Entry through `BlobEncoder.convert_columns` (itself checked
against the pure-Python path in tests/test_speedups.py).

The two must give the same Arrow rows in the same order, the same errors and the same tally, for
any stream: plain DML Entries (which the sink writes), Entries it leaves to Python (control events,
properties, headers or images it is not sure of, fields repeated or out of place on the wire),
tables seen again after others, Entries split over Envelopes, framing errors, every mode. No
Spark session: the batch function runs on Arrow batches directly, as a Spark worker runs it.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge.blob import rows as blob_rows
from bridge.errors import BridgeError
from bridge.stream import Tally
from bridge.wire.framing import encode_varint
from support.strategies import INT64, UINT32, UINT64, begin_entries, commit_entries, dml_entries, mysql_columns

pa = pytest.importorskip("pyarrow")

import bridge.spark as bs  # noqa: E402
import bridge.spark.jobs as jobs  # noqa: E402
from support.spark_batches import TallyRecorder, kafka_batches, kafka_schema  # noqa: E402

pytestmark = pytest.mark.skipif(not blob_rows.NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")

KAFKA = kafka_schema()
OPTIONS = {"lossless": bridge.DEFAULT_OPTIONS, "strict": bridge.Options(strict=True),
           "db-version": bridge.Options(db_version="8.0.32", control_events="drop")}


def _batches(values: list[bytes], per_batch: int = 1000, partition: int = 0, topic: str | None = "dts") -> list:
    return kafka_batches(values, per_batch, partition, topic)


SUNK: list = []  # Entries the sink wrote, per run


def _run(batches: list, sink: bool, options, mode: str):
    original, init = jobs._DtsToBlob.use_sink, jobs._DtsToBlob.__init__
    made = []

    def record(self, *args):
        init(self, *args)
        made.append(self)
    jobs._DtsToBlob.use_sink = sink
    jobs._DtsToBlob.__init__ = record
    try:
        tally = TallyRecorder()
        fn = bs.dts_to_blob_batches(options, mode, arrow=True, tally=tally)
        out = list(fn(iter(batches)))
    except BridgeError as exc:
        return ("error", type(exc).__name__, str(exc)), None, []
    finally:
        jobs._DtsToBlob.use_sink, jobs._DtsToBlob.__init__ = original, init
        if sink:
            SUNK.append(sum(job.sunk for job in made))
    schema = pa.schema([(name, jobs._arrow_type(kind)) for name, kind in jobs._with_error(jobs.BLOB_COLUMNS, mode)])
    return pa.Table.from_batches(out, schema=schema), tally.seen, [b.num_rows for b in out]


def assert_same(batches: list, options=bridge.DEFAULT_OPTIONS, mode: str = "FAILFAST") -> pa.Table:
    got, got_tally, got_sizes = _run(batches, True, options, mode)
    expected, expected_tally, _ = _run(batches, False, options, mode)
    if isinstance(expected, tuple) or isinstance(got, tuple):  # an error, on one side or both
        assert got == expected
        return expected
    assert got.schema == expected.schema
    for name in expected.column_names:
        assert got[name].to_pylist() == expected[name].to_pylist(), name
    assert got_tally == expected_tally
    assert all(0 < n <= jobs._OUT_ROWS for n in got_sizes)
    for chunk in got["blob"].chunks:
        chunk.validate(full=True)  # the sink's lines are UTF-8 without a check of their own
    return expected


def _values(entries: list, max_bytes: int = 1 << 20) -> list[bytes]:
    return [env.SerializeToString() for env in bridge.pack_entries(entries, max_bytes)]


def _plain(entry: pb.Entry) -> pb.Entry:
    """The Entry without properties anywhere: what the sink takes (when its values are canonical)."""
    entry = pb.Entry.FromString(entry.SerializeToString())
    del entry.header.properties[:]
    del entry.event.properties[:]
    for row in entry.event.dmlEvent.rows:
        del row.properties[:]
    return entry


def _item(entry_bytes: bytes) -> bytes:
    return b"\x0a" + encode_varint(len(entry_bytes)) + entry_bytes


def _envelope(items: list[bytes]) -> bytes:
    return pb.Envelope(version=1, total=1, index=0, data=b"".join(items)).SerializeToString()


def _wire_entry(header: bytes, event: bytes, extra: bytes = b"") -> bytes:
    return b"\x0a" + encode_varint(len(header)) + header + b"\x12" + encode_varint(len(event)) + event + extra


# ---- examples ---------------------------------------------------------------------------------------------

COLUMNS = [("id", "bigint(20)", True), ("name", "varchar(32)", False), ("price", "decimal(10,2)", False)]
# the columns a DataWorks message without extension decodes to: a one-row Entry with the default
# header needs no extension
FOREIGN = [("id", "bigint(20)", True), ("name", "longtext", False), ("price", "double", False)]
_DATA = {"bigint(20)": lambda i, r: pb.Data(dataType=pb.INT64, sv=str(i * 10 + r + 1)),
         "varchar(32)": lambda i, r: pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=f"n\u00e9\"{i}\n".encode()),
         "longtext": lambda i, r: pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=f"t\u00e9\\{r}".encode()),
         "decimal(10,2)": lambda i, r: pb.Data(dataType=pb.DECIMAL, sv=f"{i}.{r:02d}"),
         "double": lambda i, r: pb.Data(dataType=pb.FLOAT64, sv=f"{i}.5")}


def _orders(n: int, seq: int = 1, table: str = "orders", dml_type: int = pb.INSERT, rows: int = 2,
            columns=COLUMNS, **header) -> list:
    out = []
    for i in range(n):
        entry = pb.Entry()
        h = entry.header
        h.version, h.sourceType, h.messageType = 1, pb.MYSQL, pb.DML
        h.timestamp, h.schemaName, h.tableName, h.seqId = 1_700_000_000 + i, "shop", table, seq + i
        h.fileName, h.position, h.gtid = "mysql-bin.000001", 4 + i, f"3E11FA47-71CA-11E1-9E33-C80AA9429562:{i + 1}"
        for k, v in header.items():
            setattr(h, k, v)
        dml = entry.event.dmlEvent
        dml.dmlEventType = dml_type
        for name, kind, key in columns:
            dml.columns.add(name=name, originalType=kind, isKey=key)
        for r in range(rows):
            row = dml.rows.add()
            for image in ([row.oldColumns] if dml_type != pb.INSERT else []) + (
                    [row.newColumns] if dml_type != pb.DELETE else []):
                image.extend(_DATA[kind](i, r) for _, kind, _ in columns)
        out.append(entry)
    return out


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("mode", ["FAILFAST", "PERMISSIVE", "DROPMALFORMED"])
def test_plain_stream_of_every_op_and_table(options, mode):
    entries = (_orders(30) + _orders(20, seq=100, table="items", dml_type=pb.UPDATE)
               + _orders(10, seq=200, dml_type=pb.DELETE, rows=1) + _orders(5, seq=300, rows=1, gtid="",
                                                                            fileName="", position=0))
    table = assert_same(_batches(_values(entries, 4000), per_batch=3), options, mode)
    assert table.num_rows == 30 * 2 + 20 * 4 + 10 + 5
    assert SUNK[-1] == 65 - 2  # all but the first Entry of each table


def test_output_batches_stay_under_the_row_limit():
    entries = _orders(3000, rows=3)  # 9,000 messages in a few Envelopes
    table = assert_same(_batches(_values(entries)))
    assert table.num_rows == 9000
    assert SUNK[-1] == 2999


def test_a_header_the_sink_writes_itself():
    """Every header field at an edge: negative int32 and int64, the largest uint64, escapes and
    non-ASCII text, isLast; and a default header on a one-row Entry (no extension)."""
    odd = dict(version=-7, serverId=INT64[0], position=UINT64, eventIndex=UINT64, isLast=True,
               fileName="bin\"\\\x01\u2028\U0001F600", gtid="\t")
    entries = (_orders(3, **odd) + _orders(3, seq=10, version=0, serverId=INT64[1], gtid="", fileName="", position=0)
               + _orders(3, seq=20, rows=1, gtid="", fileName="", position=0)
               + _orders(2, seq=0, timestamp=UINT32))
    bare = dict(gtid="", fileName="", position=0, rows=1, columns=FOREIGN, table="dw")
    entries += (_orders(3, seq=30, **bare) + _orders(1, seq=40, **{**bare, "gtid": "g"})
                + _orders(1, seq=50, **{**bare, "version": 2}) + _orders(1, seq=60, **{**bare, "isLast": True})
                + _orders(1, seq=70, **{**bare, "rows": 2}) + _orders(2, seq=80, **bare))
    quiet = [line for line in assert_same(_batches(_values(entries)))["blob"].to_pylist() if '"dts"' not in line]
    assert len(quiet) == 3 + 2  # the one-row Entries with the default header
    for options in OPTIONS.values():
        assert_same(_batches(_values(entries)), options)
        assert SUNK[-1] == len(entries) - 2  # the first Entry of each table is Python's


def test_a_table_the_sink_cannot_take_is_asked_about_once(monkeypatch):
    """A table whose `sink_table` is None (C cannot write it) is remembered as None: its Entries all
    go through convert_columns, with the same rows, and `sink_table` is not asked again for each."""
    asked = []
    from bridge.blob.encode import BlobEncoder
    original = BlobEncoder.sink_table

    def none_for_items(self, entry, raw):
        asked.append(entry.header.tableName)
        return None if entry.header.tableName == "items" else original(self, entry, raw)
    monkeypatch.setattr(BlobEncoder, "sink_table", none_for_items)
    entries = _orders(6) + _orders(6, seq=100, table="items")
    assert_same(_batches(_values(entries, 4000), per_batch=2))
    assert SUNK[-1] == 5  # orders' Entries after its first; none of items'
    assert asked == ["orders", "items"]  # once per table (the run with the sink off registers none)
    from bridge.native import speedups
    raw = entries[7].SerializeToString()
    assert speedups.Sink().entries([raw], 0, {speedups.table_key(raw): None}, 0, 0, True, b"v") == (0, 0, 0)


def test_entries_the_sink_leaves_to_python():
    """Control events, properties, a non-canonical value, a timestamp before 2001, header fields
    repeated, of another wire type, unknown, and an Entry field beyond header and event: the rows
    come from convert_columns, in order between the sink's."""
    base = _orders(4)
    event = base[0].event.SerializeToString()
    header = base[0].header.SerializeToString()
    with_props = pb.Entry.FromString(base[1].SerializeToString())
    with_props.header.properties.add(key="k", value="v")
    odd_value = pb.Entry.FromString(base[2].SerializeToString())
    odd_value.event.dmlEvent.rows[1].newColumns[0].sv = "007"
    early = _orders(1, seq=50, timestamp=5)[0]
    control = [pb.Entry(header=pb.Header(version=1, messageType=pb.BEGIN, timestamp=1_700_000_000)),
               pb.Entry(header=pb.Header(version=1, messageType=pb.COMMIT, timestamp=1_700_000_000))]
    items = [_item(e.SerializeToString()) for e in [base[0], control[0], with_props, odd_value, early, base[3],
                                                      control[1]]]
    items += [_item(_wire_entry(header + b"\x20\x01", event)),  # timestamp again (protobuf keeps the last)
              _item(_wire_entry(header + b"\x70\x05", event)),  # field 14, unknown
              _item(_wire_entry(header + b"\x5a\x00", event)),  # seqId as a string: another wire type
              _item(_wire_entry(header, event, b"\x18\x01")),  # Entry field 3
              _item(base[1].SerializeToString())]
    for options in OPTIONS.values():
        for mode in ("FAILFAST", "PERMISSIVE"):
            assert_same(_batches([_envelope(items)] + _values(base)), options, mode)
            if mode == "PERMISSIVE":  # (FAILFAST stops at the early timestamp)
                assert SUNK[-1] == 1 + 1 + 4  # base[0] registers the table: base[3], base[1], all of base


def test_framing_errors_and_split_envelopes_keep_their_place():
    values = _values(_orders(40), 900)  # split into segments
    broken = values[:3] + [b"\xff\xff"] + values[3:10] + values[11:]  # garbage, then a missing segment
    for mode in ("FAILFAST", "PERMISSIVE", "DROPMALFORMED"):
        assert_same(_batches(broken, per_batch=4), mode=mode)


def test_a_partition_without_topic_or_of_null_partition():
    values = _values(_orders(10))
    assert_same(_batches(values, topic=None))
    nulls = pa.RecordBatch.from_pydict({"topic": ["t"] * len(values), "partition": [None] * len(values),
                                        "offset": list(range(len(values))), "value": values}, schema=KAFKA)
    assert_same([nulls])


# ---- generated streams --------------------------------------------------------------------------------------

@st.composite
def streams(draw):
    """Entries over a few tables that come back, most of them plain, with control events and
    Entries carrying properties in between."""
    tables = [(draw(mysql_columns(max_size=5)), name) for name in ("a", "b", "c")[:draw(st.integers(1, 3))]]
    out = []
    for _ in range(draw(st.integers(1, 12))):
        roll = draw(st.integers(0, 9))
        if roll == 0:
            out.append(draw(st.one_of(begin_entries(), commit_entries())))
            continue
        columns, name = draw(st.sampled_from(tables))
        entry = draw(dml_entries(columns))
        entry.header.tableName = name
        if roll > 2:
            entry = _plain(entry)
        if roll > 6:  # a time the sink writes (the 13-digit eventTime)
            entry.header.timestamp = draw(st.integers(1_000_000_000, UINT32))
        out.append(entry)
    return out


@given(streams(), st.sampled_from(list(OPTIONS)), st.sampled_from(["FAILFAST", "PERMISSIVE"]),
       st.sampled_from([300, 2000, 1 << 20]))
def test_generated_streams_give_the_same_rows(entries, options, mode, max_bytes):
    assert_same(_batches(_values(entries, max_bytes), per_batch=3), OPTIONS[options], mode)


# ---- Entries known to parse ----------------------------------------------------------------------------------

def _parses(data: bytes) -> bool:
    try:
        pb.Entries.FromString(data)
    except Exception:  # noqa: BLE001  (protobuf's DecodeError, whatever its module)
        return False
    return True


def test_valid_entries_knows_every_sample():
    import glob
    import os

    from bridge.native import _speedups
    seen = 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "samples", "*.pb"))):
        for _, _, raw in bridge.read_pb(path):
            env = pb.Envelope.FromString(raw)
            if env.total == 1:
                assert _speedups.valid_entries(env.data)
                seen += 1
    assert seen > 10
    assert _speedups.valid_entries(b"".join(_values(_orders(50)))[:0])  # empty: an empty Entries


_CUTS = st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["flip", "drop", "insert", "cut"]),
                           st.integers(0, 255)), max_size=3)


@given(streams(), _CUTS)
def test_valid_entries_never_says_yes_to_what_protobuf_refuses(entries, cuts):
    """Byte flips, drops, inserts and cuts of an Entries encoding: whatever valid_entries takes,
    protobuf parses; and a lazy Reassembler gives the same Entries as the parse."""
    from bridge.native import _speedups
    data = bytearray(b"".join(b"\x0a" + encode_varint(len(e.SerializeToString())) + e.SerializeToString()
                              for e in entries))
    for at, how, byte in cuts:
        at = at % (len(data) + 1)
        if how == "flip" and at < len(data):
            data[at] ^= byte or 0x80
        elif how == "drop" and at < len(data):
            del data[at]
        elif how == "insert":
            data.insert(at, byte)
        elif how == "cut":
            del data[at:]
    data = bytes(data)
    if _speedups.valid_entries(data):
        assert _parses(data)
    if not cuts:
        assert _speedups.valid_entries(data)
    envelope = pb.Envelope(version=1, total=1, index=0, data=data).SerializeToString()
    lazy, eager = (bridge.Reassembler(lazy=flag).feed(0, 0, envelope)[0] for flag in (True, False))
    if isinstance(eager, bridge.Assembled):
        assert isinstance(lazy, bridge.Assembled) and lazy.raws == eager.raws
        assert list(lazy.entries.items) == list(eager.entries.items)
    else:
        assert type(lazy) is type(eager) and str(lazy) == str(eager)


def _entries_bytes(entry_bytes: bytes) -> bytes:
    return b"\x0a" + encode_varint(len(entry_bytes)) + entry_bytes


@pytest.mark.parametrize("case", ["utf8-column-name", "utf8-charset", "utf8-kv", "varint-65-bits", "field-0",
                                  "group", "short-length"])
def test_valid_entries_refuses_what_protobuf_refuses(case):
    from bridge.native import _speedups
    entry = _orders(1)[0]
    if case == "utf8-column-name":
        entry.event.dmlEvent.columns[0].name = "\u00e9"
        data = _entries_bytes(entry.SerializeToString().replace("\u00e9".encode(), b"\xff\xfe"))
    elif case == "utf8-charset":
        data = _entries_bytes(entry.SerializeToString().replace(b"utf8mb4", b"utf8m\xc0\x80"))
    elif case == "utf8-kv":
        entry.header.properties.add(key="k", value="v\u00e9")
        data = _entries_bytes(entry.SerializeToString().replace("v\u00e9".encode(), b"v\xed\xa0\x80"[:3]))
    elif case == "varint-65-bits":
        data = _entries_bytes(_wire_entry(b"\x08" + b"\xff" * 9 + b"\x02", b""))
    elif case == "field-0":
        data = _entries_bytes(entry.SerializeToString()) + b"\x00\x01"
    elif case == "group":
        data = _entries_bytes(entry.SerializeToString()) + b"\x1b\x1c"  # field 3 start and end group
    else:
        data = _entries_bytes(entry.SerializeToString())[:-1]
    assert not _speedups.valid_entries(data)
    assert _speedups.valid_entries(_entries_bytes(entry.SerializeToString())) or case == "utf8-kv"
    # protobuf keeps a well-formed group as an unknown field and drops a varint's 65th bit: there the
    # check is only not sure, and protobuf's own parse decides
    assert _parses(data) == (case in ("group", "varint-65-bits"))


# ---- one bad Entry: the mode decides, with the sink as without it (docs/spark.md, "Bad records: `mode`") -------------------------

def _bad_source_type(entry: pb.Entry) -> str:
    entry.header.sourceType = 4
    return "unknown SourceType 4 (partition 0, offset 1, seqId 2, table shop.orders, topic dts)"


def _unknown_column_type(entry: pb.Entry) -> str:
    entry.event.dmlEvent.columns[1].originalType = "frobnicate(3)"
    return ("unknown MySQL column type: frobnicate(3) (partition 0, offset 1, seqId 2, table shop.orders, "
            "column name, topic dts)")


def _unparsable_column_type(entry: pb.Entry) -> str:
    entry.event.dmlEvent.columns[2].originalType = "decimal(x,"
    return ("unknown MySQL column type: decimal(x, (partition 0, offset 1, seqId 2, table shop.orders, "
            "column price, topic dts)")


def _unparsable_arguments(entry: pb.Entry) -> str:
    entry.event.dmlEvent.columns[2].originalType = "decimal(x,2)"
    return ("unparsable MySQL column type arguments: decimal(x,2) (partition 0, offset 1, seqId 2, "
            "table shop.orders, column price, topic dts)")


BAD_ENTRIES = {"unknown-source-type": _bad_source_type, "unknown-column-type": _unknown_column_type,
               "unparsable-column-type": _unparsable_column_type, "unparsable-arguments": _unparsable_arguments}


@pytest.mark.parametrize("mode", ["FAILFAST", "PERMISSIVE", "DROPMALFORMED"])
@pytest.mark.parametrize("case", BAD_ENTRIES)
def test_one_bad_entry_between_two_good_ones(case, mode):
    """Three single-Entry Envelopes, the middle one bad: the sink registers no table from an Entry
    the mode rejected, so FAILFAST raises the bridge error and the other modes carry on."""
    entries = _orders(3, rows=1)
    error = BAD_ENTRIES[case](entries[1])
    batches = _batches([_values([e])[0] for e in entries])
    table = assert_same(batches, mode=mode)
    got, tally, _ = _run(batches, True, bridge.DEFAULT_OPTIONS, mode)
    if mode == "FAILFAST":
        assert got == ("error", "ConversionError", error)
        return
    keep = mode == "PERMISSIVE"
    assert table["offset"].to_pylist() == ([0, 1, 2] if keep else [0, 2])
    assert table["sequence_id"].to_pylist() == (["1000000", None, "3000000"] if keep else ["1000000", "3000000"])
    if keep:
        assert table["error"].to_pylist() == [None, error, None]
        assert table["entry"].to_pylist() == [0, 0, 0] and table["blob"].to_pylist()[1] is None
    assert tally == [dataclasses.asdict(Tally(input=3, converted=2, rejected=1, outputs=2, envelopes=3))]


@pytest.mark.parametrize("mode", ["PERMISSIVE", "DROPMALFORMED"])
@pytest.mark.parametrize("case", BAD_ENTRIES)
def test_bad_entries_inside_an_entries_leave_the_sink_to_the_good_ones(case, mode):
    """A bad Entry first of its Entries (before any table is known) and again among good ones of its
    table: each is rejected where it stands, the first good Entry registers the table, and the sink
    writes every good one after it."""
    good = _orders(7, rows=2)
    first, second = (pb.Entry.FromString(good[0].SerializeToString()) for _ in range(2))
    BAD_ENTRIES[case](first)
    BAD_ENTRIES[case](second)
    values = _values([first] + good[:4]) + _values(good[4:5] + [second] + good[5:])
    assert len(values) == 2
    table = assert_same(_batches(values), mode=mode)
    assert SUNK[-1] == 7 - 1
    if mode == "PERMISSIVE":
        errors = table["error"].to_pylist()
        assert [(o, e) for o, e, err in zip(table["offset"].to_pylist(), table["entry"].to_pylist(), errors)
                if err is not None] == [(0, 0), (1, 1)]
    else:
        assert table.num_rows == 14
    assert [line for line in table["blob"].to_pylist() if line is not None] == [
        bridge.encode_blob(m).decode() for e in good for m in bridge.BlobEncoder().convert(e)]
    _, tally, _ = _run(_batches(values), True, bridge.DEFAULT_OPTIONS, mode)
    assert tally == [dataclasses.asdict(Tally(input=9, converted=7, rejected=2, outputs=14, envelopes=2))]
