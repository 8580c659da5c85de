"""The shard merge's bookkeeping, apart from what it merges: which buffered record may be handed on
next (docs/kafka.md, "Reading DataHub: the merge"; bridge/stream/shards.py says what a stream, an
order and "covers" mean). `DataHubAssembler` feeds it records and marks and takes the records it
hands on; the decoders and the error policy stay there.

Shards and streams are small ints here (the assembler numbers them as it first sees them): this is
the interface the C `_speedups.Merge` has too, and `PyMerge` below is its reference
(tests/test_shard_merge.py runs both on the same operations and compares every step). Items are
opaque: `push` takes one, `next` gives it back.

Rules:
- a shard's records go out in the order they were pushed (a commit below one covers nothing after it);
- a head that is **stale** (a record of its stream at or after its order was handed on: a copy of
  a record written twice, or a late one) goes out at once: the assembler drops or reports it, and
  stale records waiting on other shards hold nothing back;
- the head of a shard goes out when every other shard of its topic **covers** it: the other shard's
  first waiting record of the head's stream that is not stale is not earlier (the same order is the same record
  written twice: the head goes first, the copy after it), or (none waiting) it is finished, or it
  showed a record of the stream at or after the head's, or it was seen at its end `settle` s after the head was read, or
  DataHub's clock was `settle` s past the head's system time when it was, or the head's shard is
  among its `ancestors` (the assembler names them: split parents only, see `_ancestry` there);
- `next` runs passes over the shards in the order they first buffered a record, each shard handing
  on heads while they are covered, until a pass hands on nothing; only shards whose head may have
  become releasable are looked at (`dirty`: a new head, a mark on the topic, a change in what the
  shard that held the head back last time holds of its stream, a release of the head's stream),
  which hands on exactly what looking
  at every head on every pass does;
- nothing stalls for good (docs/kafka.md, "Reading DataHub: stalls"): `stuck` names a shard whose
  head sits in a cycle of shards each held back by an earlier record of the head's stream waiting
  behind the next one's head (nothing read later can end such a cycle), `oldest` the shard whose
  head was read first, and `force` hands a shard's head on though it is not covered (the assembler
  decides when: a cycle at once, the records and seconds bounds); a record of the stream still
  buffered elsewhere then comes after a later one, and the assembler reports it as out of order;
- `stuck(True)` walks only from the shards whose hold-back may have changed since it last did
  (`_walk`), which finds every cycle as `stuck()` does, in time proportional to what changed: a
  cycle that was not there has a hold-back that changed, and walking from a shard whose own
  hold-back changed, or from the shard a changed hold-back points to, goes round it. A shard's
  hold-back (the first other shard holding a live earlier record of its head's stream) changes
  only when its head does (a push to it empty, a hand-on from it), when what was handed on of its
  head's stream does (a hand-on of that stream anywhere, `set_released`), or when another shard
  gets a live record of that stream (a push to that one, which is walked from).
"""
from __future__ import annotations

from collections import deque

__all__ = ["PyMerge", "new_merge"]

_INF = float("inf")


def _order(order):
    """An order is a tuple of ints (as the C merge insists: comparing two runs no Python code)."""
    if type(order) is not tuple or any(type(v) is not int for v in order):
        raise TypeError("an order is a tuple of ints")
    return order


class _Rec:
    __slots__ = ("shard", "stream", "order", "read_at", "system_ms", "item")

    def __init__(self, shard, stream, order, read_at, system_ms, item) -> None:
        self.shard, self.stream, self.order = shard, stream, order
        self.read_at, self.system_ms, self.item = read_at, system_ms, item


