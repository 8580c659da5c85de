"""`blob_to_dts` / `tuple_to_dts` on the rows of `format("datahub")` (bridge/spark/datahub_source.py):
Entries rebuilt exactly as the one-process reverse pipeline rebuilds them, batch and streaming.

The rows are grouped by DataHub topic (all its shards: an Entry's rows and an UPDATE's halves may
sit on any of them) and fed, per group, to the library's shard merge
(`bridge.stream.shards.DataHubAssembler`): the shard marks first, then each shard's records in
sequence order, then the marks saying which shards were read to their end (and when) or are
finished. A record is handed to its stream's decoder only when every other shard covers it, so an
Entry comes out whole, in source order per stream, exactly once.

- batch (`spark.read`): the read is all there is, so the group ends with the assembler's `finish`
  (incomplete Entries reported under `mode`);
- streaming: `transformWithStateInPandas`; the assembler's open tail (records not yet handed on,
  records of open Entries, the shards' facts: `DataHubAssembler.snapshot`) is the group's state
  between micro-batches, so rows of one Entry in different micro-batches meet there. A replayed
  micro-batch restores the state before it and gives the same rows (the marks' times come from the
  micro-batch's offsets). Incomplete Entries are reported when their stream moves on, never dropped.
pyspark and pandas are imported only where the plan is built and on the workers.
"""
from __future__ import annotations

import json
import pickle
from collections.abc import Iterator

from bridge.errors import OptionsError
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.spark.jobs import DTS_COLUMNS, FROM_SPARK, SparkTally, _ddl, _pandas_column, _ToDts, _with_error
from bridge.spark.streaming import PROVIDER_CONF, ROCKSDB

__all__ = ["is_datahub_frame", "datahub_to_dts", "merge_bounds", "SOURCE_COLUMNS"]

SOURCE_COLUMNS = ("topic", "shard", "sequence", "system_time", "attributes", "mark")
STATE_SCHEMA = "snapshot BINARY"


def merge_bounds(max_held, stall_seconds) -> tuple[int, float]:
    """`blob_to_dts` / `tuple_to_dts`'s `max_held` and `stall_seconds` checked (the CLI's
    `--max-held`, `--stall-seconds`; docs/kafka.md, "Reading DataHub: stalls")."""
    if type(max_held) is not int or max_held < 1:
        raise OptionsError("option 'max_held' (the records the shard merge may hold before it decides a stall) "
                           "is a whole number of at least 1", value=max_held)
    if (isinstance(stall_seconds, bool) or not isinstance(stall_seconds, (int, float))
            or not 0 < stall_seconds < float("inf")):
        raise OptionsError("option 'stall_seconds' (seconds with records held and none handed on before the "
                           "shard merge decides a stall) is a number of seconds more than 0", value=stall_seconds)
    return max_held, float(stall_seconds)


def is_datahub_frame(df) -> bool:
    """Rows of `format("datahub")` (the columns shard, sequence and attributes)."""
    return {"topic", "shard", "sequence", "attributes"} <= set(df.columns)


class _DataHubToDts(_ToDts):
    """One DataHub topic's rows -> (key, Entry) through a DataHubAssembler, packed as `_ToDts` packs."""

    def __init__(self, options: Options, mode: str, limit: int, key: str, fields, tables,
                 max_held: int = 100_000, stall_seconds: float = 300.0) -> None:
        super().__init__(mode, limit, key)
        self.options, self.fields, self.tables = options, fields, tables
        self.max_held, self.stall_seconds = max_held, stall_seconds
        self.assembler = None
        self.final = False

    def fresh(self, snapshot: bytes | None):
        from bridge.stream.shards import DataHubAssembler
        self.assembler = DataHubAssembler(self.options, settle=0.0, tables=self.tables,
                                          max_buffered=self.max_held, stall_seconds=self.stall_seconds)
        if snapshot:
            self.assembler.restore(pickle.loads(snapshot))
        return self.assembler

    def entries(self, records):
        assembler, policy = self.assembler, self.policy
        for _, entry in assembler.entries(records, policy):
            yield self.key_of(entry, None), entry
        if self.final:
            for _, entry in assembler.finish(policy):
                yield self.key_of(entry, None), entry

    def snapshot(self) -> bytes:
        return pickle.dumps(self.assembler.snapshot(), protocol=pickle.HIGHEST_PROTOCOL)


def _records(frame, topic: str, fields, schema) -> list[tuple]:
    """The group's rows as the assembler's input: every shard's "shard" mark, then each shard's
    records in sequence order, then the "end" / "finished" marks."""
    from bridge.datahub.calls import sort_shard_id
    from bridge.stream.shards import DataHubRecord, ShardMark
    columns = {name: _pandas_column(frame, name) for name in frame.columns
               if name in SOURCE_COLUMNS or name == "data" or (fields and name in fields)}
    n = len(frame)
    marks = columns.get("mark") or [None] * n
    starts, ends, records = [], [], []
    read_at: dict = {}
    for i in range(n):
        shard = str(columns["shard"][i])
        key = (topic, shard)
        mark = marks[i]
        if mark is not None:
            doc = json.loads(mark)
            kind = doc["kind"]
            at = doc.get("at", 0) / 1000
            value = ShardMark(kind, topic, shard, tuple(doc.get("parents") or ()), at)
            if kind == "shard":
                read_at[key] = at
                starts.append((sort_shard_id(shard), key, value))
            else:
                ends.append((sort_shard_id(shard), key, value))
            continue
        seq = int(columns["sequence"][i])
        attrs = columns["attributes"][i]
        attrs = dict(attrs) if attrs is not None else {}
        stamp = columns["system_time"][i]
        system_time = 0 if stamp is None else int(stamp) // 1000
        if fields is None:
            data = columns["data"][i]
            rec = DataHubRecord(topic, shard, seq, system_time, attrs, data=None if data is None else bytes(data))
        else:
            row = {name: (None if columns[name][i] is None else FROM_SPARK[kind](columns[name][i]))
                   for name, kind in fields.items()}
            rec = DataHubRecord(topic, shard, seq, system_time, attrs, row=row, schema=schema)
        records.append((sort_shard_id(shard), seq, key, rec))
    marked = {key for _, key, _ in starts}
    for order, _, key, _ in records:  # without mark rows: every shard known before a record is fed
        if key not in marked:
            marked.add(key)
            starts.append((order, key, ShardMark("shard", topic, key[1])))
    out = [(key, -1, value) for _, key, value in sorted(starts, key=lambda t: t[0])]
    for _, seq, key, rec in sorted(records, key=lambda t: (t[0], t[1])):
        if key in read_at:
            rec = _with_read_at(rec, read_at[key])
        out.append((key, seq, rec))
    out.extend((key, -1, value) for _, key, value in sorted(ends, key=lambda t: t[0]))
    return out


