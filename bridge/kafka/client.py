"""DTS over Kafka: consume Envelopes with checkpoint-safe offset commits, produce `.pb` files.

The consumer feeds every message as (partition, offset, value) to one `Reassembler`, runs the
Entries through `bridge.stream` (the error policy and the accounting live there) and hands each
converted item to a sink. Offsets are committed only after the sink has made everything
converted so far durable (flush + fsync), at every CHECKPOINT entry and at the end of a run, and
never past the first segment of an Entries that is still incomplete: at-least-once, and a
graceful stop loses nothing and writes nothing twice (docs/kafka.md, "The commit rule").

confluent-kafka is imported lazily; without it the functions raise `KafkaError` naming the
package to install.

>>> client_config("h:9092", sasl_username="u", sasl_password="p")["security.protocol"]
'SASL_PLAINTEXT'
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bridge.errors import BridgeError
from bridge.stream import ErrorPolicy, dts_records_to_entries, entries_to_messages, entries_to_outputs
from bridge.stream.state import replace_json
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Reassembler, read_pb

__all__ = ["KafkaError", "client_config", "produce_file", "consume", "ConsumeReport", "GroupOffsets",
           "FileOffsets", "partitions_of", "replace_json", "SASL_USERNAME_ENV", "SASL_PASSWORD_ENV"]

SASL_USERNAME_ENV = "DTS_BRIDGE_SASL_USERNAME"
SASL_PASSWORD_ENV = "DTS_BRIDGE_SASL_PASSWORD"
# What Tencent DTS consumer groups ask for; either can be overridden.
DEFAULT_SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512"}


class KafkaError(BridgeError):
    """The broker or the client failed: connection, unknown topic, delivery, commit."""


def confluent():
    try:
        import confluent_kafka
    except ImportError:
        raise KafkaError("Kafka needs confluent-kafka: pip install 'dts-datahub-bridge[kafka]'") from None
    return confluent_kafka


def client_config(brokers: str, *, security_protocol: str | None = None, sasl_mechanism: str | None = None,
                  sasl_username: str | None = None, sasl_password: str | None = None,
                  extra: dict | None = None) -> dict:
    """librdkafka settings for a DTS topic: SASL (SCRAM-SHA-512 over SASL_PLAINTEXT unless told
    otherwise) as soon as a user name is given."""
    config: dict[str, Any] = {"bootstrap.servers": brokers}
    if sasl_username or sasl_password:
        config.update(DEFAULT_SASL)
        config["sasl.username"] = sasl_username or ""
        config["sasl.password"] = sasl_password or ""
    if security_protocol:
        config["security.protocol"] = security_protocol
    if sasl_mechanism:
        config["sasl.mechanism"] = sasl_mechanism
    config.update(extra or {})
    return config


def _raise_for(err, what: str) -> None:
    if err is not None:
        raise KafkaError(f"{what}: {err.str() if hasattr(err, 'str') else err}")


def partitions_of(client, topic: str, timeout: float = 10.0) -> list[int]:
    """The topic's partition ids, from the broker's metadata."""
    try:
        meta = client.list_topics(topic, timeout=timeout)
    except confluent().KafkaException as exc:
        raise KafkaError(f"cannot read the metadata of topic {topic!r}: {exc.args[0]}") from None
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        reason = info.error.str() if info is not None and info.error is not None else "no partitions"
        raise KafkaError(f"topic {topic!r} is not available ({reason})")
    return sorted(info.partitions)


# ---- produce ------------------------------------------------------------------------------------

def produce_file(path, config: dict, topic: str, partition: int | None = None, timeout: float = 30.0) -> int:
    """Send a `.pb` file's Envelopes, in order, to one partition; returns how many were sent.

    Each Envelope is acknowledged before the next is sent (synchronous), so the partition holds
    them in file order even across retries, and a failure stops at a known Envelope. Without
    `partition` every message carries the file's name as key, which the partitioner maps to one
    partition.
    """
    ck = confluent()
    producer = ck.Producer({**config, "linger.ms": 0})
    key = None if partition is not None else os.path.basename(os.fspath(path)).encode()
    failure: list = []

    def delivered(err, msg) -> None:
        if err is not None:
            failure.append(err)

    count = 0
    for number, _, raw in read_pb(path):
        kwargs = {"partition": partition} if partition is not None else {}
        try:
            producer.produce(topic, value=raw, key=key, on_delivery=delivered, **kwargs)
        except (BufferError, ck.KafkaException) as exc:
            raise KafkaError(f"cannot send Envelope {number} of {path}: {exc}") from None
        if producer.flush(timeout) or failure:
            reason = failure[0].str() if failure else f"not acknowledged within {timeout:g} s"
            raise KafkaError(f"Envelope {number} of {path} was not delivered ({reason}); {count} were")
        count += 1
    return count


# ---- where offsets live -------------------------------------------------------------------------

class GroupOffsets:
    """Offsets committed to the consumer group; the commit metadata also records how far the run
    had read, so that the next run can count what it reads again (brokers may drop it: Tansu does)."""

    def __init__(self, consumer, topic: str, timeout: float = 10.0) -> None:
        self.consumer, self.topic, self.timeout = consumer, topic, timeout
        self.times: dict[int, int] = {}  # when each partition was last committed (epoch ms), if kept

    def load(self, partitions: list[int]) -> dict[int, tuple[int | None, int | None]]:
        TopicPartition = confluent().TopicPartition
        got = _retrying(lambda: self.consumer.committed([TopicPartition(self.topic, p) for p in partitions],
                                                        timeout=self.timeout),
                        "cannot read the group's committed offsets", max(self.timeout, 30.0))
        out = {}
        for tp in got:
            offset = tp.offset if tp.offset >= 0 else None
            out[tp.partition] = (offset, _read_mark(tp.metadata))
            at = _read_mark(tp.metadata, "at")
            if at is not None:
                self.times[tp.partition] = at
        return out

    def save(self, commit: dict[int, int], read: dict[int, int]) -> None:
        TopicPartition = confluent().TopicPartition
        at = int(time.time() * 1000)
        offsets = [TopicPartition(self.topic, p, off, metadata=json.dumps({"read": read[p], "at": at}))
                   for p, off in sorted(commit.items())]
        result = _retrying(lambda: self.consumer.commit(offsets=offsets, asynchronous=False),
                           "offset commit failed", max(self.timeout, 30.0))
        for tp in result or []:
            _raise_for(tp.error, f"offset commit of partition {tp.partition} failed")


def _retrying(call: Callable[[], Any], what: str, timeout: float):
    """`call()`, again while the broker answers with a retriable error (a group coordinator that is
    still loading or moving, as on a fresh broker) for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except confluent().KafkaException as exc:
            err = exc.args[0]
            ck = confluent()
            moving = getattr(err, "code", lambda: None)() in (  # librdkafka does not flag these retriable
                ck.KafkaError.NOT_COORDINATOR, ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                ck.KafkaError.COORDINATOR_NOT_AVAILABLE, ck.KafkaError._WAIT_COORD)
            if (moving or getattr(err, "retriable", lambda: False)()) and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise KafkaError(f"{what}: {err}") from None


