"""The restart look: before its first write to a DataHub topic after `resume`, the writer reads each
shard's tail back (newest first) and collects the positions of this source's records that landed
past the committed offsets, so that those records, put again, are dropped; and the check of a
request whose answer was lost (`_landed_already`). Also `read_topic`, every record of a topic.
"""
from __future__ import annotations

from collections.abc import Iterator

from bridge.datahub.records import ATTR_EPOCH, ATTR_POS, ATTR_TOPIC, LOST_ANSWER_MARGIN_MS, Pending, Position
from bridge.datahub.routing import _Shard, _Topic

__all__ = ["TailLook"]


class TailLook:
    """The writer's restart look (a mixin of `DataHubWriter`, whose state it uses)."""

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


