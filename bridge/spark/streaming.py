"""The streaming side of `dts_to_blob` / `dts_to_tuple`: Envelope reassembly kept in Spark state.

A streaming DataFrame is grouped by Kafka (topic, partition) and run through
`transformWithStateInPandas`: per key and micro-batch, the open Entries (and TDSQL's complete
Entries waiting behind an open one, the last offset and `ps` seen) are restored from the key's
state into a `Reassembler`, the key's rows are fed to the same per-partition job as a batch read
(`_DtsToBlob`, `_DtsToTuple`) in offset order, and what is still open is written back. The state
is a plain Spark struct (`STATE_SCHEMA`), checkpointed with the query; an Entries open past
`max_open_offsets` / `max_open_seconds` becomes a dead letter under the job's mode. pyspark and
pandas are imported only on the workers and in `stream_transform`.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

from bridge.errors import FramingError, OptionsError
from bridge.native import split_items, valid_entries
from bridge.spark.jobs import SparkTally, _arrow_type, _FromDts, _pandas_column
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Assembled, LazyEntries, Reassembler, encode_varint

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"

DEFAULT_MAX_OPEN_OFFSETS = 10_000

# One Kafka partition's reassembly between micro-batches. `open`: the segments of each unfinished
# Entries (per TDSQL shard; shard null without the ShardId header) and when it opened; `waiting`:
# complete Entries held behind an earlier open one (TDSQL only), as their Entries bytes.
STATE_SCHEMA = (
    "last_offset BIGINT, sharded BOOLEAN, "
    "ps ARRAY<STRUCT<shard: STRING, ps: BIGINT>>, "
    "open ARRAY<STRUCT<shard: STRING, total: BIGINT, first_offset: BIGINT, next_index: BIGINT, "
    "opened_ms: BIGINT, chunks: ARRAY<BINARY>>>, "
    "waiting ARRAY<STRUCT<first_offset: BIGINT, last_offset: BIGINT, segments: BIGINT, data: BINARY>>"
)


def check_limits(max_open_offsets, max_open_seconds) -> None:
    if max_open_offsets is not None and (isinstance(max_open_offsets, bool) or not isinstance(max_open_offsets, int)
                                         or max_open_offsets < 1):
        raise OptionsError("option 'max_open_offsets' must be a positive integer or None", value=max_open_offsets)
    if max_open_seconds is not None and (isinstance(max_open_seconds, bool)
                                         or not isinstance(max_open_seconds, (int, float)) or max_open_seconds <= 0):
        raise OptionsError("option 'max_open_seconds' must be a positive number or None", value=max_open_seconds)


# ---- the state of one Kafka partition's Reassembler ------------------------------------------

def _entries_bytes(item: Assembled) -> bytes:
    if item.raws is not None:
        return b"".join(b"\x0a" + encode_varint(len(raw)) + raw for raw in item.raws)
    return item.entries.SerializeToString()


def _assembled(data: bytes, partition, first: int, last: int, segments: int, lazy: bool) -> Assembled:
    """A waiting Entries from its bytes, as the Reassembler built it the first time."""
    raws = split_items(data)
    if lazy and raws is not None and valid_entries(data):
        return Assembled(LazyEntries(raws), partition, first, last, segments, raws)
    entries = pb.Entries.FromString(data)
    if raws is not None and len(raws) != len(entries.items):
        raws = None
    return Assembled(entries, partition, first, last, segments, raws)


def load_state(state, partition, lazy: bool) -> tuple[Reassembler, dict]:
    """(Reassembler, {first offset of an open Entries: when it opened, ms}) from a key's state."""
    reassembler = Reassembler(lazy=lazy)
    opened: dict = {}
    if state is None:
        return reassembler, opened
    last, sharded, ps, open_, waiting = state
    reassembler.restore_partition(
        partition, last, sharded, ps or (),
        [(shard, total, first, next_index, [bytes(c) for c in chunks])
         for shard, total, first, next_index, _, chunks in open_ or ()],
        [_assembled(bytes(data), partition, first, last_offset, segments, lazy)
         for first, last_offset, segments, data in waiting or ()])
    for _, _, first, _, opened_ms, _ in open_ or ():
        opened[first] = opened_ms
    return reassembler, opened


def dump_state(reassembler: Reassembler, partition, opened: dict, now_ms: int) -> tuple:
    """The key's state (STATE_SCHEMA) after a micro-batch; `opened` gains the Entries opened in it."""
    last, sharded, ps, buffers, waiting = reassembler.partition_state(partition)
    open_ = []
    for shard, buf in buffers:
        opened.setdefault(buf.first_offset, now_ms)
        open_.append((shard, buf.total, buf.first_offset, buf.next_index, opened[buf.first_offset], list(buf.chunks)))
    waiting = [(a.first_offset, a.last_offset, a.segments, _entries_bytes(a)) for a in waiting]
    return (last, sharded, ps, open_, waiting)


# ---- bounded state -------------------------------------------------------------------------------

