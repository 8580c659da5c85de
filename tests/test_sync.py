"""End-to-end tests of `dts-bridge sync` (docs/kafka.md, "`dts-bridge sync`") on real parts: a real
Apache Kafka broker (tests/support/kafka_broker.py), `dts-bridge sync` as a real subprocess, and
the stand-in DataHub (tests/support/datahub_standin.py) that the real pydatahub client inside
`sync` talks to over HTTP, with chaos faults on (5xx, throttling, lost answers after apply,
connection resets, delays; fixed seeds).

The kill loops SIGKILL `sync` at seeded random points (by time and by how many records landed),
restart it with the same --group, produce more data between restarts (catch-up), then run it to
completion and compare what landed in DataHub with `dts-bridge convert` of the very files that were
produced: per (DataHub shard, Kafka partition), record for record, in order. Nothing is sorted
before a comparison: within one shard the records of one partition keep that partition's order,
while the two partitions interleave freely, so each shard is split by the partition in the
record's `dts.pos` attribute ("partition:offset:entry:row") and the positions are checked to be
strictly increasing (hence unique) per (shard, partition), and unique across the whole topic.

Also here: SIGTERM drains (exit 0, commit, a rerun writes nothing); TDSQL streams (ShardId/ps
headers: two shards' multi-segment Entries interleaved in one partition, a redelivery, ps gaps
under fail and skip, a restart at a commit point held by an open Entries); restarts that used
to write records twice (partitions owned by different processes, then by one); a Tuple restart
after a DDL added a column; the first sync on a freshly started broker.

Seeds: SYNC_TEST_SEED=N changes the seed of the kill points and of the chaos (default 1729);
a failure message names the seed and keeps the runs' stderr in the test's tmp_path. The long
variants (22 kills, bigger streams, more chaos; marked deep) run under `make test-deep`
(tests/conftest.py skips `deep` tests unless HYPOTHESIS_PROFILE=deep).
"""
from __future__ import annotations

import collections
import json
import pathlib
import random
import signal
import subprocess
import time
import uuid

import orjson
import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.datahub

from confluent_kafka import Producer  # noqa: E402

from bridge import shard_key  # noqa: E402
from bridge.datahub.sink import make_client, shard_for, tuple_shard_key  # noqa: E402
from bridge.sync import topic_name  # noqa: E402
from bridge.wire import subscribe_pb2 as pb  # noqa: E402
from bridge.wire.framing import Assembled, Reassembler, pack_entries, read_pb, split_entries, write_pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import compare  # noqa: E402
from support.pipeline import CHAOS_OPS, ROOT, bridge_cli, dts_pos, fault_summary, run_bridge, text_or_none  # noqa: E402
from support.sync_runs import (  # noqa: E402
    PROJECT,
    SEED,
    Sync,
    chaos,
    committed_offsets,
    convert_blob,
    convert_tuple,
    end_offsets,
    entries_of,
    envelope_count,
    kill_loop,
    landed_by_shard_partition,
    no_traceback,
    produce,
    repack,
    unique_name,
    warm_group_coordinator,
)

SAMPLES = ROOT / "samples"

# ---- Blob --------------------------------------------------------------------------------------

