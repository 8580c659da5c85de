"""(i) The reverse pipeline's throughput (issue 32): `sync --to dts` (DataHub -> Kafka DTS Envelopes,
exactly once) against `dts-bridge convert` of the same records (Blob lines -> .pb), rows/s and the ratio.

Setup (untimed): the workload of benchmarks/workload.py (`--rows` DML rows, the fixed seed) is turned
into Blob lines by `BlobEncoder.convert_columns`, as the forward `sync --to blob` does, and written
by the forward `DataHubWriter` into a 3-shard Blob topic of the stand-in DataHub
(tests/support/datahub_standin.py, run as its own process on loopback, so that it does not share the
measured process's interpreter), routed by primary key with the `dts.topic`/`dts.pos` attributes,
exactly as `sync --to blob` lands them: the rows of one Entry and an UPDATE's halves spread over the
shards. The same lines, in source order, go to one `.blob.jsonl` file. The Kafka end is the real
Apache Kafka broker of the tests (tests/support/kafka_broker.py, transactions on), a fresh 3-partition
topic per pass.

Timed, interleaved, best of `--repeat` (the median is kept too):
- `sync_to_dts`: `bridge.pipeline.to_dts.sync_to_dts` in this process, from the call (ListShard, the
  transactional producer's init_transactions, reading the offsets topic) until every Entry was written
  and the last transaction committed (the run's `stop()` turns true when the sink has written them all;
  the loop then flushes and commits), default commit interval (5 s);
- `sync_cli`: `dts-bridge sync --to dts ... --from-beginning --idle-timeout 1` as a process, wall time
  less the idle timeout (process start included, like `convert_cli`'s);
- `convert_cli`, the baseline: `dts-bridge convert LINES.blob.jsonl -o OUT.pb` as a process (wall time,
  process start included);
- `convert_library`: `bridge.stream.blob_lines_to_entries` of the same lines and `SerializeToString`
  of each Entry, in this process (what `convert` runs, without its process start and file writes);
- `datahub_read_floor`: `DataHubSource` alone polled until it has read every record (GetRecords pages
  through pydatahub from the stand-in), nothing assembled or written: the most any pipeline reading
  DataHub through pydatahub and this stand-in could reach.
A row is one DML row change (an update is one row and two Blob lines). Ratios: rows/s over rows/s.
The passes' output is checked: each pass rebuilds the same number of Entries. Each pass also keeps its
CPU seconds (`cpu`: this process's, all threads, for the in-process passes; the child's user + system
time for the processes), which a machine shared with other work disturbs less than wall time, and
`sync_to_dts` its fixed costs: `first_record_s`, from the call until the first record reached the
loop, and `tail_s`, from the last record read until the call returned.

Sizes: the target is taken at `DEFAULT_ROWS` (100,000 rows: steady state, where the run's fixed
costs, about a third of a second, weigh little); `make bench` also runs `SMALL_ROWS` (20,000),
where they weigh more, and keeps it beside it ("small").

    python -m benchmarks.reverse_bench [--rows 100000] [--repeat 3] [--json] [--profile]

`make bench` (benchmarks/run.py) runs it too unless --skip-reverse; its results go to
results.json ("reverse") and docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from . import timing, workload

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT, TOPIC, SHARDS, PARTITIONS = "bench", "blobs", 3, 3
SOURCE = "bench-dts"  # the dts.topic attribute: the Kafka topic the lines came from
IDLE = 1.0  # --idle-timeout of the CLI pass, subtracted from its wall time
DEFAULT_ROWS = 100_000  # the target's size (steady state)
SMALL_ROWS = 20_000  # also measured by `make bench`: the fixed costs show

_log = timing.log


def _support():
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def _cli() -> list:
    script = os.path.join(os.path.dirname(sys.executable), "dts-bridge")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "bridge"]


class StandIn:
    """The stand-in DataHub as its own process on a free loopback port."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.datahub_standin", "--port", "0"],
                                     cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http"):
            self.stop()
            raise RuntimeError(f"the stand-in DataHub did not start: {self.endpoint!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def blob_records(work) -> tuple[list, int]:
    """[(shard key, line, (offset, entry, row))] in source order, as `sync --to blob` makes them from
    the workload's Envelopes, and the number of DML rows."""
    from bridge.blob.encode import BlobEncoder
    encoder = BlobEncoder()
    out = []
    for index, (entry, raw) in enumerate(zip(work.entries, work.entry_bytes)):
        columns = encoder.convert_columns(entry, raw)
        for row, (key, line) in enumerate(zip(columns[4], columns[6])):
            out.append((key, line, (index, 0, row)))
    return out, work.rows


def fill(endpoint: str, records: list) -> list:
    """Create the Blob topic and land `records` through the forward writer; records per shard."""
    from bridge.datahub.sink import DataHubWriter, Position, make_client
    client = make_client(endpoint)
    client.create_project(PROJECT, "bench")
    client.create_blob_topic(PROJECT, TOPIC, SHARDS, 7, "bench")
    writer = DataHubWriter(client, PROJECT)
    writer.topic(TOPIC)
    for key, line, (offset, entry, row) in records:
        writer.put(TOPIC, key, line, Position(SOURCE, 0, offset, entry, row))
    writer.flush()
    writer.close()
    return [shard.shard_id for shard in client.list_shard(PROJECT, TOPIC).shards]


def _policy():
    from bridge.stream import ErrorPolicy
    return ErrorPolicy("fail")


def run_library(endpoint: str, bootstrap: str, broker, entries: int, *, profile: str | None = None) -> dict:
    """One in-process `sync_to_dts` into a fresh topic, until all `entries` are written and committed."""
    from bridge.datahub.sink import make_client
    from bridge.kafka import client_config
    from bridge.pipeline.to_dts import sync_to_dts
    topic = broker.create_topic(f"rev-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS)
    parts = []
    policy = _policy()
    seen: list = []  # when a poll first and last handed on records

    def done() -> bool:
        return bool(parts) and parts[0].sink.written >= entries

    def started(got) -> None:
        parts.append(got)
        poll = got.source.poll

        def timed(budget, timeout):
            batch = poll(budget, timeout)
            if batch:
                now = time.perf_counter()
                if not seen:
                    seen.append(now)
                seen[1:] = [now]
            return batch
        got.source.poll = timed  # the loop polls this source (the bench's own timing, nothing else)

    def go():
        return sync_to_dts(make_client(endpoint), PROJECT, TOPIC, client_config(bootstrap), topic, policy,
                           from_beginning=True, stop=done, started=started)
    began, cpu = time.perf_counter(), time.process_time()
    if profile:
        import cProfile
        prof = cProfile.Profile()
        result = prof.runcall(go)
        prof.dump_stats(profile)
    else:
        result = go()
    ended = time.perf_counter()
    seconds, cpu = ended - began, time.process_time() - cpu
    sink = result.sink
    if sink.written != entries or policy.tally.rejected:
        raise RuntimeError(f"sync_to_dts wrote {sink.written} Entries of {entries} "
                           f"({policy.tally.rejected} rejected)")
    return {"seconds": seconds, "cpu": round(cpu, 3), "entries": sink.written, "messages": sink.messages,
            "transactions": sink.commits, "records_read": result.report.envelopes,
            "first_record_s": round(seen[0] - began, 3) if seen else None,
            "tail_s": round(ended - seen[-1], 3) if seen else None}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_read_floor(endpoint: str, lines: int) -> dict:
    """The reading alone: `DataHubSource` (pydatahub GetRecords pages over HTTP from the stand-in)
    polled until every shard is read to its end, nothing assembled or written: the most any reader
    over pydatahub and this stand-in could reach."""
    from bridge.datahub.sink import make_client
    from bridge.datahub.source import DataHubSource, ShardMark
    source = DataHubSource(make_client(endpoint), PROJECT, TOPIC, from_beginning=True)
    began, cpu = time.perf_counter(), time.process_time()
    source.open({})
    got = 0
    try:
        while got < lines:
            got += sum(1 for item in source.poll(1000, 0.5) if not isinstance(item[2], ShardMark))
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        source.close()
    return {"seconds": seconds, "cpu": round(cpu, 3), "records_read": got, "readers": source.readers}


def run_cli_sync(endpoint: str, bootstrap: str, broker, entries: int) -> dict:
    topic = broker.create_topic(f"rev-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS)
    command = _cli() + ["sync", "--to", "dts", "--datahub-endpoint", endpoint, "--project", PROJECT,
                        "--datahub-topic", TOPIC, "--brokers", bootstrap, "--topic", topic, "--from-beginning",
                        "--idle-timeout", str(IDLE), "--no-progress", "--status-interval", "0", "--json"]
    began, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "DATAHUB_ACCESS_ID": "bench", "DATAHUB_ACCESS_KEY": "bench"})
    seconds, cpu = time.perf_counter() - began - IDLE, _children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"sync --to dts failed ({done.returncode}): {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    if doc["entries_written"] != entries:
        raise RuntimeError(f"sync --to dts wrote {doc['entries_written']} Entries of {entries}")
    return {"seconds": seconds, "cpu": round(cpu, 3), "entries": doc["entries_written"],
            "messages": doc["kafka_messages"], "transactions": doc["transactions"]}


def run_cli_convert(lines_path: str, out_path: str, entries: int) -> dict:
    command = _cli() + ["convert", lines_path, "-o", out_path, "--no-progress"]
    began, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds, cpu = time.perf_counter() - began, _children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"convert failed ({done.returncode}): {done.stderr[-2000:]}")
    import bridge
    got = sum(len(env_entries) for env_entries in _entries_in(bridge, out_path))
    if got != entries:
        raise RuntimeError(f"convert gave {got} Entries of {entries}")
    return {"seconds": seconds, "cpu": round(cpu, 3), "entries": got}


