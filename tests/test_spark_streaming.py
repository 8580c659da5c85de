"""Streaming `dts_to_blob` / `dts_to_tuple` (docs/spark.md, "Streaming"): an Entries whose segments
fall into two micro-batches is kept in Spark state and emitted whole, once, in order.

The stream is Kafka-shaped rows in Parquet files read with `readStream` and `maxFilesPerTrigger=1`,
so each file is one micro-batch; the cuts between files fall inside split Entries of both Kafka
partitions. Every streaming result is compared with the batch conversion of the same rows, record
for record, per Kafka partition in the order the sink got them. One local[2] session serves every
test (getOrCreate, as tests/test_spark.py).
"""
import json
import os
import shutil
import uuid

import pytest

import bridge
from bridge import pb
from bridge.wire.framing import Assembled, Reassembler

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("pandas")

import bridge.spark as bs  # noqa: E402
from bridge.spark import streaming as st  # noqa: E402
from bridge.spark import tails  # noqa: E402

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "samples")
TOPIC = "dts"
GARBAGE = b"\xff\xff\xff not an Envelope"


def envelopes(name) -> list[bytes]:
    return [raw for _, _, raw in bridge.read_pb(os.path.join(SAMPLES, f"{name}.pb"))]


def splits(raws) -> list[tuple[int, int]]:
    """(first, last) offset of each Entries cut into several Envelopes."""
    out, first = [], None
    for n, raw in enumerate(raws):
        if raw == GARBAGE:
            continue
        env = pb.Envelope.FromString(raw)
        if env.total > 1 and env.index == 0:
            first = n
        if env.total > 1 and env.index == env.total - 1:
            out.append((first, n))
    return out


# Partition 0: large.pb (Entries split 1-4, 6-11, 15-18); partition 1: types, mixed, then large
# (split 6-9, 11-16, 20-23). The dirty stream drops a middle segment (partition 0) and puts a
# record that is no Envelope in front of large (partition 1). Cuts: each file's first offset.
CLEAN = ({0: envelopes("large"), 1: envelopes("types") + envelopes("mixed") + envelopes("large")},
         {0: [0, 2, 8, 16, 19, 21], 1: [0, 4, 9, 13, 21, 26]})
_large = envelopes("large")
DIRTY = ({0: _large[:8] + _large[9:], 1: envelopes("types") + envelopes("mixed") + [GARBAGE] + _large},
         {0: [0, 2, 7, 15, 18, 20], 1: [0, 4, 10, 14, 22, 27]})


def straddles(stream) -> int:
    """How many cuts between files fall inside a split Entries."""
    parts, cuts = stream
    return sum(first < cut <= last for p, raws in parts.items() for cut in cuts[p][1:-1]
               for first, last in splits(raws))


def write_files(folder, stream, files=None) -> None:
    """File f holds offsets cuts[f] .. cuts[f+1]-1 of every partition; modification times in file
    order, so the file source takes them in that order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    parts, cuts = stream
    os.makedirs(folder, exist_ok=True)
    for f in files if files is not None else range(len(cuts[0]) - 1):
        rows = [(p, o, raws[o]) for p, raws in parts.items() for o in range(cuts[p][f], cuts[p][f + 1])]
        table = pa.table({
            "key": pa.array([None] * len(rows), pa.binary()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
            "topic": pa.array([TOPIC] * len(rows), pa.string()),
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "timestamp": pa.array([1_600_000_000_000_000 + r[1] for r in rows], pa.timestamp("us", tz="UTC")),
        })
        path = os.path.join(folder, f"part-{f:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_600_000_000 + f, 1_600_000_000 + f))


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    session = bs.local_session("bridge-tests")
    session.sparkContext.setLogLevel("OFF")
    session.conf.set(st.PROVIDER_CONF, st.ROCKSDB)  # a session made before local_session set it
    return session


@pytest.fixture(params=["spark-state", "state-location"])
def state(request, tmp_path):
    """Where the open tails live between micro-batches: Spark's state store (the default) or
    `state_location`'s files (bridge/spark/tails.py); every query test runs on both."""
    return {} if request.param == "spark-state" else {"state_location": str(tmp_path / "tails")}


