"""Smoke tests of the real Apache Kafka broker the pipeline tests run on (tests/support/kafka_broker.py,
docs/testing-kafka.md): records and headers come back in order per partition, a consumer group's
committed offsets keep their metadata (the bridge relies on that), and `dts-bridge produce` then
`dts-bridge consume` give exactly what `dts-bridge convert` gives.
"""
import json
import os
import pathlib
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _consume_all(bootstrap: str, topic: str, group: str, count: int, timeout: float = 20.0) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    got = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
    finally:
        consumer.close()
    return got


def test_startup_time_is_reported(kafka_broker, capsys):
    assert kafka_broker.bootstrap.startswith("127.0.0.1:") and kafka_broker.running
    assert kafka_broker.startup_seconds is not None and kafka_broker.startup_seconds < 60
    with capsys.disabled():
        print(f"\n[kafka broker {kafka_broker.version} at {kafka_broker.bootstrap}: "
              f"started in {kafka_broker.startup_seconds:.1f} s; logs in {kafka_broker.log_path}]")


def test_records_and_headers_come_back_in_order(kafka_broker):
    topic = kafka_broker.create_topic(_name("smoke"), partitions=2)
    metadata = kafka_broker.admin().list_topics(topic, timeout=10).topics[topic]
    assert sorted(metadata.partitions) == [0, 1]
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})
    sent = {0: [], 1: []}
    for i in range(40):
        partition = i % 2
        headers = [("seq", str(i).encode()), ("dup", b"a"), ("dup", b"b"), ("empty", b"")]
        value = f"value-{i}".encode() * (1 + i % 3)
        producer.produce(topic, value=value, key=f"k{i}".encode(), partition=partition, headers=headers)
        sent[partition].append((f"k{i}".encode(), value, headers))
    assert producer.flush(15) == 0
    got = {0: [], 1: []}
    for msg in _consume_all(kafka_broker.bootstrap, topic, _name("g-smoke"), 40):
        got[msg.partition()].append((msg.key(), msg.value(), msg.headers()))
        assert msg.offset() == len(got[msg.partition()]) - 1
    assert got == sent  # per partition: every record, in order, headers (repeated keys too) intact


def test_committed_offsets_keep_their_metadata(kafka_broker):
    topic = kafka_broker.create_topic(_name("commit"), partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(10):
        producer.produce(topic, value=b"x%d" % i, partition=i % 2)
    assert producer.flush(15) == 0
    group = _name("g-commit")
    config = {"bootstrap.servers": kafka_broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    meta = {0: json.dumps({"entry": "a", "held": [3, 4]}), 1: "plain text \u00e9"}
    consumer = Consumer(config)
    try:
        done = consumer.commit(offsets=[TopicPartition(topic, 0, 3, meta[0]), TopicPartition(topic, 1, 5, meta[1])],
                               asynchronous=False)
        assert all(tp.error is None for tp in done)
    finally:
        consumer.close()
    reader = Consumer(config)  # a new member of the group reads back what the broker kept
    try:
        committed = reader.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    finally:
        reader.close()
    assert [(tp.partition, tp.offset, tp.metadata) for tp in committed] == [(0, 3, meta[0]), (1, 5, meta[1])]


def _cli() -> list[str]:
    script = pathlib.Path(sys.executable).with_name("dts-bridge")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bridge"]


def test_cli_produce_then_consume_equals_convert(kafka_broker, tmp_path):
    sample = ROOT / "samples" / "mixed.pb"
    topic = kafka_broker.create_topic(_name("cli"), partitions=2)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = dict(cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    proc = subprocess.run([*_cli(), "produce", str(sample), "--brokers", kafka_broker.bootstrap, "--topic", topic],
                          **run)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "consumed.jsonl"
    proc = subprocess.run([*_cli(), "consume", "--brokers", kafka_broker.bootstrap, "--topic", topic,
                           "--group", _name("g-cli"), "--from-beginning", "--to", "blob", "-o", str(out),
                           "--idle-timeout", "1", "--json"], **run)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    ref = tmp_path / "converted.jsonl"
    proc = subprocess.run([*_cli(), "convert", str(sample), "-o", str(ref), "--to", "blob"], **run)
    assert proc.returncode in (0, 1), proc.stderr
    expected = ref.read_bytes().splitlines()
    assert expected and out.read_bytes().splitlines() == expected  # every Blob line, in order
    assert report["rejected"] == 0 and report["held_segments"] == 0 and report["stopped"] == "idle"
    assert sum(report["committed"].values()) == report["envelopes"]  # all on one partition (key = file name)
