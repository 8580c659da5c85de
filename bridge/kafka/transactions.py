"""Source positions committed with the records they vouch for: a compacted Kafka offsets topic
written in the sink's own transaction (as Kafka Connect's exactly-once source connectors do,
KIP-618), and a wrapper for stores kept without transactions.

- `TransactionalPositions(sink)`: a pipeline `Positions`. `load` starts the sink (its
  `init_transactions()` fences a zombie and aborts its open transaction), creates the offsets topic
  if missing (`cleanup.policy=compact`), waits until no transaction is open on it, then reads it to
  its end with `isolation.level=read_committed` (the latest value per key). `save` writes one
  record per changed source key (key `["<source id>", "<key text>"]`, value
  `{"position": p, "read": r, "at": epoch ms}`) and commits the transaction: the records written
  since the last commit and these positions become visible together, or neither does. With a sink
  built with `transactions=False` the same topic is a plain store (written and flushed after the
  records), and `load` also runs the sink's tail look (`DtsKafkaSink.resume`).
- `TailPositions(store, sink)`: any other `Positions` (a `FileOffsets`, ...) for a sink without
  transactions; `load` runs the tail look from what it loaded.

Wiring (the loop is `bridge.pipeline.run`):

    sink = DtsKafkaSink(config, "dts-out", transactional_id=transactional_id_for(project, dh_topic, "dts-out"))
    positions = TransactionalPositions(sink, key_text=..., parse_key=...)
    try:
        run(source, positions, assembler, lambda e: e, sink, policy, size=lambda e: 1, commit_interval=1.0)
    finally:
        sink.close()
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from bridge.kafka.client import KafkaError, confluent, partitions_of

__all__ = ["TransactionalPositions", "TailPositions", "DEFAULT_OFFSETS_TOPIC", "ensure_offsets_topic",
           "read_offsets_topic", "offsets_clients"]

DEFAULT_OFFSETS_TOPIC = "dts-bridge-offsets"
_CONSUMER_ONLY_DROP = ("linger", "acks", "batch", "compression", "message.", "queue.", "enable.idem", "transaction",
                       "retries", "delivery.")


def _client_config(config: dict) -> dict:
    return {k: v for k, v in config.items() if not k.startswith(_CONSUMER_ONLY_DROP)}


def offsets_clients(config: dict) -> tuple:
    """(AdminClient, read_committed Consumer) for `ensure_offsets_topic` and `read_offsets_topic`,
    made together: a librdkafka client sets up its connection in the background, about 55 ms on
    loopback, so clients made side by side (and beside the sink's producer starting) pay it once,
    not once each. The caller closes the consumer."""
    ck = confluent()
    from confluent_kafka.admin import AdminClient
    admin = AdminClient(_client_config(config))
    # fetch.wait.max.ms: a fetch at the end is answered at once (with librdkafka's default the broker
    # holds it 500 ms, and the partition EOF that ends the read comes only with that answer)
    consumer = ck.Consumer({**_client_config(config), "group.id": f"dts-bridge-offsets-{uuid.uuid4().hex}",
                            "enable.auto.commit": False, "enable.partition.eof": True,
                            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                            "fetch.wait.max.ms": 10})
    return admin, consumer


def ensure_offsets_topic(config: dict, topic: str, *, partitions: int = 1, replication_factor: int = -1,
                         timeout: float = 30.0, admin=None) -> None:
    """Create `topic` (compacted) unless it exists; wait until every partition has a leader.
    `admin`: an AdminClient to use (else one of its own)."""
    ck = confluent()
    from confluent_kafka.admin import AdminClient, NewTopic
    if admin is None:
        admin = AdminClient(_client_config(config))
    meta = admin.list_topics(timeout=timeout)
    if topic not in meta.topics:
        futures = admin.create_topics([NewTopic(topic, partitions, replication_factor,
                                                config={"cleanup.policy": "compact"})])
        for future in futures.values():
            try:
                future.result(timeout)
            except ck.KafkaException as exc:
                if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise KafkaError(f"cannot create the offsets topic {topic!r}: {exc.args[0].str()}") from None
    deadline = time.monotonic() + timeout
    while True:
        info = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        if info is not None and info.error is None and info.partitions and \
                all(p.leader >= 0 and p.error is None for p in info.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise KafkaError(f"the offsets topic {topic!r} has partitions without a leader after {timeout:g} s")
        time.sleep(0.1)


def _settled(config: dict, topic: str, partitions: list[int], wait: float, admin=None) -> dict:
    """Wait until the last stable offset of every partition reaches the high watermark seen now:
    a transaction still open there (another pipeline's) would hide the records after it from a
    read_committed reader, ours among them. Returns each partition's [low watermark, last stable
    offset) range: where a read_committed reader starts and where it ends."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec
    if admin is None:
        admin = AdminClient(_client_config(config))

    def ends(level, spec=OffsetSpec.latest) -> dict:
        request = {TopicPartition(topic, p): spec() for p in partitions}
        got = admin.list_offsets(request, isolation_level=level)
        return {tp.partition: future.result(wait).offset for tp, future in got.items()}

    target = ends(IsolationLevel.READ_UNCOMMITTED)
    deadline = time.monotonic() + wait
    while True:
        stable = ends(IsolationLevel.READ_COMMITTED)
        if all(stable[p] >= target[p] for p in partitions):
            low = ends(IsolationLevel.READ_COMMITTED, OffsetSpec.earliest)
            return {p: (low[p], stable[p]) for p in partitions}
        if time.monotonic() > deadline:
            raise KafkaError(f"a transaction stays open on the offsets topic {topic!r} for over {wait:g} s "
                             f"(partitions {sorted(p for p in partitions if stable[p] < target[p])})")
        time.sleep(0.2)


def read_offsets_topic(config: dict, topic: str, *, timeout: float = 30.0, settle: float = 120.0,
                       clients: tuple | None = None) -> dict:
    """The latest value of every key of `topic`, read to its end as a read_committed consumer:
    {key bytes: value bytes}; a key whose latest record is a tombstone is left out.

    Its end is the last stable offset each partition had once no transaction was open on it
    (`_settled`): a partition with nothing below it is not read at all, the others until partition
    EOF (the reader's own end) or a record at or past that offset, in short `consume` waits (one
    long wait for a full batch was half a second of every start). `clients`: `offsets_clients`'
    pair to use (the caller closes them), else its own."""
    ck = confluent()
    admin, consumer = clients if clients is not None else offsets_clients(config)
    try:
        partitions = partitions_of(consumer, topic, timeout)
        ranges = _settled(config, topic, partitions, settle, admin=admin)
        open_ = {p for p in partitions if ranges[p][1] > max(ranges[p][0], 0)}
        latest: dict = {}
        if not open_:
            return latest
        consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in sorted(open_)])
        deadline = time.monotonic() + max(timeout, 60.0)
        while open_:
            for msg in consumer.consume(num_messages=1000, timeout=0.05):
                err = msg.error()
                if err is not None:
                    if err.code() == ck.KafkaError._PARTITION_EOF:
                        open_.discard(msg.partition())
                        continue
                    raise KafkaError(f"cannot read the offsets topic {topic!r}: {err.str()}")
                if msg.value() is None:
                    latest.pop(msg.key(), None)
                else:
                    latest[msg.key()] = msg.value()
                if msg.offset() + 1 >= ranges[msg.partition()][1]:
                    open_.discard(msg.partition())
            if open_ and time.monotonic() > deadline:
                raise KafkaError(f"the offsets topic {topic!r} was not read to its end in time")
        return latest
    finally:
        if clients is None:
            consumer.close()