def read_stream(spark, folder):
    return spark.readStream.schema(bs.KAFKA_SCHEMA).option("maxFilesPerTrigger", 1).parquet(folder)


class Sink:
    """foreachBatch target: each micro-batch's rows by batch id (a replayed batch replaces its
    first attempt, as an idempotent sink would); `fail_at` fails that batch once."""

    def __init__(self, fail_at=None) -> None:
        self.batches: dict = {}
        self.fail_at = fail_at

    def __call__(self, df, batch_id) -> None:
        rows = df.collect()
        if batch_id == self.fail_at:
            self.fail_at = None
            raise RuntimeError(f"sink fails batch {batch_id} once")
        self.batches[batch_id] = rows

    def rows(self) -> list:
        return [row for b in sorted(self.batches) for row in self.batches[b]]


def run(out, sink, checkpoint):
    query = out.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint) \
        .trigger(availableNow=True).start()
    query.awaitTermination()
    return query


def per_partition(rows) -> dict:
    """Rows per Kafka partition in the order given (error rows of no partition under None)."""
    out: dict = {}
    for row in rows:
        out.setdefault(row.partition, []).append(tuple(row))
    return out


# ---- no query needed --------------------------------------------------------------------------

def test_the_streams_cut_inside_split_entries():
    assert straddles(CLEAN) >= 5 and straddles(DIRTY) >= 4


def _feed_all(reassembler, records):
    out = []
    for partition, offset, value, headers in records:
        out += reassembler.feed(partition, offset, value, headers)
    return out


def _tdsql_records():
    """Two TDSQL shards interleaved in partition 3: shard a's split Entries open while shard b's
    complete Entries wait behind it."""
    big = bridge.split_entries(pb.Entries(items=[pb.Entry(header=pb.Header(seqId=i, tableName="t" * 40))
                                                 for i in range(6)]).SerializeToString(), 64)
    small = [pb.Envelope(version=1, total=1, index=0, data=pb.Entries(items=[pb.Entry(header=pb.Header(seqId=100 + i))])
                         .SerializeToString()) for i in range(3)]
    records, ps = [], {"a": 0, "b": 0}
    sequence = [("a", big[0]), ("b", small[0]), ("a", big[1]), ("b", small[1])] + \
        [("a", env) for env in big[2:]] + [("b", small[2])]
    for offset, (shard, env) in enumerate(sequence):
        ps[shard] += 1
        records.append((3, 100 + offset, env.SerializeToString(),
                        [("ShardId", shard.encode()), ("ps", str(ps[shard]).encode())]))
    return records


def _summary(items) -> list:
    return [(i.first_offset, i.last_offset, [e.header.seqId for e in i.entries.items]) if isinstance(i, Assembled)
            else (type(i).__name__, str(i)) for i in items]


def _through_tail_file(state: tuple) -> tuple:
    """The state as state_location's tail file carries it (bridge/spark/tails.py): the same value back."""
    back = tails.decode_state(tails.encode_state(state), "x")
    assert back == state
    return back


