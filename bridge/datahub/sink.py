"""DataHub out: the one DataHub writer every face uses (`dts-bridge sync`, `deliver`, Spark's `datahub` sink).

Its guarantees (order per shard, bounded memory, rate, refusals, retries, the exactly-once effect
across restarts) are written where it lives, in bridge/datahub/writer.py, and in docs/kafka.md
("Guarantees and how they are kept").

DataHub has no local emulator: the tests drive the real pydatahub client against a loopback
stand-in server (tests/support/datahub_standin.py).

The writer lives in bridge/datahub/writer.py (the queue, the threads, the acknowledgements) over
routing.py, packing.py and resume.py; this module keeps the names every face imports.

>>> shard_for("[10001]", ["0", "1", "2"]) in ("0", "1", "2")
True
>>> Position("dts", 0, 12, 1, 3).key
'0:12:1:3'
"""
from __future__ import annotations

import time
from collections.abc import Callable

from bridge.datahub.calls import ACCESS_ID_ENV, ACCESS_KEY_ENV, DataHubError, make_client
from bridge.datahub.records import (
    ATTR_EPOCH,
    ATTR_POS,
    ATTR_TOPIC,
    MAX_REQUEST_BYTES,
    MAX_STRING_BYTES,
    OversizedRecord,
    Position,
)
from bridge.datahub.resume import LookStopped
from bridge.datahub.routing import shard_for, tuple_shard_key
from bridge.datahub.writer import DataHubWriter

__all__ = ["DataHubWriter", "DataHubSink", "DataHubError", "LookStopped", "OversizedRecord", "Position", "shard_for",
           "tuple_shard_key", "make_client", "MAX_REQUEST_BYTES", "MAX_STRING_BYTES", "ACCESS_ID_ENV", "ACCESS_KEY_ENV", "ATTR_TOPIC", "ATTR_POS", "ATTR_EPOCH"]


class DataHubSink:
    """One topic of the writer, for `dts-bridge deliver`: `put_blob(data, key)` takes a Blob
    message's bytes, `put_tuple(row, key)` a Tuple row; `flush()` returns once every record is
    acknowledged. `position` (a `Position`) makes a record recognisable after a restart.
    """

    def __init__(self, endpoint: str, project: str, topic: str, *, access_id: str | None = None,
                 access_key: str | None = None, record_schema: dict | None = None, batch_size: int = 500,
                 max_retries: int = 6, backoff: float = 0.2, max_backoff: float = 10.0, routing: str = "shard",
                 compress: str = "lz4", client=None, sleep: Callable[[float], None] = time.sleep,
                 observer: Callable[..., None] | None = None) -> None:
        if routing != "shard":
            raise DataHubError(f"routing must be shard (PutRecordsByShard keeps each shard's order), not {routing!r}")
        if batch_size < 1:
            raise DataHubError("batch_size must be at least 1")
        client = client or make_client(endpoint, access_id, access_key, compress)
        self.project, self.topic = project, topic
        self.writer = DataHubWriter(client, project, batch_records=batch_size, max_retries=max_retries,
                                    backoff=backoff, max_backoff=max_backoff, sleep=sleep, observer=observer)
        info = self.writer.topic(topic, record_schema)
        if record_schema is not None and info.kind != "TUPLE":
            raise DataHubError(f"topic {project}/{topic} is a {info.kind} topic, not TUPLE")

    @property
    def records(self) -> int:
        return self.writer.records

    @property
    def requests(self) -> int:
        return self.writer.requests

    @property
    def retries(self) -> int:
        return self.writer.retries

    def put_blob(self, data: bytes, key: str, attributes: dict | None = None, position: Position | None = None) -> bool:
        return self.writer.put(self.topic, key, data, position, attributes)

    def put_tuple(self, row: dict, key: str, attributes: dict | None = None, position: Position | None = None) -> bool:
        return self.writer.put(self.topic, key, row, position, attributes)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

