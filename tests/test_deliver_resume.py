"""`dts-bridge deliver` killed with SIGKILL at random points and run again (docs/kafka.md, "deliver"),
against the loopback stand-in DataHub: what lands, shard by shard and in order, is the file's
lines routed by DataWorks' rule, each exactly once. The state file makes a rerun start after the
last acknowledged line; records that landed after it, before the kill, are recognised by their
position attributes and not sent again.

What deliver wrote is also read back by the reverse reader (`DataHubSource` and
`DataHubAssembler`, what `sync --to dts` runs): the lines' positions (`dts.pos`) name Entries as
the forward `sync`'s do, so the reader rebuilds exactly the Entries `convert` rebuilds from the
file, UPDATE halves and events of several rows included, after kills too.
"""
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("datahub")
pytestmark = pytest.mark.datahub

from bridge.cli.deliver import DELIVER_STATE_SUFFIX  # noqa: E402
from bridge.cli.main import main  # noqa: E402
from bridge.datahub.calls import make_client  # noqa: E402
from bridge.datahub.source import DataHubSource  # noqa: E402
from bridge.options import Options  # noqa: E402
from bridge.stream import ErrorPolicy, blob_lines_to_entries  # noqa: E402
from bridge.stream.shards import DataHubAssembler  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import SHARDS, expected_per_shard, landed_per_shard  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def standin():
    with StandInDataHub() as server:
        server.create_topic("p", "t", shard_count=len(SHARDS))
        yield server


def blob_input(tmp_path, times: int) -> pathlib.Path:
    """Blob lines of the mixed sample, `times` over (so a run lasts long enough to be killed)."""
    pb = tmp_path / "in.pb"
    pb.write_bytes((ROOT / "samples" / "mixed.pb").read_bytes() * times)
    out = tmp_path / "in.jsonl"
    assert main(["convert", str(pb), "-o", str(out)]) == 0
    return out


def deliver_cmd(server, path, *extra) -> list[str]:
    return [sys.executable, "-m", "bridge", "deliver", str(path), "--datahub-endpoint", server.endpoint,
            "--project", "p", "--topic", "t", "--batch-size", "40", "--status-interval", "0", *extra]


def env() -> dict:
    return {**os.environ, "DATAHUB_ACCESS_ID": "test-id", "DATAHUB_ACCESS_KEY": "test-secret"}


def read_back(server, topic: str = "t", timeout: float = 60.0) -> tuple[list[bytes], list]:
    """What the reverse reader rebuilds from the whole topic: (the Entries' bytes in the order it
    hands them on, what it rejected)."""
    asm = DataHubAssembler(settle=0.0)
    source = DataHubSource(make_client(server.endpoint, "test-id", "test-secret"), "p", topic, from_beginning=True,
                           interval=0.01, backoff=0.001, max_backoff=0.01, wants_tick=asm.waiting, processes=False)
    policy = ErrorPolicy("skip")
    source.open({})
    out, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batch = source.poll(500, 0.05)
            out += [e.SerializeToString() for _, e in asm.entries(batch, policy)]
            if not batch and source.caught_up() and not asm.buffered:
                return out, policy.rejects
    finally:
        source.close()
    raise AssertionError(f"not read back within {timeout} s: {asm.buffered} buffered")


def convert_lines(lines: list[bytes]) -> list[bytes]:
    """The Entries `convert` rebuilds from the lines as one file, in order."""
    return [e.SerializeToString() for _, e in blob_lines_to_entries(lines, ErrorPolicy("fail"), Options())]


def kill_rounds(server, cmd, total: int, kills: int, seed: int) -> int:
    """Run `cmd` `kills` times, each SIGKILLed once a random further share of the records landed
    (or left to finish); returns how many were killed while running."""
    rng = random.Random(seed)
    killed = 0
    for _ in range(kills):
        target = len(server.records("p", "t")) + rng.uniform(0.05, 0.35) * total
        proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while proc.poll() is None and len(server.records("p", "t")) < target and time.monotonic() < deadline:
            time.sleep(0.003)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            killed += 1
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, -signal.SIGKILL), err.decode()
    return killed


