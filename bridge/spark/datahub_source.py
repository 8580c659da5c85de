"""`spark.read.format("datahub")` / `spark.readStream.format("datahub")`: the shards of a DataHub
Blob topic (or of Tuple topics by list or `{db}_{table}` template) as a DataFrame, read with the
library's reader (`bridge.datahub.source.DataHubSource`: GetCursor + GetRecords under the retry
policy, data loss past the lifecycle, splits and merges).

One input partition per shard range. A streaming query's offsets are
`{topic: {shard: next sequence}, "_plan": {"at": ms, "ends": {topic: [shard, ...]}}}`: the
positions, plus when the micro-batch was planned and which shards it reads to their end then (so a
replayed micro-batch gives the same rows). A shard whose parents (split, merge) are not read to
their end yet keeps its position: a child's records never come before its parents' end.

Shard states: an empty shard's end is 0 (`DataHubSource.end_of`: GetCursor LATEST answers 0 on an
empty shard as on a shard of one record, told apart by reading one record); a shard that gains its
first record is read from sequence 0. A shard no longer listed (DataHub deletes a CLOSED shard once
its records are past the lifecycle) leaves the offsets, and its range in that micro-batch is a
"finished" mark: read to its end before (it was in the previous plan's `ends`, or its end is known),
nothing is lost; else its unread records are lost data (`failOnDataLoss`).

Columns: `topic STRING, shard STRING, sequence BIGINT, system_time TIMESTAMP, attributes
MAP<STRING,STRING>`, then `data BINARY` (Blob) or the Tuple fields, then `mark STRING`. Rows with a
non-NULL `mark` are no records: they tell `blob_to_dts` / `tuple_to_dts` (bridge/spark/reverse.py)
what it cannot see in records (a JSON object: `kind` "shard" with `parents` and `at`, "end" with
`at`, or "finished"), so that Entries whose rows sit on several shards are rebuilt exactly. Filter
them out (`mark IS NULL`) for the records alone. docs/spark.md, "Reading DataHub".
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bridge.errors import OptionsError
from bridge.spark.source import _admit, _flag, _integer
from bridge.values import signed_digits

__all__ = ["READ_OPTIONS", "ReadOptions", "read_schema", "register_reader"]

_UTC = datetime.timezone.utc
PLAN = "_plan"  # DataHub topic names start with a letter: no clash

READ_OPTIONS = {
    "endpoint": (None, "both", "the DataHub endpoint URL"),
    "project": (None, "both", "the DataHub project"),
    "topic": (None, "both", "a Blob topic, Tuple topics as a comma-separated list, or a {db}_{table} template"),
    "accessId": (None, "both", "credentials (default: DATAHUB_ACCESS_ID / DATAHUB_ACCESS_KEY on each side)"),
    "accessKey": (None, "both", ""),
    "startingPosition": ("oldest", "both", "oldest, latest, a time (ISO 8601 or epoch ms), or JSON "
                         "{\"topic\": {\"0\": 12}} offsets"),
    "failOnDataLoss": ("true", "both", "records past the lifecycle before they were read: fail or skip them"),
    "maxRecordsPerTrigger": (None, "stream", "at most this many records per micro-batch, split by lag"),
    "settle": ("1", "stream", "seconds a shard must be seen at its end after a record was read before it "
               "counts as holding nothing earlier of that record's stream"),
    "page": ("1000", "both", "records per GetRecords request"),
    "marks": ("true", "both", "add the mark rows blob_to_dts / tuple_to_dts need"),
}
_BY_LOWER = {name.lower(): name for name in READ_OPTIONS}


@dataclass(frozen=True)
class ReadOptions:
    endpoint: str
    project: str
    topics: object  # str (one topic or a template) or tuple of names
    access_id: str | None = None
    access_key: str | None = None
    starting: object = "oldest"  # "oldest" | "latest" | int ms | {(topic, shard): next}
    fail_on_data_loss: bool = True
    max_records: int | None = None
    settle: float = 1.0
    page: int = 1000
    marks: bool = True

    @classmethod
    def parse(cls, options, streaming: bool) -> ReadOptions:
        given = {}
        for key, value in dict(options).items():
            name = _BY_LOWER.get(key.lower())
            if name is None:
                if key.lower() == "path":
                    continue
                raise OptionsError(f"the datahub source has no option {key!r}; it takes " + ", ".join(READ_OPTIONS))
            given[name] = value
        for name, (_, where, _) in READ_OPTIONS.items():
            if name in given and where == "stream" and not streaming:
                raise OptionsError(f"option {name!r} applies to streaming reads only (readStream)", value=given[name])
        missing = [n for n in ("endpoint", "project", "topic") if not given.get(n)]
        if missing:
            raise OptionsError(f"the datahub source needs the option {missing[0]!r}")
        topic = str(given["topic"]).strip()
        topics = tuple(t.strip() for t in topic.split(",")) if "," in topic else topic
        return cls(endpoint=given["endpoint"], project=given["project"], topics=topics,
                   access_id=given.get("accessId"), access_key=given.get("accessKey"),
                   starting=_starting(given.get("startingPosition", "oldest")),
                   fail_on_data_loss=_flag("failOnDataLoss", given.get("failOnDataLoss", "true")),
                   max_records=_integer("maxRecordsPerTrigger", given["maxRecordsPerTrigger"], 1)
                   if "maxRecordsPerTrigger" in given else None,
                   settle=_seconds("settle", given.get("settle", "1")),
                   page=_integer("page", given.get("page", "1000"), 1),
                   marks=_flag("marks", given.get("marks", "true")))

    def source(self):
        """A DataHubSource over the topics (no shard opened: the planner and the tasks read ranges)."""
        from bridge.datahub.calls import make_client
        from bridge.datahub.source import DataHubSource
        client = make_client(self.endpoint, self.access_id or os.environ.get("DATAHUB_ACCESS_ID", ""),
                             self.access_key or os.environ.get("DATAHUB_ACCESS_KEY", ""))
        return DataHubSource(client, self.project, list(self.topics) if isinstance(self.topics, tuple)
                             else self.topics, fail_on_data_loss=self.fail_on_data_loss, page=self.page)


def _seconds(name: str, text) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionsError(f"option {name!r} is a number of seconds", value=text) from None
    if value < 0:
        raise OptionsError(f"option {name!r} is at least 0", value=text)
    return value


def _starting(text):
    spec = str(text).strip()
    if spec.lower() in ("oldest", "latest"):
        return spec.lower()
    if signed_digits(spec):
        return int(spec)
    if spec.startswith("{"):
        try:
            doc = json.loads(spec)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and all(isinstance(v, dict) for k, v in doc.items() if k != PLAN):
            try:
                return _positions(doc)
            except (TypeError, ValueError):
                pass
        raise OptionsError("option 'startingPosition': JSON offsets are {\"topic\": {\"shard\": next sequence}}",
                           value=text)
    try:
        stamp = datetime.datetime.fromisoformat(spec)
    except ValueError:
        raise OptionsError("option 'startingPosition' is oldest, latest, a time (ISO 8601 or epoch ms) or JSON "
                           "offsets", value=text) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_UTC)
    return int(stamp.timestamp() * 1000)


# ---- offsets -------------------------------------------------------------------------------------

def _positions(doc: dict | None) -> dict[tuple, int]:
    if not doc:
        return {}
    return {(topic, str(shard)): int(pos) for topic, shards in doc.items() if topic != PLAN
            for shard, pos in shards.items()}


def _document(positions: dict[tuple, int], at: int | None = None, ends: set | None = None) -> dict:
    from bridge.datahub.calls import sort_shard_id
    doc: dict = {}
    for (topic, shard) in sorted(positions, key=lambda k: (k[0], sort_shard_id(k[1]))):
        doc.setdefault(topic, {})[shard] = int(positions[(topic, shard)])
    if at is not None:
        plan: dict = {}
        for topic, shard in sorted(ends or (), key=lambda k: (k[0], sort_shard_id(k[1]))):
            plan.setdefault(topic, []).append(shard)
        doc[PLAN] = {"at": int(at), "ends": plan}
    return doc


@dataclass(frozen=True)
class ShardRange:
    """One input partition: shard `key`'s sequences [start, end), the batch's plan time `at` (ms),
    whether the range reaches the shard's end as seen then (`at_end`) and whether the shard is
    closed and read to its end (`finished`), and its parents."""
    topic: str
    shard: str
    start: int
    end: int
    parents: tuple
    at: int
    at_end: bool
    finished: bool


class Planner:
    """The driver side: shards, start positions, admission control, AvailableNow, ticks."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.source = opts.source()
        self.closed_end: dict[tuple, int] = {}  # a CLOSED shard's end never changes
        self.target: dict[tuple, int] | None = None
        self.last_data_at: float | None = time.time()  # a tick after every (re)start
        self.facts: list = []

    def _facts(self) -> list:
        self.facts = self.source.shard_facts()
        return self.facts

    def end(self, key: tuple, state: str) -> int:
        if state == "CLOSED":
            if key not in self.closed_end:
                self.closed_end[key] = self.source.end_of(key)
            return self.closed_end[key]
        return self.source.end_of(key)

    def _first(self, key: tuple, state: str, initial: bool) -> int:
        """Where a shard without a position starts: by startingPosition for the shards of the
        first plan, from its oldest record for a shard that appeared later (a split's child)."""
        starting = self.opts.starting
        if not initial or starting == "oldest":
            oldest = self.source.sequence(key, "OLDEST")
            return oldest if oldest is not None else self.end(key, state)
        if starting == "latest":
            return self.end(key, state)
        if isinstance(starting, int):
            return min(self.source.start_at(key, starting), self.end(key, state))
        if key in starting:
            return starting[key]
        oldest = self.source.sequence(key, "OLDEST")
        return oldest if oldest is not None else self.end(key, state)

    def initial(self) -> dict:
        if isinstance(self.opts.starting, dict):
            unknown = sorted(set(self.opts.starting) - {k for k, _, _ in self._facts()})
            if unknown:
                raise OptionsError(f"option 'startingPosition' names shard {unknown[0][1]} of topic {unknown[0][0]}, "
                                   "which is not there", value=self.opts.starting)
        return _document({key: self._first(key, state, True) for key, _, state in self._facts()})

    def _finished(self, positions: dict, states: dict, key: tuple) -> bool:
        return states.get(key) == "CLOSED" and positions.get(key, -1) >= self.end(key, "CLOSED")

    def readable(self, positions: dict, states: dict, parents: dict, key: tuple) -> bool:
        return all((key[0], p) not in states or self._finished(positions, states, (key[0], p))
                   for p in parents.get(key, ()))

    def prepare_available_now(self) -> None:
        self.target = {key: self.end(key, state) for key, _, state in self._facts()}

    def _gone(self, key: tuple, position: int, read_to_end: bool) -> None:
        """Shard `key` is no longer listed (deleted past the lifecycle) at `position`: lost data
        unless it was read to its end (`read_to_end`: it was at its end in the previous plan)."""
        from bridge.datahub.source import DataLossError
        end = self.closed_end.get(key)
        if read_to_end or (end is not None and position >= end):
            return
        text = (f"DataHub {self.opts.project}/{key[0]} shard {key[1]} no longer exists (deleted past the topic's "
                f"lifecycle) and was not read to its end: records from {position} on were never read"
                + (f" (its end was {end})" if end is not None else ""))
        if self.opts.fail_on_data_loss:
            raise DataLossError(text + "; failOnDataLoss=false reads on without them")
        logging.getLogger(__name__).warning("%s: skipped (failOnDataLoss=false)", text)

    def latest(self, start: dict | None, limit: int | None) -> dict:
        from bridge.datahub.source import ShardGoneError
        begin = _positions(start)
        now = time.time()  # the look starts: shards at their end now are so at `now` at least
        facts = self._facts()
        states = {key: state for key, _, state in facts}
        parents = {key: ps for key, ps, _ in facts}
        planned = {(t, s) for t, shards in (((start or {}).get(PLAN) or {}).get("ends") or {}).items() for s in shards}
        for key in sorted(set(begin) - set(states)):  # gone: it leaves the offsets (ranges: a "finished" mark)
            self._gone(key, begin.pop(key), key in planned)
        positions = dict(begin)
        ends: dict[tuple, int] = {}
        real: dict[tuple, int] = {}
        for key, _, state in facts:
            if key not in begin:  # a shard new to the query (a split's child): its start, read later
                if self.target is None or key in self.target:
                    positions[key] = self._first(key, state, start is None)
                continue
            if not self.readable(begin, states, parents, key):
                continue  # its parents are not read to their end yet
            try:
                real[key] = end = self.end(key, state)
            except ShardGoneError:
                continue  # deleted since it was listed: the next plan leaves it out
            if self.target is not None:
                end = min(end, self.target.get(key, begin[key]))
            ends[key] = max(end, begin[key])
        until = {k: ends.get(k, positions[k]) for k in positions}
        if limit is not None:
            until = _admit(positions, until, limit)
        at_end = {k for k in ends if until[k] == real[k]}
        if start is None or until != _positions(start):
            self.last_data_at = now
            return _document(until, int(now * 1000), at_end)
        if self.last_data_at is None:
            return start  # nothing new, and the last look is fresh enough
        wait = self.last_data_at + self.opts.settle - now
        if wait > 0:
            if self.target is None:
                return start
            time.sleep(wait)  # AvailableNow: its last batch must take the look the tail waits for
            return self.latest(start, limit)
        self.last_data_at = None
        return _document(until, int(now * 1000), at_end)  # a tick: the same positions, a later look

    def ranges(self, start: dict | None, end: dict) -> list[ShardRange]:
        first, last = _positions(start), _positions(end)
        plan = end.get(PLAN) or {}
        at = int(plan.get("at", 0))
        ends = {(t, s) for t, shards in (plan.get("ends") or {}).items() for s in shards}
        facts = self.facts or self._facts()
        known = {key: (ps, state) for key, ps, state in facts}
        if any(k not in known for k in last):
            facts = self._facts()
            known = {key: (ps, state) for key, ps, state in facts}
        out = []
        for key, stop in last.items():
            ps, state = known.get(key, ((), "ACTIVE"))
            begin = first.get(key, stop)
            out.append(ShardRange(key[0], key[1], begin, stop, tuple(ps), at, key in ends,
                                  state == "CLOSED" and stop >= self.end(key, state)))
        # gone (past the lifecycle), left out of `end`: nothing more to wait for (a shard listed but not
        # in `end` is one the start offset has and the plan not: an initial offset asked again on a
        # restart, after a split)
        for key in sorted(set(first) - set(last) - set(known)):
            out.append(ShardRange(key[0], key[1], first[key], first[key], (), at, False, True))
        return out

    def batch_ranges(self) -> list[ShardRange]:
        """A batch read: every shard from startingPosition to its end now."""
        at = int(time.time() * 1000)
        out = []
        for key, ps, state in self._facts():
            stop = self.end(key, state)
            begin = min(self._first(key, state, True), stop)
            out.append(ShardRange(key[0], key[1], begin, stop, tuple(ps), at, True, state == "CLOSED"))
        return out