def _entries_in(bridge, path: str):
    """Entries per Envelope group of a .pb file (counted to check a pass)."""
    r = bridge.Reassembler()
    for offset, _, raw in bridge.read_pb(path):
        for item in r.feed(0, offset, raw):
            yield item.entries.items


def run_library_convert(lines: list, entries: int) -> dict:
    from bridge.stream import blob_lines_to_entries
    policy = _policy()
    began, cpu = time.perf_counter(), time.process_time()
    got = 0
    for _, entry in blob_lines_to_entries(lines, policy):
        entry.SerializeToString()
        got += 1
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    if got != entries:
        raise RuntimeError(f"blob_lines_to_entries gave {got} Entries of {entries}")
    return {"seconds": seconds, "cpu": round(cpu, 3), "entries": got}


def measure(rows: int = DEFAULT_ROWS, repeat: int = 3, seed: int = 20240517, *, cli: bool = True,
            profile: str | None = None, log=_log) -> dict:
    """Build, fill, time every pass `repeat` times in rotating order; the results as a dict."""
    _support()
    from support.kafka_broker import KafkaBroker
    os.environ.setdefault("DATAHUB_ACCESS_ID", "bench")
    os.environ.setdefault("DATAHUB_ACCESS_KEY", "bench")
    work = workload.build(rows, seed=seed)
    records, rows = blob_records(work)
    entries = len(work.entries)
    lines = [line for _, line, _ in records]
    log(f"reverse: {rows:,} rows in {entries:,} Entries, {len(lines):,} Blob lines")
    folder = tempfile.mkdtemp(prefix="reverse-bench-")
    lines_path = os.path.join(folder, "lines.blob.jsonl")
    with open(lines_path, "wb") as fh:
        for line in lines:
            fh.write(line)
            fh.write(b"\n")
    server = StandIn()
    broker = None
    try:
        fill(server.endpoint, records)
        log(f"reverse: filled {PROJECT}/{TOPIC} ({SHARDS} shards) on {server.endpoint}")
        broker = KafkaBroker()
        log(f"reverse: Kafka broker {broker.version} on {broker.bootstrap}")
        passes = {
            "sync_to_dts": lambda: run_library(server.endpoint, broker.bootstrap, broker, entries),
            "convert_cli": lambda: run_cli_convert(lines_path, os.path.join(folder, "out.pb"), entries),
            "convert_library": lambda: run_library_convert(lines, entries),
            "datahub_read_floor": lambda: run_read_floor(server.endpoint, len(lines)),
        }
        if cli:
            passes["sync_cli"] = lambda: run_cli_sync(server.endpoint, broker.bootstrap, broker, entries)
        run_library(server.endpoint, broker.bootstrap, broker, entries)  # warm-up: the broker's JIT, imports
        seconds: dict[str, list] = {name: [] for name in passes}
        cpus: dict[str, list] = {name: [] for name in passes}
        fixed: dict[str, list] = {"first_record_s": [], "tail_s": []}
        facts: dict[str, dict] = {}
        names = list(passes)
        for rep in range(repeat):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                got = passes[name]()
                seconds[name].append(got.pop("seconds"))
                cpus[name].append(got.pop("cpu"))
                for k in fixed:
                    if k in got:
                        fixed[k].append(got.pop(k))
                facts[name] = got
            log(f"reverse round {rep + 1}: " + ", ".join(f"{n} {rows / seconds[n][-1]:,.0f} rows/s" for n in names))
        hot = None
        if profile:
            run_library(server.endpoint, broker.bootstrap, broker, entries, profile=profile)
            hot = profile
    finally:
        if broker is not None:
            broker.stop()
        server.stop()
    out = {"rows": rows, "entries": entries, "blob_lines": len(lines), "shards": SHARDS,
           "kafka_partitions": PARTITIONS, "repeat": repeat, "kafka_version": broker.version if broker else None,
           "passes": {}}
    for name in names:
        best, median = min(seconds[name]), statistics.median(seconds[name])
        out["passes"][name] = {"seconds_best": round(best, 3), "seconds_median": round(median, 3),
                               "seconds": [round(s, 3) for s in seconds[name]],
                               "rows_per_s": round(rows / best), "rows_per_s_median": round(rows / median),
                               "cpu_best": min(cpus[name]), "cpu": cpus[name],
                               "rows_per_cpu_s": round(rows / min(cpus[name])) if min(cpus[name]) > 0 else None,
                               **facts[name]}
    out["passes"]["sync_to_dts"].update(fixed)  # per round, seconds
    p = out["passes"]
    out["ratios"] = {"read_floor_vs_convert_cli":
                         round(p["datahub_read_floor"]["rows_per_s"] / p["convert_cli"]["rows_per_s"], 4),
                     "sync_to_dts_vs_read_floor":
                         round(p["sync_to_dts"]["rows_per_s"] / p["datahub_read_floor"]["rows_per_s"], 4),
                     "sync_to_dts_vs_convert_cli": round(p["sync_to_dts"]["rows_per_s"] / p["convert_cli"]["rows_per_s"], 4),
                     "sync_to_dts_vs_convert_library":
                         round(p["sync_to_dts"]["rows_per_s"] / p["convert_library"]["rows_per_s"], 4)}
    if "sync_cli" in p:
        out["ratios"]["sync_cli_vs_convert_cli"] = round(p["sync_cli"]["rows_per_s"] / p["convert_cli"]["rows_per_s"], 4)
    # the same ratio in CPU seconds (rows per CPU second): what a busy machine shifts less
    out["ratios"]["sync_to_dts_vs_convert_cli_cpu"] = round(p["convert_cli"]["cpu_best"] / p["sync_to_dts"]["cpu_best"], 4)
    if hot:
        out["profile"] = hot
    return out


