"""DataHub -> Kafka test parts shared by tests/test_kafka_dts_sink.py and the `sync --to dts`
tests: the input (the Entries of samples/*.pb, each tagged with a test id in its header
properties, as one in-memory source's Envelopes), a pipeline Source over it (`ListSource`), one
run of `DtsKafkaSink` + positions through the loop (`run_once`), and the read-back checks
(`read_back`: what a consumer with an isolation level sees; `assert_exactly_once`).
"""
from __future__ import annotations

import pathlib
import random
import time
import uuid

from bridge.kafka import DtsKafkaSink, FileOffsets, TailPositions, TransactionalPositions
from bridge.kafka.sink import murmur2
from bridge.stream import ErrorPolicy
from bridge.stream.pipeline import DtsAssembler
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Reassembler, read_pb, split_entries

try:
    from bridge.pipeline import run
except ImportError:  # the loop before it moved up a layer
    from bridge.stream.pipeline import run

ROOT = pathlib.Path(__file__).resolve().parents[2]

__all__ = ["TEST_ID", "SAMPLES", "sample_entries", "build_input", "input_entries", "key_text", "parse_key",
           "ListSource", "make_sink", "run_once", "read_back", "entry_id", "expected_partition",
           "assert_exactly_once", "unique_name"]

TEST_ID = "test.id"
SAMPLES = {("dh", "0"): ["realistic", "types"], ("dh", "1"): ["mixed", "mariadb"], ("dh", "2"): ["large"]}


# ---- the input: Entries of the samples, tagged, as one source's records ------------------------

def sample_entries(name: str) -> list[pb.Entry]:
    r, out = Reassembler(), []
    for number, _, raw in read_pb(ROOT / "samples" / f"{name}.pb"):
        for item in r.feed(0, number, raw):
            out.extend(item.entries.items)
    return out


def build_input(seed: int = 7) -> dict:
    """{source key: [Envelope bytes]}: each key's Entries packed 1 to 3 to an Envelope (so `where`
    carries an entry index), each Entry tagged with its key and number."""
    rnd = random.Random(seed)
    out = {}
    for key, names in SAMPLES.items():
        entries = [e for name in names for e in sample_entries(name)]
        for i, entry in enumerate(entries):
            entry.header.properties.add(key=TEST_ID, value=f"{key[1]}:{i}")
        records, i = [], 0
        while i < len(entries):
            n = rnd.randint(1, 3)
            data = pb.Entries(items=entries[i:i + n]).SerializeToString()
            records.extend(env.SerializeToString() for env in split_entries(data, 1 << 21))
            i += n
        out[key] = records
    return out


def input_entries(records: dict) -> dict:
    """{key: [Entry]} in source order."""
    out = {}
    for key, values in records.items():
        r, got = Reassembler(), []
        for offset, value in enumerate(values):
            for item in r.feed(key, offset, value):
                got.extend(item.entries.items)
        out[key] = got
    return out


def key_text(key) -> str:
    return f"{key[0]}/{key[1]}"


def parse_key(text: str):
    return tuple(text.split("/", 1))


class ListSource:
    """A pipeline Source over {key: [Envelope bytes]}: positions are list indexes; `poll` takes
    records round robin over the keys; `fail_after` raises after that many records (a crash)."""

    def __init__(self, records: dict, *, per_poll: int = 7, delay: float = 0.0, fail_after: int | None = None,
                 on_open=None):
        self.records, self.per_poll, self.delay, self.fail_after = records, per_poll, delay, fail_after
        self.on_open = on_open
        self.next: dict = {}
        self.handed = 0

    def keys(self) -> list:
        return list(self.records)

    def open(self, committed) -> None:
        self.next = {k: committed.get(k) or 0 for k in self.records}
        if self.on_open is not None:
            self.on_open(self.next)

    def poll(self, budget: int, timeout: float) -> list:
        if self.delay:
            time.sleep(self.delay)
        out = []
        limit = min(budget, self.per_poll)
        if self.fail_after is not None:
            if self.handed >= self.fail_after:
                raise RuntimeError("the source died")
            limit = min(limit, self.fail_after - self.handed)
        while len(out) < limit and not self.caught_up():
            for key, values in self.records.items():
                at = self.next[key]
                if at < len(values) and len(out) < limit:
                    out.append((key, at, values[at], None))
                    self.next[key] = at + 1
                    self.handed += 1
        return out

    def caught_up(self) -> bool:
        return all(self.next[k] >= len(v) for k, v in self.records.items())

    def ends(self) -> dict:
        return {k: len(v) for k, v in self.records.items()}

    def close(self) -> None:
        pass


