"""Whole Entries from the shards of DataHub topics: the pipeline `Assembler` for a DataHub source.

DataWorks and the forward `sync` route Blob records to shards by primary key, so the rows of one
Entry and the two halves of one UPDATE can sit on different shards, and one shard mixes several
tables and source Kafka partitions. What is ordered: per shard, the records of one **stream** keep
source order, where a stream is

- with the bridge's attributes (`dts.topic`, `dts.pos` = "partition:offset:entry:row"): one source
  Kafka partition of one DataHub topic, ordered by (offset, entry, row);
- else (DataWorks): one table (`schema.source` dbName.tableName of a Blob line, `_source_table_` of
  a Tuple row, or the Tuple topic) of one DataHub topic, ordered by (sequenceId, half) with the
  update's before half first.

`DataHubAssembler` merges the shards per stream (docs/kafka.md, "Reading DataHub: the merge"): a
record is handed to the stream's decoder (BlobDecoder, TupleDecoder) only when it is the next of
its shard (shard order is kept, so a commit below it covers nothing handed on past it) and every
other shard of its topic **covers** it: the shard holds no earlier record of the stream not yet
handed on, and it has shown a later record of the stream, or it is finished (CLOSED and read to
its end), or it descends from the record's shard through splits only (a split's children only
hold later records; a merge's child may hold older ones, see `_ancestry`), or it was seen at its end at least `settle` seconds after the record was read, or after
DataHub's clock was `settle` seconds past the record's system time (when the source knows a lower
bound of that clock: then a record still to land there would land more than `settle` after this
one, in the wrong order, which is the writer's contract in docs/kafka.md). Records
of one Entry are contiguous in their stream, so an Entry is complete when its last record is fed;
when a stream moves on to another Entry while one is incomplete, that one can never complete and
is reported under the error policy (its records counted as rejected), never dropped. A record that
arrives after a later record of its stream was handed on (a writer still writing, slower than
`settle`) is reported as out of order, never reordered silently.

The source's `ShardMark` values (records of the same shape) tell the assembler which shards exist
(with their parents), when one was seen at its end and when one is finished.
"""
from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from bridge.blob.decode import BlobDecoder
from bridge.errors import BridgeError, ConversionError, OptionsError
from bridge.native import speedups
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.stream import ErrorPolicy
from bridge.stream.merge import new_merge
from bridge.tuple.decode import TupleDecoder
from bridge.values import digits, entry_group, signed_digits

__all__ = ["DataHubRecord", "ShardMark", "DataHubAssembler", "OutOfOrderError", "PositionError", "stream_of"]

ATTR_TOPIC = "dts.topic"  # as bridge.datahub.sink writes them
ATTR_POS = "dts.pos"
_HALF = {"UPDATE_BEFOR": 0, "UPDATE_AFTER": 1}


@dataclass(slots=True)
class DataHubRecord:
    """One DataHub record as read: `data` (Blob bytes) or `row` (Tuple: field name -> value) with the
    topic's `schema` (a pydatahub RecordSchema or its JSON), its attributes, sequence, system time
    (DataHub's clock, ms) and when it was read (`time.monotonic()`). Read-only by convention: it is
    not frozen because a frozen dataclass's __init__ costs 5 times as much (0.72 against 0.15 us,
    one per record read); it pickles as the frozen one did (a list of the fields), so a snapshot
    pickled before restores."""
    topic: str
    shard: str
    sequence: int
    system_time: int
    attributes: Mapping[str, str]
    data: bytes | None = None
    row: dict | None = None
    schema: Any = None
    read_at: float = 0.0

    def __getstate__(self) -> list:
        return [self.topic, self.shard, self.sequence, self.system_time, self.attributes, self.data, self.row,
                self.schema, self.read_at]

    def __setstate__(self, state: list) -> None:
        (self.topic, self.shard, self.sequence, self.system_time, self.attributes, self.data, self.row, self.schema,
         self.read_at) = state


