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
import re
import threading
import time

from bridge.kafka.client import KafkaError, confluent
from bridge.stream.letters import letter_line, letter_position

__all__ = ["KafkaDeadLetters", "PREFIX", "topic_problem"]

PREFIX = "kafka:"  # --dead-letters kafka:TOPIC
MAX_TOPIC_LENGTH = 249  # Kafka's own limit (org.apache.kafka.common.internals.Topic)
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def topic_problem(name: str) -> str | None:
    """What Kafka would refuse in a topic name (its own rules: the characters [a-zA-Z0-9._-], at
    most 249 of them, not "." or ".."), or None for a legal name.

    >>> topic_problem("dts.dead-letters_1") is None
    True
    >>> topic_problem("a/b")
    "the topic name 'a/b' has characters Kafka does not allow ('/'); legal: a-z A-Z 0-9 . _ -"
    """
    if not name:
        return "the topic name is empty"
    if name in (".", ".."):
        return f"{name!r} is not a topic name Kafka allows"
    if len(name) > MAX_TOPIC_LENGTH:
        return f"the topic name is {len(name)} characters long; Kafka allows at most {MAX_TOPIC_LENGTH}"
    if not _LEGAL.fullmatch(name):
        bad = "".join(sorted(set(_LEGAL.sub("", name))))
        return (f"the topic name {name!r} has characters Kafka does not allow ({bad!r}); "
                "legal: a-z A-Z 0-9 . _ -")
    return None


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
        self._failures: list[str] = []
        self._lock = threading.Lock()
        problem = topic_problem(topic)
        if problem is not None:
            raise KafkaError(f"dead letters to {PREFIX}{topic}: {problem}")
        # The producer and the topic come with the first letter: a run whose brokers do not answer
        # (yet) is not held up or ended here; it waits for them as its consumer does (bridge.sync's
        # loop, "KAFKA NOT ANSWERING"), and a letter written meanwhile fails its `sync`, before any
        # offset is committed. librdkafka's log goes to the config's `logger` (the consumer's).
        self._producer = None
        self._topic_ready = False

    @property
    def producer(self):
        if self._producer is None:
            ck = confluent()
            try:
                self._producer = ck.Producer({**self.config, "enable.idempotence": True, "linger.ms": 5})
            except ck.KafkaException as exc:
                raise KafkaError(f"dead letters to {self.topic}: invalid Kafka settings: {_text(exc)}") from None
        return self._producer

    def restore(self) -> dict[int, int]:
        """Under halt-table, create the topic (compacted) when missing and halt again the tables
        that have a letter of this source: the brokers must answer within `timeout` then, or the
        run stops with a KafkaError before it starts. Otherwise nothing: the topic is made with the
        first letter."""
        if self.halt_tables:
            self._ensure_topic()
            for letter in self._read_all():
                if letter.get("source") == self.source and letter.get("table"):
                    self.halted.setdefault(letter["table"], f"halted at {letter_position(letter)}: "
                                                            f"{letter.get('error')}")
        return {}

    def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        ck = confluent()
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient(self.config)
        try:
            try:
                meta = admin.list_topics(timeout=self.timeout)
            except ck.KafkaException as exc:
                raise KafkaError(f"cannot reach the brokers of the dead-letter topic {self.topic} within "
                                 f"{self.timeout:g} s: {_text(exc)}") from None
            if self.topic not in meta.topics:
                futures = admin.create_topics([NewTopic(self.topic, 1, -1, config={"cleanup.policy": "compact"})])
                for future in futures.values():
                    try:
                        future.result(self.timeout)
                    except ck.KafkaException as exc:
                        if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                            raise KafkaError(f"cannot create the dead-letter topic {self.topic}: "
                                             f"{_text(exc)}") from None
        finally:
            admin.poll(0)  # hand its log lines to the config's logger
        self._topic_ready = True

    def _read_all(self) -> list[dict]:
        ck = confluent()
        consumer = ck.Consumer({**{k: v for k, v in self.config.items() if not k.startswith(("linger", "enable.idem"))},
                                "group.id": "dts-bridge-dead-letters", "enable.auto.commit": False,
                                "enable.partition.eof": True, "isolation.level": "read_committed"})
        out = []
        try:
            try:
                meta = consumer.list_topics(self.topic, timeout=self.timeout)
            except ck.KafkaException as exc:
                raise KafkaError(f"cannot read the dead-letter topic {self.topic}: {_text(exc)}") from None
            parts = sorted(meta.topics[self.topic].partitions)
            consumer.assign([ck.TopicPartition(self.topic, p, ck.OFFSET_BEGINNING) for p in parts])
            open_, deadline = set(parts), time.monotonic() + self.timeout
            while open_ and time.monotonic() < deadline:
                try:
                    batch = consumer.consume(500, 0.5)
                except ck.KafkaException as exc:
                    raise KafkaError(f"cannot read the dead-letter topic {self.topic}: {_text(exc)}") from None
                for msg in batch:
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
                self._failures.append(err.str())

        with self._lock:
            if self._failures:
                return  # `sync` stops the run before the next commit: this letter's Entry is read again then
            if not self._topic_ready:
                try:
                    self._ensure_topic()
                except KafkaError as err:  # from a DataHub writer's thread too: `sync` says it
                    self._failures.append(err.reason)
                    return
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
            left = self._producer.flush(self.timeout) if self._producer is not None else 0
        if left or self._failures:
            reason = self._failures[0] if self._failures else f"{left} not acknowledged within {self.timeout:g} s"
            raise KafkaError(f"dead letters to {self.topic} were not delivered: {reason}")

    def mark(self, offsets: dict[int, int], halted: dict[str, str]) -> None:
        self.halted = dict(halted)

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(self.timeout)


def _text(exc) -> str:
    err = exc.args[0] if exc.args else exc
    return err.str() if hasattr(err, "str") else str(err)