# ---- the rows (executors) ------------------------------------------------------------------------

def _mark(kind: str, **more) -> str:
    return json.dumps({"kind": kind, **more}, separators=(",", ":"))


def _stamp(ms) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, _UTC)


def read_range(opts: ReadOptions, part: ShardRange, fields: list | None, settle_ms: int) -> Iterator[tuple]:
    """The rows of one shard range: a "shard" mark, the records, then "finished" or "end"."""
    width = 1 if fields is None else len(fields)
    empty = (None,) * width
    if opts.marks:
        yield (part.topic, part.shard, part.start - 1, None, None) + empty + (
            _mark("shard", parents=list(part.parents), at=part.at),)
    if part.end > part.start:
        source = opts.source()
        convert = None if fields is None else [_to_spark(kind) for _, kind in fields]
        for rec in source.read_range((part.topic, part.shard), part.start, part.end):
            head = (rec.topic, rec.shard, rec.sequence, _stamp(rec.system_time), dict(rec.attributes))
            if fields is None:
                yield head + (rec.data,) + ((None,) if opts.marks else ())
            else:
                row = rec.row
                values = tuple(None if row.get(name) is None else conv(row.get(name))
                               for (name, _), conv in zip(fields, convert))
                yield head + values + ((None,) if opts.marks else ())
    if opts.marks:
        if part.finished:
            yield (part.topic, part.shard, part.end - 1, None, None) + empty + (_mark("finished"),)
        elif part.at_end:
            yield (part.topic, part.shard, part.end - 1, None, None) + empty + (
                _mark("end", at=part.at - settle_ms),)


