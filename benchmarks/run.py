"""`python -m benchmarks`: build the workload, time every case, write the results."""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import os
import platform
import sys
import time

from . import cases, profiling, report, reverse_bench, rss, shapes, spark_bench, spark_streaming_bench, timing, workload

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORK_DIR = os.path.join(HERE, "work")
RESULTS = os.path.join(HERE, "results.json")
DOCS = os.path.join(ROOT, "docs", "performance.md")
CHART = os.path.join(ROOT, "docs", "performance.png")
DEFAULT_ROWS = 200_000

METHOD = """
- **One workload** (`benchmarks/workload.py`): DML on one MySQL table of 12 columns (bigint key,
  varchar utf8mb4, decimal(12,2), int, datetime, double, tinyint(1), text, bigint unsigned, date,
  timestamp, json), values as the DTS producer writes them (about 10% NULL notes, a fifth of the
  unsigned values drawn from the whole 64-bit range, multi-byte UTF-8 text). A quarter of the row changes are updates
  with full before and after images, the rest inserts; an Entry holds 1 to 5 row changes of one
  kind (about half hold one), and the Entries are packed into Envelopes by `bridge.pack_entries`.
  Fixed seed: the same bytes on every run. A row is one DML row change: an update is one row and
  two Blob messages.
- **Same process, interleaved, best of N**: the workload is cut into chunks (at Entry boundaries);
  every case runs on every chunk N times in rotating order, after its inputs were built untimed.
  A case's time is the sum over chunks of its fastest repetition (the median is reported too), so
  a burst of load from another process spoils one repetition of one chunk, not a whole case.
  Ratios are rows/s over rows/s.
- **(a) naive DTS -> JSON**: per Entry `Entry.FromString`, `json_format.MessageToDict`,
  `json.dumps(...).encode()`. **(b) the bridge**: per Entry `Entry.FromString` and
  `BlobEncoder.convert_lines(entry, entry_bytes)` (one encoder per chunk, as the CLI keeps one per
  stream), which is what the CLI and `consume` run: plain DML Entries are written to JSON lines by
  the C extension, everything else through the message dicts and `orjson.dumps`; lossless
  (default options) and strict. Two more (b) cases for comparison: the dict API
  (`convert(entry, entry_bytes)`, row images read in C, then `encode_blob` of each message) and
  the pure-Python path (`convert(entry)` and `encode_blob`, the reference the C path is tested
  against); and the two faces a library user calls: the pure functions (`entry_to_blob(entry)`,
  which serialises a DML Entry once for the C path, and `encode_blob`) and the batch form
  (`entries_to_blob_lines` of the chunk's Entry encodings, one shared encoder).
- **(c) floors**: `Entry.FromString` alone over the same bytes; `orjson.dumps` of the Blob dicts
  the bridge built beforehand (lossless dicts for the lossless floor, strict dicts for the strict
  one); the combined floor's time is the sum of the two. The Python read floor parses and reads
  `dataType`, `sv` and `bv` of every `Data` in a Python loop, converting nothing: no pure-Python
  converter over protobuf's message objects can be faster, so it bounds what the pure-Python
  path can reach.
- **(d) Blob -> DTS**: per JSON line `BlobDecoder.feed_line` (`decode_blob` and `feed`, as
  `bridge.stream` and Spark call it: a line repeating the last schema's bytes has only the rest
  parsed) and `SerializeToString` of each Entry it completes, over the lines (b) writes (lossless lines with
  default options; strict lines with strict options). Naive: per line of protobuf's canonical JSON
  of the same Entries, `json.loads`, `json_format.ParseDict` into `pb.Entry`, `SerializeToString`.
  Floor: `orjson.loads` of the lossless lines plus serialising the equivalent Entries. Python
  build floor: `orjson.loads`, one `Data` per value through the repeated field's `add()` with no
  type conversion, serialise: the bound for a pure-Python (d).
- **(e) DTS -> Tuple**: per Entry `Entry.FromString` and `TupleEncoder.convert(entry, raw)` (row
  dicts of typed values; no file writing). Tuple -> DTS: the Tuple rows `convert` writes for the
  chunk, per table, made once per chunk; timed: `TupleDecoder.feed` of each row (schema, table and
  DTS columns as `convert` gives them) and `SerializeToString` of each Entry it completes. In the
  value-shape matrix both are also put beside Blob (DTS -> Tuple / `convert_lines`, Tuple -> DTS /
  Blob -> DTS): the "Tuple as fast as Blob" targets.
- **(f) Spark**: `bridge.spark.local_session()` (local[2]); the Envelopes as a Kafka-shaped
  DataFrame (key, value, topic, partition 0..1 interleaved, offset, timestamp) read from Parquet
  and cached, and the same rows in the layout Spark's Kafka source reads them (each Kafka
  partition in one task, offsets in order: `kafka_order` of the six columns), cached too. After a
  pair of full warm-up passes of each (session start-up and JIT excluded), on the Kafka-ordered frame:
  `dts_to_blob(df, ordered=True)` (the (f) figure), a `mapInArrow` identity pass, and an output
  floor (a `mapInArrow` pass that emits, per Envelope, as many rows of `dts_to_blob`'s schema as
  it gives messages, each with a Blob line of the average size, converting nothing: slices of one
  4096-row batch built once per task, so it is what Spark spends taking the output and the most
  any converter can reach); on the interleaved frame, `dts_to_blob(df)`, which shuffles it into
  Kafka order itself (`dts_to_blob_shuffled`). Each is forced by a `noop` write and alternates
  with the single-process (b) on the same Entries; best of N rounds. Each pass's CPU seconds are
  read from `/proc` for the JVM (all its threads) and the Python workers (the daemon, its workers
  and the workers it reaped), and from `time.process_time` for the driver, where the
  single-process pass runs.
- **(g) CLI**: `.pb` streams repeating the workload's Envelopes up to 100 MiB and 1 GiB (kept in
  `benchmarks/work/`, git-ignored); `dts-bridge convert X.pb -o - --to blob` with standard output
  to `/dev/null`, in its own process, peak RSS from `/usr/bin/time -v` (or `getrusage` of a fresh
  wrapper process); rows/s is rows over the wall time, process start-up included.
- **(h) value shapes** (`benchmarks/shapes.py`; docs/performance.md, "Value shapes (h)"): one workload per shape of value DTS
  really sends, `--shape-rows` rows each: the canonical table; its temporals as STRING with a
  charset (utf8mb4 or binary, per Entry); its datetime as DATETIME(6) with microseconds; its text
  in gbk; its Entries with header properties; and the realistic mix
  (`bridge.samples.values.realistic_entries`: REAL_ORDERS in Entries of 1 and 3 rows and the gbk
  table REAL_SUPPLIERS, 4 : 4 : 1, as DTS writes the bytes, NIL spelt out included). Per shape, in
  chunks of at most 5,000 rows, interleaved and best of N as above: the naive DTS -> JSON and JSON ->
  DTS baselines, `entry_to_blob` + `encode_blob`, `entries_to_blob_lines`, `convert_lines`, DTS ->
  Tuple and Blob -> DTS (lossless lines), each as a ratio to its naive baseline on the same bytes.
- **(i) DataHub -> Kafka** (`benchmarks/reverse_bench.py`, alone: `python -m benchmarks.reverse_bench`):
  `--reverse-rows` of the workload as the Blob lines `sync --to blob` writes, landed by the forward
  `DataHubWriter` in a 3-shard Blob topic of the stand-in DataHub (its own process, loopback; routed by
  primary key with the `dts.pos` attributes, so an Entry's rows and an update's halves spread over the
  shards); the real Kafka broker of the tests (transactions on), a fresh 3-partition topic per pass.
  Timed, rotating order, best of `--repeat`: `sync_to_dts` (the library function in this process, from
  the call until every Entry is written and the last transaction committed), `sync_cli`
  (`dts-bridge sync --to dts --from-beginning --idle-timeout 1`, wall time less the idle timeout),
  `convert_cli` (`dts-bridge convert LINES.blob.jsonl -o OUT.pb`, wall time; the baseline),
  `convert_library` (`blob_lines_to_entries` + `SerializeToString`, in this process) and
  `datahub_read_floor` (`DataHubSource` alone), each with its CPU seconds. The target is taken at
  `--reverse-rows` (100,000 rows: steady state); `--reverse-small-rows` (20,000), where the run's fixed
  costs weigh more, is measured too and kept beside it ("small" in results.json).
- **Hot spots**: `cProfile` over (b) and (d), lossless, on the first rows of the workload (the C
  extension's functions count as one call each); own time
  (tottime) per function as a share of the profiled total (cProfile's overhead inflates the
  share of small Python functions called per value).
"""


