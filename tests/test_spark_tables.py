"""A whole database into DataHub from Spark (docs/spark.md, "A whole database"): `bridge.spark.dts_entries`
and the `datahub` sink's whole-database mode (bridge/spark/tables.py, docs/spark.md "A whole
database"), on the real Kafka broker (`dts-kafka`) and the stand-in DataHub.

The input is the sync tests' whole-database stream (tests/support/table_stream.py: CREATE, ALTER ADD /
DROP / RENAME / MODIFY COLUMN of shop.orders, a poisoned table bad.poison, a 2 MB row in shop.big), packed into Envelopes of 300
bytes (the 2 MB Entry into 512 KB ones, under the broker's 1 MB) so that many Entries are split,
and produced into both partitions of one Kafka topic: two Spark tasks then convert the same tables, evolve the same topics
and write the same shards at once. What lands is put beside `dts-bridge convert --to tuple` of the
very file, per (DataHub shard, Kafka partition), in order (support.table_stream.expected_topics
applies the policy), and the dead-letter topic must hold exactly the Entries the policy leaves out,
once per Kafka partition.

- test_task_function_two_partitions_at_once: the sink's task function (`write_batches`) run by two
  threads at once on dts_entries rows, evolve + dlq, its dead letters exported and replayed; no
  Spark, a few seconds.
- test_streaming_stopped_mid_run_and_restarted: dts-kafka with maxOffsetsPerTrigger (micro-batch
  ends inside split Entries, checked in the offset log) -> dts_entries -> writeStream datahub,
  evolve + dlq, stopped mid-run and restarted from its checkpoint (make test-deep: make test has the
  same pipeline in a driver process killed with SIGKILL and restarted, tests/test_spark_tables_kill.py).
- test_streaming_lenient_deep: the same under lenient + dlq, in larger micro-batches (make test-deep).
- test_halt_table_across_micro_batches_and_a_replay: the task function over two epochs, the second
  run twice, halt-table.
- test_records_datahub_refuses_are_dead_letters, test_schema_change_fail_names_table_and_position,
  test_options_are_checked_up_front, test_dts_entries_output_and_options.
- test_driver_killed_with_sigkill_and_restarted_deep: the whole driver killed twice (make test-deep).
"""
from __future__ import annotations

import base64
import collections
import json
import threading
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = [pytest.mark.spark, pytest.mark.datahub]


import bridge.spark as bs  # noqa: E402
from bridge.datahub.sink import (  # noqa: E402
    DataHubError,
    DataHubWriter,
    Position,
    make_client,  # noqa: E402
)
from bridge.errors import ConversionError, OptionsError  # noqa: E402
from bridge.spark.jobs import _batch_function  # noqa: E402
from bridge.spark.sink import configure, write_batches  # noqa: E402
from bridge.spark.streaming import PROVIDER_CONF, ROCKSDB  # noqa: E402
from bridge.spark.tables import ENTRY_COLUMNS, _DtsToEntries  # noqa: E402
from bridge.sync import topic_name  # noqa: E402
from bridge.wire import subscribe_pb2 as pb  # noqa: E402
from bridge.wire.framing import pack_entries, write_pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.pipeline import ENV, ROOT, bridge_cli, run_bridge  # noqa: E402
from support.spark_driver import _split_ranges, _two_task_name, checkpoint_cuts, kill_loop, straddling_cuts  # noqa: E402
from support.sync_runs import PROJECT, convert_tuple  # noqa: E402
from support.table_stream import build_stream, check_topics, expected_dead  # noqa: E402

LETTERS = "dead_letters"
PARTITIONS = (0, 1)


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """(Envelopes, facts, {table: [(partition, versions)]} of `dts-bridge convert --to tuple`)."""
    entries, facts = build_stream(rounds=6)
    big = next(i for i, e in enumerate(entries) if e.header.seqId in facts["big"])
    envelopes = [env.SerializeToString() for env in
                 [*pack_entries(entries[:big], 300), *pack_entries(entries[big:big + 1], 1 << 19),
                  *pack_entries(entries[big + 1:], 300)]]
    folder = tmp_path_factory.mktemp("tables")
    path = folder / "tables.pb"
    with open(path, "wb") as out:
        write_pb(out, (pb.Envelope.FromString(raw) for raw in envelopes))
    converted = collections.defaultdict(list)
    for table, versions in convert_tuple(path, folder).items():
        for partition in PARTITIONS:
            converted[table].append((partition, versions))
    return envelopes, facts, converted


@pytest.fixture(scope="module")
def kafka_topic(kafka_broker, stream):
    """The stream in both partitions of a topic whose partitions run in two Spark tasks."""
    from confluent_kafka import Producer
    envelopes = stream[0]
    name = kafka_broker.create_topic(_two_task_name("tables"), partitions=len(PARTITIONS))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    failed = []
    for partition in PARTITIONS:
        for raw in envelopes:
            producer.produce(name, raw, partition=partition, on_delivery=lambda err, _: err and failed.append(err))
    assert producer.flush(60) == 0 and not failed, failed
    return name


def sink_options(server, **more) -> dict:
    return {**dict(endpoint=server.endpoint, project=PROJECT, accessId="test-id", accessKey="test-secret", to="tuple",
                   topic="{db}_{table}", createTopics="true", shards=2, batchSize=8, deadLetters=LETTERS,
                   onTableError="dlq", oversized="dlq"), **more}