class PyMerge:
    """The merge in Python: the reference of `_speedups.Merge` (same methods, same results)."""

    def __init__(self, settle: float) -> None:
        self.settle = float(settle)
        self.buffered = 0
        self._topic: list[int] = []  # shard -> its topic
        self._finished: list[bool] = []
        self._end_at: list[float] = []
        self._end_ms: list[float] = []
        self._ancestors: list[frozenset] = []
        self._others: list[tuple] = []  # shard -> the other shards of its topic, in shard order
        self._buf: list[deque] = []
        self._order: list[int] = []  # shards in the order they first buffered a record
        self._in_order: list[bool] = []
        self._waiting: dict = {}  # (shard, stream) -> deque[_Rec] not handed on
        self._seen: dict = {}  # (shard, stream) -> order of the last record read
        self._released: dict = {}  # stream -> order of the last record handed on
        self._dirty: set = set()
        self._blockers: dict = {}  # shard -> the other shard that held its head back when last looked at
        self._walk: set = set()  # shards whose hold-back may have changed since `stuck(True)` walked from them
        self._pos = -1  # the pass `next` is in: index into _order, or -1 between passes
        self._draining = False  # `next` is handing on the heads of _order[_pos]
        self._progress = True

    # -- shards and marks ------------------------------------------------------------------------
    def add_shard(self, topic: int) -> int:
        shard = len(self._topic)
        self._topic.append(topic)
        self._finished.append(False)
        self._end_at.append(-_INF)
        self._end_ms.append(-_INF)
        self._ancestors.append(frozenset())
        self._buf.append(deque())
        self._in_order.append(False)
        topics = self._topic
        self._others = [tuple(o for o in range(len(topics)) if o != s and topics[o] == topics[s])
                        for s in range(len(topics))]
        return shard

    def _shard(self, shard: int) -> int:
        if not 0 <= shard < len(self._topic):
            raise IndexError(f"no shard {shard} in the merge")
        return shard

    @staticmethod
    def _stream(stream: int) -> int:
        if not isinstance(stream, int):
            raise TypeError(f"a stream is an int, not {stream!r}")
        if not 0 <= stream <= 0x7FFFFFFF:
            raise IndexError(f"stream {stream} out of range")
        return stream

    def set_ancestors(self, shard: int, ancestors) -> None:
        self._ancestors[self._shard(shard)] = frozenset(ancestors)

    def mark(self, shard: int, finished: bool, end_at: float, end_ms: float) -> None:
        """What is known of `shard` now; every shard of its topic holding records is looked at again."""
        self._shard(shard)
        self._finished[shard] = bool(finished)
        self._end_at[shard] = float(end_at)
        self._end_ms[shard] = float(end_ms)
        buf = self._buf
        self._dirty.update(s for s in self._others[shard] + (shard,) if buf[s])

    def finish_all(self) -> None:
        """The true end of input: every shard counts as seen at its end for good."""
        for s in range(len(self._topic)):
            self._end_at[s] = self._end_ms[s] = _INF
        self._dirty.update(self._order)

    # -- records ----------------------------------------------------------------------------------
    def push(self, shard: int, stream: int, order, read_at: float, system_ms: float, item,
             check_late: bool = True) -> bool:
        """Buffer `item`, the next record of `shard`; False (nothing buffered) when `check_late` and
        a record of `stream` at or after `order` was handed on already."""
        self._shard(shard), self._stream(stream), _order(order)
        read_at, system_ms = float(read_at), float(system_ms)
        if check_late:
            released = self._released.get(stream)
            if released is not None and order <= released:
                return False
        seen = self._seen.get((shard, stream))
        later = seen is None or order > seen
        rec = _Rec(shard, stream, order, read_at, system_ms, item)
        buf = self._buf[shard]
        waiting = self._waiting.get((shard, stream))
        if waiting is None:
            waiting = self._waiting[(shard, stream)] = deque()
        first = not waiting
        # its hold-back or the others' may change: a new head, or no live record of the stream
        # waiting here before (none, or the first stale: then maybe none)
        if not buf or first or self._stale(waiting[0]):
            self._walk.add(shard)
        if not buf:
            self.enlist(shard)
            self._dirty.add(shard)  # a new head
        buf.append(rec)
        waiting.append(rec)
        if later:
            self._seen[(shard, stream)] = order
        self.buffered += 1
        if first:
            self._touch(shard, stream)
        return True

    def next(self):
        """The next item to hand on, or None when none can go now."""
        order, dirty, bufs = self._order, self._dirty, self._buf
        while True:
            if self._pos < 0:
                if not (self._progress and self.buffered and dirty):
                    if not self.buffered:
                        dirty.clear()
                    self._progress = True
                    return None
                self._progress = False
                self._pos, self._draining = 0, False
            while self._pos < len(order):
                shard = order[self._pos]
                if not self._draining:
                    if shard not in dirty:
                        self._pos += 1
                        continue
                    dirty.discard(shard)
                    self._draining = True
                buf = bufs[shard]
                if buf:
                    head = buf[0]
                    others = self._others[shard]
                    if not others or self._stale(head) or self._blocker(shard, head, others) is None:
                        return self._pop_head(shard)
                self._draining = False
                self._pos += 1
            self._pos = -1

    def _stale(self, rec: _Rec) -> bool:
        """Whether a record of its stream at or after its order was handed on already: a copy or a
        late record, which the assembler drops or reports whatever the other shards hold."""
        released = self._released.get(rec.stream)
        return released is not None and rec.order <= released

    def _live(self, shard: int, stream: int):
        """The first record of `stream` waiting on `shard` that is not stale, or None."""
        waiting = self._waiting.get((shard, stream))
        if not waiting:
            return None
        released = self._released.get(stream)
        if released is None:
            return waiting[0]
        for rec in waiting:
            if rec.order > released:
                return rec
        return None

    def _release(self, head: _Rec) -> None:
        released = self._released.get(head.stream)
        if released is None or head.order > released:  # (a forced head may have gone past it)
            self._released[head.stream] = head.order

    # -- stalls -------------------------------------------------------------------------------------
    def _held_by(self, shard: int):
        """The first other shard holding an earlier record of the head's stream waiting, or None."""
        buf = self._buf[shard]
        if not buf:
            return None
        head = buf[0]
        if self._stale(head):
            return None
        for other in self._others[shard]:
            live = self._live(other, head.stream)
            if live is not None and live.order < head.order:
                return other
        return None

    def _first_read(self, shards) -> int:
        order, bufs = self._order, self._buf
        return min(shards, key=lambda s: (bufs[s][0].read_at, order.index(s)))

    def stuck(self, changed: bool = False) -> int:
        """A shard whose head is in a deadlock (each shard of a cycle held back by an earlier record
        of its head's stream waiting on the next): of the first cycle found walking from the shards
        in the passes' order, the one whose head was read first; -1 when there is none. `changed`:
        walking only from the shards whose hold-back may have changed since a `stuck(True)` walked
        from them (those it did not walk from, a cycle found first, stay to walk from next time)."""
        walked: dict = {}
        walk = self._walk
        for start in self._order:
            if changed:
                if start not in walk:
                    continue
                walk.discard(start)
            if not self._buf[start] or start in walked:
                continue
            path, shard = [], start
            while shard is not None and shard not in walked:
                walked[shard] = start
                path.append(shard)
                shard = self._held_by(shard)
            if shard is not None and walked[shard] == start and self._all_held(shard):
                return self._first_read(path[path.index(shard):])
        return -1

    def _all_held(self, shard: int) -> bool:
        """Whether every head of `shard`'s topic is held back by an earlier record waiting on
        another shard: a cycle is a deadlock only then. A head that waits for a shard's end or for
        `settle` instead can go in time, and its release can end the cycle (a retried copy behind
        one head of the cycle goes stale once its first copy, at that head, is handed on)."""
        bufs = self._buf
        return all(self._held_by(s) is not None for s in self._others[shard] + (shard,) if bufs[s])

    def oldest(self) -> int:
        """The shard whose head was read first (ties: the passes' order), -1 when none holds a record."""
        held = [s for s in self._order if self._buf[s]]
        return self._first_read(held) if held else -1

    def force(self, shard: int):
        """Hand `shard`'s head on though it is not covered (a stall decided); None when it holds none."""
        buf = self._buf[self._shard(shard)]
        if not buf:
            return None
        item = self._pop_head(shard)
        if buf:
            self._dirty.add(shard)  # a new head
        return item

    def _pop_head(self, shard: int):
        """Take `shard`'s head out of the merge (as the C merge's pop_head): its item."""
        buf = self._buf[shard]
        head = buf.popleft()
        self._waiting[(shard, head.stream)].popleft()
        self.buffered -= 1
        self._progress = True
        self._release(head)
        self._touch(shard, head.stream, True)
        if buf:
            self._walk.add(shard)  # a new head
        return head.item

    # -- what is held (snapshots, positions) ------------------------------------------------------
    def head(self, shard: int):
        buf = self._buf[shard] if 0 <= shard < len(self._buf) else None
        return buf[0].item if buf else None

    def items(self, shard: int) -> list:
        return [rec.item for rec in self._buf[self._shard(shard)]]

    def order(self) -> list:
        return list(self._order)

    def enlist(self, shard: int) -> None:
        """Put `shard` next in the passes' order (if it is not in it yet): a restore keeps the order."""
        if not self._in_order[self._shard(shard)]:
            self._in_order[shard] = True
            self._order.append(shard)

    def seen(self) -> list:
        """[(shard, stream, order, whether the shard still holds records of the stream), ...]"""
        return [(s, stream, order, bool(self._waiting.get((s, stream)))) for (s, stream), order in self._seen.items()]

    def set_seen(self, shard: int, stream: int, order) -> None:
        self._seen[(self._shard(shard), self._stream(stream))] = _order(order)

    def released(self, stream: int):
        return self._released.get(stream)

    def set_released(self, stream: int, order) -> None:
        self._released[self._stream(stream)] = _order(order)
        self._walk.update(s for s in self._order if self._buf[s])  # what is stale changed

    # -- covering ---------------------------------------------------------------------------------
    def _covers(self, other: int, head: _Rec) -> bool:
        live = self._live(other, head.stream)
        if live is not None:
            return live.order >= head.order
        if self._finished[other]:
            return True
        seen = self._seen.get((other, head.stream))
        if seen is not None and seen >= head.order:
            return True
        if self._end_at[other] >= head.read_at + self.settle:
            return True
        if self._end_ms[other] >= head.system_ms + self.settle * 1000:
            return True
        return head.shard in self._ancestors[other]

    def _blocker(self, shard: int, head: _Rec, others: tuple):
        covers = self._covers
        first = self._blockers.get(shard)
        if first is not None and not covers(first, head):
            return first
        for other in others:
            if other != first and not covers(other, head):
                self._blockers[shard] = other
                return other
        return None

    def _touch(self, shard: int, stream: int, released: bool = False) -> None:
        """What `shard` holds of `stream` changed (and, `released`, what was handed on of it): the
        other shards whose head is of that stream and was held back by `shard` last time (or by
        none; after a release, by any: their head may be stale now) are looked at again."""
        bufs, dirty, blockers = self._buf, self._dirty, self._blockers
        for other in self._others[shard]:
            buf = bufs[other]
            if buf and buf[0].stream == stream:
                if released:
                    self._walk.add(other)  # its head's hold-back may be another shard now
                if other not in dirty and (released or blockers.get(other, shard) == shard):
                    dirty.add(other)


def new_merge(settle: float, native: bool | None = None):
    """The C merge when the extension is there (and `native` is not False), else `PyMerge`."""
    from bridge.native import speedups
    if native is not False and speedups is not None and hasattr(speedups, "Merge"):
        return speedups.Merge(settle)
    return PyMerge(settle)
