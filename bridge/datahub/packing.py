"""Packing records into PutRecordsByShard requests and sending one until it lands.

A request holds up to `batch_records` records and `max_request_bytes` (DataHub takes 4 MB per
request); records that do not fit a request are `OversizedRecord`s before they are queued. A
request refused as malformed is sent again one record per request; a record refused alone goes to
`on_refused`. Each shard is paced under its allowed rate (AIMD: LimitExceeded halves it, each
acknowledged request adds `rate_step`). A request whose outcome is unknown is checked against the
shard's tail (`_landed_already`, bridge.datahub.resume) before it is sent again.
"""
from __future__ import annotations

import time

from bridge.datahub.calls import DataHubError
from bridge.datahub.records import MAX_STRING_BYTES, OversizedRecord, Pending
from bridge.datahub.routing import _Shard, _Topic
from bridge.errors import ConversionError

__all__ = ["RequestPacking"]

# A request DataHub refused for its content (a record it finds malformed), not for how it was sent.
_MALFORMED_CODES = frozenset({"InvalidParameter", "MalformedRecord", "InvalidData"})
_RESHARD_CODES = frozenset({"InvalidShardOperation", "ShardSealed", "NoSuchShard"})



class RequestPacking:
    """The writer's requests (a mixin of `DataHubWriter`, whose state and counters it uses)."""

    def _refresh_schema(self, topic: _Topic):
        """The Tuple topic's RecordSchema read again (fields other writers appended)."""
        info = self.call(lambda: self.client.get_topic(self.project, topic.name), "GetTopic")
        with self._cv:
            topic.schema = info.record_schema
        return topic.schema

    def _caught_up(self, topic: _Topic, batch: list[Pending]) -> bool:
        """A Tuple request refused as malformed: when another writer appended fields since its
        records were built (their values one per old field), the records take NULLs for the new
        fields and go again (True); else (False) the refusal stands."""
        if topic.kind != "TUPLE":
            return False
        from datahub.models import TupleRecord
        schema = self._refresh_schema(topic)
        fields = schema.field_list
        old = [r.record.values for r in batch]
        names = [f.name for f in fields]
        grew = [len(v) < len(fields) for v in old]
        if not any(grew):
            return False
        for item, values in zip(batch, old):
            before = item.record.field_list
            if [f.name for f in before] != names[:len(before)]:
                return False  # not an append: leave the refusal to the caller
            record = TupleRecord(schema=schema, values=list(values) + [None] * (len(fields) - len(values)))
            for key, value in (item.record.attributes or {}).items():
                record.put_attribute(key, value)
            item.record = record
        return True

    def _record(self, info: _Topic, value):
        from datahub.models import BlobRecord, TupleRecord
        if info.kind == "BLOB":
            if not isinstance(value, (bytes, bytearray)):
                raise ConversionError(f"topic {info.name} is a Blob topic: a record needs bytes")
            return BlobRecord(blob_data=bytes(value)), len(value) * 4 // 3 + 64
        if not isinstance(value, dict):
            raise ConversionError(f"topic {info.name} is a Tuple topic: a record needs a row")
        schema = info.schema  # read once: a worker may read it afresh meanwhile (_caught_up)
        names = schema.field_list
        extra = set(value) - {f.name for f in names}
        if extra:
            raise ConversionError(f"topic {info.name} has no field for {sorted(extra)}: its RecordSchema differs "
                                  f"from the row's")
        values = [value.get(f.name) for f in names]
        for field, v in zip(names, values):
            if isinstance(v, str) and len(v) * 3 > MAX_STRING_BYTES and len(v.encode("utf-8")) > MAX_STRING_BYTES:
                raise OversizedRecord(f"field {field.name} holds {len(v.encode('utf-8'))} bytes, over DataHub's "
                                      f"STRING limit ({MAX_STRING_BYTES} bytes)")
        try:
            record = TupleRecord(schema=schema, values=values)
        except Exception as exc:  # noqa: BLE001 - pydatahub raises its own types for bad values
            raise ConversionError(f"row does not fit the RecordSchema of {info.name} ({exc})") from None
        return record, 64 + sum(len(str(v)) + 8 for v in values if v is not None)

    def _batch(self, shard: _Shard) -> list[Pending]:
        if shard.solo:
            return [shard.queue[0]]
        batch, size = [], 0
        for item in shard.queue:
            if batch and (len(batch) >= self.batch_records or size + item.size > self.max_request_bytes):
                break
            batch.append(item)
            size += item.size
        return batch

    def _send(self, shard: _Shard, batch: list[Pending]):
        """Put `batch` to its shard until it lands: the number of records that landed (halted or
        refused ones are handed to `on_refused`), "split" when DataHub refused a request of several
        records as malformed (they go again one per request), "reshard" when the shard is gone."""
        import requests
        from datahub import exceptions as dx
        topic, attempt, unsure = shard.topic, 0, False
        if self.halted and self.on_refused is not None:
            for p in batch:
                if not p.dropped and self._is_halted(p):
                    p.dropped = True
                    self._refuse(p, "halted")
            batch = [p for p in batch if not p.dropped]
            if not batch:
                return 0
        records = [p.record for p in batch]
        first_sent_ms = None  # wall clock of the first attempt: how far back a lost answer is looked for
        failing = None  # monotonic time of the first failure (the retry timeout counts from it)
        name = f"PutRecordsByShard to {topic.name}/{shard.shard_id}"
        while True:
            if unsure:
                with self.on_behalf_of(name, failing):  # its errors name this request, within its deadline
                    landed = self._landed_already(shard, batch, first_sent_ms)
                if landed:
                    self._succeeded()
                    return len(batch)
            self._pace(shard)
            started = time.monotonic()
            if first_sent_ms is None:
                first_sent_ms = int(time.time() * 1000)
            code = None
            try:
                self.requests += 1
                self.client.put_records_by_shard(self.project, topic.name, shard.shard_id, records)
                self._observe("request", op="PutRecordsByShard", topic=topic.name, shard=shard.shard_id,
                              records=len(batch), seconds=time.monotonic() - started, outcome="ok")
                shard.rate = min(self.max_rate, shard.rate + self.rate_step)
                if failing is not None:
                    self._succeeded()
                return len(batch)
            except dx.LimitExceededException:
                code = "LimitExceeded"  # this attempt did not land; an earlier answer-less one still may have
                self.throttled += 1
                shard.rate = max(self.min_rate, shard.rate / 2)
            except (requests.ConnectionError, requests.Timeout, ConnectionError, dx.TimeoutException) as exc:
                code, unsure = type(exc).__name__, True
            except dx.DatahubException as exc:
                code = getattr(exc, "error_code", None) or type(exc).__name__
                status = getattr(exc, "status_code", 0) or 0
                if code in _RESHARD_CODES or isinstance(exc, dx.ShardSealedException):
                    self._observe("request", op="PutRecordsByShard", topic=topic.name, shard=shard.shard_id,
                                  records=len(batch), seconds=time.monotonic() - started, outcome=code)
                    return "reshard"
                if status < 500 and code in _MALFORMED_CODES and self._caught_up(topic, batch):
                    records = [p.record for p in batch]
                    continue
                if status < 500 and self.on_refused is not None and code in _MALFORMED_CODES:
                    self._observe("request", op="PutRecordsByShard", topic=topic.name, shard=shard.shard_id,
                                  records=len(batch), seconds=time.monotonic() - started, outcome=code)
                    if len(batch) > 1:
                        return "split"
                    self._refuse(batch[0], f"DataHub refused the record: {code}: "
                                           f"{getattr(exc, 'error_msg', None) or exc}")
                    return 0
                if status < 500 and not isinstance(exc, dx.InternalServerException):
                    first = batch[0].position
                    where = f" (first record at {first.source} {first.key})" if first else ""
                    raise DataHubError(f"DataHub refused a request to {self.project}/{topic.name} shard "
                                       f"{shard.shard_id}{where}: {code}: {exc}") from None
                unsure = True
            self._observe("request", op="PutRecordsByShard", topic=topic.name, shard=shard.shard_id,
                          records=len(batch), seconds=time.monotonic() - started, outcome=code)
            failing = failing or time.monotonic()
            attempt = self._wait(attempt, f"{name}: {code}", code, since=failing)

    def _refuse(self, pending: Pending, reason: str) -> None:
        self.refused += 1
        self.on_refused(pending, reason)

    def _pace(self, shard: _Shard) -> None:
        """Keep the shard under its allowed request rate (AIMD, see `_Shard.rate`)."""
        now = time.monotonic()
        if shard.next_at > now:
            self.sleep(shard.next_at - now)
            now = time.monotonic()
        shard.next_at = max(now, shard.next_at) + 1.0 / shard.rate

