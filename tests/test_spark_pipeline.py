"""End-to-end Spark Structured Streaming pipeline tests (issue 16, point 5 and "Done when"), on real
parts: a real Apache Kafka broker (tests/support/kafka_broker.py), Spark's own `kafka` source (the
spark-sql-kafka-0-10 jars in .cache/jars/spark-kafka/) and `dts-kafka`, `dts_to_blob` /
`dts_to_tuple` on the stream with a small `maxOffsetsPerTrigger` (so that micro-batch boundaries
fall inside Entries split across Envelopes), `writeStream.format("datahub")` into the stand-in
DataHub (tests/support/datahub_standin.py) with chaos faults, and a driver process (a real
subprocess, tests/pipeline_jobs/driver.py) killed with SIGKILL (its whole process group: Python,
JVM, Python workers) and restarted from its checkpoint.

What landed is compared with `dts-bridge convert` of the very files produced, per (DataHub shard,
Kafka partition) taken from the `dts.pos` attribute, record for record, in the order DataHub holds
them (never sorted); positions strictly increase per (shard, partition) and are unique per topic.
The checkpoint's offset log is read to prove that micro-batch boundaries did fall inside split
Entries.

- test_blob_dts_kafka_killed_and_restarted: dts-kafka -> Blob, 1 kill (deep: 6).
- test_blob_spark_kafka_source_killed_and_restarted: Spark's `kafka` source -> Blob, 1 kill (deep: 4).
- test_tuple_dts_kafka_killed_and_restarted: dts-kafka -> Tuple (media.thumbnails), 1 kill (deep: 4).
- test_micro_batch_boundaries_inside_entries_lose_nothing_in_any_mode: both Kafka sources, FAILFAST
  (clean topic), PERMISSIVE and DROPMALFORMED (a topic with a missing segment and a record that is
  no Envelope), streaming rows (foreachBatch) equal to the batch conversion of the same records
  (one subprocess, tests/pipeline_jobs/collect.py, runs the six queries at once).
- test_two_tasks_writing_one_shard_with_lost_answers_land_each_record_once: the `datahub` sink's
  task function (`write_batches`) run by two threads at once on a one-shard topic with lost
  answers, as two Spark tasks of one micro-batch do; no Spark, a few seconds.

The pipeline topic's name is chosen so that its two Kafka partitions run in two Spark tasks
(`spark_task_of`: Spark's hash partitioning of (topic, partition)), as they do on a cluster; the two
tasks then write to the same DataHub shards at the same time.

Seeds: SPARK_PIPELINE_SEED=N (default 1729) changes kill points and chaos.
"""
from __future__ import annotations

import collections
import glob
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

import orjson
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = [pytest.mark.spark, pytest.mark.datahub]

from support.datahub_standin import StandInDataHub  # noqa: E402
from support.kafka_broker import kafka_broker  # noqa: E402,F401  (the session fixture)

from bridge import pb, shard_key  # noqa: E402
from bridge._wire import Reassembler, pack_entries, read_pb, write_pb  # noqa: E402
from bridge.datahub_sink import make_client, shard_for, tuple_shard_key  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
JOBS = ROOT / "tests" / "pipeline_jobs"
PROJECT = "p"
SHARDS = ["0", "1", "2"]
SEED = int(os.environ.get("SPARK_PIPELINE_SEED", "1729"))
ENV = dict(os.environ, PYTHONPATH=str(ROOT), DATAHUB_ACCESS_ID="test-id", DATAHUB_ACCESS_KEY="test-secret")
SPARK_KAFKA_JARS = sorted(glob.glob(str(ROOT / ".cache" / "jars" / "spark-kafka" / "*.jar")))
CHAOS_OPS = ("PutRecords", "PutRecordsByShard", "GetCursor", "GetRecords", "ListShard", "GetTopic", "CreateTopic")
GARBAGE = b"\xff\xff\xff not an Envelope"
TABLE = "media.thumbnails"
MAX_OFFSETS = 10  # per micro-batch: the topic's 48 offsets in about five micro-batches


def _java() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")


