"""Every shard state (issue 40, point 5), in both faces that read DataHub: the library's
`DataHubSource` (what `dts-bridge sync --to dts` runs) and the Spark `format("datahub")` streaming
source (its planner, bridge/spark/datahub_source.py, and queries on local[2]).

The states: an empty shard (a new topic's; a split's child not written yet; a CLOSED shard that
never held a record), a shard that gets its first record while a run or a query is under way, and a
shard expired past the lifecycle (the stand-in's `expire_shard`: DataHub deletes a CLOSED shard
once its records are past the lifecycle) after it was read to its end, or before. For each: what
is read equals `convert` of the same lines, and the ends (the lag's, the planned micro-batch ends)
are the shards' real ends, never an empty shard's phantom record.

DataHub's GetCursor answers LATEST (and OLDEST) with sequence 0 and no error on an empty shard, as
on a shard of one record (the Java SDK's e2e GetCursorTest: OLDEST on a new shard is sequence 0,
cursor 3000...0; SEQUENCE 1 there is SeekOutOfRange); the stand-in answers so, checked first.

Lines are the forward converter's Blob lines of the samples with the forward `sync`'s position
attributes (tests/support/reverse_stream.py), compared in order, never sorted.
"""
from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

pytest.importorskip("datahub")
pytestmark = pytest.mark.datahub

from datahub import exceptions as dx  # noqa: E402
from datahub.models import BlobRecord, CursorType  # noqa: E402

from bridge.datahub.calls import make_client  # noqa: E402
from bridge.datahub.source import DataHubSource, DataLossError  # noqa: E402
from bridge.stream import ErrorPolicy  # noqa: E402
from bridge.stream.shards import DataHubAssembler, ShardMark  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.reverse_stream import P, convert, sample_lines, write_round_robin  # noqa: E402

ENTRIES = sample_lines(("mixed",))  # [lines of one Entry], 85 Entries


@pytest.fixture(scope="module")
def server():
    with StandInDataHub() as s:
        yield s
    assert s.errors == []


@pytest.fixture(scope="module")
def client(server):
    return make_client(server.endpoint, "id", "key")


def new_topic(server, shards: int) -> str:
    topic = f"states_{uuid.uuid4().hex[:8]}"
    server.create_topic(P, topic, shard_count=shards)
    return topic


def counts(server, topic) -> dict:
    """{key: records} of every shard still there: each shard's real end."""
    return {(topic, s["shard_id"]): s["records"] for s in server.shards(P, topic)}


def get_records_asked(server) -> int:
    return sum(1 for r in list(server.requests) if r.get("op") == "GetRecords")


# ---- the stand-in answers an empty shard as DataHub does --------------------------------------------

def test_standin_answers_an_empty_shard_as_datahub_does(server, client):
    """OLDEST and LATEST on an empty shard: sequence 0, no error, the cursor of sequence 0 (LATEST on
    a shard of one record answers the same sequence); SEQUENCE 1 there is SeekOutOfRange; a
    GetRecords at the cursor gives no record, on a CLOSED empty shard InvalidShardOperation."""
    topic = new_topic(server, 2)
    client.put_records_by_shard(P, topic, "0", [BlobRecord(blob_data=b"one")])
    for kind in ("OLDEST", "LATEST"):
        empty = client.get_cursor(P, topic, "1", CursorType[kind])
        assert (empty.sequence, empty.cursor) == (0, "3" + "%07x" % 1 + "0" * 24)
        assert client.get_cursor(P, topic, "0", CursorType[kind]).sequence == 0  # one record: alike
    with pytest.raises(dx.SeekOutOfRangeException):
        client.get_cursor(P, topic, "1", CursorType.SEQUENCE, 1)
    cursor = client.get_cursor(P, topic, "1", CursorType.LATEST).cursor
    assert client.get_blob_records(P, topic, "1", cursor, 1).records == []
    one = client.get_cursor(P, topic, "0", CursorType.LATEST).cursor
    assert [r.blob_data for r in client.get_blob_records(P, topic, "0", one, 1).records] == [b"one"]
    children = server.split(P, topic, "1")
    with pytest.raises(dx.ShardSealedException):
        client.get_blob_records(P, topic, "1", cursor, 1)
    for child in children:
        assert client.get_cursor(P, topic, child, CursorType.LATEST).sequence == 0


# ---- DataHubSource (sync --to dts) -------------------------------------------------------------------

