"""Models of the writers `sync --to dts` must read (SPEC.md section 7, "Writers the reverse pipeline
must read"), of DataHub's shards under them, and of a reader that reads those shards under any legal
schedule: shared by tests/test_writer_models.py.

Written apart from the bridge's writers (bridge/datahub, bridge/sync.py, bridge/cli/deliver.py): what
each writer puts on DataHub is restated here from the docs, only the line and row encoders
(`BlobEncoder`, `entry_to_tuples`) are the bridge's, since their output is what the writers carry.

- `forward_sync`: the forward `sync` / Spark `datahub` sink. The bridge's lossless Blob lines, each
  with `dts.topic` (the Kafka topic) and `dts.pos` = "partition:offset:entry:row" (the offset of the
  Envelope the Entry starts in, the Entry's index among that Envelope's Entries, the line's index
  among the Entry's lines), routed by DataWorks' rule (the primary key's values, else "db.table").
- `deliver`: `dts-bridge deliver FILE` of the lossless lines of a file: each line one record,
  `dts.topic` = "file:" + the file's absolute path, `dts.pos` = "0:FIRST:0:ROW" (FIRST: the 1-based
  line number of the Entry's first line, ROW: the line's place in its Entry), routed by
  DataWorks' rule.
- `dataworks_blob`: DataWorks' real-time sync, Blob: strict lines (one message per row, no `dts`
  extension), primary-key routing, no attributes.
- `dataworks_tuple`: DataWorks' real-time sync, Tuple: one topic per table (and column set), rows
  with its meta columns, primary-key routing, no attributes.
- `foreign_lossless`: any other writer of the bridge's lossless Blob lines (what `dts-bridge
  convert` writes), no attributes, routed by primary key, by table or at random.

Each model gives the records in write order (`Rec`, with a logical id `rid`) and what `convert`
gives of the same lines or rows (`blob_lines_to_entries` / `tuple_rows_to_entries`, in file order):
per stream (a source partition, a file, or a table of a topic), the Entries in order, each with the
ids of the records it is made of.

`DataHubModel` lands them: per shard in write order; a writer's retry lands a batch again (on the
same shard, or, after that shard was split or merged, where the routing sends it now); shards split
and merge between any two records (parents CLOSED, the children get only later records). `Reader`
reads the shards as `DataHubSource` does (a CLOSED shard to its end before any child, a child once
all its parents are finished; pages cut anywhere; shards in any interleaving) and makes what the
source hands the assembler: `(key, sequence, DataHubRecord | ShardMark, {})`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import random

import orjson

from bridge.blob.encode import BlobEncoder
from bridge.options import Options
from bridge.samples import PRIMARY, WORDS, Binlog, Col, Table, build_sample_entries, delete, insert, update
from bridge.samples.values import integer, serial, words
from bridge.stream import ErrorPolicy, blob_lines_to_entries, tuple_rows_to_entries
from bridge.stream.shards import DataHubRecord, ShardMark
from bridge.tuple.decode import TupleDecoder
from bridge.tuple.encode import entry_to_tuples, record_schema
from bridge.wire import subscribe_pb2 as pb

DECODE = Options()  # what `sync --to dts` and `convert` read with by default
BLOB_TOPIC = "blobs"
KAFKA_TOPIC = "dts-topic"
DELIVERED_FILE = os.path.abspath("/data/mixed.jsonl")


@dataclasses.dataclass
class Rec:
    """One record a writer writes (before routing and retries)."""
    rid: int
    topic: str
    key: str | None  # the routing key (None: routed at random)
    data: bytes | None = None
    row: dict | None = None
    schema: dict | None = None
    attributes: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Written:
    """A writer's records in write order and what `convert` makes of them: `expected[stream]` =
    [(Entry bytes, rids of its records)] in order; `entry_of[rid]` = (stream, index)."""
    writer: str
    records: list
    expected: dict
    entry_of: dict
    tables: dict  # Tuple topic -> "db.table" (DataHubAssembler(tables=...))
    routing: str = "key"  # key | random


# -- the inputs: samples and generated binlogs ------------------------------------------------------

_SAMPLES = None
SAMPLE_NAMES = ("mixed", "realistic", "mariadb", "types")


def samples() -> dict:
    global _SAMPLES
    if _SAMPLES is None:
        _SAMPLES = build_sample_entries()
    return _SAMPLES


ITEMS = Table("shop", "items", (Col("id", "int(11)", serial(1), key=True), Col("qty", "int(11)", integer(1, 9)),
                                Col("name", "varchar(40)", words(WORDS, 1, 2))))
NOTES = Table("shop", "notes", (Col("body", "varchar(40)", words(WORDS, 1, 3)),))  # no primary key
PAIRS = Table("hr", "pairs", (Col("a", "int(11)", serial(1), key=True), Col("b", "int(11)", serial(5), key=True),
                              Col("v", "int(11)", integer(0, 99))))


def generated(rng: random.Random, transactions: int) -> list:
    """A DTS stream from the samples' binlog model: transactions of inserts, updates and deletes of
    1-4 rows on three tables (one without a primary key, one with two key columns), heartbeats."""
    b = Binlog(PRIMARY, seed=rng.randrange(1 << 30))
    for t in (ITEMS, NOTES, PAIRS):
        b.ddl(t.create_sql(), schema=t.schema, table=t.name)
    live = {t.name: [] for t in (ITEMS, NOTES, PAIRS)}
    for _ in range(transactions):
        changes = []
        for _ in range(rng.randint(1, 3)):
            table = rng.choice((ITEMS, NOTES, PAIRS))
            rows = live[table.name]
            kind = rng.choice(("insert", "insert", "update", "delete")) if rows else "insert"
            n = rng.randint(1, 4)
            if kind == "insert":
                new = [b.row(table) for _ in range(n)]
                rows.extend(new)
                changes.append(insert(table, new))
            elif kind == "update":
                picked = rows[:n]
                pairs = []
                for i, old in enumerate(picked):
                    fresh = b.row(table)
                    new = {c.name: old[c.name] if c.key else fresh[c.name] for c in table.cols}
                    pairs.append((old, new))
                    rows[i] = new
                changes.append(update(table, pairs))
            else:
                gone, live[table.name] = rows[:n], rows[n:]
                changes.append(delete(table, gone))
        b.transaction(*changes)
        if rng.random() < 0.2:
            b.idle(6)
    return b.finish()


def pick_entries(rng: random.Random, size: int) -> list:
    """A stretch of a sample (any contiguous stretch of a DTS stream is one), or a generated stream."""
    if rng.random() < 0.35:
        return generated(rng, max(1, size // 4))
    entries = samples()[rng.choice(SAMPLE_NAMES)]
    start = rng.randrange(max(1, len(entries) - size))
    return list(entries[start:start + size])


# -- what `convert` makes of lines and rows -----------------------------------------------------------

def _groups(converted: list, count: int) -> list:
    """[(Entry bytes, line indexes 0-based)] from convert's (where, Entry) in file order: an Entry is
    the lines after the previous Entry's last line up to its own (lines of one Entry are contiguous
    in a file)."""
    out, first = [], 0
    for where, entry in converted:
        last = where.get("line", where.get("row"))
        out.append((entry.SerializeToString(), tuple(range(first, last))))
        first = last
    assert first == count, f"convert left lines {first}..{count} out of its Entries"
    return out


def converted_lines(lines: list) -> list:
    policy = ErrorPolicy("fail")
    got = list(blob_lines_to_entries(list(enumerate(lines, 1)), policy, DECODE))
    assert policy.tally.rejected == 0
    return _groups(got, len(lines))


def converted_rows(rows: list, schema: dict, table: str) -> list:
    policy = ErrorPolicy("fail")
    got = list(tuple_rows_to_entries(list(enumerate(rows, 1)), TupleDecoder(schema, DECODE, table=table), policy))
    return _groups(got, len(rows))


def line_source(line: bytes):
    """The table a line's stream is (docs/kafka.md: a Blob line's `schema.source`), None without one."""
    schema = orjson.loads(line).get("schema") or {}
    source = schema.get("source")
    return (source.get("dbName"), source.get("tableName")) if isinstance(source, dict) else None


def dataworks_key(line: bytes) -> str:
    """DataWorks' routing key, restated (SPEC.md 2): the primary key's values (after image, else the
    before image) as a JSON array when the table has one, else "db.table"."""
    msg = orjson.loads(line)
    schema = msg.get("schema") or {}
    keys = schema.get("primaryKey") or []
    payload = msg.get("payload") or {}
    image = ((payload.get("after") or payload.get("before") or {}).get("dataColumn")) or {}
    if keys and image:
        return orjson.dumps([image.get(k) for k in keys]).decode()
    source = schema.get("source") or {}
    return f"{source.get('dbName', '')}.{source.get('tableName', '')}"


def _written(writer, records, per_stream, tables=None, routing="key") -> Written:
    """Records and, per stream, [(Entry bytes, rids)]."""
    entry_of = {}
    for stream, entries in per_stream.items():
        for index, (_, rids) in enumerate(entries):
            for rid in rids:
                assert rid not in entry_of
                entry_of[rid] = (stream, index)
    assert set(entry_of) == {r.rid for r in records}
    return Written(writer, records, per_stream, entry_of, tables or {}, routing)


# -- the writers --------------------------------------------------------------------------------------

def forward_sync(parts: list, rng: random.Random) -> Written:
    """The forward `sync` (and Spark's `datahub` sink) over a Kafka topic of len(parts) partitions
    (`parts[p]`: that partition's Entries): lossless lines with their source positions. Entries
    share an Envelope now and then (the same offset, entry 0, 1, ...)."""
    encoder = BlobEncoder(Options())
    records, per_stream = [], {}
    queues = []
    for p, entries in enumerate(parts):
        lines, places = [], []
        offset, index = rng.randrange(0, 1000), 0
        for number, entry in enumerate(entries):
            if number and rng.random() < 0.6:  # the next Envelope
                offset += rng.randint(1, 3)
                index = 0
            elif number:  # one more Entry of the same Envelope
                index += 1
            for row, line in enumerate(encoder.convert_lines(entry)):
                lines.append(line)
                places.append(f"{p}:{offset}:{index}:{row}")
        groups = converted_lines(lines)
        queues.append((p, lines, places, groups))
    # the partitions' lines interleave as the sync's consumer reads them (one partition keeps its order)
    cursors = [0] * len(queues)
    rid_of = {}
    while any(cursors[i] < len(q[1]) for i, q in enumerate(queues)):
        i = rng.choice([i for i, q in enumerate(queues) if cursors[i] < len(q[1])])
        p, lines, places, _ = queues[i]
        n = cursors[i]
        rid = len(records)
        rid_of[(p, n)] = rid
        records.append(Rec(rid, BLOB_TOPIC, dataworks_key(lines[n]), data=lines[n],
                           attributes={"dts.topic": KAFKA_TOPIC, "dts.pos": places[n]}))
        cursors[i] += 1
    for p, _, _, groups in queues:
        per_stream[("partition", p)] = [(raw, tuple(rid_of[(p, n)] for n in lines_)) for raw, lines_ in groups]
    return _written("sync", records, per_stream)


def deliver(entries: list) -> Written:
    """`dts-bridge deliver` of the file `convert` wrote of `entries`: each line one record with
    the file's position (bridge/cli/deliver.py, docs/kafka.md "dts-bridge deliver")."""
    encoder = BlobEncoder(Options())
    lines, places = [], []
    for e in entries:  # an Entry's lines share the number of its first line (1-based), row by row
        first = len(lines) + 1
        for row, line in enumerate(encoder.convert_lines(e)):
            lines.append(line)
            places.append(f"0:{first}:0:{row}")
    records = [Rec(n, BLOB_TOPIC, dataworks_key(line), data=line,
                   attributes={"dts.topic": "file:" + DELIVERED_FILE, "dts.pos": places[n]})
               for n, line in enumerate(lines)]
    return _written("deliver", records, {("file", 0): converted_lines(lines)})


def _per_table(lines: list, topic: str) -> dict:
    """convert of one file of lines, its Entries per stream (the table of their lines)."""
    out: dict = {}
    for raw, idx in converted_lines(lines):
        tables = {line_source(lines[i]) for i in idx}
        assert len(tables) == 1, tables
        out.setdefault(("table", topic, tables.pop()), []).append((raw, idx))
    return out


def dataworks_blob(entries: list) -> Written:
    """DataWorks' real-time sync to a Blob topic: strict lines, primary-key routing, no attributes."""
    encoder = BlobEncoder(Options(strict=True))
    lines = [line for e in entries for line in encoder.convert_lines(e)]
    records = [Rec(n, BLOB_TOPIC, dataworks_key(line), data=line) for n, line in enumerate(lines)]
    return _written("dataworks-blob", records, _per_table(lines, BLOB_TOPIC))


def foreign_lossless(entries: list, routing: str) -> Written:
    """Another writer of the bridge's lossless lines (`convert`'s output), no attributes, routed
    by primary key ("key"), by table ("table") or at random ("random")."""
    encoder = BlobEncoder(Options())
    lines = [line for e in entries for line in encoder.convert_lines(e)]
    records = []
    for n, line in enumerate(lines):
        if routing == "key":
            key = dataworks_key(line)
        elif routing == "table":
            source = line_source(line)
            key = f"{source[0]}.{source[1]}" if source else "."
        else:
            key = None
        records.append(Rec(n, BLOB_TOPIC, key, data=line))
    return _written(f"foreign-{routing}", records, _per_table(lines, BLOB_TOPIC),
                    routing="random" if routing == "random" else "key")


def dataworks_tuple(entries: list) -> Written:
    """DataWorks' real-time sync to Tuple topics: one topic per table (a new one when its columns
    change: a topic has one RecordSchema), rows with its meta columns, primary-key routing."""
    topics: dict = {}  # (db, table, schema JSON) -> (topic, schema, keys, rows)
    order = []  # (topic, row) in write order
    for e in entries:
        h = e.header
        if h.messageType != pb.DML:
            continue
        columns = e.event.dmlEvent.columns
        schema = record_schema(columns, DECODE)
        ident = (h.schemaName, h.tableName, orjson.dumps(schema))
        if ident not in topics:
            n = sum(1 for k in topics if k[:2] == ident[:2])
            topics[ident] = (f"{h.schemaName}_{h.tableName}" + (f"_v{n}" if n else ""), schema,
                             [c.name for c in columns if c.isKey], [])
        topic, schema, keys, rows = topics[ident]
        for row in entry_to_tuples(e, DECODE):
            rows.append(row)
            order.append((topic, row, keys, f"{h.schemaName}.{h.tableName}"))
    records, index = [], {}
    for topic, row, keys, table in order:
        key = orjson.dumps([row.get(k) for k in keys], default=str).decode() if keys else table
        index.setdefault(topic, []).append(len(records))
        schema = next(t[1] for t in topics.values() if t[0] == topic)
        records.append(Rec(len(records), topic, key, row=row, schema=schema))
    per_stream, tables = {}, {}
    for (db, table, _), (topic, schema, _, rows) in topics.items():
        tables[topic] = f"{db}.{table}"
        groups = converted_rows(rows, schema, f"{db}.{table}")
        per_stream[("tuple", topic)] = [(raw, tuple(index[topic][i] for i in idx)) for raw, idx in groups]
    return _written("dataworks-tuple", records, per_stream, tables)


# -- DataHub's shards under a writer ------------------------------------------------------------------

def shard_for(key: str, ids: list) -> str:
    """DataWorks' rule, restated: MD5 of the key modulo the ACTIVE shards, over their sorted ids."""
    digest = hashlib.md5(key.encode("utf-8")).digest()
    return ids[int.from_bytes(digest[:8], "big") % len(ids)]


@dataclasses.dataclass
class Landed:
    rec: Rec
    system_ms: int


class Shard:
    def __init__(self, sid: str, parents=()) -> None:
        self.sid, self.parents = sid, tuple(parents)
        self.active = True
        self.records: list[Landed] = []


class DataHubModel:
    """The topics' shards and the writer's landings; `now` is DataHub's clock (seconds), rising by
    at least a millisecond at every step so that every landing and every look has its own time."""

    def __init__(self, written: Written, rng: random.Random, shards: int, retries: bool = True) -> None:
        self.written, self.rng, self.retrying = written, rng, retries
        self.now = 1_700_000_000.0
        self.topics: dict = {}
        for rec in written.records:
            if rec.topic not in self.topics:
                self.topics[rec.topic] = {str(i): Shard(str(i)) for i in range(shards)}
        self.next = 0  # the next record to write
        self.recent: dict = {}  # (topic, shard) -> the last records landed there (a batch to retry)
        self.copies = 0
        self.splits = self.merges = self.retries = 0

    def tick(self) -> None:
        self.now += self.rng.choice((0.001, 0.002, 0.05, 0.4, 1.5))

    def active(self, topic: str) -> list:
        return sorted((s for s in self.topics[topic].values() if s.active), key=lambda s: int(s.sid))

    def _route(self, rec: Rec) -> Shard:
        active = self.active(rec.topic)
        if rec.key is None:
            return self.rng.choice(active)
        return self.topics[rec.topic][shard_for(rec.key, [s.sid for s in active])]

    def _land(self, rec: Rec, shard: Shard) -> None:
        self.tick()
        shard.records.append(Landed(rec, int(self.now * 1000)))
        self.copies += 1
        batch = self.recent.setdefault((rec.topic, shard.sid), [])
        batch.append(rec)
        del batch[:-4]

    @property
    def written_all(self) -> bool:
        return self.next >= len(self.written.records)

    def write_step(self) -> None:
        """The writer's next move: a record, a retry of a batch, a split or a merge."""
        rng = self.rng
        roll = rng.random()
        topic = rng.choice(sorted(self.topics))
        active = self.active(topic)
        if roll < 0.05 and len(self.topics[topic]) < 9:
            self._split(topic, rng.choice(active))
        elif roll < 0.09 and len(active) > 1:
            a, b = rng.sample(active, 2)
            self._merge(topic, a, b)
        elif roll < 0.17 and self.recent and self.retrying:
            (topic, sid), batch = rng.choice(sorted(self.recent.items(), key=lambda kv: kv[0]))
            shard = self.topics[topic][sid]
            start = rng.randrange(len(batch))
            self.retries += 1
            for rec in list(batch[start:]):  # an answer lost: the batch again, in order
                self._land(rec, shard if shard.active else self._route(rec))
        elif not self.written_all:
            rec = self.written.records[self.next]
            self.next += 1
            self._land(rec, self._route(rec))

    def _new_id(self, topic: str) -> str:
        return str(max(int(s) for s in self.topics[topic]) + 1)

    def _split(self, topic: str, shard: Shard) -> None:
        shard.active = False
        for _ in range(2):
            sid = self._new_id(topic)
            self.topics[topic][sid] = Shard(sid, (shard.sid,))
        self.splits += 1

    def _merge(self, topic: str, a: Shard, b: Shard) -> None:
        a.active = b.active = False
        sid = self._new_id(topic)
        self.topics[topic][sid] = Shard(sid, (a.sid, b.sid))
        self.merges += 1

    def all_copies(self) -> dict:
        """(topic, shard, sequence) -> rid of every record on DataHub."""
        return {(t, s.sid, seq): landed.rec.rid for t, shards in self.topics.items() for s in shards.values()
                for seq, landed in enumerate(s.records)}


class Reader:
    """`DataHubSource` over the model: what it hands the assembler, one page or mark at a time.
    `positions`: the next sequence per key to read (a committed position), else from the oldest."""

    def __init__(self, hub: DataHubModel, rng: random.Random, positions: dict | None = None) -> None:
        self.hub, self.rng = hub, rng
        self.pos: dict = dict(positions or {})
        self.listed: dict = {}  # key -> Shard
        self.done: set = set()  # keys CLOSED and read to their end ("finished" handed on)
        self.read: dict = {}  # key -> the loop's read position (next to read)

    def relist(self) -> list:
        """ListShard: a "shard" mark for every shard not listed yet."""
        out = []
        for topic, shards in sorted(self.hub.topics.items()):
            for sid, shard in sorted(shards.items(), key=lambda kv: int(kv[0])):
                key = (topic, sid)
                if key not in self.listed:
                    self.listed[key] = shard
                    out.append(self._mark("shard", key))
        return out

    def _mark(self, kind: str, key, server_ms=None) -> tuple:
        shard = self.listed[key]
        nxt = self.pos.get(key, 0)
        self.read[key] = nxt
        return (key, nxt - 1, ShardMark(kind, key[0], key[1], shard.parents, self.hub.now, server_ms), {})

    def readable(self) -> list:
        """Listed shards a reader may read now: every parent finished (read to its end, CLOSED)."""
        out = []
        for key, shard in self.listed.items():
            if key in self.done:
                continue
            if all((key[0], p) in self.done or (key[0], p) not in self.listed for p in shard.parents):
                out.append(key)
        return out

    def page(self, key) -> list:
        """GetRecords from the shard's position: up to a few records; at its end an "end" mark
        (with DataHub's clock or not), or "finished" when CLOSED and read to its end."""
        hub, rng = self.hub, self.rng
        hub.tick()
        shard = self.listed[key]
        start = self.pos.get(key, 0)
        n = rng.choice((1, 1, 2, 3, 5, 50))
        out = []
        for seq in range(start, min(start + n, len(shard.records))):
            landed = shard.records[seq]
            rec = landed.rec
            out.append((key, seq, DataHubRecord(key[0], key[1], seq, landed.system_ms, dict(rec.attributes),
                                                data=rec.data, row=dict(rec.row) if rec.row is not None else None,
                                                schema=rec.schema, read_at=hub.now), {}))
        self.pos[key] = start + len(out)
        if out:
            self.read[key] = self.pos[key]
        if self.pos[key] == len(shard.records):
            if not shard.active:  # it answers that it is CLOSED: the shards are listed again (its
                out.extend(self.relist())  # children are known before it counts as finished)
                self.done.add(key)
                out.append(self._mark("finished", key))
            elif rng.random() < 0.8:
                out.append(self._mark("end", key, rng.choice((None, int(hub.now * 1000)))))
        return out

    def caught_up(self) -> bool:
        hub = self.hub
        if any((t, sid) not in self.listed for t, shards in hub.topics.items() for sid in shards):
            return False
        return all(key in self.done or (self.pos.get(key, 0) == len(s.records) and s.active)
                   for key, s in self.listed.items())
