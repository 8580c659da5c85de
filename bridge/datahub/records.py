"""The records the DataHub writer sends: their source positions (the attributes that make a restart
exact), DataHub's limits, and a queued record (`Pending`).

>>> Position("dts", 0, 12, 1, 3).key
'0:12:1:3'
"""
from __future__ import annotations

from dataclasses import dataclass

from bridge.errors import ConversionError
from bridge.values import signed_digits

__all__ = ["ATTR_TOPIC", "ATTR_POS", "ATTR_EPOCH", "MAX_REQUEST_BYTES", "MAX_STRING_BYTES", "SHARD_MAX_RATE",
           "LOST_ANSWER_MARGIN_MS", "OversizedRecord", "Position", "Pending"]

ATTR_TOPIC = "dts.topic"
ATTR_POS = "dts.pos"
ATTR_EPOCH = "dts.epoch"
# DataHub takes up to 4 MB per request; leave room for the envelope around the records.
MAX_REQUEST_BYTES = 4 * 1024 * 1024 - 64 * 1024
# How far before its first attempt a request whose answer was lost is looked for (clock skew).
LOST_ANSWER_MARGIN_MS = 60_000
# DataHub's documented limits (alibabacloud.com/help/en/datahub/limits): an HTTP body of 4 MB, a STRING
# field of 2 MB, 2,000 write requests/s and 5 MB/s per shard. No other per-record limit is documented:
# a record is oversized when it cannot fit one request, or a STRING value is over 2 MB.
MAX_STRING_BYTES = 2 * 1024 * 1024
SHARD_MAX_RATE = 2000.0  # requests per second DataHub allows a shard


class OversizedRecord(ConversionError):
    """A record over DataHub's limits (a request of 4 MB, a STRING value of 2 MB)."""



@dataclass(frozen=True)
class Position:
    """Where a record came from: the source (a Kafka topic, or a file), the partition, the offset of
    the first Envelope of its Entries (or a line number), the Entry's index in it and the record's
    index among the Entry's outputs. Increasing in stream order within a partition."""
    source: str
    partition: int
    offset: int
    entry: int = 0
    row: int = 0

    @property
    def key(self) -> str:
        return f"{self.partition}:{self.offset}:{self.entry}:{self.row}"

    @staticmethod
    def parse(text: str) -> tuple[int, int, int, int] | None:
        parts = text.split(":")
        if len(parts) != 4 or not all(signed_digits(p) for p in parts):
            return None
        return tuple(int(p) for p in parts)  # type: ignore[return-value]


class Pending:
    __slots__ = ("record", "key", "position", "seq", "size", "topic", "tag", "context", "dropped", "at")

    def __init__(self, record, key: str, position: Position | None, seq: int, size: int) -> None:
        self.record, self.key, self.position, self.seq, self.size = record, key, position, seq, size
        self.topic = None
        self.tag = None  # the caller's label (a table): `halt(tag)` stops records so labelled
        self.context = None  # the caller's, handed back to `on_refused`
        self.dropped = False  # handed to `on_refused` (halted): never sent, even when its batch goes again
        self.at = 0.0  # when it was queued (monotonic): a request waits at most `linger` for more