def make(client, topic, **kw):
    asm = DataHubAssembler(settle=0.0)
    kw = {"interval": 0.01, "backoff": 0.001, "max_backoff": 0.01, "relist_interval": 0.05, **kw}
    source = DataHubSource(client, P, topic, wants_tick=asm.waiting, **kw)
    source.ends_interval = 0.0  # every ends() asks DataHub: the lag checked is the real one
    return source, asm


class Reader:
    """A source and its merge read as the pipeline loop reads them: the position of each key is
    the last record's or mark's + 1 (what the loop commits), the lag each shard's end less it."""

    def __init__(self, source, asm):
        self.source, self.asm = source, asm
        self.policy = ErrorPolicy("fail")
        self.positions: dict = {}
        self.marks: set = set()  # (shard, kind) of the marks handed on
        self.entries: list[bytes] = []

    def poll(self, budget=200) -> list:
        batch = self.source.poll(budget, 0.05)
        for item in batch:
            self.positions[item[0]] = max(self.positions.get(item[0], 0), item[1] + 1)
            if isinstance(item[2], ShardMark):
                self.marks.add((item[0][1], item[2].kind))
        self.entries += [e.SerializeToString() for _, e in self.asm.entries(batch, self.policy)]
        return batch

    def drain(self, want: list | None = None, until=lambda: True, timeout=20.0) -> list[bytes]:
        """Entries handed on until every shard is read to its end, nothing is held, `until()`
        holds and as many Entries as `want` came (then they must equal it)."""
        before, deadline = len(self.entries), time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = self.poll()
            got = self.entries[before:]
            if not batch and self.source.caught_up() and not self.asm.buffered and until() \
                    and (want is None or len(got) >= len(want)):
                assert want is None or got == want
                return got
        raise AssertionError(f"not drained: {len(self.entries) - before} Entries of {len(want or ())}, "
                             f"{self.asm.buffered} held, caught_up={self.source.caught_up()}")

    def lag(self) -> dict:
        return {k: end - self.positions.get(k, 0) for k, end in self.source.ends().items()}


def lines_of(entries) -> list:
    return [line for lines in entries for line in lines]


@pytest.mark.parametrize("start", ["end", "beginning", "since"])
def test_a_new_topic_s_empty_shard_gets_its_first_record_while_reading(server, client, start):
    """A 3-shard topic whose shard 1 never held a record: the ends are the shards' real ends (0 for
    shard 1, before and after the first read), and when shard 1 gets its first record under a
    running reader, that record is read (a start at the "end" is sequence 0, not 1)."""
    topic = new_topic(server, 3)
    old = write_round_robin(client, topic, ENTRIES[:12], ["0", "2"])
    kw = {"from_beginning": True} if start == "beginning" else {}
    if start == "since":
        time.sleep(0.01)
        kw["since_ms"] = int(time.time() * 1000)
    reader = Reader(*make(client, topic, **kw))
    reader.source.open({})
    assert reader.source.ends() == counts(server, topic) and counts(server, topic)[(topic, "1")] == 0
    reader.drain(convert(old) if start == "beginning" else [])
    assert reader.source.ends() == counts(server, topic)
    assert set(reader.lag().values()) == {0}
    new = write_round_robin(client, topic, ENTRIES[12:30], ["0", "1", "2"], first=12)  # shard 1's first records
    reader.drain(convert(new))
    assert reader.source.ends() == counts(server, topic) and counts(server, topic)[(topic, "1")] > 0
    assert set(reader.lag().values()) == {0}
    reader.source.close()


def test_a_resumed_run_reads_the_first_record_of_a_shard_committed_at_1_while_empty(server, client):
    """Earlier versions started an empty shard at its "end" 1 (LATEST 0, + 1) and committed 1 for it:
    resumed from that position while the shard is still empty, the reader starts at 0, so the
    shard's first record is read (before: the position stayed 1 and sequence 0 was never read)."""
    topic = new_topic(server, 2)
    old = write_round_robin(client, topic, ENTRIES[:10], ["0"])
    reader = Reader(*make(client, topic))
    reader.source.open({(topic, "0"): len(old), (topic, "1"): 1})
    reader.drain([])
    assert reader.source.ends() == counts(server, topic) and set(reader.lag().values()) == {0}
    new = write_round_robin(client, topic, ENTRIES[10:25], ["0", "1"], first=10)
    reader.drain(convert(new))
    assert set(reader.lag().values()) == {0}
    reader.source.close()


