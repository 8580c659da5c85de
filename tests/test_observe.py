"""Watching a run (bridge/cli/observe.py, docs/kafka.md "Metrics and progress"): the progress display
only on a terminal, the status line, Prometheus metrics, the librdkafka log deduplicated, and the
small CLI faces (--version, a missing output directory).
"""
import io
import logging
import pathlib
import subprocess
import sys
import time
import urllib.request

import pytest

from bridge.cli import observe
from bridge.cli.main import main
from bridge.stream import Tally

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Tty(io.StringIO):
    def isatty(self):
        return True


# ---- progress ------------------------------------------------------------------------------------

def test_progress_shows_on_a_terminal_only():
    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = observe.progress(unit="records", stream=stream, delay=0, mininterval=0,
                               describe=lambda: "3 rejected")
        assert list(bar.wrap(range(1000))) == list(range(1000))
        if stream is tty:
            assert bar.bar.n == 1000  # every item counted, the last partial batch too
        bar.close()
    assert "768 records" in tty.getvalue() and "3 rejected" in tty.getvalue()
    assert pipe.getvalue() == ""
    off = observe.progress(stream=Tty(), enabled=False)
    assert not off.enabled and list(off.wrap("abc")) == ["a", "b", "c"]


def test_progress_follows_a_count_kept_elsewhere():
    tty = Tty()
    count = [0]
    bar = observe.progress(unit="Envelopes", stream=tty, delay=0, mininterval=0).follow(lambda: count[0], every=0.01)
    count[0] = 42
    deadline = time.monotonic() + 5
    while bar.bar.n < 42 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bar.bar.n == 42
    bar.close()
    assert "42 Envelopes" in tty.getvalue()


def test_convert_progress_never_reaches_a_pipe(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bridge", "convert", str(ROOT / "samples" / "large.pb"),
                             "-o", str(tmp_path / "x.jsonl")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr


# ---- status line ---------------------------------------------------------------------------------

def test_status_line_every_interval_with_rates():
    stream = io.StringIO()
    total = [0]

    def render(status):
        total[0] += 100
        return f"{total[0]} done ({observe.rate_text(status.rate('done', total[0]))})"
    with observe.StatusLine(0.05, stream=stream, label="dts-bridge x", render=render):
        time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("dts-bridge x: ") and "/s)" in line for line in lines)
    silent = io.StringIO()
    with observe.StatusLine(0, stream=silent, render=render):
        time.sleep(0.1)
    assert silent.getvalue() == ""


def test_status_line_survives_a_failing_render():
    stream = io.StringIO()
    status = observe.StatusLine(1, stream=stream, label="x", render=lambda s: 1 / 0)
    status.start()
    status.emit()
    status.stop()
    assert "status unavailable: ZeroDivisionError" in stream.getvalue()


# ---- metrics -------------------------------------------------------------------------------------

