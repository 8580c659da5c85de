"""`dts-bridge sync --to dts` (DataHub -> Kafka DTS Envelopes) as a real process on real parts: the
real Apache Kafka broker with transactions (tests/support/kafka_broker.py) and the stand-in DataHub
over HTTP, with the forward `sync --to blob` writing the DataHub topic first.

The round trip through both pipelines: samples -> Kafka -> `sync --to blob` -> DataHub (3 shards,
so the rows of one Entry and an UPDATE's halves sit on several) -> `sync --to dts` -> Kafka; a
read_committed consumer must see every original Entry once, byte for byte, in source order per
table. The kill loops SIGKILL `sync --to dts` at random moments and restart it: with the reader
threads (the sample is a few pages, under the 32 after which the fetch process starts), and with
`--fetch-process always`, the fetch process of bridge/datahub/prefetch.py serving from the first page;
that one also asks that no fetch process outlives its killed parent.
"""
from __future__ import annotations

import os
import random
import subprocess
import time
import uuid

import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")

from bridge.wire import subscribe_pb2 as pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.dts_kafka import read_back  # noqa: E402
from support.pipeline import ENV, ROOT, bridge_cli, run_bridge  # noqa: E402
from support.sync_runs import entries_of, produce  # noqa: E402

PROJECT = "dts"
SAMPLE = ROOT / "samples" / "mixed.pb"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def table_of(entry: pb.Entry) -> str:
    h = entry.header
    return f"{h.schemaName}.{h.tableName}" if h.tableName else ""


def by_table(entries) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for entry in entries:
        out.setdefault(table_of(entry), []).append(entry.SerializeToString())
    return out


@pytest.fixture(scope="module")
def landed(kafka_broker, tmp_path_factory):
    """The sample written through the forward pipeline into a 3-shard Blob topic of a stand-in."""
    server = StandInDataHub().start()
    source = kafka_broker.create_topic(_name("dts-in"), partitions=1)
    produce(kafka_broker, source, SAMPLE, 0)
    forward = run_bridge(bridge_cli(
        "sync", "--brokers", kafka_broker.bootstrap, "--topic", source, "--group", _name("g"), "--from-beginning",
        "--to", "blob", "--datahub-endpoint", server.endpoint, "--project", PROJECT, "--datahub-topic", "blobs",
        "--shards", "3", "--idle-timeout", "2", "--no-progress", "--status-interval", "0"), timeout=180)
    assert forward.returncode == 0, forward.stderr
    per_shard = [s["records"] for s in server.shards(PROJECT, "blobs")]
    assert len(per_shard) == 3 and all(per_shard), per_shard  # the records really are spread
    yield server
    server.stop()