def test_end_of_an_empty_shard_is_0_one_read_only_while_it_looks_empty(server, client):
    """`end_of`: 0 for an empty shard, 1 for a shard of one record, LATEST + 1 otherwise; a GetRecords
    of one record is asked only when LATEST answers 0 on a shard not known to hold a record. A range
    planned to such an end is read without error (before: "shard 1 ends at 0, before the planned
    end 1"). A CLOSED shard that never held a record (a split's child split again) ends at 0 too."""
    topic = new_topic(server, 3)
    client.put_records_by_shard(P, topic, "0", [BlobRecord(blob_data=b"a")])
    client.put_records_by_shard(P, topic, "2", [BlobRecord(blob_data=b"%d" % i) for i in range(3)])
    source = DataHubSource(client, P, topic, readers=0)
    keys = source.keys()
    asked = []
    for key in keys + keys:
        before = get_records_asked(server)
        end = source.end_of(key)
        asked.append((key[1], end, get_records_asked(server) - before))
    assert asked == [("0", 1, 1), ("1", 0, 1), ("2", 3, 0), ("0", 1, 0), ("1", 0, 1), ("2", 3, 0)]
    assert [len(list(source.read_range(k, 0, source.end_of(k)))) for k in keys] == [1, 0, 3]
    left, right = server.split(P, topic, "1")
    grand = server.split(P, topic, left)
    facts = {k[1]: state for k, _, state in source.shard_facts()}
    assert facts["1"] == facts[left] == "CLOSED"
    assert [source.end_of((topic, s)) for s in ("1", left, right, *grand)] == [0, 0, 0, 0, 0]
    client.put_records_by_shard(P, topic, right, [BlobRecord(blob_data=b"first")])
    assert source.end_of((topic, right)) == 1
    assert [r.data for r in source.read_range((topic, right), 0, 1)] == [b"first"]
    source.close()


def test_a_split_s_children_not_written_yet(server, client):
    """A shard split under a reader: its children are empty until written (their ends 0, the lag 0),
    the parent is finished and each child read from sequence 0 once written; a child split again
    before it held a record is a CLOSED empty shard, finished without error, its own children empty."""
    topic = new_topic(server, 1)
    first = write_round_robin(client, topic, ENTRIES[:15], ["0"])
    reader = Reader(*make(client, topic, from_beginning=True))
    reader.drain(convert(first))
    left, right = server.split(P, topic, "0")
    reader.drain([], until=lambda: {(left, "shard"), (right, "shard"), ("0", "finished")} <= reader.marks)
    assert reader.source.ends() == counts(server, topic) and counts(server, topic)[(topic, left)] == 0
    assert set(reader.lag().values()) == {0}
    second = write_round_robin(client, topic, ENTRIES[15:30], [left], first=15)
    reader.drain(convert(second))
    grand = server.split(P, topic, right)  # never written, now CLOSED
    reader.drain([], until=lambda: (right, "finished") in reader.marks and (grand[1], "shard") in reader.marks)
    assert reader.source.ends() == counts(server, topic)
    assert {k for k, kind in reader.marks if kind == "finished"} == {"0", right}
    third = write_round_robin(client, topic, ENTRIES[30:45], [left, grand[1]], first=30)
    reader.drain(convert(third))
    assert reader.source.ends() == counts(server, topic) and counts(server, topic)[(topic, grand[0])] == 0
    assert set(reader.lag().values()) == {0}
    reader.source.close()


def _split_topic(server, client):
    """A 1-shard topic: 20 Entries on shard 0, which is split; 10 more on its children."""
    topic = new_topic(server, 1)
    parent = write_round_robin(client, topic, ENTRIES[:20], ["0"])
    children = server.split(P, topic, "0")
    return topic, parent, children, write_round_robin(client, topic, ENTRIES[20:30], children, first=20)


