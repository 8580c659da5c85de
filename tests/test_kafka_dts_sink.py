"""The Kafka write side of DataHub -> Kafka (issue 32, points 3 and 4), on the real Apache Kafka
broker (tests/support/kafka_broker.py: transactions on, transaction state log replication 1):
`DtsKafkaSink` + `TransactionalPositions` driven by the pipeline loop (`bridge.pipeline.run`) from a
small in-memory Source of Envelopes (the Entries of samples/*.pb, one test id in each Entry's
header properties), then a read_committed consumer reads the topic back.

Checked: every Entry once and in source order per partition; aborts and SIGKILLs at random points
then a restart from the committed positions; a zombie fenced by a second sink with the same
transactional id; segments over max_message_bytes; partition_by key; and without transactions the
tail look after a kill.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("confluent_kafka")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bridge.kafka import (  # noqa: E402
    FileOffsets,
    KafkaError,
    TailPositions,
    TransactionalPositions,
    transactional_id_for,
)
from bridge.kafka.sink import POSITION_HEADER, murmur2  # noqa: E402
from bridge.wire import subscribe_pb2 as pb  # noqa: E402
from bridge.wire.framing import split_entries  # noqa: E402
from support.dts_kafka import (  # noqa: E402
    assert_exactly_once,
    build_input,
    entry_id,
    input_entries,
    key_text,
    make_sink,
    parse_key,
    read_back,
    records_on,
    run_once,
)
from support.dts_kafka import unique_name as _name  # noqa: E402


@pytest.fixture(scope="module")
def records():
    return build_input()


# ---- transactions ------------------------------------------------------------------------------

def test_every_entry_once_in_order_per_partition(kafka_broker, records):
    topic = kafka_broker.create_topic(_name("dts-out"), partitions=3)
    offsets = _name("offs")
    tid = transactional_id_for("proj", "blob", topic)
    report, sink, positions = run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=offsets)
    assert report.stopped == "idle" and sink.commits >= 2 and sink.written == sum(
        len(v) for v in input_entries(records).values())
    got = read_back(kafka_broker.bootstrap, topic)
    assert_exactly_once(got, records)
    # tables never share a partition with another's copy; table-less Entries sit in partition 0
    for p, entries in got.items():
        assert all(p == 0 for e, _, _ in entries if not e.header.tableName)
    # the positions: compacted topic, committed per key; a restart writes nothing more
    from confluent_kafka.admin import ConfigResource
    admin = kafka_broker.admin()
    res = ConfigResource("topic", offsets)
    conf = list(admin.describe_configs([res]).values())[0].result(10)
    assert conf["cleanup.policy"].value == "compact"
    stored = positions.stored()
    assert stored == {k: (len(v), len(v)) for k, v in records.items()}
    report2, sink2, _ = run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=offsets)
    assert report2.envelopes == 0 and sink2.written == 0
    assert_exactly_once(read_back(kafka_broker.bootstrap, topic), records)


def test_abort_at_random_points_then_restart_gives_each_entry_once(kafka_broker, records):
    topic = kafka_broker.create_topic(_name("dts-abort"), partitions=2)
    offsets = _name("offs")
    tid = transactional_id_for("proj", "abort", topic)
    rnd = random.Random(11)
    total = sum(len(v) for v in records.values())
    for _ in range(6):
        with pytest.raises(RuntimeError, match="source died"):
            run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=offsets,
                     fail_after=rnd.randint(2, total // 12), per_poll=2, commit_interval=rnd.choice([0.0, 0.01, 0.05]))
    report, _, _ = run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=offsets)
    assert report.started and any(v for v in report.started.values())  # it resumed, not restarted
    assert_exactly_once(read_back(kafka_broker.bootstrap, topic), records)
    # a read_uncommitted consumer sees the aborted transactions' records too (docs/kafka.md)
    dirty = read_back(kafka_broker.bootstrap, topic, "read_uncommitted")
    assert sum(len(v) for v in dirty.values()) >= total


CHILD = """
import json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from support.dts_kafka import build_input, run_once
args = json.loads(sys.argv[1])
records = build_input()
run_once(args["bootstrap"], args["topic"], args["tid"], records, offsets_topic=args["offsets"],
         store_path=args.get("store"), per_poll=2, delay=0.05, commit_interval=args["interval"],
         on_open=lambda at: print("open", json.dumps(sorted(at.values())), flush=True))
