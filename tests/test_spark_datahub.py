"""The `datahub` Spark data source (bridge/spark/sink.py, docs/spark.md "Writing to DataHub"):
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
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("datahub")
pytestmark = [pytest.mark.spark, pytest.mark.datahub]

import bridge  # noqa: E402
import bridge.spark as bs  # noqa: E402
from bridge.cli.main import main  # noqa: E402
from bridge.datahub.sink import Position, shard_for, tuple_shard_key  # noqa: E402
from bridge.errors import OptionsError  # noqa: E402
from bridge.spark.sink import configure  # noqa: E402
from bridge.stream import ErrorPolicy, dts_records_to_entries  # noqa: E402
from bridge.tuple import coerce_row  # noqa: E402
from bridge.wire.framing import pack_entries  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import SHARDS, expected_per_shard, landed_per_shard  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIXED = ROOT / "samples" / "mixed.pb"
TOPIC = "dts"


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
    assert landed_per_shard(datahub) == expected_per_shard(lines)
    records = datahub.records("p", "t")
    assert {r["attributes"]["dts.topic"] for r in records} == {TOPIC}
    assert all("dts.epoch" not in r["attributes"] for r in records)  # a batch write without option epoch
    positions_in_order(datahub)
    (summary,) = commits(log)
    assert (summary["outcome"], summary["rows"], summary["written"], summary["skipped"]) == \
        ("commit", len(lines), len(lines), 0)
    assert summary["requests"] >= len(lines) // 7


def test_batch_blob_write_is_exact_through_throttling_5xx_and_lost_answers(spark, datahub, tmp_path):
    lines = blob_lines(tmp_path)
    datahub.faults.chaos(11, p_5xx=0.1, p_throttle=0.1, p_reset=0.05, p_ack_lost=0.15)
    sink(bs.dts_to_blob(kafka_df(spark, envelopes())), datahub, batchSize=5, workers=3).save()
    assert datahub.faults.count("chaos-ack-lost") >= 1  # records landed whose answer was lost
    assert datahub.faults.count() >= 4
    assert landed_per_shard(datahub) == expected_per_shard(lines)  # each once, in order


def test_a_batch_write_run_again_with_its_epoch_writes_only_what_did_not_land(spark, datahub, tmp_path):
    """The first run dies when an answer is lost (maxRetries 0) after some requests landed; the
    same write with the same epoch finds those records on the shards' tails and skips them."""
    lines = blob_lines(tmp_path)
    log = tmp_path / "commits.jsonl"
    df = bs.dts_to_blob(kafka_df(spark, envelopes()))
    datahub.faults.chaos(7, p_ack_lost=0.1)  # the 13th PutRecordsByShard lands and loses its answer
    with pytest.raises(Exception, match="giving up"):
        sink(df, datahub, batchSize=5, maxRetries=0, epoch=3, commitLog=log).save()
    first = len(datahub.records("p", "t"))
    assert 0 < first < len(lines)
    datahub.faults.chaos(None)
    sink(df, datahub, batchSize=5, epoch=3, commitLog=log).save()
    assert landed_per_shard(datahub) == expected_per_shard(lines)
    *_, summary = commits(log)
    assert (summary["outcome"], summary["epoch"], summary["skipped"], summary["written"]) == \
        ("commit", 3, first, len(lines) - first)
    assert {r["attributes"]["dts.epoch"] for r in datahub.records("p", "t")} == {"3"}


