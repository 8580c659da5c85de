"""The one-process pipeline: a DTS Kafka topic -> Blob or Tuple -> DataHub, exactly once in effect.

The stages are the ones every face wires: `pipeline.consume` (reads, reassembles per partition or per
TDSQL shard, converts through `bridge.stream` under the error policy, commits) and the
`DataHubWriter` (ordered per shard, idempotent). The sink below is the seam: `write` puts each
converted record with its source position, `sync` waits until DataHub acknowledged everything put
so far, and the pipeline loop commits offsets only after `flush` returned. On start the writer is told
the committed offsets (`DataHubWriter.resume`), so records that landed after the last commit and
are read again are recognised by their position attributes and not written twice.

>>> topic_name("{db}_{table}", "Shop-DB", "Order Items")
'shop_db_order_items'
"""
from __future__ import annotations

import collections
import fnmatch
import re
import threading
from collections.abc import Callable

from bridge.blob.encode import BlobEncoder
from bridge.datahub.sink import DataHubWriter, LookStopped, OversizedRecord, Position, tuple_shard_key
from bridge.errors import BridgeError, ConversionError
from bridge.options import Options
from bridge.pipeline.options import SCHEMA_CHANGE_POLICIES, TABLE_ERROR_POLICIES
from bridge.stream.pipeline import Overlay, Report
from bridge.values import discard_substitutions

__all__ = ["BlobSink", "TupleSink", "Routing", "TableErrors", "EntryGate", "topic_name", "blob_converter", "run",
           "replay", "make_sink", "TopicNameCollision", "SchemaChangeError", "SCHEMA_CHANGE_POLICIES", "TABLE_ERROR_POLICIES",
           "REPLAY_SUFFIX"]

_TOPIC_BAD = re.compile(r"[^a-z0-9_]+")
# Records sent again from dead letters carry the Kafka topic with this suffix as `dts.topic`: they land
# after newer records of their shard, so the tail scan of sync (which stops at its first committed
# record) must not take them for its own.
REPLAY_SUFFIX = "#dead-letters"
BLOB_COLUMNS = 7  # BlobEncoder.convert_columns: sequenceId, op, db, table, shard key, eventTime, line


class TopicNameCollision(BridgeError):
    """Two tables (or databases) whose topic names are the same once cleaned."""


class SchemaChangeError(BridgeError):
    """Under --schema-change fail: a row's RecordSchema differs from its topic's."""


def topic_name(template: str, db: str, table: str) -> str:
    """A DataHub topic name from a template with {db} and {table}: lower case, runs of anything but
    letters, digits and underscores become one underscore, a leading letter ensured, 128 at most."""
    name = template.replace("{db}", db).replace("{table}", table).lower()
    name = _TOPIC_BAD.sub("_", name).strip("_")
    if not name or not name[0].isalpha():
        name = "t_" + name
    return name[:128]


def blob_converter(options: Options) -> Callable:
    """Entry (and its bytes) -> the columns of `BlobEncoder.convert_columns` (lines and shard keys)."""
    encoder = BlobEncoder(options)
    return encoder.convert_columns


def table_of(entry) -> str:
    return f"{entry.header.schemaName}.{entry.header.tableName}"


