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
its end), or it is a descendant of the record's shard (split/merge children only hold later
records), or it was seen at its end at least `settle` seconds after the record was read, or after
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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from bridge.blob.decode import BlobDecoder
from bridge.errors import BridgeError, ConversionError
from bridge.native import speedups
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.stream import ErrorPolicy
from bridge.stream.merge import new_merge
from bridge.tuple.decode import TupleDecoder

__all__ = ["DataHubRecord", "ShardMark", "DataHubAssembler", "OutOfOrderError", "stream_of"]

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


_POS_STREAM = getattr(speedups, "pos_stream", None)  # (speedups is None without the extension)


def stream_of(rec: DataHubRecord) -> tuple[tuple, tuple, tuple]:
    """(stream, order, group) of a record: the stream whose order it keeps, its place in it, and
    the Entry it belongs to (records of one group are contiguous in the stream).

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
        parts = pos.split(":")
        if len(parts) == 4:
            a, b, c, d = parts
            if (a.isdigit() and b.isdigit() and c.isdigit() and d.isdigit()) or \
                    all(x.lstrip("-").isdigit() for x in parts):
                p, o, e, r = int(a), int(b), int(c), int(d)
                return ("pos", rec.topic, attrs.get(ATTR_TOPIC, ""), p), (o, e, r), (o, e)
    if rec.row is not None:
        row = rec.row
        seq = row.get("_sequence_id_")
        if isinstance(seq, str) and seq.isdigit():
            half = 1 if row.get("_operation_type_") == "U" and row.get("_after_image_") == "Y" else 0
            return ("table", rec.topic, row.get("_source_table_")), (int(seq), half), (int(seq),)
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
            if isinstance(seq, str) and seq.isdigit():
                half = _HALF.get(payload.get("op"), 0)
                return ("table", rec.topic, table), (int(seq), half), (int(seq),)
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
    __slots__ = ("decoder", "group", "fed", "index")

    def __init__(self, decoder, index) -> None:
        self.decoder = decoder
        self.group = None  # the group of the last record fed
        self.fed: list = []  # (key, seq, record) of records fed whose Entry is not complete yet
        self.index = index  # the stream's number in the merge


class DataHubAssembler:
    """DataHub records (a `DataHubSource`'s) -> whole Entries, shards merged per stream (see the
    module docstring). `settle`: seconds a shard must have been seen at its end after a record was
    read for that shard to count as holding nothing earlier (a writer still writing). `tables`:
    Tuple topic -> "db.table" (or a callable) for rows without `_source_table_` (else the table is
    the topic's name, in no database). `columns`: Tuple topic -> its DTS columns, restoring types.
    Which record goes next is the merge's (bridge/stream/merge.py: the C one when the extension is
    built, `native=False` the Python reference); the decoders and the error policy are here."""

    def __init__(self, options: Options = DEFAULT_OPTIONS, *, settle: float = 1.0,
                 tables: Mapping[str, str] | Callable[[str], str] | None = None,
                 columns: Mapping[str, list] | None = None, max_pending: int = 100_000,
                 clock: Callable[[], float] = time.monotonic, native: bool | None = None) -> None:
        self.options, self.settle, self.tables, self.columns = options, settle, tables, columns
        self.max_pending, self.clock = max_pending, clock
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
    def buffered(self) -> int:
        """Records read and not handed on yet."""
        return self._merge.buffered

    # -- the Assembler protocol -----------------------------------------------------------------
    def entries(self, records: Iterable[tuple], policy: ErrorPolicy) -> Iterator[tuple]:
        take, feed, shards, tally = self._merge.next, self._feed, self._shards, policy.tally
        for record in records:
            key, seq, value = record[0], record[1], record[2]
            if type(value) is ShardMark:
                self._mark(key, value)
            else:
                self._read(shards.get(key) or self._info(key), key, seq, value, policy)
            item = take()
            while item is not None:
                where, out = feed(item, policy)
                for entry in out:
                    tally.input += 1
                    yield where, entry
                item = take()

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
        while item is not None:
            where, out = self._feed(item, policy)
            for entry in out:
                policy.tally.input += 1
                yield where, entry
            item = take()
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
            "counts": (self.late, self.orphans, self.released),
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
                           (key, seq, rec, stream, group), False)
        for (key, stream), order in snap["seen"].items():
            merge.set_seen(self._info(key).index, self._sid(stream), order)
        self._handed_after.update(snap["handed_after"])
        self.late, self.orphans, self.released = snap["counts"]
        for stream, (group, released, fed) in snap["streams"].items():
            sid = self._sid(stream)
            if released is not None:
                merge.set_released(sid, released)
            st = self._streams[stream] = _Stream(None, sid)
            st.group = group
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
        """Tell the merge each shard of `topic`'s known ancestors (split/merge children only hold
        later records than their parents): the parents, theirs, and so on through known shards."""
        shards = self._shards
        for key, info in shards.items():
            if key[0] != topic:
                continue
            todo, done = list(info.parents), set()
            while todo:
                parent = (topic, todo.pop())
                if parent in done or parent not in shards:
                    continue
                done.add(parent)
                todo.extend(shards[parent].parents)
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
        stream, order, group = stream_of(rec)
        sid = self._sids.get(stream)
        if sid is None:
            sid = self._sid(stream)
        if self._merge.push(info.index, sid, order, rec.read_at, rec.system_time, (key, seq, rec, stream, group)):
            return
        self.late += 1
        policy.tally.input += 1
        err = OutOfOrderError(f"DataHub {key[0]} shard {key[1]} sequence {seq}: a record that belongs before one "
                              f"already handed on (its stream {stream[:3]} at {order}, handed on up to "
                              f"{self._merge.released(sid)}): written after the reader saw its shard at the end for "
                              f"{self.settle} s (raise settle), or written twice",
                              shard=key[1], sequence=seq)
        policy.reject(err, rec.data if rec.data is not None else rec.row)

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
        """Hand a record (the merge's item: key, seq, record, stream, group) to its stream's
        decoder: (where, the Entries it completed)."""
        key, seq, rec, stream, group = item
        st = self._streams.get(stream)
        if st is None or st.decoder is None:
            st = self._stream(stream, rec)
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
