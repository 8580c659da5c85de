"""`sync --to dts` on DataHub topics another writer filled (issue 40): a user's own pydatahub code
putting `convert`'s lines of samples/mixed.pb (lossless, and strict as DataWorks writes them) on a
Blob topic of 1 or 4 shards, routed by the primary key's hash, with no position attributes. What
lands in Kafka is, per table and in order, exactly what `convert` makes of the same lines.

The writer here is the user's, not the bridge's: pydatahub's `put_records_by_shard` in batches of
a few records per shard, each shard's records in source order, the shard picked by an MD5 of
DataWorks' routing key (the primary key's values, else "db.table"), as a user's script would."""
from __future__ import annotations

import hashlib
import uuid

import pytest

pytest.importorskip("confluent_kafka")
pytest.importorskip("datahub")

from datahub.models import BlobRecord  # noqa: E402

from bridge.blob.encode import BlobEncoder  # noqa: E402
from bridge.datahub.calls import make_client  # noqa: E402
from bridge.options import Options  # noqa: E402
from bridge.samples import build_sample_entries  # noqa: E402
from bridge.stream import ErrorPolicy, blob_lines_to_entries  # noqa: E402
from support.crossing import write_crossing  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.dts_kafka import read_back  # noqa: E402
from support.pipeline import bridge_cli, run_bridge  # noqa: E402
from support.writer_models import dataworks_key  # noqa: E402

PROJECT = "foreign"


def _table(entry) -> str:
    """The stream an Entry keeps order in: its database and table (a DDL without a table: its
    database), as the lines' `schema.source` says."""
    h = entry.header
    return f"{h.schemaName}.{h.tableName}"


def _by_table(entries) -> dict:
    out: dict = {}
    for entry in entries:
        out.setdefault(_table(entry), []).append(entry.SerializeToString())
    return out


def _lines(strict: bool) -> list:
    encoder = BlobEncoder(Options(strict=strict))
    return [line for entry in build_sample_entries()["mixed"] for line in encoder.convert_lines(entry)]


def _users_writer(server, topic: str, lines: list, shards: int) -> None:
    """A user's pydatahub script: route by the key's MD5, put a few records per shard at a time."""
    client = make_client(server.endpoint, "id", "key")
    per: dict = {str(s): [] for s in range(shards)}
    for line in lines:
        shard = int(hashlib.md5(dataworks_key(line).encode()).hexdigest(), 16) % shards
        per[str(shard)].append(BlobRecord(blob_data=line))
    for shard, records in per.items():
        for i in range(0, len(records), 7):
            client.put_records_by_shard(PROJECT, topic, shard, records[i:i + 7])


@pytest.mark.parametrize("shards", [1, 4])
@pytest.mark.parametrize("strict", [False, True], ids=["lossless", "strict"])
def test_sync_to_dts_gives_back_what_convert_makes_of_a_users_lines(kafka_broker, shards, strict):
    lines = _lines(strict)
    policy = ErrorPolicy("fail")
    want = _by_table(e for _, e in blob_lines_to_entries(list(enumerate(lines, 1)), policy, Options()))
    assert policy.tally.rejected == 0 and sum(map(len, want.values())) >= 40
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blobs", shard_count=shards)
        _users_writer(server, "blobs", lines, shards)
        if shards > 1:
            assert all(s["records"] for s in server.shards(PROJECT, "blobs"))  # really spread
        out = kafka_broker.create_topic(f"foreign-{uuid.uuid4().hex[:8]}", partitions=3)
        done = run_bridge(bridge_cli(
            "sync", "--to", "dts", "--datahub-endpoint", server.endpoint, "--project", PROJECT,
            "--datahub-topic", "blobs", "--brokers", kafka_broker.bootstrap, "--topic", out, "--from-beginning",
            "--idle-timeout", "3", "--no-progress", "--status-interval", "0"), timeout=180)
    assert done.returncode == 0, done.stderr
    assert "rejected" not in done.stderr or " 0 rejected" in done.stderr or "rejected 0" in done.stderr, done.stderr
    got = read_back(kafka_broker.bootstrap, out)
    have = _by_table(entry for partition in sorted(got) for entry, _, _ in got[partition])
    assert sorted(have) == sorted(want)
    for table in want:  # each Entry once, byte for byte, in convert's order per table (never sorted)
        assert have[table] == want[table], table