def _read_mark(metadata: str | None, key: str = "read") -> int | None:
    try:
        return int(json.loads(metadata)[key]) if metadata else None
    except (ValueError, KeyError, TypeError):
        return None


class FileOffsets:
    """Offsets in a local JSON file, for brokers (or ACLs) without consumer-group commits. The
    file is replaced atomically and fsynced, like the output it vouches for."""

    def __init__(self, path, topic: str) -> None:
        self.path, self.topic = os.fspath(path), topic
        self.times: dict[int, int] = {}  # when each partition was last committed (epoch ms)

    def load(self, partitions: list[int]) -> dict[int, tuple[int | None, int | None]]:
        try:
            with open(self.path, "rb") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return {p: (None, None) for p in partitions}
        except (OSError, ValueError) as exc:
            raise KafkaError(f"cannot read the offsets file {self.path}: {exc}") from None
        if doc.get("topic") != self.topic:
            raise KafkaError(f"the offsets file {self.path} is for topic {doc.get('topic')!r}, not {self.topic!r}")
        known = doc.get("partitions", {})
        self.times = {p: known[str(p)]["at"] for p in partitions
                      if isinstance(known.get(str(p), {}).get("at"), int)}
        return {p: (known[str(p)]["commit"], known[str(p)].get("read")) if str(p) in known else (None, None)
                for p in partitions}

    def save(self, commit: dict[int, int], read: dict[int, int]) -> None:
        doc = {"topic": self.topic, "partitions": {}}
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                doc = json.load(fh)
        at = int(time.time() * 1000)
        for p, off in commit.items():
            doc["partitions"][str(p)] = {"commit": off, "read": read[p], "at": at}
        replace_json(self.path, doc)