def back(kafka_broker, server, topic: str, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return run_bridge(bridge_cli(
        "sync", "--to", "dts", "--datahub-endpoint", server.endpoint, "--project", PROJECT, "--datahub-topic",
        "blobs", "--brokers", kafka_broker.bootstrap, "--topic", topic, "--from-beginning", "--idle-timeout", "3",
        "--no-progress", "--status-interval", "0", "--commit-interval", "0.5", *extra), timeout=timeout)


def assert_round_trip(kafka_broker, topic: str) -> None:
    got = read_back(kafka_broker.bootstrap, topic)
    entries = [entry for partition in sorted(got) for entry, _, _ in got[partition]]
    want = by_table(entries_of(SAMPLE))
    have = by_table(entries)
    assert sorted(have) == sorted(want)
    for table in want:  # each Entry once, byte for byte, in source order per table
        assert have[table] == want[table], table


def test_round_trip_through_both_pipelines(kafka_broker, landed):
    topic = kafka_broker.create_topic(_name("dts-back"), partitions=3)
    done = back(kafka_broker, landed, topic, "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert_round_trip(kafka_broker, topic)


def test_killed_and_restarted_delivers_each_entry_once(kafka_broker, landed):
    """SIGKILL at random moments (five at least), then a run to the end: a read_committed consumer
    sees each Entry once, in order per table (transactions: records and positions together)."""
    topic = kafka_broker.create_topic(_name("dts-kill"), partitions=3)
    rng = random.Random(int(ENV.get("SYNC_TEST_SEED", "1729")))
    args = ["sync", "--to", "dts", "--datahub-endpoint", landed.endpoint, "--project", PROJECT, "--datahub-topic",
            "blobs", "--brokers", kafka_broker.bootstrap, "--topic", topic, "--from-beginning", "--idle-timeout", "3",
            "--no-progress", "--status-interval", "0", "--commit-interval", "0.2"]
    kills = 0
    for _ in range(5):
        proc = subprocess.Popen(bridge_cli(*args), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(1.0, 4.0))  # start-up (imports, init_transactions) is about a second
        if proc.poll() is None:
            proc.kill()
            kills += 1
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err, err
    done = back(kafka_broker, landed, topic)
    assert done.returncode == 0, done.stderr
    assert kills >= 3, f"only {kills} runs were still running when killed"
    assert_round_trip(kafka_broker, topic)


# the fetch process's command line loads bridge/datahub/prefetch.py under this module name
FETCH_MODULE = "_dts_bridge_datahub_fetch"
RUN_TAG = "DTS_BRIDGE_TEST_RUN"  # set in a run's environment, so its processes are found after it died


def processes_tagged(tag: str) -> dict[int, tuple[int, str]]:
    """The live processes (zombies are dead) started with RUN_TAG=tag in their environment, a
    parent's and its children's: pid -> (parent pid, command line)."""
    want = f"{RUN_TAG}={tag}".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if state != b"Z":
            found[int(name)] = (int(ppid), cmdline)
    return found


def talks_to(pid: int, port: int) -> bool:
    """Whether process `pid` holds a TCP connection to 127.0.0.1:`port` (the stand-in's HTTP/1.1
    keeps a client's connection open after its first request)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return False
    return any(row[9] in inodes and row[2] == f"0100007F:{port:04X}" for row in rows)


def test_killed_with_the_fetch_process_delivers_each_entry_once_and_leaves_no_fetch_process(kafka_broker, landed):
    """--fetch-process always: the pages come through the fetch process from the start. SIGKILL at
    random moments once it runs (six rounds, three kills at least that hit it running), then a run to
    the end: a read_committed consumer sees each Entry once, in order per table; every process of a
    killed run (its fetch process above all) is gone within 5 s of the kill (the fetch process ends
    when its stdin, the parent's pipe, closes); and the fetch process did fetch (it held a connection
    to the stand-in DataHub: in two runs at least, a kill may come before its first request), so
    threads alone would not pass. (The sample is one page a shard: the reader threads often fetch
    it while the process starts, and the process serves the shards' looks at their end.)"""
    topic = kafka_broker.create_topic(_name("dts-kill-fetch"), partitions=3)
    rng = random.Random(int(ENV.get("SYNC_TEST_SEED", "1729")) + 1)
    args = ["sync", "--to", "dts", "--datahub-endpoint", landed.endpoint, "--project", PROJECT, "--datahub-topic",
            "blobs", "--brokers", kafka_broker.bootstrap, "--topic", topic, "--from-beginning", "--idle-timeout", "3",
            "--no-progress", "--status-interval", "0", "--commit-interval", "0.2", "--fetch-process", "always"]
    kills = fetching = 0
    for _ in range(6):
        tag = uuid.uuid4().hex
        proc = subprocess.Popen(bridge_cli(*args), cwd=ROOT, env=dict(ENV, **{RUN_TAG: tag}),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        fetchers: dict[int, bool] = {}  # the fetch process(es) seen -> whether it talked to DataHub
        kill_at, give_up = None, time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < give_up:
            for pid, (ppid, cmdline) in processes_tagged(tag).items():
                if ppid == proc.pid and FETCH_MODULE in cmdline:
                    fetchers[pid] = fetchers.get(pid, False) or talks_to(pid, landed.port)
            if fetchers and kill_at is None:  # a random moment of the run with its fetch process
                kill_at = time.monotonic() + rng.uniform(0.3, 2.5)
            if kill_at is not None and time.monotonic() >= kill_at:
                break
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            if fetchers:
                kills += 1
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err, err
        fetching += any(fetchers.values())
        deadline = time.monotonic() + 5
        while (left := processes_tagged(tag)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"outlived their SIGKILLed parent {proc.pid} by 5 s: {left}"
    done = back(kafka_broker, landed, topic, "--fetch-process", "always")
    assert done.returncode == 0, done.stderr
    assert kills >= 3, f"only {kills} runs were killed while their fetch process ran"
    assert fetching >= 2, f"only {fetching} runs' fetch process talked to DataHub"
    assert_round_trip(kafka_broker, topic)