def _crossing(server, topic: str) -> None:
    write_crossing(server, PROJECT, topic)


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_shards_holding_each_other_back_are_decided_and_the_run_ends(kafka_broker, tmp_path, on_error):
    """The issue's stall: heads blocking each other. Under skip the merge hands the oldest head on
    at once, rejects the record that then comes out of order (shard, sequence, why) and the run
    ends on --idle-timeout; under fail it exits 1 naming the stall. Never a spin, never a traceback."""
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "crossing", shard_count=2)
        _crossing(server, "crossing")
        out = kafka_broker.create_topic(f"crossing-{uuid.uuid4().hex[:8]}", partitions=1)
        rejects = tmp_path / "rejects.jsonl"
        extra = ["--on-error", "skip", "--rejects", str(rejects)] if on_error == "skip" else ["--on-error", "fail"]
        done = run_bridge(bridge_cli(
            "sync", "--to", "dts", "--datahub-endpoint", server.endpoint, "--project", PROJECT,
            "--datahub-topic", "crossing", "--brokers", kafka_broker.bootstrap, "--topic", out, "--from-beginning",
            "--idle-timeout", "3", "--no-progress", "--status-interval", "0", "--json", *extra), timeout=120)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    import orjson
    doc = orjson.loads(done.stdout)  # the report ends every run, an error too
    if on_error == "fail":
        assert "the merge stalled" in done.stderr and "shard" in done.stderr, done.stderr
        assert doc["stopped"] == "error: StallError" and "the merge stalled" in doc["error"], doc
        assert "stopped: error: StallError" in done.stderr, done.stderr  # and the summary line
        return
    assert doc["stalls"] >= 1 and doc["rejected"] == 1 and doc["converted"] == 3, doc
    assert doc["input"] == doc["converted"] + doc["rejected"] + doc["not_emitted"], doc
    bad = [orjson.loads(line) for line in rejects.read_bytes().splitlines()]
    assert len(bad) == 1 and bad[0]["kind"] == "OutOfOrderError" and "sequence" in bad[0], bad
    got = read_back(kafka_broker.bootstrap, out)
    assert sum(len(v) for v in got.values()) == 3


@pytest.mark.parametrize("shards,strict", [(4, False), (4, True),
                                           pytest.param(1, False, marks=pytest.mark.deep)],
                         ids=["lossless-4", "strict-4", "lossless-1"])
def test_spark_blob_to_dts_streaming_gives_back_what_convert_makes_of_a_users_lines(spark, tmp_path, shards, strict):
    """The Spark face of the test above: a streaming `format("datahub")` query, micro-batches cut
    inside Entries (maxRecordsPerTrigger), `blob_to_dts` merging the shards in Spark state."""
    import bridge.spark as bs
    from bridge.spark.kafka_sink import entries_of
    from bridge.wire import subscribe_pb2 as pb
    lines = _lines(strict)
    policy = ErrorPolicy("fail")
    want = _by_table(e for _, e in blob_lines_to_entries(list(enumerate(lines, 1)), policy, Options()))
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blobs", shard_count=shards)
        _users_writer(server, "blobs", lines, shards)
        df = (spark.readStream.format("datahub").option("endpoint", server.endpoint).option("project", PROJECT)
              .option("topic", "blobs").option("accessId", "id").option("accessKey", "key")
              .option("maxRecordsPerTrigger", 37).option("settle", 0.2).load())
        name = f"foreign_{uuid.uuid4().hex[:6]}"
        q = (bs.blob_to_dts(df).writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(240)
        assert q.exception() is None, q.exception()
        rows = spark.sql(f"select * from {name}").collect()
    have = _by_table(pb.Entry.FromString(e.SerializeToString()) for e in entries_of(r["value"] for r in rows))
    assert sorted(have) == sorted(want)
    for table in want:
        assert have[table] == want[table], table