def test_a_shard_expired_after_it_was_read(server, client):
    """The split's parent read to its end, then expired: reading goes on (no error, the children's
    new records read), the ends and the lag stay right; a run resumed from the committed positions
    lists the shard no more and reads on."""
    topic, parent, children, more = _split_topic(server, client)
    reader = Reader(*make(client, topic, from_beginning=True))
    reader.drain(convert(parent + more), until=lambda: ("0", "finished") in reader.marks)
    ends = counts(server, topic)
    server.expire_shard(P, topic, "0")
    listings = reader.source.relists
    late = write_round_robin(client, topic, ENTRIES[30:40], children, first=30)
    reader.drain(convert(late), until=lambda: reader.source.relists > listings + 1)  # (it saw the shard gone)
    assert reader.source.ends() == {**ends, **counts(server, topic)}
    assert set(reader.lag().values()) == {0} and reader.source.lost == {}
    reader.source.close()
    again = Reader(*make(client, topic))  # resumed: the committed positions, the expired shard's among them
    again.source.open(dict(reader.positions))
    assert again.source.keys() == sorted(counts(server, topic)) and (topic, "0") not in again.source.keys()
    last = write_round_robin(client, topic, ENTRIES[40:50], children, first=40)
    again.drain(convert(last))
    assert set(again.lag().values()) == {0}
    again.source.close()


@pytest.mark.parametrize("fail", [True, False], ids=["fail", "skip"])
def test_a_shard_expired_before_it_was_read_to_its_end_is_lost_data(server, client, fail):
    """The split's parent expires while the reader is inside it: its records from the reader's
    position on were never read. fail_on_data_loss: a DataLossError naming the shard and the
    position; else they are counted in `lost` (what the reader knew of the shard's end), the shard
    is finished, its children read, and the lag is 0 (before: the shard was finished silently)."""
    topic, parent, children, more = _split_topic(server, client)
    whole = len(lines_of(ENTRIES[:8]))
    reader = Reader(*make(client, topic, from_beginning=True, readers=0, page=whole, fail_on_data_loss=fail))
    reader.source.open({})
    while reader.positions.get((topic, "0"), 0) < whole:  # (the first poll hands on the shards' marks too)
        reader.poll(budget=whole - reader.positions.get((topic, "0"), 0))
    end = reader.source.ends()[(topic, "0")]
    assert end == len(parent) and reader.positions[(topic, "0")] == whole
    server.expire_shard(P, topic, "0")
    if fail:
        with pytest.raises(DataLossError, match=rf"shard 0 no longer exists .*records from {whole} on were never "
                                                rf"read \({end - whole} at least"):
            reader.drain()
        return
    want = convert(lines_of(ENTRIES[:8])) + convert(more)
    reader.drain(until=lambda: ("0", "finished") in reader.marks and len(reader.entries) >= len(want))
    assert reader.source.lost == {(topic, "0"): end - whole}
    assert reader.entries == want
    assert set(reader.lag().values()) == {0} and reader.source.ends()[(topic, "0")] == end
    reader.source.close()


# ---- the Spark format("datahub") source: its planner (the driver) and its ranges (the tasks) --------

def planner(server, topic, **options):
    from bridge.spark.datahub_source import Planner, ReadOptions
    given = {"endpoint": server.endpoint, "project": P, "topic": topic, "accessId": "id", "accessKey": "key",
             "settle": "0", **options}
    return Planner(ReadOptions.parse(given, streaming=True))


class Plans:
    """Micro-batches as a streaming query plans and reads them: `latest` from the last end, its
    ranges read by `read_range` (what a task runs); the records read per shard and the marks kept."""

    def __init__(self, planner):
        self.planner = planner
        self.end = planner.initial()
        self.read: dict = {}  # shard -> [sequence, ...] in the order read
        self.marks: list = []  # (shard, kind)

    def next(self, limit=None) -> dict:
        start, self.end = self.end, self.planner.latest(self.end, limit)
        self.run(start, self.end)
        return self.end

    def run(self, start: dict, end: dict) -> None:
        """The micro-batch from `start` to `end`: its ranges read as its tasks read them."""
        from bridge.spark.datahub_source import read_range
        for part in self.planner.ranges(start, end):
            for row in read_range(self.planner.opts, part, None, 0):
                if row[-1] is None:
                    self.read.setdefault(row[1], []).append(row[2])
                else:
                    self.marks.append((row[1], json.loads(row[-1])["kind"]))

    def positions(self) -> dict:
        from bridge.spark.datahub_source import _positions
        return _positions(self.end)

    def planned_at_end(self) -> set:
        return {s for shards in ((self.end.get("_plan") or {}).get("ends") or {}).values() for s in shards}


def sequences(server, topic) -> dict:
    out: dict = {}
    for r in server.records(P, topic):
        out.setdefault(r["shard"], []).append(r["sequence"])
    return out