@pytest.mark.parametrize("carry", [lambda state: state, _through_tail_file], ids=["spark-state", "tail-file"])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("records", [
    [(0, n, raw, None) for n, raw in enumerate(_large)],
    _tdsql_records(),
], ids=["plain", "tdsql"])
def test_state_round_trip_is_invisible(records, lazy, carry):
    """Cut the records anywhere, carry the Reassembler through dump_state / load_state (as Spark's
    state keeps it, or through a tail file's bytes): the same Entries (and errors) as one
    Reassembler fed everything."""
    whole = _summary(_feed_all(Reassembler(lazy=lazy), records))
    partition = records[0][0]
    for cut in range(1, len(records)):
        first = Reassembler(lazy=lazy)
        got = _feed_all(first, records[:cut])
        state = carry(st.dump_state(first, partition, {}, 1_700_000_000_000 + cut))
        second, opened = st.load_state(state, partition, lazy)
        assert set(opened) == {buf.first_offset for buf in first._open.values()}
        assert set(opened.values()) <= {1_700_000_000_000 + cut}
        got += _feed_all(second, records[cut:])
        assert _summary(got) == whole, cut
    # a redelivery after the cut is still known as one (last offset and ps survive the state)
    again = Reassembler(lazy=lazy)
    _feed_all(again, records[:4])
    restored, _ = st.load_state(carry(st.dump_state(again, partition, {}, 0)), partition, lazy)
    assert restored.feed(*records[3])[0].__class__.__name__ in ("FramingError", "Redelivered")


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "9"])
def test_limits_are_checked(value):
    with pytest.raises(bridge.OptionsError, match="max_open_offsets"):
        st.check_limits(value, None)
    if not isinstance(value, (float, str)) or value == "9":
        with pytest.raises(bridge.OptionsError, match="max_open_seconds"):
            st.check_limits(None, value)


# ---- streaming queries ------------------------------------------------------------------------

def _blob_reference(spark, folder, mode):
    tally = bs.SparkTally(spark)
    rows = bs.dts_to_blob(spark.read.parquet(folder), mode=mode, tally=tally).collect()
    return rows, tally.value


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["FAILFAST", "PERMISSIVE", "DROPMALFORMED"])
def test_blob_stream_across_micro_batches_equals_batch(spark, tmp_path, mode, state):
    stream = CLEAN if mode == "FAILFAST" else DIRTY
    folder = str(tmp_path / "in")
    write_files(folder, stream)
    tally = bs.SparkTally(spark)
    sink = Sink()
    run(bs.dts_to_blob(read_stream(spark, folder), mode=mode, tally=tally, **state), sink, str(tmp_path / "ck"))
    assert sorted(sink.batches) == list(range(len(stream[1][0]) - 1))  # one micro-batch per file
    expected, expected_tally = _blob_reference(spark, folder, mode)
    got = per_partition(sink.rows())
    assert got == per_partition(expected)
    assert tally.value == expected_tally and tally.value.balanced()
    if mode == "FAILFAST":
        assert tally.value.rejected == 0 and len(got[0]) > 100
    else:
        assert tally.value.rejected > 0
        errors = {(r.partition, r.offset) for r in sink.rows() if mode == "PERMISSIVE" and r.error is not None}
        # the missing segment (partition 0, in a straddled Entries) and the record that is no Envelope
        assert errors >= ({(0, 8), (1, 5)} if mode == "PERMISSIVE" else set())


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["FAILFAST", "PERMISSIVE", "DROPMALFORMED"])
def test_tuple_stream_across_micro_batches_equals_batch(spark, tmp_path, mode, state):
    stream = CLEAN if mode == "FAILFAST" else DIRTY
    folder = str(tmp_path / "in")
    write_files(folder, stream)
    batch = spark.read.parquet(folder)
    table = "media.attachments"  # in both partitions, its Entries split and not
    columns = bs.table_columns(batch, table)
    tally = bs.SparkTally(spark)
    sink = Sink()
    out = bs.dts_to_tuple(read_stream(spark, folder), table, columns=columns, mode=mode, positions=True,
                          tally=tally, **state)
    run(out, sink, str(tmp_path / "ck"))
    reference = bs.SparkTally(spark)
    expected = bs.dts_to_tuple(batch, table, columns=columns, mode=mode, positions=True, tally=reference).collect()
    got = per_partition(sink.rows())
    assert got == per_partition(expected)
    assert len(got[0]) > 10 and len(got[1]) > 10
    assert tally.value == reference.value and tally.value.balanced()