def _with_read_at(rec, at: float):
    from dataclasses import replace
    return replace(rec, read_at=at)


def _run(job: _DataHubToDts, topic: str, frame, fields, schema, snapshot: bytes | None) -> list[tuple]:
    job.fresh(snapshot)
    return list(job.rows(iter(_records(frame, topic, fields, schema))))


def _frame(rows: list[tuple], columns: list[str]):
    import pandas as pd
    return pd.DataFrame.from_records(rows, columns=columns) if rows else pd.DataFrame({c: [] for c in columns})


def _processor(make_job, fields, schema, tally: SparkTally | None):
    from pyspark.sql.streaming import StatefulProcessor

    class DataHubReassembly(StatefulProcessor):
        """One DataHub topic per key: its shards merged, the assembler's open tail in state."""

        def init(self, handle) -> None:
            self.state = handle.getValueState("assembly", STATE_SCHEMA)
            self.job = None

        def handleInputRows(self, key, rows, timerValues) -> Iterator:
            import pandas as pd
            frames = list(rows)
            frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            if self.job is None:
                self.job = make_job()
            job = self.job
            snapshot = self.state.get()[0] if self.state.exists() else None
            out = _run(job, str(key[0]), frame, fields, schema, None if snapshot is None else bytes(snapshot))
            self.state.update((job.snapshot(),))
            yield _frame(out, [name for name, _ in job.columns])

        def close(self) -> None:
            if self.job is not None and tally is not None:
                tally.add(self.job.policy.tally)

    return DataHubReassembly()


def datahub_to_dts(df, options: Options | None, mode: str, limit: int, key: str, tally: SparkTally | None,
                   schema=None, table=None, *, max_held: int = 100_000, stall_seconds: float = 300.0):
    """The rows of `format("datahub")` -> DTS `key`, `value` rows (`dts_schema(mode)`): Blob when
    the rows have `data`, else Tuple (`schema`: the topics' RecordSchema, default from the Spark
    types of the field columns; `table`: "db.table", or a dict topic -> "db.table", for rows
    without `_source_table_`). `max_held`, `stall_seconds`: the merge's bounds (`merge_bounds`)."""
    options = options or DEFAULT_OPTIONS
    max_held, stall_seconds = merge_bounds(max_held, stall_seconds)
    if key not in ("table", "single"):
        raise OptionsError("on DataHub rows option 'key' is table or single", value=key)
    blob = "data" in df.columns
    fields = None
    if not blob:
        fields = {f.name: _field_type(f) for f in df.schema.fields if f.name not in SOURCE_COLUMNS}
        if schema is None:
            schema = {"fields": [{"name": n, "type": t} for n, t in fields.items()]}
        else:
            from bridge.tuple import TupleDecoder
            schema = TupleDecoder(schema, options).schema
            fields = {f["name"]: f["type"] for f in schema["fields"]}
    if df.isStreaming and "mark" not in df.columns:
        raise OptionsError("a streaming blob_to_dts / tuple_to_dts on DataHub rows needs the mark rows "
                           "(the datahub source's option marks=true, the default, and the mark column kept)")
    tables = table if isinstance(table, dict) or table is None else (lambda _t: table)

    def make_job():
        job = _DataHubToDts(options, mode, limit, key, fields, tables, max_held, stall_seconds)
        return job

    out_ddl = _ddl(_with_error(DTS_COLUMNS, mode))
    wanted = [c for c in df.columns if c in SOURCE_COLUMNS or c == "data" or (fields and c in fields)]
    df = df.select(*wanted)
    if df.isStreaming:
        provider = df.sparkSession.conf.get(PROVIDER_CONF, None)
        if provider != ROCKSDB:
            raise OptionsError(f"a streaming blob_to_dts / tuple_to_dts keeps its state with "
                               f"transformWithStateInPandas, which needs {PROVIDER_CONF}={ROCKSDB}", value=provider)
        return df.groupBy("topic").transformWithStateInPandas(_processor(make_job, fields, schema, tally), out_ddl,
                                                              "Append", "None")

    def whole(key_, frame):
        job = make_job()
        job.final = True
        out = _run(job, str(key_[0]), frame, fields, schema, None)
        if tally is not None:
            tally.add(job.policy.tally)
        return _frame(out, [name for name, _ in job.columns])

    return df.groupBy("topic").applyInPandas(whole, out_ddl)


def _field_type(field) -> str:
    from bridge.values.types import field_type_of_spark
    return field_type_of_spark(field.name, field.dataType.simpleString(), "; pass schema=")