# ---- consume ------------------------------------------------------------------------------------

# Reassembler.held_from says where the incomplete Entries of a partition starts: the commit must not pass it.
_HoldingReassembler = Reassembler


@dataclass
class ConsumeReport:
    """What a consume run did, besides the Tally: Envelopes read, those read again (below the
    previous run's read position, when the offset store kept it; None when unknown), commits.
    Live while the run goes on (pass one to `consume` to watch it): `committed`, `position` (the
    next offset to read per partition) and `high` (the partition's high watermark as the last
    fetch saw it, refreshed about once a second)."""
    envelopes: int = 0
    reread: int | None = 0
    held: int = 0
    commits: int = 0
    deferred: int = 0  # commits a sink held back (`sink.may_commit`)
    committed: dict = field(default_factory=dict)
    started: dict = field(default_factory=dict)
    stopped: str = "end"
    position: dict = field(default_factory=dict)
    high: dict = field(default_factory=dict)

    def lag(self) -> dict[int, int]:
        """Per partition: messages between the committed (else the read) offset and the high watermark."""
        out = {}
        for p, high in list(self.high.items()):  # a status thread reads it while the run fills it
            base = self.committed.get(p, self.position.get(p, self.started.get(p)))
            if base is not None and high >= 0:
                out[p] = max(0, high - base)
        return out

    def as_dict(self) -> dict:
        return {"envelopes": self.envelopes, "reread": self.reread, "held_segments": self.held,
                "commits": self.commits, "started": {str(k): v for k, v in sorted(self.started.items())},
                "committed": {str(k): v for k, v in sorted(self.committed.items())}, "stopped": self.stopped}


_START = {"earliest": "OFFSET_BEGINNING", "latest": "OFFSET_END"}