# ---- what must land ------------------------------------------------------------------------------

def check_letters(server, source: str, dead: set[int], context: str, partitions=PARTITIONS) -> list[dict]:
    """The dead-letter topic: per Kafka partition, exactly the expected Entries (by seqId), once
    each, the Entry's bytes whole, in stream order per (shard, partition)."""
    seen = collections.Counter()
    letters = []
    for record in server.records(PROJECT, LETTERS):
        letter = json.loads(record["data"])
        entry = pb.Entry.FromString(base64.b64decode(letter["entry_base64"]))
        assert f"{entry.header.schemaName}.{entry.header.tableName}" == letter["table"], letter["table"]
        assert letter["source"] == source and letter["error"], letter
        assert letter["datahub_topic"] == topic_name("{db}_{table}", *letter["table"].split(".", 1)), letter
        assert record["attributes"]["dts.pos"] == (f"{letter['partition']}:{letter['offset']}:{letter['entry']}:"
                                                   f"{-1 if letter['row'] is None else letter['row']}")
        seen[(letter["partition"], entry.header.seqId, letter["row"])] += 1
        letters.append(letter)
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"dead letters written twice: {twice}\n{context}"
    assert {p for p, _, _ in seen} <= set(partitions), seen
    for partition in partitions:
        got = {seq for p, seq, _ in seen if p == partition}
        assert got == dead, (f"partition {partition}: {len(got - dead)} unexpected dead letters "
                             f"{sorted(got - dead)[:10]}, {len(dead - got)} missing {sorted(dead - got)[:10]}\n{context}")
    return letters


def check_all(server, source: str, stream, schema_change: str, context: str, table_error: str = "dlq",
              partitions=PARTITIONS) -> str:
    _, facts, converted = stream
    converted = {t: [v for v in versions if v[0] in partitions] for t, versions in converted.items()}
    dead = expected_dead(facts, schema_change, table_error)
    letters = check_letters(server, source, dead, context, partitions)
    # then the tables, as tests/test_sync_tables.py checks sync's (which lists no other topic)
    make_client(server.endpoint, "test-id", "test-secret").delete_topic(PROJECT, LETTERS)
    compared = check_topics(server, source, converted, schema_change, dead, context)
    return f"{compared} rows compared, {len(letters)} dead letters"


# ---- the task function, two tasks at once --------------------------------------------------------

def entry_batches(envelopes, topic: str, partition: int):
    """dts_entries' rows of one Kafka partition (its per-partition function), as Arrow batches of 40."""
    import pyarrow as pa
    kafka = pa.RecordBatch.from_pydict({"topic": [topic] * len(envelopes), "partition": [partition] * len(envelopes),
                                        "offset": list(range(len(envelopes))), "value": envelopes})
    rows = _batch_function(lambda: _DtsToEntries("FAILFAST"), True, None)(iter([kafka]))
    return pa.Table.from_batches(list(rows)).to_batches(max_chunksize=40)


