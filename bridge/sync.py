"""The one-process pipeline: a DTS Kafka topic -> Blob or Tuple -> DataHub, exactly once in effect.

The stages are the ones every face wires: `kafka.consume` (reads, reassembles per partition or per
TDSQL shard, converts through `bridge.stream` under the error policy, commits) and the
`DataHubWriter` (ordered per shard, idempotent). The sink below is the seam: `write` puts each
converted record with its source position, `sync` waits until DataHub acknowledged everything put
so far, and `kafka.consume` commits offsets only after `sync` returned. On start the writer is told
the committed offsets (`DataHubWriter.resume`), so records that landed after the last commit and
are read again are recognised by their position attributes and not written twice.

>>> topic_name("{db}_{table}", "Shop-DB", "Order Items")
'shop_db_order_items'
"""
from __future__ import annotations

import re
from typing import Callable

from .blob_encode import BlobEncoder
from .datahub_sink import DataHubWriter, Position, tuple_shard_key
from .errors import BridgeError
from .options import Options

__all__ = ["BlobSink", "TupleSink", "topic_name", "blob_converter", "run"]

_TOPIC_BAD = re.compile(r"[^a-z0-9_]+")


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


class _Sink:
    """Puts each Entry's records with their positions, all of them or (a record that does not fit:
    the Entry's error, under the policy) none; `sync()` returns once DataHub acknowledged them."""

    def __init__(self, writer: DataHubWriter, source: str, policy) -> None:
        self.writer, self.source, self.policy = writer, source, policy
        self.written = 0

    def _put_all(self, where: dict, items) -> None:
        base = (where["partition"], where["offset"], where["entry"])
        items = list(items)
        try:
            prepared = [self.writer.prepare(topic, key, value, Position(self.source, *base, row))
                        for row, (topic, key, value) in enumerate(items)]
        except BridgeError as err:
            err.located(partition=where["partition"], offset=where["offset"])
            tally = self.policy.tally
            self.policy.reject(err)  # counted: the Entry was counted converted, now rejected
            tally.converted -= 1
            tally.outputs -= len(items)
            return
        for item in prepared:
            if item is not None and self.writer.put_prepared(item):
                self.written += 1

    def sync(self) -> None:
        self.writer.flush()

    def may_commit(self, offsets: dict) -> bool:
        """kafka.consume asks before it commits: see DataHubWriter.covered."""
        return self.writer.covered(offsets)


class BlobSink(_Sink):
    """Blob messages to one DataHub topic."""

    def __init__(self, writer: DataHubWriter, topic: str, source: str, policy) -> None:
        super().__init__(writer, source, policy)
        self.topic = topic
        writer.topic(topic)

    @staticmethod
    def size(columns) -> int:
        return len(columns[0])

    def write(self, where: dict, columns) -> None:
        self._put_all(where, ((self.topic, key, line) for key, line in zip(columns[4], columns[6])))


class TupleSink(_Sink):
    """Tuple rows to one topic per table (a name template), created when missing with the
    RecordSchema the rows have. A column the topic lacks (added by DDL) is appended to the topic as
    a nullable field before the first row that has it; a dropped column is NULL in later rows; a
    field whose type changed is the Entry's error (the writer's topic check), never a cut row."""

    size = staticmethod(len)

    def __init__(self, writer: DataHubWriter, template: str, source: str, policy) -> None:
        super().__init__(writer, source, policy)
        self.template = template
        self._topics: dict[str, str] = {}
        self.evolved: list = []  # (topic, fields added, where)

    def write(self, where: dict, rows) -> None:
        items = []
        for table, columns, schema, row in rows:
            topic = self._topics.get(table)
            if topic is None:
                db, _, name = table.partition(".")
                topic = self._topics[table] = topic_name(self.template, db, name)
            info = self.writer.topic(topic, schema)
            have = {f.name for f in info.schema.field_list}
            added = [(f["name"], f["type"]) for f in schema["fields"] if f["name"] not in have and f["name"] in row]
            if added:  # a column added by DDL: the topic grows a nullable field before the first row using it
                self.writer.append_fields(topic, added)
                self.evolved.append((topic, [name for name, _ in added], dict(where)))
            keys = [c.name for c in columns if c.isKey]
            items.append((topic, tuple_shard_key(row, table, keys), row))
        self._put_all(where, items)


# How far DataHub's clock may be behind this machine's: the tail scan reads back this much further.
CLOCK_MARGIN_MS = 5 * 60 * 1000


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
        commit_interval: float | None = 5.0, report=None):
    """Resume the writer at the stored offsets, then `kafka.consume` into `sink`; returns its report."""
    from . import kafka
    partitions = partitions if partitions is not None else kafka.partitions_of(consumer, topic)
    store = _EveryPartition(store)
    stored = store.load(partitions)
    committed = {p: stored.get(p, (None, None))[0] for p in partitions}
    times = getattr(store.store, "times", {})
    since = None
    if any(off is not None for off in committed.values()) and \
            all(p in times for p, off in committed.items() if off is not None):
        since = min(times[p] for p, off in committed.items() if off is not None) - CLOCK_MARGIN_MS
    writer.resume(topic, committed, since_ms=since)
    try:
        return kafka.consume(consumer, topic, store, convert, sink, policy, partitions=partitions, start=start,
                             max_messages=max_messages, idle_timeout=idle_timeout, stop=stop, raw=raw,
                             size=sink.size, commit_interval=commit_interval, report=report)
    finally:
        writer.stop()
