"""`dts-bridge sync --to dts` (DataHub -> Kafka DTS Envelopes) as a real process on real parts: the
real Apache Kafka broker with transactions (tests/support/kafka_broker.py) and the stand-in DataHub
over HTTP, with the forward `sync --to blob` writing the DataHub topic first.

The round trip through both pipelines: samples -> Kafka -> `sync --to blob` -> DataHub (3 shards,
so the rows of one Entry and an UPDATE's halves sit on several) -> `sync --to dts` -> Kafka; a
read_committed consumer must see every original Entry once, byte for byte, in source order per
table. The kill loop SIGKILLs `sync --to dts` at random moments and restarts it.
"""
from __future__ import annotations

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
