"""DataHub out: the one DataHub writer every face uses (`dts-bridge sync`, `deliver`, Spark's `datahub` sink).

Guarantees (docs/kafka.md, "The DataHub writer"):

- **Order per shard.** Records are routed to a shard by DataWorks' rule (`shard_for(key, ids)`: MD5
  of the key over the topic's ACTIVE shard ids) and each shard has one request in flight at a time,
  sent with PutRecordsByShard, which DataHub applies whole or not at all. A retry resends the same
  records, from the first one that did not land, before anything later of that shard: a partial
  failure can never let a later record land first. Shards are written in parallel (`workers`).
- **Bounded memory.** At most `max_buffered` records wait; `put` blocks until the shards drain
  (backpressure reaches the Kafka consumer, which simply stops polling).
- **Rate (AIMD).** Each shard has an allowed request rate, from DataHub's 2,000/s: LimitExceeded
  halves it (to 1/s at least), each acknowledged request adds `rate_step` (1/s) back.
- **Refusals.** With `on_refused`, a request DataHub refuses as malformed (InvalidParameter,
  MalformedRecord) is sent again one record per request; a record refused alone is handed to
  `on_refused` and skipped, the next goes on (the shard's order is kept).
- **Retries.** Throttling (LimitExceeded) and server trouble back off with jitter; a request whose
  outcome is unknown (a timeout, a dropped connection, a 5xx) is checked against the shard's tail
  before it is sent again, so it cannot land twice. Split or merged shards (InvalidShardOperation,
  ShardSealed, NoSuchShard) make the writer wait for the topic's requests in flight, list the shards
  again and route every waiting record anew, in the order it was put.
- **Exactly-once effect across restarts.** Every record carries its source position as attributes
  (`dts.topic`, `dts.pos` = "partition:offset:entry:row"). `resume(source, committed)` tells the
  writer which Kafka offsets were committed; before its first write to a DataHub topic the writer
  reads each shard's tail back to the first committed record and drops every record put again that
  already landed there. This is exact when offsets are committed only after `flush()` and no
  converted record starts at or after a committed offset (what `bridge.sync` does).

DataHub has no local emulator: the tests drive the real pydatahub client against a loopback
stand-in server (tests/support/datahub_standin.py).

>>> shard_for("[10001]", ["0", "1", "2"]) in ("0", "1", "2")
True
>>> Position("dts", 0, 12, 1, 3).key
'0:12:1:3'
"""
from __future__ import annotations

import collections
import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson

from bridge.datahub.calls import (
    ACCESS_ID_ENV,
    ACCESS_KEY_ENV,
    DataHubError,
    Retrying,
    make_client,
    pydatahub,
    shard_state,
    sort_shard_id,
)
from bridge.errors import BridgeError, ConversionError

__all__ = ["DataHubWriter", "DataHubSink", "DataHubError", "OversizedRecord", "Position", "shard_for",
           "tuple_shard_key", "make_client", "MAX_REQUEST_BYTES", "MAX_STRING_BYTES", "ACCESS_ID_ENV", "ACCESS_KEY_ENV", "ATTR_TOPIC", "ATTR_POS", "ATTR_EPOCH"]

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
# A request DataHub refused for its content (a record it finds malformed), not for how it was sent.
_MALFORMED_CODES = frozenset({"InvalidParameter", "MalformedRecord", "InvalidData"})
_RESHARD_CODES = frozenset({"InvalidShardOperation", "ShardSealed", "NoSuchShard"})


class OversizedRecord(ConversionError):
    """A record over DataHub's limits (a request of 4 MB, a STRING value of 2 MB)."""


def shard_for(key: str, shard_ids: list[str]) -> str:
    """The shard of a key: MD5 of the key modulo the number of shards, over the sorted ids."""
    digest = hashlib.md5(key.encode("utf-8")).digest()
    return shard_ids[int.from_bytes(digest[:8], "big") % len(shard_ids)]


