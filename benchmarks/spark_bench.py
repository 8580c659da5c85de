"""(f) `bridge.spark.dts_to_blob` on Spark local[2] against a mapInArrow identity pass.

The Kafka-shaped input (key, value, topic, partition 0..1, offset, timestamp) holds the workload's
Envelopes, written once to Parquet under benchmarks/work/ (partitions interleaved) and cached.
Spark's Kafka source reads each topic partition's offsets in order in one task; the cached
`ordered` frame is that layout (`kafka_order` of all six columns, computed once, untimed).
`dts_to_blob(ordered, ordered=True)` is the (f) pass, and the identity and output-floor passes
read the same frame. `dts_to_blob_shuffled` is the transform on the interleaved input, which it
puts in Kafka order itself (a shuffle and a sort). A `noop` write forces every output column.
Session start-up, the Python workers' first start and the JVM's compilation of each pass's code
are left out by two full warm-up passes of each. Between the Spark passes the single-process bridge
(case (b), lossless) runs on the same Entries, so the ratio compares like with like under the
same load.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

import bridge

from . import cases

KAFKA_TOPIC = "dts-bench"
PARTITIONS = 2
OUT_ROWS = 4096  # rows per output batch, as bridge.spark.jobs writes them
# identity, output floor and dts_to_blob on Kafka-ordered input; dts_to_blob on interleaved input
# (it shuffles); the single-process case (b) on the same Entries.
PASSES = ("identity", "output_floor", "dts_to_blob", "dts_to_blob_shuffled", "single_process")
COLUMNS = ("topic", "partition", "offset", "value")


def _kafka_parquet(envelopes: list, path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = len(envelopes)
    partition = [i % PARTITIONS for i in range(n)]
    offset = [i // PARTITIONS for i in range(n)]
    base = 1_700_000_000_000_000
    table = pa.table({
        "key": pa.array([b"shop.orders"] * n, pa.binary()),
        "value": pa.array([env.SerializeToString() for env in envelopes], pa.binary()),
        "topic": pa.array([KAFKA_TOPIC] * n, pa.string()),
        "partition": pa.array(partition, pa.int32()),
        "offset": pa.array(offset, pa.int64()),
        "timestamp": pa.array([base + i * 1000 for i in range(n)], pa.timestamp("us", tz="UTC")),
    })
    pq.write_table(table, path)


def _identity(ordered):
    def identity(batches):
        yield from batches
    return ordered.select(*COLUMNS).mapInArrow(identity, "`topic` STRING, `partition` INT, `offset` BIGINT, `value` BINARY")


def _output_floor(ordered, counts: dict, line: bytes):
    """The same ordered input, and per Envelope as many rows of `dts_to_blob`'s schema as it gives
    messages (`counts`, by partition and offset), each holding a Blob line of the average size, made
    without converting anything (slices of one prebuilt batch): what Spark spends taking the output
    alone, and so the most any converter can reach."""
    import pyarrow as pa

    import bridge.spark as bs

    def fake(batches):
        full = None  # one batch of OUT_ROWS rows, built once per task: the Python side does ~nothing
        for batch in batches:
            parts, offsets = batch.column("partition").to_pylist(), batch.column("offset").to_pylist()
            total = sum(counts.get((p, o), 0) for p, o in zip(parts, offsets))
            for start in range(0, total, OUT_ROWS):  # batches of the size dts_to_blob writes
                full = full or _floor_batch(OUT_ROWS)
                yield full.slice(0, min(OUT_ROWS, total - start))

    def _floor_batch(n: int):
        text = ["x"] * n
        return pa.RecordBatch.from_pydict({
            "topic": pa.array([KAFKA_TOPIC] * n), "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array([0] * n, pa.int64()), "entry": pa.array([0] * n, pa.int32()),
            "row": pa.array([0] * n, pa.int32()), "sequence_id": pa.array(["1000000000"] * n),
            "op": pa.array(["INSERT"] * n), "db": pa.array(text), "table": pa.array(text),
            "shard_key": pa.array(["[1]"] * n),
            "event_time": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
            "blob": pa.array([line] * n, pa.binary()).view(pa.string())})
    return ordered.select(*COLUMNS).mapInArrow(fake, bs.blob_schema())


def _message_counts(envelopes: list) -> tuple[dict, bytes]:
    """Blob messages per (partition, first offset) of the Kafka-shaped input, and a line of the
    average length."""
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    records = [(i % PARTITIONS, i // PARTITIONS, env.SerializeToString()) for i, env in enumerate(envelopes)]
    encoder = bridge.BlobEncoder()
    counts: dict = {}
    total = size = 0
    for where, entry, raw in dts_records_to_entries(sorted(records), ErrorPolicy("fail"), raw=True):
        lines = encoder.convert_lines(entry, raw)
        key = (where["partition"], where["offset"])
        counts[key] = counts.get(key, 0) + len(lines)
        total += len(lines)
        size += sum(len(x) for x in lines)
    return counts, b"x" * (size // max(total, 1))


def _process_cpu() -> dict | None:
    """CPU seconds so far of this process's descendants, by kind: the JVM ("jvm", all its threads)
    and the Python workers ("python", the daemon and its workers, with the children it has
    reaped). Linux /proc only; None elsewhere."""
    if not os.path.isdir("/proc/self/task"):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    parents, stats, kinds = {}, {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                command = fh.read().split(b"\0")[0].decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        pid = int(name)
        parents[pid] = int(fields[1])
        stats[pid] = sum(int(x) for x in fields[11:15]) / tick  # utime, stime, cutime, cstime
        base = os.path.basename(command)
        kinds[pid] = "jvm" if base == "java" else ("python" if base.startswith("python") else None)
    me, out = os.getpid(), {"jvm": 0.0, "python": 0.0}
    for pid, kind in kinds.items():
        up, seen = parents.get(pid), 0
        while up and up != me and seen < 64:  # a descendant of this process?
            up, seen = parents.get(up), seen + 1
        if up == me and kind is not None:
            out[kind] += stats[pid]
    return out


def _noop(df) -> None:
    df.write.format("noop").mode("overwrite").save()


def run(entries: list, rows: int, work_dir: str, repeat: int, log: Callable[[str], None]) -> dict:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"pyspark/pyarrow not installed ({exc.name}): pip install 'dts-datahub-bridge[spark]'"}
    import bridge.spark as bs

    envelopes = list(bridge.pack_entries(entries))
    path = os.path.join(work_dir, f"spark_input_{rows}.parquet")
    _kafka_parquet(envelopes, path)
    log(f"spark: {rows} rows in {len(envelopes)} Envelopes on {PARTITIONS} Kafka partitions; starting local[2]")
    spark = bs.local_session("bridge-bench")
    try:
        df = spark.read.parquet(path).cache()
        df.count()
        ordered = bs.kafka_order(df).cache()  # as the Kafka source reads it (all six columns: no
        ordered.count()                       # plan of the transform's own kafka_order matches it)
        counts, line = _message_counts(envelopes)
        # warm-up: the Python workers' start and the JVM's just-in-time compilation of the code
        # paths each pass takes (a first full pass runs 1.5-2x slower), two full passes each
        for _ in range(2):
            _noop(bs.dts_to_blob(ordered, ordered=True))
            _noop(bs.dts_to_blob(df))
            _noop(_identity(ordered))
            _noop(_output_floor(ordered, counts, line))

        def layout(frame) -> list:
            rows = frame.selectExpr("spark_partition_id() AS p").groupBy("p").count().collect()
            return sorted(r["count"] for r in rows)

        per_task = layout(ordered)
        per_task_shuffled = layout(bs.kafka_order(df.select(*COLUMNS)))
        chunk = cases.Chunk(rows, [e.SerializeToString() for e in entries], {}, {}, [], entries)
        single = cases.CASES["dts_to_blob"][1]
        times: dict[str, list] = {name: [] for name in PASSES}
        cpu: dict[str, list] = {name: [] for name in PASSES}
        for rep in range(repeat):
            for name in PASSES:
                before, cpu_start = _process_cpu(), time.process_time()
                start = time.perf_counter()
                if name == "identity":
                    _noop(_identity(ordered))
                elif name == "output_floor":
                    _noop(_output_floor(ordered, counts, line))
                elif name == "dts_to_blob":
                    _noop(bs.dts_to_blob(ordered, ordered=True))
                elif name == "dts_to_blob_shuffled":
                    _noop(bs.dts_to_blob(df))
                else:
                    single(chunk)
                times[name].append(time.perf_counter() - start)
                after = _process_cpu()
                if after is not None:
                    cpu[name].append({"jvm": round(after["jvm"] - before["jvm"], 3),
                                      "python": round(after["python"] - before["python"], 3),
                                      "driver": round(time.process_time() - cpu_start, 3)})
            log(f"spark round {rep + 1}: " + ", ".join(f"{n} {rows / t[-1]:,.0f} rows/s" for n, t in times.items()))
        default_parallelism = spark.sparkContext.defaultParallelism
    finally:
        spark.stop()
    best = {name: min(t) for name, t in times.items()}
    # the CPU of each pass's best round (the driver's own: only the single-process pass works there)
    cpu_best = {name: cpu[name][t.index(min(t))] for name, t in times.items() if cpu[name]}
    return {
        "cores": os.cpu_count(),
        "cpu_seconds": cpu_best,
        "rows": rows,
        "envelopes": len(envelopes),
        "envelopes_per_spark_task": per_task,
        "envelopes_per_spark_task_shuffled": per_task_shuffled,
        "default_parallelism": default_parallelism,
        "seconds": {name: round(t, 4) for name, t in best.items()},
        "rows_per_s": {name: round(rows / t) for name, t in best.items()},
        "samples": times,
    }
