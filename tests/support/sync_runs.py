"""`dts-bridge sync` as a real subprocess on real parts, and what it lands: shared by tests/test_sync.py
(one table, Blob and Tuple, kill loops, TDSQL) and tests/test_sync_tables.py (a whole database), and
by tests/test_spark_tables.py, which puts Spark's output beside the same file conversions.

- `Sync`: `dts-bridge sync` with fixed arguments, started (`start`) or run to the end (`run`);
  `kill_loop` SIGKILLs it at seeded points (by time and by records landed) and restarts it.
- `produce` / `convert_blob` / `convert_tuple`: `dts-bridge produce` and `convert` of a file, what
  must land; `repack` / `entries_of`: a file's Entries packed again under a smaller Kafka limit.
- `landed_by_shard_partition`: what landed per (DataHub shard, Kafka partition) from `dts.pos`, in
  each shard's sequence order; `compare` (tests/support/landing.py) puts it beside what must land.
- `committed_offsets` / `end_offsets` / `warm_group_coordinator`: the Kafka side.
- `chaos`: the stand-in DataHub's random faults at the sync tests' rates.

Seeds: SYNC_TEST_SEED=N changes the seed of the kill points and of the chaos (default 1729).
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from bridge.wire.framing import Assembled, Reassembler, pack_entries, read_pb, write_pb
from support.landing import by_shard_partition
from support.pipeline import CHAOS_OPS, ENV, ROOT, bridge_cli, run_bridge

PROJECT = "dts"
SEED = int(os.environ.get("SYNC_TEST_SEED", "1729"))


def unique_name(prefix: str) -> str:
    """`prefix`-<8 hex digits>: a topic, group or folder name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---- streams ---------------------------------------------------------------------------------

def entries_of(path: pathlib.Path) -> list:
    """The Entry messages of a .pb file, in order (every Envelope reassembles)."""
    reassembler, out = Reassembler(), []
    for number, _, raw in read_pb(path):
        for item in reassembler.feed(0, number, raw):
            assert isinstance(item, Assembled), f"{path}: {item}"
            out.extend(item.entries.items)
    assert reassembler.finish() == []
    return out


def repack(src: pathlib.Path, dest: pathlib.Path, max_message_bytes: int, times: int = 1) -> pathlib.Path:
    """The Entries of `src` (`times` over) packed again under a smaller Kafka message limit, as
    the DTS producer packs them: more Envelopes (more commit points) and more Entries split into
    segments."""
    entries = entries_of(src) * times
    with open(dest, "wb") as out:
        write_pb(out, pack_entries(entries, max_message_bytes))
    return dest


def envelope_count(path: pathlib.Path) -> int:
    return sum(1 for _ in read_pb(path))


def produce(broker, topic: str, path: pathlib.Path, partition: int) -> None:
    proc = run_bridge(bridge_cli("produce", str(path), "--brokers", broker.bootstrap, "--topic", topic,
                     "--partition", str(partition)))
    assert proc.returncode == 0, f"dts-bridge produce {path.name} failed: {proc.stderr}"


def convert_blob(path: pathlib.Path, tmp_path: pathlib.Path) -> list[bytes]:
    out = tmp_path / f"expected-{path.stem}-{uuid.uuid4().hex[:6]}.jsonl"
    proc = run_bridge(bridge_cli("convert", str(path), "-o", str(out), "--to", "blob"))
    assert proc.returncode == 0, f"dts-bridge convert {path} failed: {proc.stderr}"
    lines = out.read_bytes().splitlines()
    assert lines, path
    return lines


def convert_tuple(path: pathlib.Path, tmp_path: pathlib.Path) -> dict[str, list[tuple[dict, list[dict]]]]:
    """{table: [(schema document, rows), ...] per version file, in version order}."""
    folder = tmp_path / f"tuple-{path.stem}-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    proc = run_bridge(bridge_cli("convert", str(path), "-o", str(folder / "{table}.jsonl"), "--to", "tuple",
                     "--on-error", "skip"))
    assert proc.returncode in (0, 1), f"dts-bridge convert --to tuple {path} failed: {proc.stderr}"
    out: dict[str, list] = {}
    schemas = sorted(folder.glob("*.schema.json"), key=lambda p: _version_of(p.name))
    for side in schemas:
        doc = json.loads(side.read_text())
        data = side.with_name(side.name[:-len(".schema.json")] + ".jsonl")
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        out.setdefault(doc["table"], []).append((doc, rows))
    assert out, path
    return out