def test_a_task_run_again_with_its_epoch_writes_only_the_rest():
    """The task's write function itself, without Spark: Arrow batches of dts_to_blob rows; the first
    attempt dies while reading its input (as a killed task does), the second writes the rest."""
    import pyarrow as pa

    from bridge.spark.jobs import BLOB_COLUMNS
    from bridge.spark.sink import write_batches

    raws = envelopes()
    kafka = pa.RecordBatch.from_pydict({"topic": [TOPIC] * len(raws), "partition": [0] * len(raws),
                                        "offset": list(range(len(raws))), "value": raws})
    rows = pa.Table.from_batches(list(bs.dts_to_blob_batches(arrow=True)(iter([kafka])))).to_batches(max_chunksize=10)
    lines = [v.encode() for b in rows for v in b.column("blob").to_pylist()]
    with StandInDataHub() as server:
        server.create_topic("p", "t", shard_count=3)
        config = configure(dict(endpoint=server.endpoint, project="p", topic="t", accessId="i", accessKey="k",
                                batchSize="4"), BLOB_COLUMNS, streaming=True)

        def dies_after(n):
            yield from rows[:n]
            while len(server.records("p", "t")) < 10:  # dies once a part of what it put landed
                time.sleep(0.01)
            raise RuntimeError("task killed")
        with pytest.raises(RuntimeError, match="task killed"):
            write_batches(config, dies_after(6), epoch=8)
        first = len(server.records("p", "t"))
        assert 0 < first < len(lines)
        report = write_batches(config, iter(rows), epoch=8)
        assert (report["skipped"], report["written"], report["epoch"]) == (first, len(lines) - first, 8)
        assert landed_per_shard(server) == expected_per_shard(lines)
        positions_in_order(server)


def test_a_row_without_its_position_is_named_by_its_own_place_not_the_row_before():
    """The task's loop (TaskRows -> TaskRecords -> RowsTask): a row missing its offset stops the
    task with the sink's error, located by what the row has (its partition), never by the row
    written before it."""
    import pyarrow as pa

    from bridge.errors import ConversionError
    from bridge.spark.jobs import BLOB_COLUMNS
    from bridge.spark.sink import write_batches
    names = [n for n, _ in BLOB_COLUMNS]
    good = dict(topic=TOPIC, partition=0, offset=7, entry=0, row=0, sequence_id="1", op="INSERT", db="d",
                table="t", shard_key="k", event_time=None, blob='{"a": 1}')
    bad = dict(good, partition=1, offset=None)
    schema = pa.schema([(n, pa.timestamp("us") if n == "event_time" else pa.int32()
                         if n in ("partition", "entry", "row") else pa.int64() if n == "offset" else pa.string())
                        for n in names])
    batches = [pa.RecordBatch.from_pylist([good], schema=schema), pa.RecordBatch.from_pylist([bad], schema=schema)]
    with StandInDataHub() as server:
        server.create_topic("p", "t", shard_count=1)
        config = configure(dict(endpoint=server.endpoint, project="p", topic="t", accessId="i", accessKey="k"),
                           BLOB_COLUMNS, streaming=True)
        with pytest.raises(ConversionError, match="a row without its position") as caught:
            write_batches(config, iter(batches), epoch=1)
    assert caught.value.where.get("partition") == 1 and "offset" not in caught.value.where, caught.value.where


def test_tuple_batch_write_to_a_created_topic_per_table(spark, datahub, tmp_path):
    folder = tmp_path / "tuple"
    main(["convert", str(MIXED), "-o", str(folder / "{table}.jsonl"), "--to", "tuple", "--on-error", "skip",
          "--no-progress"])
    side = json.loads((folder / "hr.employees.schema.json").read_text())
    fields = [(f["name"], f["type"]) for f in side["fields"]]
    rows = [coerce_row(json.loads(line), fields) for line in (folder / "hr.employees.jsonl").read_text().splitlines()]
    keys = [c["name"] for c in side["dtsColumns"] if c.get("isKey")]
    df = bs.dts_to_tuple(kafka_df(spark, envelopes()), "hr.employees", {"fields": side["fields"]}, positions=True)
    sink(df, datahub, topic="{db}_{table}", table="hr.employees", keyColumns=",".join(keys), createTopics="true",
         shards=3, batchSize=3).save()
    (project,) = datahub.dump_state()["projects"]
    (topic,) = [t for t in project["topics"] if t["name"] == "hr_employees"]
    assert [(f["name"], f["type"].upper()) for f in topic["fields"]] == fields  # created from the Spark types
    assert len(topic["shards"]) == 3
    want: dict[str, list] = {}
    for row in rows:
        want.setdefault(shard_for(tuple_shard_key(row, "hr.employees", keys), SHARDS), []).append(
            [row[name] for name, _ in fields])
    got: dict[str, list] = {}
    for record in datahub.records("p", "hr_employees"):
        got.setdefault(record["shard"], []).append(record["values"])
    assert got == want
    assert len(got) > 1  # the key spreads the table over shards
    positions_in_order(datahub, "hr_employees")