def tuple_shard_key(row: dict, table: str, keys: list[str]) -> str:
    """`shard_key` for a Tuple row: the key columns' values, else the table name. DECIMAL values
    (Decimal) go in as their text, as they are written."""
    if keys:
        return orjson.dumps([row.get(k) for k in keys], default=str).decode()
    return table


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
        if len(parts) != 4 or not all(p.lstrip("-").isdigit() for p in parts):
            return None
        return tuple(int(p) for p in parts)  # type: ignore[return-value]


class _Pending:
    __slots__ = ("record", "key", "position", "seq", "size", "topic", "tag", "context", "dropped")

    def __init__(self, record, key: str, position: Position | None, seq: int, size: int) -> None:
        self.record, self.key, self.position, self.seq, self.size = record, key, position, seq, size
        self.topic = None
        self.tag = None  # the caller's label (a table): `halt(tag)` stops records so labelled
        self.context = None  # the caller's, handed back to `on_refused`
        self.dropped = False  # handed to `on_refused` (halted): never sent, even when its batch goes again


class _Shard:
    __slots__ = ("topic", "shard_id", "queue", "busy", "solo", "rate", "next_at")

    def __init__(self, topic: _Topic, shard_id: str, rate: float) -> None:
        self.topic, self.shard_id = topic, shard_id
        self.queue: collections.deque[_Pending] = collections.deque()
        self.busy = False
        self.solo = 0  # records still to send one per request (after a refused request)
        self.rate = rate  # requests per second allowed (AIMD: halved on LimitExceeded, +step on success)
        self.next_at = 0.0


class _Topic:
    def __init__(self, name: str, kind: str, schema) -> None:
        self.name, self.kind, self.schema = name, kind, schema
        self.shard_ids: list[str] = []
        self.shards: dict[str, _Shard] = {}
        self.resharding = False
        self.landed: set[str] | None = None  # positions of ours found past the commit, not yet put again
        self.scanned = False