def _version_of(name: str) -> tuple:
    stem = name[:-len(".schema.json")]
    base, _, last = stem.rpartition(".")
    if base and last.startswith("v") and last[1:].isdigit():
        return (base, int(last[1:]))
    return (stem, 1)


# ---- what landed against what must land --------------------------------------------------------

def landed_by_shard_partition(server, topic: str, source: str, value) -> tuple[dict, dict]:
    """{(shard, partition): [value(record)]} and the same with positions, in shard sequence order."""
    return by_shard_partition(server.records(PROJECT, topic), topic, source, value)


def committed_offsets(broker, topic: str, group: str, partitions) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=15)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got}


def end_offsets(broker, topic: str, partitions) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("g-watermarks")})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in partitions}
    finally:
        consumer.close()


def warm_group_coordinator(broker, topic: str) -> None:
    """Wait until the broker's group coordinator answers (a fresh broker answers NOT_COORDINATOR
    for a moment; see test_first_sync_on_a_fresh_broker...)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_name("g-warm")})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                consumer.committed([TopicPartition(topic, 0)], timeout=5)
                return
            except Exception:  # noqa: BLE001 - KafkaException while the coordinator loads
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


def landed_count(server) -> int:
    """Records DataHub acknowledged so far (every topic of the stand-in)."""
    return sum(r.get("records") or 0 for r in list(server.requests)
               if r.get("op") in ("PutRecords", "PutRecordsByShard")
               and (r.get("status") == 200 or "chaos-ack-lost" in (r.get("faults") or ())))


# ---- sync as a subprocess ----------------------------------------------------------------------

class Sync:
    """Starts `dts-bridge sync` with fixed arguments; each run's stdout/stderr go to files."""

    def __init__(self, tmp_path: pathlib.Path, broker, topic: str, group: str, server, *extra: str) -> None:
        self.tmp_path, self.runs = tmp_path, 0
        # one supervised process of the group: a static member id (its own: the tests reuse group
        # names across topics), so a restart after a SIGKILL takes its partitions back at once
        # instead of waiting for the killed member's session to end
        self.args = bridge_cli("sync", "--brokers", broker.bootstrap, "--topic", topic, "--group", group,
                         "--instance-id", f"{group}-{uuid.uuid4().hex[:8]}",
                         "--from-beginning", "--datahub-endpoint", server.endpoint, "--project", PROJECT,
                         "--max-retries", "30", "--status-interval", "0", "--json", *extra)

    def start(self, *more: str) -> tuple[subprocess.Popen, pathlib.Path, pathlib.Path]:
        self.runs += 1
        out = self.tmp_path / f"sync-run-{self.runs}.out"
        err = self.tmp_path / f"sync-run-{self.runs}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen([*self.args, *more], cwd=ROOT, env=ENV, stdout=fo, stderr=fe,
                                    stdin=subprocess.DEVNULL)
        return proc, out, err

    def run(self, *more: str, timeout: float = 180) -> tuple[int, dict, str]:
        proc, out, err = self.start(*more)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"sync run {self.runs} did not end within {timeout} s: {err.read_text()[-3000:]}")
        text = out.read_text()
        report = json.loads(text) if text.strip() else {}
        return code, report, err.read_text()


def no_traceback(err_text: str, what: str) -> None:
    assert "Traceback" not in err_text, f"{what} printed a traceback:\n{err_text[-4000:]}"


def kill_loop(sync: Sync, server, *, kills: int, seed: int, stages: list, produce_stage, max_delay: float,
              max_step: int, log: list, ok_codes: tuple = (0,)) -> list[dict]:
    """SIGKILL `sync` at seeded random points until `kills` runs were killed; before each restart
    the next stage of data (if any) is produced. Kill points: the first run early (once its first
    few records landed), then at random either after a random delay or after a
    random number of further records landed (plus a small random delay), so that kills fall
    during writes, during the restart's tail scan (catch-up) and between them."""
    rng = random.Random(seed)
    done: list[dict] = []
    stages = list(stages)
    attempt = 0
    while len(done) < kills:
        attempt += 1
        assert attempt <= kills * 4, f"only {len(done)} of {kills} kills after {attempt - 1} runs: {log}"
        if attempt > 1 and stages:
            produce_stage(stages.pop(0))
        before = landed_count(server)
        proc, out, err = sync.start()
        started = time.monotonic()
        if attempt == 1:  # early: right after the first run's first records landed
            mode, delay, threshold = "early", rng.uniform(0.0, 0.1), before + rng.randint(1, 8)
        elif rng.random() < 0.5:
            mode, delay, threshold = "time", rng.uniform(0.2, max_delay), None
        else:
            mode, delay, threshold = "landed", rng.uniform(0.0, 0.3), before + rng.randint(1, max_step)
        while proc.poll() is None:
            now = time.monotonic()
            if now - started > 60:
                break
            if threshold is None and now - started >= delay:
                break
            if threshold is not None and landed_count(server) >= threshold:
                time.sleep(delay)
                break
            time.sleep(0.01)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            at = landed_count(server)
            done.append(dict(run=sync.runs, mode=mode, after=round(time.monotonic() - started, 2),
                             landed_in_run=at - before))
            log.append(f"run {sync.runs}: SIGKILL ({mode}) after {done[-1]['after']} s, "
                       f"{at - before} records acknowledged during the run, {at} in all")
        else:
            log.append(f"run {sync.runs}: ended by itself with {proc.returncode} before the kill ({mode})")
            text = out.read_text()
            # exit 1 is fine only for a run that completed and counted rejected records (--on-error skip)
            finished = proc.returncode == 0 or (text.strip() and json.loads(text).get("rejected", 0) > 0)
            assert proc.returncode in ok_codes and finished, \
                f"sync run {sync.runs} failed with {proc.returncode}: {err.read_text()[-3000:]}\n" + "\n".join(log)
        no_traceback(err.read_text(), f"sync run {sync.runs}")
    for stage in stages:
        produce_stage(stage)
    return done