class TransactionalPositions:
    """Source positions in a compacted offsets topic, committed in the transaction of `sink` (a
    `DtsKafkaSink`); see the module's doc. `source_id` (default: the sink's transactional id, else
    its topic) names this pipeline in the keys; `key_text`/`parse_key` turn a source key (a
    DataHub (topic, shard) pair, ...) into text and back (default str / identity)."""

    def __init__(self, sink, *, offsets_topic: str = DEFAULT_OFFSETS_TOPIC, source_id: str | None = None,
                 key_text: Callable[[Any], str] | None = None, parse_key: Callable[[str], Any] | None = None,
                 create: bool = True, partitions: int = 1, replication_factor: int = -1,
                 timeout: float = 30.0, settle: float | None = None) -> None:
        self.sink, self.offsets_topic = sink, offsets_topic
        self.source_id = source_id or sink.transactional_id or f"dts-bridge:{sink.topic}"
        self.key_text = key_text or getattr(sink, "key_text", str)
        self.parse_key = parse_key or (lambda text: text)
        self.create, self.partitions, self.replication_factor = create, partitions, replication_factor
        self.timeout = timeout
        # how long a foreign transaction open on the offsets topic is waited for (the broker aborts
        # one after its transaction.timeout.ms: a minute by default)
        self.settle = settle if settle is not None else 120.0
        self.times: dict = {}

    def _record_key(self, text: str) -> bytes:
        return json.dumps([self.source_id, text], separators=(",", ":")).encode()

    def stored(self, clients: tuple | None = None) -> dict:
        """Everything this pipeline committed: {parsed key: (position, read)}. `clients`: an
        `offsets_clients` pair to read with (the caller closes them)."""
        if clients is None:
            clients = offsets_clients(self.sink.config)
            try:
                return self.stored(clients)
            finally:
                clients[1].close()
        if self.create:
            ensure_offsets_topic(self.sink.config, self.offsets_topic, partitions=self.partitions,
                                 replication_factor=self.replication_factor, timeout=self.timeout, admin=clients[0])
        raw = read_offsets_topic(self.sink.config, self.offsets_topic, timeout=self.timeout, settle=self.settle,
                                 clients=clients)
        out = {}
        for key, value in raw.items():
            try:
                source, text = json.loads(key)
                doc = json.loads(value)
            except (ValueError, TypeError):
                continue  # not a record of ours
            if source != self.source_id or not isinstance(doc, dict):
                continue
            parsed = self.parse_key(text)
            out[parsed] = (doc.get("position"), doc.get("read"))
            if isinstance(doc.get("at"), int):
                self.times[parsed] = doc["at"]
        return out

    def load(self, keys: list) -> dict:
        clients = offsets_clients(self.sink.config)  # (connecting while the sink starts)
        try:
            self.sink.start()  # init_transactions first: our own zombie's transaction is aborted by it
            stored = self.stored(clients)
        finally:
            clients[1].close()
        by_text = {self.key_text(k): v for k, v in stored.items()}
        got = {k: stored.get(k, by_text.get(self.key_text(k), (None, None))) for k in keys}
        if not self.sink.transactions:
            self.sink.resume(got)
        return got

    def save(self, commit: dict, read: dict) -> None:
        at = int(time.time() * 1000)
        records = [(self.offsets_topic, self._record_key(self.key_text(k)),
                    json.dumps({"position": off, "read": read.get(k, off), "at": at},
                               separators=(",", ":")).encode())
                   for k, off in commit.items()]
        self.sink.commit(records)


class TailPositions:
    """A `Positions` store (`FileOffsets`, ...) for a `DtsKafkaSink(transactions=False)`: `load`
    gives the stored positions and runs the sink's tail look from them; `save` flushes the sink's
    producer first (the loop has flushed it already: the records are acknowledged) and stores."""

    def __init__(self, store, sink) -> None:
        self.store, self.sink = store, sink

    @property
    def times(self) -> dict:
        return getattr(self.store, "times", {})

    def load(self, keys: list) -> dict:
        got = self.store.load(keys)
        self.sink.resume(got)
        return got

    def save(self, commit: dict, read: dict) -> None:
        self.sink.flush()
        self.store.save(commit, read)
