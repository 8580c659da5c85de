"""A whole database in Spark: `dts_entries` rows and the `datahub` sink's whole-database mode.

`bridge.spark.dts_entries` gives one row per complete Entry (its bytes in `dts`, its position:
topic, partition, offset of the first segment of its Entries, entry index), reassembled as
`dts_to_blob` does (`_DtsToEntries` below runs through the same batch and streaming machinery, so
an Entries cut by a micro-batch boundary comes whole, once). Given such rows,
`format("datahub")` converts them in each task with the very code `dts-bridge sync` runs
(`bridge.sync.make_sink`: routing, the schema-change policy, the table-error policy, the
oversized policy) into Tuple topics by a `{db}_{table}` template or Blob topics (one, or
`{db}`), and writes dead letters to a DataHub Blob topic through the same idempotent writer.

`TablesTask` is one task's work (a `RowsTask`, bridge/spark/task.py, for Entry rows): per source (Kafka topic)
one DataHubWriter, one sink and gate, one dead-letter writer. pyspark is never imported here.

>>> entries_schema("PERMISSIVE")
'`topic` STRING, `partition` INT, `offset` BIGINT, `entry` INT, `dts` BINARY, `error` STRING'
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from bridge.datahub.sink import ATTR_EPOCH, ATTR_TOPIC, DataHubError, DataHubWriter, OversizedRecord, Position
from bridge.errors import BridgeError, ConversionError
from bridge.spark.jobs import POSITION_COLUMNS, _ddl, _FromDts, _with_error
from bridge.spark.task import SETTLE_SECONDS, RowsTask, TaskRecords, TaskRows, conversion_options
from bridge.values import digits
from bridge.wire import subscribe_pb2 as pb

__all__ = ["ENTRY_COLUMNS", "entries_schema", "TablesTask", "TopicDeadLetters", "earlier_halts", "export_dead_letters"]

ENTRY_COLUMNS = POSITION_COLUMNS[:4] + (("dts", "binary"),)


def entries_schema(mode: str = "FAILFAST") -> str:
    """DDL of `dts_entries` output; PERMISSIVE adds `error STRING`."""
    return _ddl(_with_error(ENTRY_COLUMNS, mode))


class _DtsToEntries(_FromDts):
    """Kafka records in offset order -> one row per Entry: its position and bytes (as the
    Reassembler cut them from the Entries, else the Entry encoded again)."""

    raw = True

    def __init__(self, mode: str) -> None:
        super().__init__(mode, (("dts", "binary"),))
        self.columns = _with_error(ENTRY_COLUMNS, mode)

    def convert_columns(self, entry: pb.Entry, raw: bytes | None = None) -> tuple[int, Any]:
        return 1, [[bytes(raw) if raw is not None else entry.SerializeToString()]]

    def chunks(self, records):
        for columns in super().chunks(records):  # without the base's `row` (always 0 here)
            yield columns[:4] + columns[5:]


# ---- dead letters in a DataHub Blob topic --------------------------------------------------------

WHOLE_ENTRY_ROW = -1  # the `row` of a dead letter's position when the whole Entry is the letter


class TopicDeadLetters:
    """`deadletters.DeadLetters`' interface (write, sync, halted, written) over a DataHub Blob
    topic: each letter (the file's JSON line) is a record put through its own DataHubWriter with
    the Entry's position (row -1 for a whole Entry), so a micro-batch replayed after a crash finds
    the letters its failed attempt wrote and writes them once."""

    def __init__(self, writer: DataHubWriter, topic: str, halted: dict[str, str]) -> None:
        self.writer, self.topic = writer, topic
        self.halted = dict(halted)
        self.written = 0
        self._lock = threading.Lock()

    def write(self, *, entry_bytes: bytes, source: str, partition: int, offset: int, entry: int,
              row: int | None, table: str, error: str, datahub_topic: str | None) -> None:
        from bridge.deadletters import letter_line
        fields = dict(source=source, partition=partition, offset=offset, entry=entry, row=row, table=table,
                      datahub_topic=datahub_topic)
        line = letter_line(entry_bytes=entry_bytes, error=error, **fields)
        position = Position(source, partition, offset, entry, WHOLE_ENTRY_ROW if row is None else row)
        with self._lock:  # one put at a time: the data writer's threads hand refused records over
            try:
                put = self.writer.put(self.topic, table or "", line, position)  # a table's letters in one shard
            except OversizedRecord:
                # An Entry too large for a DataHub request once in base64 (a sync file takes it): the letter
                # goes without its bytes, saying where Kafka holds them; replay --from-dlq rejects it.
                error = (f"{error} [the Entry's {len(entry_bytes)} bytes are left out of this letter, over "
                         f"DataHub's request limit: read them from Kafka at partition {partition} offset {offset}]")
                line = letter_line(entry_bytes=b"", error=error, **fields)
                put = self.writer.put(self.topic, table or "", line, position)
            if put:
                self.written += 1

    def sync(self) -> None:
        self.writer.flush()

    def mark(self, offsets: dict, halted: dict) -> None:
        """Nothing to record beside positions here: Spark's commit protocol keeps the task's place,
        each letter carries its position (written once on a replay), and the halts are read back
        from the topic itself (`earlier_halts`)."""


LETTER_WINDOW = 1000  # records of the dead-letter topic read (and held) at a time: GetRecords' most


def earlier_halts(writer: DataHubWriter, topic: str, source: str, epoch: int) -> dict[str, str]:
    """Under halt-table, the tables halted before micro-batch `epoch`: every table with a dead
    letter of `source` from an earlier micro-batch (each letter halts its table). Read from the
    dead-letter topic itself, so a replayed micro-batch starts from the same halts."""
    halted: dict[str, str] = {}
    for record in writer.read_topic(topic, LETTER_WINDOW):
        attrs = record.attributes or {}
        mark = attrs.get(ATTR_EPOCH, "")
        if attrs.get(ATTR_TOPIC) != source or not digits(mark) or int(mark) >= epoch:
            continue
        letter = orjson.loads(record.blob_data)
        halted.setdefault(letter["table"], f"halted in micro-batch {mark} at {letter['partition']}:"
                                           f"{letter['offset']}:{letter['entry']}: {letter['error']}")
    return halted


def export_dead_letters(client, project: str, topic: str, path: str) -> int:
    """Write the dead-letter topic's letters to `path`, one JSON line each (sync's dead-letter
    file format), for `dts-bridge replay --from-dlq PATH`; returns how many. `client` is a pydatahub
    client (`bridge.datahub.sink.make_client(endpoint)`)."""
    writer = DataHubWriter(client, project, workers=1)
    count = 0
    try:
        with open(path, "wb") as out:
            for record in writer.read_topic(topic, LETTER_WINDOW):
                out.write(bytes(record.blob_data) + b"\n")
                count += 1
    finally:
        writer.stop()
    return count


def _check_letter_topic(writer: DataHubWriter, topic: str) -> None:
    """An existing dead-letter topic must be a Blob topic: said when the task starts, not at its
    first dead letter (a missing one is created, with createTopics, when the first letter comes)."""
    from datahub import exceptions as dx
    try:
        info = writer.call(lambda: writer.client.get_topic(writer.project, topic), "GetTopic", raw=True)
    except dx.ResourceNotFoundException:
        return
    kind = str(getattr(info.record_type, "value", info.record_type)).upper()
    if kind != "BLOB":
        raise DataHubError(f"option 'deadLetters': topic {writer.project}/{topic} is a {kind} topic; dead letters "
                           "are records of a Blob topic")


# ---- one task's whole-database writing -----------------------------------------------------------

class _Pipeline:
    """One source's stages in a task: writer -> sink (with its gate) -> DataHub, dead letters aside."""

    def __init__(self, task: TablesTask, source: str) -> None:
        from bridge import sync
        from bridge.stream import ErrorPolicy
        opts, epoch = task.config.options, task.epoch
        self.writer = task.new_writer(source)
        self.letters = None
        if opts["deadLetters"]:
            letter_writer = task.new_writer(source)
            _check_letter_topic(letter_writer, opts["deadLetters"])
            halted = {}
            if opts["onTableError"] == "halt-table" and epoch is not None:
                halted = earlier_halts(letter_writer, opts["deadLetters"], source, epoch)
            self.letters = TopicDeadLetters(letter_writer, opts["deadLetters"], halted)
        self.policy = ErrorPolicy("fail", keep_records=False)
        self.sink, self.gate = sync.make_sink(
            opts["to"], self.writer, opts["topic"], source, self.policy, conversion_options(opts),
            include=opts["include"] or (), exclude=opts["exclude"] or (), on_table_error=opts["onTableError"],
            schema_change=opts["schemaChange"], oversized=opts["oversized"], letters=self.letters)
        if self.letters is not None:  # no table (or database) may map to the dead letters' topic
            self.sink.reserve(opts["deadLetters"], "the dead letters (option deadLetters)")
        self.raw = opts["to"] == "blob"  # Blob's C fast path reads the Entry's bytes, as sync gives them

    def writers(self) -> list[DataHubWriter]:
        return [self.writer] + ([self.letters.writer] if self.letters is not None else [])