def test_task_function_two_partitions_at_once(stream, tmp_path):
    """Two threads run the sink's task function at once, one per Kafka partition of the same
    stream (as two Spark tasks of a micro-batch): both evolve the same topics (an AppendField the
    other just made is taken as done; records built on the RecordSchema before it take NULL for
    the new field) and write the same shards. The dead letters exported to a file go through
    `dts-bridge replay --from-dlq` under lenient: the MODIFY'd Entries land, the poisoned and the
    oversized ones are still rejected."""
    envelopes = stream[0]
    with StandInDataHub() as server:
        config = configure(sink_options(server), ENTRY_COLUMNS, streaming=True)
        reports, errors = {}, []

        def task(partition):
            try:
                reports[partition] = write_batches(config, iter(entry_batches(envelopes, "dts", partition)), epoch=0)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        threads = [threading.Thread(target=task, args=(p,)) for p in PARTITIONS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not errors, errors
        exported = bs.export_dead_letters(make_client(server.endpoint, "test-id", "test-secret"), PROJECT, LETTERS,
                                          str(tmp_path / "letters.jsonl"))
        done = check_all(server, "dts", stream, "evolve", "two tasks at once")
        assert sum(r["skipped"] for r in reports.values()) == 0
        assert exported == sum(r["dead_letters"] for r in reports.values()) > 0, (exported, reports)
        # each AppendField is made once between the two: a task that read the topic's schema after
        # the other grew it has nothing to evolve, so which task reports it is the threads' timing
        evolved = {(e["topic"], tuple(e["fields"])) for r in reports.values() for e in r["evolved"]}
        assert ("shop_orders", ("note",)) in evolved and ("shop_orders", ("remark",)) in evolved, reports
        proc = run_bridge(bridge_cli("replay", "--from-dlq", str(tmp_path / "letters.jsonl"), "--to", "tuple", "--datahub-endpoint",
                         server.endpoint, "--project", PROJECT, "--datahub-topic", "{db}_{table}", "--schema-change",
                         "lenient", "--on-error", "skip", "--json"))
        replay = json.loads(proc.stdout)
        facts = stream[1]
        assert replay["rejected"] == len(PARTITIONS) * (len(facts["poison_bad"]) + len(facts["big"])), proc.stderr
        letters = [json.loads(line) for line in (tmp_path / "letters.jsonl").read_text().splitlines()]
        modified = {(x["partition"], x["offset"], x["entry"]) for x in letters if x["table"] == "shop.orders"}
        replayed = [r["attributes"]["dts.pos"] for r in server.records(PROJECT, "shop_orders")
                    if r["attributes"]["dts.topic"] == "dts#dead-letters"]
        assert len(replayed) == len(set(replayed)) == replay["written"] > 0, replay
        assert {tuple(int(p) for p in pos.split(":")[:3]) for pos in replayed} == modified
        print(f"\n[two tasks at once: {done}; {exported} letters exported, replay wrote {replay['written']}]")


def test_halt_table_across_micro_batches_and_a_replay(stream):
    """onTableError halt-table, one Kafka partition in two micro-batches (epochs 0 and 1, cut just
    after bad.poison's first bad Entry), the second run twice: bad.poison halts in micro-batch 0
    and stays halted in 1 (the halt read back from the dead-letter topic, from epochs before 1 only,
    so the replay decides the same), shop.orders halts at its first MODIFY'd Entry in micro-batch
    1; every later Entry of both is a dead letter, once; the other tables land whole."""
    envelopes, facts, _ = stream
    import pyarrow as pa
    table = pa.Table.from_batches(entry_batches(envelopes, "dts", 0))
    first_bad = next(i for i, raw in enumerate(table.column("dts").to_pylist())
                     if pb.Entry.FromString(raw).header.seqId in facts["poison_bad"])
    cut = first_bad + 3
    with StandInDataHub() as server:
        config = configure(sink_options(server, onTableError="halt-table"), ENTRY_COLUMNS, streaming=True)
        first = write_batches(config, iter(table.slice(0, cut).to_batches(max_chunksize=40)), epoch=0)
        assert set(first["halted"]) == {"bad.poison", "shop.big"}, first["halted"]  # the oversized row halts too
        second = [write_batches(config, iter(table.slice(cut).to_batches(max_chunksize=40)), epoch=1) for _ in range(2)]
        assert set(second[0]["halted"]) == {"bad.poison", "shop.big", "shop.orders"}, second[0]["halted"]
        assert second[1]["written"] == 0 and second[1]["skipped"] == second[0]["written"] > 0, second
        done = check_all(server, "dts", stream, "evolve", "halt-table, two micro-batches", "halt-table", (0,))
        print(f"\n[halt-table over two micro-batches and a replay: {done}]")


def test_records_datahub_refuses_are_dead_letters(stream):
    """DataHub refuses the first requests to a shard as malformed: the records go again one per
    request, each record refused alone is a dead letter of its own (its row) in the topic, handed
    over by the writer's threads; every other record lands once."""
    envelopes = stream[0]
    with StandInDataHub() as server:
        server.faults.fail_next("PutRecordsByShard", status=400, code="MalformedRecord", message="bad record",
                                times=3, shard="0")
        config = configure(sink_options(server, include="shop.orders,shop.customers"), ENTRY_COLUMNS, streaming=True)
        report = write_batches(config, iter(entry_batches(envelopes, "dts", 0)), epoch=0)
        letters = [json.loads(r["data"]) for r in server.records(PROJECT, LETTERS)]
        refused = {f"{x['partition']}:{x['offset']}:{x['entry']}:{x['row']}" for x in letters if x["row"] is not None}
        assert refused and all("MalformedRecord" in x["error"] for x in letters if x["row"] is not None), letters
        landed = collections.Counter(r["attributes"]["dts.pos"] for name in ("shop_orders", "shop_customers")
                                     for r in server.records(PROJECT, name))
        assert not refused & set(landed) and set(landed.values()) == {1}, refused & set(landed)
        # "written" counts the records put, the refused ones too (as sync counts them)
        assert report["dead_letters"] == len(letters) and report["written"] == len(landed) + len(refused), report


# ---- Spark: a stream stopped mid-run and restarted; a batch read ----------------------------------

MAX_OFFSETS = 212  # per micro-batch, over both partitions: 508 offsets in 3, ending inside split Entries


def kafka_read(spark, broker, topic: str, max_offsets: int):
    return (spark.readStream.format("dts-kafka").option("brokers", broker.bootstrap).option("topic", topic)
            .option("maxOffsetsPerTrigger", str(max_offsets)).load())


def commits(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_query(spark, broker, topic: str, server, checkpoint, log, trigger: dict, max_offsets: int = MAX_OFFSETS,
                **options):
    writer = bs.dts_entries(kafka_read(spark, broker, topic, max_offsets)).writeStream.format("datahub")
    for key, value in sink_options(server, commitLog=log, **options).items():
        writer = writer.option(key, str(value))
    return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()


@pytest.mark.deep  # make test has the streaming whole database killed and restarted (test_spark_tables_kill.py)
def test_streaming_stopped_mid_run_and_restarted(spark, kafka_broker, kafka_topic, stream, tmp_path):
    """dts-kafka with maxOffsetsPerTrigger -> dts_entries -> writeStream datahub (Tuple, evolve,
    dlq): stopped once records landed, restarted from the checkpoint to the end. Every table's
    topic equals the file conversion per (shard, partition), in order, and its RecordSchema the
    evolved one; the dead letters are exactly the poisoned, MODIFY'd and oversized Entries, once
    per partition; micro-batches ended inside split Entries."""
    checkpoint, log = tmp_path / "ckpt", tmp_path / "commits.jsonl"
    spark.conf.set(PROVIDER_CONF, ROCKSDB)  # a session made before local_session set it
    with StandInDataHub() as server:
        server.faults.delay("PutRecordsByShard", seconds=0.01)
        query = start_query(spark, kafka_broker, kafka_topic, server, checkpoint, log,
                            {"processingTime": "200 milliseconds"})
        try:
            deadline = time.monotonic() + 240
            while not any(c["outcome"] == "commit" for c in commits(log)):
                assert query.isActive and time.monotonic() < deadline, (query.exception(), commits(log))
                time.sleep(0.1)
        finally:
            query.stop()
        stopped_after = [c["batch"] for c in commits(log) if c["outcome"] == "commit"]
        query = start_query(spark, kafka_broker, kafka_topic, server, checkpoint, log, {"availableNow": True})
        assert query.awaitTermination(300), "the restarted stream did not finish"
        assert query.exception() is None, query.exception()
        done = check_all(server, kafka_topic, stream, "evolve", f"stopped after micro-batches {stopped_after}")
        summaries = [c for c in commits(log) if c["outcome"] == "commit"]
        batches = [c["batch"] for c in summaries]
        assert sorted(set(batches)) == list(range(max(batches) + 1)), batches
        evolved = {(e["topic"], tuple(e["fields"])) for c in summaries for e in c["evolved"]}
        assert ("shop_orders", ("note",)) in evolved and ("shop_orders", ("remark",)) in evolved, evolved
        cuts = checkpoint_cuts(checkpoint, kafka_topic)
        splits = {p: _split_ranges(stream[0]) for p in PARTITIONS}
        straddle = straddling_cuts(cuts, splits)
        assert straddle, f"no micro-batch ended inside a split Entries: {dict(cuts)}"
        print(f"\n[stream stopped after micro-batches {stopped_after}, restarted: {len(batches)} micro-batches "
              f"committed, {sum(c['skipped'] for c in summaries)} records found landed by a replayed one, "
              f"{len(straddle)} ends inside split Entries; {done}]")


@pytest.mark.deep  # another query, 15 s: make test keeps to evolve (the same TupleSink runs lenient in test_sync_tables)
def test_streaming_lenient_deep(spark, kafka_broker, kafka_topic, stream, tmp_path):
    """The same stream under lenient, in larger micro-batches: qty's new type goes to qty__string
    (a STRING field appended when first needed), every other row lands."""
    log = tmp_path / "commits.jsonl"
    spark.conf.set(PROVIDER_CONF, ROCKSDB)
    with StandInDataHub() as server:
        query = start_query(spark, kafka_broker, kafka_topic, server, tmp_path / "ckpt", log, {"availableNow": True},
                            max_offsets=260, schemaChange="lenient")
        assert query.awaitTermination(300), "the stream did not finish"
        assert query.exception() is None, query.exception()
        done = check_all(server, kafka_topic, stream, "lenient", "streaming, lenient")
        evolved = {f for c in commits(log) for e in c["evolved"] for f in e["fields"]}
        assert "qty__string" in evolved, evolved
        print(f"\n[streaming lenient: {len(commits(log))} micro-batches; {done}]")


def test_schema_change_fail_names_table_and_position(stream):
    """schemaChange fail: the first row whose RecordSchema differs from its topic's stops the task
    with the table, the fields and the Kafka position; nothing of the table lands after it."""
    with StandInDataHub() as server:
        config = configure(sink_options(server, schemaChange="fail", exclude="bad.*"), ENTRY_COLUMNS,
                           streaming=False)
        with pytest.raises(Exception, match="--schema-change fail") as caught:
            write_batches(config, iter(entry_batches(stream[0], "dts", 0)))
        text = str(caught.value)
        assert "shop.orders" in text and "added note STRING" in text and "partition 0 offset" in text, text
        landed = server.records(PROJECT, "shop_orders")
        assert landed and all("note" not in json.dumps(r["values"]) for r in landed)


BASE = {"endpoint": "http://127.0.0.1:9", "project": "p", "topic": "{db}_{table}", "to": "tuple"}
BLOB_ROWS = [("topic", "string"), ("partition", "int"), ("offset", "bigint"), ("entry", "int"), ("row", "int"),
             ("shard_key", "string"), ("blob", "string")]


@pytest.mark.parametrize("options, columns, message", [
    ({"to": "parquet"}, ENTRY_COLUMNS, "option 'to'"),
    ({"to": "tuple", "topic": "orders"}, ENTRY_COLUMNS, "option 'topic' needs {table}"),
    ({"to": "blob", "topic": "dts_{table}"}, ENTRY_COLUMNS, "option 'topic' takes no {table}"),
    ({"schemaChange": "drop"}, ENTRY_COLUMNS, "option 'schemaChange'"),
    ({"to": "blob", "topic": "dts", "schemaChange": "lenient"}, ENTRY_COLUMNS, "option 'schemaChange' is for"),
    ({"onTableError": "skip"}, ENTRY_COLUMNS, "option 'onTableError'"),
    ({"onTableError": "dlq"}, ENTRY_COLUMNS, "option 'deadLetters'"),
    ({"oversized": "dlq"}, ENTRY_COLUMNS, "option 'deadLetters'"),
    ({"oversized": "chunk"}, ENTRY_COLUMNS, "option 'oversized'"),
    ({"deadLetters": "dl_{db}"}, ENTRY_COLUMNS, "option 'deadLetters'"),
    ({"include": " , "}, ENTRY_COLUMNS, "option 'include'"),
    ({"keyColumns": "id"}, ENTRY_COLUMNS, "option 'keyColumns'"),
    ({"shemaChange": "evolve"}, ENTRY_COLUMNS, "did you mean 'schemaChange'"),
    ({}, ENTRY_COLUMNS[:4] + (("dts", "string"),), "dts binary"),
    ({"topic": "t", "include": "shop.*"}, BLOB_ROWS, "option '(to|include)' is for rows of dts_entries"),
    ({"zeroDates": "zero"}, ENTRY_COLUMNS, "option 'zeroDates'"),
    ({"strict": "true", "controlEvents": "emit"}, ENTRY_COLUMNS, "control_events"),
    ({"topic": "t", "zeroDates": "null"}, BLOB_ROWS, "option '(to|zeroDates)' is for rows of dts_entries"),
])
def test_options_are_checked_up_front(options, columns, message):
    with pytest.raises(OptionsError, match=message):
        configure({**BASE, **options}, columns, streaming=True)


def test_dts_entries_output_and_options(spark, stream):
    """One row per Entry, in stream order, its bytes the Entry's; a bad mode is refused."""
    envelopes = stream[0]
    rows = bs.dts_entries(spark.createDataFrame(
        [(None, raw, "dts", 0, n, None) for n, raw in enumerate(envelopes)], bs.KAFKA_SCHEMA)).collect()
    entries = build_stream(rounds=6)[0]
    assert [pb.Entry.FromString(r.dts) for r in rows] == entries
    assert [(r.offset, r.entry) for r in rows] == sorted((r.offset, r.entry) for r in rows)
    with pytest.raises(OptionsError, match="option 'mode'"):
        bs.dts_entries(spark.createDataFrame([], bs.KAFKA_SCHEMA), mode="LENIENT")


# ---- kill -9 of the whole driver (make test-deep) ----------------------------------------------------

DRIVER = """
import json, sys
import bridge.spark as bs
cfg = json.loads(open(sys.argv[1]).read())
spark = bs.local_session("tables-kill")
spark.sparkContext.setLogLevel("ERROR")
bs.register(spark)
kafka = (spark.readStream.format("dts-kafka").option("brokers", cfg["brokers"]).option("topic", cfg["topic"])
         .option("maxOffsetsPerTrigger", cfg["max_offsets"]).load())
writer = bs.dts_entries(kafka).writeStream.format("datahub").option("checkpointLocation", cfg["checkpoint"])
for key, value in cfg["options"].items():
    writer = writer.option(key, str(value))
query = writer.trigger(**cfg["trigger"]).start()
print("started", flush=True)
query.awaitTermination()
print("finished", flush=True)
"""


class TablesDriver:
    """DRIVER as a subprocess with one config (support.spark_driver.kill_loop's interface)."""

    def __init__(self, tmp_path, **cfg) -> None:
        self.tmp_path, self.cfg, self.runs = tmp_path, cfg, 0
        self.script = tmp_path / "tables_driver.py"
        self.script.write_text(DRIVER)

    def start(self, trigger: str):
        import subprocess
        import sys

        self.runs += 1
        config, log = self.tmp_path / f"driver-{self.runs}.json", self.tmp_path / f"driver-{self.runs}.log"
        when = {"availableNow": True} if trigger == "availableNow" else {"processingTime": trigger}
        config.write_text(json.dumps(dict(self.cfg, trigger=when)))
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(self.script), str(config)], cwd=ROOT, env=ENV, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return proc, log


@pytest.mark.deep  # three Spark drivers, minutes: make test-deep
def test_driver_killed_with_sigkill_and_restarted_deep(kafka_broker, kafka_topic, stream, tmp_path):
    """The whole driver (Python, JVM, Python workers) killed with SIGKILL twice inside micro-batches
    (lenient + dlq, chaos faults off), then run to the end from its checkpoint: every table and the
    dead letters exactly as the file conversion says, nothing twice."""
    with StandInDataHub() as server:
        server.faults.delay("PutRecordsByShard", seconds=0.05)  # a window to kill in
        driver = TablesDriver(tmp_path, brokers=kafka_broker.bootstrap, topic=kafka_topic, max_offsets=60,
                              checkpoint=str(tmp_path / "ckpt"),
                              options=sink_options(server, schemaChange="lenient", commitLog=str(tmp_path / "log.jsonl")))

        def count() -> int:
            names = make_client(server.endpoint, "i", "k").list_topic(PROJECT).topic_names
            return sum(len(server.records(PROJECT, name)) for name in names)
        _, facts, converted = stream
        dead = expected_dead(facts, "lenient", "dlq")
        total = sum(len(rows) for _, versions in converted.items() for _, vs in versions for _, rows in vs) \
            + len(dead) * len(PARTITIONS)
        log: list[str] = []
        kills = kill_loop(driver, count, kills=2, total=total, seed=1729, log=log)
        server.faults.clear()
        done = check_all(server, kafka_topic, stream, "lenient", "killed:\n  " + "\n  ".join(log))
        print(f"\n[{len(kills)} SIGKILLs in {driver.runs} runs; {done}]\n  " + "\n  ".join(log))


# ---- review of the whole-database Spark side: defects found, each with its test ------------------

@pytest.fixture(scope="module")
def small_envelopes():
    """build_stream(rounds=1) in Envelopes of 300 bytes (the 2 MB row whole): a second of work."""
    entries, facts = build_stream(rounds=1)
    return [env.SerializeToString() for env in pack_entries(entries, 300)], facts


def test_a_table_mapped_to_a_blob_topic_is_the_tables_error(small_envelopes):
    """A Tuple table whose topic exists as a Blob topic: the library's error naming the topic and
    the position (halt-all), or dead letters of that table only (dlq); was an AttributeError."""
    envelopes, facts = small_envelopes
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "shop_customers", 2, "BLOB")
        options = sink_options(server, onTableError="halt-all", oversized="fail", exclude="shop.big")
        del options["deadLetters"]
        config = configure(options, ENTRY_COLUMNS, streaming=True)
        with pytest.raises(ConversionError, match=r"shop_customers is a BLOB topic.*partition 0, offset \d+"):
            write_batches(config, iter(entry_batches(envelopes, "dts", 0)), epoch=0)
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "shop_customers", 2, "BLOB")
        report = write_batches(configure(sink_options(server), ENTRY_COLUMNS, streaming=True),
                               iter(entry_batches(envelopes, "dts", 0)), epoch=0)
        letters = [json.loads(r["data"]) for r in server.records(PROJECT, LETTERS)]
        customers = {x["offset"] for x in letters if x["table"] == "shop.customers"}
        assert customers and all("BLOB topic" in x["error"] for x in letters if x["table"] == "shop.customers")
        assert server.records(PROJECT, "shop_orders") and report["dead_letters"] == len(letters)


