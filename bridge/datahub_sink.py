"""DataHub out: Blob messages as BlobRecords, Tuple rows as TupleRecords, through the pydatahub SDK.

Records are batched (`batch_size` per PutRecords request), routed to a shard by DataWorks' rule
(`bridge.shard_key(msg)`, the primary-key values or the table name, hashed over the topic's
ACTIVE shard ids, so one key always lands in one shard and keeps its order), and retried with
exponential backoff when DataHub says the failure is transient (throttling, server errors,
connection trouble; per record for a partly failed batch). Credentials come from
`DATAHUB_ACCESS_ID` / `DATAHUB_ACCESS_KEY` unless passed.

DataHub has no local emulator: tests/test_datahub_sink.py answers ListShard and PutRecords from
a loopback HTTP server and decodes the request bodies with pydatahub's own classes.

>>> shard_for("[10001]", ["0", "1", "2"]) in ("0", "1", "2")
True
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Callable

from .blob_encode import shard_key
from .errors import BridgeError, ConversionError

__all__ = ["DataHubSink", "DataHubError", "shard_for", "tuple_shard_key", "ACCESS_ID_ENV", "ACCESS_KEY_ENV",
           "RETRYABLE_CODES"]

ACCESS_ID_ENV = "DATAHUB_ACCESS_ID"
ACCESS_KEY_ENV = "DATAHUB_ACCESS_KEY"
# PutRecords per-record error codes worth another try; anything else is the record's own fault.
RETRYABLE_CODES = frozenset({"LimitExceeded", "InternalServerError", "ServiceUnavailable", "ShardNotReady",
                             "InvalidShardOperation", "ShardSealed", "MalformedRecord.Retry"})
_RESHARD_CODES = frozenset({"InvalidShardOperation", "ShardSealed"})


class DataHubError(BridgeError):
    """DataHub refused records or could not be reached within the retries."""


def _pydatahub():
    try:
        import datahub
    except ImportError:
        raise DataHubError("the DataHub sink needs pydatahub: pip install 'dts-datahub-bridge[datahub]'") from None
    return datahub


def shard_for(key: str, shard_ids: list[str]) -> str:
    """The shard of a key: MD5 of the key modulo the number of shards, over the sorted ids."""
    digest = hashlib.md5(key.encode("utf-8")).digest()
    return shard_ids[int.from_bytes(digest[:8], "big") % len(shard_ids)]


def tuple_shard_key(row: dict, table: str, keys: list[str]) -> str:
    """`shard_key` for a Tuple row: the key columns' values, else the table name."""
    if keys:
        return shard_key({"schema": {"primaryKey": keys}, "payload": {"after": {"dataColumn": row}}})
    return table


def _sort_id(shard_id: str):
    return (0, int(shard_id), "") if shard_id.isdigit() else (1, 0, shard_id)


