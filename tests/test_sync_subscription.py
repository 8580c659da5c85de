"""`dts-bridge sync --to dts --subscription ID`: every commit of positions is also copied to a DataHub
subscription, for DataHub's lag view only (docs/kafka.md, "DataHub's lag view: --subscription").

The stand-in DataHub's subscription API is checked first with the real pydatahub client (sessions,
commits, takeovers, resets, the error codes); then real runs: the real Apache Kafka broker with
transactions, the stand-in over HTTP (GetRecords pages of a few records, so a run lasts long enough
to be interfered with), the forward `sync --to blob` filling a 3-shard Blob topic first. What must
hold: after a run the subscription holds, per shard, the last record below the committed position
(its sequence and system time); a run SIGKILLed and restarted resumes from the Kafka offsets topic
even though the subscription was reset meanwhile (each Entry lands once); another consumer taking the
offset session over mid-run does not stop the run; an unknown subscription is a usage error (2).
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid

import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")

from datahub import DataHub  # noqa: E402
from datahub import exceptions as dx  # noqa: E402
from datahub.models import OffsetBase, OffsetWithSession, SubscriptionState  # noqa: E402

from support.datahub_standin import StandInDataHub  # noqa: E402
from support.dts_kafka import read_back  # noqa: E402
from support.pipeline import ENV, ROOT, bridge_cli, run_bridge  # noqa: E402
from support.sync_runs import entries_of, free_port, produce, scrape  # noqa: E402

PROJECT = "dts"
TOPIC = "blobs"
SAMPLE = ROOT / "samples" / "mixed.pb"
PAGE = 4  # records per GetRecords answer: a run takes several rounds of requests per shard


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _client(server: StandInDataHub) -> DataHub:
    return DataHub("test-id", "test-secret", server.endpoint)


# ---- the stand-in's subscription API, through the real pydatahub client ----------------------------

def test_standin_subscriptions_behave_as_datahub_documents():
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "t", shard_count=2)
        client = _client(server)
        sub = client.create_subscription(PROJECT, "t", "lag view").sub_id
        assert len(sub) == 18 and sub[:13].isdigit() and sub[13:].isalpha()
        listed = client.list_subscription(PROJECT, "t", "", 1, 10)
        assert listed.total_count == 1 and listed.subscriptions[0].sub_id == sub
        assert listed.subscriptions[0].state == SubscriptionState.ACTIVE
        # nothing committed yet: -1 / -1; the first session of a shard is 0, the next 1
        opened = client.init_and_get_subscription_offset(PROJECT, "t", sub, ["0", "1"]).offsets
        assert {k: (o.sequence, o.timestamp, o.session_id) for k, o in opened.items()} == \
            {"0": (-1, -1, 0), "1": (-1, -1, 0)}
        mine = opened["0"]
        client.update_subscription_offset(PROJECT, "t", sub, {"0": OffsetWithSession(7, 1234, mine.version,
                                                                                     mine.session_id)})
        got = client.get_subscription_offset(PROJECT, "t", sub).offsets
        assert (got["0"].sequence, got["0"].timestamp, got["1"].sequence) == (7, 1234, -1)
        assert got["0"].session_id == ""  # a read gives no session: it cannot commit
        # another consumer opens a session: ours is stale, and the offset stays as it was
        other = _client(server).init_and_get_subscription_offset(PROJECT, "t", sub, ["0"]).offsets["0"]
        assert (other.sequence, other.session_id) == (7, 1)
        with pytest.raises(dx.InvalidOperationException) as refused:
            client.update_subscription_offset(PROJECT, "t", sub, {"0": OffsetWithSession(9, 1300, mine.version,
                                                                                         mine.session_id)})
        assert refused.value.error_code == "OffsetSessionChanged"
        assert server.subscription_offsets(PROJECT, "t", sub)["0"]["sequence"] == 7
        # all or nothing: a stale shard in the request keeps the good one from being written too
        fresh = client.init_and_get_subscription_offset(PROJECT, "t", sub, ["1"]).offsets["1"]
        with pytest.raises(dx.InvalidOperationException):
            client.update_subscription_offset(PROJECT, "t", sub, {
                "1": OffsetWithSession(3, 99, fresh.version, fresh.session_id),
                "0": OffsetWithSession(9, 1300, mine.version, mine.session_id)})
        assert server.subscription_offsets(PROJECT, "t", sub)["1"]["sequence"] == -1
        # a reset bumps the version: a commit under the old one is refused with OffsetReseted
        client.reset_subscription_offset(PROJECT, "t", sub, {"0": OffsetBase(2, 500)})
        with pytest.raises(dx.OffsetResetException) as reset:
            client.update_subscription_offset(PROJECT, "t", sub, {"0": OffsetWithSession(9, 1300, other.version,
                                                                                         other.session_id)})
        assert reset.value.error_code == "OffsetReseted"
        again = client.init_and_get_subscription_offset(PROJECT, "t", sub, ["0"]).offsets["0"]
        assert (again.sequence, again.timestamp, again.version) == (2, 500, other.version + 1)
        # an INACTIVE subscription refuses commits; an unknown one is NoSuchSubscription
        client.update_subscription_state(PROJECT, "t", sub, SubscriptionState.INACTIVE)
        with pytest.raises(dx.SubscriptionOfflineException):
            client.update_subscription_offset(PROJECT, "t", sub, {"0": OffsetWithSession(3, 1, again.version,
                                                                                         again.session_id)})
        with pytest.raises(dx.DatahubException) as unknown:
            client.get_subscription_offset(PROJECT, "t", "1700000000000NOSUB")
        assert (unknown.value.error_code, unknown.value.status_code) == ("NoSuchSubscription", 404)
        with pytest.raises(dx.ResourceNotFoundException):
            client.init_and_get_subscription_offset(PROJECT, "t", sub, ["9"])
        client.delete_subscription(PROJECT, "t", sub)
        assert client.list_subscription(PROJECT, "t", "", 1, 10).total_count == 0


def test_a_shard_never_opened_refuses_commits_with_offset_session_closed():
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "t", shard_count=1)
        sub = server.create_subscription(PROJECT, "t")
        with pytest.raises(dx.InvalidOperationException) as refused:
            _client(server).update_subscription_offset(PROJECT, "t", sub, {"0": OffsetWithSession(1, 1, 0, 0)})
        assert refused.value.error_code == "OffsetSessionClosed"


# ---- real runs --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def landed(kafka_broker):
    """The sample written through the forward pipeline into a 3-shard Blob topic of a stand-in that
    answers GetRecords PAGE records at a time."""
    server = StandInDataHub(max_get_limit=PAGE).start()
    source = kafka_broker.create_topic(_name("dts-in"), partitions=1)
    produce(kafka_broker, source, SAMPLE, 0)
    forward = run_bridge(bridge_cli(
        "sync", "--brokers", kafka_broker.bootstrap, "--topic", source, "--group", _name("g"), "--from-beginning",
        "--to", "blob", "--datahub-endpoint", server.endpoint, "--project", PROJECT, "--datahub-topic", TOPIC,
        "--shards", "3", "--idle-timeout", "2", "--no-progress", "--status-interval", "0"), timeout=180)
    assert forward.returncode == 0, forward.stderr
    per_shard = [s["records"] for s in server.shards(PROJECT, TOPIC)]
    assert len(per_shard) == 3 and all(n > 3 * PAGE for n in per_shard), per_shard
    yield server
    server.stop()


@pytest.fixture
def standin(landed):
    landed.faults.clear()
    yield landed
    landed.faults.clear()


def _args(server, kafka_broker, topic: str, *extra: str) -> list[str]:
    return bridge_cli("sync", "--to", "dts", "--datahub-endpoint", server.endpoint, "--project", PROJECT,
                      "--datahub-topic", TOPIC, "--brokers", kafka_broker.bootstrap, "--topic", topic,
                      "--from-beginning", "--idle-timeout", "2", "--no-progress", "--status-interval", "0",
                      "--commit-interval", "0.2", *extra)


def _report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def _assert_mirrors(server, sub: str, committed: dict) -> None:
    """The subscription holds, per shard, the record just below the committed position."""
    offsets = server.subscription_offsets(PROJECT, TOPIC, sub)
    assert sorted(committed) == [f"{TOPIC}/{s}" for s in sorted(offsets)] == [f"{TOPIC}/{i}" for i in range(3)]
    for key, position in committed.items():
        shard = key.split("/")[1]
        last = server.records(PROJECT, TOPIC, shard)[position - 1]
        assert (offsets[shard]["sequence"], offsets[shard]["timestamp"]) == (position - 1, last["system_time"]), key


def _assert_each_entry_once(kafka_broker, topic: str) -> None:
    def by_table(entries) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = {}
        for entry in entries:
            h = entry.header
            out.setdefault(f"{h.schemaName}.{h.tableName}" if h.tableName else "", []).append(
                entry.SerializeToString())
        return out
    got = read_back(kafka_broker.bootstrap, topic)
    have = by_table(entry for partition in sorted(got) for entry, _, _ in got[partition])
    want = by_table(entries_of(SAMPLE))
    assert sorted(have) == sorted(want)
    for table in want:
        assert have[table] == want[table], table


def _wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _some_committed(server, sub: str) -> bool:
    return any(o["sequence"] >= 0 for o in server.subscription_offsets(PROJECT, TOPIC, sub).values())


@pytest.mark.parametrize("mode", ["transactions", "no-transactions"])
def test_the_subscription_holds_the_committed_positions(kafka_broker, standin, mode, tmp_path):
    sub = standin.create_subscription(PROJECT, TOPIC, "dts-bridge lag view")
    topic = kafka_broker.create_topic(_name("dts-sub"), partitions=3)
    extra = ["--no-transactions", "--offsets-file", str(tmp_path / "offsets.json")] if mode == "no-transactions" else []
    doc = _report(run_bridge(_args(standin, kafka_broker, topic, "--subscription", sub, "--json", *extra),
                             timeout=120))
    assert doc["committed"] == {f"{TOPIC}/{s['shard_id']}": s["records"] for s in standin.shards(PROJECT, TOPIC)}
    _assert_mirrors(standin, sub, doc["committed"])
    mirror = doc["subscription"]
    assert mirror["subscriptions"] == {TOPIC: sub} and mirror["failures"] == 0 and mirror["commits"] >= 1
    assert mirror["offsets"] == {k: v - 1 for k, v in doc["committed"].items()}
    _assert_each_entry_once(kafka_broker, topic)


def test_unknown_subscription_is_a_usage_error(kafka_broker, standin):
    topic = kafka_broker.create_topic(_name("dts-nosub"), partitions=1)
    done = run_bridge(_args(standin, kafka_broker, topic, "--subscription", "1700000000000NOSUB"), timeout=60)
    assert done.returncode == 2, done.stderr
    assert "1700000000000NOSUB" in done.stderr and f"{PROJECT}/{TOPIC}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert read_back(kafka_broker.bootstrap, topic) in ({}, {0: []})  # nothing was written


def test_killed_run_resumes_from_kafka_not_from_the_reset_subscription(kafka_broker, standin):
    """SIGKILL once the subscription holds something, then reset its offsets (shard 0 back to its
    first record, the others to their last): the restart must still deliver each Entry exactly once,
    so it resumed from the Kafka offsets topic; afterwards the subscription mirrors that run's commits."""
    sub = standin.create_subscription(PROJECT, TOPIC)
    topic = kafka_broker.create_topic(_name("dts-subkill"), partitions=3)
    standin.faults.delay("GetRecords", seconds=0.1)  # a run that lasts while it is killed
    proc = subprocess.Popen(_args(standin, kafka_broker, topic, "--subscription", sub), cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _some_committed(standin, sub), 60, "a first subscription commit")
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    ends = {s["shard_id"]: s["records"] for s in standin.shards(PROJECT, TOPIC)}
    client = _client(standin)
    client.reset_subscription_offset(PROJECT, TOPIC, sub, {
        "0": OffsetBase(0, standin.records(PROJECT, TOPIC, "0")[0]["system_time"]),
        **{s: OffsetBase(n - 1, standin.records(PROJECT, TOPIC, s)[n - 1]["system_time"])
           for s, n in ends.items() if s != "0"}})
    standin.faults.clear()
    doc = _report(run_bridge(_args(standin, kafka_broker, topic, "--subscription", sub, "--json"), timeout=120))
    _assert_each_entry_once(kafka_broker, topic)
    assert doc["committed"] == {f"{TOPIC}/{s}": n for s, n in ends.items()}
    _assert_mirrors(standin, sub, doc["committed"])


