"""A frozen copy of the shard merge as it was before it moved to bridge/stream/merge.py (and to C):
`DataHubAssembler` of commit d9065da, its merge written out in one class. The tests run the
assembler (with the C merge and with `PyMerge`) and this copy on the same input and compare every
step where the rules have not changed since (tests/test_shard_merge.py says which inputs); it is
never changed with the code it checks."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping

from bridge.blob.decode import BlobDecoder
from bridge.errors import BridgeError
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.stream import ErrorPolicy
from bridge.stream.shards import DataHubRecord, OutOfOrderError, ShardMark, stream_of
from bridge.tuple.decode import TupleDecoder

__all__ = ["ReferenceAssembler"]


class _Item:
    __slots__ = ("key", "seq", "rec", "stream", "order", "group")

    def __init__(self, key, seq, rec, stream, order, group) -> None:
        self.key, self.seq, self.rec, self.stream, self.order, self.group = key, seq, rec, stream, order, group


class _ShardInfo:
    __slots__ = ("parents", "finished", "end_at", "end_server_ms")

    def __init__(self, parents=()) -> None:
        self.parents = tuple(parents)
        self.finished = False
        self.end_at = float("-inf")
        self.end_server_ms = float("-inf")  # DataHub's clock (at least) when last seen at its end


class _Stream:
    __slots__ = ("decoder", "group", "fed", "released")

    def __init__(self, decoder) -> None:
        self.decoder = decoder
        self.group = None  # the group of the last record fed
        self.fed: list = []  # (key, seq, record) of records fed whose Entry is not complete yet
        self.released = None  # order of the last record handed on


class ReferenceAssembler:
    """DataHub records (a `DataHubSource`'s) -> whole Entries, shards merged per stream (see the
    module docstring). `settle`: seconds a shard must have been seen at its end after a record was
    read for that shard to count as holding nothing earlier (a writer still writing). `tables`:
    Tuple topic -> "db.table" (or a callable) for rows without `_source_table_` (else the table is
    the topic's name, in no database). `columns`: Tuple topic -> its DTS columns, restoring types."""

    def __init__(self, options: Options = DEFAULT_OPTIONS, *, settle: float = 1.0,
                 tables: Mapping[str, str] | Callable[[str], str] | None = None,
                 columns: Mapping[str, list] | None = None, max_pending: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options, self.settle, self.tables, self.columns = options, settle, tables, columns
        self.max_pending, self.clock = max_pending, clock
        self._shards: dict = {}  # key -> _ShardInfo
        self._buffers: dict = {}  # key -> deque[_Item] (shard order)
        self._by_stream: dict = {}  # (key, stream) -> deque[_Item] not yet handed on
        self._seen: dict = {}  # (key, stream) -> order of the last record read
        self._streams: dict = {}  # stream -> _Stream
        self._topics: dict = {}  # topic -> [keys]
        self.buffered = 0
        self.late = 0
        self.orphans = 0
        self.released = 0
        self._handed_after: dict = {}  # key -> the last sequence handed to a decoder
        # shards whose head may have become releasable since it was last looked at (the others'
        # heads are known not to be: nothing they depend on changed); see _release
        self._dirty: set = set()
        self._key_texts: dict = {}  # key -> "topic:shard"
        self._others_of: dict = {}  # key -> the other shards of its topic
        self._blockers: dict = {}  # key -> the other shard that held its head back when last looked at

    # -- the Assembler protocol -----------------------------------------------------------------
    def entries(self, records: Iterable[tuple], policy: ErrorPolicy) -> Iterator[tuple]:
        for record in records:
            key, seq, value = record[0], record[1], record[2]
            if isinstance(value, ShardMark):
                self._mark(key, value)
            else:
                self._read(key, seq, value, policy)
            if self._dirty:
                yield from self._release(policy)

    def resume_at(self, key) -> None:
        """Nothing to skip: a committed position never lies past a record handed on (shard order)."""

    def held_from(self, key) -> int | None:
        first = None
        buf = self._buffers.get(key)
        if buf:
            first = buf[0].seq
        for stream in self._streams.values():
            for k, s, _ in stream.fed:
                if k == key and (first is None or s < first):
                    first = s
        return first

    def held(self) -> int:
        return self.buffered + sum(len(s.fed) for s in self._streams.values())

    def waiting(self) -> bool:
        """Records wait for a fresh look at shards at their end (the source's `wants_tick`)."""
        return self.buffered > 0

    def commit_safe(self) -> bool:
        """No incomplete Entry has records on a shard past which later records were handed on: a
        commit now is exact (a restart hands on nothing twice). Wire it into the commit (e.g. a
        sink's `may_commit`) where exactly-once matters."""
        for stream in self._streams.values():
            for key, seq, _ in stream.fed:
                if self._handed_after.get(key, -1) > seq:
                    return False
        return True

    def finish(self, policy: ErrorPolicy) -> Iterator[tuple]:
        """At the true end of input (every shard finished or read to its end for good): everything
        buffered is handed on and incomplete Entries are reported."""
        for info in self._shards.values():
            info.end_at = info.end_server_ms = float("inf")
        self._dirty.update(self._buffers)
        yield from self._release(policy)
        for stream in self._streams.values():
            if stream.decoder is not None:
                self._report(stream, stream.decoder.finish(), policy)
            stream.fed.clear()

    # -- the open tail as plain data (a streaming engine's state between micro-batches) ----------
    def snapshot(self) -> dict:
        """What this assembler holds, as plain picklable data: the shards it knows (parents,
        finished, last seen at the end), the records not yet handed on (in shard order), and per
        stream the order handed on up to, its open Entry's group and the records fed to it.
        `restore` on a fresh assembler (same options) continues exactly where this one is.
        Streams of records without an order of their own are left out once their Entry closed."""
        streams = {}
        for stream, st in self._streams.items():
            if stream[0] == "shard" and not st.fed:
                continue
            streams[stream] = (st.group, st.released, [(k, s, rec) for k, s, rec in st.fed])
        seen = {ks: order for ks, order in self._seen.items() if ks[1][0] != "shard" or self._by_stream.get(ks)}
        return {
            "shards": [(key, info.parents, info.finished, info.end_at, info.end_server_ms)
                       for key, info in self._shards.items()],
            "buffered": [(key, [(item.seq, item.rec) for item in buf]) for key, buf in self._buffers.items() if buf],
            "seen": seen,
            "streams": streams,
            "handed_after": dict(self._handed_after),
            "counts": (self.late, self.orphans, self.released),
        }

    def restore(self, snap: dict) -> None:
        """Take over a `snapshot`: the records fed to an open Entry go to a fresh decoder again
        (they complete nothing, as they did not before)."""
        for key, parents, finished, end_at, *server in snap["shards"]:  # (a snapshot of before had no server)
            info = self._info(key, parents)
            info.finished, info.end_at = finished, end_at
            if server:
                info.end_server_ms = server[0]
        for key, items in snap["buffered"]:
            for seq, rec in items:
                stream, order, group = stream_of(rec)
                item = _Item(key, seq, rec, stream, order, group)
                self._buffers.setdefault(key, deque()).append(item)
                self._by_stream.setdefault((key, stream), deque()).append(item)
                self.buffered += 1
                self._dirty.add(key)
        self._seen.update(snap["seen"])
        self._handed_after.update(snap["handed_after"])
        self.late, self.orphans, self.released = snap["counts"]
        for stream, (group, released, fed) in snap["streams"].items():
            st = self._streams[stream] = _Stream(None)
            st.group, st.released = group, released
            for key, seq, rec in fed:
                st = self._stream(_Item(key, seq, rec, stream, None, group))
                if rec.row is not None:
                    out = st.decoder.feed(rec.row, number=seq)
                else:
                    out = st.decoder.feed_line(rec.data, line=seq, source=f"{key[0]}:{key[1]}")
                if out:  # cannot be: these records completed nothing the first time
                    raise BridgeError(f"DataHub {key[0]} shard {key[1]} sequence {seq}: a restored open Entry "
                                      "completed on restore (a snapshot of other options?)")
                st.fed.append((key, seq, rec))

    # -- marks and records --------------------------------------------------------------------
    def _info(self, key, parents=()) -> _ShardInfo:
        info = self._shards.get(key)
        if info is None:
            info = self._shards[key] = _ShardInfo(parents)
            self._topics.setdefault(key[0], []).append(key)
            self._others_of.clear()
        elif parents and not info.parents:
            info.parents = tuple(parents)
        return info

    def _mark(self, key, mark: ShardMark) -> None:
        info = self._info(key, mark.parents)
        if mark.kind == "finished":
            info.finished = True
        elif mark.kind == "end":
            info.end_at = max(info.end_at, mark.at)
            if mark.server_ms is not None:
                info.end_server_ms = max(info.end_server_ms, mark.server_ms)
        # what the mark says about this shard may cover the heads of every other shard of its topic
        buffers = self._buffers
        self._dirty.update(k for k in self._topics[key[0]] if buffers.get(k))

    def _read(self, key, seq: int, rec: DataHubRecord, policy: ErrorPolicy) -> None:
        self._info(key)
        stream, order, group = stream_of(rec)
        st = self._streams.get(stream)
        if st is not None and st.released is not None and order <= st.released:
            self.late += 1
            policy.tally.input += 1
            err = OutOfOrderError(f"DataHub {key[0]} shard {key[1]} sequence {seq}: a record that belongs before one "
                                  f"already handed on (its stream {stream[:3]} at {order}, handed on up to "
                                  f"{st.released}): written after the reader saw its shard at the end for "
                                  f"{self.settle} s (raise settle), or written twice",
                                  shard=key[1], sequence=seq)
            policy.reject(err, rec.data if rec.data is not None else rec.row)
            return
        item = _Item(key, seq, rec, stream, order, group)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = deque()
        if not buf:
            self._dirty.add(key)  # a new head
        buf.append(item)
        waiting = self._by_stream.get((key, stream))
        if waiting is None:
            waiting = self._by_stream[(key, stream)] = deque()
        first = not waiting
        waiting.append(item)
        seen = self._seen.get((key, stream))
        if seen is None or order > seen:
            self._seen[(key, stream)] = order
        self.buffered += 1
        if first:
            # this shard now holds a record of the stream (before: only what it had shown of it):
            # the heads of that stream on the other shards may be covered now
            self._touch(key, stream)

    # -- the merge ------------------------------------------------------------------------------
    def _covers(self, other, head: _Item) -> bool:
        """Whether shard `other` can no longer hold a record of `head`'s stream before it."""
        waiting = self._by_stream.get((other, head.stream))
        if waiting:
            return waiting[0].order > head.order
        info = self._shards[other]
        if info.finished:
            return True
        seen = self._seen.get((other, head.stream))
        if seen is not None and seen > head.order:
            return True
        if info.end_at >= head.rec.read_at + self.settle:
            return True
        # (a record written long ago, e.g. a backfill, needs no wait: the writer's window is over)
        if info.end_server_ms >= head.rec.system_time + self.settle * 1000:
            return True
        return self._descends(other, head.key)

    def _descends(self, key, ancestor) -> bool:
        todo, done = list(self._shards[key].parents), set()
        while todo:
            parent = (key[0], todo.pop())
            if parent == ancestor:
                return True
            if parent in done or parent not in self._shards:
                continue
            done.add(parent)
            todo.extend(self._shards[parent].parents)
        return False

    def _others(self, key) -> tuple:
        """The other shards of `key`'s topic (cached until a shard is first seen)."""
        others = self._others_of.get(key)
        if others is None:
            others = self._others_of[key] = tuple(k for k in self._topics[key[0]] if k != key)
        return others

    def _touch(self, key, stream) -> None:
        """What shard `key` holds of `stream` changed: the other shards whose head is of that stream
        and was held back by `key` when last looked at are looked at again (a head held back by
        another shard is still held back: nothing of that shard changed)."""
        buffers, dirty, blockers = self._buffers, self._dirty, self._blockers
        for other in self._others(key):
            if other not in dirty:
                buf = buffers.get(other)
                if buf and buf[0].stream == stream and blockers.get(other, key) == key:
                    dirty.add(other)

    def _blocker(self, key, head: _Item, others: tuple):
        """The other shard that does not cover `head` (the one that did not last time first), or
        None when every other shard covers it."""
        covers = self._covers
        first = self._blockers.get(key)
        if first is not None and not covers(first, head):
            return first
        for other in others:
            if other != first and not covers(other, head):
                self._blockers[key] = other
                return other
        return None

    def _release(self, policy: ErrorPolicy) -> Iterator[tuple]:
        """Hand on every head covered by the other shards of its topic, in passes over the shards
        in the order they were first seen, until a pass hands on nothing. A shard not in `_dirty`
        is skipped: its head was held back by one other shard (`_blockers`) when last looked at
        and nothing of that shard it depends on (its records of the head's stream, its marks)
        changed since, so the order things are handed on in is the same as looking at every head
        on every pass."""
        dirty = self._dirty
        progress = True
        while progress and self.buffered and dirty:
            progress = False
            for key, buf in self._buffers.items():
                if key not in dirty:
                    continue
                dirty.discard(key)
                others = self._others(key)
                while buf:
                    head = buf[0]
                    if others and self._blocker(key, head, others) is not None:
                        break
                    buf.popleft()
                    self._by_stream[(key, head.stream)].popleft()
                    self.buffered -= 1
                    progress = True
                    self._touch(key, head.stream)
                    where, out = self._feed(head, policy)
                    for entry in out:
                        policy.tally.input += 1
                        yield where, entry
        if not self.buffered:
            dirty.clear()

    def _stream(self, item: _Item) -> _Stream:
        st = self._streams.get(item.stream)
        if st is None or st.decoder is None:
            rec = item.rec
            if rec.row is not None:
                table = self._table(rec.topic)
                cols = self.columns.get(rec.topic) if self.columns else None
                decoder = TupleDecoder(rec.schema, self.options, table=table, columns=cols,
                                       max_pending=self.max_pending)
            else:
                decoder = BlobDecoder(self.options, max_pending=self.max_pending)
            if st is None:
                st = self._streams[item.stream] = _Stream(decoder)
            else:
                st.decoder = decoder
        return st

    def _table(self, topic: str):
        tables = self.tables
        if tables is None:
            return ("", topic)
        name = tables(topic) if callable(tables) else tables.get(topic)
        return name if name else ("", topic)

    def _feed(self, item: _Item, policy: ErrorPolicy) -> tuple[dict | None, list]:
        """Hand a record to its stream's decoder: (where, the Entries it completed)."""
        st = self._streams.get(item.stream)
        if st is None or st.decoder is None:
            st = self._stream(item)
        decoder = st.decoder
        if st.fed and st.group != item.group:
            # the stream moved on to another Entry: the open one can never complete
            self.orphans += 1
            self._report(st, decoder.finish(), policy)
            st.fed.clear()
        st.group = item.group
        st.released = item.order
        self.released += 1
        key, seq = item.key, item.seq
        ha = self._handed_after
        if seq > ha.get(key, -1):
            ha[key] = seq
        rec = item.rec
        shard = self._key_texts.get(key)
        if shard is None:
            shard = self._key_texts[key] = f"{key[0]}:{key[1]}"
        try:
            if rec.row is not None:
                out = decoder.feed(rec.row, number=seq)
            else:
                out = decoder.feed_line(rec.data, line=seq, source=shard)
        except BridgeError as err:
            count = getattr(err, "count", 1)
            policy.tally.input += count
            policy.reject(err.located(shard=shard, sequence=seq), rec.data if rec.data is not None else rec.row, count)
            return None, ()
        if decoder.evicted:
            self._report(st, decoder.evicted[:], policy)
            decoder.evicted.clear()
        if decoder.pending:
            st.fed.append((key, seq, rec))
        elif st.fed:
            st.fed.clear()
        if not out:
            return None, ()
        return {"shard": shard, "sequence": seq}, out

    def _report(self, st: _Stream, errors: list, policy: ErrorPolicy) -> None:
        for err in errors:
            count = getattr(err, "count", 1)
            policy.tally.input += count
            policy.reject(err, None, count)