def _need_spark_kafka_jars() -> str:
    if not any("spark-sql-kafka" in p for p in SPARK_KAFKA_JARS):
        pytest.skip(f"no spark-sql-kafka jar in {ROOT / '.cache/jars/spark-kafka'} (run make install)")
    return ",".join(SPARK_KAFKA_JARS)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bridge", *args]


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


# ---- the input: a 2-partition topic with Entries split across Envelopes ----------------------------

def _entries(path: pathlib.Path) -> list:
    reassembler, out = Reassembler(), []
    for number, _, raw in read_pb(path):
        for item in reassembler.feed(0, number, raw):
            out.extend(item.entries.items)
    assert reassembler.finish() == []
    return out


def _repack(src: pathlib.Path, dest: pathlib.Path, size: int) -> pathlib.Path:
    with open(dest, "wb") as out:
        write_pb(out, pack_entries(_entries(src), size))
    return dest


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


def test_spark_task_of_matches_spark_hash():
    assert spark_task_of("pipeline-a12087cb", 0) == 0 and spark_task_of("pipeline-a12087cb", 1) == 1
    assert [spark_task_of(n, p) for n in ("x", "abcde", "pipeline-ffffffff", "ñé-topic") for p in (0, 1)] == \
        [0, 0, 0, 0, 0, 1, 1, 0]  # pmod(hash(n, p), 2) as Spark 4.3 computes it


def _two_task_name(prefix: str) -> str:
    while True:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if spark_task_of(name, 0) != spark_task_of(name, 1):
            return name


class Topic:
    """A Kafka topic produced by the test: its name, each partition's records (bytes, by offset)
    and, for a clean topic, the files produced to each partition in order."""

    def __init__(self, name: str, records: dict[int, list[bytes]], files: dict[int, list[pathlib.Path]]) -> None:
        self.name, self.records, self.files = name, records, files

    def splits(self) -> dict[int, list[tuple[int, int]]]:
        return {p: _split_ranges(raws) for p, raws in self.records.items()}

    def offsets(self) -> int:
        return sum(len(v) for v in self.records.values())


@pytest.fixture(scope="module")
def clean_topic(kafka_broker, tmp_path_factory) -> Topic:  # noqa: F811
    """Partition 0: samples/large.pb (21 Envelopes; Entries of 4, 6 and 4 segments). Partition 1:
    mixed.pb packed into 2 KB Envelopes (16), then large.pb packed into 8 KB ones (11): 48 offsets,
    every Entries split across Envelopes somewhere. Produced with `dts-bridge produce`."""
    folder = tmp_path_factory.mktemp("pipeline-input")
    files = {0: [SAMPLES / "large.pb"],
             1: [_repack(SAMPLES / "mixed.pb", folder / "mixed-2k.pb", 2048),
                 _repack(SAMPLES / "large.pb", folder / "large-8k.pb", 8000)]}
    # the two partitions in two Spark tasks, as on a cluster (see spark_task_of)
    name = kafka_broker.create_topic(_two_task_name("pipeline"), partitions=2)
    records: dict[int, list[bytes]] = {}
    for partition, paths in files.items():
        for path in paths:
            proc = _run(_cli("produce", str(path), "--brokers", kafka_broker.bootstrap, "--topic", name,
                             "--partition", str(partition)))
            assert proc.returncode == 0, f"dts-bridge produce {path} failed: {proc.stderr}"
            records.setdefault(partition, []).extend(raw for _, _, raw in read_pb(path))
    topic = Topic(name, records, files)
    assert {p: len(r) for p, r in records.items()} == {0: 21, 1: 27}
    assert all(len(s) >= 3 for s in topic.splits().values())
    return topic