def _blob_kill_loop(kafka_broker, tmp_path, *, kills: int, seed: int, layout: dict, stages: list,
                    max_delay: float, max_step: int, chaos_scale: float):
    began = time.monotonic()
    topic = kafka_broker.create_topic(unique_name("sync-blob"), partitions=2)
    warm_group_coordinator(kafka_broker, topic)
    shards = ["0", "1", "2"]
    expected_lines: dict[int, list[bytes]] = {0: [], 1: []}
    produced: dict[int, list[str]] = {0: [], 1: []}

    def produce_stage(stage):
        for path, partition in stage:
            produce(kafka_broker, topic, path, partition)
            expected_lines[partition].extend(convert_blob(path, tmp_path))
            produced[partition].append(path.name)

    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        produce_stage(layout)
        chaos(server, seed, chaos_scale)
        sync = Sync(tmp_path, kafka_broker, topic, "g-blob", server, "--to", "blob", "--datahub-topic", "blob",
                    "--idle-timeout", "2")
        killed = kill_loop(sync, server, kills=kills, seed=seed, stages=stages, produce_stage=produce_stage,
                           max_delay=max_delay, max_step=max_step, log=log)
        code, report, err = sync.run()
        server.faults.clear()  # the checks below read through a client of their own
        context = (f"seed {seed}; stderr of every run in {tmp_path}; partitions: {produced}; "
                   f"faults: {fault_summary(server)}\n  " + "\n  ".join(log))
        no_traceback(err, "the final sync run")
        assert code == 0, f"final sync run exited {code}: {err[-3000:]}\n{context}"
        assert report["stopped"] == "idle" and report["rejected"] == 0, (report, context)
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        assert [s["shard_id"] for s in server.shards(PROJECT, "blob") if s["state"] == "ACTIVE"] == shards
        expected: dict = collections.defaultdict(list)
        for partition, lines in expected_lines.items():
            for line in lines:
                expected[(shard_for(shard_key(orjson.loads(line)), shards), partition)].append(line)
        assert len({s for s, _ in expected}) == 3 and {p for _, p in expected} == {0, 1}, \
            "the stream must reach every shard from both partitions"
        got, positions = landed_by_shard_partition(server, "blob", topic, lambda r: r["data"])
        compared = compare("blob", got, positions, expected, context)
        # the final run committed the end of both partitions
        ends = end_offsets(kafka_broker, topic, [0, 1])
        assert committed_offsets(kafka_broker, topic, "g-blob", [0, 1]) == ends, context
        assert len(killed) >= kills
        assert any(k["landed_in_run"] > 0 for k in killed), f"no kill fell while records were landing\n{context}"
        faults = fault_summary(server)
        for kind in ("chaos-5xx", "chaos-throttle", "chaos-ack-lost", "chaos-reset"):
            assert faults.get(kind, 0) > 0, f"chaos never injected {kind}: {faults}"
        print(f"\n[sync blob kill loop, seed {seed}: {len(killed)} kills in {sync.runs} runs, {compared} records "
              f"compared over {len(expected)} (shard, partition) pairs, {sum(map(envelope_count, _paths(layout, stages)))} "
              f"Envelopes, faults {faults}, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


def _paths(layout, stages):
    return [path for path, _ in layout] + [path for stage in stages for path, _ in stage]


def test_sync_blob_kill_loop(kafka_broker, tmp_path):
    """3 SIGKILLs (the first early in the first run), chaos on every DataHub operation, a
    2-partition topic whose Entries include ones split across Envelopes; two stages produced
    during the loop. Then what landed equals the file conversion per (shard, partition)."""
    small = {n: repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-1200.pb", 1200) for n in ("mixed", "types")}
    _blob_kill_loop(kafka_broker, tmp_path, kills=3, seed=SEED,
                    layout=[(SAMPLES / "mixed.pb", 0), (SAMPLES / "large.pb", 1)],
                    stages=[[(small["types"], 0)], [(small["mixed"], 1)]],
                    max_delay=3.0, max_step=60, chaos_scale=1.0)


@pytest.mark.deep
def test_sync_blob_kill_loop_deep(kafka_broker, tmp_path):
    """20+ kills, bigger streams (the samples packed again under 800 and 1200 byte messages,
    several times over), more chaos."""
    files = {}
    for n in ("mixed", "types", "large"):
        files[n] = repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-800x2.pb", 800, times=2)
        files[n + "3"] = repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-1200x3.pb", 1200, times=3)
    stages = [[(files["types"], 0)], [(files["mixed"], 1)], [(files["large3"], 0)], [(SAMPLES / "types.pb", 1)],
              [(files["mixed3"], 0)], [(files["large"], 1)], [(files["types3"], 1)]]
    _blob_kill_loop(kafka_broker, tmp_path, kills=22, seed=SEED + 1,
                    layout=[(SAMPLES / "mixed.pb", 0), (SAMPLES / "large.pb", 1)], stages=stages,
                    max_delay=4.0, max_step=150, chaos_scale=1.8)


# ---- Tuple -------------------------------------------------------------------------------------

def check_tuple_topics(server, source: str, converted: dict, context: str, shards: int = 2) -> tuple[int, int, dict]:
    """Every table's topic against the Tuple file conversion: {table: [(partition, versions)]} in
    production order. Returns (rows compared, (topic, shard, partition) groups, {table: topic})."""
    client = make_client(server.endpoint, "test-id", "test-secret")
    topics = {}
    for table in converted:
        db, _, name = table.partition(".")
        topics[table] = topic_name("{db}_{table}", db, name)
    assert len(set(topics.values())) == len(topics), topics
    listed = set(client.list_topic(PROJECT).topic_names)
    assert listed == set(topics.values()), f"topics in DataHub {sorted(listed)}, tables {topics}\n{context}"
    compared = pairs = 0
    for table, parts in converted.items():
        name = topics[table]
        # the topic: the first version's fields, then each column a later version added (DDL),
        # appended as it first appears; a row fills the fields by name (a dropped column: NULL)
        want = []
        for _, versions in parts:
            for doc, _ in versions:
                want += [(f["name"], f["type"].upper()) for f in doc["fields"]
                         if f["name"] not in {n for n, _ in want}]
        fields = [n for n, _ in want]
        info = client.get_topic(PROJECT, name)
        have = [(f.name, str(getattr(f.type, "value", f.type)).upper()) for f in info.record_schema.field_list]
        assert have == want, f"{name}: RecordSchema {have}, the table's versions make {want}"
        shard_ids = sorted((s["shard_id"] for s in server.shards(PROJECT, name) if s["state"] == "ACTIVE"), key=int)
        assert len(shard_ids) == shards, (name, shard_ids)
        expected: dict = collections.defaultdict(list)
        for partition, versions in parts:
            for doc, rows in versions:
                keys = [c["name"] for c in doc["dtsColumns"] if c.get("isKey")]
                for row in rows:
                    shard = shard_for(tuple_shard_key(row, table, keys), shard_ids)
                    expected[(shard, partition)].append([text_or_none(row.get(f)) for f in fields])
        got, positions = landed_by_shard_partition(server, name, source,
                                                   lambda r: [text_or_none(v) for v in r["values"]])
        compared += compare(name, got, positions, expected, f"table {table}; {context}")
        pairs += len(expected)
    return compared, pairs, topics


def _tuple_kill_loop(kafka_broker, tmp_path, *, kills: int, seed: int, layout: list, stages: list,
                     max_delay: float, max_step: int, chaos_scale: float):
    began = time.monotonic()
    topic = kafka_broker.create_topic(unique_name("sync-tuple"), partitions=2)
    warm_group_coordinator(kafka_broker, topic)
    # table -> [(partition, [(schema document, rows) per version])] in production order
    converted: dict[str, list] = collections.defaultdict(list)
    produced: dict[int, list[str]] = {0: [], 1: []}

    def produce_stage(stage):
        for path, partition in stage:
            produce(kafka_broker, topic, path, partition)
            for table, versions in convert_tuple(path, tmp_path).items():
                converted[table].append((partition, versions))
            produced[partition].append(path.name)

    log: list[str] = []
    with StandInDataHub() as server:
        produce_stage(layout)
        chaos(server, seed, chaos_scale)
        sync = Sync(tmp_path, kafka_broker, topic, "g-tuple", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--shards", "2", "--on-error", "skip", "--idle-timeout", "2")
        killed = kill_loop(sync, server, kills=kills, seed=seed, stages=stages, produce_stage=produce_stage,
                           max_delay=max_delay, max_step=max_step, log=log, ok_codes=(0, 1))
        code, report, err = sync.run()
        server.faults.clear()  # the checks below read through a client of their own
        context = (f"seed {seed}; stderr of every run in {tmp_path}; partitions: {produced}; "
                   f"faults: {fault_summary(server)}\n  " + "\n  ".join(log))
        no_traceback(err, "the final sync run")
        # --on-error skip: exit 1 when the run rejected a record (types.pb has Entries the Tuple
        # conversion refuses, as the file conversion does)
        assert code == (1 if report.get("rejected") else 0), f"final sync run exited {code}: {err[-3000:]}\n{context}"
        assert report["stopped"] == "idle", (report, context)
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        compared, pairs, topics = check_tuple_topics(server, topic, converted, context)
        assert len(topics) >= 9, topics
        ends = end_offsets(kafka_broker, topic, [0, 1])
        assert committed_offsets(kafka_broker, topic, "g-tuple", [0, 1]) == ends, context
        assert any(k["landed_in_run"] > 0 for k in killed), f"no kill fell while records were landing\n{context}"
        faults = fault_summary(server)
        for kind in ("chaos-5xx", "chaos-throttle", "chaos-ack-lost", "chaos-reset"):
            assert faults.get(kind, 0) > 0, f"chaos never injected {kind}: {faults}"
        print(f"\n[sync tuple kill loop, seed {seed}: {len(killed)} kills in {sync.runs} runs, {len(topics)} tables, "
              f"{compared} rows compared over {pairs} (topic, shard, partition) groups, faults {faults}, "
              f"{time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


def test_sync_tuple_kill_loop(kafka_broker, tmp_path):
    """The kill loop for Tuple: one topic per table ('{db}_{table}', 2 shards, created by sync),
    9 tables, the shop tables in both partitions; each table's topic equals the Tuple file
    conversion per (shard, partition), values compared as text."""
    small = {n: repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-1200.pb", 1200) for n in ("mixed", "types")}
    _tuple_kill_loop(kafka_broker, tmp_path, kills=3, seed=SEED + 7,
                     layout=[(SAMPLES / "mixed.pb", 0), (SAMPLES / "large.pb", 1)],
                     stages=[[(small["types"], 0)], [(small["mixed"], 1)]],
                     max_delay=3.0, max_step=40, chaos_scale=1.0)


@pytest.mark.deep
def test_sync_tuple_kill_loop_deep(kafka_broker, tmp_path):
    files = {}
    for n in ("mixed", "types", "large"):
        files[n] = repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-800x2.pb", 800, times=2)
        files[n + "3"] = repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-1200x3.pb", 1200, times=3)
    stages = [[(files["types"], 0)], [(files["mixed"], 1)], [(files["large3"], 0)], [(SAMPLES / "types.pb", 1)],
              [(files["mixed3"], 0)], [(files["large"], 1)], [(files["types3"], 1)]]
    _tuple_kill_loop(kafka_broker, tmp_path, kills=22, seed=SEED + 8,
                     layout=[(SAMPLES / "mixed.pb", 0), (SAMPLES / "large.pb", 1)], stages=stages,
                     max_delay=4.0, max_step=100, chaos_scale=1.8)


# ---- SIGTERM drains ------------------------------------------------------------------------------

def _shard_total(server, topic: str) -> int:
    return sum(s["records"] for s in server.shards(PROJECT, topic))


def _wait_for(predicate, proc, timeout: float, what: str, err: pathlib.Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"sync ended ({proc.returncode}) before {what}: {err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s: {err.read_text()[-3000:]}"
        time.sleep(0.02)


def _terminate(proc, out: pathlib.Path, err: pathlib.Path, what: str) -> dict:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{what}: sync did not end within 60 s of SIGTERM: {err.read_text()[-3000:]}")
    text = err.read_text()
    no_traceback(text, what)
    assert code == 0, f"{what}: SIGTERM must drain and exit 0, got {code}: {text[-3000:]}"
    report = json.loads(out.read_text())
    assert report["stopped"] == "signal", (what, report)
    assert "stopped: signal" in text, text[-2000:]
    return report


def test_sigterm_drains_commits_and_a_rerun_writes_nothing_new(kafka_broker, tmp_path):
    """SIGTERM while records are being written: exit 0, and everything written before the stop is
    committed (the next run finds nothing of its re-read already landed); SIGTERM once everything
    landed: the committed offsets are the ends of the partitions; a rerun writes nothing."""
    topic = kafka_broker.create_topic(unique_name("sync-term"), partitions=2)
    warm_group_coordinator(kafka_broker, topic)
    files = [(repack(SAMPLES / "mixed.pb", tmp_path / "mixed-800.pb", 800), 0),
             (repack(SAMPLES / "types.pb", tmp_path / "types-800.pb", 800), 0),
             (repack(SAMPLES / "large.pb", tmp_path / "large-800.pb", 800), 1)]
    expected_lines: dict[int, list[bytes]] = {0: [], 1: []}
    for path, partition in files:
        produce(kafka_broker, topic, path, partition)
        expected_lines[partition].extend(convert_blob(path, tmp_path))
    total = sum(map(len, expected_lines.values()))
    shards = ["0", "1", "2"]
    expected: dict = collections.defaultdict(list)
    for partition, lines in expected_lines.items():
        for line in lines:
            expected[(shard_for(shard_key(orjson.loads(line)), shards), partition)].append(line)
    ends = end_offsets(kafka_broker, topic, [0, 1])
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        # slow and faulty enough that the first SIGTERM falls while records are being written
        server.faults.chaos(SEED + 3, p_5xx=0.05, p_throttle=0.1, p_ack_lost=0.05, p_reset=0.03, p_delay=0.6,
                            max_delay=0.1, op=CHAOS_OPS)
        sync = Sync(tmp_path, kafka_broker, topic, "g-term", server, "--to", "blob", "--datahub-topic", "blob",
                    "--batch-size", "10")
        # 1. SIGTERM in the middle
        proc, out, err = sync.start()
        _wait_for(lambda: _shard_total(server, "blob") >= 30, proc, 60, "30 records in DataHub", err)
        first = _terminate(proc, out, err, "SIGTERM in the middle")
        committed = committed_offsets(kafka_broker, topic, "g-term", [0, 1])
        # a partition the run had not read yet has no commit (librdkafka's OFFSET_INVALID, -1001)
        assert {int(p): o for p, o in first["committed"].items()} == {p: o for p, o in committed.items() if o >= 0}, \
            (first, committed)
        assert all(committed[p] <= ends[p] for p in (0, 1)) and max(committed.values()) > 0, (committed, ends)
        # (the drain may have written everything: the run converts ahead of DataHub, up to 20,000
        # records, and flushes them all before its commit; what follows holds either way)
        got, positions = landed_by_shard_partition(server, "blob", topic, lambda r: r["data"])
        print(f"\n[SIGTERM after {_shard_total(server, 'blob')} of {total} records landed; committed {committed}, "
              f"partition ends {ends}]")
        for key, have in got.items():  # what landed is a prefix of each (shard, partition), in order
            assert have == expected[key][:len(have)], f"after SIGTERM: shard {key[0]} partition {key[1]} is not " \
                                                      f"a prefix of the expected records"
        for key, pos in positions.items():  # and lies before the committed offset: drained, then committed
            assert all(off < max(committed[key[1]], 0) for _, off, _, _ in pos), \
                f"shard {key[0]}: records of partition {key[1]} at or after the committed offset " \
                f"{committed[key[1]]} landed: {[p for p in pos if p[1] >= committed[key[1]]][:5]}"
        # 2. the rest, then SIGTERM once everything landed
        proc, out, err = sync.start()
        _wait_for(lambda: _shard_total(server, "blob") >= total, proc, 90, f"all {total} records in DataHub", err)
        time.sleep(0.5)
        second = _terminate(proc, out, err, "SIGTERM after everything landed")
        server.faults.clear()
        assert second["already_landed"] == 0, \
            f"the drained run had committed everything it wrote, yet the next run found " \
            f"{second['already_landed']} records already there: {second}"
        assert committed_offsets(kafka_broker, topic, "g-term", [0, 1]) == ends, \
            f"after everything was read and SIGTERM: committed {committed_offsets(kafka_broker, topic, 'g-term', [0, 1])}, " \
            f"partition ends {ends}"
        got, positions = landed_by_shard_partition(server, "blob", topic, lambda r: r["data"])
        compare("blob", got, positions, expected, f"seed {SEED + 3}; {tmp_path}")
        snapshot = server.records(PROJECT, "blob")
        # 3. a rerun finds nothing to do
        code, third, err_text = sync.run("--idle-timeout", "2")
        no_traceback(err_text, "the rerun")
        assert code == 0 and third["stopped"] == "idle", (code, third, err_text[-2000:])
        assert third["written"] == 0 and third["envelopes"] == 0, f"the rerun wrote or read again: {third}"
        assert server.records(PROJECT, "blob") == snapshot, "the rerun changed DataHub"
        assert committed_offsets(kafka_broker, topic, "g-term", [0, 1]) == ends


# ---- TDSQL: ShardId / ps headers ---------------------------------------------------------------

def entries_groups(path: pathlib.Path) -> list[bytes]:
    """Each Entries message of a .pb file (the unit DTS packs and splits), as bytes, in order."""
    reassembler, out = Reassembler(), []
    for number, _, raw in read_pb(path):
        for item in reassembler.feed(0, number, raw):
            assert isinstance(item, Assembled), f"{path}: {item}"
            out.append(item.entries.SerializeToString())
    return out


def tdsql_stream(seed: int, tmp_path: pathlib.Path) -> tuple[list[dict], dict[str, list[bytes]]]:
    """Two database shards' Entries, cut into segments, interleaved at random in one partition:
    [{"shard", "ps", "group" (index into the shard's Entries), "index", "total", "value"}] and
    {shard: [Entries bytes]}. s1 carries large.pb's Entries, s2 mixed.pb's repacked under 2000 bytes."""
    groups = {"s1": entries_groups(SAMPLES / "large.pb"),
              "s2": entries_groups(repack(SAMPLES / "mixed.pb", tmp_path / "mixed-2000.pb", 2000))}
    queues = {}
    for shard, items in groups.items():
        queue = []
        for g, data in enumerate(items):
            envs = split_entries(data, 1500)
            queue += [dict(shard=shard, group=g, index=e.index, total=e.total, value=e.SerializeToString())
                      for e in envs]
        queues[shard] = queue
    assert sum(1 for r in queues["s1"] if r["index"] > 0) >= 5 and sum(1 for r in queues["s2"] if r["index"] > 0) >= 2
    rng = random.Random(seed)
    records, ps = [], {"s1": 0, "s2": 0}
    while queues["s1"] or queues["s2"]:
        shard = rng.choice([s for s in ("s1", "s2") if queues[s]])
        record = queues[shard].pop(0)
        ps[shard] += 1
        records.append(dict(record, ps=ps[shard]))
    # the two shards' segments really interleave: some Entries of one shard is open while the other's go by
    open_spans = 0
    for i, r in enumerate(records):
        if r["index"] == 0 and r["total"] > 1:
            end = next(j for j in range(i, len(records)) if records[j]["shard"] == r["shard"]
                       and records[j]["group"] == r["group"] and records[j]["index"] == r["total"] - 1)
            open_spans += any(records[j]["shard"] != r["shard"] for j in range(i, end))
    assert open_spans >= 3, "the seed did not interleave multi-segment Entries"
    return records, groups


def expected_tdsql_lines(records: list[dict], groups: dict, tmp_path: pathlib.Path, leave_out=()) -> list[bytes]:
    """The Blob lines of every Entries (but `leave_out`: (shard, group) pairs) in the order of
    its first segment in the partition: `dts-bridge convert` of those Entries written whole."""
    order = [(r["shard"], r["group"]) for r in records if r["index"] == 0 and (r["shard"], r["group"]) not in leave_out]
    assert len(order) == len(set(order))
    path = tmp_path / f"tdsql-expected-{uuid.uuid4().hex[:6]}.pb"
    with open(path, "wb") as out:
        write_pb(out, [env for shard, g in order for env in split_entries(groups[shard][g], 1 << 20)])
    return convert_blob(path, tmp_path)


def produce_tdsql(broker, topic: str, records: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for r in records:
        producer.produce(topic, value=r["value"], partition=0,
                         headers=[("ShardId", r["shard"].encode()), ("ps", str(r["ps"]).encode())])
    assert producer.flush(30) == 0


def test_tdsql_interleaved_shards_and_a_redelivery(kafka_broker, tmp_path):
    """Two TDSQL shards' multi-segment Entries interleaved in one partition, one record delivered
    again (same ps, three records later): each shard's Entries land whole, in first-segment order,
    the redelivery is dropped and counted."""
    records, groups = tdsql_stream(SEED, tmp_path)
    expected = expected_tdsql_lines(records, groups, tmp_path)
    # redeliver a middle segment of s1, three records after it
    k = next(i for i, r in enumerate(records) if r["shard"] == "s1" and 0 < r["index"] < r["total"] - 1
             and i > 10)
    stream = records[:k + 4] + [records[k]] + records[k + 4:]
    topic = kafka_broker.create_topic(unique_name("sync-tdsql"), partitions=1)
    warm_group_coordinator(kafka_broker, topic)
    produce_tdsql(kafka_broker, topic, stream)
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "one", shard_count=1)  # one shard: the whole output order is checked
        sync = Sync(tmp_path, kafka_broker, topic, "g-tdsql", server, "--to", "blob", "--datahub-topic", "one",
                    "--idle-timeout", "2")
        code, report, err = sync.run()
        no_traceback(err, "sync of the TDSQL stream")
        assert code == 0, err[-3000:]
        assert report["redelivered"] == 1, report
        assert "dropped 1 redelivered" in err, err[-2000:]
        assert report["rejected"] == 0 and report["held_segments"] == 0, report
        got = [r["data"] for r in server.records(PROJECT, "one")]
        positions = [dts_pos(r) for r in server.records(PROJECT, "one")]
        compare("one", {("0", 0): got}, {("0", 0): positions}, {("0", 0): expected},
                f"TDSQL stream of {len(stream)} records (seed {SEED}), redelivered: #{k} (s1 ps {records[k]['ps']})")
        # positions: the offset of each Entries' first segment; the output is in that order
        assert [p[1] for p in positions] == sorted(p[1] for p in positions)
        assert committed_offsets(kafka_broker, topic, "g-tdsql", [0]) == {0: len(stream)}


def test_tdsql_ps_gap_is_an_error_naming_partition_shard_and_both_numbers(kafka_broker, tmp_path):
    """A ps gap in each shard: s2 loses a whole Entries, s1 loses a middle segment of a
    multi-segment Entries. Under --on-error fail: exit 1 naming partition, shard and both ps
    numbers. Under skip: both gaps in the rejects file; the two Entries that lost records are
    missing and every other Entries lands whole, in order."""
    records, groups = tdsql_stream(SEED + 1, tmp_path)
    lost_s2 = next(r for r in records[len(records) // 3:] if r["shard"] == "s2" and r["total"] == 1)
    lost_s1 = next(r for r in records[len(records) // 2:] if r["shard"] == "s1" and 0 < r["index"] < r["total"] - 1)
    stream = [r for r in records if r is not lost_s2 and r is not lost_s1]
    first_gap = min((lost_s1, lost_s2), key=records.index)
    expected = expected_tdsql_lines(records, groups, tmp_path,
                                    leave_out={("s2", lost_s2["group"]), ("s1", lost_s1["group"])})
    topic = kafka_broker.create_topic(unique_name("sync-tdsql-gap"), partitions=1)
    warm_group_coordinator(kafka_broker, topic)
    produce_tdsql(kafka_broker, topic, stream)
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "fail", shard_count=1)
        server.create_topic(PROJECT, "skip", shard_count=1)
        # 1. --on-error fail
        sync = Sync(tmp_path, kafka_broker, topic, "g-gap-fail", server, "--to", "blob", "--datahub-topic", "fail",
                    "--idle-timeout", "2")
        code, _, err = sync.run()
        no_traceback(err, "sync --on-error fail")
        assert code == 1, f"a ps gap under --on-error fail must end the run with 1, got {code}: {err[-2000:]}"
        gap = first_gap
        message = err.strip().splitlines()[-1] if err.strip() else ""
        for needle in (gap["shard"], str(gap["ps"] - 1), str(gap["ps"] + 1), "partition 0"):
            assert needle in err, f"the error must name partition 0, shard {gap['shard']} and ps {gap['ps'] - 1} " \
                                  f"-> {gap['ps'] + 1}; missing {needle!r} in: {err[-2000:]}"
        got = [r["data"] for r in server.records(PROJECT, "fail")]
        assert got == expected[:len(got)], "what landed before the failure is not a prefix of the expected output"
        assert committed_offsets(kafka_broker, topic, "g-gap-fail", [0])[0] <= records.index(gap), \
            f"the failed run committed past the gap: {message}"
        # 2. --on-error skip --rejects FILE
        rejects = tmp_path / "rejects.jsonl"
        sync = Sync(tmp_path, kafka_broker, topic, "g-gap-skip", server, "--to", "blob", "--datahub-topic", "skip",
                    "--idle-timeout", "2", "--on-error", "skip", "--rejects", str(rejects))
        code, report, err = sync.run()
        no_traceback(err, "sync --on-error skip")
        lines = [json.loads(line) for line in rejects.read_text().splitlines()]
        for lost in (lost_s2, lost_s1):
            hits = [doc for doc in lines if lost["shard"] in json.dumps(doc) and str(lost["ps"] - 1) in json.dumps(doc)
                    and str(lost["ps"] + 1) in json.dumps(doc)]
            assert hits, f"no reject names shard {lost['shard']} and ps {lost['ps'] - 1} -> {lost['ps'] + 1}: {lines}"
            assert any(doc.get("partition") == 0 for doc in hits), f"the gap's reject names no partition: {hits}"
        assert report["rejected"] >= 1 and code == 1, \
            f"a ps gap under skip must be counted (rejected) and reported, got exit {code}, {report}"
        got = [r["data"] for r in server.records(PROJECT, "skip")]
        positions = [dts_pos(r) for r in server.records(PROJECT, "skip")]
        compare("skip", {("0", 0): got}, {("0", 0): positions}, {("0", 0): expected},
                f"TDSQL gaps: s2 lost ps {lost_s2['ps']} (a whole Entries), s1 lost ps {lost_s1['ps']} "
                f"(segment {lost_s1['index']} of {lost_s1['total']}); rejects: {lines}")


def test_tdsql_gap_of_whole_entries_under_skip_is_counted_and_reported(kafka_broker, tmp_path):
    """The gap alone (s2 loses one whole single-segment Entries, nothing is abandoned): under
    --on-error skip it must still be counted (the run's rejected count, exit 1) and listed."""
    records, groups = tdsql_stream(SEED + 2, tmp_path)
    lost = next(r for r in records[len(records) // 3:] if r["shard"] == "s2" and r["total"] == 1)
    stream = [r for r in records if r is not lost]
    expected = expected_tdsql_lines(records, groups, tmp_path, leave_out={("s2", lost["group"])})
    topic = kafka_broker.create_topic(unique_name("sync-tdsql-gap1"), partitions=1)
    warm_group_coordinator(kafka_broker, topic)
    produce_tdsql(kafka_broker, topic, stream)
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "skip", shard_count=1)
        rejects = tmp_path / "rejects.jsonl"
        sync = Sync(tmp_path, kafka_broker, topic, "g-gap1", server, "--to", "blob", "--datahub-topic", "skip",
                    "--idle-timeout", "2", "--on-error", "skip", "--rejects", str(rejects))
        code, report, err = sync.run()
        no_traceback(err, "sync --on-error skip")
        got = [r["data"] for r in server.records(PROJECT, "skip")]
        positions = [dts_pos(r) for r in server.records(PROJECT, "skip")]
        compare("skip", {("0", 0): got}, {("0", 0): positions}, {("0", 0): expected},
                f"TDSQL gap: s2 lost ps {lost['ps']} (a whole Entries)")
        lines = [json.loads(line) for line in rejects.read_text().splitlines()]
        assert [(d.get("partition"), d.get("shard"), d.get("last_ps"), d.get("ps")) for d in lines] == \
            [(0, "s2", lost["ps"] - 1, lost["ps"] + 1)], lines
        summary = err.strip().splitlines()[-1]
        on_stderr = "jumps" in err or "gap" in err
        assert report["rejected"] >= 1 and code == 1, \
            f"a ps gap under --on-error skip (s2 ps {lost['ps'] - 1} -> {lost['ps'] + 1}, one Entries lost) is " \
            f"listed in the rejects file but not counted: exit {code}, rejected {report['rejected']} in the JSON " \
            f"report, {'' if on_stderr else 'nothing about it on stderr, '}summary: {summary!r}"


def test_first_sync_on_a_fresh_broker(tmp_path):
    """A broker that just started answers NOT_COORDINATOR (or COORDINATOR_LOAD_IN_PROGRESS) for
    a moment while its group coordinator loads; `sync`'s first read of the group's offsets
    must wait that out (GroupOffsets retries retriable answers), not exit 1."""
    from support.kafka_broker import BrokerStartError, KafkaBroker, missing
    if missing():
        pytest.skip(missing())
    for attempt in range(3):
        try:
            broker = KafkaBroker(tmp_path / f"fresh-broker-{attempt}")
            break
        except BrokerStartError as err:  # a cluster id drawn with a leading '-' reads as a flag to StorageTool
            if attempt == 2 or "--cluster-id" not in str(err):
                raise
    with broker, StandInDataHub() as server:
        topic = broker.create_topic(unique_name("sync-fresh"), partitions=1)
        produce(broker, topic, SAMPLES / "mixed.pb", 0)
        server.create_topic(PROJECT, "blob", shard_count=1)
        sync = Sync(tmp_path, broker, topic, "g-fresh", server, "--to", "blob", "--datahub-topic", "blob",
                    "--idle-timeout", "1")
        code, report, err = sync.run()
        no_traceback(err, "sync on a fresh broker")
        assert code == 0, f"sync on a broker that started {broker.startup_seconds:.1f} s ago exited {code}: " \
                          f"{err.strip()[-1500:]}"
        assert [r["data"] for r in server.records(PROJECT, "blob")] == convert_blob(SAMPLES / "mixed.pb", tmp_path)


def test_restart_after_crashes_that_advanced_partitions_unevenly(kafka_broker, tmp_path):
    """Two processes with disjoint --partitions sets (the layout docs/kafka.md allows) write one
    DataHub topic; later one process takes both partitions over. Two partitions share one shard.
    1. The process of partition 0 (--partitions 0; a stream without CHECKPOINT entries, so no
       commit) lands its records and is killed: they landed past partition 0's commit (none).
    2. The process of partition 1 reads it to its end and commits: its records land after those of
       step 1 in the shard, all below partition 1's commit.
    3. A run over both partitions must recognise step 1's records as already there (its tail scan
       has to look past partition 1's committed records to partition 0's), not write them again.
    (The deep kill loop found the same duplicates without --partitions; rule 3 of docs/kafka.md's
    tail-scan invariant now prevents that path, but not this one.)"""
    topic = kafka_broker.create_topic(unique_name("sync-uneven"), partitions=2)
    warm_group_coordinator(kafka_broker, topic)
    no_checkpoint = tmp_path / "mixed-no-checkpoint.pb"
    with open(no_checkpoint, "wb") as out:
        write_pb(out, pack_entries([e for e in entries_of(SAMPLES / "mixed.pb") if e.header.messageType != pb.CHECKPOINT],
                                   1200))
    expected_lines = {0: convert_blob(no_checkpoint, tmp_path), 1: convert_blob(SAMPLES / "large.pb", tmp_path)}
    produce(kafka_broker, topic, no_checkpoint, 0)
    produce(kafka_broker, topic, SAMPLES / "large.pb", 1)
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=1)
        sync = Sync(tmp_path, kafka_broker, topic, "g-uneven", server, "--to", "blob", "--datahub-topic", "blob")
        proc, _, err = sync.start("--partitions", "0")
        _wait_for(lambda: _shard_total(server, "blob") >= len(expected_lines[0]), proc, 60,
                  "partition 0's records in DataHub", err)
        time.sleep(0.3)
        proc.kill()
        proc.wait()
        assert _shard_total(server, "blob") == len(expected_lines[0])
        assert committed_offsets(kafka_broker, topic, "g-uneven", [0, 1]) == {0: -1001, 1: -1001}
        code, report, err_text = sync.run("--partitions", "1", "--idle-timeout", "1")
        assert code == 0 and report["committed"] == {"1": end_offsets(kafka_broker, topic, [1])[1]}, \
            (code, report, err_text[-2000:])
        code, report, err_text = sync.run("--idle-timeout", "1")
        no_traceback(err_text, "the run over both partitions")
        assert code == 0, err_text[-2000:]
        expected = {("0", p): lines for p, lines in expected_lines.items()}
        got, positions = landed_by_shard_partition(server, "blob", topic, lambda r: r["data"])
        compare("blob", got, positions, expected,
                f"third run: {report['written']} written, {report['already_landed']} found already there; "
                f"partition 0's {len(expected_lines[0])} records had landed in step 1")


def test_tuple_restart_after_a_ddl_added_a_column(kafka_broker, tmp_path):
    """A sync run ends (idle, everything committed) right after the DDL that adds a column to
    shop.orders and before the first row that has it; the next run starts with such a row. It
    must carry on (the topic grows the field, as it does within one run), not refuse the topic."""
    entries = entries_of(SAMPLES / "mixed.pb")
    ddl = next(i for i, e in enumerate(entries) if i > 20 and e.header.messageType == pb.DDL
               and e.header.tableName == "orders")
    parts = []
    for n, chunk in enumerate((entries[:ddl + 1], entries[ddl + 1:])):
        path = tmp_path / f"mixed-part{n}.pb"
        with open(path, "wb") as out:
            write_pb(out, pack_entries(chunk, 4096))
        parts.append(path)
    topic = kafka_broker.create_topic(unique_name("sync-ddl"), partitions=1)
    warm_group_coordinator(kafka_broker, topic)
    converted: dict = collections.defaultdict(list)
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic, "g-ddl", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--idle-timeout", "1", "--on-error", "skip")
        for n, path in enumerate(parts):
            produce(kafka_broker, topic, path, 0)
            for table, versions in convert_tuple(path, tmp_path).items():
                converted[table].append((0, versions))
            code, report, err = sync.run()
            no_traceback(err, f"sync run {n + 1}")
            assert code == 0 and report.get("stopped") == "idle", \
                f"sync run {n + 1} (the stream {'after' if n else 'up to'} the DDL of shop.orders at Entry {ddl}) " \
                f"exited {code}: {err.strip()[-1500:]}"
        check_tuple_topics(server, topic, converted, f"{tmp_path}", shards=1)


def test_zero_dates_are_counted_and_written_to_the_ledger_as_convert_does(kafka_broker, tmp_path):
    """samples/realistic carries zero dates: sync --to tuple writes them as NULL (the default
    --zero-dates null), counts them in --json and writes the same ledger lines, in the same order,
    as `convert --to tuple --ledger` of the same file."""
    path = SAMPLES / "realistic.pb"
    want_ledger = tmp_path / "convert-ledger.jsonl"
    proc = run_bridge(bridge_cli("convert", str(path), "--to", "tuple", "-o", str(tmp_path / "conv" / "{table}.jsonl"),
                     "--mkdir", "--ledger", str(want_ledger)))
    assert proc.returncode == 0, proc.stderr
    want = [json.loads(line) for line in want_ledger.read_text().splitlines()]
    assert want and {r["kind"] for r in want} >= {"zero_dates"}
    topic = kafka_broker.create_topic(unique_name("sync-ledger"), partitions=1)
    warm_group_coordinator(kafka_broker, topic)
    produce(kafka_broker, topic, path, 0)
    ledger = tmp_path / "sync-ledger.jsonl"
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic, "g-ledger", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--idle-timeout", "1", "--ledger", str(ledger))
        code, report, err = sync.run()
        no_traceback(err, "sync")
        assert code == 0, err[-2000:]
    got = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert got == want
    kinds = collections.Counter(r["kind"] for r in want)
    assert (report["zero_dates"], report["out_of_range"], report["fractions"]) == \
        (kinds["zero_dates"], kinds["out_of_range"], kinds["fractions"])
    assert f"{kinds['zero_dates']} zero or invalid dates" in err


def test_tdsql_restart_at_a_held_commit_point(kafka_broker, tmp_path):
    """TDSQL: shard s2's Entries B starts first and completes while s1's Entries A, which started
    after B's first segment, is still open. B is handed out (it started first), A holds the commit
    point at A's first segment, which lies before B's later segments. The next run starts there:
    B's remaining segments arrive without their first one, yet B already landed whole. The rerun
    must end with every Entries exactly once, in first-segment order, and nothing rejected."""
    s1 = entries_groups(SAMPLES / "large.pb")
    s2 = entries_groups(repack(SAMPLES / "mixed.pb", tmp_path / "mixed-2000.pb", 2000))
    group_a = next(g for g in s1 if len(split_entries(g, 1500)) >= 3)
    group_b = max(s2, key=len)
    seg_a, seg_b = split_entries(group_a, 1500), split_entries(group_b, max(600, len(group_b) // 3 + 64))
    assert len(seg_a) >= 3 and len(seg_b) >= 2, (len(seg_a), len(seg_b))
    tail_s2, tail_s1 = s2[:2], s1[:2]  # whole Entries after them, one segment each at most 1 MB
    plan = [("s2", "B", seg_b[0]), ("s1", "A", seg_a[0])] + [("s2", "B", e) for e in seg_b[1:]] + \
           [("s1", "A", e) for e in seg_a[1:]] + \
           [("s2", f"C{i}", e) for i, g in enumerate(tail_s2) for e in split_entries(g, 1 << 20)] + \
           [("s1", f"D{i}", e) for i, g in enumerate(tail_s1) for e in split_entries(g, 1 << 20)]
    ps = collections.Counter()
    records = []
    for shard, name, env in plan:
        ps[shard] += 1
        records.append(dict(shard=shard, group=name, index=env.index, total=env.total,
                            value=env.SerializeToString(), ps=ps[shard]))
    groups = {"s1": {"A": group_a, **{f"D{i}": g for i, g in enumerate(tail_s1)}},
              "s2": {"B": group_b, **{f"C{i}": g for i, g in enumerate(tail_s2)}}}
    expected = expected_tdsql_lines(records, groups, tmp_path)
    topic = kafka_broker.create_topic(unique_name("sync-tdsql-held"), partitions=1)
    warm_group_coordinator(kafka_broker, topic)
    produce_tdsql(kafka_broker, topic, records)
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "one", shard_count=1)
        sync = Sync(tmp_path, kafka_broker, topic, "g-held", server, "--to", "blob", "--datahub-topic", "one")
        # run 1 stops right after B's last segment: B landed, A is open from offset 1
        code, report, err = sync.run("--max-messages", str(1 + len(seg_b)))
        no_traceback(err, "run 1")
        assert code == 0 and report["stopped"] == "max-messages", (code, report, err[-2000:])
        b_lines = len(convert_blob_bytes(group_b, tmp_path))
        assert _shard_total(server, "one") == b_lines, "run 1 must hand B out whole (it started first)"
        assert committed_offsets(kafka_broker, topic, "g-held", [0]) == {0: 1}, \
            "the commit must stop at A's first segment (offset 1)"
        # run 2 starts at offset 1: B's later segments come again, without B's first segment
        code, report, err = sync.run("--idle-timeout", "1")
        no_traceback(err, "run 2")
        got = [r["data"] for r in server.records(PROJECT, "one")]
        positions = [dts_pos(r) for r in server.records(PROJECT, "one")]
        compare("one", {("0", 0): got}, {("0", 0): positions}, {("0", 0): expected},
                f"run 2 after a commit held at A's first segment: exit {code}, {report.get('rejected')} rejected, "
                f"stderr: {err.strip()[-800:]}")
        assert code == 0 and report["rejected"] == 0, \
            f"run 2 re-read B's later segments (offsets 2..{len(seg_b)}) behind the held commit and " \
            f"treated them as errors: exit {code}, {report}, {err.strip()[-1500:]}"


def convert_blob_bytes(entries_bytes: bytes, tmp_path: pathlib.Path) -> list[bytes]:
    path = tmp_path / f"one-{uuid.uuid4().hex[:6]}.pb"
    with open(path, "wb") as out:
        write_pb(out, split_entries(entries_bytes, 1 << 20))
    return convert_blob(path, tmp_path)


def test_sync_tdsql_kill_loop(kafka_broker, tmp_path):
    """The kill loop on TDSQL streams: each of 2 partitions carries two database shards'
    multi-segment Entries interleaved (ShardId / ps headers) and one redelivered record; 3 SIGKILLs
    with chaos faults, then per (DataHub shard, partition) the Blob lines equal the conversion of
    the partition's Entries in first-segment order, exactly once."""
    began = time.monotonic()
    topic = kafka_broker.create_topic(unique_name("sync-tdsql-kill"), partitions=2)
    warm_group_coordinator(kafka_broker, topic)
    shards = ["0", "1", "2"]
    expected: dict = collections.defaultdict(list)
    for partition in (0, 1):
        records, groups = tdsql_stream(SEED + 11 * (partition + 1), tmp_path)
        k = next(i for i, r in enumerate(records) if r["shard"] == "s2" and i > len(records) // 2)
        stream = records[:k + 2] + [records[k]] + records[k + 2:]
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})
        for r in stream:
            producer.produce(topic, value=r["value"], partition=partition,
                             headers=[("ShardId", r["shard"].encode()), ("ps", str(r["ps"]).encode())])
        assert producer.flush(30) == 0
        for line in expected_tdsql_lines(records, groups, tmp_path):
            expected[(shard_for(shard_key(orjson.loads(line)), shards), partition)].append(line)
    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        chaos(server, SEED + 12)
        sync = Sync(tmp_path, kafka_broker, topic, "g-tdsql-kill", server, "--to", "blob", "--datahub-topic", "blob",
                    "--idle-timeout", "2")
        killed = kill_loop(sync, server, kills=3, seed=SEED + 12, stages=[], produce_stage=None, max_delay=3.0,
                           max_step=60, log=log)
        code, report, err = sync.run()
        server.faults.clear()
        context = f"seed {SEED + 12}; runs' stderr in {tmp_path}; faults {fault_summary(server)}\n  " + "\n  ".join(log)
        no_traceback(err, "the final sync run")
        assert code == 0 and report["rejected"] == 0, f"final run exited {code}: {err[-3000:]}\n{context}"
        got, positions = landed_by_shard_partition(server, "blob", topic, lambda r: r["data"])
        compared = compare("blob", got, positions, expected, context)
        assert committed_offsets(kafka_broker, topic, "g-tdsql-kill", [0, 1]) == end_offsets(kafka_broker, topic, [0, 1])
        assert any(k["landed_in_run"] > 0 for k in killed), context
        print(f"\n[sync TDSQL kill loop: {len(killed)} kills in {sync.runs} runs, {compared} records compared, "
              f"{time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))
