"""A DTS Kafka topic as a pipeline `Source`: Envelopes as (partition, offset, value, headers).

The consumer is assigned the partitions (the group, or a file, only keeps offsets), seeks each to
its committed offset or to `start`, and reports each partition's end from the high watermarks its
fetches brought. Give the consumer `enable.partition.eof=True`: `caught_up` then knows when every
partition was read to its end.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from bridge.kafka.client import KafkaError, confluent, partitions_of

__all__ = ["KafkaSource"]

_START = {"earliest": "OFFSET_BEGINNING", "latest": "OFFSET_END"}


class KafkaSource:
    """`topic`'s partitions (all, or `partitions`) read by `consumer` from the committed offsets,
    else from `start` (earliest | latest)."""

    def __init__(self, consumer, topic: str, *, partitions: list[int] | None = None, start: str = "latest") -> None:
        if start not in _START:
            raise ValueError(f"start must be earliest or latest, not {start!r}")
        self.consumer, self.topic, self.start = consumer, topic, start
        self._partitions = partitions
        self._at_end: set = set()  # partitions read to their end since their last message
        self._high: dict[int, int] = {}
        self._high_at = 0.0

    def keys(self) -> list[int]:
        if self._partitions is None:
            self._partitions = partitions_of(self.consumer, self.topic)
        return list(self._partitions)

    def open(self, committed: Mapping[int, int | None]) -> None:
        ck = confluent()
        begin = getattr(ck, _START[self.start])
        self.consumer.assign([ck.TopicPartition(self.topic, p, off if off is not None else begin)
                              for p, off in ((p, committed.get(p)) for p in self.keys())])

    def poll(self, budget: int, timeout: float) -> list[tuple]:
        ck = confluent()
        try:
            batch = self.consumer.consume(num_messages=budget, timeout=timeout)
        except ck.KafkaException as exc:
            raise KafkaError(f"cannot read from {self.topic}: {exc.args[0]}") from None
        if time.monotonic() - self._high_at >= 1.0:
            self._watermarks()
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

    def caught_up(self) -> bool:
        return self._at_end >= set(self.keys())

    def ends(self) -> dict[int, int]:
        return dict(self._high)

    def close(self) -> None:
        self.consumer.close()