@pytest.mark.parametrize("options, message", [
    (dict(to="blob", topic=LETTERS, onTableError="halt-table"), "option 'deadLetters'.*the data"),
    (dict(topic="dead_{table}"), "the dead letters"),  # dead.letters -> dead_letters at run time
])
def test_dead_letters_share_no_topic_with_the_data(small_envelopes, options, message):
    """The dead-letter topic cannot also be a data topic (its records were read back as letters: a
    KeyError at the next micro-batch, and the data writer took letters for landed records)."""
    from bridge.sync import TopicNameCollision
    envelopes, _ = small_envelopes
    with StandInDataHub() as server:
        if options.get("to") == "blob":
            with pytest.raises(OptionsError, match=message):
                configure(sink_options(server, **options), ENTRY_COLUMNS, streaming=True)
            return
        entries = [pb.Entry.FromString(raw) for raw in
                   pa_column(entry_batches(envelopes, "dts", 0), "dts")]
        for entry in entries:  # one table of the stream renamed dead.letters
            if entry.header.schemaName == "shop" and entry.header.tableName == "customers":
                entry.header.schemaName, entry.header.tableName = "dead", "letters"
        renamed = [env.SerializeToString() for env in pack_entries(entries, 300)]
        config = configure(sink_options(server, **options), ENTRY_COLUMNS, streaming=True)
        with pytest.raises(TopicNameCollision, match=message):
            write_batches(config, iter(entry_batches(renamed, "dts", 0)), epoch=0)