@pytest.fixture(scope="module")
def dirty_topic(kafka_broker) -> Topic:  # noqa: F811
    """Partition 0: large.pb without its 9th record (a middle segment of the 6-segment Entries);
    partition 1: a record that is no Envelope, then large.pb. Produced one record per request."""
    from confluent_kafka import Producer
    large = [raw for _, _, raw in read_pb(SAMPLES / "large.pb")]
    records = {0: large[:8] + large[9:], 1: [GARBAGE] + large}
    name = kafka_broker.create_topic(f"pipeline-dirty-{uuid.uuid4().hex[:8]}", partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    for partition, raws in records.items():
        for raw in raws:
            producer.produce(name, raw, partition=partition)
            producer.flush(30)
    assert producer.flush(30) == 0
    return Topic(name, records, {})


def convert_blob(path: pathlib.Path, tmp_path: pathlib.Path) -> list[bytes]:
    out = tmp_path / f"expected-{path.stem}-{uuid.uuid4().hex[:6]}.jsonl"
    proc = _run(_cli("convert", str(path), "-o", str(out), "--to", "blob", "--no-progress"))
    assert proc.returncode == 0, f"dts-bridge convert {path} failed: {proc.stderr}"
    return out.read_bytes().splitlines()


def convert_tuple(path: pathlib.Path, tmp_path: pathlib.Path, table: str) -> tuple[dict, list[dict]]:
    """The Tuple file conversion of one table: (schema document, rows)."""
    folder = tmp_path / f"tuple-{path.stem}-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    proc = _run(_cli("convert", str(path), "-o", str(folder / "{table}.jsonl"), "--to", "tuple",
                     "--on-error", "skip", "--no-progress"))
    assert proc.returncode in (0, 1), f"dts-bridge convert --to tuple {path} failed: {proc.stderr}"
    side = folder / f"{table}.schema.json"
    if not side.exists():
        return {}, []
    assert not list(folder.glob(f"{table}.v2.*")), "the table changed its schema inside the file"
    rows = [json.loads(line) for line in (folder / f"{table}.jsonl").read_text().splitlines()]
    return json.loads(side.read_text()), rows


# ---- what landed against what must land ------------------------------------------------------------

def _pos(record: dict) -> tuple[int, int, int, int]:
    text = record["attributes"].get("dts.pos", "")
    parts = text.split(":")
    assert len(parts) == 4 and all(p.isdigit() for p in parts), f"record without a dts.pos attribute: {record}"
    return tuple(int(p) for p in parts)


EPOCHS: dict = {}  # position -> the dts.epoch of each copy, filled by landed() for compare()'s messages


def landed(server, topic: str, source: str, value, keep: pathlib.Path | None = None) -> tuple[dict, dict]:
    """{(shard, partition): [value(record)]} and their positions, in each shard's sequence order
    (`keep`: every record's shard, sequence and attributes written there, for a failure's analysis)."""
    got: dict = collections.defaultdict(list)
    positions: dict = collections.defaultdict(list)
    records = server.records(PROJECT, topic)
    if keep is not None:
        keep.write_text("\n".join(json.dumps({k: r.get(k) for k in ("shard", "sequence", "attributes")})
                                  for r in records))
    EPOCHS.clear()
    for record in records:
        EPOCHS.setdefault(_pos(record), []).append(record["attributes"].get("dts.epoch"))
        assert record["attributes"].get("dts.topic") == source, \
            f"{topic} shard {record['shard']}: dts.topic {record['attributes'].get('dts.topic')!r}, not {source!r}"
        pos = _pos(record)
        got[(record["shard"], pos[0])].append(value(record))
        positions[(record["shard"], pos[0])].append(pos)
    return got, positions


def _short(value) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return text if len(text) < 300 else text[:300] + "..."


