"""The streaming side of `dts_to_blob` / `dts_to_tuple` / `dts_entries` with `state_location`: each
Kafka partition's open tail kept in files beside the query instead of in Spark's state store.

The stream is shuffled by Kafka (topic, partition), as Spark's own streaming floor is, and one
`mapInArrow` converts each Kafka partition's rows of the micro-batch with the same per-partition
job as a batch read, in offset order. What a partition leaves open at the end of a micro-batch
(the segments of an unfinished Entries, TDSQL's complete Entries waiting behind one, the last
offset and `ps`: `streaming.STATE_SCHEMA`, the same value the Spark-state path keeps) is written
to one small Arrow file per (query, Kafka partition, micro-batch):

    <state_location>/<query id>/<transform>/t<topic>/<partition>/<micro-batch id, 20 digits>.arrow

(<transform>: "blob", "entries" or "tuple-<db.table>", so that two transforms of one query, the
Tuple rows of two tables, keep apart; a null topic is "-")

and micro-batch B of a partition starts from the newest file of a micro-batch before B. The query
id (the checkpoint's, kept across restarts) and the micro-batch id come from the task's local
properties, which Spark's micro-batch execution sets for every task; a micro-batch re-run after a
crash has the same id and the same offsets, so it reads the same tail and writes the same one (a
file is written under a temporary name and moved into place; two attempts of one task write the
same state). Files of a partition older than `RETAIN` micro-batches behind the newest are removed,
except the newest of those (it is still the state of a partition that had no rows since).

Not supported: `asyncProgressTrackingEnabled` (Spark refuses it for stateful operators; here it
would replan micro-batches whose ids already have tails), and speculative tasks on HDFS, whose
overwrite is a delete and a rename (docs/spark.md, "Streaming").

Why: Spark's transformWithStateInPandas sorts every row of the micro-batch into groups, converts
them to pandas and back, and keeps a RocksDB store per shuffle partition; on the streaming bench
that cost as much as the conversion itself (docs/performance.md, "Spark streaming at Spark's own
pace"). Here every row crosses into Python once, as Arrow, and the state is one small file read
and one written per Kafka partition and micro-batch. The price: `state_location` is part of the
query's checkpoint, on a file system every executor reaches (a local path on one machine, a
shared mount, or a URI pyarrow.fs opens: s3://, hdfs://, gs://; OSS and COS through S3's API),
kept, moved and deleted with the checkpoint (docs/spark.md, "Streaming").
"""
from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote

from bridge.errors import OptionsError
from bridge.spark.jobs import SparkTally, _arrow_column, _FromDts
from bridge.spark.streaming import check_limits, convert_partition, load_state, streaming_job

