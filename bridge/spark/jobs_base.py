"""What both directions of the per-partition Spark jobs share (bridge/spark/to_datahub.py: DTS ->
DataHub rows; bridge/spark/to_dts.py: DataHub rows -> DTS; bridge/spark/jobs.py names them all).

The Spark schemas of the rows (Kafka, positions, Blob, DTS), Spark's bad-record modes, the
accumulator tally, the job base class (one iterator over a Spark partition's Arrow or pandas
batches, so stream state lives across batches) and the adapters that turn batches into records and
a job's rows back into batches. pyspark and pyarrow are imported only inside the functions that run
on the workers.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from bridge.errors import BridgeError, OptionsError
from bridge.stream import (
    ErrorPolicy,
    Tally,
)
from bridge.values.types import arrow_type as _arrow_type  # Spark type -> Arrow type, the one map's
from bridge.wire import subscribe_pb2 as pb

# Spark's bad-record modes -> the stream layer's error policy.
MODES = {"FAILFAST": "fail", "PERMISSIVE": "keep", "DROPMALFORMED": "skip"}


KAFKA_COLUMNS = (("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
                 ("offset", "bigint"), ("timestamp", "timestamp"))


POSITION_COLUMNS = (("topic", "string"), ("partition", "int"), ("offset", "bigint"), ("entry", "int"),
                    ("row", "int"))


BLOB_COLUMNS = POSITION_COLUMNS + (
    ("sequence_id", "string"), ("op", "string"), ("db", "string"), ("table", "string"),
    ("shard_key", "string"), ("event_time", "timestamp"), ("blob", "string"))


DTS_COLUMNS = (("key", "binary"), ("value", "binary"))


ERROR_COLUMN = ("error", "string")


# Kafka key of each output Envelope (besides naming an input column).
KEYS = ("table", "single")


DEFAULT_DECIMAL = (38, 18)  # a DECIMAL field known only from a RecordSchema (Spark's widest)


_OUT_ROWS = 4096  # rows per output batch


def _ddl(columns) -> str:
    return ", ".join(f"`{name}` {kind.upper()}" for name, kind in columns)


KAFKA_SCHEMA = _ddl(KAFKA_COLUMNS)


BLOB_SCHEMA = _ddl(BLOB_COLUMNS)


DTS_SCHEMA = _ddl(DTS_COLUMNS)


def _policy_name(mode: str) -> str:
    name = MODES.get(str(mode).upper())
    if name is None:
        raise OptionsError(f"option 'mode' must be one of {', '.join(MODES)}", value=mode)
    return name


def _with_error(columns, mode: str) -> tuple:
    return tuple(columns) + ((ERROR_COLUMN,) if _policy_name(mode) == "keep" else ())


_TALLY_FIELDS = tuple(f.name for f in dataclasses.fields(Tally))  # every count, so none is lost on the way


class _TallyParam:
    """An AccumulatorParam (duck-typed, so defining it needs no pyspark) summing Tally tuples."""

    def zero(self, value):
        return (0,) * len(_TALLY_FIELDS)

    def addInPlace(self, a, b):
        return tuple(x + y for x, y in zip(a, b))


class SparkTally:
    """The stream layer's `Tally` summed over every task through a Spark accumulator.

    Read `.value` on the driver after an action. Like any accumulator updated in a transformation
    it counts again when the DataFrame is computed again (a second action, a retried task):
    cache the output or `reset()` between actions.
    """

    def __init__(self, spark) -> None:
        self._acc = spark.sparkContext.accumulator((0,) * len(_TALLY_FIELDS), _TallyParam())

    @property
    def value(self) -> Tally:
        return Tally(*self._acc.value)

    def reset(self) -> None:
        self._acc.value = (0,) * len(_TALLY_FIELDS)

    def add(self, tally: Tally) -> None:
        self._acc.add(tuple(getattr(tally, name) for name in _TALLY_FIELDS))


class _RowPolicy(ErrorPolicy):
    """The stream layer's ErrorPolicy; under PERMISSIVE it also hands each error over for its row."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.errors: list[BridgeError] = []

    def reject(self, err: BridgeError, raw: Any = None, count: int = 1) -> dict:
        record = super().reject(err, raw, count)
        if self.on_error == "keep":
            self.errors.append(err)
        return record