def compare(topic: str, got: dict, positions: dict, expected: dict, context: str) -> int:
    """Every (shard, partition) equal, in order; positions strictly increasing per (shard,
    partition) and unique in the topic. Returns the number of records compared."""
    problems = []
    seen: dict = {}
    for key, pos_list in positions.items():
        for i, pos in enumerate(pos_list):
            if pos in seen:
                epochs = EPOCHS.get(pos, [])
                why = (f"; both copies of micro-batch {epochs[0]}: sent twice by one attempt (a retry), "
                       "not a replay after a restart" if len(epochs) == 2 and epochs[0] == epochs[1] is not None
                       else f"; micro-batches {epochs}" if any(e is not None for e in epochs) else "")
                problems.append(f"{topic}: position {':'.join(map(str, pos))} landed twice "
                                f"(shard {seen[pos][0]} #{seen[pos][1]} and shard {key[0]} #{i}{why})")
            seen[pos] = (key[0], i)
        for i, (a, b) in enumerate(zip(pos_list, pos_list[1:])):
            if not a < b:
                problems.append(f"{topic} shard {key[0]} partition {key[1]}: record #{i + 1} at "
                                f"{':'.join(map(str, b))} follows {':'.join(map(str, a))} "
                                f"({'a duplicate' if a == b else 'reordered'})")
                break
    for key in sorted(set(got) | set(expected)):
        have, want = got.get(key, []), expected.get(key, [])
        if have == want:
            continue
        first = next((i for i, (h, w) in enumerate(zip(have, want)) if h != w), min(len(have), len(want)))
        c_have, c_want = collections.Counter(map(repr, have)), collections.Counter(map(repr, want))
        extra, lost = sum((c_have - c_want).values()), sum((c_want - c_have).values())
        pos = positions.get(key, [])
        where = ":".join(map(str, pos[first])) if first < len(pos) else "-"
        problems.append(
            f"{topic} shard {key[0]} partition {key[1]}: {len(have)} records landed, {len(want)} expected; "
            f"first difference at #{first} (dts.pos {where}); {lost} lost, {extra} extra"
            f"{'; same records in another order: REORDERED' if not lost and not extra else ''}\n"
            f"    landed:   {_short(have[first]) if first < len(have) else '(end)'}\n"
            f"    expected: {_short(want[first]) if first < len(want) else '(end)'}")
    problems.sort(key=lambda text: "landed twice" in text or "follows" in text)
    assert not problems, f"{context}\n" + "\n".join(problems[:20]) + \
        (f"\n... and {len(problems) - 20} more" if len(problems) > 20 else "")
    return sum(len(v) for v in expected.values())


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


def chaos(server, seed: int) -> None:
    server.faults.chaos(seed, p_5xx=0.05, p_throttle=0.06, p_reset=0.03, p_ack_lost=0.06, p_delay=0.2,
                        max_delay=0.05, op=CHAOS_OPS)


def fault_summary(server) -> dict:
    return dict(collections.Counter(kind for _, kind in server.faults.injected))


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


def _blob_pipeline(tmp_path, broker, topic: Topic, *, source: str, kills: int, seed: int) -> None:
    _java()
    began = time.monotonic()
    jars = _need_spark_kafka_jars() if source == "kafka" else ""
    expected: dict = collections.defaultdict(list)
    for partition, paths in topic.files.items():
        for path in paths:
            for line in convert_blob(path, tmp_path):
                expected[(shard_for(shard_key(orjson.loads(line)), SHARDS), partition)].append(line)
    total = sum(len(v) for v in expected.values())
    assert len({s for s, _ in expected}) == 3 and {p for _, p in expected} == {0, 1}
    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        chaos(server, seed)
        driver = Driver(tmp_path, source=source, bootstrap=broker.bootstrap, topic=topic.name,
                        maxOffsetsPerTrigger=MAX_OFFSETS, endpoint=server.endpoint, project=PROJECT,
                        datahub_topic="blob", batchSize=5, maxRetries=30, jars=jars, kind="blob")
        count = _landed_count(server, "blob")
        killed = kill_loop(driver, count, kills=kills, total=total, seed=seed, log=log)
        server.faults.clear()
        faults = fault_summary(server)
        context = f"source {source}, seed {seed}; driver logs in {tmp_path}; faults {faults}\n  " + "\n  ".join(log)
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        got, positions = landed(server, "blob", topic.name, lambda r: r["data"], tmp_path / "landed.jsonl")
        compared = compare("blob", got, positions, expected, context)
        assert len(killed) == kills and all(k["landed_in_run"] > 0 for k in killed), context
        assert faults.get("chaos-ack-lost", 0) > 0 and faults.get("chaos-5xx", 0) > 0, f"chaos too quiet: {faults}"
        cuts = checkpoint_cuts(driver.checkpoint, topic.name)
        inside = straddling_cuts(cuts, topic.splits())
        assert inside, f"no micro-batch ended inside a split Entries: cuts {dict(cuts)}, splits {topic.splits()}"
        summaries = commits(driver.commit_log)
        skipped = sum(s.get("skipped", 0) for s in summaries if s["outcome"] == "commit")
        print(f"\n[{source} -> Blob -> datahub, seed {seed}: {len(killed)} kills in {driver.runs} runs, {compared} "
              f"records compared over {len(expected)} (shard, partition) pairs, {len(cuts[0])} micro-batches, "
              f"{len(inside)} micro-batch ends inside split Entries, {skipped} records found already landed by "
              f"replays, faults {faults}, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


# ---- 1. dts-kafka -> Blob -> datahub, killed twice ---------------------------------------------------

def test_blob_dts_kafka_killed_and_restarted(kafka_broker, clean_topic, tmp_path):  # noqa: F811
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="dts-kafka", kills=1, seed=SEED)