QUERY_ID = "sql.streaming.queryId"  # Spark's StreamExecution.QUERY_ID_KEY: the checkpoint's query id
BATCH_ID = "streaming.sql.batchId"  # MicroBatchExecution.BATCH_ID_KEY
RETAIN = 100  # micro-batches of tails kept behind the newest (spark.sql.streaming.minBatchesToRetain's default)
FORMAT = b"bridge-tail/1"
_NAME = re.compile(r"^(\d{20})\.arrow$")
_TMP = re.compile(r"^\.(\d{20})\.[0-9a-f]{32}\.tmp$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # file:/x, s3://b/x, hdfs://nn/x: a URI, never a relative path


def _state_type():
    import pyarrow as pa
    return pa.schema([
        ("last_offset", pa.int64()), ("sharded", pa.bool_()),
        ("ps", pa.list_(pa.struct([("shard", pa.string()), ("ps", pa.int64())]))),
        ("open", pa.list_(pa.struct([("shard", pa.string()), ("total", pa.int64()), ("first_offset", pa.int64()),
                                     ("next_index", pa.int64()), ("opened_ms", pa.int64()),
                                     ("chunks", pa.list_(pa.large_binary()))]))),
        ("waiting", pa.list_(pa.struct([("first_offset", pa.int64()), ("last_offset", pa.int64()),
                                        ("segments", pa.int64()), ("data", pa.large_binary())]))),
    ], metadata={b"format": FORMAT})


_OPEN = ("shard", "total", "first_offset", "next_index", "opened_ms", "chunks")
_WAITING = ("first_offset", "last_offset", "segments", "data")


def encode_state(state: tuple) -> bytes:
    """`dump_state`'s value as an Arrow IPC file of one row."""
    import pyarrow as pa
    last, sharded, ps, open_, waiting = state
    row = {"last_offset": last, "sharded": sharded,
           "ps": [{"shard": shard, "ps": seq} for shard, seq in ps],
           "open": [dict(zip(_OPEN, item)) for item in open_],
           "waiting": [dict(zip(_WAITING, item)) for item in waiting]}
    schema = _state_type()
    table = pa.Table.from_pylist([row], schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_state(data: bytes, where: str) -> tuple:
    """The inverse of `encode_state`: the tuple `load_state` takes."""
    import pyarrow as pa
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise OptionsError(f"state_location: {where} is not a tail file ({exc})") from None
    if ((table.schema.metadata or {}).get(b"format") != FORMAT or table.num_rows != 1
            or not table.schema.equals(_state_type(), check_metadata=False)):
        raise OptionsError(f"state_location: {where} is not a tail file of this version ({FORMAT.decode()})")
    row = table.to_pylist()[0]
    return (row["last_offset"], row["sharded"],
            [(p["shard"], p["ps"]) for p in row["ps"]],
            [tuple(item[k] for k in _OPEN) for item in row["open"]],
            [tuple(item[k] for k in _WAITING) for item in row["waiting"]])


def location_uri(location: str) -> str:
    """`state_location` as the driver resolves it: a URI as it is, a path made absolute."""
    if not isinstance(location, str) or not location:
        raise OptionsError("option 'state_location' must be a path or a URI", value=location)
    return location if _SCHEME.match(location) else os.path.abspath(location)


def open_location(location: str):
    """(pyarrow FileSystem, root path) of `state_location`: a URI pyarrow.fs opens, or a path."""
    from pyarrow import fs as pafs
    uri = location_uri(location)
    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise OptionsError(f"option 'state_location' cannot be opened: {exc}", value=location) from None


class TailStore:
    """The tail files of one Kafka partition of one query."""

    def __init__(self, fs, root: str, query: str, label: str, topic, partition: int) -> None:
        self.fs = fs
        self.root = root.rstrip("/") or root
        self.folders = [self.root]  # root, query, transform, topic, partition: self.dir last
        for part in (quote(query, safe=""), quote(label, safe=""), "-" if topic is None else "t" + quote(topic, safe=""),
                     str(partition)):
            self.folders.append(f"{self.folders[-1].rstrip('/')}/{part}")
        self.dir = self.folders[-1]
        self.stale: list[str] = []  # temporary files of attempts that never moved theirs into place

    def _fault(self, path: str, what: str) -> OptionsError:
        whose = "" if path.startswith(self.dir) else f" (the tails of this Kafka partition go in {self.dir})"
        return OptionsError(f"state_location: {path} {what}{whose}")

    def _ids(self) -> list[int]:
        """The micro-batch ids of the tail files in the folder. Every entry named as a tail must be
        a file: a folder, or (on a local file system) a symbolic link to nothing, is an OptionsError,
        never skipped (the partition would restart without its open tail)."""
        from pyarrow import fs as pafs
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.dir, allow_not_found=True))
        except OSError as exc:
            self._check_folders(0)  # a file in the way is named as one
            raise self._fault(self.dir, f"cannot be listed ({exc})") from None
        self.stale = [info.path for info in infos if (m := _TMP.match(info.base_name))]
        ids = []
        for info in infos:
            if (m := _NAME.match(info.base_name)) is None:
                continue
            if info.type != pafs.FileType.File:
                kind = "a folder" if info.type == pafs.FileType.Directory else f"not a file ({info.type.name})"
                raise self._fault(info.path, f"is {kind}, where a tail file is expected")
            ids.append(int(m.group(1)))
        if getattr(self.fs, "type_name", "") == "local":
            self._dangling(infos)
        return sorted(ids)

    def _dangling(self, infos) -> None:
        """A local folder's tail names pyarrow does not list (symbolic links to nothing)."""
        listed = {info.base_name for info in infos}
        try:
            names = os.listdir(self.dir)
        except (FileNotFoundError, NotADirectoryError):  # no folder yet; a file above it: _check_folders
            return
        except OSError as exc:
            raise self._fault(self.dir, f"cannot be listed ({exc.strerror})") from None
        for name in sorted(names):
            if name in listed or not _NAME.match(name):
                continue
            path = f"{self.dir}/{name}"
            if os.path.islink(path):
                raise self._fault(path, f"is a symbolic link to {os.readlink(path)}, which does not exist")
            raise self._fault(path, "cannot be read")

    def _check_folders(self, batch: int) -> None:
        """An empty partition folder: the folders above it must be folders (a file among them is
        named here, not when the first tail cannot be written), and a local root, made by the
        driver before the query started, must be there after its first micro-batch (a local path
        that is not on every executor's machine, or removed while the query ran: the tails of
        partitions with committed micro-batches are out of reach, not an empty state)."""
        from pyarrow import fs as pafs
        try:
            infos = self.fs.get_file_info(self.folders)
        except OSError as exc:
            raise self._fault(self.dir, f"cannot be looked at ({exc})") from None
        for info in infos:
            if info.type == pafs.FileType.File:
                raise self._fault(info.path, "is a file, not a folder")
        if infos[0].type != pafs.FileType.NotFound:
            return
        above = self.root
        while "/" in above.strip("/"):  # the nearest folder above the root that is there must be one
            above = above.rstrip("/").rsplit("/", 1)[0] or "/"
            try:
                info = self.fs.get_file_info(above)
            except OSError:
                break
            if info.type == pafs.FileType.File:
                raise self._fault(info.path, "is a file, not a folder")
            if info.type != pafs.FileType.NotFound:
                break
        if batch > 0 and getattr(self.fs, "type_name", "") == "local":  # (an object store's folders may be implied)
            raise self._fault(self.root, f"is not there in micro-batch {batch} (the driver makes it when the "
                                         "query starts: is it on a file system every executor reaches, and "
                                         "was it removed while the query ran?)")

    def _path(self, batch: int) -> str:
        return f"{self.dir}/{batch:020d}.arrow"

    def load(self, batch: int) -> tuple[tuple | None, list[int]]:
        """(the state after the newest micro-batch before `batch`, or None; the ids present).
        A tail that cannot be read is an OptionsError naming it, never an empty state."""
        ids = self._ids()
        if not ids and not self.stale:
            self._check_folders(batch)
        before = [i for i in ids if i < batch]
        if not before:
            return None, ids
        path = self._path(before[-1])
        try:
            with self.fs.open_input_stream(path) as fh:
                data = fh.read()
        except OSError as exc:
            raise self._fault(path, f"cannot be read ({exc})") from None
        return decode_state(data, path), ids

    def save(self, batch: int, state: tuple, ids: list[int]) -> None:
        """The state after `batch`, moved into place whole; tails past RETAIN removed."""
        tmp = f"{self.dir}/.{batch:020d}.{uuid.uuid4().hex}.tmp"
        try:
            if not ids and not self.stale:  # the folder is there when `load` listed a file in it
                self.fs.create_dir(self.dir, recursive=True)
            with self.fs.open_output_stream(tmp) as out:
                out.write(encode_state(state))
            self.fs.move(tmp, self._path(batch))
        except OSError as exc:
            raise self._fault(self._path(batch), f"cannot be written ({exc})") from None
        old = [i for i in ids if i < batch - RETAIN]
        try:
            for i in old[:-1]:  # the newest of them is the state of anything re-run from RETAIN back
                self.fs.delete_file(self._path(i))
            for path in self.stale:  # a killed attempt's; no attempt of a micro-batch that far back runs now
                if int(_TMP.match(path.rsplit("/", 1)[-1]).group(1)) < batch - RETAIN:
                    self.fs.delete_file(path)
        except OSError as exc:
            raise self._fault(self.dir, f"old tails cannot be removed ({exc})") from None


