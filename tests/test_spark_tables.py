"""A whole database into DataHub from Spark (issue 20, the Spark side): `bridge.spark.dts_entries`
and the `datahub` sink's whole-database mode (bridge/_spark_tables.py, docs/spark.md "A whole
database"), on the real Kafka broker (`dts-kafka`) and the stand-in DataHub.

The input is tests/test_sync_tables.py's stream (CREATE, ALTER ADD / DROP / RENAME / MODIFY COLUMN
of shop.orders, a poisoned table bad.poison, a 2 MB row in shop.big), packed into Envelopes of 300
bytes (the 2 MB Entry into 1 MB ones) so that many Entries are split, and produced into both
partitions of one Kafka topic: two Spark tasks then convert the same tables, evolve the same topics
and write the same shards at once. What lands is put beside `dts-bridge convert --to tuple` of the
very file, per (DataHub shard, Kafka partition), in order (test_sync_tables.expected_topics
applies the policy), and the dead-letter topic must hold exactly the Entries the policy leaves out,
once per Kafka partition.

- test_task_function_two_partitions_at_once: the sink's task function (`write_batches`) run by two
  threads at once on dts_entries rows, evolve + dlq; no Spark, a few seconds.
- test_streaming_stopped_mid_run_and_restarted: dts-kafka with maxOffsetsPerTrigger (micro-batch
  ends inside split Entries, checked in the offset log) -> dts_entries -> writeStream datahub,
  evolve + dlq, stopped mid-run and restarted from its checkpoint.
- test_batch_lenient: spark.read dts-kafka -> dts_entries -> write datahub, lenient + dlq.
- test_schema_change_fail_names_table_and_position, test_options_are_checked_up_front.
"""
from __future__ import annotations

import base64
import collections
import json
import os
import shutil
import threading
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = [pytest.mark.spark, pytest.mark.datahub]

from support.datahub_standin import StandInDataHub  # noqa: E402
from support.kafka_broker import kafka_broker  # noqa: E402,F401  (the session fixture)
from test_spark_pipeline import checkpoint_cuts, _two_task_name  # noqa: E402
from test_sync import PROJECT, _text, compare, convert_tuple, landed_by_shard_partition  # noqa: E402
from test_sync_tables import build_stream, expected_dead, expected_topics  # noqa: E402

import bridge.spark as bs  # noqa: E402
from bridge import subscribe_pb2 as pb  # noqa: E402
from bridge._spark_jobs import _batch_function  # noqa: E402
from bridge._spark_tables import ENTRY_COLUMNS, _DtsToEntries  # noqa: E402
from bridge._wire import pack_entries, write_pb  # noqa: E402
from bridge.datahub_sink import make_client, shard_for, tuple_shard_key  # noqa: E402
from bridge.errors import OptionsError  # noqa: E402
from bridge.spark_datahub import configure, write_batches  # noqa: E402
from bridge.sync import topic_name  # noqa: E402

LETTERS = "dead_letters"
PARTITIONS = (0, 1)


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    session = bs.local_session("bridge-tests")
    session.sparkContext.setLogLevel("OFF")
    bs.register(session)
    return session


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """(Envelopes, facts, {table: [(partition, versions)]} of `dts-bridge convert --to tuple`)."""
    entries, facts = build_stream(rounds=6)
    big = next(i for i, e in enumerate(entries) if e.header.seqId in facts["big"])
    envelopes = [env.SerializeToString() for env in
                 [*pack_entries(entries[:big], 300), *pack_entries(entries[big:big + 1], 1 << 20),
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
def kafka_topic(kafka_broker, stream):  # noqa: F811
    """The stream in both partitions of a topic whose partitions run in two Spark tasks."""
    from confluent_kafka import Producer
    envelopes = stream[0]
    name = kafka_broker.create_topic(_two_task_name("tables"), partitions=len(PARTITIONS))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5, "enable.idempotence": True,
                         "message.max.bytes": 4 << 20})
    for partition in PARTITIONS:
        for raw in envelopes:
            producer.produce(name, raw, partition=partition)
    assert producer.flush(60) == 0
    return name