@dataclass(frozen=True, slots=True)
class ShardMark:
    """What a DataHub source knows about a shard beyond its records: "shard" (it exists, with its
    parents), "end" (read to its current end at `at`, time.monotonic(); `server_ms`, when known, a
    lower bound of DataHub's clock, ms since the epoch, when that was seen), "finished" (CLOSED and
    read to its end)."""
    kind: str
    topic: str
    shard: str
    parents: tuple = ()
    at: float = 0.0
    server_ms: int | None = None


class OutOfOrderError(ConversionError):
    """A record came after a later record of its stream was handed on."""


class StallError(ConversionError):
    """The merge could not hand any record on and decided a stall (`--on-error fail` stops here)."""


_POS_STREAM = getattr(speedups, "pos_stream", None)  # (speedups is None without the extension)


class PositionError(ConversionError):
    """A record's `dts.pos` attribute is not the bridge's "partition:offset:entry:row"."""


def _position(pos: str) -> tuple[int, int, int, int]:
    parts = pos.split(":")
    if len(parts) == 4 and all(signed_digits(x) for x in parts):
        p, o, e, r = (int(x) for x in parts)
        return p, o, e, r
    raise PositionError(f"{ATTR_POS} {pos[:64]!r} is not partition:offset:entry:row in ASCII digits",
                        value=pos[:64])


def stream_of(rec: DataHubRecord) -> tuple[tuple, tuple, tuple]:
    """(stream, order, group) of a record: the stream whose order it keeps, its place in it, and
    the Entry it belongs to (records of one group are contiguous in the stream). A record without
    position attributes is grouped as its decoder rebuilds Entries (`bridge.values.entry_group`:
    the rows of a lossless line's DML event by their Entry's seqId, any other line or row alone).
    A `dts.pos` that is not the bridge's shape is a `PositionError` (the record's own error).

    >>> r = DataHubRecord("t", "0", 5, 0, {"dts.topic": "k", "dts.pos": "2:40:1:3"}, data=b"{}")
    >>> stream_of(r)
    (('pos', 't', 'k', 2), (40, 1, 3), (40, 1))
    """
    attrs = rec.attributes
    pos = attrs.get(ATTR_POS) if attrs else None
    if pos is not None:
        if _POS_STREAM is not None:  # plain "p:o:e:r" in C (the same tuples), else the lines below
            got = _POS_STREAM(pos, rec.topic, attrs.get(ATTR_TOPIC, ""))
            if got is not None:
                return got
        p, o, e, r = _position(pos) if type(pos) is str else _position(str(pos))
        return ("pos", rec.topic, attrs.get(ATTR_TOPIC, ""), p), (o, e, r), (o, e)
    if rec.row is not None:
        row = rec.row
        seq = row.get("_sequence_id_")
        if digits(seq):
            half = 1 if row.get("_operation_type_") == "U" and row.get("_after_image_") == "Y" else 0
            value = int(seq)
            return ("table", rec.topic, row.get("_source_table_")), (value, half), entry_group(value)
    elif rec.data is not None:
        try:
            msg = orjson.loads(rec.data)
        except orjson.JSONDecodeError:
            msg = None
        if type(msg) is dict:
            payload = msg.get("payload")
            schema = msg.get("schema")
            source = schema.get("source") if type(schema) is dict else None
            table = (source.get("dbName"), source.get("tableName")) if type(source) is dict else (None, None)
            seq = payload.get("sequenceId") if type(payload) is dict else None
            if digits(seq):
                half = _HALF.get(payload.get("op"), 0)
                value = int(seq)
                ext = msg.get("dts")
                row = ext.get("row") if type(ext) is dict else None
                rows = row[1] if type(row) is list and len(row) == 2 and type(row[1]) is int else 1
                return ("table", rec.topic, table), (value, half), entry_group(value, rows)
    # nothing to order it by: a stream of its own (the decoder will say what is wrong with it)
    return ("shard", rec.topic, rec.shard, rec.sequence), (rec.sequence,), (rec.sequence,)


