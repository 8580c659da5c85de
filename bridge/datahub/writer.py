"""The DataHub writer every face uses (`dts-bridge sync`, `deliver`, Spark's `datahub` sink).

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
  ShardSealed, NoSuchShard) make the writer stop the topic's requests, wait for those in flight,
  list the shards again and move the records waiting for shards no longer ACTIVE to their heirs
  (children of a split, the shard of a merge), in the order they were put; records waiting for
  shards that stay ACTIVE stay (`_reshard`, below; docs/kafka.md "Writing through splits and
  merges"). So per shard records land in put order through resharding too.
- **Exactly-once effect across restarts.** Every record carries its source position as attributes
  (`dts.topic`, `dts.pos` = "partition:offset:entry:row"). `resume(source, committed)` tells the
  writer which Kafka offsets were committed; before its first write to a DataHub topic the writer
  reads each shard's tail back to the first committed record and drops every record put again that
  already landed there. This is exact when offsets are committed only after `flush()` and no
  converted record starts at or after a committed offset (what `bridge.sync` does).

DataHub has no local emulator: the tests drive the real pydatahub client against a loopback
stand-in server (tests/support/datahub_standin.py).

The writer is one class over four modules along its seams (docs/decisions.md): routing
(bridge/datahub/routing.py), request packing and sending (packing.py), the restart look (resume.py)
and, here, the queue, the worker threads and the acknowledgements.
"""
from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable

from bridge.datahub.calls import BY_COUNT, DataHubError, Retrying, pydatahub, shard_state, sort_shard_id
from bridge.datahub.packing import RequestPacking
from bridge.datahub.records import (
    ATTR_EPOCH,
    ATTR_POS,
    ATTR_TOPIC,
    MAX_REQUEST_BYTES,
    SHARD_MAX_RATE,
    OversizedRecord,
    Pending,
    Position,
)
from bridge.datahub.resume import TailLook
from bridge.datahub.routing import ShardRouting, _Shard, _Topic, shard_for
from bridge.errors import BridgeError

__all__ = ["DataHubWriter", "LINGER"]

# How long a shard's request waits for more records (Kafka's producer has linger.ms for the same
# reason): 50 ms adds at most that to a record's latency, never to a flush, and lets a request
# fill while records come slower than DataHub takes them (tests/test_datahub_writer.py counts).
LINGER = 0.05


