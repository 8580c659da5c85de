"""A Spark streaming driver as a real subprocess, killed with SIGKILL and restarted from its
checkpoint, and what the pipeline tests check of what landed in the stand-in DataHub: shared by
tests/test_spark_pipeline.py (Blob and Tuple of one table) and tests/test_spark_tables_kill.py (a
whole database).

- `Driver`: tests/pipeline_jobs/driver.py with one config, `start(trigger)` a process group;
  `kill_loop` SIGKILLs it at seeded points once records landed, then runs it to the end
  (availableNow).
- `landed` / `compare`: what landed per (DataHub shard, Kafka partition) from the `dts.pos`
  attribute, in each shard's sequence order (never sorted), against what must land.
- `checkpoint_cuts` / `straddling_cuts`: the micro-batch ends from the checkpoint's offset log and
  those inside Entries split across Envelopes (`_split_ranges`).
- `spark_task_of` / `_two_task_name`: which Spark task runs a Kafka partition, a topic name whose
  two partitions run in two tasks.
- `chaos`: the stand-in's random faults (5xx, throttling, resets, lost answers, delays) at the
  pipeline tests' rates (support.pipeline.fault_summary: what hit).
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from bridge import pb
from support import landing
from support.pipeline import CHAOS_OPS, ENV, ROOT, dts_pos

JOBS = ROOT / "tests" / "pipeline_jobs"
PROJECT = "p"


def _java() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")


def _split_ranges(raws: list[bytes]) -> list[tuple[int, int]]:
    """(first, last) offset of every Entries cut into several Envelopes (records that are no
    Envelope are skipped, offsets count every record)."""
    out, first = [], None
    for n, raw in enumerate(raws):
        try:
            env = pb.Envelope.FromString(raw)
        except Exception:  # noqa: BLE001 - the dirty topic's garbage record
            continue
        if env.total > 1 and env.index == 0:
            first = n
        if env.total > 1 and env.index == env.total - 1 and first is not None:
            out.append((first, n))
            first = None
    return out


# ---- which Spark task gets which Kafka partition ---------------------------------------------------------
# The streaming transforms group by (topic, partition) into spark.sql.shuffle.partitions (2 in
# local_session) tasks by Spark's Murmur3 hash (seed 42), as `pmod(hash(topic, partition), 2)`.
# The topic name decides whether a 2-partition topic's partitions run in one task or in two (the
# usual case on a cluster, where the two tasks then write to the same DataHub shards at once):
# the tests choose names that give two tasks, so that they do not depend on a random name.

_M = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _mix_k1(k: int) -> int:
    return (_rotl((k * 0xcc9e2d51) & _M, 15) * 0x1b873593) & _M


def _mix_h1(h: int, k: int) -> int:
    return (_rotl(h ^ k, 13) * 5 + 0xe6546b64) & _M


def _fmix(h: int, n: int) -> int:
    h ^= n
    h ^= h >> 16
    h = (h * 0x85ebca6b) & _M
    h ^= h >> 13
    h = (h * 0xc2b2ae35) & _M
    return h ^ (h >> 16)


def spark_task_of(topic: str, partition: int, tasks: int = 2) -> int:
    """Spark's HashPartitioning of the row (topic STRING, partition INT): Murmur3_x86_32 with
    seed 42, the string by `hashUnsafeBytes` (whole 4-byte words, then each trailing byte as a
    signed int), the int chained with the string's hash as seed; pmod by `tasks`. Checked against
    `spark.sql("select hash('pipeline-a12087cb', cast(1 as int))")` = -2130201617."""
    data, h = topic.encode(), 42
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h = _mix_h1(h, _mix_k1(int.from_bytes(data[i:i + 4], "little")))
    for b in data[aligned:]:
        h = _mix_h1(h, _mix_k1((b - 256 if b > 127 else b) & _M))
    h = _fmix(h, len(data))
    h = _fmix(_mix_h1(h, _mix_k1(partition & _M)), 4)
    return (h - (1 << 32) if h & 0x80000000 else h) % tasks


def _two_task_name(prefix: str) -> str:
    while True:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if spark_task_of(name, 0) != spark_task_of(name, 1):
            return name


# ---- what landed against what must land ------------------------------------------------------------

EPOCHS: dict = {}  # position -> the dts.epoch of each copy, filled by landed() for compare()'s messages


def landed(server, topic: str, source: str, value, keep: pathlib.Path | None = None,
           project: str = PROJECT) -> tuple[dict, dict]:
    """{(shard, partition): [value(record)]} and their positions, in each shard's sequence order
    (`keep`: every record's shard, sequence and attributes written there, for a failure's analysis)."""
    records = server.records(project, topic)
    if keep is not None:
        keep.write_text("\n".join(json.dumps({k: r.get(k) for k in ("shard", "sequence", "attributes")})
                                  for r in records))
    EPOCHS.clear()
    for record in records:
        EPOCHS.setdefault(dts_pos(record), []).append(record["attributes"].get("dts.epoch"))
    return landing.by_shard_partition(records, topic, source, value)


def compare(topic: str, got: dict, positions: dict, expected: dict, context: str) -> int:
    """support.landing.compare, its messages naming the micro-batches (dts.epoch) of a position
    that landed twice (from the last `landed`)."""
    return landing.compare(topic, got, positions, expected, context, epochs=EPOCHS)


def checkpoint_cuts(checkpoint: pathlib.Path, topic: str) -> dict[int, list[int]]:
    """Each micro-batch's end offset per Kafka partition, from the checkpoint's offset log (the
    source's offsets document is the log entry's last line, {"topic": {"partition": offset}})."""
    cuts: dict[int, list[int]] = collections.defaultdict(list)
    folder = checkpoint / "offsets"
    for path in sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        doc = json.loads(path.read_text().strip().splitlines()[-1])
        for partition, offset in doc[topic].items():
            cuts[int(partition)].append(int(offset))
    return cuts


def straddling_cuts(cuts: dict[int, list[int]], splits: dict[int, list[tuple[int, int]]]) -> list[tuple]:
    """(partition, cut, Entries first offset, last offset) for every micro-batch end that falls
    inside a split Entries (the micro-batch ends after `first` and before `last` is read)."""
    return [(p, cut, first, last) for p, ends in cuts.items() for cut in sorted(set(ends))
            for first, last in splits.get(p, ()) if first < cut <= last]


def commits(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def chaos(server, seed: int, ops: tuple = CHAOS_OPS) -> None:
    server.faults.chaos(seed, p_5xx=0.05, p_throttle=0.06, p_reset=0.03, p_ack_lost=0.06, p_delay=0.2,
                        max_delay=0.05, op=ops)


# ---- the driver as a subprocess, killed and restarted ------------------------------------------------

class Driver:
    """tests/pipeline_jobs/driver.py with one config; each run's output in files of tmp_path."""

    def __init__(self, tmp_path: pathlib.Path, **cfg) -> None:
        self.tmp_path, self.runs = tmp_path, 0
        self.checkpoint = tmp_path / "checkpoint"
        self.commit_log = tmp_path / "commits.jsonl"
        self.cfg = dict(cfg, checkpoint=str(self.checkpoint), commitLog=str(self.commit_log))

    def start(self, trigger: str) -> tuple[subprocess.Popen, pathlib.Path]:
        self.runs += 1
        config = self.tmp_path / f"driver-{self.runs}.json"
        config.write_text(json.dumps(dict(self.cfg, trigger=trigger)))
        log = self.tmp_path / f"driver-{self.runs}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(JOBS / "driver.py"), str(config)], cwd=ROOT, env=ENV,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        return proc, log


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: pathlib.Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no output)"