def pa_column(batches, name: str) -> list:
    return [v for batch in batches for v in batch.column(batch.schema.get_field_index(name)).to_pylist()]


def test_a_tuple_dead_letter_topic_is_refused_before_any_row(small_envelopes):
    """deadLetters naming an existing Tuple topic fails the task at its start, naming the option
    (it failed only at the first dead letter, perhaps hours in)."""
    envelopes, _ = small_envelopes
    with StandInDataHub() as server:
        server.create_topic(PROJECT, LETTERS, 1, "TUPLE", [("a", "STRING")])
        config = configure(sink_options(server), ENTRY_COLUMNS, streaming=True)
        with pytest.raises(DataHubError, match="option 'deadLetters'.*TUPLE"):
            write_batches(config, iter(entry_batches(envelopes, "dts", 0)), epoch=0)
        assert make_client(server.endpoint, "i", "k").list_topic(PROJECT).topic_names == [LETTERS]


def test_dead_letters_without_a_policy_writing_them_are_refused():
    """deadLetters under onTableError halt-all and oversized fail would never be written: refused."""
    with pytest.raises(OptionsError, match="option 'deadLetters'.*never"):
        configure({**BASE, "deadLetters": LETTERS}, ENTRY_COLUMNS, streaming=True)
    configure({**BASE, "deadLetters": LETTERS, "oversized": "dlq"}, ENTRY_COLUMNS, streaming=True)