def test_a_session_taken_over_mid_run_does_not_stop_the_run(kafka_broker, standin):
    sub = standin.create_subscription(PROJECT, TOPIC)
    topic = kafka_broker.create_topic(_name("dts-substeal"), partitions=3)
    standin.faults.delay("GetRecords", seconds=0.1)
    port = free_port()
    proc = subprocess.Popen(_args(standin, kafka_broker, topic, "--subscription", sub, "--json", "--metrics-port",
                                  str(port)), cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

    def failures_metric() -> float:
        try:
            got = scrape(port)
        except OSError:
            return 0.0
        return sum(v for name, samples in got.items() if name == "dts_bridge_subscription_commit_failures_total"
                   for labels, v in samples.items() if dict(labels).get("reason") == "OffsetSessionChanged")

    try:
        _wait_for(lambda: _some_committed(standin, sub), 60, "a first subscription commit")
        assert proc.poll() is None, "the run ended before its session could be taken over"
        # another consumer of the subscription opens a session on every shard: the run's is stale
        _client(standin).init_and_get_subscription_offset(PROJECT, TOPIC, sub, ["0", "1", "2"])
        _wait_for(failures_metric, 30, "subscription_commit_failures{reason=OffsetSessionChanged} to count it")
        assert proc.poll() is None, "the run stopped"
        standin.faults.clear()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    doc = _report(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    _assert_each_entry_once(kafka_broker, topic)
    mirror = doc["subscription"]
    assert mirror["failures"] >= 1 and set(mirror["failure_reasons"]) == {"OffsetSessionChanged"}, mirror
    assert "OffsetSessionChanged" in err and "opened again at the next commit" in err, err
    _assert_mirrors(standin, sub, doc["committed"])  # the session was opened again and the commits went on
    ops = [(r["op"], r["status"]) for r in standin.requests if r["op"] == "CommitSubscriptionOffset"]
    assert ("CommitSubscriptionOffset", 400) in ops and ops[-1] == ("CommitSubscriptionOffset", 200)


# ---- the mirror on its own, against the stand-in: failures are counted, never waited for -----------

def test_the_mirror_never_blocks_and_counts_what_fails():
    from datahub.models import BlobRecord

    from bridge.datahub.subscription import SubscriptionOffsets, UnknownSubscription, find_subscriptions
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "t", shard_count=2)
        server.create_topic(PROJECT, "u", shard_count=1)
        client = _client(server)
        for shard in ("0", "1"):
            client.put_records(PROJECT, "t", [_on(BlobRecord(blob_data=b"x%d" % i), shard) for i in range(5)])
        times = {s: [r["system_time"] for r in server.records(PROJECT, "t", s)] for s in ("0", "1")}
        sub = server.create_subscription(PROJECT, "t")
        assert find_subscriptions(client, PROJECT, ["u", "t"], [sub]) == {"t": sub}
        with pytest.raises(UnknownSubscription, match="1700000000000NOSUB"):
            find_subscriptions(client, PROJECT, ["u", "t"], ["1700000000000NOSUB"])
        lines: list[str] = []
        mirror = SubscriptionOffsets(client, PROJECT, {"t": sub}, backoff=0.05, max_backoff=0.1,
                                     log=lines.append).start()

        def holds(shard: str, sequence: int) -> bool:
            return server.subscription_offsets(PROJECT, "t", sub).get(shard, {}).get("sequence") == sequence

        mirror.seen(("t", "0"), 0, times["0"][0])
        mirror.committed({("t", "0"): 1, ("u", "0"): 5})  # a topic without a subscription: left alone
        _wait_for(lambda: holds("0", 0), 10, "the first commit")
        assert server.subscription_offsets(PROJECT, "t", sub)["0"]["timestamp"] == times["0"][0]
        # a DataHub that takes 2 s to answer: committed() returns at once, the thread waits
        server.faults.delay("CommitSubscriptionOffset", seconds=2.0, times=1)
        began = time.monotonic()
        mirror.committed({("t", "0"): 3, ("t", "1"): 2})  # times not seen: looked up with GetCursor
        assert time.monotonic() - began < 0.1
        _wait_for(lambda: holds("0", 2) and holds("1", 1), 10, "the slow commit")
        offsets = server.subscription_offsets(PROJECT, "t", sub)
        assert (offsets["0"]["timestamp"], offsets["1"]["timestamp"]) == (times["0"][2], times["1"][1])
        # throttled: retried within the attempt, not a failure
        server.faults.fail_next("CommitSubscriptionOffset", status=429, code="LimitExceeded", times=2)
        mirror.committed({("t", "1"): 3})
        _wait_for(lambda: holds("1", 2), 10, "the throttled commit")
        assert mirror.failures == 0 and mirror.retries >= 2, (dict(mirror.reasons), lines)
        # throttled past the (few) retries: one failure, by its code; the next commit goes through
        server.faults.fail_next("CommitSubscriptionOffset", status=429, code="LimitExceeded", times=4)
        mirror.committed({("t", "1"): 4})
        _wait_for(lambda: mirror.failures == 1, 10, "the throttled-out commit")
        assert dict(mirror.reasons) == {"LimitExceeded": 1} and holds("1", 2)
        mirror.committed({("t", "1"): 5})
        _wait_for(lambda: holds("1", 4), 10, "the commit after the throttling")
        _wait_for(lambda: any("offsets committed again" in line for line in lines), 10, "the recovery told")
        # a split's children get a session of their own when their first position is committed
        left, _ = server.split(PROJECT, "t", "1")
        client.put_records(PROJECT, "t", [_on(BlobRecord(blob_data=b"y"), left)])
        mirror.committed({("t", left): 1})
        _wait_for(lambda: holds(left, 0), 10, "the child shard's commit")
        assert server.subscription_offsets(PROJECT, "t", sub)[left]["session"] == 0
        # the split's parent expires: its NoSuchShard is counted once and it is left out, the others go on
        server.expire_shard(PROJECT, "t", "1")
        client.put_records(PROJECT, "t", [_on(BlobRecord(blob_data=b"z"), left)])
        mirror.committed({("t", "1"): 4, ("t", left): 2})
        _wait_for(lambda: holds(left, 1), 10, "the commit without the expired shard")
        assert mirror.reasons["NoSuchShard"] == 1 and holds("1", 4)
        assert any("shard 1 no longer exists" in line for line in lines), lines
        # deleted: counted and told once, and the pipeline's call still returns at once
        server.delete_subscription(PROJECT, "t", sub)
        mirror.committed({("t", "0"): 2})
        _wait_for(lambda: mirror.failures == 3, 10, "the failed commit")
        assert dict(mirror.reasons) == {"LimitExceeded": 1, "NoSuchShard": 1, "NoSuchSubscription": 1}
        assert "NoSuchSubscription" in mirror.last_error
        assert len([line for line in lines if "NoSuchSubscription" in line]) == 1, lines
        began = time.monotonic()
        mirror.close(wait=1.0)
        assert time.monotonic() - began < 3.0
        assert mirror.report()["offsets"] == {"t/0": 2, "t/1": 4, f"t/{left}": 1}


def _on(record, shard: str):
    record.shard_id = shard
    return record
