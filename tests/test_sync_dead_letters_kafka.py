"""`dts-bridge sync --dead-letters kafka:TOPIC`: the dead letters as records of a Kafka topic, the
same documents a dead-letter file holds, on the real Kafka broker and the stand-in DataHub.

The same input and the same DataHub fault (the first requests to shard 0 refused as malformed)
run once with a file and once with a topic: the letters must be the same documents, each once
per key, and the records that landed must be the others.
"""
from __future__ import annotations

import json
import time
import uuid

import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")

from support.datahub_standin import StandInDataHub  # noqa: E402
from support.pipeline import ROOT  # noqa: E402
from support.sync_runs import PROJECT, Sync, no_traceback, produce  # noqa: E402

SAMPLE = ROOT / "samples" / "mixed.pb"


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes, dict]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from confluent_kafka import KafkaError as CKError
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    out = []
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        open_, deadline = set(parts), time.monotonic() + 30
        while open_ and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    assert msg.error().code() == CKError._PARTITION_EOF, msg.error()
                    open_.discard(msg.partition())
                    continue
                out.append((msg.key(), json.loads(msg.value())))
        assert not open_
    finally:
        consumer.close()
    return out


def run_with(kafka_broker, tmp_path, topic: str, dead: str) -> tuple[dict, set]:
    with StandInDataHub() as server:
        server.faults.fail_next("PutRecordsByShard", status=400, code="MalformedRecord", message="bad record",
                                times=2, shard="0")
        sync = Sync(tmp_path, kafka_broker, topic, f"g-{uuid.uuid4().hex[:6]}", server, "--to", "blob",
                    "--datahub-topic", "blobs", "--shards", "2", "--idle-timeout", "1", "--on-table-error", "dlq",
                    "--dead-letters", dead)
        code, report, err = sync.run()
        no_traceback(err, "sync")
        assert report["stopped"] == "idle", err[-2000:]
        landed = {r["attributes"]["dts.pos"] for r in server.records(PROJECT, "blobs")}
    return report, landed


def test_dead_letters_to_a_kafka_topic_equal_the_file(kafka_broker, tmp_path):
    topic = kafka_broker.create_topic(f"dlq-in-{uuid.uuid4().hex[:8]}", partitions=1)
    produce(kafka_broker, topic, SAMPLE, 0)
    path = tmp_path / "dead.jsonl"
    file_report, file_landed = run_with(kafka_broker, tmp_path, topic, str(path))
    from_file = [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    assert from_file and file_report["dead_letters"] == len(from_file)

    dlq = f"dlq-{uuid.uuid4().hex[:8]}"
    kafka_report, kafka_landed = run_with(kafka_broker, tmp_path, topic, f"kafka:{dlq}")
    records = read_topic(kafka_broker.bootstrap, dlq)
    keys = [key for key, _ in records]
    assert len(keys) == len(set(keys))  # each letter once, keyed by its position
    assert [doc for _, doc in records] == from_file  # the same documents, in the same order
    assert all(key == f"{doc['source']}:{doc['partition']}:{doc['offset']}:{doc['entry']}"
               + ("" if doc["row"] is None else f":{doc['row']}") for (key, doc) in
               ((k.decode(), d) for k, d in records))
    assert kafka_report["dead_letters"] == len(records) and kafka_landed == file_landed
    for doc in from_file:  # a refused record did not land
        assert f"{doc['partition']}:{doc['offset']}:{doc['entry']}:{doc['row']}" not in kafka_landed


def test_dead_letters_topic_needs_a_name(kafka_broker, tmp_path):
    from support.pipeline import bridge_cli, run_bridge
    with StandInDataHub() as server:
        done = run_bridge(bridge_cli("sync", "--brokers", kafka_broker.bootstrap, "--topic", "t", "--group", "g",
                                     "--datahub-endpoint", server.endpoint, "--project", PROJECT,
                                     "--datahub-topic", "blobs", "--on-table-error", "dlq", "--dead-letters",
                                     "kafka:"))
    assert done.returncode == 2 and "kafka:TOPIC needs a topic name" in done.stderr, done.stderr


def test_dead_letters_to_brokers_that_do_not_answer_wait_as_the_run_does(tmp_path):
    """Brokers on a closed local port: the run waits for them as it does without dead letters
    (status lines, librdkafka's log through the run's deduplicating logger) and a SIGTERM ends it
    cleanly; it once sat 30 s in the dead-letter topic's metadata request printing raw librdkafka
    lines and ended as `internal error: KafkaException`."""
    import signal
    import socket
    import subprocess

    from support.pipeline import ENV, bridge_cli
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with StandInDataHub() as server:
        proc = subprocess.Popen(bridge_cli("sync", "--brokers", f"127.0.0.1:{port}", "--topic", "t", "--group", "g",
                                           "--datahub-endpoint", server.endpoint, "--project", PROJECT,
                                           "--datahub-topic", "blobs", "--to", "blob", "--idle-timeout", "1",
                                           "--status-interval", "1", "--no-progress", "--on-table-error", "dlq",
                                           "--dead-letters", "kafka:dlq"),
                                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=6)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    no_traceback(err, "sync")
    assert "internal error" not in err and "%3|" not in err, err[-3000:]
    assert proc.returncode == 0 and "stopped: signal" in err and "0 dead letters to kafka:dlq" in err, err[-3000:]
    assert len(err.splitlines()) < 30, err[-3000:]
