"""What the driver and the tasks of the `datahub` sink (bridge/spark/sink.py) share: the sink's
options declared once, the configuration the driver decides and pickles to the tasks, and the task
that writes Blob / Tuple rows, which `TablesTask` (bridge/spark/tables.py, a whole database)
extends. It sits below both so that the sink dispatches to either task and neither imports the sink.

>>> [o.key for o in OPTIONS][:3]
['endpoint', 'project', 'topic']
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from bridge.datahub.sink import DataHubError, DataHubWriter, Position, make_client, tuple_shard_key
from bridge.errors import BridgeError, ConversionError, OptionsError
from bridge.options import Options, option_specs
from bridge.pipeline.options import PipelineOptions, pipeline_option_specs, spark_key
from bridge.sync import topic_name

NAME = "datahub"
_POSITIONS = ("topic", "partition", "offset", "entry", "row")
SETTLE_SECONDS = 120.0  # how long a stopping task waits for its requests in flight


# ---- options: declared once ---------------------------------------------------------------------

def _text(key: str, value: str) -> str:
    if not value:
        raise OptionsError(f"option {key!r} must not be empty", value=value)
    return value


def _int_at_least(minimum: int) -> Callable[[str, str], int]:
    def parse(key: str, value: str) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise OptionsError(f"option {key!r} must be an integer >= {minimum}", value=value)
        return number
    return parse


def _bool(key: str, value: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise OptionsError(f"option {key!r} must be true or false", value=value)
    return text == "true"


def _one_of(*choices: str) -> Callable[[str, str], str]:
    def parse(key: str, value: str) -> str:
        if value not in choices:
            raise OptionsError(f"option {key!r} must be one of {', '.join(choices)}", value=value)
        return value
    return parse


def _names(key: str, value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in str(value).split(",") if n.strip())
    if not names:
        raise OptionsError(f"option {key!r} must name at least one column", value=value)
    return names


def _patterns(key: str, value: str) -> tuple[str, ...]:
    patterns = tuple(p.strip() for p in str(value).split(",") if p.strip())
    if not patterns:
        raise OptionsError(f"option {key!r} must give at least one db.table pattern", value=value)
    return patterns


def _table(key: str, value: str) -> str:
    db, dot, table = str(value).partition(".")
    if not dot or not db or not table:
        raise OptionsError(f"option {key!r} must be db.table", value=value)
    return value


@dataclasses.dataclass(frozen=True)
class Option:
    key: str
    parse: Callable[[str, str], Any]
    default: Any
    description: str


OPTIONS = (
    Option("endpoint", _text, None, "DataHub endpoint URL (required)"),
    Option("project", _text, None, "DataHub project (required)"),
    Option("topic", _text, None, "DataHub topic (required); for Tuple rows a template with {db} and {table} "
                                 "(as dts-bridge sync names topics), filled from option table or the rows' "
                                 "db and table columns"),
    Option("accessId", _text, None, "access key id; else DATAHUB_ACCESS_ID (driver, then executor)"),
    Option("accessKey", _text, None, "access key secret; else DATAHUB_ACCESS_KEY"),
    Option("routing", _one_of("shard"), "shard", "shard: DataWorks' rule (MD5 of the key over the ACTIVE shard "
                                                 "ids) on the shard key, one request in flight per shard"),
    Option("keyColumns", _names, None, "Tuple rows: the key columns of the shard key (tuple_shard_key), "
                                       "else the table name (every row of a table in one shard)"),
    Option("table", _table, None, "Tuple rows: their db.table (the shard key without keyColumns, and "
                                  "{db}/{table} of a topic template)"),
    Option("source", _text, None, "the source recorded in dts.topic; else each row's topic column"),
    Option("epoch", _int_at_least(0), None, "batch writes: an epoch that makes a rerun with the same rows "
                                            "write only what did not land (streaming: the micro-batch id)"),
    Option("commitLog", _text, None, "a file on the driver: one JSON line of counts per committed or "
                                     "aborted job / micro-batch"),
    # a whole database: rows of dts_entries, converted in the task as dts-bridge sync converts them
    Option("to", _one_of("blob", "tuple"), "blob", "dts_entries rows: blob (topic names one topic, or one per "
                                                   "database with {db}) or tuple (topic is a template with {table})"),
    Option("include", _patterns, None, "dts_entries rows: only tables whose db.table matches one of these "
                                       "comma-separated shell patterns"),
    Option("exclude", _patterns, None, "dts_entries rows: leave out tables whose db.table matches"),
    Option("deadLetters", _text, None, "dts_entries rows: the DataHub Blob topic of dead letters (needed by "
                                       "onTableError dlq|halt-table and oversized dlq)"),
)


def _number(kind: type) -> Callable[[str, str], Any]:
    def parse(key: str, value: str):
        try:
            return kind(str(value).strip())
        except ValueError:
            raise OptionsError(f"option {key!r} must be {'an integer' if kind is int else 'a number'}",
                               value=value) from None
    return parse


# the pipeline options (bridge.pipeline.options: declared once, as dts-bridge sync's flags): read
# from text here, checked by PipelineOptions itself (the same defaults and bounds as the CLI's)
_PIPELINE = tuple((name, Option(spark_key(name), _bool if kind is bool else _number(kind) if kind in (int, float)
                                else (lambda key, value: str(value)), default, text))
                  for name, kind, default, _, _, text in pipeline_option_specs("spark"))
OPTIONS += tuple(o for _, o in _PIPELINE)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _conversion_option(name: str, kind: str, default, choices, description: str) -> Option:
    """One `bridge.Options` field as a sink option (camelCase: zero_dates -> zeroDates), checked by
    Options itself when the sink is configured."""
    if kind == "bool":
        parse = _bool
    elif kind == "int":
        parse = _int_at_least(0)
    elif choices:
        parse = _one_of(*choices)
    else:
        parse = _text
    return Option(_camel(name), parse, None, f"dts_entries rows: the conversion's {name} option ({description})")


# a whole database's conversion options: those of bridge.Options (as dts-bridge sync's flags), but
# the error policy (onTableError decides) and the line limit (no lines are read)
_CONVERSION = tuple((spec[0], _conversion_option(*spec)) for spec in option_specs()
                    if spec[0] not in ("on_error", "max_line_bytes"))  # (Options field, sink option)
OPTIONS += tuple(o for _, o in _CONVERSION)
_ENTRY_OPTIONS = ("to", "include", "exclude", "schemaChange", "onTableError", "oversized", "deadLetters",
                  *(o.key for _, o in _CONVERSION))
_BY_KEY = {o.key.lower(): o for o in OPTIONS}


def conversion_options(opts: dict) -> Options:
    """The `bridge.Options` of a whole-database sink from its parsed options."""
    return Options(**{name: opts[o.key] for name, o in _CONVERSION if opts[o.key] is not None})


def parse_options(options) -> dict:
    """The data source's options (any key case) parsed and checked, defaults filled in; an option
    that looks like a misspelt one of ours is refused, naming the one meant."""
    given = {str(k).lower(): v for k, v in dict(options).items()}
    out = {}
    for lower, value in given.items():
        if lower in _BY_KEY:
            continue
        near = difflib.get_close_matches(lower, list(_BY_KEY), n=1, cutoff=0.8)
        if near:
            raise OptionsError(f"unknown option {lower!r}; did you mean {_BY_KEY[near[0]].key!r}?")
    for option in OPTIONS:
        value = given.get(option.key.lower())
        out[option.key] = option.default if value is None else option.parse(option.key, value)
    for key in ("endpoint", "project", "topic"):
        if out[key] is None:
            raise OptionsError(f"the {NAME} sink needs the option {key!r}")
    try:
        PipelineOptions(**{name: out[o.key] for name, o in _PIPELINE})
    except OptionsError as err:
        for name, o in _PIPELINE:
            if f"option {name!r}" in str(err):
                raise OptionsError(str(err).replace(f"option {name!r}", f"option {o.key!r}", 1)) from None
        raise
    if out["onTableError"] is None:  # as the error policy, which a sink's task has as FAILFAST
        out["onTableError"] = "halt-all"
    return out


@dataclasses.dataclass(frozen=True)
class SinkConfig:
    """Everything a task needs: the parsed options and the input's shape (plain data, pickled to
    the executors)."""
    options: dict
    kind: str                          # BLOB, TUPLE or ENTRIES (rows of dts_entries: a whole database)
    fields: tuple = ()                 # TUPLE: ((name, DataHub field type), ...) in column order
    timestamps: tuple = ()             # TUPLE: the fields held as Spark timestamps
    rows_name_tables: bool = False     # TUPLE: db / table columns give each row's table
    epoch: int | None = None

    @property
    def record_schema(self) -> dict | None:
        return {"fields": [{"name": n, "type": t} for n, t in self.fields]} if self.kind == "TUPLE" else None

    @property
    def template(self) -> bool:
        return "{db}" in self.options["topic"] or "{table}" in self.options["topic"]


# ---- the task side: one task's rows through the pipeline loop --------------------------------------

_UNSET = object()


class TaskRows:
    """The `Source` (bridge.stream.pipeline) of one task: the rows of the Arrow batches Spark hands
    the sink, in order. `chunks` gives one list of records per batch, read lazily: a poll gives
    what is left of the batch at hand and reads the next batch only when that is used up, so a
    batch's rows are written before Spark is asked for the next one, as they come. A record is
    (key, Kafka offset, value, None), the key and value as the task's `records` make them; several
    rows may share an offset (the rows of one Entries). There is nothing to commit here: Spark's
    commit protocol (the epoch) is the task's, so the loop runs with `MemoryPositions` and its
    closing commit is the sink's flush. It ends at the end of the input (`caught_up`, so
    `run(idle_timeout=0)` stops).

    With `split`, it also ends before a record whose `split(record)` differs from the run's first
    (the whole-database mode runs the loop once per source, each with its own sink and gate);
    `upcoming()` names the next run's, `next_run()` starts it.

    >>> rows = TaskRows(iter([[("a", 1, "x", None), ("a", 2, "y", None)], [("b", 3, "z", None)]]), split=lambda r: r[0])
    >>> rows.upcoming(), [r[1] for r in rows.poll(10, 0)], rows.poll(10, 0), rows.caught_up()
    ('a', [1, 2], [], True)
    >>> rows.next_run(), rows.upcoming(), [r[1] for r in rows.poll(10, 0)], rows.next_run()
    (True, 'b', [3], False)
    """

    dynamic = False

    def __init__(self, chunks: Iterator[list], split: Callable[[tuple], Any] | None = None) -> None:
        self._chunks, self._split = chunks, split
        self._at: list = []  # the batch at hand
        self._i = 0
        self._run: Any = _UNSET  # split value of the run under way
        self._stopped = self._end = False

    def keys(self) -> list:
        return []  # keys come with the rows; nothing is stored for them

    def open(self, committed) -> None:
        pass

    def _fill(self) -> bool:
        """A record at hand, reading the next batch if need be (False at the end of the input)."""
        while self._i >= len(self._at):
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self._at, self._i = chunk, 0
        return True

    def upcoming(self) -> Any:
        """The split value of the next record (None at the end)."""
        return self._split(self._at[self._i]) if self._fill() else None

    def poll(self, budget: int, timeout: float) -> list[tuple]:
        if self._stopped:
            return []
        if not self._fill():
            self._stopped = self._end = True
            return []
        end = min(len(self._at), self._i + budget)
        out = self._at[self._i:end]
        if self._split is not None:
            if self._run is _UNSET:
                self._run = self._split(out[0])
            for n, record in enumerate(out):
                if self._split(record) != self._run:
                    out, end, self._stopped = out[:n], self._i + n, True
                    break
        self._i = end
        return out

    def next_run(self) -> bool:
        """After a run ended at a boundary: whether records remain (the next run takes them)."""
        if self._end or self.upcoming() is None:
            return False
        self._run, self._stopped = _UNSET, False
        return True

    def caught_up(self) -> bool:
        return self._stopped

    def ends(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class TaskRecords:
    """The `Assembler` of a task's rows: nothing is held (the transforms before the sink
    reassembled the Entries), each record's value is `(where, item, error)` and goes on as
    (where, item), but a PERMISSIVE error row, counted in `counts` as rejected and not written.
    `parse(where, item)` may turn an item into what the converter takes, or give None for a row
    it rejected under the error policy."""

    def __init__(self, counts: dict, parse: Callable[[dict, Any], Any] | None = None) -> None:
        self.counts, self.parse = counts, parse
        self.where: dict = {}  # the row being handed on, for an error raised while it is written

    def entries(self, records, policy) -> Iterator[tuple]:
        tally, counts, parse = policy.tally, self.counts, self.parse
        for record in records:
            where, item, error = record[2]
            counts["rows"] += 1
            if error is not None:
                counts["rejected"] += 1  # a PERMISSIVE error row: nothing to write
                continue
            self.where = where
            tally.input += 1
            if parse is not None:
                item = parse(where, item)
                if item is None:
                    continue
            yield (where, *item) if parse is not None else (where, item)
            self.where = {}  # handed on and written: an error reading the next row is not this row's

    def resume_at(self, key) -> None:
        pass

    def held_from(self, key) -> int | None:
        return None

    def held(self) -> int:
        return 0


def _one(item) -> tuple:
    return (item,)


class RowsTask:
    """One task's writing of Blob / Tuple rows through the pipeline loop (`bridge.pipeline.run`:
    `TaskRows` -> `TaskRecords` -> this task as the `Sink`): a DataHubWriter per source (Kafka
    topic), rows put in arrival order, flushed when the input ends."""

    def __init__(self, config: SinkConfig, epoch: int | None, client_for: Callable[[], Any] | None = None) -> None:
        self.config, self.epoch = config, epoch
        opts = config.options
        self.client_for = client_for or (lambda: make_client(opts["endpoint"], opts["accessId"], opts["accessKey"],
                                                             opts["compress"]))
        self.writers: dict[str, DataHubWriter] = {}
        self.checked: set[tuple[str, str]] = set()
        self.topics: dict[tuple, str] = {}
        self.counts = dict(rows=0, written=0, skipped=0, rejected=0)
        self.offsets: dict[str, list[int]] = {}

    def run(self, batches) -> None:
        """Every row of `batches` (Arrow record batches) written in order, then flushed."""
        from bridge import pipeline
        from bridge.stream import ErrorPolicy
        from bridge.stream.pipeline import MemoryPositions
        records = TaskRecords(self.counts)
        try:
            pipeline.run(TaskRows(self.records(batches)), MemoryPositions(), records, _one, self,
                         ErrorPolicy("fail", keep_records=False), idle_timeout=0, size=len)
        except BridgeError as err:
            if not any(err is w.error for w in self.writers.values()):  # a writer thread's names its records
                err.located(**records.where)
            raise
        self.finish()

    def new_writer(self, source: str) -> DataHubWriter:
        """A DataHubWriter of the options, resumed at the epoch for `source` (the records' dts.topic)."""
        opts = self.config.options
        create = {"shards": opts["shards"], "lifecycle": opts["lifecycle"]} if opts["createTopics"] else None
        writer = DataHubWriter(self.client_for(), opts["project"], batch_records=opts["batchSize"],
                               workers=opts["workers"], max_retries=opts["maxRetries"], create_topics=create)
        if self.epoch is not None:
            writer.resume(source, epoch=self.epoch)
        return writer

    def writer(self, source: str) -> DataHubWriter:
        writer = self.writers.get(source)
        if writer is None:
            writer = self.writers[source] = self.new_writer(source)
        return writer

    def records(self, batches) -> Iterator[tuple]:
        """The task's rows as `TaskRows` records, a list per batch: key (source, partition),
        position the offset, value (where, (topic, shard key, value, source), error)."""
        fixed_source = self.config.options["source"]
        for batch in batches:
            cols = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
            n = batch.num_rows
            pos = [cols[p].to_pylist() for p in _POSITIONS]
            errors = cols["error"].to_pylist() if "error" in cols else itertools.repeat(None)
            if self.config.kind == "BLOB":
                keys, values = cols["shard_key"].to_pylist(), cols["blob"].to_pylist()
                items = ((self.config.options["topic"], keys[i], values[i]) for i in range(n))
            else:
                items = self._tuple_items(cols, n)
            chunk = []
            for i, ((topic, key, value), error) in enumerate(zip(items, errors)):
                source = fixed_source or pos[0][i]
                where = dict(zip(_POSITIONS[1:], (pos[1][i], pos[2][i], pos[3][i], pos[4][i])))
                if error is None and (source is None or None in where.values()):
                    raise ConversionError(f"a row without its position ({', '.join(_POSITIONS)}): the {NAME} sink "
                                          "writes rows of dts_to_blob / dts_to_tuple(positions=True)", **where)
                chunk.append(((source, where["partition"]), where["offset"] or 0,
                              (where, (topic, key, value, source), error), None))
            yield chunk

    def write(self, where: dict, outputs) -> None:
        """The loop's `Sink.write`: one row, put with its position."""
        for topic, key, value, source in outputs:
            if value is None or key is None:
                raise ConversionError("a row without blob or shard_key", **where)
            writer = self.writer(source)
            self.check_topic(writer, source, topic)
            if isinstance(value, str):
                value = value.encode("utf-8")
            try:
                put = writer.put(topic, key, value, Position(source, *where.values()))
            except BridgeError as err:
                raise err.located(**where)
            self.counts["written" if put else "skipped"] += 1
            self.span(source, where["partition"], where["offset"])

    def span(self, source: str, partition: int, offset: int) -> None:
        """The task's Kafka offsets, per source and partition, for the counts."""
        span = self.offsets.setdefault(f"{source}:{partition}", [offset, offset])
        span[0], span[1] = min(span[0], offset), max(span[1], offset)

    def check_topic(self, writer: DataHubWriter, source: str, topic: str) -> None:
        if (source, topic) in self.checked:
            return
        info = writer.topic(topic, self.config.record_schema)
        if info.kind != self.config.kind:
            rows = "dts_to_blob" if self.config.kind == "BLOB" else "Tuple"
            raise DataHubError(f"topic {self.config.options['project']}/{topic} is a {info.kind} topic; the rows "
                               f"are {rows} rows")
        self.checked.add((source, topic))

    def _tuple_items(self, cols: dict, n: int) -> Iterator[tuple]:
        import pyarrow as pa
        opts, config = self.config.options, self.config
        values = []
        for name, _ in config.fields:
            column = cols[name]
            if name in config.timestamps:  # epoch microseconds, as pydatahub and the Tuple files hold them
                column = column.cast(pa.timestamp("us", tz=getattr(column.type, "tz", None))).cast(pa.int64())
            values.append(column.to_pylist())
        names = [name for name, _ in config.fields]
        dbs = cols["db"].to_pylist() if config.rows_name_tables else None
        tables = cols["table"].to_pylist() if config.rows_name_tables else None
        keys = list(opts["keyColumns"] or ())
        for i in range(n):
            row = {name: column[i] for name, column in zip(names, values)}
            if dbs is None:
                table = opts["table"]
                db, _, name = (table or ".").partition(".")
            else:
                db, name = dbs[i] or "", tables[i] or ""
                table = f"{db}.{name}"
            topic = opts["topic"]
            if config.template:
                topic = self.topics.get((db, name)) or self.topics.setdefault((db, name), topic_name(topic, db, name))
            yield topic, tuple_shard_key(row, table, keys), row

    def flush(self) -> None:
        """The loop's `Sink.flush`: returns once DataHub acknowledged every row put."""
        for writer in self.writers.values():
            writer.flush()

    def finish(self) -> None:
        for writer in self.writers.values():
            writer.stop()

    def stop(self) -> None:
        # Wait for requests in flight: a retried task or a replay must not scan a tail that still grows.
        for writer in self.writers.values():
            writer.stop(wait=SETTLE_SECONDS)

    def report(self) -> dict:
        counts = dict(self.counts, epoch=self.epoch, offsets=self.offsets)
        for name in ("requests", "retries", "throttled", "resplits"):
            counts[name] = sum(getattr(w, name) for w in self.writers.values())
        return counts