class Routing:
    """--include / --exclude: shell-style patterns on `db.table`. An Entry of a table (DML, DDL)
    goes on when it matches an include pattern (or there is none) and no exclude pattern; Entries
    without a table (transaction markers, heartbeats, checkpoints) always go on.

    >>> Routing(["shop.*"], ["shop.tmp_*"]).wants("shop.orders"), Routing([], ["shop.tmp_*"]).wants("shop.tmp_1")
    (True, False)
    """

    def __init__(self, include=(), exclude=()) -> None:
        self.include, self.exclude = list(include or ()), list(exclude or ())

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    def wants(self, table: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(table, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(table, p) for p in self.exclude)


class _Failed:
    """What EntryGate hands on for an Entry whose conversion failed (or whose table is halted): the
    sink dead-letters it (one output, so the Entry was counted converted; the sink moves it to
    rejected)."""
    __slots__ = ("error",)

    def __init__(self, error: BridgeError) -> None:
        self.error = error


class EntryGate:
    """Wraps a converter: Entries of excluded tables give nothing (counted as not emitted); with
    `tables` (--on-table-error), an Entry of a halted table, or one whose conversion fails, becomes
    a `_Failed` for the sink. Remembers the Entry being converted (`current`) for dead letters."""

    def __init__(self, convert: Callable, empty, routing: Routing | None = None,
                 tables: TableErrors | None = None) -> None:
        self.convert, self.empty, self.routing, self.tables = convert, empty, routing, tables
        self.current = (None, None)

    def __call__(self, entry, raw: bytes | None = None):
        self.current = (entry, raw)
        header = entry.header
        if header.tableName or header.schemaName:
            table = table_of(entry)
            if self.routing and not self.routing.wants(table):
                return self.empty()
            if self.tables is not None and table in self.tables.halted:
                return _Failed(ConversionError(f"table {table} is halted (--on-table-error halt-table): "
                                               f"{self.tables.halted[table]}"))
        try:
            return self.convert(entry) if raw is None else self.convert(entry, raw)
        except BridgeError as err:
            if self.tables is None:
                raise
            discard_substitutions()  # a dead letter: its zero dates etc. count nowhere
            return _Failed(err)


class TableErrors:
    """--on-table-error: what happens to an Entry (or a record) of a table that cannot be delivered.
    dlq: a dead letter, and the run goes on; halt-table: a dead letter, and so is every later
    record of that table (kept across restarts in the dead letters' state); halt-all: the run
    stops (as --on-error fail). Refusals heard from the writer's threads are counted by the main
    thread (`settle`), at the latest before each commit."""

    def __init__(self, mode: str, letters, source: str, tally) -> None:
        if mode not in TABLE_ERROR_POLICIES:
            raise BridgeError(f"on-table-error must be one of {', '.join(TABLE_ERROR_POLICIES)}, not {mode!r}")
        self.mode, self.letters, self.source, self.tally = mode, letters, source, tally
        self.halted: dict[str, str] = dict(letters.halted) if letters is not None else {}
        self.writer: DataHubWriter | None = None
        self.dead = 0  # dead letters written by this run
        self._refused: collections.deque = collections.deque()
        self._rejected: set = set()  # (partition, offset, entry) already moved to rejected
        self._lock = threading.Lock()

    def entry(self, where: dict, entry_bytes: bytes, table: str, err: BridgeError, topic: str | None) -> None:
        """A whole Entry not delivered (its outputs counted converted): dead letter, per the policy."""
        err.located(partition=where["partition"], offset=where["offset"])
        if self.mode == "halt-all" or self.letters is None:
            raise err
        self._letter(where, None, entry_bytes, table, str(err), topic)
        self._reject(where, 0)

    def record(self, pending, reason: str) -> None:
        """The writer refused a record (or it belongs to a halted table): from a writer thread."""
        where, row, entry, raw, table = pending.context
        entry_bytes = bytes(raw) if raw is not None else entry.SerializeToString()
        self._letter(where, row, entry_bytes, table, reason, pending.topic.name, after=pending.position)
        self._refused.append(where)

    def settle(self) -> None:
        while self._refused:
            self._reject(self._refused.popleft(), 1)

    def _letter(self, where: dict, row, entry_bytes: bytes, table: str, error: str, topic, after=None) -> None:
        """Write a dead letter; under halt-table the table halts: later Entries at the gate, and
        for a record the writer refused (`after`: its position) the table's records still waiting
        in the writer behind it (records put before a halting Entry still go)."""
        self.letters.write(entry_bytes=entry_bytes, source=self.source, partition=where["partition"],
                           offset=where["offset"], entry=where["entry"], row=row, table=table, error=error,
                           datahub_topic=topic)
        with self._lock:
            self.dead += 1
            if self.mode == "halt-table" and table not in self.halted:
                self.halted[table] = f"halted at {where['partition']}:{where['offset']}:{where['entry']}: {error}"
                if self.writer is not None and after is not None:
                    self.writer.halt(table, after)

    def _reject(self, where: dict, outputs: int) -> None:
        key = (where["partition"], where["offset"], where["entry"])
        self.tally.withdrew(outputs)
        if key not in self._rejected:
            self._rejected.add(key)
            self.tally.undelivered()


class _Sink:
    """Puts each Entry's records with their positions, all of them or (a record that does not fit:
    the Entry's error) none; `sync()` returns once DataHub acknowledged them (and the dead letters
    are on disk). An Entry not delivered goes to `tables` (--on-table-error) when given, else to
    the error policy (--on-error); an oversized record follows `oversized` (fail | dlq)."""

    def __init__(self, writer: DataHubWriter, source: str, policy, *, tables: TableErrors | None = None,
                 gate: EntryGate | None = None, oversized: str = "fail", letters=None) -> None:
        self.writer, self.source, self.policy = writer, source, policy
        self.tables, self.gate, self.oversized, self.letters = tables, gate, oversized, letters
        self.written = 0
        self.since_ms: Callable[[dict], int | None] | None = None  # run() sets it: the restart look's floor
        self.stop: Callable[[], bool] | None = None  # run() sets it: the restart look stops when asked
        if oversized not in ("fail", "dlq", "policy"):  # policy: as any other error of the Entry (replay)
            raise BridgeError(f"oversized must be fail or dlq, not {oversized!r}")
        if oversized == "dlq" and letters is None:
            raise BridgeError("oversized records go to dead letters (dlq) only with a dead-letter file")
        if tables is not None:
            tables.writer = writer

    def reserve(self, topic: str, owner: str) -> None:
        """A topic no table (or database) may go to, e.g. the dead letters' own: mapping one there
        is a TopicNameCollision naming `owner`."""
        if getattr(self, "topic", None) == topic:  # BlobSink's one topic
            raise TopicNameCollision(f"{owner} and the data both go to DataHub topic {topic!r}")
        self._owners[topic] = owner

    def _entry_bytes(self) -> bytes:
        entry, raw = self.gate.current if self.gate is not None else (None, None)
        if raw is not None:
            return bytes(raw)
        return entry.SerializeToString() if entry is not None else b""

    def _table(self) -> str:
        entry = self.gate.current[0] if self.gate is not None else None
        return table_of(entry) if entry is not None else ""

    def _not_delivered(self, where: dict, err: BridgeError, topic: str | None) -> None:
        """An Entry counted converted that does not go to DataHub."""
        err.located(partition=where["partition"], offset=where["offset"])
        if isinstance(err, OversizedRecord) and self.oversized != "policy":
            if self.oversized == "fail":
                raise err
            tables = self.tables or TableErrors("dlq", self.letters, self.source, self.policy.tally)
            tables._letter(where, None, self._entry_bytes(), self._table(), str(err), topic)
            tables._reject(where, 0)
            return
        if self.tables is not None:
            self.tables.entry(where, self._entry_bytes(), self._table(), err, topic)
            return
        self.policy.tally.undelivered()  # the Entry was counted converted: now rejected (before the
        self.policy.reject(err, count=0)  # rejects line is written: it counts what rejected grew by)

    def _put_all(self, where: dict, items) -> None:
        base = (where["partition"], where["offset"], where["entry"])
        items = list(items)
        only = where.get("rows")  # a replay of one refused record: its index among the outputs
        table = self._table()
        context = None
        if self.tables is not None and self.writer.on_refused is not None:  # the Entry's bytes made if refused
            entry, raw = self.gate.current if self.gate is not None else (None, None)
            context = (dict(where), None, entry, raw, table)
        prepared = []
        try:
            for row, (topic, key, value) in enumerate(items):
                if only is not None and row not in only:
                    continue
                ctx = None if context is None else (context[0], row, *context[2:])
                prepared.append(self.writer.prepare(topic, key, value, Position(self.source, *base, row),
                                                    tag=table, context=ctx))
        except BridgeError as err:
            self.policy.tally.withdrew(len(items))
            self._not_delivered(where, err, items[0][0] if items else None)
            return
        for item in prepared:
            if item is not None and self.writer.put_prepared(item):
                self.written += 1

    def write_failed(self, where: dict, outputs) -> bool:
        if isinstance(outputs, _Failed):
            self.policy.tally.withdrew(1)
            entry = self.gate.current[0] if self.gate is not None else None
            self._not_delivered(where, outputs.error, self.letter_topic(entry) if entry is not None else None)
            return True
        return False

    def letter_topic(self, entry) -> str | None:
        """The DataHub topic an Entry would have gone to (for its dead letter)."""
        return None

    def flush(self) -> None:
        self.writer.flush()
        if self.tables is not None:
            self.tables.settle()
        if self.letters is not None:
            self.letters.sync()

    def resume(self, committed: dict) -> None:
        """The restart look of a group member, for the partitions it has now (the loop calls it when
        the group assigns some): records of this source that landed past `committed` are found in
        the shards' tails and not written again (DataHubWriter.resume)."""
        since = self.since_ms(committed) if self.since_ms is not None else None
        self.writer.resume(self.source, committed, since_ms=since, stop=self.stop)

    def acknowledged(self) -> dict[int, int]:
        """The acknowledgement watermark (`DataHubWriter.acknowledged`): per Kafka partition with
        records not yet done, the offset of the first; everything of it below was acknowledged by
        DataHub or dead-lettered (refusals counted, the dead letters fsynced before this returns). A
        partition absent has nothing outstanding. The loop may commit min(read, held, this) without
        `flush()`; `flush()` still waits for everything."""
        acked = self.writer.acknowledged()
        if self.tables is not None:
            self.tables.settle()
        if self.letters is not None:
            self.letters.sync()
        return acked

    def mark(self, offsets: dict) -> None:
        """After sync, before the offsets are stored: the dead letters' length goes with them."""
        if self.letters is not None:
            self.letters.mark(offsets, self.tables.halted if self.tables is not None else {})

    def may_commit(self, offsets: dict) -> bool:
        """The pipeline loop asks before it commits: see DataHubWriter.covered."""
        return self.writer.covered(offsets)


class BlobSink(_Sink):
    """Blob messages to one DataHub topic, or one per database (`{db}` in the name: messages
    without a database, i.e. transaction markers and heartbeats, go to the topic the template
    names with an empty {db})."""

    def __init__(self, writer: DataHubWriter, topic: str, source: str, policy, **kw) -> None:
        super().__init__(writer, source, policy, **kw)
        self.template = topic
        self.per_db = "{db}" in topic
        self._topics: dict[str, str] = {}
        self._owners: dict[str, str] = {}
        if not self.per_db:
            self.topic = topic
            writer.topic(topic)

    @staticmethod
    def size(columns) -> int:
        return 1 if isinstance(columns, _Failed) else len(columns[0])

    def letter_topic(self, entry) -> str | None:
        return topic_name(self.template, entry.header.schemaName, "") if self.per_db else self.topic

    def _topic_of(self, db: str) -> str:
        topic = self._topics.get(db)
        if topic is None:
            topic = topic_name(self.template, db, "")
            owner = self._owners.setdefault(topic, db)
            if owner != db:
                raise TopicNameCollision(f"databases {owner!r} and {db!r} both map to DataHub topic {topic!r} "
                                         f"(template {self.template!r}): change --datahub-topic or --exclude one")
            self._topics[db] = topic
            self.writer.topic(topic)
        return topic

    def write(self, where: dict, columns) -> None:
        if self.write_failed(where, columns):
            return
        if not self.per_db:
            self._put_all(where, ((self.topic, key, line) for key, line in zip(columns[4], columns[6])))
            return
        self._put_all(where, [(self._topic_of(db or ""), key, line)
                              for db, key, line in zip(columns[2], columns[4], columns[6])])


def _type_of(field) -> str:
    return str(getattr(field.type, "value", field.type)).upper()


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class TupleSink(_Sink):
    """Tuple rows to one topic per table (a name template), created when missing with the
    RecordSchema the rows have. Each row's RecordSchema is compared with its topic's at write time
    (so a replay after a crash decides the same), under `schema_change`:

    - evolve: a column the topic lacks (added or renamed by DDL) is appended as a nullable field
      before the first row that has it; a dropped column is NULL; a changed type is the Entry's error;
    - lenient: as evolve, and a column whose type changed goes to a nullable STRING field
      `<column>__<newtype>` (appended), its value as text; the old field is NULL from then on;
    - ignore: the topic is never altered; values of fields it lacks (or whose type differs) are
      left out of the rows, counted per table (`ignored`);
    - fail: any difference stops the run, naming the table, the fields and the position."""

    @staticmethod
    def size(rows) -> int:
        return 1 if isinstance(rows, _Failed) else len(rows)

    def __init__(self, writer: DataHubWriter, template: str, source: str, policy, *,
                 schema_change: str = "evolve", **kw) -> None:
        super().__init__(writer, source, policy, **kw)
        if schema_change not in SCHEMA_CHANGE_POLICIES:
            raise BridgeError(f"schema-change must be one of {', '.join(SCHEMA_CHANGE_POLICIES)}, not "
                              f"{schema_change!r}")
        self.template, self.schema_change = template, schema_change
        self._topics: dict[str, str] = {}
        self._owners: dict[str, str] = {}
        self.evolved: list = []  # (topic, fields added, where)
        self.ignored: dict[str, dict] = {}  # table -> {"rows": n, "values": n, "fields": [...]}

    def letter_topic(self, entry) -> str | None:
        return topic_name(self.template, entry.header.schemaName, entry.header.tableName)

    def _topic_of(self, table: str) -> str:
        topic = self._topics.get(table)
        if topic is None:
            db, _, name = table.partition(".")
            topic = topic_name(self.template, db, name)
            owner = self._owners.setdefault(topic, table)
            if owner != table:
                raise TopicNameCollision(f"tables {owner} and {table} both map to DataHub topic {topic!r} "
                                         f"(template {self.template!r}): change --datahub-topic or --exclude one")
            self._topics[table] = topic
        return topic

    def write(self, where: dict, rows) -> None:
        if self.write_failed(where, rows):
            return
        items = []
        topic = None
        try:
            for table, columns, schema, row in rows:
                topic = self._topic_of(table)
                row = self._fit(topic, table, schema, row, where)
                keys = [c.name for c in columns if c.isKey]
                items.append((topic, tuple_shard_key(row, table, keys), row))
        except ConversionError as err:
            self.policy.tally.withdrew(len(rows))
            self._not_delivered(where, err, topic)
            return
        self._put_all(where, items)

    def _fit(self, topic: str, table: str, schema: dict, row: dict, where: dict) -> dict:
        info = self.writer.topic(topic, schema, check=False)
        if info.kind != "TUPLE":  # the table's error (its position added), not an AttributeError
            raise ConversionError(f"table {table}: topic {topic} is a {info.kind} topic, not a Tuple topic")
        have = {f.name: _type_of(f) for f in info.schema.field_list}
        want = {f["name"]: f["type"].upper() for f in schema["fields"]}
        added = [(n, t) for n, t in want.items() if n not in have]
        changed = [(n, have[n], t) for n, t in want.items() if n in have and have[n] != t]
        if not added and not changed and (self.schema_change != "fail" or len(have) == len(want)):
            return row
        policy = self.schema_change
        if policy == "fail":
            dropped = [n for n in have if n not in want]
            raise SchemaChangeError(
                f"table {table}: the row's RecordSchema differs from topic {topic}'s (--schema-change fail) at "
                f"partition {where['partition']} offset {where['offset']} entry {where['entry']}: "
                + "; ".join(part for part in (
                    "added " + ", ".join(f"{n} {t}" for n, t in added) if added else "",
                    "dropped " + ", ".join(dropped) if dropped else "",
                    "changed " + ", ".join(f"{n} {a} -> {b}" for n, a, b in changed) if changed else "") if part))
        if policy == "ignore":
            left = [n for n, _ in added if n in row] + [n for n, _, _ in changed if n in row]
            if left:
                count = self.ignored.setdefault(table, {"rows": 0, "values": 0, "fields": []})
                count["rows"] += 1
                count["values"] += len(left)
                count["fields"] = sorted(set(count["fields"]) | set(left))
                row = {k: v for k, v in row.items() if k not in left}
            return row
        if changed and policy == "evolve":
            raise ConversionError(f"table {table}: column types changed ("
                                  + ", ".join(f"{n} {a} -> {b}" for n, a, b in changed)
                                  + f"); topic {topic} keeps the old types (--schema-change lenient writes the "
                                    f"new values to <column>__<newtype> STRING fields)")
        append = [(n, t) for n, t in added if n in row]
        if changed:  # lenient
            row = dict(row)
            for n, _, t in changed:
                alt = f"{n}__{t.lower()}"
                if n in row:
                    row[alt] = _text(row.pop(n))
                    if alt not in have:
                        append.append((alt, "STRING"))
        if append:  # the topic grows nullable fields before the first row using them
            self.writer.append_fields(topic, append)
            self.evolved.append((topic, [n for n, _ in append], dict(where)))
        return row


def make_sink(to: str, writer: DataHubWriter, template: str, source: str, policy, options: Options, *,
              include=(), exclude=(), on_table_error: str | None = None, schema_change: str | None = None,
              oversized: str = "fail", letters=None):
    """(sink, gate) of one pipeline, as every face builds it (`dts-bridge sync` and `replay`, the
    Spark `datahub` sink given whole Entries): `to` blob|tuple, the topic `template`, routing by
    `include` / `exclude`, the table-error policy (refused records go to it through the writer's
    `on_refused`), the schema-change policy (Tuple) and the oversized policy; `letters` is the
    dead-letter sink (`deadletters.DeadLetters`, or anything with its write/sync/halted)."""
    tables = None
    if on_table_error is not None:
        tables = TableErrors(on_table_error, letters, source, policy.tally)
        if on_table_error != "halt-all":
            writer.on_refused = tables.record
    routing = Routing(include, exclude)
    common = dict(tables=tables, oversized=oversized, letters=letters)
    if to == "blob":
        gate = EntryGate(blob_converter(options), lambda: tuple([] for _ in range(BLOB_COLUMNS)), routing, tables)
        return BlobSink(writer, template, source, policy, gate=gate, **common), gate
    from bridge.tuple.files import tuple_converter
    gate = EntryGate(tuple_converter(options, None), list, routing, tables)
    return TupleSink(writer, template, source, policy, gate=gate, schema_change=schema_change or "evolve",
                     **common), gate


# The restart look (DataHubWriter.resume) reads each shard back per partition to its committed record,
# which needs no clock. This bound only ends the look in a shard where a partition has no committed
# record (an idle partition, keys that never went there): no record of it at or past its commit can
# be older than the last commit's time (stamped here) less the skew between this machine's clock and
# DataHub's (NTP keeps it under a second) and less how long before a commit a record past it may
# land while the commit waits for an earlier one (seconds, unless one shard is stuck while the others
# take the partition's later records, which a newer record of that partition in the shard then shows
# and the look follows back). 60 s covers both with room; benchmarks/restart_bench.py measures what
# it costs (an idle partition makes each shard's look read back that far).
CLOCK_MARGIN_MS = 60 * 1000


class _EveryPartition:
    """An offset store whose every save names every partition (unchanged ones with their last
    offsets), so each partition's commit time stays recent and the tail scan short."""

    def __init__(self, store) -> None:
        self.store = store
        self.commit: dict[int, int] = {}
        self.read: dict[int, int] = {}

    def load(self, partitions: list[int]) -> dict:
        stored = self.store.load(partitions)
        for p, (off, mark) in stored.items():
            if off is not None:
                self.commit[p] = off
                self.read[p] = mark if mark is not None else off
        return stored

    def save(self, commit: dict[int, int], read: dict[int, int]) -> None:
        self.commit.update(commit)
        self.read.update(read)
        self.store.save(dict(self.commit), {p: self.read.get(p, off) for p, off in self.commit.items()})


def run(consumer, topic: str, store, writer: DataHubWriter, sink, convert: Callable, policy, *,
        partitions: list[int] | None = None, start: str = "latest", max_messages: int | None = None,
        idle_timeout: float | None = None, stop: Callable[[], bool] = lambda: False, raw: bool = False,
        commit_interval: float | None = 5.0, report=None, subscribe: bool = False):
    """Resume the writer at the stored offsets, then `pipeline.consume` into `sink`; returns its report.

    With `subscribe` the process is a member of the consumer group (cooperative rebalancing): the
    loop resumes the writer for the partitions the group gives it, as they come (`_Sink.resume`),
    and commits a partition's offsets before it goes to another member (docs/kafka.md, "Scaling
    out in a consumer group")."""
    from bridge import kafka, pipeline
    letters = getattr(sink, "letters", None)
    if letters is not None:  # restored: its committed offsets win where ahead
        store = Overlay(store, lambda: letters.offsets)
    if subscribe:
        if partitions is not None:
            raise BridgeError("a group member is given its partitions by the group: no partitions with subscribe")
        def since_ms(committed: dict) -> int | None:
            times = getattr(store, "times", {})  # filled as the loop loads the gained partitions
            done = [p for p, off in committed.items() if off is not None]
            if not done or not all(p in times for p in done):
                return None
            return min(times[p] for p in done) - CLOCK_MARGIN_MS

        sink.since_ms, sink.stop = since_ms, stop
        report = report if report is not None else Report()
        try:
            return pipeline.consume(consumer, topic, store, convert, sink, policy, start=start,
                                    max_messages=max_messages, idle_timeout=idle_timeout, stop=stop, raw=raw,
                                    size=sink.size, commit_interval=commit_interval, report=report, subscribe=True)
        except LookStopped:  # asked to stop while the look for gained partitions ran: nothing new to commit
            report.stopped = "signal"
            return report
        finally:
            writer.stop()
    partitions = partitions if partitions is not None else kafka.partitions_of(consumer, topic)
    store = _EveryPartition(store)
    stored = store.load(partitions)
    committed = {p: stored.get(p, (None, None))[0] for p in partitions}
    times = getattr(store.store, "times", {})
    since = None
    if any(off is not None for off in committed.values()) and \
            all(p in times for p, off in committed.items() if off is not None):
        since = min(times[p] for p, off in committed.items() if off is not None) - CLOCK_MARGIN_MS
    try:
        writer.resume(topic, committed, since_ms=since, stop=stop)
    except LookStopped:  # asked to stop while reading the shards' tails: nothing written, nothing to commit
        writer.stop()
        report = report if report is not None else Report()
        report.stopped = "signal"
        return report
    try:
        return pipeline.consume(consumer, topic, store, convert, sink, policy, partitions=partitions, start=start,
                             max_messages=max_messages, idle_timeout=idle_timeout, stop=stop, raw=raw,
                             size=sink.size, commit_interval=commit_interval, report=report)
    finally:
        writer.stop()


def replay(letters: list[dict], writer: DataHubWriter, sink: _Sink, convert: Callable) -> dict:
    """Send dead letters (`deadletters.read_dead_letters`) again through `sink` (built with the
    source `<Kafka topic>` + REPLAY_SUFFIX) after a fix: each Entry is converted anew with the
    given options; a letter of one refused record sends that record only. Idempotent: the writer is
    resumed with nothing committed, so every record an earlier replay landed is found in the
    shards' tails and skipped. Returns counts; errors go to the sink's policy."""
    from bridge.wire import subscribe_pb2 as pb
    sources = {letter["source"] for letter in letters}
    if len(sources) > 1:
        raise BridgeError(f"the dead letters come from several Kafka topics ({', '.join(sorted(sources))}): "
                          f"replay them one file per topic")
    writer.resume(sink.source, {})
    tally = sink.policy.tally
    whole = {(x["partition"], x["offset"], x["entry"]) for x in letters if x.get("row") is None}
    seen: set = set()
    for letter in letters:
        where = {"partition": letter["partition"], "offset": letter["offset"], "entry": letter["entry"]}
        key = (where["partition"], where["offset"], where["entry"])
        rows = None if letter.get("row") is None else {letter["row"]}
        # an Entry once: a letter of one of its records is covered by a letter of the whole Entry
        if (key, letter.get("row")) in seen or (rows is not None and key in whole):
            continue
        seen.add((key, letter.get("row")))
        if not letter["entry_bytes"]:  # left out of a DataHub dead-letter topic (too large): nothing to send
            sink.policy.reject_input(ConversionError(f"dead letter at line {letter['line']} holds no Entry: "
                                                     f"{letter.get('error')}", **where))
            continue
        try:
            entry = pb.Entry.FromString(letter["entry_bytes"])
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError
            sink.policy.reject_input(ConversionError(f"dead letter at line {letter['line']}: the Entry does not "
                                                     f"parse ({exc})", **where), letter["entry_bytes"])
            continue
        raw = letter["entry_bytes"] if isinstance(sink, BlobSink) else None
        try:
            outputs = (sink.gate or convert)(entry) if raw is None else (sink.gate or convert)(entry, raw)
        except BridgeError as err:
            sink.policy.reject_input(err.located(**where), letter["entry_bytes"])
            continue
        n = sink.size(outputs)
        tally.took(n)
        if not n:
            continue
        sink.write({**where, "rows": rows} if rows is not None else where, outputs)
    sink.flush()
    return {"letters": len(letters), "written": sink.written, "already_landed": writer.skipped}