class _Job:
    """One Spark partition's conversion: input tuples (the columns `inputs` picks) -> output tuples."""

    utf8_bytes: frozenset = frozenset()  # STRING output columns whose values come as UTF-8 bytes

    def __init__(self, mode: str, columns) -> None:
        self.policy = _RowPolicy(_policy_name(mode), keep_records=False)
        self.keep = self.policy.on_error == "keep"
        self.columns = _with_error(columns, mode)

    def inputs(self, names: list[str]) -> list[str | None]:
        raise NotImplementedError

    def rows(self, records: Iterator[tuple]) -> Iterator[tuple]:
        raise NotImplementedError

    def batch(self, columns: list, schema):
        """An Arrow batch of `schema` from a list of values per output column."""
        import pyarrow as pa
        arrays = [_utf8_array(col) if f.name in self.utf8_bytes else pa.array(col, type=f.type)
                  for col, f in zip(columns, schema)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def chunks(self, records: Iterator[tuple]) -> Iterator[list]:
        """The output in columns (a list of values per output column), about _OUT_ROWS rows at a
        time, or as Arrow batches of the output schema."""
        out = self.rows(records)
        while chunk := list(itertools.islice(out, _OUT_ROWS)):
            yield list(zip(*chunk))


def _batch_function(make_job: Callable[[], _Job], arrow: bool, tally: SparkTally | None):
    """A mapInArrow (arrow=True) or mapInPandas function running one job per Spark partition.

    Timestamps reach the job as epoch microseconds; pandas nulls (NaN, NaT) as None.
    """
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        job = make_job()
        schema = pa.schema([(name, _arrow_type(kind)) for name, kind in job.columns])
        first = next(batches, None)
        if first is not None:
            wanted = job.inputs(list(first.schema.names if arrow else first.columns))
            column = _arrow_column if arrow else _pandas_column

            def records() -> Iterator[tuple]:
                for batch in itertools.chain([first], batches):
                    yield from zip(*[column(batch, n) if n else itertools.repeat(None) for n in wanted])

            for columns in job.chunks(records()):
                batch = columns if isinstance(columns, pa.RecordBatch) else job.batch(columns, schema)
                yield batch if arrow else batch.to_pandas(integer_object_nulls=True)
        if tally is not None:
            tally.add(job.policy.tally)
    return run


def _utf8_array(values):
    """A STRING Arrow array of UTF-8 bytes (or None): built as BINARY and viewed as STRING once
    every value is checked to be UTF-8, several times faster than decoding each to `str`."""
    import pyarrow as pa
    array = pa.array(values, type=pa.binary()).view(pa.string())
    array.validate(full=True)
    return array


def _arrow_column(batch, name: str) -> list:
    import pyarrow as pa
    col = batch.column(name)
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("us", tz=col.type.tz)).cast(pa.int64())
    return col.to_pylist()


def _pandas_column(frame, name: str) -> list:
    import pandas as pd
    series = frame[name]
    if pd.api.types.is_datetime64_any_dtype(series):  # naive ones are taken as UTC
        return [None if pd.isna(v) else v.value // 1000 for v in series]
    return [None if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and v != v) else v
            for v in series.tolist()]


def _pack_columns(columns) -> bytes | None:
    # protobuf messages do not survive cloudpickle; their encoding does
    return None if columns is None else pb.DMLEvent(columns=columns).SerializeToString()


def _unpack_columns(raw: bytes | None) -> list | None:
    return None if raw is None else list(pb.DMLEvent.FromString(raw).columns)