@pytest.mark.spark
def test_entries_stream_across_micro_batches_equals_batch(spark, tmp_path, state):
    """`dts_entries` (the whole-database input of format("datahub")): each complete Entry once, in
    the micro-batch that completes it, equal to the batch read's per Kafka partition."""
    folder = str(tmp_path / "in")
    write_files(folder, CLEAN)
    sink = Sink()
    run(bs.dts_entries(read_stream(spark, folder), **state), sink, str(tmp_path / "ck"))
    expected = bs.dts_entries(spark.read.parquet(folder)).collect()
    got = per_partition(sink.rows())
    assert got == per_partition(expected) and len(got[0]) > 10 and len(got[1]) > 10


@pytest.mark.spark
def test_micro_batches_of_several_files_equal_batch(spark, tmp_path, state):
    """Three files a micro-batch (several map tasks, so a Kafka partition's rows can reach its task
    out of offset order, and are sorted there): the same rows as the batch read, per partition."""
    folder = str(tmp_path / "in")
    write_files(folder, CLEAN)
    stream = spark.readStream.schema(bs.KAFKA_SCHEMA).option("maxFilesPerTrigger", 3).parquet(folder)
    sink = Sink()
    run(bs.dts_to_blob(stream, **state), sink, str(tmp_path / "ck"))
    assert sorted(sink.batches) == [0, 1]
    expected, _ = _blob_reference(spark, folder, "FAILFAST")
    assert per_partition(sink.rows()) == per_partition(expected)


# Every cut position at once: Kafka partition p carries large.pb (21 Envelopes, split 1-4, 6-11,
# 15-18) cut into three micro-batches at offsets p+1 and p+4 (the third empty where that passes the
# end), so the first cut falls at each offset 1..20 and the second at 4..20; partitions 6 and 7's
# middle micro-batch is nothing but continuation segments of one Entries (7-9, 8-10 of 6-11).
EVERY_CUT = ({p: _large for p in range(20)}, {p: [0, p + 1, min(p + 4, len(_large)), len(_large)] for p in range(20)})


@pytest.mark.spark
def test_micro_batches_cut_at_every_position_equal_batch(spark, tmp_path, state):
    """Twenty Kafka partitions (about ten a task, so several keys share one) cut inside and between
    Entries at every offset: each partition's rows, in the order the sink got them, equal the batch
    conversion's, and each micro-batch gives exactly the Entries it completes."""
    folder = str(tmp_path / "in")
    write_files(folder, EVERY_CUT)
    assert straddles(EVERY_CUT) >= 20
    parts, cuts = EVERY_CUT
    assert [(first, last) for first, last in splits(_large) if first < 7 and 10 <= last] == [(6, 11)]
    sink = Sink()
    run(bs.dts_to_blob(read_stream(spark, folder), **state), sink, str(tmp_path / "ck"))
    assert sorted(sink.batches) == [0, 1, 2]
    expected, _ = _blob_reference(spark, folder, "FAILFAST")
    got = per_partition(sink.rows())
    assert sorted(got) == list(range(20)) and got == per_partition(expected)
    ends = {first: last for first, last in splits(_large)}
    for b, rows in sink.batches.items():
        for p, mine in per_partition(rows).items():
            # an Entries comes in the micro-batch holding its last segment, never before or after
            lo, hi = cuts[p][b], cuts[p][b + 1]
            assert all(lo <= ends.get(r[2], r[2]) < hi for r in mine), (b, p)
        if b == 1:
            assert 6 not in per_partition(rows) and 7 not in per_partition(rows)  # continuation only