def test_the_dead_letter_topic_is_read_in_windows(monkeypatch, tmp_path):
    """earlier_halts and export_dead_letters read the dead-letter topic a window at a time, not a
    whole shard into memory (it grows with every halted table's traffic)."""
    import bridge.spark.tables as st
    monkeypatch.setattr(st, "LETTER_WINDOW", 7)
    with StandInDataHub() as server:
        client = make_client(server.endpoint, "test-id", "test-secret")
        writer = DataHubWriter(client, PROJECT, create_topics={"shards": 1}, batch_records=5)
        writer.resume("dts", epoch=0)
        letters = st.TopicDeadLetters(writer, LETTERS, {})
        for n in range(30):
            letters.write(entry_bytes=b"\x00", source="dts", partition=0, offset=n, entry=0, row=None,
                          table=f"db.t{n % 3}", error=f"bad {n}", datahub_topic=None)
        letters.sync()
        writer.stop()
        reads = []
        real = DataHubWriter._read

        def counted(self, topic, shard_id, start, count):
            reads.append(count)
            return real(self, topic, shard_id, start, count)
        monkeypatch.setattr(DataHubWriter, "_read", counted)
        reader = DataHubWriter(client, PROJECT, workers=1)
        halted = st.earlier_halts(reader, LETTERS, "dts", 1)
        reader.stop()
        assert sorted(halted) == ["db.t0", "db.t1", "db.t2"] and "bad 0" in halted["db.t0"], halted
        assert reads and max(reads) <= 7, reads
        reads.clear()
        assert bs.export_dead_letters(client, PROJECT, LETTERS, str(tmp_path / "letters.jsonl")) == 30
        assert reads and max(reads) <= 7, reads
        exported = [json.loads(line) for line in (tmp_path / "letters.jsonl").read_text().splitlines()]
        assert [x["offset"] for x in exported] == list(range(30))