def _partitions(table) -> Iterator[tuple]:
    """(topic or None, partition, its rows in offset order) of a micro-batch's rows in one task."""
    import pyarrow.compute as pc
    names = table.schema.names
    keys = [n for n in ("topic", "partition") if n in names]
    if table.num_rows == 0:
        return
    groups = table.select(keys).group_by(keys, use_threads=False).aggregate([]).to_pylist()
    groups.sort(key=lambda g: (g.get("topic") is not None, g.get("topic") or "", g["partition"] is not None,
                               g["partition"] or 0))
    for group in groups:
        part = table
        if len(groups) > 1:
            mask = None
            for k in keys:
                col = table.column(k)
                test = pc.is_null(col) if group[k] is None else pc.equal(col, group[k])
                mask = test if mask is None else pc.and_(mask, test)
            part = table.filter(mask)
        offsets = part.column("offset")
        if part.num_rows > 1 and not pc.all(pc.greater(offsets.slice(1), offsets.slice(0, part.num_rows - 1)),
                                            skip_nulls=False).as_py():
            part = part.sort_by([("offset", "ascending")])
        yield group.get("topic"), group["partition"], part


def _tail_function(make_job: Callable[[], _FromDts], limits: tuple, tally: SparkTally | None, location: str,
                   label: str):
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        from pyspark import TaskContext
        ctx = TaskContext.get()
        query = ctx.getLocalProperty(QUERY_ID) if ctx is not None else None
        batch_id = ctx.getLocalProperty(BATCH_ID) if ctx is not None else None
        if query is None or batch_id is None:
            raise OptionsError("state_location keeps a streaming query's tails per micro-batch: this task "
                               "runs outside a micro-batch (a continuous trigger?)")
        batch_id = int(batch_id)
        batches = list(batches)
        if not batches:
            return
        table = pa.Table.from_batches(batches)
        fs, root = open_location(location)
        job, schema = streaming_job(make_job, limits)
        now_ms = int(time.time() * 1000)
        for topic, partition, part in _partitions(table):
            if partition is None:
                raise OptionsError("a DTS DataFrame's `partition` must not be null", value=None)
            store = TailStore(fs, root, query, label, topic, partition)
            state, ids = store.load(batch_id)
            try:
                restored = load_state(state, partition, job.lazy)
            except Exception as exc:  # noqa: BLE001 (a damaged waiting Entries: protobuf's DecodeError, ...)
                raise OptionsError(f"state_location: the tail of {store.dir} before micro-batch {batch_id} "
                                   f"does not restore: {type(exc).__name__}: {exc}") from None
            yield from convert_partition(job, schema, topic, partition, restored,
                                         lambda n, part=part: _arrow_column(part, n), part.schema.names, now_ms,
                                         lambda after, store=store, ids=ids: store.save(batch_id, after, ids))
        if tally is not None:
            tally.add(job.policy.tally)
    return run


def tail_transform(df, make_job: Callable[[], _FromDts], output_ddl: str, tally: SparkTally | None,
                   max_open_offsets: int | None, max_open_seconds: float | None, location: str, label: str):
    """A streaming Kafka-shaped DataFrame through `make_job`'s conversion, open tails in `location`
    under `label` (the transform: "blob", "entries", "tuple-<db.table>")."""
    check_limits(max_open_offsets, max_open_seconds)
    fs, root = open_location(location)
    uri = location_uri(location)
    try:
        fs.create_dir(root, recursive=True)
    except OSError as exc:
        raise OptionsError(f"option 'state_location' cannot be written: {exc}", value=location) from None
    missing = [c for c in ("partition", "offset", "value") if c not in df.columns]
    if missing:  # before the query starts, not in its first task
        raise OptionsError(f"a DTS DataFrame needs the Kafka columns {', '.join(missing)}")
    keys = [c for c in ("topic", "partition") if c in df.columns]
    fn = _tail_function(make_job, (max_open_offsets, max_open_seconds), tally, uri, label)
    return df.repartition(*keys).mapInArrow(fn, output_ddl)