def text(result: dict) -> str:
    lines = [f"{result['rows']:,} rows, {result['entries']:,} Entries, {result['blob_lines']:,} Blob lines on "
             f"{result['shards']} shards -> {result['kafka_partitions']} Kafka partitions; best of {result['repeat']}",
             f"{'pass':<16} {'rows/s (best)':>14} {'rows/s (median)':>16} {'seconds':>8} {'cpu s':>7}"]
    for name, p in result["passes"].items():
        lines.append(f"{name:<16} {p['rows_per_s']:>14,} {p['rows_per_s_median']:>16,} {p['seconds_best']:>8} "
                     f"{p['cpu_best']:>7}")
    sync = result["passes"]["sync_to_dts"]
    lines.append(f"sync_to_dts fixed: first record after {sync.get('first_record_s')} s, "
                 f"last record read to the end {sync.get('tail_s')} s")
    for name, value in result["ratios"].items():
        lines.append(f"{name:<34} {value:.3f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reverse_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"DML rows (default {DEFAULT_ROWS})")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best counts (default 3)")
    parser.add_argument("--seed", type=int, default=20240517)
    parser.add_argument("--no-cli", action="store_true", help="leave out the `dts-bridge sync --to dts` process")
    parser.add_argument("--profile", metavar="PATH", help="also run sync_to_dts once under cProfile, stats to PATH")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    result = measure(args.rows, args.repeat, args.seed, cli=not args.no_cli, profile=args.profile)
    print(json.dumps(result, indent=2) if args.json else text(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