def consume(consumer, topic: str, store, convert: Callable[[pb.Entry], list], sink, policy: ErrorPolicy, *,
            partitions: list[int] | None = None, start: str = "latest", max_messages: int | None = None,
            idle_timeout: float | None = None, stop: Callable[[], bool] = lambda: False,
            poll_timeout: float = 0.2, raw: bool = False, report: ConsumeReport | None = None,
            size: Callable[[Any], int] | None = None, commit_interval: float | None = None) -> ConsumeReport:
    """Read `topic` from the stored offsets (else from `start`), convert, write to `sink`, commit.

    `sink.write(where, item)` takes each converted item; `sink.sync()` must make everything
    written so far durable before it returns (it runs before every commit); a sink with a
    `mark(offsets)` method is told, after `sync` and before the offsets are stored, every
    partition's offset about to be committed (a file face records its files' lengths there). The
    run ends after
    `max_messages` Envelopes, after `idle_timeout` seconds without one, or when `stop()` turns
    true; every ending but an exception commits. Partitions are assigned, not subscribed: the
    group (or file) only keeps offsets, so one process reads each partition. Give the consumer
    `enable.partition.eof=True`: idleness then waits for every partition to be read to its end,
    else for five times `idle_timeout`. `raw`: call `convert(entry, entry_bytes)` where the bytes
    are known (`BlobEncoder.convert_lines` takes them for its C fast path). `report`: a
    `ConsumeReport` to fill (and watch from another thread), else a new one. `size`: the sink
    takes each Entry's outputs whole (`sink.write(where, outputs)`), `size(outputs)` of them.
    `commit_interval`: also commit when this many seconds passed since the last commit (streams
    without CHECKPOINT entries, and a shorter replay after a crash).
    """
    ck = confluent()
    partitions = partitions if partitions is not None else partitions_of(consumer, topic)
    stored = store.load(partitions)
    report = report if report is not None else ConsumeReport()
    begin = getattr(ck, _START[start])
    report.started = {p: stored.get(p, (None, None))[0] for p in partitions}
    consumer.assign([ck.TopicPartition(topic, p, off if off is not None else begin)
                     for p, (off, _) in ((p, stored.get(p, (None, None))) for p in partitions)])
    marks = {p: mark for p, (_, mark) in stored.items()}
    if any(off is not None and mark is None for off, mark in stored.values()):
        report.reread = None  # committed before, but how far that run read is unknown
    reassembler = _HoldingReassembler()
    for p, (off, _) in stored.items():
        if off is not None:
            reassembler.resume_at(p)
    read: dict[int, int] = {}
    committed: dict[int, int] = {}
    checkpoint = [False]
    mark_sink = getattr(sink, "mark", None)
    may_commit = getattr(sink, "may_commit", None)  # a sink may hold a commit back (bridge.sync)

    last_commit = [time.monotonic()]

    def commit() -> None:
        last_commit[0] = time.monotonic()
        sink.sync()
        safe = {}
        for p, nxt in read.items():
            held = reassembler.held_from(p)
            safe[p] = nxt if held is None else held
        changed = {p: off for p, off in safe.items() if committed.get(p) != off}
        if changed and may_commit is not None and not may_commit({**committed, **changed}):
            report.deferred += 1  # the sink cannot vouch for these offsets yet: commit later
            return
        if mark_sink is not None:
            mark_sink({**committed, **changed})
        if changed:
            store.save(changed, {p: read[p] for p in changed})
            committed.update(changed)
            report.committed = dict(committed)
            report.commits += 1

    watermarks_at = [0.0]

    def watermarks() -> None:
        # The high watermark each fetch brought (cached: no request to the broker).
        watermarks_at[0] = time.monotonic()
        for p in partitions:
            try:
                _, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, p), cached=True)
            except (ck.KafkaException, RuntimeError):
                continue
            if high is not None and high >= 0:
                report.high[p] = high

    at_end: set = set()  # partitions read to their end since their last message

    def idle(since: float) -> bool:
        # Idle means caught up: every partition at its end (the first fetch can take a while),
        # or nothing at all for five times the timeout.
        waited = time.monotonic() - since
        return waited >= idle_timeout and (at_end >= set(partitions) or waited >= 5 * idle_timeout)

    def records() -> Iterator[tuple[int, int, bytes]]:
        last = time.monotonic()
        while True:
            wanted = 500 if max_messages is None else min(500, max_messages - report.envelopes)
            if wanted <= 0:
                report.stopped = "max-messages"
                return
            if stop():
                report.stopped = "signal"
                return
            try:
                batch = consumer.consume(num_messages=wanted, timeout=poll_timeout)
            except ck.KafkaException as exc:
                raise KafkaError(f"cannot read from {topic}: {exc.args[0]}") from None
            if time.monotonic() - watermarks_at[0] >= 1.0:
                watermarks()
            if idle_timeout is not None and all(m.error() is not None for m in batch) and idle(last):
                report.stopped = "idle"
                return
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == ck.KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                        continue
                    raise KafkaError(f"cannot read from {topic}: {err.str()}")
                due = commit_interval is not None and time.monotonic() - last_commit[0] >= commit_interval
                if checkpoint[0] or due:  # everything up to the checkpoint's Entries has been written
                    commit()
                    checkpoint[0] = False
                if stop():
                    report.stopped = "signal"
                    return
                partition, offset = msg.partition(), msg.offset()
                last = time.monotonic()
                at_end.discard(partition)
                report.envelopes += 1
                mark = marks.get(partition)
                if report.reread is not None and mark is not None and offset < mark:
                    report.reread += 1
                read[partition] = report.position[partition] = offset + 1
                yield partition, offset, msg.value(), msg.headers()

    def entries():
        # finish=False: an Entries still incomplete at the end is read again next run, not rejected
        for item in dts_records_to_entries(records(), policy, reassembler, finish=False, raw=raw):
            if item[1].header.messageType == pb.CHECKPOINT:
                checkpoint[0] = True
            yield item

    if size is None:
        for where, item in entries_to_messages(entries(), convert, policy):
            sink.write(where, item)
    else:
        for where, outputs in entries_to_outputs(entries(), convert, policy, size=size):
            if outputs is not None:
                sink.write(where, outputs)
    commit()
    report.held = reassembler.held_segments()
    report.committed = dict(committed)
    return report