class DataHubWriter(ShardRouting, RequestPacking, TailLook, Retrying):
    """Writes Blob and Tuple records to DataHub topics of one project, ordered per shard and
    idempotent across restarts (see the module docstring).

    `put(topic, key, value, position)`: `value` is a Blob message's bytes or a Tuple row (a dict
    keyed by field name); `key` is the routing key (`shard_key`, `tuple_shard_key`). `flush()`
    returns once DataHub acknowledged every record put before it, or raises `DataHubError`.
    `observer(event, **facts)` hears each request ("request": op, topic, shard, records, seconds,
    outcome), each retry ("retry": reason, code), an outage ("degraded": request, reason, seconds;
    then "recovered": request, seconds) and the restart look ("look", see `resume`).
    `retry_timeout`: seconds a failing request is retried (None or -1: for ever, what `dts-bridge
    sync` uses); not given, `max_retries` bounds the retries.
    """

    def __init__(self, client, project: str, *, batch_records: int = 1000,
                 max_request_bytes: int = MAX_REQUEST_BYTES, max_buffered: int = 20_000, workers: int = 4,
                 max_retries: int = 12, backoff: float = 0.1, max_backoff: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep, seed: int | None = None,
                 observer: Callable[..., None] | None = None, create_topics: dict | None = None,
                 on_refused: Callable[[Pending, str], None] | None = None, max_rate: float = SHARD_MAX_RATE,
                 min_rate: float = 1.0, rate_step: float = 1.0, retry_timeout: float | None | str = BY_COUNT,
                 linger: float = LINGER) -> None:
        if batch_records < 1:
            raise DataHubError("batch_records must be at least 1")
        if workers < 1:
            raise DataHubError("workers must be at least 1")
        pydatahub()
        self.client, self.project = client, project
        self.batch_records, self.max_request_bytes, self.max_buffered = batch_records, max_request_bytes, max_buffered
        self.max_retries, self.backoff, self.max_backoff, self.sleep = max_retries, backoff, max_backoff, sleep
        # seconds a failing request is retried (None or -1: for ever); BY_COUNT: max_retries times
        self.retry_timeout = None if retry_timeout is not None and retry_timeout != BY_COUNT and \
            retry_timeout < 0 else retry_timeout
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
        self._since_of: dict[int, int | None] = {}
        self.look_reads = 0
        # a shard's request waits up to `linger` seconds for more records unless it is full (batch_records,
        # max_request_bytes) or someone waits for it (flush, a full buffer, stop): dense requests when
        # records come slower than DataHub takes them (Tuple rows convert slower than Blob lines)
        self.linger = linger
        self._urgent = 0  # flushes (and puts blocked on a full buffer) waiting
        self._acks: dict[int, _Outstanding] = {}  # per source partition: records put, not yet done
        # per topic: the shards DataHub refused as split, merged or gone since the last reshard, each
        # with the first record of the refused request (for the errors)
        self._refused: dict[str, dict[str, Pending]] = {}
        self._threads = [threading.Thread(target=self._work, name=f"datahub-writer-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    # -- set-up ---------------------------------------------------------------------------------

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

    # -- records --------------------------------------------------------------------------------

    def put(self, topic: str, key: str, value, position: Position | None = None,
            attributes: dict | None = None) -> bool:
        """Queue one record; False when it already landed before a restart (and is dropped)."""
        prepared = self.prepare(topic, key, value, position, attributes)
        return self.put_prepared(prepared) if prepared is not None else False

    def prepare(self, topic: str, key: str, value, position: Position | None = None,
                attributes: dict | None = None, tag=None, context=None) -> Pending | None:
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
        pending = Pending(record, key, position, 0, size)
        pending.topic, pending.tag, pending.context = info, tag, context
        return pending

    def halt(self, tag, after: Position | None = None) -> None:
        """Records labelled `tag` not yet sent go to `on_refused` instead ("halted"), in order: with
        `after`, only those of its partition past it, and those of other partitions."""
        with self._cv:
            self.halted.setdefault(tag, after)

    def _is_halted(self, pending: Pending) -> bool:
        if pending.tag not in self.halted:
            return False
        after, pos = self.halted[pending.tag], pending.position
        if after is None or pos is None or pos.partition != after.partition:
            return True
        return (pos.offset, pos.entry, pos.row) > (after.offset, after.entry, after.row)

    def put_prepared(self, pending: Pending) -> bool:
        with self._cv:
            if self._buffered >= self.max_buffered:
                self._urgent += 1
                self._cv.notify_all()
                try:
                    while self._buffered >= self.max_buffered and self._error is None:
                        self._cv.wait()
                finally:
                    self._urgent -= 1
            self._raise_pending_locked()
            self._seq += 1
            pending.seq = self._seq
            pending.at = time.monotonic()
            shard = self._route(pending.topic, pending.key)
            shard.queue.append(pending)
            shard.last = pending.seq
            shard.bytes += pending.size
            self._buffered += 1
            if pending.position is not None:
                marks = self._acks.get(pending.position.partition)
                if marks is None:
                    marks = self._acks[pending.position.partition] = _Outstanding()
                marks.add(pending.position.offset)
            if not shard.busy and len(shard.queue) == 1:
                self._ready.append(shard)
                self._cv.notify_all()
            elif self.linger and len(shard.queue) == self.batch_records:
                self._cv.notify_all()  # a lingering request is full now
        return True

    def acknowledged(self) -> dict[int, int]:
        """The acknowledgement watermark: per source partition (a `Position`'s) that has records
        put and not yet done, the offset of the first of them. Every record of that partition put
        below it is done: acknowledged by DataHub, handed to `on_refused` (refused or halted: a dead
        letter), or dropped at `prepare` as already landed; so an Entry counts only once all its
        records are done. A partition absent from the answer has nothing outstanding. A pipeline
        may commit, per partition, min(next to read, first held, this) without a `flush()`.
        Raises what stopped the writer, as `flush` does."""
        with self._cv:
            self._raise_pending_locked()
            return {p: first for p, marks in self._acks.items() if (first := marks.first()) is not None}

    @property
    def acked(self) -> int:
        """Records DataHub acknowledged so far (landed; not those found already there)."""
        return self.records

    @property
    def queued(self) -> int:
        """Records put and not yet done (waiting or in flight)."""
        return self._buffered

    def flush(self) -> None:
        """Wait until every record put so far is acknowledged (or raise what stopped a shard)."""
        with self._cv:
            self._urgent += 1
            self._cv.notify_all()
            try:
                while self._buffered and self._error is None:
                    self._cv.wait()
            finally:
                self._urgent -= 1
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
    def _due(self, shard: _Shard, now: float) -> float:
        """When the shard's next request should go: now when it is full, urgent or not lingering,
        else when its oldest record has waited `linger`."""
        if not self.linger or self._urgent or shard.solo or len(shard.queue) >= self.batch_records \
                or shard.bytes >= self.max_request_bytes or not shard.queue:
            return now
        return shard.queue[0].at + self.linger


    def _work(self) -> None:
        while True:
            with self._cv:
                shard = None
                while shard is None:
                    if self._closing:
                        return
                    now, wake = time.monotonic(), None
                    for candidate in self._ready:
                        if candidate.topic.resharding:
                            continue
                        due = self._due(candidate, now)
                        if due <= now:
                            shard = candidate
                            break
                        wake = due if wake is None else min(wake, due)
                    if shard is None:
                        self._cv.wait(None if wake is None else wake - now)
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
                    for item in batch:  # landed, refused (handed to on_refused) or halted: done
                        shard.queue.popleft()
                        shard.bytes -= item.size
                        if item.position is not None:
                            self._acks[item.position.partition].done(item.position.offset)
                    self._buffered -= len(batch)
                    self.records += outcome
                    shard.solo = max(0, shard.solo - len(batch))
                    if shard.queue:
                        self._ready.append(shard)
                    self._cv.notify_all()
                    continue
                # refused: the shard is CLOSED (split, merged) or gone. Its records stay queued (the
                # batch was not popped); the topic stops sending at once (no other request of it can
                # go out on the old routing), and the refusal is noted for the reshard to check.
                # Every worker waiting in `_reshard` for this shard to be idle hears it (before, the
                # missing notify left a reshard waiting for ever when two shards closed at once).
                topic = shard.topic
                self._refused.setdefault(topic.name, {})[shard.shard_id] = batch[0]
                start = not topic.resharding
                topic.resharding = True
                self._cv.notify_all()
            if start:
                self._reshard(topic)

    # -- splits and merges ------------------------------------------------------------------------
    # (docs/kafka.md, "Writing through splits and merges"). The promise kept: per shard, records land
    # in the order they were put (`Pending.seq`). What breaks it is moving a waiting record to a shard
    # that was already given a later record, which routing every waiting record anew over the new
    # ACTIVE shards did (DataWorks' rule is MD5 modulo the number of shards: a split or merge moves
    # most keys, also between shards that stay ACTIVE). So a reshard moves only the records waiting
    # for a shard that is no longer ACTIVE, and only to its heirs (its ACTIVE descendants: the
    # children of a split, the shard of a merge), which are new to this writer; records waiting for a
    # shard that stays ACTIVE stay with it; records put later are routed over the new ACTIVE shards.

    def _route(self, info: _Topic, key: str) -> _Shard:
        shard_id = shard_for(key, info.shard_ids)
        shard = info.shards.get(shard_id)
        if shard is None:
            shard = info.shards[shard_id] = _WShard(info, shard_id, self.max_rate)
        return shard

    def _reshard(self, topic: _Topic) -> None:
        """A request of `topic` was refused because its shard is CLOSED or gone (the caller set
        `topic.resharding`: no request of the topic goes out meanwhile). Wait for the topic's
        requests in flight (a second shard refused at once is noted in `_refused` and handled here
        too), list the shards, and move the records waiting for shards that are no longer ACTIVE to
        their heirs, in put order. A listing that does not explain every refusal yet (a refused
        shard still ACTIVE, a closed one without an ACTIVE heir: its children still OPENING) is
        retried with backoff under the writer's retry policy, after which the writer stops with an
        error naming the shard and the first record waiting for it."""
        with self._cv:
            while any(s.busy for s in topic.shards.values()) and not self._closing:
                self._cv.wait(0.5)
        attempt, since = 0, None
        try:
            while True:
                listing = self.call(lambda: self.client.list_shard(self.project, topic.name), "ListShard").shards
                with self._cv:
                    problem = self._reroute(topic, listing)
                    if problem is None:
                        self._refused.pop(topic.name, None)
                        topic.resharding = False
                        self.resplits += 1
                        self._cv.notify_all()
                        return
                since = since or time.monotonic()
                attempt = self._wait(attempt, problem, "ShardNotReady", since=since)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of put/flush
            with self._cv:
                topic.resharding = False
                self._error = self._error or exc
                self._cv.notify_all()

    def _reroute(self, topic: _Topic, listing) -> str | None:
        """Under the lock: apply a ListShard answer (see `_reshard`), or say why it cannot be
        applied yet (nothing changed then)."""
        states = {str(s.shard_id): shard_state(s) for s in listing}
        active = sorted((sid for sid, state in states.items() if state == "ACTIVE"), key=sort_shard_id)
        where = f"{self.project}/{topic.name}"
        if not active:
            return f"ListShard of {where}: no ACTIVE shard"
        for sid, first in sorted(self._refused.get(topic.name, {}).items()):
            if states.get(sid) == "ACTIVE":
                return (f"PutRecordsByShard to {topic.name}/{sid} was refused as if the shard were closed, "
                        f"but ListShard shows it ACTIVE (first record waiting: {_named(first)})")
        children: dict[str, list[str]] = {}
        for s in listing:
            for parent in getattr(s, "parent_shard_ids", None) or ():
                children.setdefault(str(parent), []).append(str(s.shard_id))
        gone = [s for sid, s in topic.shards.items() if states.get(sid) != "ACTIVE"]
        heirs: dict[str, list[str]] = {}
        for shard in gone:
            if not shard.queue:
                continue
            found, todo, seen = set(), list(children.get(shard.shard_id, ())), set()
            while todo:  # ACTIVE descendants (a child may be closed already: a split then a merge)
                sid = todo.pop()
                if sid in seen:
                    continue
                seen.add(sid)
                if states.get(sid) == "ACTIVE":
                    found.add(sid)
                else:
                    todo.extend(children.get(sid, ()))
            if not found:
                return (f"shard {topic.name}/{shard.shard_id} is {states.get(shard.shard_id, 'gone')} and ListShard "
                        f"shows no ACTIVE shard that replaced it yet; {len(shard.queue)} records wait for it "
                        f"(first: {_named(shard.queue[0])})")
            heirs[shard.shard_id] = sorted(found, key=sort_shard_id)
        waiting = sorted(((p, s.shard_id) for s in gone for p in s.queue), key=lambda item: item[0].seq)
        for shard in gone:
            shard.queue.clear()
            shard.bytes = 0
            if shard in self._ready:
                self._ready.remove(shard)
            del topic.shards[shard.shard_id]
        topic.shard_ids = active
        for item, old in waiting:
            choices = heirs[old]
            target = self._shard_of(topic, shard_for(item.key, choices))
            if target.last > item.seq:  # never, as heirs are new to this writer: checked all the same
                fits = [sid for sid in choices if self._shard_of(topic, sid).last < item.seq]
                if not fits:
                    raise DataHubError(
                        f"cannot keep the order of shard {topic.name}/{old}'s records through its reshard: every "
                        f"shard that replaced it ({', '.join(choices)}) was given a later record than "
                        f"{_named(item)}")
                target = self._shard_of(topic, shard_for(item.key, fits))
            target.queue.append(item)
            target.bytes += item.size
            target.last = item.seq
        for shard in topic.shards.values():
            if shard.queue and not shard.busy and shard not in self._ready:
                self._ready.append(shard)
        return None

    def _read(self, topic: _Topic, shard_id: str, start: int, count: int, look: bool = False) -> list:
        """Up to `count` records of a shard from sequence `start` (TailLook's reads: the restart look,
        the check of a lost answer), where a CLOSED shard's end ends the read: DataHub answers a
        GetRecords at or past the last record of a CLOSED shard with InvalidShardOperation ("closed
        and all its records have been read"), also on an empty CLOSED shard, whose GetCursor LATEST
        answers 0 as an empty shard's does. (Before, that answer stopped a restart after a split
        or merge: "GetRecords failed: InvalidShardOperation".)"""
        from datahub.models import CursorType
        try:
            cursor = self.call(lambda: self.client.get_cursor(self.project, topic.name, shard_id, CursorType.SEQUENCE,
                                                               start), "GetCursor").cursor
        except DataHubError:
            if self._sequence(topic, shard_id, "LATEST") is None:
                return []
            raise
        out: list = []
        while len(out) < count:
            if look:
                self._check_stop()
                self.look_reads += 1
            want = min(1000, count - len(out))
            if topic.kind == "BLOB":
                get = lambda: self.client.get_blob_records(self.project, topic.name, shard_id, cursor, want)  # noqa: E731
            else:
                get = lambda: self.client.get_tuple_records(self.project, topic.name, shard_id,  # noqa: E731
                                                            topic.schema, cursor, want)
            try:
                result = self.call(get, "GetRecords")
            except DataHubError as err:
                if "InvalidShardOperation" in str(err) or "ShardSealed" in str(err):
                    break  # a CLOSED shard read to its end
                raise
            if not result.records:
                break
            out.extend(result.records)
            cursor = result.next_cursor
        return out[:count]

    def _shard_of(self, topic: _Topic, shard_id: str) -> _WShard:
        shard = topic.shards.get(shard_id)
        if shard is None:
            shard = topic.shards[shard_id] = _WShard(topic, shard_id, self.max_rate)
        return shard


def _named(pending: Pending) -> str:
    """A queued record as errors name it: its sequence among the records put, and its position."""
    pos = pending.position
    return f"record #{pending.seq}" + (f" at {pos.source} dts.pos {pos.key}" if pos is not None else "")


class _WShard(_Shard):
    """A shard as this writer keeps it: `last`, the sequence (`Pending.seq`) of the last record given
    to it, so a reshard can tell (and refuses) a move that would put a record after a later one."""
    __slots__ = ("last",)

    def __init__(self, topic: _Topic, shard_id: str, rate: float) -> None:
        super().__init__(topic, shard_id, rate)
        self.last = 0



class _Outstanding:
    """One source partition's records put and not yet done, counted per offset in put order (the
    offsets of one partition are put in increasing order: its Entries in stream order)."""
    __slots__ = ("groups", "index", "ordered")

    def __init__(self) -> None:
        self.groups: collections.deque[list[int]] = collections.deque()  # [offset, records not done]
        self.index: dict[int, list[int]] = {}
        self.ordered = True

    def add(self, offset: int) -> None:
        group = self.index.get(offset)
        if group is None:
            if self.groups and offset < self.groups[-1][0]:
                self.ordered = False  # put out of order (not by bridge.sync): first() takes the min
            group = self.index[offset] = [offset, 0]
            self.groups.append(group)
        group[1] += 1

    def done(self, offset: int) -> None:
        self.index[offset][1] -= 1
        while self.groups and self.groups[0][1] == 0:
            del self.index[self.groups.popleft()[0]]

    def first(self) -> int | None:
        """The lowest offset with a record not done (None: none)."""
        if not self.groups:
            return None
        if not self.ordered:
            return min(g[0] for g in self.groups if g[1] > 0)
        return self.groups[0][0]