class DataHubWriter(Retrying):
    """Writes Blob and Tuple records to DataHub topics of one project, ordered per shard and
    idempotent across restarts (see the module docstring).

    `put(topic, key, value, position)`: `value` is a Blob message's bytes or a Tuple row (a dict
    keyed by field name); `key` is the routing key (`shard_key`, `tuple_shard_key`). `flush()`
    returns once DataHub acknowledged every record put before it, or raises `DataHubError`.
    `observer(event, **facts)` hears each request ("request": op, topic, shard, records, seconds,
    outcome) and each retry ("retry": reason, code).
    """

    def __init__(self, client, project: str, *, batch_records: int = 1000,
                 max_request_bytes: int = MAX_REQUEST_BYTES, max_buffered: int = 20_000, workers: int = 4,
                 max_retries: int = 12, backoff: float = 0.1, max_backoff: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep, seed: int | None = None,
                 observer: Callable[..., None] | None = None, create_topics: dict | None = None,
                 on_refused: Callable[[_Pending, str], None] | None = None, max_rate: float = SHARD_MAX_RATE,
                 min_rate: float = 1.0, rate_step: float = 1.0) -> None:
        if batch_records < 1:
            raise DataHubError("batch_records must be at least 1")
        if workers < 1:
            raise DataHubError("workers must be at least 1")
        pydatahub()
        self.client, self.project = client, project
        self.batch_records, self.max_request_bytes, self.max_buffered = batch_records, max_request_bytes, max_buffered
        self.max_retries, self.backoff, self.max_backoff, self.sleep = max_retries, backoff, max_backoff, sleep
        self.rng = random.Random(seed)
        self.observer = observer
        self.create_topics = create_topics  # {"shards": N, "lifecycle": days} creates missing topics
        # on_refused(record, reason): a record DataHub refused as malformed (alone in its request), or
        # one labelled with a halted tag, is handed there and skipped (its shard's order is kept);
        # without it a refused request stops the writer
        self.on_refused = on_refused
        self.max_rate, self.min_rate, self.rate_step = max_rate, min_rate, rate_step
        self.halted: dict = {}  # tag -> halted after this Position (None: all of it)
        self.refused = 0
        self.records = self.requests = self.retries = self.throttled = self.skipped = self.resplits = 0
        self._topics: dict[str, _Topic] = {}
        self._cv = threading.Condition()
        self._ready: collections.deque[_Shard] = collections.deque()
        self._buffered = 0
        self._seq = 0
        self._error: BaseException | None = None
        self._closing = False
        self._source: str | None = None
        self._committed: dict[int, int | None] = {}
        self._epoch: int | None = None
        self._since: int | None = None
        self._threads = [threading.Thread(target=self._work, name=f"datahub-writer-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    # -- set-up ---------------------------------------------------------------------------------
    def resume(self, source: str, committed: dict[int, int | None] | None = None, epoch: int | None = None,
               since_ms: int | None = None) -> None:
        """Records of `source` put again after a restart that already landed are dropped: a shard's
        tail is read back to the first record of `source` below its partition's committed offset
        (`committed[partition]`; None or absent: nothing of that partition was committed).

        With `epoch` (a Spark micro-batch id) every record also carries `dts.epoch`, and the tail is
        read back to the first record of `source` from an earlier epoch instead: a micro-batch
        replayed after a failure finds what its earlier attempt wrote (every record of an earlier
        epoch landed before any of this one, as Spark runs the batches one after another).

        With `since_ms` (the earliest time, DataHub's clock, at which a record landed after the last
        commit could have been written: the oldest partition's commit time less a margin for clock
        skew) the tail is read back to the first record older than that instead, whoever wrote the
        records in between: exact whatever process owned which partition before."""
        with self._cv:
            self._source, self._committed, self._epoch = source, dict(committed or {}), epoch
            self._since = since_ms
            for topic in self._topics.values():
                topic.scanned = False

    def covered(self, offsets: dict[int, int]) -> bool:
        """Whether committing `offsets` is safe: no record found in a shard's tail (landed after the
        last commit, not yet put again) lies at or past them. Committing past such a record before
        the run reached it again would put newer committed records after it in the shard, where the
        next restart's tail scan would stop before finding it. Those below `offsets` are dropped:
        the commit covers them."""
        with self._cv:
            for topic in self._topics.values():
                for key in list(topic.landed or ()):
                    pos = Position.parse(key)
                    limit = offsets.get(pos[0]) if pos else None
                    if limit is None:
                        continue
                    if pos[1] >= limit:
                        return False
            for topic in self._topics.values():
                for key in list(topic.landed or ()):
                    pos = Position.parse(key)
                    limit = offsets.get(pos[0]) if pos else None
                    if limit is not None and pos[1] < limit:
                        topic.landed.discard(key)
        return True

    def topic(self, name: str, record_schema: dict | None = None, check: bool = True) -> _Topic:
        """The topic's facts, read once (its type and, for Tuple, its RecordSchema); with
        `create_topics` a missing topic is created (Tuple with `record_schema`). `check`: an existing
        Tuple topic whose fields clash with `record_schema` is an error (bridge.sync compares per row
        under its schema-change policy instead)."""
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        pydatahub()
        try:
            info = self.call(lambda: self.client.get_topic(self.project, name), "GetTopic")
        except DataHubError as err:
            if self.create_topics is None or "NoSuchTopic" not in str(err) and "not exist" not in str(err).lower():
                raise
            info = self._create(name, record_schema)
        kind = str(getattr(info.record_type, "value", info.record_type)).upper()
        schema = info.record_schema if kind == "TUPLE" else None
        if kind == "TUPLE" and schema is None:
            raise DataHubError(f"Tuple topic {self.project}/{name} has no RecordSchema")
        if kind == "TUPLE" and record_schema is not None and check:
            # Fields are matched by name: a field both have must have one type; one the rows lack must
            # take NULL; one the topic lacks is the caller's to append (a column added by DDL).
            want = {f["name"]: f["type"].upper() for f in record_schema["fields"]}
            have = {f.name: str(getattr(f.type, "value", f.type)).upper() for f in schema.field_list}
            clash = [n for n, t in want.items() if n in have and have[n] != t]
            required = [f.name for f in schema.field_list if f.name not in want and not getattr(f, "allow_null", True)]
            if clash or required:
                raise DataHubError(f"topic {self.project}/{name} has RecordSchema {sorted(have.items())}, the rows need "
                                   f"{sorted(want.items())} ({'types differ for ' + ', '.join(clash) if clash else ''}"
                                   f"{'; ' if clash and required else ''}"
                                   f"{'NOT NULL fields the rows lack: ' + ', '.join(required) if required else ''})")
        topic = _Topic(name, kind, schema)
        topic.shard_ids = self._active_shards(name)
        with self._cv:
            self._topics.setdefault(name, topic)
            return self._topics[name]

    def append_fields(self, name: str, fields: list[tuple[str, str]]) -> None:
        """Add nullable fields (name, DataHub type) to a Tuple topic, after everything queued for it
        landed (records built on the old RecordSchema go first), and read its RecordSchema again."""
        from datahub.models import FieldType
        self.flush()
        # read afresh: another writer (a Spark task of another Kafka partition) may have appended them
        have = {f.name for f in self._refresh_schema(self.topic(name)).field_list}
        for field, kind in fields:
            if field in have:
                continue
            try:
                self.call(lambda: self.client.append_field(self.project, name, field, FieldType(kind.lower())),
                           "AppendField")
            except DataHubError:
                # appended by another writer in between: done, if with the same type
                now = {f.name: str(getattr(f.type, "value", f.type)).upper()
                       for f in self._refresh_schema(self.topic(name)).field_list}
                if now.get(field) != kind.upper():
                    raise
        self._refresh_schema(self.topic(name))

    def _refresh_schema(self, topic: _Topic):
        """The Tuple topic's RecordSchema read again (fields other writers appended)."""
        info = self.call(lambda: self.client.get_topic(self.project, topic.name), "GetTopic")
        with self._cv:
            topic.schema = info.record_schema
        return topic.schema

    def _caught_up(self, topic: _Topic, batch: list[_Pending]) -> bool:
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

    def _create(self, name: str, record_schema: dict | None):
        from datahub.models import RecordSchema
        shards, lifecycle = self.create_topics.get("shards", 1), self.create_topics.get("lifecycle", 7)
        if record_schema is None:
            op = lambda: self.client.create_blob_topic(self.project, name, shards, lifecycle, "dts-bridge")  # noqa: E731
        else:
            schema = RecordSchema.from_json({"fields": record_schema["fields"]})
            op = lambda: self.client.create_tuple_topic(self.project, name, shards, lifecycle, schema,  # noqa: E731
                                                         "dts-bridge")
        try:
            self.call(op, "CreateTopic")
        except DataHubError as err:
            if "AlreadyExist" not in str(err):
                raise
        return self.call(lambda: self.client.get_topic(self.project, name), "GetTopic")

    def _active_shards(self, name: str) -> list[str]:
        result = self.call(lambda: self.client.list_shard(self.project, name), "ListShard")
        ids = [s.shard_id for s in result.shards if shard_state(s) == "ACTIVE"]
        if not ids:
            raise DataHubError(f"topic {self.project}/{name} has no ACTIVE shard")
        return sorted(ids, key=sort_shard_id)

    # -- records --------------------------------------------------------------------------------
    def put(self, topic: str, key: str, value, position: Position | None = None,
            attributes: dict | None = None) -> bool:
        """Queue one record; False when it already landed before a restart (and is dropped)."""
        prepared = self.prepare(topic, key, value, position, attributes)
        return self.put_prepared(prepared) if prepared is not None else False

    def prepare(self, topic: str, key: str, value, position: Position | None = None,
                attributes: dict | None = None, tag=None, context=None) -> _Pending | None:
        """Build a record and check it fits (a ConversionError if not), without queueing it; None
        when it already landed before a restart. Callers that must put all of an Entry's records or
        none prepare them all first."""
        self._raise_pending()
        info = self.topic(topic)
        if position is not None and self._source is not None and not info.scanned:
            self._scan(info)
        if position is not None and info.landed and position.key in info.landed:
            info.landed.discard(position.key)
            self.skipped += 1
            return None
        record, size = self._record(info, value)
        if attributes:
            for name, val in attributes.items():
                record.put_attribute(name, str(val))
        if position is not None:
            record.put_attribute(ATTR_TOPIC, position.source)
            record.put_attribute(ATTR_POS, position.key)
            size += 24 + len(position.source) + len(position.key)
            if self._epoch is not None:
                record.put_attribute(ATTR_EPOCH, str(self._epoch))
                size += 16
        if size > self.max_request_bytes:
            raise OversizedRecord(f"record of {size} bytes exceeds DataHub's request limit "
                                  f"({self.max_request_bytes} bytes)")
        pending = _Pending(record, key, position, 0, size)
        pending.topic, pending.tag, pending.context = info, tag, context
        return pending

    def halt(self, tag, after: Position | None = None) -> None:
        """Records labelled `tag` not yet sent go to `on_refused` instead ("halted"), in order: with
        `after`, only those of its partition past it, and those of other partitions."""
        with self._cv:
            self.halted.setdefault(tag, after)

    def _is_halted(self, pending: _Pending) -> bool:
        if pending.tag not in self.halted:
            return False
        after, pos = self.halted[pending.tag], pending.position
        if after is None or pos is None or pos.partition != after.partition:
            return True
        return (pos.offset, pos.entry, pos.row) > (after.offset, after.entry, after.row)

    def put_prepared(self, pending: _Pending) -> bool:
        with self._cv:
            while self._buffered >= self.max_buffered and self._error is None:
                self._cv.wait()
            self._raise_pending_locked()
            self._seq += 1
            pending.seq = self._seq
            shard = self._route(pending.topic, pending.key)
            shard.queue.append(pending)
            self._buffered += 1
            if not shard.busy and len(shard.queue) == 1:
                self._ready.append(shard)
                self._cv.notify_all()
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

    def _route(self, info: _Topic, key: str) -> _Shard:
        shard_id = shard_for(key, info.shard_ids)
        shard = info.shards.get(shard_id)
        if shard is None:
            shard = info.shards[shard_id] = _Shard(info, shard_id, self.max_rate)
        return shard

    def flush(self) -> None:
        """Wait until every record put so far is acknowledged (or raise what stopped a shard)."""
        with self._cv:
            while self._buffered and self._error is None:
                self._cv.wait()
            self._raise_pending_locked()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.stop()

    def stop(self, wait: float | None = None) -> None:
        """End the workers; records not yet acknowledged are abandoned (a restart resends them).
        `wait` (seconds): also wait for the requests in flight to come back, so that nothing of this
        writer lands after `stop` returns (a retry that is due gives up instead)."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if wait is not None:
            deadline = time.monotonic() + wait
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def error(self) -> BaseException | None:
        """What a worker thread failed with (raised by the next put, flush or stop), else None."""
        return self._error

    def _raise_pending(self) -> None:
        with self._cv:
            self._raise_pending_locked()

    def _raise_pending_locked(self) -> None:
        if self._error is not None:
            err = self._error
            raise err if isinstance(err, BridgeError) else DataHubError(f"DataHub writer failed: {err}")

    # -- the workers ----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cv:
                shard = None
                while shard is None:
                    if self._closing:
                        return
                    for candidate in self._ready:
                        if not candidate.topic.resharding:
                            shard = candidate
                            break
                    if shard is None:
                        self._cv.wait()
                self._ready.remove(shard)
                shard.busy = True
                batch = self._batch(shard)
            try:
                outcome = self._send(shard, batch)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller of put/flush
                with self._cv:
                    shard.busy = False
                    if self._error is None:
                        self._error = exc
                    self._cv.notify_all()
                continue
            with self._cv:
                shard.busy = False
                if outcome == "split":  # refused: the same records again, one per request
                    shard.solo = len(batch)
                    self._ready.append(shard)
                    self._cv.notify_all()
                    continue
                if outcome != "reshard":
                    for _ in batch:
                        shard.queue.popleft()
                    self._buffered -= len(batch)
                    self.records += outcome
                    shard.solo = max(0, shard.solo - len(batch))
                    if shard.queue:
                        self._ready.append(shard)
                    self._cv.notify_all()
                    continue
            self._reshard(shard.topic)

    def _batch(self, shard: _Shard) -> list[_Pending]:
        if shard.solo:
            return [shard.queue[0]]
        batch, size = [], 0
        for item in shard.queue:
            if batch and (len(batch) >= self.batch_records or size + item.size > self.max_request_bytes):
                break
            batch.append(item)
            size += item.size
        return batch

    def _send(self, shard: _Shard, batch: list[_Pending]):
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
        while True:
            if unsure and self._landed_already(shard, batch, first_sent_ms):
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
            attempt = self._wait(attempt, f"PutRecordsByShard to {topic.name}/{shard.shard_id}: {code}", code)

    def _refuse(self, pending: _Pending, reason: str) -> None:
        self.refused += 1
        self.on_refused(pending, reason)

    def _pace(self, shard: _Shard) -> None:
        """Keep the shard under its allowed request rate (AIMD, see `_Shard.rate`)."""
        now = time.monotonic()
        if shard.next_at > now:
            self.sleep(shard.next_at - now)
            now = time.monotonic()
        shard.next_at = max(now, shard.next_at) + 1.0 / shard.rate

    def _landed_already(self, shard: _Shard, batch: list[_Pending], since_ms: int | None) -> bool:
        """After an answer-less attempt: did the request land? PutRecordsByShard is all or nothing,
        so it landed iff the batch's last record is in the shard. Other writers (Spark tasks of other
        Kafka partitions) may have appended since, so the tail is read back, newest first, to the
        records written before the first attempt (less a clock margin), not just the last one."""
        last = batch[-1].position
        if last is None:
            return False  # no position to recognise it by: at-least-once for such records
        floor = None if since_ms is None else since_ms - LOST_ANSWER_MARGIN_MS
        for record in self._newest_first(shard.topic, shard.shard_id, 16):
            attrs = record.attributes or {}
            if attrs.get(ATTR_POS) == last.key and attrs.get(ATTR_TOPIC) == last.source:
                return True
            if floor is not None and (getattr(record, "system_time", None) or 0) < floor:
                return False  # written before the first attempt: it cannot be further back
        return False

    def _newest_first(self, topic: _Topic, shard_id: str, window: int) -> Iterator:
        """A shard's records from the newest back, read in windows growing fourfold (a reader that
        stops early reads little)."""
        latest = self._sequence(topic, shard_id, "LATEST")
        if latest is None:
            return
        oldest = self._sequence(topic, shard_id, "OLDEST") or 0
        end = latest
        while end >= oldest:
            start = max(oldest, end - window + 1)
            yield from reversed(self._read(topic, shard_id, start, end - start + 1))
            end, window = start - 1, window * 4

    def _reshard(self, topic: _Topic) -> None:
        """The topic's shards changed: wait for its requests in flight, list the shards again and
        route every waiting record anew, in the order it was put."""
        with self._cv:
            if topic.resharding:
                return
            topic.resharding = True
            while any(s.busy for s in topic.shards.values()):
                self._cv.wait()
        try:
            ids = self._active_shards(topic.name)
        except BaseException as exc:  # noqa: BLE001
            with self._cv:
                topic.resharding = False
                self._error = self._error or exc
                self._cv.notify_all()
            return
        with self._cv:
            waiting = sorted((p for s in topic.shards.values() for p in s.queue), key=lambda p: p.seq)
            for shard in topic.shards.values():
                shard.queue.clear()
                if shard in self._ready:
                    self._ready.remove(shard)
            topic.shard_ids = ids
            topic.shards = {sid: s for sid, s in topic.shards.items() if sid in ids}
            for item in waiting:
                self._route(topic, item.key).queue.append(item)
            for shard in topic.shards.values():
                if shard.queue:
                    self._ready.append(shard)
            topic.resharding = False
            self.resplits += 1
            self._cv.notify_all()

    # -- the tail of a shard --------------------------------------------------------------------
    def _scan(self, topic: _Topic) -> None:
        """Collect the positions of `source`'s records that landed past the committed offsets."""
        landed: set[str] = set()
        shards = self.call(lambda: self.client.list_shard(self.project, topic.name), "ListShard").shards
        for shard in shards:
            landed |= self._scan_shard(topic, shard.shard_id)
        with self._cv:
            topic.landed, topic.scanned = landed, True

    def _scan_shard(self, topic: _Topic, shard_id: str) -> set[str]:
        found: set[str] = set()
        for record in self._newest_first(topic, shard_id, 64):
            if self._since is not None and (getattr(record, "system_time", None) or 0) < self._since:
                return found  # written before the oldest commit: nothing after the commits is older
            attrs = record.attributes or {}
            if attrs.get(ATTR_TOPIC) != self._source:
                continue  # another writer's record
            pos = Position.parse(attrs.get(ATTR_POS, ""))
            if pos is None:
                continue
            if self._epoch is None and self._committed and pos[0] not in self._committed:
                continue  # a partition another process owns: neither ours to skip nor a boundary
            if self._epoch is not None:
                epoch = attrs.get(ATTR_EPOCH, "")
                if not epoch.lstrip("-").isdigit() or int(epoch) < self._epoch:
                    return found  # an earlier micro-batch: everything before it landed before this one
            else:
                committed = self._committed.get(pos[0])
                if committed is not None and pos[1] < committed:
                    if self._since is not None:
                        continue  # committed; the time bound ends the scan
                    return found  # everything before this landed before the last commit
            found.add(f"{pos[0]}:{pos[1]}:{pos[2]}:{pos[3]}")
        return found

    def read_topic(self, topic: str, window: int = 1000) -> Iterator:
        """Every record of `topic`, shard by shard in sequence order, read `window` records at a
        time (a topic that keeps growing is never held whole in memory)."""
        info = self.topic(topic)
        shards = self.call(lambda: self.client.list_shard(self.project, topic), "ListShard").shards
        for shard in sorted(shards, key=lambda s: (len(s.shard_id), s.shard_id)):
            latest = self._sequence(info, shard.shard_id, "LATEST")
            if latest is None:
                continue
            start = self._sequence(info, shard.shard_id, "OLDEST") or 0
            while start <= latest:
                chunk = self._read(info, shard.shard_id, start, min(window, latest - start + 1))
                if not chunk:
                    break
                yield from chunk
                last = getattr(chunk[-1], "sequence", None)
                start = last + 1 if isinstance(last, int) and last >= start else start + len(chunk)

    def _sequence(self, topic: _Topic, shard_id: str, kind: str) -> int | None:
        from datahub import exceptions as dx
        from datahub.models import CursorType
        try:
            result = self.call(lambda: self.client.get_cursor(self.project, topic.name, shard_id,
                                                               CursorType[kind]), "GetCursor", raw=True)
        except (dx.SeekOutOfRangeException, dx.InvalidCursorException, dx.InvalidParameterException):
            return None  # an empty shard has no cursor
        sequence = getattr(result, "sequence", -1)
        return None if sequence is None or sequence < 0 else sequence

    def _read(self, topic: _Topic, shard_id: str, start: int, count: int) -> list:
        from datahub.models import CursorType
        cursor = self.call(lambda: self.client.get_cursor(self.project, topic.name, shard_id, CursorType.SEQUENCE,
                                                           start), "GetCursor").cursor
        out: list = []
        while len(out) < count:
            want = min(1000, count - len(out))
            if topic.kind == "BLOB":
                result = self.call(lambda: self.client.get_blob_records(self.project, topic.name, shard_id, cursor,
                                                                         want), "GetRecords")
            else:
                result = self.call(lambda: self.client.get_tuple_records(self.project, topic.name, shard_id,
                                                                          topic.schema, cursor, want), "GetRecords")
            if not result.records:
                break
            out.extend(result.records)
            cursor = result.next_cursor
        return out[:count]


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