@pytest.mark.deep
def test_blob_dts_kafka_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):  # noqa: F811
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="dts-kafka", kills=6, seed=SEED + 1)


# ---- 2. Spark's own kafka source -> Blob -> datahub ----------------------------------------------------

@pytest.mark.deep  # make test keeps Spark's own kafka source in the micro-batch boundary test (4.) for time
def test_blob_spark_kafka_source_killed_and_restarted(kafka_broker, clean_topic, tmp_path):  # noqa: F811
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="kafka", kills=1, seed=SEED + 2)


@pytest.mark.deep
def test_blob_spark_kafka_source_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):  # noqa: F811
    _blob_pipeline(tmp_path, kafka_broker, clean_topic, source="kafka", kills=4, seed=SEED + 3)


# ---- 3. dts-kafka -> Tuple -> datahub ---------------------------------------------------------------

def _text(value):
    return None if value is None else str(value)


def _tuple_pipeline(tmp_path, broker, topic: Topic, *, kills: int, seed: int) -> None:
    _java()
    began = time.monotonic()
    expected: dict = collections.defaultdict(list)
    fields: list | None = None
    shard_ids = ["0", "1"]
    for partition, paths in topic.files.items():
        for path in paths:
            doc, rows = convert_tuple(path, tmp_path, TABLE)
            if not rows:
                continue
            names = [f["name"] for f in doc["fields"]]
            assert fields is None or fields == names, (fields, names)
            fields = names
            keys = [c["name"] for c in doc["dtsColumns"] if c.get("isKey")]
            for row in rows:
                expected[(shard_for(tuple_shard_key(row, TABLE, keys), shard_ids), partition)].append(
                    [_text(row.get(f)) for f in fields])
    assert fields and {p for _, p in expected} == {0, 1} and len({s for s, _ in expected}) == 2, expected.keys()
    total = sum(len(v) for v in expected.values())
    name = TABLE.replace(".", "_")
    log: list[str] = []
    with StandInDataHub() as server:
        chaos(server, seed)
        driver = Driver(tmp_path, source="dts-kafka", bootstrap=broker.bootstrap, topic=topic.name,
                        maxOffsetsPerTrigger=MAX_OFFSETS, endpoint=server.endpoint, project=PROJECT,
                        datahub_topic="{db}_{table}", batchSize=5, maxRetries=30, kind="tuple", table=TABLE,
                        shards=len(shard_ids))
        killed = kill_loop(driver, _landed_count(server, name), kills=kills, total=total, seed=seed, log=log)
        server.faults.clear()
        faults = fault_summary(server)
        context = f"seed {seed}; driver logs in {tmp_path}; faults {faults}\n  " + "\n  ".join(log)
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        client = make_client(server.endpoint, "test-id", "test-secret")
        assert set(client.list_topic(PROJECT).topic_names) == {name}
        schema = client.get_topic(PROJECT, name).record_schema
        assert [f.name for f in schema.field_list] == fields, context
        assert [s["shard_id"] for s in server.shards(PROJECT, name) if s["state"] == "ACTIVE"] == shard_ids
        got, positions = landed(server, name, topic.name, lambda r: [_text(v) for v in r["values"]],
                                 tmp_path / "landed.jsonl")
        compared = compare(name, got, positions, expected, context)
        assert len(killed) == kills and all(k["landed_in_run"] > 0 for k in killed), context
        cuts = checkpoint_cuts(driver.checkpoint, topic.name)
        inside = straddling_cuts(cuts, topic.splits())
        assert inside, f"no micro-batch ended inside a split Entries: cuts {dict(cuts)}"
        print(f"\n[dts-kafka -> Tuple {TABLE} -> datahub, seed {seed}: {len(killed)} kills in {driver.runs} runs, "
              f"{compared} rows compared over {len(expected)} (shard, partition) pairs, {len(inside)} micro-batch "
              f"ends inside split Entries, faults {faults}, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


def test_tuple_dts_kafka_killed_and_restarted(kafka_broker, clean_topic, tmp_path):  # noqa: F811
    _tuple_pipeline(tmp_path, kafka_broker, clean_topic, kills=1, seed=SEED + 4)


@pytest.mark.deep
def test_tuple_dts_kafka_killed_and_restarted_deep(kafka_broker, clean_topic, tmp_path):  # noqa: F811
    _tuple_pipeline(tmp_path, kafka_broker, clean_topic, kills=4, seed=SEED + 5)


# ---- 4. a micro-batch boundary inside an Entries, every mode, both Kafka sources -------------------------

def _by_partition(rows) -> dict:
    """Rows per Kafka partition in the order given (never sorted)."""
    out: dict = {}
    for row in rows:
        out.setdefault(row[1], []).append(tuple(row))
    return out


def test_micro_batch_boundaries_inside_entries_lose_nothing_in_any_mode(kafka_broker, clean_topic, dirty_topic,
                                                                     tmp_path):  # noqa: F811
    """Streaming dts_to_blob with maxOffsetsPerTrigger on Spark's `kafka` source and on dts-kafka,
    FAILFAST on the clean topic, PERMISSIVE and DROPMALFORMED on the dirty one: the micro-batches'
    rows, in batch order, equal the batch conversion of the same topic per Kafka partition (error
    rows included), with the same tally; FAILFAST's Blob lines equal `dts-bridge convert`."""
    _java()
    began = time.monotonic()
    jars = _need_spark_kafka_jars()
    out = tmp_path / "collected.json"
    config = tmp_path / "collect.json"
    config.write_text(json.dumps(dict(sources=["kafka", "dts-kafka"], bootstrap=kafka_broker.bootstrap,
                                      clean=clean_topic.name, dirty=dirty_topic.name, maxOffsetsPerTrigger=MAX_OFFSETS,
                                      out=str(out), checkpoints=str(tmp_path / "checkpoints"), jars=jars)))
    proc = subprocess.run([sys.executable, str(JOBS / "collect.py"), str(config)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "finished" in proc.stdout, \
        f"the collect job exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(out.read_text())
    expected_lines = {p: [line.decode() for path in paths for line in convert_blob(path, tmp_path)]
                      for p, paths in clean_topic.files.items()}
    entries = sum(len(_entries(path)) for paths in clean_topic.files.values() for path in paths)
    summary = []
    for source in ("kafka", "dts-kafka"):
        for mode in ("FAILFAST", "PERMISSIVE", "DROPMALFORMED"):
            got = result[source][mode]
            topic = clean_topic if mode == "FAILFAST" else dirty_topic
            what = f"{source} {mode}"
            ids = sorted(got["stream"], key=int)
            assert [int(i) for i in ids] == list(range(len(ids))), f"{what}: micro-batch ids {ids}"
            stream_rows = [row for i in ids for row in got["stream"][i]]
            cuts = checkpoint_cuts(pathlib.Path(got["checkpoint"]), topic.name)
            inside = straddling_cuts(cuts, topic.splits())
            assert inside, f"{what}: no micro-batch ended inside a split Entries: cuts {dict(cuts)}"
            s, b = _by_partition(stream_rows), _by_partition(got["batch"])
            for p in sorted(set(s) | set(b), key=str):
                have, want = s.get(p, []), b.get(p, [])
                if have != want:
                    first = next((i for i, (h, w) in enumerate(zip(have, want)) if h != w), min(len(have), len(want)))
                    pytest.fail(f"{what} partition {p}: the stream gave {len(have)} rows, the batch conversion "
                                f"{len(want)}; first difference at #{first}:\n  stream: "
                                f"{_short(have[first]) if first < len(have) else '(end)'}\n  batch:  "
                                f"{_short(want[first]) if first < len(want) else '(end)'}\n"
                                f"micro-batch ends {dict(cuts)} inside split Entries {inside}")
            assert got["stream_tally"] == got["batch_tally"], (what, got["stream_tally"], got["batch_tally"])
            tally = got["stream_tally"]
            assert tally["input"] == tally["converted"] + tally["rejected"] + tally["not_emitted"], (what, tally)
            errors = [(r[1], r[2]) for r in stream_rows if r[6] is not None]
            if mode == "FAILFAST":
                assert tally["rejected"] == 0 and not errors
                # input counts Entry messages: every Entry of the files produced, once
                assert tally["input"] == entries, (what, tally, entries)
                lines = {p: [r[5] for r in rows] for p, rows in s.items()}
                assert lines == expected_lines, f"{what}: the Blob lines differ from dts-bridge convert"
            else:
                # the 6-segment Entries missing its 3rd segment (partition 0, offsets 6..10 now) and
                # the record that is no Envelope (partition 1, offset 0)
                assert tally["rejected"] >= 2, (what, tally)
                if mode == "PERMISSIVE":
                    assert (1, 0) in errors and any(p == 0 and 6 <= o <= 10 for p, o in errors), (what, errors)
                else:
                    assert not errors
                good = {p: [r[5] for r in rows if r[6] is None] for p, rows in s.items()}
                # every Entries but the broken one: partition 1 is all of large.pb
                assert good[1] == expected_lines[0], f"{what}: partition 1 is not large.pb's conversion"
            summary.append(f"{what}: {len(ids)} micro-batches, {len(inside)} ends inside split Entries, "
                           f"{len(stream_rows)} rows, rejected {tally['rejected']}")
    print(f"\n[micro-batch boundaries, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(summary))


# ---- the sink's task function, two tasks writing one shard at once ----------------------------------------

def test_two_tasks_writing_one_shard_with_lost_answers_land_each_record_once(tmp_path):
    """What every micro-batch of the pipelines above does, without Spark: two Spark tasks (the
    `datahub` sink's task function, `write_batches`, one per Kafka partition, as the streaming
    `dts_to_blob` gives them) write at the same time to one DataHub shard, and some answers are
    lost after the records landed (chaos ack-lost). Each task's writer checks an answer-less
    request against the shard's tail before sending it again; every record must land once, and
    each partition's records in order."""
    import threading

    import pyarrow as pa

    import bridge.spark as bs
    from bridge._spark_jobs import BLOB_COLUMNS
    from bridge.spark_datahub import configure, write_batches

    raws = [raw for _, _, raw in read_pb(SAMPLES / "large.pb")]
    rows = {}
    for partition in (0, 1):
        kafka = pa.RecordBatch.from_pydict({"topic": ["dts"] * len(raws), "partition": [partition] * len(raws),
                                            "offset": list(range(len(raws))), "value": raws})
        rows[partition] = pa.Table.from_batches(
            list(bs.dts_to_blob_batches(arrow=True)(iter([kafka])))).to_batches(max_chunksize=8)
    expected = {p: [v.encode() for b in batches for v in b.column("blob").to_pylist()] for p, batches in rows.items()}
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "one", shard_count=1)
        config = configure(dict(endpoint=server.endpoint, project=PROJECT, topic="one", accessId="i", accessKey="k",
                                batchSize="3"), BLOB_COLUMNS, streaming=True)
        server.faults.chaos(SEED, p_ack_lost=0.15, p_delay=0.3, max_delay=0.02, op=("PutRecordsByShard",))
        reports, errors = {}, []

        def task(partition):
            try:
                reports[partition] = write_batches(config, iter(rows[partition]), epoch=0)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
        threads = [threading.Thread(target=task, args=(p,)) for p in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        server.faults.clear()
        assert not errors, errors
        lost_answers = server.faults.count("chaos-ack-lost")
        got, positions = landed(server, "one", "dts", lambda r: r["data"], tmp_path / "landed.jsonl")
        compare("one", got, positions, {("0", p): lines for p, lines in expected.items()},
                f"two tasks on one shard, {lost_answers} answers lost after the records landed; reports {reports}")
        assert lost_answers > 0
