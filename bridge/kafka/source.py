"""A DTS Kafka topic as a pipeline `Source`: Envelopes as (partition, offset, value, headers).

Two ways to own partitions:

- assigned (`subscribe=False`): the consumer is assigned the partitions (all, or a given list);
  the group, or a file, only keeps offsets, so one process reads each partition;
- a member of the consumer group (`subscribe=True`, `dts-bridge sync`'s default): the consumer
  subscribes with cooperative rebalancing, so N processes share the partitions and Kafka's tools
  show them; the pipeline loop is told which partitions come and go (`listen`), commits what it
  owns before a partition goes, and starts a gained partition at its committed offset.

Either way each partition starts at its committed offset or at `start`, and its end is known
from the high watermarks the fetches brought. Give the consumer `enable.partition.eof=True`:
`caught_up` then knows when every partition was read to its end.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from bridge.kafka.client import KafkaError, confluent, partitions_of

__all__ = ["KafkaSource"]

_START = {"earliest": "OFFSET_BEGINNING", "latest": "OFFSET_END"}


class KafkaSource:
    """`topic`'s partitions (all, or `partitions`; or, with `subscribe`, those the group gives this
    member) read by `consumer` from the committed offsets, else from `start` (earliest | latest)."""

    def __init__(self, consumer, topic: str, *, partitions: list[int] | None = None, start: str = "latest",
                 subscribe: bool = False) -> None:
        if start not in _START:
            raise ValueError(f"start must be earliest or latest, not {start!r}")
        if subscribe and partitions is not None:
            raise ValueError("a group member is given its partitions by the group: no partitions with subscribe")
        self.consumer, self.topic, self.start = consumer, topic, start
        self.dynamic = subscribe
        self._partitions = partitions if not subscribe else []
        self._at_end: set = set()  # partitions read to their end since their last message
        self._high: dict[int, int] = {}
        self._high_at = 0.0
        self._listener: tuple | None = None
        self.rebalances = 0  # assignments and revocations heard (a group member)
        # a broker that stops answering (frozen, partitioned away) sends no error: it is asked for a
        # partition's end every `health_interval` seconds, and `silent_since` says since when it is not
        self.health_interval, self.health_timeout = 10.0, 5.0
        self.silent_since: float | None = None
        self._health_at = time.monotonic()
        self.assigned_once = not subscribe  # a group member waits for its first assignment
        self.assigned_at: float | None = None  # when partitions were last gained (a group member)

    def keys(self) -> list[int]:
        if self._partitions is None:
            self._partitions = partitions_of(self.consumer, self.topic)
        return list(self._partitions)

    def listen(self, assigned: Callable[[list], dict], revoked: Callable[..., None]) -> None:
        """A group member's loop: `assigned(partitions)` -> their committed offsets (None: `start`),
        `revoked(partitions, lost=False)` before they go."""
        self._listener = (assigned, revoked)

    def open(self, committed: Mapping[int, int | None]) -> None:
        ck = confluent()
        begin = getattr(ck, _START[self.start])
        if self.dynamic:
            self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                    on_lost=self._on_lost)
            return
        self.consumer.assign([ck.TopicPartition(self.topic, p, off if off is not None else begin)
                              for p, off in ((p, committed.get(p)) for p in self.keys())])

    # The group's callbacks run inside consumer.consume(), in the loop's thread, between records.
    def _on_assign(self, consumer, partitions) -> None:
        ck = confluent()
        begin = getattr(ck, _START[self.start])
        gained = [tp.partition for tp in partitions if tp.topic == self.topic]
        starts = self._listener[0](gained) if gained and self._listener else {}
        for tp in partitions:
            off = starts.get(tp.partition)
            tp.offset = off if off is not None else begin
        consumer.incremental_assign(partitions)
        self._partitions = sorted(set(self._partitions) | set(gained))
        self.rebalances += 1
        self.assigned_once = True
        if gained:  # the loop's idle wait counts from here: a late assignment is not time spent idle
            self.assigned_at = time.monotonic()

    def _on_revoke(self, consumer, partitions, lost: bool = False) -> None:
        going = [tp.partition for tp in partitions if tp.topic == self.topic]
        if going and self._listener:
            self._listener[1](going, lost)
        self._partitions = [p for p in self._partitions if p not in going]
        for p in going:
            self._at_end.discard(p)
            self._high.pop(p, None)
        self.rebalances += 1

    def _on_lost(self, consumer, partitions) -> None:
        self._on_revoke(consumer, partitions, lost=True)

    def poll(self, budget: int, timeout: float) -> list[tuple]:
        ck = confluent()
        try:
            batch = self.consumer.consume(num_messages=budget, timeout=timeout)
        except ck.KafkaException as exc:
            raise KafkaError(f"cannot read from {self.topic}: {exc.args[0]}") from None
        if time.monotonic() - self._high_at >= 1.0:
            self._watermarks()
        if time.monotonic() - self._health_at >= self.health_interval:
            self._health()
        out = []
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.code() == ck.KafkaError._PARTITION_EOF:
                    self._at_end.add(msg.partition())
                    continue
                raise KafkaError(f"cannot read from {self.topic}: {err.str()}")
            self._at_end.discard(msg.partition())
            out.append((msg.partition(), msg.offset(), msg.value(), msg.headers()))
        return out

    def _watermarks(self) -> None:
        # The high watermark each fetch brought (cached: no request to the broker).
        ck = confluent()
        self._high_at = time.monotonic()
        for p in self.keys():
            try:
                _, high = self.consumer.get_watermark_offsets(ck.TopicPartition(self.topic, p), cached=True)
            except (ck.KafkaException, RuntimeError):
                continue
            if high is not None and high >= 0:
                self._high[p] = high

    def _health(self) -> None:
        """One uncached request to the broker (a partition's watermarks): remember since when the
        broker does not answer it within `health_timeout`."""
        ck = confluent()
        self._health_at = time.monotonic()
        keys = self.keys()  # a member the group dropped (its session ended) has none: ask partition 0
        try:
            self.consumer.get_watermark_offsets(ck.TopicPartition(self.topic, keys[0] if keys else 0),
                                                timeout=self.health_timeout, cached=False)
        except (ck.KafkaException, RuntimeError):
            if self.silent_since is None:
                self.silent_since = time.time() - self.health_timeout
            return
        self.silent_since = None

    def caught_up(self) -> bool:
        if not self.assigned_once:
            return False  # not yet a member with partitions: nothing is known to be read
        if self.dynamic and not self.keys():
            return False  # a member given nothing (yet: cooperative rounds hand partitions out in steps)
        return self._at_end >= set(self.keys())

    def ends(self) -> dict[int, int]:
        return dict(self._high)

    def close(self) -> None:
        self.consumer.close()