@pytest.mark.parametrize("starting", ["oldest", "latest", "time"])
def test_spark_plans_an_empty_shard_and_its_first_record(server, client, starting):
    """A 3-shard topic whose shard 1 never held a record: every startingPosition starts it at 0, the
    micro-batches' ends are the shards' real ends (shard 1: 0, at its end), its range is read
    without error (before: "shard 1 ends at 0, before the planned end 1"), and its first records,
    written while the query runs, are read from sequence 0."""
    topic = new_topic(server, 3)
    write_round_robin(client, topic, ENTRIES[:12], ["0", "2"])
    since = int(time.time() * 1000) + 1
    time.sleep(0.01)
    plans = Plans(planner(server, topic, startingPosition=str(since) if starting == "time" else starting))
    assert plans.positions()[(topic, "1")] == 0
    plans.next()
    assert plans.positions() == counts(server, topic) and plans.planned_at_end() == {"0", "1", "2"}
    assert plans.read == ({"0": sequences(server, topic)["0"], "2": sequences(server, topic)["2"]}
                          if starting == "oldest" else {})
    old = sequences(server, topic)
    write_round_robin(client, topic, ENTRIES[12:30], ["0", "1", "2"], first=12)  # shard 1's first records
    plans.next()
    assert plans.positions() == counts(server, topic) and plans.planned_at_end() == {"0", "1", "2"}
    every = sequences(server, topic)
    assert every["1"][0] == 0
    assert plans.read == (every if starting == "oldest" else {s: seqs[len(old.get(s, [])):]
                                                             for s, seqs in every.items()})


def test_spark_plans_a_split_s_children_not_written_yet(server, client):
    """A shard split under the query: its children are planned from 0 once the parent is read to its
    end (a "finished" mark), at their end 0 while empty; a child split again before it held a record
    is a CLOSED empty shard, finished at 0; what is written later is read from sequence 0."""
    topic = new_topic(server, 1)
    write_round_robin(client, topic, ENTRIES[:15], ["0"])
    plans = Plans(planner(server, topic))
    plans.next()
    left, right = server.split(P, topic, "0")
    plans.next()
    plans.next()
    assert plans.positions() == counts(server, topic) and plans.positions()[(topic, left)] == 0
    assert ("0", "finished") in plans.marks and {left, right} <= plans.planned_at_end()
    grand = server.split(P, topic, right)
    plans.next()
    plans.next()
    assert (right, "finished") in plans.marks and set(grand) <= plans.planned_at_end()
    write_round_robin(client, topic, ENTRIES[15:40], [left, grand[1]], first=15)
    plans.next()
    assert plans.positions() == counts(server, topic)
    assert plans.read == {s: seqs for s, seqs in sequences(server, topic).items() if seqs}


@pytest.mark.parametrize("case", ["read", "unread-fail", "unread-skip"])
def test_spark_plans_an_expired_shard(server, client, case):
    """The split's parent expires. Read to its end before: it leaves the offsets, its range in that
    micro-batch is a "finished" mark, nothing is lost and the children are read on. Expired while
    the query was inside it: failOnDataLoss fails the plan naming the shard and the position;
    failOnDataLoss=false leaves it out the same way and reads the children (before: it stayed in
    the offsets at its position for good, the loss unseen)."""
    from bridge.datahub.source import DataLossError
    topic, parent, children, more = _split_topic(server, client)
    fail = case == "unread-fail"
    plans = Plans(planner(server, topic, failOnDataLoss=str(fail).lower()))
    limit = None if case == "read" else 10
    plans.next(limit)
    if case == "read":
        plans.next()
        assert plans.positions()[(topic, "0")] == len(parent) and "0" in plans.planned_at_end()
    else:
        assert plans.positions()[(topic, "0")] == 10
    ends = counts(server, topic)
    server.expire_shard(P, topic, "0")
    if fail:
        with pytest.raises(DataLossError, match="shard 0 no longer exists .*records from 10 on were never read"):
            plans.next()
        return
    plans.next()
    assert (topic, "0") not in plans.positions() and ("0", "finished") in plans.marks
    plans.next()
    plans.next()
    assert plans.positions() == counts(server, topic) and set(children) <= plans.planned_at_end()
    want = {s: seqs for s, seqs in sequences(server, topic).items()}
    want["0"] = list(range(ends[(topic, "0")] if case == "read" else 10))
    assert plans.read == want