# ---- streaming ------------------------------------------------------------------------------

def entries_starts(raws) -> list[int]:
    """The offsets where an Entries begins (its first Envelope segment)."""
    entries = dts_records_to_entries([(0, n, raw) for n, raw in enumerate(raws)], ErrorPolicy("fail"))
    return sorted({where["offset"] for where, _ in entries})


def small_envelopes() -> list[bytes]:
    """mixed.pb's Entries packed into Envelopes of at most 2 KB (16 Kafka records, where the sample
    has 2): the same Blob messages, with room to cut the stream between Entries."""
    entries = dts_records_to_entries([(0, n, raw) for n, raw in enumerate(envelopes())], ErrorPolicy("fail"))
    return [env.SerializeToString() for env in pack_entries([entry for _, entry in entries], 2048)]


def kafka_files(folder: pathlib.Path, raws, parts: int) -> int:
    """The records as `parts` parquet files of Kafka-shaped rows, cut where an Entries begins, with
    increasing modification times (the file source's order): one micro-batch each."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    starts = entries_starts(raws)
    cuts = sorted({min(starts, key=lambda s: abs(s - len(raws) * k // parts)) for k in range(1, parts)} - {0})
    folder.mkdir()
    stamp = datetime.datetime(2021, 5, 17, tzinfo=datetime.timezone.utc)
    for i, (lo, hi) in enumerate(zip([0] + cuts, cuts + [len(raws)])):
        table = pa.table({"key": pa.array([None] * (hi - lo), pa.binary()), "value": pa.array(raws[lo:hi], pa.binary()),
                          "topic": [TOPIC] * (hi - lo), "partition": pa.array([0] * (hi - lo), pa.int32()),
                          "offset": pa.array(range(lo, hi), pa.int64()),
                          "timestamp": pa.array([stamp] * (hi - lo), pa.timestamp("us", tz="UTC"))})
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + i * 10, 1_700_000_000 + i * 10))
    return len(cuts) + 1


def run_stream(spark, server, folder, checkpoint, **options):
    stream = spark.readStream.schema(bs.KAFKA_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))
    # Each file ends where an Entries ends, so the per-partition function alone converts each
    # micro-batch exactly (dts_to_blob on a stream adds the state that carries unfinished Entries
    # from one micro-batch to the next, tested in tests/test_spark.py, and costs a shuffle).
    blob = stream.select("topic", "partition", "offset", "value").mapInArrow(
        bs.dts_to_blob_batches(arrow=True), bs.blob_schema())
    writer = blob.writeStream.format("datahub").option("checkpointLocation", str(checkpoint))
    for key, value in dict(endpoint=server.endpoint, project="p", topic="t", accessId="test-id",
                           accessKey="test-secret", **options).items():
        writer = writer.option(key, str(value))
    query = writer.trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(240), "the stream did not finish"
    finally:
        query.stop()


def test_streaming_write_over_several_micro_batches(spark, datahub, tmp_path):
    lines = blob_lines(tmp_path)
    files = kafka_files(tmp_path / "in", small_envelopes(), 4)
    log = tmp_path / "commits.jsonl"
    run_stream(spark, datahub, tmp_path / "in", tmp_path / "ckpt", batchSize=6, commitLog=log)
    assert landed_per_shard(datahub) == expected_per_shard(lines)
    summaries = commits(log)
    assert [s["batch"] for s in summaries] == list(range(files)) and files == 4
    assert all(s["outcome"] == "commit" and s["written"] > 0 and s["skipped"] == 0 for s in summaries)
    assert sum(s["written"] for s in summaries) == len(lines)
    # each record carries its micro-batch: the batches' offsets follow one another
    epochs = [(int(r["attributes"]["dts.epoch"]), Position.parse(r["attributes"]["dts.pos"])[1])
              for r in datahub.records("p", "t")]
    assert {e for e, _ in epochs} == set(range(files))
    for e in range(files - 1):
        assert max(o for b, o in epochs if b == e) < min(o for b, o in epochs if b == e + 1)


def test_a_micro_batch_replayed_after_a_failure_lands_nothing_twice(spark, datahub, tmp_path):
    """The query dies in a micro-batch after a part of it landed (an answer lost, no retries);
    restarted from its checkpoint, Spark runs that micro-batch again with the same id and
    rows, and the writer skips what the failed attempt wrote."""
    lines = blob_lines(tmp_path)
    kafka_files(tmp_path / "in", small_envelopes(), 4)
    log = tmp_path / "commits.jsonl"
    datahub.faults.chaos(14, p_ack_lost=0.1)  # the 15th PutRecordsByShard lands and loses its answer
    with pytest.raises(Exception, match="giving up"):
        run_stream(spark, datahub, tmp_path / "in", tmp_path / "ckpt", batchSize=5, maxRetries=0, commitLog=log)
    done = [s for s in commits(log) if s["outcome"] == "commit"]
    before = len(datahub.records("p", "t"))
    # which micro-batch holds the 15th request depends on how full the requests were; some landed
    assert len(done) < 4 and sum(s["written"] for s in done) < before < len(lines)
    failed = len(done)  # the id of the micro-batch that failed
    datahub.faults.chaos(None)
    run_stream(spark, datahub, tmp_path / "in", tmp_path / "ckpt", batchSize=5, commitLog=log)
    assert landed_per_shard(datahub) == expected_per_shard(lines)
    replayed = [s for s in commits(log) if s["outcome"] == "commit" and s["batch"] == failed]
    assert len(replayed) == 1 and replayed[0]["skipped"] == before - sum(s["written"] for s in done) > 0
    assert [s["batch"] for s in commits(log) if s["outcome"] == "commit"] == [0, 1, 2, 3]
    positions_in_order(datahub)


# ---- options, checked on the driver before any task runs ------------------------------------

BLOB_INPUT = [(n, "string") for n in ("topic", "shard_key", "blob")] + [("partition", "int"), ("offset", "bigint"),
                                                                          ("entry", "int"), ("row", "int")]
TUPLE_INPUT = [("topic", "string"), ("partition", "int"), ("offset", "bigint"), ("entry", "int"), ("row", "int"),
               ("id", "bigint"), ("at", "timestamp"), ("price", "decimal(10,2)"), ("error", "string")]
BASE = {"endpoint": "http://127.0.0.1:9", "project": "p", "topic": "t"}


@pytest.mark.parametrize("options, columns, streaming, overwrite, message", [
    ({}, BLOB_INPUT, False, True, "only appends"),
    ({"epoch": "4"}, BLOB_INPUT, True, False, "option 'epoch' is for batch writes"),
    ({"batchsise": "10"}, BLOB_INPUT, False, False, "did you mean 'batchSize'"),
    ({"routing": "partition-key"}, BLOB_INPUT, False, False, "option 'routing'"),
    ({"maxRetries": "-1"}, BLOB_INPUT, False, False, "option 'maxRetries'"),
    ({"createTopics": "yes"}, BLOB_INPUT, False, False, "option 'createTopics'"),
    ({}, BLOB_INPUT[1:3], False, False, "position columns"),
    ({"topic": "{db}_{table}"}, BLOB_INPUT, False, False, "Blob rows go to one topic"),
    ({"keyColumns": "id"}, BLOB_INPUT, False, False, "for Tuple rows"),
    ({}, TUPLE_INPUT, False, False, "option 'keyColumns'"),
    ({"keyColumns": "id,nope"}, TUPLE_INPUT, False, False, "columns the rows do not have"),
    ({"topic": "{db}_{table}", "keyColumns": "id"}, TUPLE_INPUT, False, False, "set option 'table'"),
    ({"table": "orders"}, TUPLE_INPUT, False, False, "db.table"),
    ({"table": "shop.orders"}, TUPLE_INPUT + [("tags", "array<string>")], False, False, "no DataHub field type"),
])
def test_options_are_checked_up_front(options, columns, streaming, overwrite, message):
    with pytest.raises(OptionsError, match=message):
        configure({**BASE, **options}, columns, streaming=streaming, overwrite=overwrite)


def test_tuple_rows_take_their_fields_from_the_columns():
    config = configure({**BASE, "TOPIC": "{db}_{table}", "table": "shop.orders", "KeyColumns": "id"}, TUPLE_INPUT,
                       streaming=True)
    assert config.kind == "TUPLE" and config.template and config.options["keyColumns"] == ("id",)
    assert config.record_schema == {"fields": [{"name": "id", "type": "BIGINT"}, {"name": "at", "type": "TIMESTAMP"},
                                               {"name": "price", "type": "DECIMAL"}]}
    assert config.timestamps == ("at",)
    with pytest.raises(OptionsError, match="needs the option 'endpoint'"):
        configure({"project": "p", "topic": "t"}, BLOB_INPUT, streaming=False)


def test_doctests():
    import doctest

    import bridge.spark.sink
    assert doctest.testmod(bridge.spark.sink).failed == 0


def test_import_does_not_load_pyspark():
    import subprocess
    import sys
    code = "import sys, bridge.spark.sink; assert 'pyspark' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ---- kill -9 --------------------------------------------------------------------------------

DRIVER = """
import sys
import bridge.spark as bs
endpoint, folder, checkpoint, log = sys.argv[1:5]
spark = bs.local_session("datahub-kill")
spark.sparkContext.setLogLevel("OFF")
bs.register(spark)
stream = spark.readStream.schema(bs.KAFKA_SCHEMA).option("maxFilesPerTrigger", 1).parquet(folder)
blob = stream.select("topic", "partition", "offset", "value").mapInArrow(bs.dts_to_blob_batches(arrow=True),
                                                                         bs.blob_schema())
