"""Dead letters of `dts-bridge sync` in a Kafka topic (`--dead-letters kafka:TOPIC`), as Kafka
Connect users keep them (`errors.deadletterqueue.topic.name`).

Each letter is one record, the JSON document a dead-letter file line holds (bridge.stream.letters:
the Entry's bytes whole, source, partition, offset, entry, row, table, error, DataHub topic), keyed
by `<source topic>:<position>` (partition:offset:entry[:row]). Letters are produced by an
idempotent producer and flushed (acknowledged by the broker) before every offset commit, so none is
lost. An Entry read again after a crash is dead-lettered again: the same key, so a consumer that
keeps the last record per key, or a compacted topic (the topic is created compacted when missing),
holds each letter once. Under `--on-table-error halt-table` a restart halts again every table that
has a letter of this source in the topic (every letter halts its table, as `TableErrors` does).

`dts-bridge replay --from-dlq` reads files; export a topic with any consumer to a file of its
values (one per line) to replay it.
"""
from __future__ import annotations

import json
import threading
import time

from bridge.kafka.client import KafkaError, confluent
from bridge.stream.letters import letter_line, letter_position

__all__ = ["KafkaDeadLetters", "PREFIX"]

PREFIX = "kafka:"  # --dead-letters kafka:TOPIC


class KafkaDeadLetters:
    """The dead-letter sink `bridge.sync`'s sinks and `TableErrors` write to (the interface of
    `bridge.deadletters.DeadLetters`: write, sync, mark, restore, halted, offsets, written, close)."""

    def __init__(self, config: dict, topic: str, source: str, *, timeout: float = 30.0,
                 halt_tables: bool = False) -> None:
        self.config, self.topic, self.source, self.timeout = dict(config), topic, source, timeout
        self.path = PREFIX + topic  # what messages name
        self.offsets: dict[int, int] = {}  # no state of its own ahead of the offset store
        self.halted: dict[str, str] = {}
        self.written = 0
        self.halt_tables = halt_tables
        self._failures: list = []
        self._lock = threading.Lock()
        ck = confluent()
        self.producer = ck.Producer({**self.config, "enable.idempotence": True, "linger.ms": 5})

    def restore(self) -> dict[int, int]:
        """Create the topic (compacted) when missing; under halt-table, halt again the tables that
        have a letter of this source."""
        self._ensure_topic()
        if self.halt_tables:
            for letter in self._read_all():
                if letter.get("source") == self.source and letter.get("table"):
                    self.halted.setdefault(letter["table"], f"halted at {letter_position(letter)}: "
                                                            f"{letter.get('error')}")
        return {}

    def _ensure_topic(self) -> None:
        ck = confluent()
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({k: v for k, v in self.config.items() if k not in ("logger",)})
        meta = admin.list_topics(timeout=self.timeout)
        if self.topic in meta.topics:
            return
        futures = admin.create_topics([NewTopic(self.topic, 1, -1, config={"cleanup.policy": "compact"})])
        for future in futures.values():
            try:
                future.result(self.timeout)
            except ck.KafkaException as exc:
                if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise KafkaError(f"cannot create the dead-letter topic {self.topic}: {exc.args[0].str()}") from None

    def _read_all(self) -> list[dict]:
        ck = confluent()
        consumer = ck.Consumer({**{k: v for k, v in self.config.items() if not k.startswith(("linger", "enable.idem"))},
                                "group.id": "dts-bridge-dead-letters", "enable.auto.commit": False,
                                "enable.partition.eof": True, "isolation.level": "read_committed"})
        out = []
        try:
            parts = sorted(consumer.list_topics(self.topic, timeout=self.timeout).topics[self.topic].partitions)
            consumer.assign([ck.TopicPartition(self.topic, p, ck.OFFSET_BEGINNING) for p in parts])
            open_, deadline = set(parts), time.monotonic() + self.timeout
            while open_ and time.monotonic() < deadline:
                for msg in consumer.consume(500, 0.5):
                    if msg.error() is not None:
                        if msg.error().code() == ck.KafkaError._PARTITION_EOF:
                            open_.discard(msg.partition())
                            continue
                        raise KafkaError(f"cannot read the dead-letter topic {self.topic}: {msg.error().str()}")
                    try:
                        out.append(json.loads(msg.value()))
                    except (TypeError, ValueError):
                        continue  # not one of ours
        finally:
            consumer.close()
        return out

    def write(self, **letter) -> None:
        """One letter (thread-safe: the DataHub writer's workers hand refused records over)."""
        key = f"{letter['source']}:{letter_position(letter)}".encode()
        value = letter_line(**letter)

        def delivered(err, msg) -> None:
            if err is not None:
                self._failures.append(err)

        with self._lock:
            while True:
                try:
                    self.producer.produce(self.topic, value=value, key=key, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let it drain
                    self.producer.poll(0.1)
            self.producer.poll(0)
            self.written += 1

    def sync(self) -> None:
        """Every letter written so far acknowledged by the broker (before the offsets are stored)."""
        with self._lock:
            left = self.producer.flush(self.timeout)
        if left or self._failures:
            reason = self._failures[0].str() if self._failures else f"{left} not acknowledged within {self.timeout:g} s"
            raise KafkaError(f"dead letters to {self.topic} were not delivered: {reason}")

    def mark(self, offsets: dict[int, int], halted: dict[str, str]) -> None:
        self.halted = dict(halted)

    def close(self) -> None:
        with self._lock:
            self.producer.flush(self.timeout)