@pytest.mark.parametrize("fail", [True, False], ids=["fail", "skip"])
def test_spark_a_micro_batch_planned_before_its_shard_expired(server, client, fail):
    """A micro-batch planned while the split's parent was there and run after it expired (a query
    restarted from its checkpoint replays its last planned micro-batch): the range's records are
    lost data, a DataLossError naming the shard and the position, or skipped; the next plan leaves
    the shard out and the children are read."""
    from bridge.datahub.source import DataLossError
    topic, parent, children, more = _split_topic(server, client)
    plans = Plans(planner(server, topic, failOnDataLoss=str(fail).lower()))
    plans.next(10)
    start, end = plans.end, plans.planner.latest(plans.end, 10)
    assert end[topic]["0"] == 20  # planned: the parent's records 10..19
    server.expire_shard(P, topic, "0")
    if fail:
        with pytest.raises(DataLossError, match="shard 0 no longer exists .*records from 10 on were never read"):
            plans.run(start, end)
        return
    plans.run(start, end)
    plans.end = end
    assert plans.read["0"] == list(range(10))
    for _ in range(3):
        plans.next()
    assert (topic, "0") not in plans.positions() and ("0", "finished") in plans.marks
    assert plans.positions() == counts(server, topic)
    assert {s: plans.read.get(s) for s in children} == {s: sequences(server, topic)[s] for s in children}


def test_spark_a_restart_after_a_split_replays_its_first_micro_batch_as_planned(server, client):
    """A query killed before its first micro-batch was committed starts again from a new initial
    offset, which lists the split's children too: the replayed micro-batch (start: that offset, end:
    the one planned before the split) reads the same records and says nothing about the children
    (before this was told apart from a shard gone past the lifecycle, they got a "finished" mark,
    and the merge handed on records past their unread ones)."""
    topic = new_topic(server, 3)
    write_round_robin(client, topic, ENTRIES[:20], ["0", "1", "2"])
    first = Plans(planner(server, topic))
    assert first.end == {topic: {"0": 0, "1": 0, "2": 0}}
    first.next(20)
    left, right = server.split(P, topic, "0")
    again = Plans(planner(server, topic))  # the restart: a new initial offset, the logged end
    assert {left, right} <= {s for _, s in again.positions()}
    again.run(again.end, first.end)
    assert again.read == first.read and sorted(again.marks) == sorted(first.marks)
    assert not any(shard in (left, right) for shard, _ in again.marks)


# ---- Spark queries on local[2]: the states end to end, and a killed driver --------------------------

def _spark_entries(rows) -> list[bytes]:
    from bridge.spark.kafka_sink import entries_of
    return [e.SerializeToString() for e in entries_of(r["value"] for r in rows)]