class TablesTask(RowsTask):
    """One task of the whole-database mode (a `RowsTask`, its writers made by
    `new_writer`): rows of `dts_entries` in arrival order, each source's Entries through the
    pipeline loop into `bridge.sync`'s sink for it."""

    def __init__(self, config, epoch: int | None, client_for: Callable[[], Any] | None = None) -> None:
        super().__init__(config, epoch, client_for)
        self.pipelines: dict[str, _Pipeline] = {}
        self.counts = dict(rows=0, rejected=0)

    def pipeline(self, source: str) -> _Pipeline:
        found = self.pipelines.get(source)
        if found is None:
            found = self.pipelines[source] = _Pipeline(self, source)
        return found

    def records(self, batches) -> Iterator[tuple]:
        """`dts_entries` rows as `TaskRows` records, a list per batch: key the partition, position
        the offset, value (where, (source, the Entry's bytes), None); error rows are counted here
        and left out, so that every run of the loop has a source."""
        fixed = self.config.options["source"]
        for batch in batches:
            cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
            errors = cols.get("error") or itertools.repeat(None)
            chunk = []
            for i, error in zip(range(batch.num_rows), errors):
                if error is not None:  # a PERMISSIVE error row of dts_entries: nothing to convert, and
                    self.counts["rows"] += 1  # no source to run under (its topic may be unknown)
                    self.counts["rejected"] += 1
                    continue
                where = {"partition": cols["partition"][i], "offset": cols["offset"][i], "entry": cols["entry"][i]}
                source = fixed or cols["topic"][i]
                if source is None or None in where.values() or cols["dts"][i] is None:
                    raise ConversionError("a row without its position or Entry (topic, partition, offset, entry, dts): "
                                          "the datahub sink's whole-database mode writes rows of dts_entries", **where)
                chunk.append((where["partition"], where["offset"], (where, (source, cols["dts"][i]), None), None))
            yield chunk

    def run(self, batches) -> None:
        """Every `dts_entries` row of `batches` in order: each run of one source's rows through the
        pipeline loop (`TaskRows` -> `TaskRecords` parsing the Entries -> the source's gate -> its
        sync sink), flushed when the source changes or the input ends."""
        from bridge import pipeline
        from bridge.stream.pipeline import MemoryPositions
        rows = TaskRows(self.records(batches), split=lambda record: record[2][1][0])
        source = rows.upcoming()
        while source is not None:
            line = self.pipeline(source)
            records = TaskRecords(self.counts, self._parser(source, line.raw, line.policy))
            try:
                pipeline.run(rows, MemoryPositions(), records, line.gate, line.sink, line.policy, idle_timeout=0,
                             size=line.sink.size)
            except BridgeError as err:  # a missing topic, a collision: named by the Entry being written
                if not any(err is w.error for w in line.writers()):  # a writer thread's names its records
                    err.located(**records.where, topic=source)
                raise
            source = rows.upcoming() if rows.next_run() else None
        self.finish()

    def _parser(self, source: str, raw: bool, policy) -> Callable:
        def parse(where: dict, item: tuple):
            data = item[1]
            try:
                entry = pb.Entry.FromString(data)
            except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError
                policy.reject(ConversionError(f"the dts column holds no Entry ({exc})", topic=source, **where), data)
                return None
            self.span(source, where["partition"], where["offset"])
            return (entry, data) if raw else (entry,)
        return parse

    def finish(self) -> None:
        for line in self.pipelines.values():
            for writer in line.writers():
                writer.stop()

    def stop(self) -> None:
        for line in self.pipelines.values():
            for writer in line.writers():
                writer.stop(wait=SETTLE_SECONDS)

    def report(self) -> dict:
        counts = dict(self.counts, epoch=self.epoch, offsets=self.offsets, written=0, skipped=0, dead_letters=0,
                      converted=0, not_emitted=0, halted={}, evolved=[], ignored={})
        for line in self.pipelines.values():
            tally = line.policy.tally
            counts["written"] += line.sink.written
            counts["skipped"] += line.writer.skipped
            counts["rejected"] += tally.rejected
            counts["converted"] += tally.converted
            counts["not_emitted"] += tally.not_emitted
            if line.letters is not None:
                counts["dead_letters"] += line.letters.written
            if line.sink.tables is not None:
                counts["halted"].update(line.sink.tables.halted)
            counts["evolved"] += [{"topic": t, "fields": f, "at": w} for t, f, w in getattr(line.sink, "evolved", [])]
            for table, c in getattr(line.sink, "ignored", {}).items():
                counts["ignored"][table] = dict(c)
        for name in ("requests", "retries", "throttled", "resplits"):
            counts[name] = sum(getattr(w, name) for line in self.pipelines.values() for w in line.writers())
        return counts