query = (blob.writeStream.format("datahub").option("checkpointLocation", checkpoint)
         .option("endpoint", endpoint).option("project", "p").option("topic", "t").option("accessId", "i")
         .option("accessKey", "k").option("batchSize", 2).option("commitLog", log)
         .trigger(availableNow=True).start())
query.awaitTermination()
print("finished", flush=True)
"""

@pytest.mark.deep  # two Spark drivers, a minute or more: make test-deep
def test_a_streaming_query_killed_with_sigkill_and_restarted_lands_every_record_once(datahub, tmp_path):
    """The whole driver (Python, JVM, Python workers) killed with SIGKILL once records of the
    stream started landing, then started again on its checkpoint: every record once, in order."""
    import signal
    import subprocess
    import sys
    lines = blob_lines(tmp_path)
    files = kafka_files(tmp_path / "in", small_envelopes(), 8)
    script, log = tmp_path / "driver.py", tmp_path / "commits.jsonl"
    script.write_text(DRIVER)
    args = [sys.executable, str(script), datahub.endpoint, str(tmp_path / "in"), str(tmp_path / "ckpt"), str(log)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    datahub.faults.delay("PutRecordsByShard", 0.1)  # a window to kill in
    first = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while len(datahub.records("p", "t")) < 40 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait()
    at_kill = len(datahub.records("p", "t"))
    committed = [s["batch"] for s in commits(log) if s["outcome"] == "commit"]
    assert 0 < at_kill < len(lines) and len(committed) < files, (at_kill, committed)
    datahub.faults.clear()
    second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "finished" in second.stdout, second.stderr[-3000:]
    assert landed_per_shard(datahub) == expected_per_shard(lines)
    positions_in_order(datahub)
    after = [s for s in commits(log) if s["outcome"] == "commit"]
    assert sorted({s["batch"] for s in after}) == list(range(files))
    # every record landed once: written by a committed attempt, or by the killed one and skipped by its replay
    assert sum(s["written"] + s["skipped"] for s in after) == len(lines)
    print(f"\n[killed with {at_kill} records landed, after micro-batches {committed}; the replay skipped "
          f"{sum(s['skipped'] for s in after)}]")