def make_sink(bootstrap: str, topic: str, tid: str | None, **kw) -> DtsKafkaSink:
    return DtsKafkaSink({"bootstrap.servers": bootstrap}, topic, transactional_id=tid, key_text=key_text,
                        transactions=tid is not None, **kw)


def run_once(bootstrap: str, topic: str, tid: str | None, records: dict, *, offsets_topic: str,
             store_path: str | None = None, commit_interval: float = 0.05, sink_kw: dict | None = None, **source_kw):
    sink = make_sink(bootstrap, topic, tid, **(sink_kw or {}))
    if tid is None and store_path:
        positions = TailPositions(FileOffsets(store_path, topic), sink)
    else:
        positions = TransactionalPositions(sink, offsets_topic=offsets_topic, source_id=f"test:{topic}",
                                           key_text=key_text, parse_key=parse_key)
    source = ListSource(records, **source_kw)
    try:
        report = run(source, positions, DtsAssembler(), lambda entry: entry, sink, ErrorPolicy("fail"),
                     size=lambda entry: 1, commit_interval=commit_interval, idle_timeout=0.2)
    finally:
        sink.close()
    return report, sink, positions


# ---- reading back ------------------------------------------------------------------------------

def read_back(bootstrap: str, topic: str, isolation: str = "read_committed") -> dict:
    """{partition: [(Entry, record headers, Envelope size)]} as a consumer with `isolation` sees them."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from confluent_kafka import KafkaError as CKError
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        r, out, open_ = Reassembler(), {p: [] for p in parts}, set(parts)
        deadline = time.monotonic() + 30
        while open_ and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    assert msg.error().code() == CKError._PARTITION_EOF, msg.error()
                    open_.discard(msg.partition())
                    continue
                for item in r.feed(msg.partition(), msg.offset(), msg.value()):
                    assert not isinstance(item, Exception), item
                    for entry in item.entries.items:
                        out[msg.partition()].append((entry, msg.headers(), len(msg.value())))
        assert not open_, "the topic was not read to its end"
        assert not r.finish(), "an Entries left unfinished"
    finally:
        consumer.close()
    return out


def records_on(bootstrap: str, topic: str) -> int:
    """Records on the topic's partitions, committed or not (the sum of the high watermarks), a
    partition whose leader is not ready yet waited for (bridge.kafka.client.retrying)."""
    from confluent_kafka import Consumer, TopicPartition

    from bridge.kafka.client import retrying
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "count"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(retrying(lambda p=p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10),
                            f"the watermarks of {topic} partition {p}", 30)[1] for p in parts)
    finally:
        c.close()


def entry_id(entry: pb.Entry) -> str:
    return next(p.value for p in entry.header.properties if p.key == TEST_ID)


def expected_partition(entry: pb.Entry, n: int) -> int:
    h = entry.header
    return 0 if not h.tableName else murmur2(f"{h.schemaName}.{h.tableName}".encode()) % n


def assert_exactly_once(got: dict, records: dict, partition_of=None) -> None:
    """Every input Entry once, byte-equal, and per partition each source key's Entries in source order."""
    inputs = input_entries(records)
    n = len(got)
    partition_of = partition_of or (lambda e: expected_partition(e, n))
    seen = [entry_id(e) for entries in got.values() for e, _, _ in entries]
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} Entries twice"
    assert sum(len(v) for v in inputs.values()) == len(seen)
    for p, entries in got.items():
        for key, wanted in inputs.items():
            mine = [e.SerializeToString() for e, _, _ in entries if entry_id(e).split(":")[0] == key[1]]
            assert mine == [e.SerializeToString() for e in wanted if partition_of(e) == p], (p, key)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