def test_a_record_is_built_on_one_reading_of_the_recordschema():
    """A worker thread may read a Tuple topic's RecordSchema afresh (another task appended a field)
    while the caller builds a record: the record takes one RecordSchema, values and fields alike
    (it took the field list of one and the RecordSchema of the other: 'does not fit', a dead letter)."""
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "t", 1, "TUPLE", [("id", "BIGINT")])
        client = make_client(server.endpoint, "test-id", "test-secret")
        writer = DataHubWriter(client, PROJECT, workers=1)
        info = writer.topic("t")
        old = info.schema
        client.append_field(PROJECT, "t", "note", __import__("datahub").models.FieldType.STRING)
        grown = client.get_topic(PROJECT, "t").record_schema

        class Flipping(type(info)):  # the schema refreshed by a worker between two reads
            reads = 0

            @property
            def schema(self):
                Flipping.reads += 1
                return old if Flipping.reads == 1 else grown

            @schema.setter
            def schema(self, value):
                pass
        info.__class__ = Flipping
        try:
            writer.put("t", "k", {"id": 1}, Position("dts", 0, 1))
            writer.flush()
        finally:
            info.__class__ = Flipping.__mro__[1]
            writer.stop()
        landed = server.records(PROJECT, "t")
        assert len(landed) == 1 and str(landed[0]["values"][0]) == "1", landed


def test_an_appendfield_another_writer_just_made_is_taken_as_done():
    """Two tasks append one field at once: the AppendField DataHub refuses because the other's
    landed in between is done when the types agree, and the library's error when they do not."""
    from datahub.models import FieldType
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "t", 1, "TUPLE", [("id", "BIGINT")])
        client = make_client(server.endpoint, "test-id", "test-secret")
        other = make_client(server.endpoint, "test-id", "test-secret")
        writer = DataHubWriter(client, PROJECT, workers=1)
        writer.topic("t")
        real = client.append_field

        def raced(project, topic, name, kind):  # the other task's AppendField lands first
            other.append_field(project, topic, name, FieldType.STRING)
            return real(project, topic, name, kind)
        client.append_field = raced
        try:
            writer.append_fields("t", [("note", "STRING")])
            assert [f.name for f in writer.topic("t").schema.field_list] == ["id", "note"]
            with pytest.raises(DataHubError, match="AppendField"):
                writer.append_fields("t", [("qty", "BIGINT")])  # the other appended qty STRING
        finally:
            writer.stop()


def test_an_error_of_the_writer_names_the_entry(small_envelopes):
    """An error met while an Entry is written (here: its table's topic missing, createTopics off)
    names the Kafka topic and the Entry's position, as every other error of the task does."""
    envelopes, _ = small_envelopes
    with StandInDataHub() as server:
        server.create_topic(PROJECT, LETTERS, 1, "BLOB")
        config = configure(sink_options(server, createTopics="false"), ENTRY_COLUMNS, streaming=True)
        with pytest.raises(DataHubError, match=r"shop_orders.*\(partition 0, offset \d+, entry \d+, topic dts\)"):
            write_batches(config, iter(entry_batches(envelopes, "dts", 0)), epoch=0)


def test_a_refused_request_names_its_own_record_not_the_entry_being_written(small_envelopes):
    """halt-all: a request DataHub refuses stops the task naming its first record (dts.pos), and no
    other Entry's position is pinned on it (the writer thread's error surfaces at a later Entry)."""
    envelopes, _ = small_envelopes
    with StandInDataHub() as server:
        server.faults.fail_next("PutRecordsByShard", status=400, code="MalformedRecord", message="bad", times=1)
        options = sink_options(server, onTableError="halt-all", oversized="fail", include="shop.orders")
        del options["deadLetters"]
        with pytest.raises(DataHubError, match=r"first record at dts 0:\d+:\d+:\d+\)") as caught:
            write_batches(configure(options, ENTRY_COLUMNS, streaming=True),
                          iter(entry_batches(envelopes, "dts", 0)), epoch=0)
        assert "(partition" not in str(caught.value), caught.value