def test_metrics_mirror_totals_and_serve_prometheus_text():
    metrics = observe.Metrics()
    tally = Tally(input=10, converted=8, rejected=2, outputs=12, envelopes=3, zero_dates=4, out_of_range=1)
    metrics.on_collect(lambda: metrics.count_tally(tally))
    metrics.lag.labels(topic="t", partition="0").set(7)
    with metrics.time_request("PutRecordsByShard"):
        pass
    port = metrics.serve(0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "dts_bridge_records_in_total 10.0" in body and "dts_bridge_rejected_total 2.0" in body
        assert 'dts_bridge_values_substituted_total{kind="zero_dates"} 4.0' in body
        assert 'dts_bridge_values_substituted_total{kind="out_of_range"} 1.0' in body
        tally.input = 15  # a scrape sees the running total of the moment
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        metrics.close()
    assert "dts_bridge_records_in_total 15.0" in body
    assert 'dts_bridge_lag{partition="0",topic="t"} 7.0' in body
    assert 'dts_bridge_datahub_request_seconds_count{request="PutRecordsByShard"} 1.0' in body
    assert 'dts_bridge_build_info{version="' in body
    metrics.count_to(metrics.records_in, 3)  # a total never goes back down
    assert metrics.value("records_in_total") == 15.0


def test_timed_datahub_client_counts_calls_and_throttling():
    class LimitExceededException(Exception):
        pass

    class Failed:
        error_code = "LimitExceeded"

    class Client:
        endpoint = "http://x"

        def put_records(self, *args):
            return type("Result", (), {"failed_records": [Failed(), Failed()]})()

        def list_shard(self, *args):
            raise LimitExceededException("slow down")

    metrics = observe.Metrics()
    client = metrics.timed_datahub_client(Client())
    assert client.endpoint == "http://x"
    client.put_records("p", "t", [])
    with pytest.raises(LimitExceededException):
        client.list_shard("p", "t")
    assert metrics.value("datahub_requests_total", request="PutRecords") == 1
    assert metrics.value("datahub_throttles_total", request="PutRecords") == 2
    assert metrics.value("datahub_throttles_total", request="ListShard") == 1
    observer = metrics.datahub_observer()
    observer("request", op="PutRecordsByShard", seconds=0.02, outcome="ok")
    observer("retry", reason="throttled", code="LimitExceeded")
    assert metrics.value("datahub_retries_total") == 1
    assert metrics.value("datahub_request_seconds_count", request="PutRecordsByShard") == 1


def test_metrics_port_in_use_is_a_usage_error(tmp_path, capsys):
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = tmp_path / "in.jsonl"
        path.write_bytes(b"")
        code = main(["deliver", str(path), "--datahub-endpoint", "http://127.0.0.1:9", "--project", "p",
                     "--topic", "t", "--metrics-port", str(port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"127.0.0.1:{port}" in err[0]


# ---- the librdkafka log ------------------------------------------------------------------------

def test_dedup_filter_holds_repeats_and_counts_them():
    now = [0.0]
    stream = io.StringIO()
    logger = observe.kafka_logger("dts-bridge.test-dedup", stream=stream, interval=10)
    dedup = next(f for f in logger.filters if isinstance(f, observe.DedupFilter))
    dedup.clock = lambda: now[0]
    for i in range(50):  # librdkafka's own words, with a timing that changes
        logger.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1",
                     f"[thrd:h:9/bootstrap]: h:9/bootstrap: Connect to ipv4#h:9 failed: Connection refused "
                     f"(after {i % 3}ms in state CONNECT)")
        now[0] += 0.1
    logger.warning("something else")
    logger.info("not shown by default")
    now[0] += 10
    logger.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1",
                 "[thrd:h:9/bootstrap]: h:9/bootstrap: Connect to ipv4#h:9 failed: Connection refused "
                 "(after 0ms in state CONNECT)")
    observe.flush_repeats(logger)
    lines = stream.getvalue().splitlines()
    assert lines[0] == ("kafka error (FAIL): h:9/bootstrap: Connect to ipv4#h:9 failed: Connection refused "
                        "(after 0ms in state CONNECT)")
    assert lines[1] == "kafka warning: something else"
    assert lines[2].endswith("(and 49 more times in the last 10 s)")
    assert len(lines) == 3  # nothing held after that: flush_repeats had nothing to say
    verbose = observe.kafka_logger("dts-bridge.test-verbose", stream=io.StringIO(), verbose=1)
    assert verbose.isEnabledFor(logging.INFO) and not verbose.isEnabledFor(logging.DEBUG)


def test_one_event_told_by_two_clients_or_threads_is_one_line():
    """librdkafka tells the event as (facility, client name, "[thrd:...]: text"): the line shown has
    neither the client nor the thread, so neither makes a repeat a new line (a consume run under
    load printed the refused connection of its consumer and of the client beside it twice)."""
    stream = io.StringIO()
    logger = observe.kafka_logger("dts-bridge.test-dedup-clients", stream=stream, interval=10)
    text = "h:9/bootstrap: Connect to ipv4#h:9 failed: Connection refused (after 0ms in state CONNECT)"
    logger.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1", f"[thrd:h:9/bootstrap]: {text}")
    logger.error("%s [%s] %s", "FAIL", "rdkafka#producer-2", f"[thrd:main]: {text[:-1]}, 1 identical error(s) "
                 "suppressed)")
    logger.error("%s [%s] %s", "REQTMOUT", "rdkafka#consumer-1", f"[thrd:h:9/bootstrap]: {text}")
    lines = stream.getvalue().splitlines()
    assert lines == [f"kafka error (FAIL): {text}", f"kafka error (REQTMOUT): {text}"]


def test_a_refused_broker_prints_a_couple_of_lines(tmp_path):
    """librdkafka reports a refused connection several times a second: one line, then a count."""
    pytest.importorskip("confluent_kafka")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    result = subprocess.run([sys.executable, "-m", "bridge", "consume", "--brokers", f"127.0.0.1:{port}",
                             "--topic", "t", "--offsets-file", str(tmp_path / "o.json"), "--partitions", "0",
                             "-o", str(tmp_path / "out.jsonl"), "--idle-timeout", "0.4", "--status-interval", "0"],
                            capture_output=True, text=True, timeout=60)
    refused = [line for line in result.stderr.splitlines() if "Connection refused" in line]
    assert 1 <= len(refused) <= 2, result.stderr
    assert len(result.stderr.splitlines()) <= 4, result.stderr


# ---- small CLI faces -----------------------------------------------------------------------------

def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"dts-bridge {observe.bridge_version()}"


def test_consume_into_a_missing_directory_is_one_line_exit_2(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "dir"
    code = main(["consume", "--brokers", "127.0.0.1:9", "--topic", "t", "--group", "g",
                 "-o", str(missing / "p{partition}.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "does not exist" in err[0] and "--mkdir" in err[0]
    assert not (tmp_path / "no").exists()


def test_doctests():
    import doctest
    assert doctest.testmod(observe).failed == 0