def run_kill_test(server, tmp_path, kills: int, seed: int, times: int) -> None:
    path = blob_input(tmp_path, times)
    lines = path.read_bytes().splitlines()
    cmd = deliver_cmd(server, path)
    killed = kill_rounds(server, cmd, len(lines), kills, seed)
    final = subprocess.run(cmd, env=env(), capture_output=True, timeout=120)
    assert final.returncode == 0, final.stderr.decode()
    assert killed >= 1, "no run was killed while it delivered: the test proved nothing"
    got, want = landed_per_shard(server), expected_per_shard(lines)
    for shard in SHARDS:  # in order, each line once: not sorted, not counted
        assert got.get(shard, []) == want.get(shard, []), f"shard {shard}: lost, duplicated or reordered"
    state = json.loads(pathlib.Path(str(path) + DELIVER_STATE_SUFFIX).read_text())
    assert state["line"] == len(lines) and state["delivered"] >= 1
    entries, rejected = read_back(server)  # the kills never split an Entry's positions
    assert not rejected, rejected[:3]
    assert entries == convert_lines(lines), "the reverse reader rebuilt other Entries than convert"


def test_the_reverse_reader_rebuilds_delivered_lines_as_convert_does(standin, tmp_path, monkeypatch):
    """deliver's positions name Entries: the lines of one Entry (an UPDATE's two halves, an event's
    rows) share partition:offset:entry, rows numbered in it, so the reverse reader hands the file's
    Entries on whole, as `convert` rebuilds them from the file. (Before, `dts.pos` was 0:LINE:0:0:
    every line an Entry of its own, and every UPDATE's first half was rejected as incomplete.) The
    batch of 7 records ends inside Entries: the state's line is always an Entry's first line."""
    monkeypatch.setenv("DATAHUB_ACCESS_ID", "test-id")
    monkeypatch.setenv("DATAHUB_ACCESS_KEY", "test-secret")
    path = blob_input(tmp_path, 2)
    lines = path.read_bytes().splitlines()
    want = convert_lines(lines)
    assert len(want) < len(lines), "the sample has no Entry of several lines: the test proves nothing"
    argv = ["deliver", str(path), "--datahub-endpoint", standin.endpoint, "--project", "p", "--topic", "t",
            "--batch-size", "7", "--status-interval", "0"]
    assert main(argv) == 0
    assert landed_per_shard(standin) == expected_per_shard(lines)
    # the positions: per Entry (as convert groups the lines) one partition:offset:entry, rows 0.. in order
    landed = sorted((tuple(int(x) for x in r["attributes"]["dts.pos"].split(":")), r["data"])
                    for r in standin.records("p", "t"))
    assert [data for _, data in landed] == lines  # in position order: the file's order
    groups = [g for g, _ in landed]
    assert len(set(groups)) == len(groups)
    assert all(g[0] == 0 and g[2] == 0 and g[1] + g[3] == number for number, g in enumerate(groups, 1))
    assert len({g[:3] for g in groups}) == len(want)
    entries, rejected = read_back(standin)
    assert not rejected, [r.get("error") for r in rejected[:3]]
    assert entries == want


def test_deliver_killed_and_rerun_lands_each_line_once(standin, tmp_path):
    run_kill_test(standin, tmp_path, kills=3, seed=5, times=12)


def test_deliver_killed_with_faults_injected(standin, tmp_path):
    # lost answers after the write landed, throttling and server errors, between the kills
    standin.faults.chaos(11, p_ack_lost=0.05, p_throttle=0.05, p_5xx=0.05)
    run_kill_test(standin, tmp_path, kills=3, seed=23, times=12)