_log = timing.log


def _chunks(entries: list, chunk_rows: int) -> list[list]:
    out, current, rows = [], [], 0
    for entry in entries:
        current.append(entry)
        rows += len(entry.event.dmlEvent.rows)
        if rows >= chunk_rows:
            out.append(current)
            current, rows = [], 0
    if current:
        out.append(current)
    return out


def _rows(entries: list) -> int:
    return sum(len(e.event.dmlEvent.rows) for e in entries)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _environment() -> dict:
    from google.protobuf.internal import api_implementation
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "protobuf": _version("protobuf"), "protobuf_backend": api_implementation.Type(),
            "orjson": _version("orjson"), "pyspark": _version("pyspark"),
            "bridge": _version("dts-datahub-bridge")}


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                epilog="Example: python -m benchmarks --rows 2000 --skip-rss --skip-spark")
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"DML rows in the workload (default {DEFAULT_ROWS})")
    p.add_argument("--chunk-rows", type=int, default=20_000, help="rows per interleaved chunk (default 20000)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions per case and chunk; the best counts (default 3)")
    p.add_argument("--seed", type=int, default=20240517)
    p.add_argument("--profile-rows", type=int, default=20_000, help="rows under cProfile (0: no profile)")
    p.add_argument("--skip-spark", action="store_true", help="leave out (f), the Spark transform")
    p.add_argument("--spark-rows", type=int, default=None, help="rows for Spark (default: --rows)")
    p.add_argument("--spark-repeat", type=int, default=8, help="Spark rounds; the best counts (default 8)")
    p.add_argument("--skip-spark-streaming", action="store_true",
                   help="leave out (f2), streaming dts_to_blob against the batch job")
    p.add_argument("--skip-rss", action="store_true", help="leave out (g), the CLI's memory on large streams")
    p.add_argument("--skip-reverse", action="store_true",
                   help="leave out (i), sync --to dts (stand-in DataHub -> Kafka broker) against convert")
    p.add_argument("--reverse-rows", type=int, default=reverse_bench.DEFAULT_ROWS,
                   help=f"DML rows for (i), its target (default {reverse_bench.DEFAULT_ROWS})")
    p.add_argument("--reverse-small-rows", type=int, default=reverse_bench.SMALL_ROWS,
                   help=f"DML rows for (i) at a small size as well, kept as its 'small' (default "
                        f"{reverse_bench.SMALL_ROWS}; 0 leaves it out)")
    p.add_argument("--shapes", default=",".join(shapes.SHAPES),
                   help="value shapes of (h), the matrix, comma-separated (default: all; '' leaves (h) out): "
                        + ", ".join(shapes.SHAPES))
    p.add_argument("--shape-rows", type=int, default=20_000, help="DML rows per value shape in (h) (default 20000)")
    p.add_argument("--only-shapes", action="store_true",
                   help="run (h) alone: the other sections are left out (for iterating on one shape)")
    p.add_argument("--rss-sizes", default="100,1000", help="stream sizes in MiB for (g) (default 100,1000)")
    p.add_argument("--publish", action="store_true",
                   help="write benchmarks/results.json and docs/performance.md even for a partial run "
                        "(a full run, the default flags, always does; other runs write into benchmarks/work/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shape_names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shape_names if s not in shapes.SHAPES]
    if unknown:
        build_parser().error(f"--shapes: unknown shape {', '.join(unknown)} (known: {', '.join(shapes.SHAPES)})")
    if args.only_shapes:
        args.skip_spark = args.skip_rss = True
        args.profile_rows = 0
        args.rows = min(args.rows, 2_000)
    sizes = sorted({int(s) for s in args.rss_sizes.split(",") if s.strip()})
    full = (args.rows >= DEFAULT_ROWS and not args.skip_spark and not args.skip_rss
            and shape_names == list(shapes.SHAPES))
    publish = full or args.publish
    os.makedirs(WORK_DIR, exist_ok=True)
    results_path, docs_path, chart_path = ((RESULTS, DOCS, CHART) if publish else
                                           tuple(os.path.join(WORK_DIR, os.path.basename(p))
                                                 for p in (RESULTS, DOCS, CHART)))
    load_before = _load()
    started = time.perf_counter()

    _log(f"building the workload: {args.rows:,} rows")
    work = workload.build(args.rows, seed=args.seed)
    _log(f"workload: {work.rows:,} rows ({work.updates:,} updates) in {len(work.entries):,} Entries, "
         f"{len(work.envelopes):,} Envelopes")

    profile = {}
    if args.profile_rows:
        sample = next(iter(_chunks(work.entries, args.profile_rows)))
        chunk = cases.prepare(sample, _rows(sample))
        for name in ("dts_to_blob", "blob_to_dts"):
            prof = profiling.hot_spots(lambda: cases.CASES[name][1](chunk))
            profile[name] = {"rows": chunk.rows, **prof}
        del chunk
        _log("profiled (b) and (d)")

    stats = {"blob_messages": 0, "blob_bytes": 0, "entry_bytes": 0}

    def prepared():
        for part in _chunks(work.entries, args.chunk_rows):
            chunk = cases.prepare(part, _rows(part))
            stats["blob_messages"] += len(chunk.blob_lines["lossless"])
            stats["blob_bytes"] += sum(map(len, chunk.blob_lines["lossless"]))
            stats["entry_bytes"] += sum(map(len, chunk.entry_bytes))
            gc.collect()
            gc.freeze()  # the inputs stay out of the collector's way while they are timed
            yield chunk
            del chunk
            gc.unfreeze()

    functions = {name: fn for name, (_, fn) in cases.CASES.items()}
    timings = timing.interleaved(functions, prepared(), args.repeat, _log)

    results: dict = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks" + ("" if argv is None and len(sys.argv) < 2 else
                                             " " + " ".join(argv if argv is not None else sys.argv[1:])),
        "environment": _environment(),
        "parameters": {"rows": args.rows, "chunk_rows": args.chunk_rows, "repeat": args.repeat, "seed": args.seed},
        "workload": {"rows": work.rows, "updates": work.updates, "entries": len(work.entries),
                     "envelopes": len(work.envelopes), "columns": len(workload.COLUMNS),
                     "entry_bytes_per_row": stats["entry_bytes"] / work.rows,
                     "blob_messages": stats["blob_messages"],
                     "blob_bytes_per_message": stats["blob_bytes"] / max(stats["blob_messages"], 1)},
        "cases": {}, "floors": {},
    }
    for name, t in timings.items():
        results["cases"][name] = {
            "description": cases.CASES[name][0], "rows": t.rows, "items": t.items,
            "seconds_best": round(t.best, 4), "seconds_median": round(t.median, 4),
            "rows_per_s": round(t.rate("best")), "rows_per_s_median": round(t.rate("median")),
            "items_per_s": round(t.items / t.best) if t.best else None,
        }
    for name, first, second in (("combined_floor", "parse_floor", "dumps_floor"),
                                ("combined_floor_strict", "parse_floor", "dumps_floor_strict"),
                                ("combined_python_floor", "python_read_floor", "dumps_floor")):
        parse, dump = timings[first], timings[second]
        best, median = parse.best + dump.best, parse.median + dump.median
        results["floors"][name] = {
            "description": f"(c) combined floor: {first} + {second} (times added)", "rows": parse.rows,
            "seconds_best": round(best, 4), "seconds_median": round(median, 4),
            "rows_per_s": round(parse.rows / best), "rows_per_s_median": round(parse.rows / median)}

    if shape_names:
        results["shapes"] = shapes.run(args.shape_rows, args.seed, min(args.chunk_rows, 5_000), args.repeat,
                                       shape_names, _log)
        results["parameters"].update(shape_rows=args.shape_rows, shapes=",".join(shape_names))
    else:
        results["shapes"] = {}

    if args.skip_spark:
        results["spark"] = {"skipped": "--skip-spark"}
    else:
        spark_rows = args.spark_rows or args.rows
        part = next(iter(_chunks(work.entries, spark_rows)))
        try:
            results["spark"] = spark_bench.run(part, _rows(part), WORK_DIR, args.spark_repeat, _log)
        except Exception as exc:  # a broken Java install must not cost the rest of the run
            _log(f"spark failed: {type(exc).__name__}: {exc}")
            results["spark"] = {"skipped": f"failed: {type(exc).__name__}: {str(exc)[:500]}"}
    if args.skip_spark or args.skip_spark_streaming:
        results["spark_streaming"] = {"skipped": "--skip-spark" if args.skip_spark else "--skip-spark-streaming"}
    else:
        part = next(iter(_chunks(work.entries, args.spark_rows or args.rows)))
        try:
            results["spark_streaming"] = spark_streaming_bench.run(part, _rows(part), WORK_DIR, 3, _log)
        except Exception as exc:
            _log(f"spark streaming failed: {type(exc).__name__}: {exc}")
            results["spark_streaming"] = {"skipped": f"failed: {type(exc).__name__}: {str(exc)[:500]}"}

    if args.skip_reverse:
        results["reverse"] = {"skipped": "--skip-reverse"}
    else:
        try:
            results["reverse"] = reverse_bench.measure(args.reverse_rows, args.repeat, args.seed, log=_log)
            if args.reverse_small_rows:  # where the fixed costs weigh more: beside the target, not instead
                results["reverse"]["small"] = reverse_bench.measure(args.reverse_small_rows, args.repeat, args.seed,
                                                                    log=_log)
        except Exception as exc:  # no Java or no Kafka jars must not cost the rest of the run
            _log(f"reverse failed: {type(exc).__name__}: {exc}")
            results["reverse"] = {"skipped": f"failed: {type(exc).__name__}: {str(exc)[:500]}"}

    if args.skip_rss:
        results["cli"] = {"skipped": "--skip-rss"}
    else:
        results["cli"] = {"streams": rss.run(work.envelope_bytes, work.rows, sizes, WORK_DIR, _log)}

    results["profile"] = profile
    results["environment"].update(load_before=load_before, load_after=_load(),
                                  seconds=round(time.perf_counter() - started, 1))
    results["ratios"] = report.compute_ratios(results)
    print(report.text_table(results))
    report.write_json(results, results_path)
    why_not = report.chart(results, chart_path)
    if why_not:
        _log(why_not)
    report.write_markdown(results, docs_path, None if why_not else os.path.basename(chart_path), METHOD)
    _log(f"wrote {os.path.relpath(results_path, ROOT)}, {os.path.relpath(docs_path, ROOT)}"
         + ("" if why_not else f", {os.path.relpath(chart_path, ROOT)}")
         + ("" if publish else " (a partial run: pass --publish to write the committed files)"))
    return 0