def sink_options(server, **more) -> dict:
    return dict(endpoint=server.endpoint, project=PROJECT, accessId="test-id", accessKey="test-secret", to="tuple",
                topic="{db}_{table}", createTopics="true", shards=2, batchSize=8, deadLetters=LETTERS,
                onTableError="dlq", oversized="dlq", **more)


# ---- what must land ------------------------------------------------------------------------------

def check_tables(server, source: str, converted: dict, schema_change: str, dead: set[int], context: str) -> int:
    """Every table's topic: its RecordSchema, and its rows per (shard, Kafka partition) in order."""
    client = make_client(server.endpoint, "test-id", "test-secret")
    topics = {t: topic_name("{db}_{table}", *t.split(".", 1)) for t in converted}
    listed = set(client.list_topic(PROJECT).topic_names)
    assert listed == set(topics.values()) | {LETTERS}, f"topics {sorted(listed)}\n{context}"
    compared = 0
    for table, (fields, rows) in expected_topics(converted, schema_change, dead).items():
        name = topics[table]
        info = client.get_topic(PROJECT, name)
        have = [(f.name, str(getattr(f.type, "value", f.type)).upper()) for f in info.record_schema.field_list]
        if fields is not None:
            assert have == fields, f"{name} ({schema_change}): RecordSchema {have}, expected {fields}\n{context}"
        shard_ids = sorted((s["shard_id"] for s in server.shards(PROJECT, name) if s["state"] == "ACTIVE"), key=int)
        expected: dict = collections.defaultdict(list)
        for partition, row, keys in rows:
            expected[(shard_for(tuple_shard_key(row, table, keys), shard_ids), partition)].append(
                [_text(row.get(f)) for f, _ in have])
        got, positions = landed_by_shard_partition(server, name, source, lambda r: [_text(v) for v in r["values"]])
        compared += compare(name, got, positions, expected, f"table {table} ({schema_change}); {context}")
    return compared


def check_letters(server, source: str, dead: set[int], context: str) -> list[dict]:
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
    for partition in PARTITIONS:
        got = {seq for p, seq, _ in seen if p == partition}
        assert got == dead, (f"partition {partition}: {len(got - dead)} unexpected dead letters "
                             f"{sorted(got - dead)[:10]}, {len(dead - got)} missing {sorted(dead - got)[:10]}\n{context}")
    return letters


def check_all(server, source: str, stream, schema_change: str, context: str) -> str:
    _, facts, converted = stream
    dead = expected_dead(facts, schema_change, "dlq")
    letters = check_letters(server, source, dead, context)
    compared = check_tables(server, source, converted, schema_change, dead, context)
    return f"{compared} rows compared, {len(letters)} dead letters"


# ---- the task function, two tasks at once --------------------------------------------------------

def entry_batches(envelopes, topic: str, partition: int):
    """dts_entries' rows of one Kafka partition (its per-partition function), as Arrow batches of 40."""
    import pyarrow as pa
    kafka = pa.RecordBatch.from_pydict({"topic": [topic] * len(envelopes), "partition": [partition] * len(envelopes),
                                        "offset": list(range(len(envelopes))), "value": envelopes})
    rows = _batch_function(lambda: _DtsToEntries("FAILFAST"), True, None)(iter([kafka]))
    return pa.Table.from_batches(list(rows)).to_batches(max_chunksize=40)


def test_task_function_two_partitions_at_once(stream):
    """Two threads run the sink's task function at once, one per Kafka partition of the same
    stream (as two Spark tasks of a micro-batch): both evolve the same topics (an AppendField the
    other just made is taken as done; records built on the RecordSchema before it take NULL for
    the new field) and write the same shards."""
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
        done = check_all(server, "dts", stream, "evolve", "two tasks at once")
        assert sum(r["skipped"] for r in reports.values()) == 0
        assert all(r["dead_letters"] and r["evolved"] for r in reports.values()), reports
        print(f"\n[two tasks at once: {done}]")