class DataHubSink:
    """Buffers records and writes them with PutRecords.

    `put_blob(data, key)` takes a Blob message's bytes; `put_tuple(row, key)` a Tuple row (the
    sink needs `record_schema`, the RecordSchema dict bridge.tuple writes). `flush()` sends the
    buffer and returns only when every record is accepted (or raises `DataHubError`).
    `routing="partition-key"` leaves hashing to DataHub instead (record.partition_key = key).
    """

    def __init__(self, endpoint: str, project: str, topic: str, *, access_id: str | None = None,
                 access_key: str | None = None, record_schema: dict | None = None, batch_size: int = 500,
                 max_retries: int = 6, backoff: float = 0.2, max_backoff: float = 10.0, routing: str = "shard",
                 compress: str = "lz4", client=None, sleep: Callable[[float], None] = time.sleep) -> None:
        if routing not in ("shard", "partition-key"):
            raise DataHubError(f"routing must be shard or partition-key, not {routing!r}")
        if batch_size < 1:
            raise DataHubError("batch_size must be at least 1")
        dh = _pydatahub()
        self.project, self.topic, self.routing = project, topic, routing
        self.batch_size, self.max_retries, self.backoff, self.max_backoff = batch_size, max_retries, backoff, max_backoff
        self.sleep = sleep
        if client is None:
            access_id = access_id or os.environ.get(ACCESS_ID_ENV)
            access_key = access_key or os.environ.get(ACCESS_KEY_ENV)
            if not access_id or not access_key:
                raise DataHubError(f"DataHub credentials missing: set {ACCESS_ID_ENV} and {ACCESS_KEY_ENV}")
            from datahub.models.compress import CompressFormat
            fmt = CompressFormat.NONE if compress == "none" else CompressFormat(compress)
            client = dh.DataHub(access_id, access_key, endpoint, compress_format=fmt)
        self.client = client
        self.schema = None
        if record_schema is not None:
            from datahub.models import RecordSchema
            self.schema = RecordSchema.from_json({"fields": record_schema["fields"]})
        self.buffer: list = []
        self.shard_ids: list[str] | None = None
        self.records = self.requests = self.retries = 0

    # -- records ----------------------------------------------------------------------------------
    def put_blob(self, data: bytes, key: str, attributes: dict | None = None) -> None:
        from datahub.models import BlobRecord
        self._put(BlobRecord(blob_data=data), key, attributes)

    def put_tuple(self, row: dict, key: str, attributes: dict | None = None) -> None:
        if self.schema is None:
            raise DataHubError("Tuple records need the topic's RecordSchema (record_schema=...)")
        from datahub.models import TupleRecord
        try:
            record = TupleRecord(schema=self.schema, values=[row.get(f.name) for f in self.schema.field_list])
        except Exception as exc:  # noqa: BLE001 - pydatahub raises its own types for bad values
            raise ConversionError(f"row does not fit the topic's RecordSchema ({exc})") from None
        self._put(record, key, attributes)

    def _put(self, record, key: str, attributes: dict | None) -> None:
        if attributes:
            for name, value in attributes.items():
                record.put_attribute(name, str(value))
        self._route(record, key)
        self.buffer.append((record, key))
        if len(self.buffer) >= self.batch_size:
            self.flush()

    def _route(self, record, key: str) -> None:
        if self.routing == "partition-key":
            record.partition_key = key
            return
        if self.shard_ids is None:
            self.shard_ids = self._active_shards()
        record.shard_id = shard_for(key, self.shard_ids)

    def _active_shards(self) -> list[str]:
        result = self._call(lambda: self.client.list_shard(self.project, self.topic), "ListShard")
        ids = [s.shard_id for s in result.shards if getattr(getattr(s, "state", None), "value", "ACTIVE") == "ACTIVE"]
        if not ids:
            raise DataHubError(f"topic {self.project}/{self.topic} has no ACTIVE shard")
        return sorted(ids, key=_sort_id)

    # -- sending ----------------------------------------------------------------------------------
    def flush(self) -> int:
        """Send every buffered record; returns how many were sent."""
        pending, self.buffer = self.buffer, []
        sent = len(pending)
        attempt = 0
        while pending:
            result = self._call(lambda: self.client.put_records(self.project, self.topic, [r for r, _ in pending]),
                                "PutRecords")
            failed = sorted(result.failed_records or [], key=lambda f: f.index)
            if not failed:
                break
            fatal = [f for f in failed if f.error_code not in RETRYABLE_CODES]
            if fatal:
                f = fatal[0]
                raise DataHubError(f"DataHub rejected {len(fatal)} record(s): {f.error_code}: {f.error_message}",
                                   record=f.index)
            attempt = self._wait(attempt, f"{len(failed)} record(s) failed: {failed[0].error_code}")
            if any(f.error_code in _RESHARD_CODES for f in failed):
                self.shard_ids = None  # shards split or merged: route again
            pending = [pending[f.index] for f in failed]
            for record, key in pending:
                self._route(record, key)
        self.records += sent
        return sent

    def close(self) -> None:
        self.flush()

    def _call(self, request: Callable[[], Any], name: str):
        import requests
        from datahub import exceptions as dx
        transient = (dx.LimitExceededException, dx.InternalServerException, requests.ConnectionError,
                     requests.Timeout, ConnectionError)
        attempt = 0
        while True:
            try:
                self.requests += 1
                return request()
            except transient as exc:
                attempt = self._wait(attempt, f"{name}: {exc}")
            except dx.DatahubException as exc:
                if getattr(exc, "status_code", 0) and exc.status_code >= 500:
                    attempt = self._wait(attempt, f"{name}: {exc}")
                    continue
                raise DataHubError(f"{name} failed: {type(exc).__name__}: {exc}") from None

    def _wait(self, attempt: int, reason: str) -> int:
        if attempt >= self.max_retries:
            raise DataHubError(f"giving up after {attempt} retries: {reason}")
        self.retries += 1
        self.sleep(min(self.max_backoff, self.backoff * (2 ** attempt)))
        return attempt + 1