def test_spark_query_through_every_shard_state(spark, server, client, tmp_path):
    """`format("datahub")` -> `blob_to_dts` -> foreachBatch, availableNow, restarted from its checkpoint
    after each change: a topic whose shard 1 is empty (before: the query failed before its first
    micro-batch), then gets its first records while shard 2 is split, its children empty; shard 2
    expired once read, one child written, the other never. Each run's Entries equal `convert` of the
    lines written since, in order per table; each run's last offsets are the shards' real ends (the
    expired shard's left out)."""
    import bridge.spark as bs
    from support.reverse_stream import by_table
    topic = new_topic(server, 3)
    checkpoint = str(tmp_path / "checkpoint")

    def run(lines):
        batches: dict = {}  # micro-batch id -> its rows (a micro-batch replayed replaces its rows)

        def keep(frame, batch_id):
            batches[batch_id] = frame.collect()

        df = (spark.readStream.format("datahub").option("endpoint", server.endpoint).option("project", P)
              .option("topic", topic).option("accessId", "id").option("accessKey", "key").option("settle", "0.2")
              .load())
        q = (bs.blob_to_dts(df).writeStream.foreachBatch(keep).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None and not q.isActive
        got = _spark_entries([row for b in sorted(batches) for row in batches[b]])
        assert by_table(got) == by_table(convert(lines)) and len(got) == len(convert(lines))
        offsets = [p["sources"][0]["endOffset"] for p in q.recentProgress if p["sources"]]
        last = json.loads(offsets[-1]) if isinstance(offsets[-1], str) else offsets[-1]
        assert {(topic, s): n for s, n in last[topic].items()} == counts(server, topic)

    run(write_round_robin(client, topic, ENTRIES[:20], ["0", "2"]))
    lines = write_round_robin(client, topic, ENTRIES[20:40], ["0", "1", "2"], first=20)
    left, right = server.split(P, topic, "2")
    run(lines)
    server.expire_shard(P, topic, "2")
    run(write_round_robin(client, topic, ENTRIES[40:60], ["0", "1", left], first=40))
    assert counts(server, topic)[(topic, right)] == 0 and (topic, "2") not in counts(server, topic)


def test_spark_query_on_a_topic_with_an_empty_shard_killed_and_restarted(server, client, kafka_broker, tmp_path):
    """`format("datahub")` -> `blob_to_dts` -> `dts-kafka` (tests/pipeline_jobs/reverse_driver.py) on
    a 3-shard topic whose shard 1 is empty: shard 1 gets its first records while the driver runs,
    the driver is SIGKILLed at a random point, shard 2 is split (one child never written), and the
    restarted driver (availableNow, from the checkpoint) runs to the end: a read_committed consumer
    sees every Entry once, equal to `convert` of the same lines in order per Kafka partition (so per
    table); the checkpoint's last offsets are the shards' real ends. Seed: SPARK_REVERSE_SEED."""
    import random

    pytest.importorskip("pyspark")
    pytest.importorskip("confluent_kafka")
    from bridge.wire import subscribe_pb2 as pb
    from support.dts_kafka import expected_partition, read_back, records_on
    from support.pipeline import ENV
    from support.reverse_stream import _killpg, _offset_log, _start
    rng = random.Random(int(ENV.get("SPARK_REVERSE_SEED", "40")))
    topic = new_topic(server, 3)
    lines = write_round_robin(client, topic, ENTRIES[:30], ["0", "2"])
    out = kafka_broker.create_topic(f"states-kill-{uuid.uuid4().hex[:6]}", partitions=3)
    checkpoint = tmp_path / "checkpoint"
    cfg = dict(endpoint=server.endpoint, project=P, datahub_topic=topic, bootstrap=kafka_broker.bootstrap, topic=out,
               checkpoint=str(checkpoint), maxRecordsPerTrigger=40, settle=0.3, markers=f"markers-{out}")
    proc, path = _start(tmp_path, 1, cfg, "200 milliseconds")
    started = time.monotonic()
    while proc.poll() is None and records_on(kafka_broker.bootstrap, out) == 0 and time.monotonic() - started < 120:
        time.sleep(0.1)
    lines += write_round_robin(client, topic, ENTRIES[30:55], ["0", "1", "2"], first=30)  # shard 1's first records
    time.sleep(rng.uniform(0.0, 1.5))
    alive = proc.poll() is None
    _killpg(proc)
    text = path.read_text(errors="replace")
    assert alive and "Traceback" not in text, text[-4000:]
    killed_at, run1 = records_on(kafka_broker.bootstrap, out), time.monotonic() - started
    left, right = server.split(P, topic, "2")
    lines += write_round_robin(client, topic, ENTRIES[55:], ["0", "1", left], first=55)
    proc, path = _start(tmp_path, 2, dict(cfg, maxRecordsPerTrigger=500), "availableNow")  # (fewer micro-batches)
    started = time.monotonic()
    try:
        code = proc.wait(300)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        raise AssertionError("the restarted run did not end:\n" + path.read_text(errors="replace")[-4000:]) from None
    text = path.read_text(errors="replace")
    assert code == 0 and "finished" in text, text[-4000:]
    got = read_back(kafka_broker.bootstrap, out)
    want = convert(lines)
    have = {p: [e.SerializeToString() for e, _, _ in items] for p, items in got.items()}
    context = (f"run 1 SIGKILLed after {run1:.1f} s with {killed_at} Kafka records, run 2 (availableNow) "
               f"{time.monotonic() - started:.1f} s, {sum(map(len, have.values()))} in the end; logs in {tmp_path}")
    for p in sorted(have):
        assert have[p] == [raw for raw in want if expected_partition(pb.Entry.FromString(raw), len(have)) == p], context
    assert sum(len(v) for v in have.values()) == len(want), context
    last = _offset_log(checkpoint, topic)[-1]
    assert {(topic, s): n for s, n in last.items()} == counts(server, topic) and last[right] == 0, context
    print(f"\n[empty-shard kill run: {len(want)} Entries compared per partition, seed "
          f"{ENV.get('SPARK_REVERSE_SEED', '40')}: {context}]")
