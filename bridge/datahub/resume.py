"""The restart look: before its first write to a DataHub topic after `resume`, the writer reads each
shard's tail back (newest first) and collects the positions of this source's records that landed
past the committed offsets, so that those records, put again, are dropped; and the check of a
request whose answer was lost (`_landed_already`). Also `read_topic`, every record of a topic.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from bridge.datahub.calls import DataHubError
from bridge.datahub.records import ATTR_EPOCH, ATTR_POS, ATTR_TOPIC, LOST_ANSWER_MARGIN_MS, Pending, Position
from bridge.datahub.routing import _Shard, _Topic
from bridge.values import signed_digits

__all__ = ["TailLook", "LookStopped"]


class LookStopped(DataHubError):
    """The restart look was asked to stop (`resume(stop=...)`): nothing was written."""


class TailLook:
    """The writer's restart look (a mixin of `DataHubWriter`, whose state it uses)."""

    look_reads = 0  # GetRecords requests of restart looks
    _stop_look: Callable[[], bool] | None = None
    _since_of: dict = {}
    _looking: int | None = None  # the thread running a look

    def resume(self, source: str, committed: dict[int, int | None] | None = None, epoch: int | None = None,
               since_ms: int | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Records of `source` put again after a restart that already landed are dropped. Each
        shard's tail is read back (newest first), per partition of `committed`, to that partition's
        last record in the shard below its committed offset: every record of a partition lands in
        its shard in offset order, so older ones are all below it too, and the ones seen before it
        are those to drop (`committed[partition]` None: nothing of that partition was committed, its
        records are all looked for; a partition not in `committed` is another process's, skipped).
        The look ends in a shard once every partition of `committed` met its committed record there.

        `committed` empty: every record of `source` in the shards is taken as landed (a replay).
        Called again with the same source (a group member given more partitions), it looks for the
        new partitions only and keeps what it found for the others.

        With `epoch` (a Spark micro-batch id) every record also carries `dts.epoch`, and the tail is
        read back to the first record of `source` from an earlier epoch instead: a micro-batch
        replayed after a failure finds what its earlier attempt wrote (every record of an earlier
        epoch landed before any of this one, as Spark runs the batches one after another).

        `since_ms` (DataHub's clock) bounds the look for partitions that have no committed record in
        a shard (an idle partition, or keys that never went there): past records older than it, a
        shard's look ends unless a partition already showed records past its commit there, which are
        then followed back to its committed record (bridge.sync.run passes the last commit's time
        less CLOCK_MARGIN_MS). None: no bound (the look may read a shard whole once).

        The look runs at once for the topics the writer knows and before the first write to any
        other; it reports to the observer ("look": state start|shard|done, topic, shard, records
        read, requests, found, seconds) and `stop()` is asked between requests: true ends it with
        `LookStopped`."""
        with self._cv:
            fresh = (source != self._source or epoch is not None or self._epoch is not None or not committed
                     or not self._committed)
            committed = dict(committed or {})
            if fresh:
                self._committed, self._since_of = {}, {}
            self._source, self._epoch = source, epoch
            self._committed.update(committed)
            for p in committed:
                self._since_of[p] = since_ms
            self._since = since_ms
            self._stop_look = stop
            for topic in self._topics.values():
                if fresh or topic.look_for is None:
                    topic.look_for = None if fresh else set(committed)
                else:
                    topic.look_for |= set(committed)
                topic.scanned = False
            topics = list(self._topics.values())
        for topic in topics:
            if not topic.scanned:
                self._scan(topic)

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

    def _landed_already(self, shard: _Shard, batch: list[Pending], since_ms: int | None) -> bool:
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

    def _newest_first(self, topic: _Topic, shard_id: str, window: int, look: bool = False) -> Iterator:
        """A shard's records from the newest back, read in windows growing fourfold (a reader that
        stops early reads little). `look`: the restart look's (counted, and `stop` is asked)."""
        if look:
            self._check_stop()
        latest = self._sequence(topic, shard_id, "LATEST")
        if latest is None:
            return
        oldest = self._sequence(topic, shard_id, "OLDEST") or 0
        end = latest
        while end >= oldest:
            start = max(oldest, end - window + 1)
            yield from reversed(self._read(topic, shard_id, start, end - start + 1, look))
            end, window = start - 1, window * 4

    def _scan(self, topic: _Topic) -> None:
        """Collect the positions of `source`'s records that landed past the committed offsets (of
        the partitions the look is for: `topic.look_for`, None for all)."""
        with self._cv:
            parts = None if topic.look_for is None else set(topic.look_for)
            committed = {p: off for p, off in self._committed.items() if parts is None or p in parts}
            sinces = [self._since_of.get(p) for p in committed] or [self._since]
            since = None if any(x is None for x in sinces) else min(sinces)
        started, reads = time.monotonic(), self.look_reads
        self._looking = threading.get_ident()
        try:
            landed, records = self._scan_shards(topic, committed, since)
        finally:
            self._looking = None
        with self._cv:
            if parts is None or topic.landed is None:
                topic.landed = landed
            else:  # a partition looked for again: what was found before for it is replaced
                topic.landed = {k for k in topic.landed if int(k.split(":", 1)[0]) not in parts} | landed
            topic.scanned, topic.look_for = True, set()
        self._observe("look", state="done", topic=topic.name, records=records, requests=self.look_reads - reads,
                      found=len(landed), seconds=time.monotonic() - started)

    def _scan_shards(self, topic: _Topic, committed: dict, since: int | None) -> tuple[set[str], int]:
        shards = self.call(lambda: self.client.list_shard(self.project, topic.name), "ListShard").shards
        self._observe("look", state="start", topic=topic.name, shards=len(shards), partitions=sorted(committed),
                      since_ms=since)
        landed: set[str] = set()
        records = 0
        for shard in shards:
            found, read = self._scan_shard(topic, shard.shard_id, committed, since)
            landed |= found
            records += read
            self._observe("look", state="shard", topic=topic.name, shard=shard.shard_id, records=read,
                          found=len(found))
        return landed, records

    def _scan_shard(self, topic: _Topic, shard_id: str, committed: dict, since: int | None) -> tuple[set[str], int]:
        """(positions found past the commits, records read) in one shard."""
        found: set[str] = set()
        looking = {p for p, off in committed.items() if off is not None}  # no committed record met yet
        unbounded = not committed or any(off is None for off in committed.values())
        past: set[int] = set()  # partitions with records past their commit met, their commit not yet
        read = 0
        for record in self._newest_first(topic, shard_id, 64, look=True):
            read += 1
            if since is not None and not past and (getattr(record, "system_time", None) or 0) < since:
                return found, read  # older than the bound, and no partition is being followed back
            attrs = record.attributes or {}
            if attrs.get(ATTR_TOPIC) != self._source:
                continue  # another writer's record
            pos = Position.parse(attrs.get(ATTR_POS, ""))
            if pos is None:
                continue
            if self._epoch is not None:
                epoch = attrs.get(ATTR_EPOCH, "")
                if not signed_digits(epoch) or int(epoch) < self._epoch:
                    return found, read  # an earlier micro-batch: everything before it landed before this one
                found.add(f"{pos[0]}:{pos[1]}:{pos[2]}:{pos[3]}")
                continue
            if committed and pos[0] not in committed:
                continue  # a partition another process owns (or not looked for now): skipped
            limit = committed.get(pos[0])
            if limit is not None and pos[1] < limit:
                looking.discard(pos[0])  # its committed record: everything older of it is committed
                past.discard(pos[0])
                if not looking and not unbounded:
                    return found, read
                continue
            if limit is not None:
                past.add(pos[0])
            found.add(f"{pos[0]}:{pos[1]}:{pos[2]}:{pos[3]}")
        return found, read

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

    def _before_wait(self) -> None:
        """Asked before and during each backoff (Retrying._pause): the look stops when asked to,
        even while DataHub is down."""
        if self._looking == threading.get_ident():
            self._check_stop()

    def _check_stop(self) -> None:
        stop = self._stop_look
        if stop is not None and stop():
            raise LookStopped("stopped during the restart look (DataHub shards' tails were being read)")

    def _read(self, topic: _Topic, shard_id: str, start: int, count: int, look: bool = False) -> list:
        from datahub.models import CursorType
        cursor = self.call(lambda: self.client.get_cursor(self.project, topic.name, shard_id, CursorType.SEQUENCE,
                                                           start), "GetCursor").cursor
        out: list = []
        while len(out) < count:
            if look:
                self._check_stop()
                self.look_reads += 1
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