@pytest.mark.spark
def test_restart_from_checkpoint_loses_and_duplicates_nothing(spark, tmp_path, state):
    """The query stops with an Entries open in state (availableNow over the first three files), a
    restart fails one micro-batch in the sink (Spark replays it from the checkpoint), and a third
    start reads the rest: the sink's rows equal the batch conversion of all files."""
    folder, checkpoint = str(tmp_path / "in"), str(tmp_path / "ck")
    write_files(folder, CLEAN, files=range(3))
    parts, cuts = CLEAN
    assert any(first < cuts[0][3] <= last for first, last in splits(parts[0]))  # open at the stop
    sink = Sink(fail_at=3)

    def start():
        run(bs.dts_to_blob(read_stream(spark, folder), **state), sink, checkpoint)
    start()
    assert sorted(sink.batches) == [0, 1, 2]
    write_files(folder, CLEAN, files=range(3, 5))
    with pytest.raises(Exception, match="sink fails batch 3 once"):
        start()
    start()
    assert sorted(sink.batches) == [0, 1, 2, 3, 4]
    expected, _ = _blob_reference(spark, folder, "FAILFAST")
    assert per_partition(sink.rows()) == per_partition(expected)
    positions = [(r.partition, r.offset, r.entry, r.row) for r in sink.rows()]
    assert len(set(positions)) == len(positions)


HEADERS_SCHEMA = bs.KAFKA_SCHEMA + ", `headers` ARRAY<STRUCT<key: STRING, value: BINARY>>"


