"""(f2) Streaming `bridge.spark.dts_to_blob` against Spark's streaming floor and the batch job, local[2].

The Kafka-shaped input (as (f): topic, partitions 0..1 interleaved, offset, value) is cut into
`FILES` Parquet files at offsets inside split Entries where there are any, so each file is one
micro-batch (`readStream` with `maxFilesPerTrigger=1`, `availableNow`) and Entries straddle
micro-batches. The streaming pass runs the whole query (a fresh checkpoint each round: planning,
the state store, one micro-batch per file) into the `noop` sink, and once more with all rows in one
file (one micro-batch). `streaming_running` is the pace of the micro-batches after the first
(input rows over their `triggerExecution` time, from the query's progress): a running query,
its start left out; `streaming_one_micro_batch_add_batch` the one micro-batch's own Spark job
(`addBatch`: reading, shuffling, converting, the state), without the query's start. `floor` is
Spark's own streaming floor on the same files and trigger (issue 33): the stream shuffled by Kafka
(topic, partition) and passed through an identity `mapInArrow` into `noop`; `streaming_tuple` is
`dts_to_tuple` of the workload's table; `*_running_vs_floor` compare the running paces (the best
rounds', and `running_vs_floor_per_round` each round's, whose passes ran side by side). `ceiling` is
what no exact streaming design can beat: the floor's shuffle with the batch job's per-partition
function (`dts_to_blob_batches`, DROPMALFORMED) in its `mapInArrow`, no state at all, so each
micro-batch's Entries cut by its ends are rejected instead of kept (a few fewer output rows, an upper
bound); `ceiling_tuple` the same with `dts_to_tuple_batches`. `tails` and `tails_tuple` are the streaming
transforms with `state_location` (the open tails in files beside the query, bridge/spark/tails.py),
`streaming` and `streaming_tuple` with Spark's state store (the default). The batch pass is
`dts_to_blob(spark.read.parquet(...))` of the same files (it shuffles into Kafka order, as the
streaming job groups by Kafka partition) into `noop`. Both are warmed up once; the best of
`repeat` alternating rounds counts.

    python -m benchmarks.spark_streaming_bench --rows 200000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable

import bridge

from . import spark_bench

FILES = 4
SEGMENT_BYTES = 64 << 10  # each 1 MiB Entries of (f) cut into segments of this size, as the DTS producer cuts large ones


def _write_files(envelopes: list, folder: str, files: int = FILES) -> int:
    """The Envelopes on two Kafka partitions (the first half of the stream and the second, cut
    between Entries) in `files` files, each holding a range of offsets of both; returns how many
    cuts between files fall inside a split Entries."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    mid = next(i for i in range(len(envelopes) // 2, len(envelopes)) if envelopes[i].index == 0)
    partitions = [envelopes[:mid], envelopes[mid:]]
    inside = 0
    for f in range(files):
        rows = []
        for p, envs in enumerate(partitions):
            first, last = len(envs) * f // files, len(envs) * (f + 1) // files
            inside += bool(f) and envs[first].index > 0
            rows += [(p, o, envs[o].SerializeToString()) for o in range(first, last)]
        table = pa.table({
            "key": pa.array([None] * len(rows), pa.binary()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
            "topic": pa.array([spark_bench.KAFKA_TOPIC] * len(rows), pa.string()),
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000 + r[1] for r in rows], pa.timestamp("us", tz="UTC")),
        })
        path = os.path.join(folder, f"part-{f:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return inside


# Spark's own streaming floor on the same files and trigger: the input shuffled by Kafka partition
# (as the stateful transform groups it) and handed through Python unchanged, into `noop`.
FLOOR_COLUMNS = "`topic` STRING, `partition` INT, `offset` BIGINT, `value` BINARY"


def _floor(stream):
    def identity(batches):
        yield from batches
    return (stream.select("topic", "partition", "offset", "value").repartition("topic", "partition")
            .mapInArrow(identity, FLOOR_COLUMNS))


def _ceiling(stream, fn=None, schema=None):
    import bridge.spark as bs
    if fn is None:
        fn, schema = bs.dts_to_blob_batches(mode="DROPMALFORMED", arrow=True), bs.blob_schema("DROPMALFORMED")
    return stream.select("topic", "partition", "offset", "value").repartition("topic", "partition").mapInArrow(fn, schema)


def _job_cpu(folder: str, table: str, schema, columns, repeat: int) -> dict:
    """Process CPU seconds (best of `repeat`, alternating) of the batch jobs' per-partition functions
    `dts_to_blob_batches` and `dts_to_tuple_batches` (DROPMALFORMED, Arrow) on the same rows, in this
    process without Spark: the one-file input split by Kafka partition, in offset order, in batches of
    256 rows as the Parquet reader is set to give them. CPU, not wall time: the machine's other work
    moves it less."""
    import glob

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import bridge.spark as bs
    table_in = pq.read_table(glob.glob(os.path.join(folder, "*.parquet"))[0]).select(
        ["topic", "partition", "offset", "value"])
    parts = [table_in.filter(pc.equal(table_in["partition"], p)).sort_by("offset").to_batches(max_chunksize=256)
             for p in (0, 1)]
    jobs = {"dts_to_blob_batches": lambda: bs.dts_to_blob_batches(mode="DROPMALFORMED", arrow=True),
            "dts_to_tuple_batches": lambda: bs.dts_to_tuple_batches(table, schema, mode="DROPMALFORMED",
                                                                    columns=columns, arrow=True)}
    cpu: dict[str, list] = {name: [] for name in jobs}
    out_rows = {}
    for _ in range(max(2, repeat)):
        for name, make in jobs.items():
            fn = make()
            start = time.process_time()
            out_rows[name] = sum(batch.num_rows for batches in parts for batch in fn(iter(batches)))
            cpu[name].append(time.process_time() - start)
    return {"seconds": {name: round(min(v), 3) for name, v in cpu.items()},
            "samples": {name: [round(x, 3) for x in v] for name, v in cpu.items()}, "rows": out_rows,
            "tuple_job_vs_blob_job": round(min(cpu["dts_to_tuple_batches"]) / min(cpu["dts_to_blob_batches"]), 2)}


def run(entries: list, rows: int, work_dir: str, repeat: int, log: Callable[[str], None]) -> dict:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"pyspark/pyarrow not installed ({exc.name}): pip install 'dts-datahub-bridge[spark]'"}
    import bridge.spark as bs
    from bridge.tuple import record_schema

    envelopes = [segment for env in bridge.pack_entries(entries)
                 for segment in bridge.split_entries(env.data, SEGMENT_BYTES)]
    folder = os.path.join(work_dir, f"spark_stream_{rows}")
    inside = _write_files(envelopes, folder)
    whole = os.path.join(work_dir, f"spark_stream_{rows}_one_file")
    _write_files(envelopes, whole, 1)
    split = sum(env.total > 1 for env in envelopes)
    first = next(e for e in entries if e.header.messageType == bridge.pb.DML)
    table = f"{first.header.schemaName}.{first.header.tableName}"
    columns = list(first.event.dmlEvent.columns)
    schema = record_schema(columns)
    job_cpu = _job_cpu(whole, table, schema, columns, repeat)
    log(f"spark streaming: the batch jobs in process, CPU s {job_cpu['seconds']}: Tuple / Blob "
        f"{job_cpu['tuple_job_vs_blob_job']}x")
    log(f"spark streaming: {rows} rows in {len(envelopes)} Envelopes ({split} segments of split Entries), "
        f"{FILES} files, {inside} cuts inside an Entries; starting local[2]")
    spark = bs.local_session("bridge-bench")
    # the one-file pass reads every 64 KiB Envelope in one Parquet batch: 4,096 rows (the default)
    # asked for 74 MB of contiguous heap and ran out of it on 2026-11-26 (a 1 GiB driver); 256 rows
    # a batch is what a job reading large binary values sets
    spark.conf.set("spark.sql.parquet.columnarReaderBatchSize", "256")
    checkpoints = os.path.join(work_dir, "spark_stream_checkpoints")
    counter = iter(range(1 << 30))
    add_batch: list = []  # seconds of the one-micro-batch pass's addBatch
    # per pass: (share of the input, seconds) of the micro-batches after the first, per run
    steady: dict[str, list] = {}

    def stream_pass(name: str, source: str, transform) -> int:
        checkpoint = os.path.join(checkpoints, str(next(counter)))
        stream = spark.readStream.schema(bs.KAFKA_SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
        query = (transform(stream).writeStream.format("noop").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        progress = query.recentProgress
        if len(progress) == 1:  # the micro-batch's own job (addBatch), the query's start and commits left out
            add_batch.append(progress[0]["durationMs"]["addBatch"] / 1000)
        if len(progress) > 1:  # the micro-batches after the first: the running query, its start left out
            later = progress[1:]
            steady.setdefault(name, []).append(
                (sum(p["numInputRows"] for p in later) / sum(p["numInputRows"] for p in progress),
                 sum(p["durationMs"]["triggerExecution"] for p in later) / 1000))
        shutil.rmtree(checkpoint, ignore_errors=True)
        return len(progress)

    def batch_pass() -> None:
        spark_bench._noop(bs.dts_to_blob(spark.read.parquet(folder)))

    passes = {"batch": batch_pass,
              "floor": lambda: stream_pass("floor", folder, _floor),
              "ceiling": lambda: stream_pass("ceiling", folder, _ceiling),
              "ceiling_tuple": lambda: stream_pass("ceiling_tuple", folder, lambda s: _ceiling(
                  s, bs.dts_to_tuple_batches(table, schema, mode="DROPMALFORMED", columns=columns, arrow=True),
                  bs.tuple_schema(schema, columns, "DROPMALFORMED"))),
              "streaming": lambda: stream_pass("streaming", folder, bs.dts_to_blob),
              "streaming_tuple": lambda: stream_pass("streaming_tuple", folder,
                                                     lambda s: bs.dts_to_tuple(s, table, schema, columns=columns)),
              # the open tails in state_location's files instead of the state store (bridge/spark/tails.py)
              "tails": lambda: stream_pass("tails", folder, lambda s: bs.dts_to_blob(
                  s, state_location=os.path.join(checkpoints, "tails"))),
              "tails_tuple": lambda: stream_pass("tails_tuple", folder, lambda s: bs.dts_to_tuple(
                  s, table, schema, columns=columns, state_location=os.path.join(checkpoints, "tails"))),
              "streaming_one_micro_batch": lambda: stream_pass("one", whole, bs.dts_to_blob)}
    try:
        shutil.rmtree(checkpoints, ignore_errors=True)
        for run_pass in passes.values():  # warm-up: workers, the state store, the JVM's compilation
            run_pass()
        steady.clear()
        add_batch.clear()
        times: dict[str, list] = {name: [] for name in passes}
        micro_batches = {}
        for rep in range(repeat):
            for name, run_pass in passes.items():
                start = time.perf_counter()
                micro_batches[name] = run_pass()
                times[name].append(time.perf_counter() - start)
            log(f"spark streaming round {rep + 1}: " +
                ", ".join(f"{n} {rows / t[-1]:,.0f} rows/s" for n, t in times.items()) + "; running: " +
                ", ".join(f"{n} {rows * s[-1][0] / s[-1][1]:,.0f} rows/s" for n, s in steady.items()))
    finally:
        spark.stop()
        shutil.rmtree(checkpoints, ignore_errors=True)
    best = {name: min(t) for name, t in times.items()}
    for name in ("floor", "ceiling", "ceiling_tuple", "streaming", "streaming_tuple", "tails", "tails_tuple"):
        share, seconds = min(steady[name], key=lambda x: x[1] / x[0])
        best[f"{name}_running"] = seconds / share  # the whole input at the running query's best pace
    best["streaming_one_micro_batch_add_batch"] = min(add_batch)
    return {
        "rows": rows, "envelopes": len(envelopes), "split_segments": split, "files": FILES,
        "micro_batches": {k: v for k, v in micro_batches.items() if v is not None}, "cuts_inside_entries": inside,
        "seconds": {name: round(t, 4) for name, t in best.items()},
        "rows_per_s": {name: round(rows / t) for name, t in best.items()},
        "streaming_vs_batch": round(best["batch"] / best["streaming"], 3),
        "streaming_one_micro_batch_vs_batch": round(best["batch"] / best["streaming_one_micro_batch"], 3),
        "streaming_running_vs_batch": round(best["batch"] / best["streaming_running"], 3),
        "streaming_running_vs_floor": round(best["floor_running"] / best["streaming_running"], 3),
        "streaming_tuple_running_vs_floor": round(best["floor_running"] / best["streaming_tuple_running"], 3),
        # the same transforms with state_location (the issue-33 targets: docs/performance.md)
        "tails_running_vs_floor": round(best["floor_running"] / best["tails_running"], 3),
        "tails_tuple_running_vs_floor": round(best["floor_running"] / best["tails_tuple_running"], 3),
        "ceiling_running_vs_floor": round(best["floor_running"] / best["ceiling_running"], 3),
        "ceiling_tuple_running_vs_floor": round(best["floor_running"] / best["ceiling_tuple_running"], 3),
        # per round, each pass's running pace over the floor's of the same round
        "running_vs_floor_per_round": {
            name: [round(floor_s / floor_share * share / seconds, 3)
                   for (floor_share, floor_s), (share, seconds) in zip(steady["floor"], steady[name])]
            for name in ("ceiling", "ceiling_tuple", "streaming", "streaming_tuple", "tails", "tails_tuple")},
        "streaming_vs_floor": round(best["floor"] / best["streaming"], 3),
        # the per-partition functions alone, in process CPU (`_job_cpu`): how far the Tuple job is
        # from the Blob one before Spark's share
        "job_cpu": job_cpu,
        "add_batch_vs_batch": round(best["batch"] / best["streaming_one_micro_batch_add_batch"], 3),
        # each round's running paces side by side (rows/s), so the ratio's spread shows
        "running_samples": {name: [round(rows * share / seconds) for share, seconds in s]
                            for name, s in steady.items()},
        "samples": times,
    }


def main(argv: list[str] | None = None) -> int:
    from . import workload
    from .timing import log as _log
    work_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work")  # as run.WORK_DIR
    p = argparse.ArgumentParser(prog="python -m benchmarks.spark_streaming_bench", description=__doc__.split("\n")[0],
                                epilog="Example: python -m benchmarks.spark_streaming_bench --rows 200000 --repeat 3")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    os.makedirs(work_dir, exist_ok=True)
    work = workload.build(args.rows, seed=args.seed)
    result = run(work.entries, work.rows, work_dir, args.repeat, _log)
    result["load_after"] = os.getloadavg()
    path = os.path.join(work_dir, "spark_streaming.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