def kill_loop(driver: Driver, count, *, kills: int, total: int, seed: int, log: list[str],
              timeout: float = 300) -> list[dict]:
    """Run the driver with a processing-time trigger and SIGKILL its process group once more
    records landed (seeded random thresholds spread over the stream, plus a small random delay so
    that kills fall inside micro-batches and during the writers' tail scans); then the final run
    (availableNow) to the end. Returns the kills."""
    rng = random.Random(seed)
    done: list[dict] = []
    for k in range(kills):
        before = count()
        # the k-th kill somewhere in the k-th of `kills` equal slices of what is still to land
        share = (total - before) / (kills - k + 1)
        threshold = before + max(1, int(share * rng.uniform(0.3, 1.0)))
        proc, out = driver.start("500 milliseconds")
        started = time.monotonic()
        while proc.poll() is None and count() < threshold and time.monotonic() - started < timeout:
            time.sleep(0.05)
        if proc.poll() is None and count() >= threshold:
            time.sleep(rng.uniform(0.0, 0.4))
        alive = proc.poll() is None
        _killpg(proc)
        at = count()
        assert alive, f"driver run {driver.runs} ended by itself ({proc.returncode}):\n{_tail(out)}\n" + "\n".join(log)
        assert at >= threshold, (f"driver run {driver.runs}: only {at - before} records landed in {timeout} s "
                                 f"(waited for {threshold - before}):\n{_tail(out)}\n" + "\n".join(log))
        done.append(dict(run=driver.runs, after=round(time.monotonic() - started, 1), landed_in_run=at - before,
                         landed=at))
        log.append(f"run {driver.runs}: SIGKILL of the process group after {done[-1]['after']} s, "
                   f"{at - before} records landed in the run, {at} of {total} in all")
        assert "Traceback" not in _tail(out, 10 ** 7), f"driver run {driver.runs} printed a traceback:\n{_tail(out)}"
    proc, out = driver.start("availableNow")
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        raise AssertionError(f"the final driver run did not end within {timeout} s (a hang?):\n{_tail(out)}\n"
                             + "\n".join(log))
    text = _tail(out, 10 ** 7)
    assert code == 0 and "finished" in text, \
        f"the final driver run exited {code}:\n{_tail(out)}\n" + "\n".join(log)
    assert "Traceback" not in text, f"the final driver run printed a traceback:\n{_tail(out)}"
    log.append(f"run {driver.runs}: availableNow to the end, {count()} records in all")
    return done


def _landed_count(server, topic: str):
    def count() -> int:
        try:
            return len(server.records(PROJECT, topic))
        except Exception:  # noqa: BLE001 - a topic the writer has not created yet
            return 0
    return count