@pytest.mark.deep
@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") != "deep", reason="many kill rounds: make test-deep")
@pytest.mark.parametrize("seed", range(5))
def test_deliver_killed_many_times(standin, tmp_path, seed):
    standin.faults.chaos(seed, p_ack_lost=0.03, p_throttle=0.03, p_5xx=0.03)
    run_kill_test(standin, tmp_path, kills=8, seed=seed, times=24)


def test_rerun_after_a_complete_run_sends_nothing_and_restart_is_checked(standin, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DATAHUB_ACCESS_ID", "test-id")
    monkeypatch.setenv("DATAHUB_ACCESS_KEY", "test-secret")
    path = blob_input(tmp_path, 1)
    lines = path.read_bytes().splitlines()
    argv = ["deliver", str(path), "--datahub-endpoint", standin.endpoint, "--project", "p", "--topic", "t",
            "--status-interval", "0"]
    assert main(argv) == 0
    assert main(argv) == 0
    assert "delivered 0 of 0 records" in capsys.readouterr().err
    assert landed_per_shard(standin) == expected_per_shard(lines)
    # the state names its input: another file under the same state is refused, --restart takes it
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"\n".join(lines[:3]) + b"\n")
    state = str(path) + DELIVER_STATE_SUFFIX
    assert main([*argv[:1], str(other), *argv[2:], "--state", state]) == 2
    assert "--restart" in capsys.readouterr().err
    # the same file grown (lines appended): resumed, only the new lines go
    with open(path, "ab") as fh:
        fh.write(lines[0] + b"\n")
    assert main(argv) == 0
    assert "delivered 1 of 1 records" in capsys.readouterr().err
    assert landed_per_shard(standin) == expected_per_shard(lines + lines[:1])
    # another topic under the same state is refused too
    assert main([*argv[:-2], "--topic", "u", "--status-interval", "0"]) == 2
    assert "not p/u" in capsys.readouterr().err


def test_rejects_are_cut_back_with_the_state(standin, tmp_path, monkeypatch):
    """A resumed run appends to the rejects file from the length the state vouches for."""
    monkeypatch.setenv("DATAHUB_ACCESS_ID", "test-id")
    monkeypatch.setenv("DATAHUB_ACCESS_KEY", "test-secret")
    path = blob_input(tmp_path, 1)
    lines = path.read_bytes().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines[:5] + [b"{not json"] + lines[5:]) + b"\n")
    rejects = tmp_path / "rejects.jsonl"
    argv = ["deliver", str(bad), "--datahub-endpoint", standin.endpoint, "--project", "p", "--topic", "t",
            "--on-error", "skip", "--rejects", str(rejects), "--batch-size", "3", "--status-interval", "0"]
    assert main(argv) == 1
    first = rejects.read_bytes()
    assert len(first.splitlines()) == 1
    with open(rejects, "ab") as fh:  # what a kill after a rejection and before the state write leaves
        fh.write(b'{"half a line')
    assert main(argv) == 0  # nothing left to deliver, nothing rejected again
    assert rejects.read_bytes() == first
    assert landed_per_shard(standin) == expected_per_shard(lines)


def test_metrics_and_status_line(standin, tmp_path):
    """--metrics-port serves Prometheus text while the run lasts; --status-interval writes status lines."""
    import urllib.request
    path = blob_input(tmp_path, 4)
    lines = path.read_bytes().splitlines()
    standin.faults.delay("PutRecordsByShard", seconds=0.05)  # a run long enough to scrape and to report
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [*deliver_cmd(standin, path)[:-2], "--status-interval", "0.2", "--metrics-port", str(port)]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    body = ""
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            time.sleep(0.05)
            continue
        if 'dts_bridge_datahub_requests_total{request="PutRecordsByShard"}' in body:
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert 'dts_bridge_datahub_request_seconds_bucket{' in body and "dts_bridge_records_in_total" in body
    status = [line for line in err.splitlines() if "records sent" in line and "acknowledged to line" in line]
    assert status and "requests" in status[0] and "retries" in status[0], err
    assert landed_per_shard(standin) == expected_per_shard(lines)