class OpenLimits:
    """`_FromDts.streaming`: at the end of a key's micro-batch, what is open stays open unless it
    is past a limit; then it is a dead letter under the job's mode (FAILFAST raises, naming topic,
    partition and offsets; PERMISSIVE gives an error row; DROPMALFORMED counts it rejected)."""

    def __init__(self, max_open_offsets: int | None, max_open_seconds: float | None) -> None:
        self.max_open_offsets = max_open_offsets
        self.max_open_seconds = max_open_seconds
        self.now_ms = 0
        self.opened: dict = {}

    def settle(self, topic, reassembler: Reassembler, policy) -> Iterator[Assembled]:
        tally = policy.tally
        partitions = set()
        for partition, shard, buf in reassembler.open_buffers():
            last = reassembler.last_offset(partition)
            last = buf.first_offset if last is None else last
            self.opened.setdefault(buf.first_offset, self.now_ms)
            reason = self._past_limit(buf, last)
            if reason is None:
                continue
            reassembler.drop_open(partition, shard)
            self.opened.pop(buf.first_offset, None)
            err = FramingError(f"dead letter: Entries {reason}, {buf.next_index} of {buf.total} segments held",
                               partition=partition, offset=buf.first_offset, shard=shard, last_offset=last)
            err.located(topic=topic)
            err.count = len(buf.chunks)
            tally.input += err.count
            policy.reject(err, None, err.count)
            partitions.add(partition)
        for partition in partitions:  # Entries waiting behind a dead letter go on
            yield from reassembler.release(partition)

    def _past_limit(self, buf, last: int) -> str | None:
        if self.max_open_offsets is not None and last - buf.first_offset >= self.max_open_offsets:
            return (f"unfinished {last - buf.first_offset} offsets after its first segment "
                    f"(max_open_offsets {self.max_open_offsets})")
        if self.max_open_seconds is not None:
            age = (self.now_ms - self.opened[buf.first_offset]) / 1000
            if age >= self.max_open_seconds:
                return f"unfinished {age:.3f} s after its first segment (max_open_seconds {self.max_open_seconds})"
        return None


# ---- one Kafka partition's micro-batch, whichever backend keeps its state ---------------------------

def streaming_job(make_job: Callable[[], _FromDts], limits: tuple):
    """(a job for a task's Kafka partitions, its output Arrow schema): the job lives for the task (the
    encoder caches, the C sink's tables); each partition sets its own Reassembler."""
    import pyarrow as pa
    job = make_job()
    job.streaming = OpenLimits(*limits)
    return job, pa.schema([(name, _arrow_type(kind)) for name, kind in job.columns])


def convert_partition(job: _FromDts, schema, topic, partition: int, restored: tuple, column: Callable,
                      names: list, now_ms: int, save: Callable[[tuple], None]) -> Iterator:
    """One Kafka partition's rows of a micro-batch (`column(name)`: a column's values in offset
    order) through `job`, from the state `load_state` restored (`restored`: its Reassembler and the
    times its Entries opened): Arrow batches of `schema`, then the state after it to `save`
    (`dump_state`'s value). The Spark-state processor and the tail files (tails.py) share it."""
    import pyarrow as pa
    reassembler, opened = restored
    job.reassemblers = {topic: reassembler}
    job.streaming.now_ms, job.streaming.opened = now_ms, opened
    wanted = job.inputs(names)
    records = zip(*[column(n) if n else itertools.repeat(topic) for n in wanted])
    for columns in job.chunks(records):
        yield columns if isinstance(columns, pa.RecordBatch) else job.batch(columns, schema)
    save(dump_state(reassembler, partition, opened, now_ms))


# ---- the stateful processor ------------------------------------------------------------------

def _processor(make_job: Callable[[], _FromDts], limits: tuple, tally: SparkTally | None):
    from pyspark.sql.streaming import StatefulProcessor

    class DtsReassembly(StatefulProcessor):
        """One Kafka partition per key; the job (`streaming_job`) lives for the task."""

        def init(self, handle) -> None:
            self.state = handle.getValueState("reassembly", STATE_SCHEMA)
            self.job = None

        def handleInputRows(self, key, rows, timerValues) -> Iterator:
            import pandas as pd
            frames = list(rows)
            frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            frame = frame.sort_values("offset", kind="stable")  # a key's rows come in no set order
            yield from self._run(key, frame, int(time.time() * 1000))

        def close(self) -> None:
            if self.job is not None and tally is not None:
                tally.add(self.job.policy.tally)

        def _run(self, key, frame, now_ms: int) -> Iterator:
            import pandas as pd
            if self.job is None:
                self.job, self.schema = streaming_job(make_job, limits)
            topic, partition = (key if len(key) == 2 else (None, key[0]))
            topic = None if topic is None else str(topic)
            partition = int(partition)
            # get() is None for a key without state: one state-server round trip, not two (exists, get)
            restored = load_state(self.state.get(), partition, self.job.lazy)
            for batch in convert_partition(self.job, self.schema, topic, partition, restored,
                                           lambda n: _pandas_column(frame, n), list(frame.columns), now_ms,
                                           self.state.update):
                # columns backed by the Arrow arrays: Spark takes them back without a Python object per
                # value (10x faster than object columns for the Blob lines)
                yield batch.to_pandas(types_mapper=pd.ArrowDtype)

    return DtsReassembly()


def stream_transform(df, make_job: Callable[[], _FromDts], output_ddl: str, tally: SparkTally | None,
                     max_open_offsets: int | None, max_open_seconds: float | None):
    """A streaming Kafka-shaped DataFrame through `make_job`'s conversion, reassembly kept in state."""
    check_limits(max_open_offsets, max_open_seconds)
    provider = df.sparkSession.conf.get(PROVIDER_CONF, None)
    if provider != ROCKSDB:
        raise OptionsError(f"a streaming dts_to_blob / dts_to_tuple keeps its state with transformWithStateInPandas, "
                           f"which needs {PROVIDER_CONF}={ROCKSDB} (set it before the query first starts; "
                           "bridge.spark.local_session does)", value=provider)
    keys = [c for c in ("topic", "partition") if c in df.columns]
    processor = _processor(make_job, (max_open_offsets, max_open_seconds), tally)
    # timeMode None: under ProcessingTime Spark runs a batch on every trigger whether or not data came
    # (and an availableNow query never ends), so the age limit is checked when a partition's records come
    return df.groupBy(*keys).transformWithStateInPandas(processor, output_ddl, "Append", "None")