def write_tdsql_files(folder, records, cuts) -> None:
    """(offset, shard, Envelope bytes) of partition 0 with TDSQL headers (ShardId, ps), cut into files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(folder, exist_ok=True)
    ps: dict = {}
    headers = []
    for _, shard, _ in records:
        ps[shard] = ps.get(shard, 0) + 1
        headers.append([{"key": "ShardId", "value": shard.encode()}, {"key": "ps", "value": str(ps[shard]).encode()}])
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    for f in range(len(cuts) - 1):
        part = range(cuts[f], cuts[f + 1])
        table = pa.table({
            "key": pa.array([None] * len(part), pa.binary()),
            "value": pa.array([records[o][2] for o in part], pa.binary()),
            "topic": pa.array([TOPIC] * len(part), pa.string()),
            "partition": pa.array([0] * len(part), pa.int32()),
            "offset": pa.array([records[o][0] for o in part], pa.int64()),
            "timestamp": pa.array([None] * len(part), pa.timestamp("us", tz="UTC")),
            "headers": pa.array([headers[o] for o in part], header_type),
        })
        path = os.path.join(folder, f"part-{f:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_600_000_000 + f, 1_600_000_000 + f))


# TDSQL shard a opens the Entries of large.pb's offsets 1..4 and never sends its last segment;
# shard b's Entries (large.pb's unsplit ones) go on in the same partition, held behind it.
DEAD = [(0, "a", _large[1]), (1, "b", _large[0]), (2, "a", _large[2]), (3, "b", _large[5]),
        (4, "a", _large[3]), (5, "b", _large[12]), (6, "b", _large[13]), (7, "b", _large[14]),
        (8, "b", _large[19]), (9, "b", _large[20])]
DEAD_CUTS = [0, 3, 6, 10]


@pytest.mark.spark
@pytest.mark.parametrize("mode, limit", [("FAILFAST", {"max_open_offsets": 4}),
                                         ("PERMISSIVE", {"max_open_offsets": 4}),
                                         ("DROPMALFORMED", {"max_open_offsets": 4}),
                                         ("PERMISSIVE", {"max_open_seconds": 0.001})],
                         ids=["FAILFAST", "PERMISSIVE", "DROPMALFORMED", "PERMISSIVE-seconds"])
def test_an_entries_open_too_long_is_a_dead_letter(spark, tmp_path, mode, limit, state):
    """The open Entries goes at the end of the first micro-batch past the limit (the second), under
    the mode; the Entries held behind it go on, in order, as the batch conversion gives them."""
    folder = str(tmp_path / "in")
    write_tdsql_files(folder, DEAD, DEAD_CUTS)
    stream = spark.readStream.schema(HEADERS_SCHEMA).option("maxFilesPerTrigger", 1).parquet(folder)
    tally = bs.SparkTally(spark)
    sink = Sink()
    out = bs.dts_to_blob(stream, mode=mode, tally=tally, **limit, **state)
    if mode == "FAILFAST":
        with pytest.raises(Exception) as caught:
            run(out, sink, str(tmp_path / "ck"))
        text = str(caught.value)
        assert "dead letter: Entries unfinished 5 offsets after its first segment (max_open_offsets 4)" in text
        assert "partition 0, offset 0, shard a, last_offset 5, topic dts" in text
        assert sorted(sink.batches) == [0] and sink.batches[0] == []  # Entries of b wait behind a
        return
    run(out, sink, str(tmp_path / "ck"))
    rows = sink.rows()
    good = [tuple(r) for r in rows if mode == "DROPMALFORMED" or r.error is None]
    reference = spark.read.schema(HEADERS_SCHEMA).parquet(folder)
    expected = [tuple(r) for r in bs.dts_to_blob(reference, mode=mode).collect()
                if mode == "DROPMALFORMED" or r.error is None]
    assert good == expected and sorted({r[2] for r in good}) == [1, 3, 5, 6, 7, 8, 9]
    assert tally.value.rejected == 3 and tally.value.balanced()  # shard a's three Envelopes
    assert [len(sink.batches[b]) > 0 for b in range(3)] == [False, True, True]
    if mode == "PERMISSIVE":
        errors = [r for r in rows if r.error is not None]
        assert [(r.partition, r.offset) for r in errors] == [(0, 0)] and rows[0].error is not None
        assert "dead letter" in errors[0].error and next(iter(limit)) in errors[0].error


# ---- batch reads ending inside an Entries --------------------------------------------------------

@pytest.mark.spark
@pytest.mark.parametrize("mode", ["FAILFAST", "PERMISSIVE", "DROPMALFORMED"])
def test_a_batch_read_ending_inside_an_entries_reports_the_tail(spark, mode):
    """A batch read whose end falls inside an Entries (offsets 15..17 of 15..18): never silent."""
    raws = _large[:18]
    rows = [(None, raw, TOPIC, 0, n, None) for n, raw in enumerate(raws)]
    df = spark.createDataFrame(rows, bs.KAFKA_SCHEMA)
    tally = bs.SparkTally(spark)
    if mode == "FAILFAST":
        with pytest.raises(Exception) as caught:
            bs.dts_to_blob(df, mode=mode).collect()
        assert "unfinished Entries at end of input: 3 of 4 segments (partition 0, offset 15, topic dts)" \
            in str(caught.value)
        return
    got = bs.dts_to_blob(df, mode=mode, tally=tally).collect()
    assert tally.value.rejected == 3 and tally.value.balanced()  # the tail's three Envelopes
    tail = [r for r in got if mode == "PERMISSIVE" and r.error is not None]
    assert max(r.offset for r in got if r not in tail) < 15
    if mode == "PERMISSIVE":
        assert [(r.partition, r.offset) for r in tail] == [(0, 15)] and "unfinished" in tail[0].error


@pytest.mark.spark
def test_streaming_needs_the_rocksdb_state_store(spark, tmp_path):
    folder = str(tmp_path / "in")
    write_files(folder, CLEAN, files=[0])
    spark.conf.set(st.PROVIDER_CONF, "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    try:
        with pytest.raises(bridge.OptionsError, match="RocksDBStateStoreProvider"):
            bs.dts_to_blob(read_stream(spark, folder))
    finally:
        spark.conf.set(st.PROVIDER_CONF, st.ROCKSDB)
    with pytest.raises(bridge.OptionsError, match="schema= or columns="):
        bs.dts_to_tuple(read_stream(spark, folder), "shop.orders")


# ---- state_location: the tail files (bridge/spark/tails.py) ------------------------------------------
# The query tests above run on both backends (the `state` fixture), and the state round trip through
# a tail file's bytes; here which tail a micro-batch reads (never its own from an earlier attempt,
# never a later one), retention, and what goes wrong loudly.

def _store(tmp_path, topic="dts", partition=0, label="blob"):
    fs, root = tails.open_location(str(tmp_path / "tails"))
    return tails.TailStore(fs, root, "query-1", label, topic, partition)


def _state(last):
    return (last, False, [], [(None, 3, last - 1, 2, 5, [b"a" * 10, b"b"])], [])


def test_a_micro_batch_reads_the_newest_tail_before_it(tmp_path):
    store = _store(tmp_path)
    assert store.load(0) == (None, [])
    for batch in (0, 1, 4):
        store.save(batch, _state(10 * batch), store.load(batch)[1])
    assert store.load(1)[0] == _state(0)
    assert store.load(4)[0] == _state(10)  # a partition without rows in 2 and 3: still 1's tail
    assert store.load(5)[0] == _state(40)
    # micro-batch 4 re-run after a crash: the tail before it, not the one its first attempt wrote
    assert store.load(4)[0] == _state(10)
    store.save(4, _state(41), store.load(4)[1])
    assert store.load(5)[0] == _state(41)
    # other partitions, topics and queries have their own
    assert _store(tmp_path, partition=1).load(9) == (None, [])
    assert _store(tmp_path, topic=None).load(9) == (None, [])
    assert _store(tmp_path, topic="dts/../x").load(9) == (None, [])
    assert _store(tmp_path, label="tuple-db.t2").load(9) == (None, [])  # another transform of the query
    assert sorted(os.listdir(tmp_path / "tails" / "query-1" / "blob")) == ["tdts"]


def test_tails_older_than_retain_go_but_the_newest_of_them_stays(tmp_path, monkeypatch):
    monkeypatch.setattr(tails, "RETAIN", 3)
    store = _store(tmp_path)
    for batch in (0, 1, 2, 7, 8, 9, 10, 11):
        store.save(batch, _state(batch + 100), store.load(batch)[1])
    assert store._ids() == [7, 8, 9, 10, 11]
    monkeypatch.setattr(tails, "RETAIN", 100)
    store.save(30, _state(130), store.load(30)[1])
    assert store._ids() == [7, 8, 9, 10, 11, 30]
    store.save(200, _state(300), store.load(200)[1])
    assert store._ids() == [30, 200]  # 30 is what a re-run of 101..200 starts from
    assert store.load(150)[0] == _state(130)
    assert not [n for n in os.listdir(store.dir) if n.endswith(".tmp")]
    # a killed attempt's temporary file goes once no attempt of its micro-batch can run
    for batch in (250, 390):
        (tmp_path / "tails" / "query-1" / "blob" / "tdts" / "0" / f".{batch:020d}.{'a' * 32}.tmp").write_bytes(b"x")
    store.save(400, _state(400), store.load(400)[1])
    assert sorted(n for n in os.listdir(store.dir) if n.endswith(".tmp")) == [f".{390:020d}.{'a' * 32}.tmp"]


def test_a_damaged_tail_is_named(tmp_path):
    store = _store(tmp_path)
    store.save(0, _state(5), [])
    path = os.path.join(store.dir, f"{0:020d}.arrow")
    with open(path, "r+b") as fh:
        fh.truncate(40)
    with pytest.raises(bridge.OptionsError, match="00000000000000000000.arrow is not a tail file"):
        store.load(1)
    # a tagged file of another layout is named too, not read as an empty state
    import pyarrow as pa
    other = pa.schema([("last_offset", pa.string())], metadata={b"format": tails.FORMAT})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, other) as writer:
        writer.write_table(pa.table({"last_offset": ["5"]}, schema=other))
    with open(path, "wb") as fh:
        fh.write(sink.getvalue().to_pybytes())
    with pytest.raises(bridge.OptionsError, match="is not a tail file of this version"):
        store.load(1)


def test_state_location_options(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(bridge.OptionsError, match="state_location"):
        tails.open_location("")
    with pytest.raises(bridge.OptionsError, match="state_location"):
        tails.open_location("nosuchscheme://x/y")
    fs, root = tails.open_location(str(blocked / "under"))
    with pytest.raises(OSError):
        fs.create_dir(root, recursive=True)
    from pyarrow import fs as pafs
    assert isinstance(tails.open_location("relative/dir")[0], pafs.LocalFileSystem)
    assert tails.location_uri("relative/dir") == os.path.abspath("relative/dir")
    # Spark's one-slash form is a URI, not a relative path under the driver's folder
    assert tails.location_uri("file:/chk/tails") == "file:/chk/tails"
    assert tails.open_location("file:/chk/tails")[1] == "/chk/tails"


@pytest.mark.spark
def test_state_location_is_for_streams_and_must_be_writable(spark, tmp_path):
    folder = str(tmp_path / "in")
    write_files(folder, CLEAN, files=[0])
    with pytest.raises(bridge.OptionsError, match="a batch DataFrame has none"):
        bs.dts_to_blob(spark.read.parquet(folder), state_location=str(tmp_path / "t"))
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(bridge.OptionsError, match="cannot be written"):
        bs.dts_to_blob(read_stream(spark, folder), state_location=str(blocked / "t"))
    with pytest.raises(bridge.OptionsError, match="needs the Kafka columns offset"):
        bs.dts_to_blob(read_stream(spark, folder).drop("offset"), state_location=str(tmp_path / "t"))


@pytest.mark.spark
def test_tails_lost_between_micro_batches_are_not_silent(spark, tmp_path):
    """The tail files deleted while the query is stopped with an Entries open: the rest of that
    Entries comes without its beginning, and FAILFAST names where (never a silent gap)."""
    folder, checkpoint, location = str(tmp_path / "in"), str(tmp_path / "ck"), str(tmp_path / "tails")
    write_files(folder, CLEAN, files=range(3))
    sink = Sink()
    run(bs.dts_to_blob(read_stream(spark, folder), state_location=location), sink, checkpoint)
    assert sorted(sink.batches) == [0, 1, 2] and os.listdir(location)
    shutil.rmtree(location)
    write_files(folder, CLEAN, files=[3])
    with pytest.raises(Exception) as caught:
        run(bs.dts_to_blob(read_stream(spark, folder), state_location=location), sink, checkpoint)
    text = str(caught.value)
    assert "FramingError" in text and "partition 0, offset 16" in text, text[-3000:]


# ---- dts-kafka on a real broker ------------------------------------------------------------------

@pytest.mark.spark
def test_dts_kafka_stream_with_max_offsets_per_trigger_equals_batch(spark, tmp_path, kafka_broker):
    """`dts-kafka` with a small maxOffsetsPerTrigger, so micro-batches end inside split Entries: the
    streaming dts_to_blob equals the batch read's, record for record per Kafka partition."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import Producer
    bs.register(spark)
    parts, _ = CLEAN
    topic = kafka_broker.create_topic(f"stream-{uuid.uuid4().hex[:8]}", partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for partition, raws in parts.items():
        for raw in raws:
            producer.produce(topic, value=raw, key=b"k", partition=partition)
    assert producer.flush(20) == 0
    stream = (spark.readStream.format("dts-kafka").option("brokers", kafka_broker.bootstrap)
              .option("topic", topic).option("maxOffsetsPerTrigger", 7).load())
    sink = Sink()
    query = run(bs.dts_to_blob(stream), sink, str(tmp_path / "ck"))
    ends = [json.loads(p["sources"][0]["endOffset"])[topic] for p in query.recentProgress]
    cuts = {(int(p), end) for end in ends for p, end in end.items()}
    assert any(first < end <= last for p, end in cuts for first, last in splits(parts[p])), cuts
    batch = spark.read.format("dts-kafka").option("brokers", kafka_broker.bootstrap).option("topic", topic).load()
    expected = bs.dts_to_blob(batch).collect()
    got = per_partition(sink.rows())
    assert got == per_partition(expected) and len(got[0]) > 100 and len(got[1]) > 100
    assert {r.topic for r in sink.rows()} == {topic}