def _to_spark(kind: str):
    if kind == "TIMESTAMP":
        return lambda v: datetime.datetime.fromtimestamp(0, _UTC) + datetime.timedelta(microseconds=int(v))
    if kind in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT"):
        return int
    return lambda v: v


def _tuple_fields(source) -> list[tuple[str, str]]:
    """The union of the Tuple topics' fields (name, DataHub type), in order of first appearance; a
    field with two types is refused."""
    out: dict[str, str] = {}
    for topic in source.topics:
        schema = source.schemas[topic]
        for f in schema.field_list:
            kind = str(getattr(f.type, "value", f.type)).upper()
            if out.setdefault(f.name, kind) != kind:
                raise OptionsError(f"the Tuple topics give field {f.name!r} two types ({out[f.name]}, {kind}): "
                                   "read them one topic at a time", value=topic)
    return list(out.items())


_SPARK = {"BIGINT": "BIGINT", "INTEGER": "INT", "SMALLINT": "SMALLINT", "TINYINT": "TINYINT", "DOUBLE": "DOUBLE",
          "FLOAT": "FLOAT", "DECIMAL": "DECIMAL(38,18)", "BOOLEAN": "BOOLEAN", "TIMESTAMP": "TIMESTAMP",
          "STRING": "STRING"}


