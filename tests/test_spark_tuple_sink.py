"""Spark's `dts_to_tuple` batch function with the C sink (`_speedups.TupleSink`, tuple_sink.c) against
the same function without it (`_DtsToTuple.use_sink = False`: every Entry through TupleEncoder.convert
and the field checks, itself checked in tests/test_spark_tuple_values.py).

The two must give equal Arrow tables (`pa.Table.equals`: the same values of the same types, in the
same order, the same nulls), the same error rows and the same tally, for any stream: plain DML
Entries of the job's table (which the sink writes), another table's (no rows), Entries it leaves to
Python (control events, DDL, properties, values it is not sure of, values the checks refuse), under
FAILFAST, PERMISSIVE and DROPMALFORMED, with and without positions. No Spark session: the batch
function runs on Arrow batches directly, as a Spark worker runs it.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge.errors import BridgeError
from bridge.native import NATIVE
from support.strategies import (
    UINT32,
    UINT64,
    begin_entries,
    commit_entries,
    ddl_entries,
    dml_entries,
    mysql_columns,
)

pa = pytest.importorskip("pyarrow")

import bridge.spark as bs  # noqa: E402
import bridge.spark.jobs as jobs  # noqa: E402
from support.spark_batches import TallyRecorder, kafka_batches, kafka_schema  # noqa: E402

pytestmark = pytest.mark.skipif(not NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")

KAFKA = kafka_schema()
TABLE = "shop.orders"
MODES = ["FAILFAST", "PERMISSIVE", "DROPMALFORMED"]
OPTIONS = {"default": bridge.DEFAULT_OPTIONS, "source-table": bridge.Options(source_table=True),
           "hex": bridge.Options(tuple_binary="hex"), "zero-dates-null": bridge.Options(zero_dates="null"),
           "not-utc": bridge.Options(timezone="Asia/Shanghai")}


def _batches(values: list[bytes], per_batch: int = 3, partition: int = 0, topic: str | None = "dts") -> list:
    return kafka_batches(values, per_batch, partition, topic)


def _values(entries: list, max_bytes: int = 1 << 20) -> list[bytes]:
    return [env.SerializeToString() for env in bridge.pack_entries(entries, max_bytes)]


SUNK: list = []  # Entries the sink wrote, per run


def _run(batches: list, sink: bool, schema, columns, options, mode: str, positions: bool):
    original, init = jobs._DtsToTuple.use_sink, jobs._DtsToTuple.__init__
    made = []

    def record(self, *args):
        init(self, *args)
        made.append(self)
    jobs._DtsToTuple.use_sink = sink
    jobs._DtsToTuple.__init__ = record
    try:
        tally = TallyRecorder()
        fn = bs.dts_to_tuple_batches(TABLE, schema, options, mode, columns=columns, positions=positions,
                                     arrow=True, tally=tally)
        out = list(fn(iter(batches)))
    except BridgeError as exc:
        return ("error", type(exc).__name__, str(exc)), None, []
    finally:
        jobs._DtsToTuple.use_sink, jobs._DtsToTuple.__init__ = original, init
    assert all((job.sink is not None) == sink for job in made)
    if sink:
        SUNK.append(sum(job.sunk for job in made))
    arrow_schema = pa.schema([(name, jobs._arrow_type(kind)) for name, kind in made[0].columns])
    return pa.Table.from_batches(out, schema=arrow_schema), tally.seen, [b.num_rows for b in out]


def assert_same(batches: list, schema, columns=None, options=bridge.DEFAULT_OPTIONS, mode: str = "FAILFAST",
                positions: bool = False):
    """The job with the sink and without it give equal tables and tallies (or the same error)."""
    got, got_tally, got_sizes = _run(batches, True, schema, columns, options, mode, positions)
    expected, expected_tally, _ = _run(batches, False, schema, columns, options, mode, positions)
    if isinstance(expected, tuple) or isinstance(got, tuple):  # an error, on one side or both
        assert got == expected
        return expected
    assert got.schema == expected.schema
    for name in expected.column_names:  # a readable difference first
        assert got[name].to_pylist() == expected[name].to_pylist(), name
    assert got.equals(expected)
    assert got_tally == expected_tally
    assert all(0 < n <= jobs._OUT_ROWS for n in got_sizes)
    got.validate(full=True)  # the sink's strings are UTF-8 without a check of their own
    return expected


# ---- the benchmark's table ----------------------------------------------------------------------------------

def _workload(rows: int = 3000):
    from benchmarks import workload
    work = workload.build(rows, seed=1)
    first = next(e for e in work.entries if e.header.messageType == pb.DML)
    columns = list(first.event.dmlEvent.columns)
    return work.entries, columns, f"{first.header.schemaName}.{first.header.tableName}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("positions", [False, True])
def test_the_benchmark_stream_goes_through_the_sink(mode, positions):
    entries, columns, table = _workload()
    assert table == TABLE
    schema = bridge.tuple.record_schema(columns)
    for given_columns in (columns, None):  # Spark types from the columns, or from the field types alone
        expected = assert_same(_batches(_values(entries, 64 << 10), per_batch=2), schema, given_columns,
                               mode=mode, positions=positions)
        assert expected.num_rows == sum(len(e.event.dmlEvent.rows) * (2 if e.event.dmlEvent.dmlEventType == pb.UPDATE
                                                                       else 1) for e in entries)
        # every Entry but the first of its column set (registered by Python); with columns=None the
        # decimals are decimal(38,18), whose 18 fraction digits the sink pads as quantize does
        assert SUNK[-1] == len(entries) - 1


# ---- generated streams --------------------------------------------------------------------------------------

def _plain(entry: pb.Entry) -> pb.Entry:
    """The Entry without properties anywhere and with a seqId and time C writes: what the sink takes
    (when its values are ones C is sure of)."""
    entry = pb.Entry.FromString(entry.SerializeToString())
    del entry.header.properties[:]
    del entry.event.properties[:]
    for row in entry.event.dmlEvent.rows:
        del row.properties[:]
    entry.header.seqId %= 1 << 40
    return entry


def _redrawn(draw, columns: list) -> list:
    """Another column set of the same table: some columns retyped, dropped or added."""
    out = []
    for name, type_text, key in columns:
        roll = draw(st.integers(0, 9))
        if roll == 0:
            continue
        if roll == 1:
            type_text = draw(mysql_columns(min_size=1, max_size=1))[0][1]
        out.append((name, type_text, key))
    if draw(st.integers(0, 4)) == 0:
        out.append(("extra_col", "int(11)", False))
    return out or columns


@st.composite
def streams(draw):
    """(entries, the job's schema and columns): Entries of the job's table in one or two column
    sets, of another table, control events and DDL between them; most plain, some with properties,
    seqIds beyond what C numbers, times at the edges."""
    columns = draw(mysql_columns(max_size=6))
    sets = [columns, _redrawn(draw, columns)]
    set_columns: dict = {}
    out = []
    for _ in range(draw(st.integers(1, 16))):
        roll = draw(st.integers(0, 11))
        if roll == 0:
            out.append(draw(st.one_of(begin_entries(), commit_entries(), ddl_entries())))
            continue
        which = draw(st.integers(0, 3)) == 0
        entry = draw(dml_entries(sets[which]))
        # a column set's Entries share their columns (properties included), as a table's do
        seen = set_columns.setdefault(which, list(entry.event.dmlEvent.columns))
        del entry.event.dmlEvent.columns[:]
        entry.event.dmlEvent.columns.extend(seen)
        entry.header.schemaName, entry.header.tableName = TABLE.split(".")
        if roll == 1:
            entry.header.tableName = "other"
        if roll > 3:
            entry = _plain(entry)
        if roll == 11:
            entry.header.seqId = draw(st.sampled_from([0, (1 << 63) // 10**6, UINT64]))
            entry.header.timestamp = draw(st.sampled_from([0, UINT32]))
        out.append(entry)
    schema_columns = draw(st.sampled_from(sets))
    return out, [pb.Column(name=n, originalType=t, isKey=k) for n, t, k in schema_columns]


def _schema(columns, options):
    try:
        return bridge.tuple.record_schema(columns, options)
    except BridgeError:
        assume(False)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], max_examples=300, deadline=None)
@given(streams(), st.sampled_from(sorted(OPTIONS)), st.sampled_from(MODES), st.booleans(), st.booleans(),
       st.sampled_from([300, 2000, 1 << 20]))
def test_generated_streams_give_the_same_rows(stream, options, mode, positions, with_columns, max_bytes):
    entries, columns = stream
    schema = _schema(columns, OPTIONS[options])
    assert_same(_batches(_values(entries, max_bytes)), schema, columns if with_columns else None,
                OPTIONS[options], mode, positions)


@st.composite
def one_table_streams(draw):
    """(entries, columns): plain Entries of one column set of the job's table, every column type
    `mysql_columns` draws, so that most of them go through the sink (streams() mixes in more that
    do not)."""
    columns = draw(mysql_columns(max_size=8))
    out, shared = [], None
    for seq in range(draw(st.integers(2, 12))):
        entry = _plain(draw(dml_entries(columns)))
        entry.header.schemaName, entry.header.tableName = TABLE.split(".")
        entry.header.seqId = seq
        shared = shared or list(entry.event.dmlEvent.columns)
        del entry.event.dmlEvent.columns[:]
        entry.event.dmlEvent.columns.extend(shared)
        out.append(entry)
    return out, [pb.Column(name=n, originalType=t, isKey=k) for n, t, k in columns]


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], max_examples=200, deadline=None)
@given(one_table_streams(), st.sampled_from(["PERMISSIVE", "DROPMALFORMED"]), st.booleans())
def test_generated_one_table_streams_give_the_same_rows(stream, mode, positions):
    entries, columns = stream
    schema = _schema(columns, bridge.DEFAULT_OPTIONS)
    assert_same(_batches(_values(entries, 2000)), schema, columns, mode=mode, positions=positions)


# ---- values at the edges of what the sink writes --------------------------------------------------------------

def _entry(columns, rows, dml_type=pb.INSERT, seq=7, timestamp=1_700_000_000, table=TABLE) -> pb.Entry:
    entry = pb.Entry()
    h = entry.header
    h.version, h.sourceType, h.messageType = 1, pb.MYSQL, pb.DML
    h.timestamp, h.seqId = timestamp, seq
    h.schemaName, h.tableName = table.split(".")
    dml = entry.event.dmlEvent
    dml.dmlEventType = dml_type
    for name, type_text in columns:
        dml.columns.add(name=name, originalType=type_text)
    for image in rows:
        row = dml.rows.add()
        for field in ([row.oldColumns] if dml_type != pb.INSERT else []) + ([row.newColumns] if dml_type != pb.DELETE
                                                                             else []):
            field.extend(image)
    return entry


def _text(charset: str, raw: bytes) -> pb.Data:
    return pb.Data(dataType=pb.STRING, charset=charset, bv=raw)


# (column type, its values: each (Data, whether the sink writes it))
EDGES = {
    "tinyint(4)": [(pb.Data(dataType=pb.INT8, sv=v), sure) for v, sure in
                   (("-128", True), ("127", True), ("0", True), ("-0", False), ("007", False))],
    "int(11)": [(pb.Data(dataType=pb.INT32, sv=v), True) for v in ("-2147483648", "2147483647")],
    "int(10) unsigned": [(pb.Data(dataType=pb.UINT32, sv=v), True) for v in ("0", "4294967295")],
    "bigint(20)": [(pb.Data(dataType=pb.INT64, sv=v), True) for v in ("-9223372036854775808", "9223372036854775807")],
    "bigint(20) unsigned": [(pb.Data(dataType=pb.UINT64, sv=v), True) for v in ("0", "18446744073709551615")],
    "double": [(pb.Data(dataType=pb.FLOAT64, sv=v), sure) for v, sure in
               (("0.1", True), ("-0.0", True), ("1", True), ("1e300", False), ("1.7976931348623157e308", False),
                ("inf", False), ("nan", False), ("1e999", False))],  # repr() with an exponent: Python's
    "float": [(pb.Data(dataType=pb.FLOAT32, sv=v), sure) for v, sure in
              (("0.1", True), ("340282346638528859811704183484516925440.0", False),
               ("350000000000000000000000000000000000000.0", False), ("-0.0", True))],
    "decimal(12,2)": [(pb.Data(dataType=pb.DECIMAL, sv=v), sure) for v, sure in
                      (("1.50", True), ("-0.00", True), ("9999999999.99", True), ("1.5", True), ("12", True),
                       ("1.505", False), ("1.500", False), ("0001.25", True), ("-0", True))],
    "decimal(38,10)": [(pb.Data(dataType=pb.DECIMAL, sv="9" * 28 + "." + "9" * 10), True),
                       (pb.Data(dataType=pb.DECIMAL, sv="-" + "9" * 28 + "." + "9" * 10), True)],
    "decimal(65,30)": [(pb.Data(dataType=pb.DECIMAL, sv="1." + "0" * 30), False)],
    "tinyint(1)": [(pb.Data(dataType=pb.INT8, sv=v), True) for v in ("0", "1")],
    "varchar(8)": [(_text("utf8mb4", "h\u00e9\U0001F600\x00".encode()), True), (_text("utf8mb4", b"\xff"), False),
                   (_text("gbk", "\u4e2d".encode("gbk")), True), (_text("latin1", b"\xe9"), True),
                   (_text("binary", b"\x01"), False), (_text("utf8mb4", b""), True)],
    "json": [(pb.Data(dataType=pb.BYTES, bv=b'{"a": [1, "\xc3\xa9"]}'), True)],
    "varbinary(8)": [(_text("binary", b"\x00\xff\x10"), True), (_text("binary", b""), True),
                     (pb.Data(dataType=pb.BYTES, bv=b"\x00"), False)],  # not its canonical DataType
    "datetime(6)": [(_text("", b"2026-11-27 20:05:54.123456"), True), (_text("", b"0000-00-00 00:00:00.000000"), False),
                    (_text("", b"0001-01-01 00:00:00.000000"), True), (_text("", b"9999-12-31 23:59:59.999999"), False)],
    "date": [(_text("", b"1970-01-01"), True), (_text("", b"9999-12-31"), True)],
    "timestamp(3)": [(_text("", b"2026-11-27 20:05:54.123 +00:00"), True)],
    "time": [(_text("", b"-838:59:59"), True)],
}


@pytest.mark.parametrize("type_text", EDGES)
@pytest.mark.parametrize("options", ["default", "hex", "zero-dates-null"])
def test_values_at_the_edges(type_text, options):
    """Each edge value alone in an Entry (after one Entry that registers the table), with a null and
    a missing value beside it: the same rows; the sink writes the Entries of the values it is sure
    of and gives the others back."""
    opts = OPTIONS[options]
    columns = [("id", "bigint(20)"), ("v", type_text)]
    first = _entry(columns, [[pb.Data(dataType=pb.INT64, sv="1"), pb.Data(dataType=pb.NIL)]])
    entries = [first] + [_entry(columns, [[pb.Data(dataType=pb.INT64, sv="2"), data],
                                          [pb.Data(dataType=pb.INT64, sv="3"), pb.Data(dataType=pb.NA)]], seq=8 + i)
                         for i, (data, _) in enumerate(EDGES[type_text])]
    schema_columns = [pb.Column(name=n, originalType=t) for n, t in columns]
    schema = bridge.tuple.record_schema(schema_columns, opts)
    for mode in MODES:
        assert_same(_batches(_values(entries)), schema, schema_columns, opts, mode, positions=True)
    if options == "default":
        assert SUNK[-1] == sum(sure for _, sure in EDGES[type_text])


@pytest.mark.parametrize("mode", MODES)
def test_values_the_fields_refuse_become_the_entry_s_error(mode):
    """The job's columns say int, decimal(12,2) and float; the Entries' column set says bigint,
    decimal(14,4) and double: a value out of the field's range, off its scale or beyond float32
    fails its Entry (Python's error), in place between the sink's Entries."""
    job_columns = [pb.Column(name="a", originalType="int(11)"), pb.Column(name="b", originalType="decimal(12,2)"),
                   pb.Column(name="c", originalType="tinyint(4)")]
    entry_columns = [("a", "bigint(20)"), ("b", "decimal(14,4)"), ("c", "bigint(20)")]

    def row(a, b, c):
        return [pb.Data(dataType=pb.INT64, sv=a), pb.Data(dataType=pb.DECIMAL, sv=b), pb.Data(dataType=pb.INT64, sv=c)]
    good = row("5", "1.2500", "-128")
    entries = [_entry(entry_columns, [good], seq=1), _entry(entry_columns, [good, good], seq=2),
               _entry(entry_columns, [row("2147483648", "1.2500", "1")], seq=3),
               _entry(entry_columns, [good], seq=4), _entry(entry_columns, [row("1", "1.2510", "1")], seq=5),
               _entry(entry_columns, [row("1", "99999999999.00", "1")], seq=6),
               _entry(entry_columns, [row("1", "1.00", "128")], seq=7), _entry(entry_columns, [good], seq=8)]
    schema = bridge.tuple.record_schema(job_columns)
    for positions in (False, True):
        assert_same(_batches(_values(entries), per_batch=1), schema, job_columns, mode=mode, positions=positions)


@pytest.mark.parametrize("mode", MODES)
def test_column_sets_the_schema_does_not_cover(mode):
    """A column the RecordSchema lacks fails every Entry of that column set (the sink takes none of
    them); a field the column set lacks is null; another table's Entries give no rows and count as
    not emitted, in the sink as in Python."""
    schema_columns = [pb.Column(name="id", originalType="bigint(20)"), pb.Column(name="name", originalType="text")]
    narrow = [("id", "bigint(20)")]
    wide = [("id", "bigint(20)"), ("name", "text"), ("more", "int(11)")]
    one = pb.Data(dataType=pb.INT64, sv="1")
    text = _text("utf8mb4", b"x")
    four = pb.Data(dataType=pb.INT32, sv="4")
    entries = []
    for i in range(3):
        entries += [_entry(narrow, [[one]], seq=10 * i + 1), _entry(wide, [[one, text, four]], seq=10 * i + 2),
                    _entry(narrow, [[one], [one]], seq=10 * i + 3, table="shop.other"),
                    _entry(narrow, [[one]], seq=10 * i + 4, dml_type=pb.DELETE)]
    schema = bridge.tuple.record_schema(schema_columns)
    for positions in (False, True):
        assert_same(_batches(_values(entries), per_batch=2), schema, schema_columns, mode=mode, positions=positions)
        if mode != "FAILFAST":
            # all but the wide ones and the first of the narrow column set (inserts and deletes share it)
            # and of the other table's
            assert SUNK[-1] == 3 * 4 - 3 - 2


@pytest.mark.parametrize("mode", MODES)
def test_updates_and_deletes_and_every_meta_column(mode):
    """Update Entries give two rows a row change (U/Y/N, U/N/Y), with the meta columns of the
    options (`_source_table_`), and a schema holding the legacy `_excute_time_` (null)."""
    columns = [("id", "bigint(20)"), ("name", "varchar(8)")]
    entries = [_entry(columns, [[pb.Data(dataType=pb.INT64, sv=str(r)), _text("utf8mb4", b"n")] for r in range(3)],
                      dml_type=t, seq=s) for s, t in enumerate([pb.UPDATE, pb.DELETE, pb.INSERT, pb.UPDATE] * 2)]
    schema_columns = [pb.Column(name=n, originalType=t) for n, t in columns]
    for options in ("default", "source-table"):
        schema = bridge.tuple.record_schema(schema_columns, OPTIONS[options])
        legacy = {"fields": schema["fields"] + [{"name": "_excute_time_", "type": "BIGINT"}]}
        for job_schema in (schema, legacy):
            expected = assert_same(_batches(_values(entries)), job_schema, schema_columns, OPTIONS[options], mode, True)
            assert expected.num_rows == 2 * (3 * 2 + 3 + 3 + 3 * 2)
            assert SUNK[-1] == len(entries) - 1


def test_an_image_without_its_values_or_with_too_many():
    """An image of no Data (Python: every column null) and one of more Data than columns (Python's
    error): the sink leaves both Entries to Python."""
    columns = [("id", "bigint(20)"), ("n", "int(11)")]
    one = pb.Data(dataType=pb.INT64, sv="1")
    n = pb.Data(dataType=pb.INT32, sv="2")
    entries = [_entry(columns, [[one, n]], seq=1), _entry(columns, [[]], seq=2), _entry(columns, [[one, n, n]], seq=3),
               _entry(columns, [[one, n]], seq=4)]
    schema_columns = [pb.Column(name=a, originalType=b) for a, b in columns]
    for mode in MODES:
        assert_same(_batches(_values(entries)), bridge.tuple.record_schema(schema_columns), schema_columns, mode=mode)
        if mode == "PERMISSIVE":
            assert SUNK[-1] == 1


def test_a_partition_without_topic_or_of_null_partition():
    entries, columns, _ = _workload(200)
    schema = bridge.tuple.record_schema(columns)
    values = _values(entries, 64 << 10)
    assert_same(_batches(values, topic=None), schema, columns, positions=True)
    nulls = pa.RecordBatch.from_pydict({"topic": ["t"] * len(values), "partition": [None] * len(values),
                                        "offset": list(range(len(values))), "value": values}, schema=KAFKA)
    assert_same([nulls], schema, columns, mode="PERMISSIVE", positions=True)


def test_framing_errors_and_split_envelopes_keep_their_place():
    entries, columns, _ = _workload(300)
    values = _values(entries, 900)  # split into segments
    broken = values[:3] + [b"\xff\xff"] + values[3:10] + values[11:]  # garbage, then a missing segment
    schema = bridge.tuple.record_schema(columns)
    for mode in MODES:
        assert_same(_batches(broken, per_batch=4), schema, columns, mode=mode, positions=True)


def test_output_batches_stay_under_the_row_limit():
    columns = [("id", "bigint(20)")]
    entries = [_entry(columns, [[pb.Data(dataType=pb.INT64, sv=str(r))] for r in range(7)], seq=s)
               for s in range(1500)]  # 10,500 rows
    schema_columns = [pb.Column(name="id", originalType="bigint(20)")]
    assert_same(_batches(_values(entries)), bridge.tuple.record_schema(schema_columns), schema_columns)
    assert SUNK[-1] == 1499


# ---- the record the sink takes ---------------------------------------------------------------------------------

def test_the_sink_refuses_records_that_do_not_fit_its_fields():
    """A record whose writer does not fit the column's storage or its plan column, or that leaves a
    plan column unread, is a ValueError, not a crash; an unknown table or one left to Python stops
    the sink at that Entry."""
    from bridge.native import speedups
    from bridge.native.contract import Kind, Out, PlanColumn, TupleStorage, TupleWriter
    plan = speedups.Plan([tuple(PlanColumn("id", Kind.LONG, pb.INT64, -9, 9, "", 0, False))], False,
                         __import__("decimal").Decimal)
    entry = _entry([("id", "bigint(20)")], [[pb.Data(dataType=pb.INT64, sv="1")]])
    raw = entry.SerializeToString()
    key = speedups.table_key(raw)
    seq = (TupleWriter.SEQ, -1, 0, 0, None)
    cases = {
        "int into a string": ((TupleStorage.STRING,), ((TupleWriter.INT, 0, 0, 9, None),)),
        "range beyond int8": ((TupleStorage.INT8,), ((TupleWriter.INT, 0, 0, 128, None),)),
        "a column unread": ((TupleStorage.STRING,), (seq,)),
        "a column read twice": ((TupleStorage.INT64, TupleStorage.INT64),
                                ((TupleWriter.INT, 0, 0, 9, None), (TupleWriter.INT, 0, 0, 9, None))),
        "double of a long": ((TupleStorage.FLOAT64,), ((TupleWriter.DOUBLE, 0, 0, 0, None),)),
        "column out of the plan": ((TupleStorage.INT64,), ((TupleWriter.INT, 1, 0, 9, None),)),
        "too few fields": ((TupleStorage.INT64, TupleStorage.STRING), ((TupleWriter.INT, 0, 0, 9, None),)),
        # what the parse itself refuses is the record's ValueError too (review, session 16)
        "a field as a list": ((TupleStorage.INT64,), ([TupleWriter.INT, 0, 0, 9, None],)),
        "a field of three": ((TupleStorage.INT64,), ((TupleWriter.INT, 0, 0),)),
        "a bound beyond int64": ((TupleStorage.INT64,), ((TupleWriter.INT, 0, -2 ** 70, 9, None),)),
        "a writer as text": ((TupleStorage.INT64,), (("INT", 0, 0, 9, None),)),
    }
    for name, (storages, fields) in cases.items():
        sink = speedups.TupleSink(storages)
        with pytest.raises(ValueError):
            sink.entries([raw], 0, {key: (plan, fields)}, 0, 0)
        assert sink.rows() == 0, name
    def sink():
        return speedups.TupleSink((TupleStorage.INT64,))
    assert sink().entries([raw], 0, {}, 0, 0) == (0, 0, 0)
    assert sink().entries([raw], 0, {key: None}, 0, 0) == (0, 0, 0)
    assert sink().entries([raw, raw], 0, {key: False}, 0, 0) == (2, 0, 0)
    one = sink()
    assert one.entries([raw], 0, {key: (plan, ((TupleWriter.INT, 0, -9, 9, None),))}, 0, 0) == (1, 1, 1)
    taken = one.take()
    assert taken[0] == 1 and taken[5][0][1] == 0 and taken[5][0][3] == (1).to_bytes(8, "little", signed=True)
    with pytest.raises(ValueError):
        speedups.TupleSink((99,))
    with pytest.raises(ValueError):  # the plan not a Plan, the fields not a tuple
        speedups.TupleSink((TupleStorage.INT64,)).entries([raw], 0, {key: ("plan", ())}, 0, 0)
    with pytest.raises(ValueError):
        speedups.TupleSink((TupleStorage.INT64,)).entries([raw], 0, {key: (plan, [seq])}, 0, 0)
    assert Out.SAME == 0


# ---- a decimal as C writes it and as _fit_decimal gives it -------------------------------------------------------

_DIGITS = st.text("0123456789", min_size=1, max_size=45)


@settings(max_examples=400, deadline=None)
@given(st.booleans(), _DIGITS, st.one_of(st.none(), _DIGITS), st.integers(1, 38), st.data())
def test_a_decimal_c_writes_is_the_one_fit_decimal_gives(negative, whole, fraction, precision, data):
    """Any DECIMAL text into any decimal(p, s): where C writes a value, it is `_fit_decimal`'s at the
    column's scale (the 128-bit unscaled integer); where `_fit_decimal` refuses or would change the
    value (more fraction digits than the scale, more digits than the precision), C gives the Entry
    back. (From the review of the Tuple sink, session 16.)"""
    from decimal import Context, Decimal

    from bridge.native import speedups
    from bridge.native.contract import Kind, Out, PlanColumn, TupleStorage, TupleWriter
    scale = data.draw(st.integers(0, precision))
    text = ("-" if negative else "") + whole + ("" if fraction is None else "." + fraction)
    plan = speedups.Plan([tuple(PlanColumn("d", Kind.DECIMAL, pb.DECIMAL, 0, 0, "", 0, False, Out.DECIMAL))],
                         False, Decimal)
    raw = _entry([("d", "decimal(65,30)")], [[pb.Data(dataType=pb.DECIMAL, sv=text)]]).SerializeToString()
    sink = speedups.TupleSink((TupleStorage.DECIMAL128,))
    done = sink.entries([raw], 0, {speedups.table_key(raw): (plan, ((TupleWriter.DECIMAL, 0, precision, scale, None),))},
                        0, 0)
    try:
        fitted = jobs._fit_decimal(Decimal(text), precision, scale)
    except BridgeError:
        fitted = None
    if done == (0, 0, 0):  # given back: Python decides
        return
    assert done == (1, 1, 1) and fitted is not None, (text, precision, scale)
    written = int.from_bytes(sink.take()[5][0][3], "little", signed=True)
    assert written == int(fitted.scaleb(scale, context=Context(prec=200))), (text, precision, scale)