class _ShardInfo:
    __slots__ = ("parents", "finished", "end_at", "end_server_ms", "index")

    def __init__(self, parents=(), index=0) -> None:
        self.parents = tuple(parents)
        self.finished = False
        self.end_at = float("-inf")
        self.end_server_ms = float("-inf")  # DataHub's clock (at least) when last seen at its end
        self.index = index  # the shard's number in the merge


class _Stream:
    __slots__ = ("decoder", "group", "fed", "index", "order")

    def __init__(self, decoder, index) -> None:
        self.decoder = decoder
        self.group = None  # the group of the last record fed
        self.order = None  # the order of the last record fed
        self.fed: list = []  # (key, seq, record) of records fed whose Entry is not complete yet
        self.index = index  # the stream's number in the merge


class DataHubAssembler:
    """DataHub records (a `DataHubSource`'s) -> whole Entries, shards merged per stream (see the
    module docstring). `settle`: seconds a shard must have been seen at its end after a record was
    read for that shard to count as holding nothing earlier (a writer still writing). `tables`:
    Tuple topic -> "db.table" (or a callable) for rows without `_source_table_` (else the table is
    the topic's name, in no database). `columns`: Tuple topic -> its DTS columns, restoring types.
    Which record goes next is the merge's (bridge/stream/merge.py: the C one when the extension is
    built, `native=False` the Python reference); the decoders and the error policy are here.

    Nothing stalls (docs/kafka.md, "Reading DataHub: stalls"): a record written twice (the same
    position, or the same sequenceId and content, on one shard or two) is dropped and counted
    (`duplicates`, the tally's `duplicates`; the last `dup_window` records handed on are kept to
    know one); when no record can be handed on, shards holding each other back in a cycle are
    decided at once, and more than `max_buffered` records held, or `stall_seconds` with records
    held and none handed on, decide the shard whose head was read first: that head is handed on
    though not covered, a record of its stream that then comes after a later one is reported as out
    of order (rejected, with shard and sequence), and under `on_error="fail"` the decision itself
    is a `StallError`. So memory is bounded by `max_buffered` records (plus the decoders'
    `max_pending` halves and `dup_window` references) whatever the input."""

    def __init__(self, options: Options = DEFAULT_OPTIONS, *, settle: float = 1.0,
                 tables: Mapping[str, str] | Callable[[str], str] | None = None,
                 columns: Mapping[str, list] | None = None, max_pending: int = 100_000,
                 clock: Callable[[], float] = time.monotonic, native: bool | None = None,
                 max_buffered: int = 100_000, stall_seconds: float | None = 300.0, dup_window: int = 10_000) -> None:
        if type(max_buffered) is not int or max_buffered < 1:
            raise OptionsError(f"max_buffered = {max_buffered!r}: the records the merge may hold, a whole number of "
                               "at least 1")
        if stall_seconds is not None and not stall_seconds > 0:
            raise OptionsError(f"stall_seconds = {stall_seconds!r}: seconds without progress before a stall is "
                               "decided, more than 0 (or None: never by time)")
        self.options, self.settle, self.tables, self.columns = options, settle, tables, columns
        self.max_pending, self.clock = max_pending, clock
        self.max_buffered, self.stall_seconds, self.dup_window = max_buffered, stall_seconds, dup_window
        self.duplicates = 0
        self.stalls = 0  # stalls decided (a head handed on though not covered)
        self.last_stall: dict | None = None  # what the last decision was (for status lines and logs)
        self._recent: OrderedDict = OrderedDict()  # (stream number, order) -> the record handed on
        self._progress_at = clock()  # when a record was last handed on (or nothing was held)
        self._looked_at = self._progress_at  # when every shard was last looked at for a cycle
        self._merge = new_merge(settle, native)
        self._shards: dict = {}  # key -> _ShardInfo (its `index` in the merge)
        self._keys: list = []  # the merge's shard number -> key
        self._topic_ids: dict = {}  # topic -> the merge's number
        self._sids: dict = {}  # stream -> the merge's number
        self._stream_keys: list = []  # the merge's stream number -> stream
        self._streams: dict = {}  # stream -> _Stream (streams a record was handed on of)
        self.late = 0
        self.orphans = 0
        self.released = 0
        self._handed_after: dict = {}  # key -> the last sequence handed to a decoder
        self._key_texts: dict = {}  # key -> "topic:shard"

    @property
    def stall(self) -> dict | None:
        """What holds the merge back now, when records have waited more than `settle` s with none
        handed on: the shard whose head was read first, its stream, the records held and for how
        long; None otherwise (the status line's STALLED and the metrics read it)."""
        merge = self._merge
        if not merge.buffered:
            return None
        waited = self.clock() - self._progress_at
        if waited <= max(self.settle, 1.0):
            return None
        shard = merge.oldest()
        head = merge.head(shard) if shard >= 0 else None
        if head is None:
            return None
        return {"shard": f"{head[0][0]}:{head[0][1]}", "sequence": head[1], "stream": _stream_text(head[3]),
                "held": merge.buffered, "seconds": round(waited, 1)}

    @property
    def buffered(self) -> int:
        """Records read and not handed on yet."""
        return self._merge.buffered

    # -- the Assembler protocol -----------------------------------------------------------------
    def entries(self, records: Iterable[tuple], policy: ErrorPolicy) -> Iterator[tuple]:
        merge, feed, shards, tally = self._merge, self._feed, self._shards, policy.tally
        take = merge.next
        for record in records:
            key, seq, value = record[0], record[1], record[2]
            if type(value) is ShardMark:
                self._mark(key, value)
            else:
                self._read(shards.get(key) or self._info(key), key, seq, value, policy)
            item = take()
            if item is None and merge.buffered:
                item = self._decide(policy, False)
            while item is not None:
                where, out = feed(item, policy)
                for entry in out:
                    tally.input += 1
                    yield where, entry
                item = take()
                if item is None and merge.buffered:
                    item = self._decide(policy, False)
            if not merge.buffered:
                self._progress_at = self.clock()

    def resume_at(self, key) -> None:
        """Nothing to skip: a committed position never lies past a record handed on (shard order)."""

    def held_from(self, key) -> int | None:
        first = None
        info = self._shards.get(key)
        if info is not None:
            head = self._merge.head(info.index)
            if head is not None:
                first = head[1]
        for stream in self._streams.values():
            for k, s, _ in stream.fed:
                if k == key and (first is None or s < first):
                    first = s
        return first

    def held(self) -> int:
        return self._merge.buffered + sum(len(s.fed) for s in self._streams.values())

    def waiting(self) -> bool:
        """Records wait for a fresh look at shards at their end (the source's `wants_tick`)."""
        return self._merge.buffered > 0

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
        self._merge.finish_all()
        take = self._merge.next
        item = take()
        if item is None and self._merge.buffered:
            item = self._decide(policy, True)
        while item is not None:
            where, out = self._feed(item, policy)
            for entry in out:
                policy.tally.input += 1
                yield where, entry
            item = take()
            if item is None and self._merge.buffered:
                item = self._decide(policy, True)
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
        merge, keys, skeys = self._merge, self._keys, self._stream_keys
        streams = {}
        for stream, st in self._streams.items():
            if stream[0] == "shard" and not st.fed:
                continue
            streams[stream] = (st.group, merge.released(st.index), [(k, s, rec) for k, s, rec in st.fed])
        seen = {}
        for shard, sid, order, waiting in merge.seen():
            stream = skeys[sid]
            if stream[0] != "shard" or waiting:
                seen[(keys[shard], stream)] = order
        buffered = []
        for shard in merge.order():
            items = merge.items(shard)
            if items:
                buffered.append((keys[shard], [(item[1], item[2]) for item in items]))
        return {
            "shards": [(key, info.parents, info.finished, info.end_at, info.end_server_ms)
                       for key, info in self._shards.items()],
            "order": [keys[shard] for shard in merge.order()],  # the merge's passes' order
            "buffered": buffered,
            "seen": seen,
            "streams": streams,
            "handed_after": dict(self._handed_after),
            "counts": (self.late, self.orphans, self.released, self.duplicates, self.stalls),
            # the records handed on last, as digests: a copy read after a restore is still known
            "recent": [(skeys[sid], order, first if type(first) is int else _digest(first))
                       for (sid, order), first in self._recent.items()],
        }

    def restore(self, snap: dict) -> None:
        """Take over a `snapshot`: the records fed to an open Entry go to a fresh decoder again
        (they complete nothing, as they did not before)."""
        merge = self._merge
        for key, parents, finished, end_at, *server in snap["shards"]:  # (a snapshot of before had no server)
            info = self._info(key, parents)
            info.finished, info.end_at = finished, end_at
            if server:
                info.end_server_ms = server[0]
            merge.mark(info.index, info.finished, info.end_at, info.end_server_ms)
        for key in snap.get("order", ()):  # (a snapshot of before had none: its buffered shards' order)
            merge.enlist(self._info(key).index)
        for key, items in snap["buffered"]:
            info = self._info(key)
            for seq, rec in items:
                stream, order, group = stream_of(rec)
                merge.push(info.index, self._sid(stream), order, rec.read_at, rec.system_time,
                           (key, seq, rec, stream, group, order), False)
        for (key, stream), order in snap["seen"].items():
            merge.set_seen(self._info(key).index, self._sid(stream), order)
        self._handed_after.update(snap["handed_after"])
        for stream, order, digest in snap.get("recent", ()):
            self._recent[(self._sid(stream), order)] = digest
        self.late, self.orphans, self.released, *more = snap["counts"]  # (a snapshot of before had three)
        if more:
            self.duplicates, self.stalls = more
        for stream, (group, released, fed) in snap["streams"].items():
            sid = self._sid(stream)
            if released is not None:
                merge.set_released(sid, released)
            st = self._streams[stream] = _Stream(None, sid)
            st.group, st.order = group, released
            for key, seq, rec in fed:
                st = self._stream(stream, rec)
                if rec.row is not None:
                    out = st.decoder.feed(rec.row, number=seq)
                else:
                    out = st.decoder.feed_line(rec.data, line=seq, source=f"{key[0]}:{key[1]}")
                if out:  # cannot be: these records completed nothing the first time
                    raise BridgeError(f"DataHub {key[0]} shard {key[1]} sequence {seq}: a restored open Entry "
                                      "completed on restore (a snapshot of other options?)")
                st.fed.append((key, seq, rec))

    # -- marks and records --------------------------------------------------------------------
    def _sid(self, stream) -> int:
        sid = self._sids.get(stream)
        if sid is None:
            sid = self._sids[stream] = len(self._stream_keys)
            self._stream_keys.append(stream)
        return sid

    def _info(self, key, parents=()) -> _ShardInfo:
        info = self._shards.get(key)
        if info is None:
            topic = self._topic_ids.get(key[0])
            if topic is None:
                topic = self._topic_ids[key[0]] = len(self._topic_ids)
            info = self._shards[key] = _ShardInfo(parents, self._merge.add_shard(topic))
            self._keys.append(key)
            self._ancestry(key[0])
        elif parents and not info.parents:
            info.parents = tuple(parents)
            self._ancestry(key[0])
        return info

    def _ancestry(self, topic: str) -> None:
        """Tell the merge, for each shard of `topic`, the shards it only holds later records than:
        its parent when it is a split's child, that parent's when the parent is one too, and so on
        through known shards. A merge's child is not one: a writer moves what it had not written to
        a merged shard yet (bridge/datahub/writer.py, a user's retries) to the child, and what it
        had for one parent can be older than what already landed on the other (docs/kafka.md,
        "Writing through splits and merges"), so a merge's child covers its parents' heads only
        by what it holds and shows, as any other shard."""
        shards = self._shards
        for key, info in shards.items():
            if key[0] != topic:
                continue
            done, parents = set(), info.parents
            while len(parents) == 1:
                parent = (topic, parents[0])
                if parent in done or parent not in shards:
                    break
                done.add(parent)
                parents = shards[parent].parents
            self._merge.set_ancestors(info.index, sorted(shards[k].index for k in done))

    def _mark(self, key, mark: ShardMark) -> None:
        info = self._info(key, mark.parents)
        if mark.kind == "finished":
            info.finished = True
        elif mark.kind == "end":
            info.end_at = max(info.end_at, mark.at)
            if mark.server_ms is not None:
                info.end_server_ms = max(info.end_server_ms, mark.server_ms)
        # what the mark says about this shard may cover the heads of every other shard of its topic
        self._merge.mark(info.index, info.finished, info.end_at, info.end_server_ms)

    def _read(self, info: _ShardInfo, key, seq: int, rec: DataHubRecord, policy: ErrorPolicy) -> None:
        try:
            stream, order, group = stream_of(rec)
        except BridgeError as err:
            policy.tally.input += 1
            policy.reject(err.located(shard=f"{key[0]}:{key[1]}", sequence=seq),
                          rec.data if rec.data is not None else rec.row)
            return
        sid = self._sids.get(stream)
        if sid is None:
            sid = self._sid(stream)
        if self._merge.push(info.index, sid, order, rec.read_at, rec.system_time,
                            (key, seq, rec, stream, group, order)):
            return
        released = self._merge.released(sid)
        if self._duplicate(sid, order, rec, released):
            policy.tally.duplicates += 1
            return
        self._late(key, seq, rec, stream, order, released, policy)

    def _late(self, key, seq, rec, stream, order, released, policy: ErrorPolicy) -> None:
        self.late += 1
        policy.tally.input += 1
        forced = " (a stall was decided past it)" if self.stalls else ""
        err = OutOfOrderError(f"DataHub {key[0]} shard {key[1]} sequence {seq}: a record that belongs before one "
                              f"already handed on{forced} (its stream {_stream_text(stream)} at {order}, handed on "
                              f"up to {released}): written after the reader saw its shard at the end for "
                              f"{self.settle} s (raise settle), or its writer did not keep the order",
                              shard=key[1], sequence=seq)
        policy.reject(err, rec.data if rec.data is not None else rec.row)

    def _duplicate(self, sid: int, order: tuple, rec: DataHubRecord, last) -> bool:
        """Whether `rec`, which comes at or before `last` (the order its stream was handed on up to),
        is a copy of a record handed on (then counted): the same content at the same order when
        that record is still among the last `dup_window` handed on, else the same order as the last
        one (a stream's order is a position: two records at one are one record written twice)."""
        first = self._recent.get((sid, order))
        if type(first) is int:  # restored from a snapshot: the first copy's digest
            same = first == _digest(rec)
        elif first is not None:
            same = first.data == rec.data and first.row == rec.row
        else:
            same = order == last
        if same:
            self.duplicates += 1
        return same

    def _decide(self, policy: ErrorPolicy, ending: bool):
        """No record can be handed on though some are held: the head to hand on anyway (a stall
        decided), or None while waiting is still right (no cycle, within both bounds)."""
        merge = self._merge
        now = self.clock()
        shard, why = -1, None
        # a cycle is decided as soon as it closes: the merge walks from the shards whose hold-back
        # changed since it last looked (bridge/stream/merge.py, `stuck(True)`: at the cost of those
        # walks, not of every shard); every shard is looked at too at the end and, a safety net,
        # once a second while none can go on
        shard = merge.stuck(True)
        if shard < 0 and (ending or now - self._looked_at >= 1.0):
            shard = merge.stuck()
            self._looked_at = now
        if shard >= 0:
            why = "its shards hold each other back (each waits for an earlier record of its stream behind " \
                  "the other's head)"
        if shard < 0:
            if ending:
                shard, why = merge.oldest(), "at the end of input"
            elif merge.buffered > self.max_buffered:
                shard, why = merge.oldest(), f"more than max_buffered = {self.max_buffered} records held"
            elif self.stall_seconds is not None and now - self._progress_at >= self.stall_seconds:
                shard, why = merge.oldest(), f"nothing handed on for stall_seconds = {self.stall_seconds} s"
            else:
                return None
        head = merge.head(shard)
        key, seq = head[0], head[1]
        self.stalls += 1
        self.last_stall = {"shard": f"{key[0]}:{key[1]}", "sequence": seq, "stream": _stream_text(head[3]),
                           "held": merge.buffered, "reason": why}
        if policy.on_error == "fail":
            raise StallError(f"DataHub {key[0]} shard {key[1]} sequence {seq}: the merge stalled, {why}: "
                             f"{merge.buffered} records held, none can go on in order (stream "
                             f"{_stream_text(head[3])}); --on-error skip hands the oldest on and rejects what then "
                             "comes out of order", shard=key[1], sequence=seq)
        return merge.force(shard)

    def _stream(self, stream, rec: DataHubRecord) -> _Stream:
        st = self._streams.get(stream)
        if st is None or st.decoder is None:
            if rec.row is not None:
                table = self._table(rec.topic)
                cols = self.columns.get(rec.topic) if self.columns else None
                decoder = TupleDecoder(rec.schema, self.options, table=table, columns=cols,
                                       max_pending=self.max_pending)
            else:
                decoder = BlobDecoder(self.options, max_pending=self.max_pending)
            if st is None:
                st = self._streams[stream] = _Stream(decoder, self._sid(stream))
            else:
                st.decoder = decoder
        return st

    def _table(self, topic: str):
        tables = self.tables
        if tables is None:
            return ("", topic)
        name = tables(topic) if callable(tables) else tables.get(topic)
        return name if name else ("", topic)

    def _feed(self, item: tuple, policy: ErrorPolicy) -> tuple[dict | None, list]:
        """Hand a record (the merge's item: key, seq, record, stream, group, order) to its stream's
        decoder: (where, the Entries it completed); a copy of the record fed before it is dropped,
        one that comes after a later record (past a stall decided) is reported."""
        key, seq, rec, stream, group, order = item
        self._progress_at = self.clock()
        st = self._streams.get(stream)
        if st is None or st.decoder is None:
            st = self._stream(stream, rec)
        if st.order is not None and order <= st.order:
            ha = self._handed_after
            if seq > ha.get(key, -1):
                ha[key] = seq
            if self._duplicate(st.index, order, rec, st.order):
                policy.tally.duplicates += 1
            else:
                self._late(key, seq, rec, stream, order, st.order, policy)
            return None, ()
        st.order = order
        recent = self._recent
        recent[(st.index, order)] = rec
        if len(recent) > self.dup_window:
            recent.popitem(last=False)
        decoder = st.decoder
        if st.fed and st.group != group:
            # the stream moved on to another Entry: the open one can never complete
            self.orphans += 1
            self._report(st, decoder.finish(), policy)
            st.fed.clear()
        st.group = group
        self.released += 1
        ha = self._handed_after
        if seq > ha.get(key, -1):
            ha[key] = seq
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


def _digest(rec: DataHubRecord) -> int:
    """A record's content as a number that is the same in every process (a snapshot keeps these)."""
    if rec.data is not None:
        return zlib.crc32(rec.data)
    return zlib.crc32(orjson.dumps(rec.row, option=orjson.OPT_SORT_KEYS, default=str)) if rec.row is not None else 0


def _stream_text(stream: tuple) -> str:
    """A stream as a status line or an error says it: ("pos", topic, source topic, partition) ->
    "source topic partition N", ("table", topic, table) -> "table db.name", ("shard", ...) -> "shard"."""
    kind = stream[0]
    if kind == "pos":
        return f"{stream[2] or 'Kafka'} partition {stream[3]}"
    if kind == "table":
        table = stream[2]
        if type(table) is tuple:
            table = ".".join(str(t) for t in table if t)
        return f"table {table or '(none)'}"
    return "its shard alone"