def chaos(server, seed: int, scale: float = 1.0) -> None:
    server.faults.chaos(seed, p_5xx=0.06 * scale, p_throttle=0.08 * scale, p_reset=0.04 * scale,
                        p_ack_lost=0.06 * scale, p_delay=0.2, max_delay=0.08, op=CHAOS_OPS)


# ---- several processes of one consumer group (tests/test_sync_group.py) ------------------------

def sync_args(broker, topic: str, group: str, server, *extra: str, instance_id: str | None = None) -> list[str]:
    """The command line of one `dts-bridge sync` member of `group` (Blob or Tuple by `extra`):
    a static member with `instance_id`, a dynamic one without."""
    static = ["--instance-id", instance_id] if instance_id else []
    return bridge_cli("sync", "--brokers", broker.bootstrap, "--topic", topic, "--group", group, *static,
                      "--from-beginning", "--datahub-endpoint", server.endpoint, "--project", PROJECT,
                      "--max-retries", "30", "--status-interval", "0", "--json", *extra)


def start_process(args: list[str], out: pathlib.Path, err: pathlib.Path, env: dict | None = None) -> subprocess.Popen:
    """`args` started in the repository with stdout and stderr to files (the test environment:
    the stand-in DataHub's credentials)."""
    with open(out, "wb") as fo, open(err, "wb") as fe:
        return subprocess.Popen(args, cwd=ROOT, env=ENV if env is None else env, stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL)


def produce_many(broker, topic: str, stage: list) -> None:
    """`dts-bridge produce` of each (path, partition) of `stage`, at the same time (one process
    per file; the partitions of a stage must differ, so each keeps its files' order)."""
    partitions = [partition for _, partition in stage]
    assert len(set(partitions)) == len(partitions), f"two files for one partition in one stage: {stage}"
    procs = [(path, subprocess.Popen(bridge_cli("produce", str(path), "--brokers", broker.bootstrap, "--topic", topic,
                                                "--partition", str(partition)),
                                     cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for path, partition in stage]
    for path, proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"dts-bridge produce {path.name} failed: {err}"


def group_members(broker, group: str, timeout: float = 10) -> tuple[str, list[dict]]:
    """Kafka's view of a consumer group (AdminClient.describe_consumer_groups): its state and its
    members as {member_id, instance_id, client_id, host, partitions (sorted)}."""
    admin = broker.admin()
    desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout)
    members = [dict(member_id=m.member_id, instance_id=m.group_instance_id, client_id=m.client_id, host=m.host,
                    partitions=sorted(tp.partition for tp in (m.assignment.topic_partitions if m.assignment else [])))
               for m in desc.members]
    return str(getattr(desc.state, "name", desc.state)), members


def group_committed(broker, group: str, topic: str, partitions, timeout: float = 10) -> dict[int, int]:
    """The group's committed offsets of `topic` (AdminClient.list_consumer_group_offsets; -1001:
    none)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    admin = broker.admin()
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])]
    got = admin.list_consumer_group_offsets(request, request_timeout=timeout)[group].result(timeout)
    return {tp.partition: tp.offset for tp in got.topic_partitions}


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int, timeout: float = 2) -> dict[str, dict[tuple, float]]:
    """A run's Prometheus metrics (--metrics-port): {name: {((label, value), ...) sorted: value}}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out