print("done", flush=True)
"""


def _kill_rounds(kafka_broker, records, topic: str, tid: str | None, rounds: int, seed: int, **extra) -> list:
    """Start the child `rounds` times, each killed (SIGKILL) at a random moment of its run (once it
    loaded its positions and started reading); returns where each round started reading."""
    rnd = random.Random(seed)
    code = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"))
    starts, finished, killed = [], False, 0
    for _ in range(rounds):
        args = {"bootstrap": kafka_broker.bootstrap, "topic": topic, "tid": tid, "offsets": extra.get("offsets"),
                "store": extra.get("store"), "interval": rnd.choice([0.02, 0.1, 0.3])}
        proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT)
        before = records_on(kafka_broker.bootstrap, topic)
        line = proc.stdout.readline().decode()
        assert line.startswith("open"), (line, proc.stderr.read().decode()[-3000:])
        starts.append(json.loads(line.split(" ", 1)[1]))
        # the kill comes at a random moment once the child wrote (under load its first write can
        # take longer than the whole random window: no round then moved the start on)
        waited = time.monotonic() + 30
        while proc.poll() is None and records_on(kafka_broker.bootstrap, topic) <= before and time.monotonic() < waited:
            time.sleep(0.02)
        time.sleep(rnd.uniform(0.05, 0.6))
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        if proc.returncode == 0:  # it wrote everything before the kill came (many rounds, small input)
            finished = True
            break
        assert proc.returncode == -signal.SIGKILL, err.decode()[-3000:]
        killed += 1
    # the kills landed while the child wrote: later rounds start further on
    assert killed >= min(rounds, 5) and starts[-1] != starts[0], (killed, starts)
    if not finished:  # and none reached the end
        assert sum(starts[-1]) < sum(len(v) for v in records.values()), starts
    return starts


def test_sigkill_at_random_moments_then_restart_gives_each_entry_once(kafka_broker, records):
    topic = kafka_broker.create_topic(_name("dts-kill"), partitions=3)
    offsets = _name("offs")
    tid = transactional_id_for("proj", "kill", topic)
    _kill_rounds(kafka_broker, records, topic, tid, rounds=5, seed=5, offsets=offsets)
    run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=offsets)
    assert_exactly_once(read_back(kafka_broker.bootstrap, topic), records)


def test_a_fencing_told_only_by_error_cb_or_a_delivery_report_names_the_takeover(kafka_broker):
    """When confluent-kafka loses the exception of a fenced flush (a bare SystemError, seen under
    load), the fencing is what error_cb told (as _FATAL, whose fatal() can be False) or what a
    delivery report carries: either names the takeover, never the raw error."""
    ck = pytest.importorskip("confluent_kafka")
    topic = kafka_broker.create_topic(_name("dts-fenced-told"), partitions=1)
    tid = transactional_id_for("proj", "told", topic)
    sink = make_sink(kafka_broker.bootstrap, topic, tid).start()
    try:
        told = ck.KafkaError(ck.KafkaError._FATAL, "Fatal error: Local: This instance has been fenced by a newer "
                             "instance", fatal=False)
        assert f"transactional id '{tid}' took over" in str(sink._error(told, "x"))
        assert sink._heard_fatal(wait=0.2) is None  # nothing told: the caller raises what it has
        report = ck.KafkaError(ck.KafkaError._FENCED, "fenced by newer producer instance")
        sink._failures.append((report, 0))
        assert sink._heard_fatal(wait=0.2) is report
        assert f"transactional id '{tid}' took over" in str(sink._error(report, "x"))
    finally:
        sink._failures.clear()
        sink.close()


def test_a_zombie_is_fenced_and_its_open_transaction_never_shows(kafka_broker, records):
    topic = kafka_broker.create_topic(_name("dts-zombie"), partitions=2)
    offsets = _name("offs")
    tid = transactional_id_for("proj", "zombie", topic)
    inputs = input_entries(records)
    key = ("dh", "0")
    zombie = make_sink(kafka_broker.bootstrap, topic, tid)
    zpos = TransactionalPositions(zombie, offsets_topic=offsets, key_text=key_text, parse_key=parse_key)
    assert zpos.load([key]) == {key: (None, None)}
    for i, entry in enumerate(inputs[key][:10]):
        zombie.write({"partition": key, "offset": i, "entry": 0}, entry)
    zombie.flush()
    zpos.save({key: 10}, {key: 10})  # committed: visible
    for i, entry in enumerate(inputs[key][10:20], start=10):
        zombie.write({"partition": key, "offset": i, "entry": 0}, entry)
    zombie.flush()  # on the broker, in an open transaction
    # the successor starts: init_transactions fences the zombie and aborts its open transaction
    successor = make_sink(kafka_broker.bootstrap, topic, tid)
    spos = TransactionalPositions(successor, offsets_topic=offsets, key_text=key_text, parse_key=parse_key)
    assert spos.load([key]) == {key: (10, 10)}
    with pytest.raises(KafkaError, match=f"another process with transactional id '{tid}' took over"):
        zombie.write({"partition": key, "offset": 20, "entry": 0}, inputs[key][20])
        zombie.flush()
        zpos.save({key: 21}, {key: 21})
    zombie.close()  # quietly: it is fenced
    got = read_back(kafka_broker.bootstrap, topic)
    ids = [entry_id(e) for entries in got.values() for e, _, _ in entries]
    assert sorted(ids, key=lambda t: int(t.split(":")[1])) == [f"0:{i}" for i in range(10)]
    # the successor goes on from 10 and commits
    for i, entry in enumerate(inputs[key][10:], start=10):
        successor.write({"partition": key, "offset": i, "entry": 0}, entry)
    successor.flush()
    spos.save({key: len(inputs[key])}, {key: len(inputs[key])})
    successor.close()
    got = read_back(kafka_broker.bootstrap, topic)
    ids = [entry_id(e) for entries in got.values() for e, _, _ in entries]
    assert sorted(ids, key=lambda t: int(t.split(":")[1])) == [f"0:{i}" for i in range(len(inputs[key]))]


def test_max_message_bytes_packs_and_splits(kafka_broker, records):
    topic = kafka_broker.create_topic(_name("dts-split"), partitions=2)
    tid = transactional_id_for("proj", "split", topic)
    limit = 3000
    run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=_name("offs"),
             sink_kw={"max_message_bytes": limit})
    got = read_back(kafka_broker.bootstrap, topic)
    assert_exactly_once(got, records)
    sizes = [size for entries in got.values() for _, _, size in entries]
    assert max(sizes) <= limit
    biggest = max(len(e.SerializeToString()) for v in input_entries(records).values() for e in v)
    assert biggest > limit  # some Entries came in segments, and came back whole
    # several small Entries share one message (packed as DTS packs them)
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": _name("g"),
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    packed = 0
    for _ in range(20):
        for msg in consumer.consume(500, 0.5):
            if msg.error() is None:
                env = pb.Envelope.FromString(msg.value())
                if env.total == 1 and len(pb.Entries.FromString(env.data).items) > 1:
                    packed += 1
        if packed:
            break
    consumer.close()
    assert packed


def test_partition_by_key(kafka_broker, records):
    topic = kafka_broker.create_topic(_name("dts-key"), partitions=4)
    tid = transactional_id_for("proj", "key", topic)
    report, sink, _ = run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=_name("offs"),
                               sink_kw={"partition_by": "key"})
    got = read_back(kafka_broker.bootstrap, topic)
    assert_exactly_once(got, records, partition_of=sink.partition_for)
    # some table spreads over several partitions (by key), and one key stays in one partition
    tables: dict = {}
    for p, entries in got.items():
        for e, _, _ in entries:
            if e.header.tableName:
                tables.setdefault((e.header.schemaName, e.header.tableName), set()).add(p)
    assert any(len(ps) > 1 for ps in tables.values())


def test_murmur2_is_the_java_default_partitioners(kafka_broker):
    from confluent_kafka import Producer
    topic = kafka_broker.create_topic(_name("murmur"), partitions=7)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "partitioner": "murmur2"})
    got = {}
    keys = [f"db{i}.table_{i * 7}".encode() for i in range(40)] + [b"", b"a", b"ab", b"abc"]
    for key in keys:
        producer.produce(topic, key=key, value=b"x", on_delivery=lambda err, msg: got.__setitem__(msg.key(),
                                                                                               msg.partition()))
    producer.flush(10)
    assert got == {key: murmur2(key) % 7 for key in keys}


# ---- without transactions ------------------------------------------------------------------------

def test_no_transactions_tail_look_after_kill(kafka_broker, records, tmp_path):
    topic = kafka_broker.create_topic(_name("dts-notx"), partitions=3)
    store = str(tmp_path / "positions.json")
    _kill_rounds(kafka_broker, records, topic, None, rounds=5, seed=3, store=store)
    report, sink, _ = run_once(kafka_broker.bootstrap, topic, None, records, offsets_topic="", store_path=store)
    got = read_back(kafka_broker.bootstrap, topic, "read_uncommitted")
    assert_exactly_once(got, records)
    assert all(h and h[0][0] == POSITION_HEADER for entries in got.values() for _, h, _ in entries)


def test_no_transactions_skips_what_landed_after_the_last_commit(kafka_broker, records, tmp_path):
    """Deterministic: a run writes everything but its positions are never saved (as if killed right
    after the records were acknowledged); the next run reads the tails and writes nothing again;
    a cut segmented Entries is finished, not started again."""
    topic = kafka_broker.create_topic(_name("dts-notx2"), partitions=2)
    store = str(tmp_path / "positions.json")
    inputs = input_entries(records)
    sink = make_sink(kafka_broker.bootstrap, topic, None, max_message_bytes=2000)
    key = ("dh", "2")  # large.pb: Entries over 2000 bytes come in segments
    big = next(i for i, e in enumerate(inputs[key]) if len(e.SerializeToString()) > 4500)
    for i, entry in enumerate(inputs[key][:big]):
        sink.write({"partition": key, "offset": i, "entry": 0}, entry)
    sink.flush()
    # the big Entry: only its first two segments reach the broker (a crash in between)
    part = sink.partition_for(inputs[key][big])
    envs = split_entries(pb.Entries(items=[inputs[key][big]]).SerializeToString(), 2000)
    assert len(envs) >= 3
    header = [(POSITION_HEADER, json.dumps({key_text(key): [big, 0]}).encode())]
    for env in envs[:2]:
        sink.producer.produce(topic, value=env.SerializeToString(), partition=part, headers=header)
    sink.close()
    # restart with nothing committed: the tail look finds all of it
    positions = TailPositions(FileOffsets(store, topic), make_sink(kafka_broker.bootstrap, topic, None,
                                                                   max_message_bytes=2000))
    sink2 = positions.sink
    assert positions.load([key]) == {key: (None, None)}
    assert sink2.cut.get(part, (None,))[0] == key_text(key)
    for i, entry in enumerate(inputs[key]):
        sink2.write({"partition": key, "offset": i, "entry": 0}, entry)
    sink2.flush()
    positions.save({key: len(inputs[key])}, {key: len(inputs[key])})
    sink2.close()
    assert sink2.skipped == big
    got = read_back(kafka_broker.bootstrap, topic, "read_uncommitted")
    ids = [entry_id(e) for entries in got.values() for e, _, _ in entries]
    assert sorted(ids, key=lambda t: int(t.split(":")[1])) == [f"2:{i}" for i in range(len(inputs[key]))]


@pytest.mark.deep
def test_deep_kill_loop(kafka_broker, records):
    topic = kafka_broker.create_topic(_name("dts-deep"), partitions=3)
    offsets = _name("offs")
    tid = transactional_id_for("proj", "deep", topic)
    _kill_rounds(kafka_broker, records, topic, tid, rounds=25, seed=99, offsets=offsets)
    run_once(kafka_broker.bootstrap, topic, tid, records, offsets_topic=offsets)
    assert_exactly_once(read_back(kafka_broker.bootstrap, topic), records)
