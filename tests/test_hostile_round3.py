"""Hostile inputs, round 3: what a fuzz round found in `inspect`, `sync --dead-letters kafka:`,
`state_location`'s tail files and `samples`.

- `inspect` of a file that is no DTS stream (zeros, random bytes, garbage between Envelopes): one
  error per stretch of garbage ("N bytes from byte X on look like no DTS stream"), read past at the
  speed of a byte search, where it once reported an error per zero byte at ~23 us each;
- `--dead-letters kafka:TOPIC` takes only names Kafka takes (a usage error naming the flag), and a
  dead-letter topic whose brokers do not answer is a `KafkaError`, never an internal error;
- a tail file that is a folder or a dangling symbolic link, a `state_location` that is a file or
  that is gone after the first micro-batch: each an `OptionsError` naming the path, never a bare
  OSError, an empty state or a skipped tail;
- `samples DIR` makes DIR only where its folder exists, unless --mkdir, as every other command.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.cli import main as cli
from bridge.errors import BridgeError, OptionsError

ROOT = Path(__file__).resolve().parents[1]
MIXED = ROOT / "samples" / "mixed.pb"
MB = 1 << 20


@pytest.fixture(autouse=True)
def _debug(monkeypatch):
    monkeypatch.setenv(cli.DEBUG_ENV, "1")  # a traceback, not an "internal error" line, if anything escapes


def run(capsysbinary, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsysbinary.readouterr()
    out, err = out.decode(), err.decode()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- inspect: garbage costs one error and a byte search, not an error per byte ---------------------

def _inspect_subprocess(path: Path, timeout: float = 30) -> tuple[dict, float]:
    """`dts-bridge inspect PATH --json` as its own process (so the old per-byte behaviour fails
    this test by its timeout instead of running for minutes): the report and the seconds it took."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bridge", "inspect", str(path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - started
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return json.loads(done.stdout), took


def test_inspect_of_a_zero_filled_file_is_one_error_read_past_fast(tmp_path):
    path = tmp_path / "zeros.pb"
    path.write_bytes(bytes(4 * MB))
    report, took = _inspect_subprocess(path)
    assert report["records"] == 0 and report["errors"] == 1, report
    assert report["first_errors"] == [f"{4 * MB} bytes from byte 0 on look like no DTS stream (16 messages in a row "
                                      f"that are no DTS Envelope; no Envelope starts in them) (source {path})"]
    assert took < 15, took  # the interpreter's start included; it was ~100 s (23 us per zero byte)


def test_inspect_of_random_bytes_is_bounded_and_says_so(tmp_path):
    path = tmp_path / "random.pb"
    path.write_bytes(random.Random(1729).randbytes(4 * MB))
    report, took = _inspect_subprocess(path)
    assert report["records"] == 0 and 1 <= report["errors"] <= 3, report
    assert "look like no DTS stream" in report["first_errors"][0], report
    assert f"{4 * MB} bytes from byte 0 on" in report["first_errors"][0], report
    assert took < 15, took


def test_inspect_reads_on_at_the_next_envelope_after_garbage(tmp_path, capsysbinary):
    """Zeros and random bytes between whole copies of a sample: every Entry of the copies is
    counted, each stretch of garbage is one error naming its length, start and where the stream
    goes on; a few bad messages (fewer than GARBAGE_RUN) are still each their own error."""
    good = MIXED.read_bytes()
    noise = random.Random(7).randbytes(100_000)
    path = tmp_path / "mixed-garbage.pb"
    path.write_bytes(good + bytes(64 * 1024) + good + noise + good + bytes(3) + good)
    code, out, _ = run(capsysbinary, "inspect", path, "--json")
    report = json.loads(out)
    clean = json.loads(run(capsysbinary, "inspect", MIXED, "--json")[1])
    assert code == 1 and report["records"] == 4 * clean["records"], report
    first = report["first_errors"]
    at = len(good)
    assert first[0] == (f"65536 bytes from byte {at} on look like no DTS stream (16 messages in a row that are no DTS "
                        f"Envelope; the next Envelope starts at byte {at + 65536}) (source {path})")
    at2 = 2 * len(good) + 65536
    assert first[1].startswith(f"100000 bytes from byte {at2} on look like no DTS stream (") and \
        first[1].endswith(f"the next Envelope starts at byte {at2 + 100_000}) (source {path})"), first
    # the three zeros: three messages that are no Envelope, each named (fewer than a run)
    assert report["errors_by_kind"] == {"DecodeError": 2, "FramingError": 3}, report
    assert [e.startswith("unsupported Envelope version 0") for e in first[2:]] == [True, True, True]


def test_inspect_keeps_naming_a_truncated_last_message(tmp_path, capsysbinary):
    good = MIXED.read_bytes()
    path = tmp_path / "cut.pb"
    path.write_bytes(good + good[:50])  # the next Envelope's prefix and a part of it
    code, out, _ = run(capsysbinary, "inspect", path, "--json")
    report = json.loads(out)
    assert code == 1 and report["errors"] == 1 and report["first_errors"][0].startswith("truncated message"), report
    # after garbage, a truncated Envelope at the end: the garbage, then the truncation
    path.write_bytes(good + bytes(1000) + good[:50])
    report = json.loads(run(capsysbinary, "inspect", path, "--json")[1])
    first = report["first_errors"]
    assert report["errors"] == 2 and first[0].startswith(f"1000 bytes from byte {len(good)} on look like"), first
    assert first[1].startswith("truncated message") and f"byte {len(good) + 1000}" in first[1], first


def test_inspect_of_garbage_from_stdin(tmp_path, capsysbinary, monkeypatch):
    import io
    data = MIXED.read_bytes() + bytes(MB)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = run(capsysbinary, "inspect", "-", "--from", "dts", "--json")
    report = json.loads(out)
    assert code == 1 and report["errors"] == 1 and report["first_errors"][0].startswith(
        f"{MB} bytes from byte {len(MIXED.read_bytes())} on look like no DTS stream"), report


# ---- sync --dead-letters kafka:TOPIC: names Kafka takes; brokers that do not answer ----------------

@pytest.mark.parametrize("name", ["a/b", "..", ".", "t,u", "x" * 250, " t", "t u", "tópico"])
def test_dead_letters_topic_names_kafka_refuses_are_usage_errors(capsysbinary, name):
    code, _, err = run(capsysbinary, "sync", "--brokers", f"127.0.0.1:{closed_port()}", "--topic", "t",
                       "--group", "g", "--datahub-endpoint", "http://127.0.0.1:9", "--project", "p",
                       "--datahub-topic", "blobs", "--on-table-error", "dlq", "--dead-letters", f"kafka:{name}")
    assert code == 2 and "--dead-letters kafka:TOPIC" in err and len(err.strip().splitlines()) == 1, err


def test_dead_letters_topic_names_kafka_takes():
    from bridge.kafka.deadletters import topic_problem
    assert topic_problem("x" * 249) is None and topic_problem("dts.dead-letters_1") is None
    assert "at most 249" in topic_problem("x" * 250)
    assert topic_problem("..") and topic_problem(".") and topic_problem("")


def test_dead_letters_to_brokers_that_do_not_answer_are_a_kafka_error():
    """On a closed local port: halting tables again needs the topic read before the run starts, so
    that is a KafkaError naming the topic; otherwise nothing connects until a letter is written,
    and a letter that cannot reach the topic fails `sync` (before any commit), a KafkaError too."""
    pytest.importorskip("confluent_kafka")
    from bridge.kafka import KafkaError
    from bridge.kafka.deadletters import KafkaDeadLetters
    config = {"bootstrap.servers": f"127.0.0.1:{closed_port()}", "log_level": 0}
    halting = KafkaDeadLetters(config, "dlq", "src", timeout=1.0, halt_tables=True)
    with pytest.raises(KafkaError, match="cannot reach the brokers of the dead-letter topic dlq"):
        halting.restore()
    letters = KafkaDeadLetters(config, "dlq", "src", timeout=1.0)
    assert letters.restore() == {} and letters._producer is None
    letters.sync()  # nothing written: nothing to wait for
    letters.write(entry_bytes=b"\x01", source="src", partition=0, offset=5, entry=0, row=None, table="db.t",
                  error="boom", datahub_topic="blobs")
    with pytest.raises(KafkaError, match="dead letters to dlq were not delivered: cannot reach the brokers"):
        letters.sync()
    letters.close()
    with pytest.raises(KafkaError, match="not allow"):
        KafkaDeadLetters(config, "a/b", "src")


# ---- state_location's tail files ----------------------------------------------------------------------

def _tails():
    pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")  # bridge.spark.tails imports the Spark jobs
    from bridge.spark import tails
    return tails


def _store(tails, location, partition=0):
    fs, root = tails.open_location(str(location))
    return tails.TailStore(fs, root, "query-1", "blob", "dts", partition)


def _state(last):
    return (last, False, [], [(None, 3, last - 1, 2, 5, [b"a" * 10, b"b"])], [])


def test_a_tail_that_is_a_folder_is_named(tmp_path):
    tails = _tails()
    store = _store(tails, tmp_path / "tails")
    store.save(0, _state(5), store.load(0)[1])
    os.mkdir(os.path.join(store.dir, f"{1:020d}.arrow"))
    with pytest.raises(OptionsError, match=rf"state_location: .*{1:020d}\.arrow is a folder, where a tail file"):
        store.load(2)


def test_a_tail_that_is_a_dangling_symlink_is_named_not_skipped(tmp_path):
    tails = _tails()
    store = _store(tails, tmp_path / "tails")
    store.save(0, _state(5), store.load(0)[1])
    store.save(1, _state(6), store.load(1)[1])
    newest = os.path.join(store.dir, f"{1:020d}.arrow")
    os.replace(newest, tmp_path / "moved.arrow")
    os.symlink(tmp_path / "gone.arrow", newest)
    with pytest.raises(OptionsError, match=rf"{1:020d}\.arrow is a symbolic link to .*gone\.arrow, which does not "
                                           "exist"):
        store.load(2)  # was: micro-batch 0's tail, as if 1 had never been


def test_a_state_location_that_is_a_file_is_named_at_load(tmp_path):
    tails = _tails()
    blocked = tmp_path / "file"
    blocked.write_text("x")
    for location in (blocked, blocked / "under"):
        store = _store(tails, location)
        for batch in (0, 3):
            with pytest.raises(OptionsError, match=f"state_location: {blocked} is a file, not a folder"):
                store.load(batch)
        with pytest.raises(OptionsError, match="cannot be written"):  # save alone: named too
            store.save(0, _state(5), [])
    # a file in place of the partition's folder
    store = _store(tails, tmp_path / "tails")
    os.makedirs(os.path.dirname(store.dir))
    Path(store.dir).write_text("x")
    with pytest.raises(OptionsError, match=f"{store.dir} is a file, not a folder"):
        store.load(1)


def test_a_state_location_gone_after_the_first_micro_batch_is_an_error(tmp_path):
    """The driver makes the folder before the query starts: missing in a later micro-batch, the
    tails are out of reach (an executor on another machine, or removed): not an empty state."""
    tails = _tails()
    store = _store(tails, tmp_path / "tails")
    assert store.load(0) == (None, [])  # the first micro-batch may come first
    with pytest.raises(OptionsError, match=r"is not there in micro-batch 4"):
        store.load(4)
    os.makedirs(tmp_path / "tails")
    assert store.load(4) == (None, [])  # a partition with no rows before: no tail, and no fault


def test_an_unreadable_tail_is_an_options_error_naming_it(tmp_path):
    tails = _tails()
    store = _store(tails, tmp_path / "tails")
    store.save(0, _state(5), store.load(0)[1])
    path = os.path.join(store.dir, f"{0:020d}.arrow")
    Path(path).write_bytes(b"")
    with pytest.raises(OptionsError, match=rf"{0:020d}\.arrow is not a tail file"):
        store.load(1)


# ---- samples DIR: made only where its folder exists, unless --mkdir -------------------------------------

def test_samples_refuses_a_missing_folder_above_dir_unless_mkdir(tmp_path, capsysbinary):
    deep = tmp_path / "no" / "such" / "deep" / "dir"
    code, _, err = run(capsysbinary, "samples", deep)
    assert code == 2 and "does not exist" in err and "--mkdir" in err, err
    assert not (tmp_path / "no").exists()
    code, _, err = run(capsysbinary, "samples", deep, "--mkdir")
    assert code == 0 and (deep / "mixed.pb").exists(), err
    code, _, _ = run(capsysbinary, "samples", tmp_path / "one")  # DIR itself, in an existing folder
    assert code == 0 and (tmp_path / "one" / "mixed.pb").exists()
    (tmp_path / "afile").write_text("x")
    code, _, err = run(capsysbinary, "samples", tmp_path / "afile")
    assert code == 2 and "is not a directory" in err, err


def test_errors_here_are_the_librarys_own():
    assert issubclass(OptionsError, BridgeError)