def read_schema(opts: ReadOptions) -> tuple[str, list | None]:
    """(Spark DDL, Tuple fields or None for Blob) of the topics."""
    source = opts.source()
    kinds = set(source.kinds.values())
    if len(kinds) > 1:
        raise OptionsError("the datahub source reads Blob or Tuple topics, not both", value=opts.topics)
    head = "`topic` STRING, `shard` STRING, `sequence` BIGINT, `system_time` TIMESTAMP, " \
           "`attributes` MAP<STRING, STRING>"
    tail = ", `mark` STRING" if opts.marks else ""
    if kinds == {"BLOB"}:
        return head + ", `data` BINARY" + tail, None
    fields = _tuple_fields(source)
    clash = [n for n, _ in fields if n in ("topic", "shard", "sequence", "system_time", "attributes", "mark")]
    if clash:
        raise OptionsError(f"Tuple field {clash[0]!r} clashes with a column of the datahub source", value=opts.topics)
    return head + "".join(f", `{n}` {_SPARK[k]}" for n, k in fields) + tail, fields


# ---- Spark classes ---------------------------------------------------------------------------------

def reader_classes():
    """(batch reader, stream reader) classes; defined on first use so that importing needs no pyspark."""
    return _classes()


_CACHE: list = []


def _classes():
    if _CACHE:
        return _CACHE[0]
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

    class ShardPartition(InputPartition):
        def __init__(self, part: ShardRange) -> None:
            super().__init__(part)
            self.part = part

    class DataHubReader(DataSourceReader):
        def __init__(self, options, fields) -> None:
            self.opts = ReadOptions.parse(options, streaming=False)
            self.fields = fields

        def partitions(self):
            return [ShardPartition(r) for r in Planner(self.opts).batch_ranges()]

        def read(self, partition):
            return read_range(self.opts, partition.part, self.fields, 0)

    class DataHubStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options, fields) -> None:
            self.opts = ReadOptions.parse(options, streaming=True)
            self.fields = fields
            self.planner = Planner(self.opts)

        def initialOffset(self) -> dict:
            return self.planner.initial()

        def getDefaultReadLimit(self):
            return ReadMaxRows(self.opts.max_records) if self.opts.max_records else ReadAllAvailable()

        def latestOffset(self, start=None, limit=None) -> dict:
            if isinstance(limit, ReadMaxRows):
                return self.planner.latest(start, limit.max_rows)
            return self.planner.latest(start, None)

        def prepareForTriggerAvailableNow(self) -> None:
            self.planner.prepare_available_now()

        def partitions(self, start: dict, end: dict):
            return [ShardPartition(r) for r in self.planner.ranges(start, end)]

        def read(self, partition):
            return read_range(self.opts, partition.part, self.fields, int(self.opts.settle * 1000))

        def commit(self, end: dict) -> None:
            pass

    _CACHE.append((DataHubReader, DataHubStreamReader))
    return _CACHE[0]


def register_reader(options, streaming: bool):
    """The reader of a `format("datahub")` read with these options (the data source class in
    bridge/spark/sink.py calls this from `reader` / `streamReader`)."""
    opts = ReadOptions.parse(options, streaming)
    _, fields = read_schema(opts)
    batch, stream = _classes()
    return stream(options, fields) if streaming else batch(options, fields)
