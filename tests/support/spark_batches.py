"""Kafka-shaped Arrow batches and a tally recorder for the tests of the Spark per-partition jobs'
C sinks (tests/test_spark_sink.py for Blob, tests/test_spark_tuple_sink.py for Tuple). pyarrow is
imported when called, so importing this needs only what collecting a test needs."""
from __future__ import annotations

import dataclasses


def kafka_schema():
    """The Kafka columns the DTS jobs read, as Arrow."""
    import pyarrow as pa
    return pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())])


class TallyRecorder:
    """A stand-in for SparkTally's `add` in one process: each task's Tally as a dict, in order."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def add(self, tally) -> None:
        self.seen.append(dataclasses.asdict(tally))


def kafka_batches(values: list[bytes], per_batch: int, partition: int = 0, topic: str | None = "dts") -> list:
    """`values` at offsets 0.. of one Kafka partition, `per_batch` rows an Arrow batch."""
    import pyarrow as pa
    schema = kafka_schema()
    out = []
    for start in range(0, len(values), per_batch):
        part = values[start:start + per_batch]
        out.append(pa.RecordBatch.from_pydict({
            "topic": [topic] * len(part), "partition": [partition] * len(part),
            "offset": list(range(start, start + len(part))), "value": part}, schema=schema))
    return out
