"""The `datahub` Spark data source (bridge/spark_datahub.py, docs/spark.md "Writing to DataHub"):
batch and streaming writes of dts_to_blob / dts_to_tuple rows through the real pydatahub client to
the loopback stand-in DataHub (tests/support/datahub_standin.py), compared with the file
conversion of the same input, per shard, in order; faults injected at the HTTP level; a
micro-batch (and a batch write with an epoch) run again after a failed attempt landed a part.

One local[2] session serves every test (getOrCreate, shared with tests/test_spark.py).
"""
import datetime
import json
import os
import pathlib
import shutil

import orjson
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("datahub")
pytestmark = [pytest.mark.spark, pytest.mark.datahub]

from support.datahub_standin import StandInDataHub  # noqa: E402

import bridge  # noqa: E402
import bridge.spark as bs  # noqa: E402
from bridge import shard_key  # noqa: E402
from bridge.cli import main  # noqa: E402
from bridge.datahub_sink import Position, shard_for, tuple_shard_key  # noqa: E402
from bridge.errors import OptionsError  # noqa: E402
from bridge.spark_datahub import configure  # noqa: E402
from bridge.stream import ErrorPolicy, dts_records_to_entries  # noqa: E402
from bridge.tuple import coerce_row  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIXED = ROOT / "samples" / "mixed.pb"
SHARDS = ["0", "1", "2"]
TOPIC = "dts"


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    session = bs.local_session("bridge-tests")
    session.sparkContext.setLogLevel("OFF")  # expected task failures would print Java stack traces
    bs.register(session)
    return session


@pytest.fixture
def datahub():
    with StandInDataHub() as server:
        server.create_topic("p", "t", shard_count=3)
        yield server
        assert server.errors == []


def envelopes(path=MIXED) -> list[bytes]:
    return [raw for _, _, raw in bridge.read_pb(path)]


def kafka_df(spark, raws, topic=TOPIC, partition=0):
    stamp = datetime.datetime(2021, 5, 17, tzinfo=datetime.timezone.utc)
    rows = [(None, raw, topic, partition, n, stamp) for n, raw in enumerate(raws)]
    return spark.createDataFrame(rows, bs.KAFKA_SCHEMA)


def blob_lines(tmp_path) -> list[bytes]:
    """`dts-bridge convert samples/mixed.pb`: what must land, line for line."""
    out = tmp_path / "mixed.jsonl"
    assert main(["convert", str(MIXED), "-o", str(out), "--no-progress"]) == 0
    return out.read_bytes().splitlines()


def expected_per_shard(lines: list[bytes]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for line in lines:
        out.setdefault(shard_for(shard_key(orjson.loads(line)), SHARDS), []).append(line)
    return out


def landed(server, topic="t") -> dict[str, list[bytes]]:
    """What landed, per shard in sequence order (never sorted)."""
    out: dict[str, list[bytes]] = {}
    for record in server.records("p", topic):
        out.setdefault(record["shard"], []).append(record["data"])
    return out


def sink(df, server, topic="t", **options):
    writer = df.write.format("datahub").mode("append")
    for key, value in dict(endpoint=server.endpoint, project="p", topic=topic, accessId="test-id",
                           accessKey="test-secret", **options).items():
        writer = writer.option(key, str(value))
    return writer


def commits(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def positions_in_order(server, topic="t") -> None:
    """Per shard, the positions of one source and partition only go up."""
    for shard in SHARDS:
        seen: dict[tuple, tuple] = {}
        for record in server.records("p", topic, shard):
            attrs = record["attributes"]
            pos = Position.parse(attrs["dts.pos"])
            key = (attrs["dts.topic"], pos[0])
            assert key not in seen or seen[key] < pos[1:], (shard, key, seen.get(key), pos)
            seen[key] = pos[1:]


# ---- batch ----------------------------------------------------------------------------------

def test_batch_blob_write_equals_the_file_conversion_per_shard(spark, datahub, tmp_path):
    lines = blob_lines(tmp_path)
    log = tmp_path / "commits.jsonl"
    sink(bs.dts_to_blob(kafka_df(spark, envelopes())), datahub, batchSize=7, commitLog=log).save()
    assert landed(datahub) == expected_per_shard(lines)
    records = datahub.records("p", "t")
    assert {r["attributes"]["dts.topic"] for r in records} == {TOPIC}
    assert all("dts.epoch" not in r["attributes"] for r in records)  # a batch write without option epoch
    positions_in_order(datahub)
    (summary,) = commits(log)
    assert (summary["outcome"], summary["rows"], summary["written"], summary["skipped"]) == \
        ("commit", len(lines), len(lines), 0)
    assert summary["requests"] >= len(lines) // 7