def test_a_dead_letter_too_large_for_datahub_leaves_the_entry_out(tmp_path):
    """oversized dlq: an Entry of 3 MB (a LONGTEXT value) makes a letter over DataHub's request limit
    once in base64. The letter goes without the Entry's bytes, its error saying so and where to
    read them (the task failed, and its replays with it: a stream stuck on one row); replay
    --from-dlq rejects such a letter naming it instead of converting an empty Entry."""
    import bridge.spark.tables as st
    big = pb.Entry()
    big.header.schemaName, big.header.tableName = "shop", "big"
    big.header.seqId = 7
    raw = big.SerializeToString()  # a header only: the 3 MB are padding, the letter's size is what counts
    with StandInDataHub() as server:
        client = make_client(server.endpoint, "test-id", "test-secret")
        writer = DataHubWriter(client, PROJECT, create_topics={"shards": 1})
        writer.resume("dts", epoch=0)
        letters = st.TopicDeadLetters(writer, LETTERS, {})
        letters.write(entry_bytes=raw + b"x" * (3 << 20), source="dts", partition=0, offset=4, entry=0, row=None,
                      table="shop.big", error="record of 3145800 bytes exceeds DataHub's request limit",
                      datahub_topic="shop_big")
        letters.write(entry_bytes=raw, source="dts", partition=0, offset=5, entry=0, row=None, table="shop.big",
                      error="a small one", datahub_topic="shop_big")
        letters.sync()
        writer.stop()
        assert letters.written == 2
        got = [json.loads(r["data"]) for r in server.records(PROJECT, LETTERS)]
        assert [(x["offset"], x["entry_base64"] == "") for x in got] == [(4, True), (5, False)], got
        assert "left out" in got[0]["error"] and "3145" in got[0]["error"], got[0]
        path = tmp_path / "letters.jsonl"
        bs.export_dead_letters(client, PROJECT, LETTERS, str(path))
        proc = run_bridge(bridge_cli("replay", "--from-dlq", str(path), "--to", "tuple", "--datahub-endpoint", server.endpoint,
                         "--project", PROJECT, "--datahub-topic", "{db}_{table}", "--on-error", "skip", "--rejects",
                         str(tmp_path / "rejects.jsonl"), "--json"))
        replay = json.loads(proc.stdout)  # the header-only Entry converts to nothing: not emitted
        assert (replay["rejected"], replay["not_emitted"]) == (1, 1), (proc.stdout, proc.stderr)
        rejects = (tmp_path / "rejects.jsonl").read_text()
        assert "holds no Entry" in rejects and "left out" in rejects, rejects


@pytest.mark.parametrize("zero_dates", [None, "string"])
def test_conversion_options_reach_the_tasks(zero_dates):
    """A whole database takes the conversion options of bridge.Options by their camelCase names
    (zeroDates as dts-bridge sync --zero-dates): samples/realistic's zero dates land as NULL in a
    TIMESTAMP field by default, and as the text sent in a STRING field under zeroDates=string."""
    from bridge.wire.framing import read_pb
    envelopes = [raw for _, _, raw in read_pb(str(ROOT / "samples" / "realistic.pb"))]
    more = {"zeroDates": zero_dates} if zero_dates else {}
    with StandInDataHub() as server:
        config = configure(sink_options(server, include="mall.suppliers", **more), ENTRY_COLUMNS, streaming=False)
        write_batches(config, iter(entry_batches(envelopes, "dts", 0)))
        topic = next(t for p in server.dump_state()["projects"] for t in p["topics"] if t["name"] == "mall_suppliers")
        field = [f["name"] for f in topic["fields"]].index("joined_on")
        kind = topic["fields"][field]["type"].upper()
        values = [r["values"][field] for r in server.records(PROJECT, "mall_suppliers")]
    assert values
    if zero_dates == "string":
        assert kind == "STRING" and "0000-00-00" in values
    else:
        assert kind == "TIMESTAMP" and None in values and all(v is None or isinstance(v, int) for v in values)


def test_an_error_row_without_a_topic_first_does_not_end_the_task(stream):
    """A PERMISSIVE error row of dts_entries whose topic is unknown, before the good rows: counted
    rows and rejected, and every good row after it is still written (the task's loop runs once per
    source, and an error row has none to run under)."""
    import pyarrow as pa
    envelopes = stream[0]
    bad = pa.RecordBatch.from_pydict({"topic": pa.array([None], pa.string()), "partition": pa.array([None], pa.int32()),
                                      "offset": pa.array([None], pa.int64()), "entry": pa.array([None], pa.int32()),
                                      "dts": pa.array([None], pa.binary()), "error": ["cannot read the record"]})
    with StandInDataHub() as server:
        config = configure(sink_options(server, include="shop.orders,shop.customers"), ENTRY_COLUMNS, streaming=True)
        plain = write_batches(config, iter(entry_batches(envelopes, "dts", 0)), epoch=0)
    with StandInDataHub() as server:
        config = configure(sink_options(server, include="shop.orders,shop.customers"), ENTRY_COLUMNS, streaming=True)
        report = write_batches(config, iter([bad, *entry_batches(envelopes, "dts", 0)]), epoch=0)
    assert plain["written"] > 0
    assert (report["written"], report["rows"], report["rejected"]) == \
        (plain["written"], plain["rows"] + 1, plain["rejected"] + 1), (plain, report)
