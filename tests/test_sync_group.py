"""`dts-bridge sync` as members of one Kafka consumer group (issue 31, "Done when"), end to end on
real parts: the real Apache Kafka broker (tests/support/kafka_broker.py), `dts-bridge sync`
processes, the stand-in DataHub (tests/support/datahub_standin.py) with chaos faults at the sync
tests' rates.

- Three members share a topic's partitions (subscribe, cooperative-sticky; some static members
  with --instance-id, some dynamic). Seeded random SIGKILLs at random moments (by time, by records
  landed, soon after a restart, i.e. during a rebalance or a restart look), each followed by a
  restart with the same --instance-id or by a new member without one; data produced between them;
  then a rolling restart (a new member up before an old one gets SIGTERM), then every member runs
  to its idle timeout. What landed in the 3-shard DataHub topic must equal `dts-bridge convert` of
  the very files produced, per (DataHub shard, Kafka partition), record for record, in order, each
  position once (support/landing.compare). Kafka's view is checked too: while running, the group
  shows 3 members whose assignments split the partitions (describe_consumer_groups); at the end its
  committed offsets (list_consumer_group_offsets) are the end offsets.
- An idle pipeline shows lag 0 within two commit intervals (--commit-interval 1, --metrics-port):
  every partition listed, and the group's committed offsets are the end offsets before it exits.
- Usage errors exit 2 with one line and no traceback: an endpoint without http://, missing
  credentials, an HTTP server that is not DataHub (HTML), a closed port (within ~6 s).

Seeds: SYNC_TEST_SEED=N (default 1729). Each process's stdout/stderr stay in the test's tmp_path.
The long variant (more partitions, kills, data and chaos) is marked deep (`make test-deep`).
"""
from __future__ import annotations

import collections
import http.server
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import orjson
import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.datahub

from bridge import shard_key  # noqa: E402
from bridge.datahub.sink import shard_for  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import compare  # noqa: E402
from support.pipeline import ENV, ROOT, fault_summary  # noqa: E402
from support.sync_runs import (  # noqa: E402
    PROJECT,
    SEED,
    chaos,
    convert_blob,
    end_offsets,
    envelope_count,
    free_port,
    group_committed,
    group_members,
    landed_by_shard_partition,
    landed_count,
    no_traceback,
    produce_many,
    repack,
    scrape,
    start_process,
    sync_args,
    unique_name,
    warm_group_coordinator,
)

SAMPLES = ROOT / "samples"
SHARDS = ["0", "1", "2"]


# ---- a supervised consumer group of sync processes ---------------------------------------------

class Member:
    def __init__(self, name: str, instance_id: str | None, proc, out, err, how: str) -> None:
        self.name, self.instance_id, self.proc, self.out, self.err, self.how = name, instance_id, proc, out, err, how
        self.started = time.monotonic()
        self.ended: str | None = None  # killed | term | exited

    def report(self) -> dict:
        text = self.out.read_text() if self.out.exists() else ""
        return json.loads(text) if text.strip() else {}

    def __repr__(self) -> str:
        return f"{self.name}({self.instance_id or 'dynamic'}, pid {self.proc.pid})"


class Group:
    """`dts-bridge sync` members of one group, started, killed, stopped and reaped by the test."""

    def __init__(self, tmp_path, broker, topic: str, partitions: int, group: str, server, extra: list[str],
                 log: list[str]) -> None:
        self.tmp_path, self.broker, self.topic, self.group, self.server = tmp_path, broker, topic, group, server
        self.partitions = partitions
        self.extra, self.log = extra, log
        self.live: dict[str, Member] = {}
        self.all: list[Member] = []
        self.began = time.monotonic()

    def t(self) -> str:
        return f"{time.monotonic() - self.began:6.1f} s"

    def start(self, instance_id: str | None, how: str) -> Member:
        name = f"m{len(self.all) + 1}"
        out, err = self.tmp_path / f"{name}.out", self.tmp_path / f"{name}.err"
        args = sync_args(self.broker, self.topic, self.group, self.server, *self.extra, instance_id=instance_id)
        member = Member(name, instance_id, start_process(args, out, err), out, err, how)
        self.live[name] = member
        self.all.append(member)
        self.log.append(f"{self.t()} start {member} ({how})")
        return member

    def kill(self, member: Member, why: str) -> None:
        member.proc.kill()
        member.proc.wait()
        member.ended = "killed"
        del self.live[member.name]
        self.log.append(f"{self.t()} SIGKILL {member} ({why}), {landed_count(self.server)} records acknowledged in all")

    def terminate(self, member: Member, timeout: float = 120) -> None:
        member.proc.send_signal(signal.SIGTERM)
        try:
            code = member.proc.wait(timeout)
        except Exception:  # noqa: BLE001 - TimeoutExpired: kill it and fail with its stderr
            member.proc.kill()
            member.proc.wait()
            raise AssertionError(f"{member} did not stop within {timeout} s of SIGTERM: "
                                 f"{member.err.read_text()[-3000:]}\n" + "\n".join(self.log))
        member.ended = "term"
        del self.live[member.name]
        report = member.report()
        self.log.append(f"{self.t()} SIGTERM {member}: exit {code}, stopped {report.get('stopped')}, "
                        f"{report.get('acknowledged')} acknowledged, {report.get('already_landed')} found already there")
        no_traceback(member.err.read_text(), str(member))
        assert code == 0 and report.get("stopped") == "signal", \
            f"{member} after SIGTERM: exit {code}, {report}: {member.err.read_text()[-3000:]}\n" + "\n".join(self.log)

    def reap(self) -> list[Member]:
        """Members that ended by themselves: each must have reached its idle timeout, exit 0."""
        gone = []
        for member in list(self.live.values()):
            code = member.proc.poll()
            if code is None:
                continue
            member.ended = "exited"
            del self.live[member.name]
            report = member.report()
            self.log.append(f"{self.t()} {member} ended by itself: exit {code}, stopped {report.get('stopped')}, "
                            f"{report.get('acknowledged')} acknowledged, {report.get('already_landed')} found already there")
            no_traceback(member.err.read_text(), str(member))
            assert code == 0 and report.get("stopped") == "idle", \
                f"{member} exited {code}, {report}: {member.err.read_text()[-3000:]}\n" + "\n".join(self.log)
            gone.append(member)
        return gone

    def stop_all(self) -> None:
        """SIGKILL every member still running (the test failed; their stderr stays)."""
        for member in list(self.live.values()):
            if member.proc.poll() is None:
                member.proc.kill()
            member.proc.wait()

    def view(self) -> tuple[str, list[dict]]:
        try:
            return group_members(self.broker, self.group)
        except Exception as exc:  # noqa: BLE001 - KafkaException while the coordinator moves: ask again
            return f"unknown ({exc})", []

    def wait_members(self, timeout: float, what: str, exits_ok: bool = True) -> list[dict]:
        """Until Kafka shows exactly the running processes as the group's members (the static ones
        by their --instance-id, as many dynamic ones as run dynamic: no killed member's session
        left), in a stable group, their assignments splitting every partition between them (each
        to exactly one); reaps meanwhile (`exits_ok=False`: a member ending is a failure)."""
        deadline = time.monotonic() + timeout
        state, members = "", []
        while time.monotonic() < deadline:
            gone = self.reap()
            assert exits_ok or not gone, \
                f"{what}: {gone} ended at its idle timeout before the group gave it partitions " \
                f"(reports: {[m.report() for m in gone]}); Kafka's view: {self.view()}\n" + "\n".join(self.log)
            want = sorted(m.instance_id or "" for m in self.live.values())
            state, members = self.view()
            owned = [p for m in members for p in m["partitions"]]
            if state.upper() == "STABLE" and sorted(m["instance_id"] or "" for m in members) == want \
                    and sorted(owned) == list(range(self.partitions)):
                self.log.append(f"{self.t()} group: {state}, {len(members)} members: " + "; ".join(
                    f"{m['instance_id'] or 'dynamic'} {m['partitions']}" for m in members))
                return members
            time.sleep(0.2)
        raise AssertionError(f"{what}: the group never showed the {len(self.live)} running members "
                             f"{list(self.live.values())} splitting partitions 0..{self.partitions - 1} within "
                             f"{timeout} s; last seen: {state} {members}\n" + "\n".join(self.log))


def _stage_files(tmp_path, partitions: int, stages: int, sizes: tuple) -> list[list]:
    """`stages` lists of (file, partition), one file per partition each: the samples repacked under
    smaller Kafka message limits (more Envelopes, Entries split across them), rotating."""
    names = ("mixed", "types", "large", "realistic", "mariadb")
    files = [repack(SAMPLES / f"{n}.pb", tmp_path / f"{n}-{size}.pb", size) for size in sizes for n in names]
    files += [SAMPLES / f"{n}.pb" for n in names]
    return [[(files[(s * partitions + p) % len(files)], p) for p in range(partitions)] for s in range(stages)]


def _group_scenario(kafka_broker, tmp_path, *, partitions: int, kills: int, seed: int, stages: int,
                    max_delay: float, max_step: int, chaos_scale: float, idle: float):
    began = time.monotonic()
    rng = random.Random(seed)
    topic = kafka_broker.create_topic(unique_name("sync-group"), partitions=partitions)
    group = unique_name("g-members")
    warm_group_coordinator(kafka_broker, topic)
    plan = _stage_files(tmp_path, partitions, stages, (1200, 800))
    expected_lines: dict[int, list[bytes]] = collections.defaultdict(list)
    produced: dict[int, list] = collections.defaultdict(list)
    converted: dict = {}

    def produce_stage(why: str) -> None:
        if not plan:
            return
        stage = plan.pop(0)
        produce_many(kafka_broker, topic, stage)
        for path, partition in stage:
            if path not in converted:
                converted[path] = convert_blob(path, tmp_path)
            expected_lines[partition].extend(converted[path])
            produced[partition].append(path)
        log.append(f"{grp.t()} produced a stage ({why}): {', '.join(f'{p.name}->{n}' for p, n in stage)}")

    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        chaos(server, seed, chaos_scale)
        grp = Group(tmp_path, kafka_broker, topic, partitions, group, server,
                    ["--to", "blob", "--datahub-topic", "blob", "--idle-timeout", str(idle), "--commit-interval", "2"],
                    log)
        try:
            produce_stage("before the start")
            static = iter(f"{group}-s{i}" for i in range(1, 1000))
            grp.start(next(static), "first")
            grp.start(next(static), "first")
            grp.start(None, "first")
            # Kafka's view while they run: 3 members splitting the partitions, the static ones by their ids
            members = grp.wait_members(60, "three members started", exits_ok=False)
            assert len(members) == 3 and all(m["partitions"] for m in members), members
            produce_stage("the members run")

            # ---- SIGKILLs at seeded random moments, each followed by a restart ----
            kinds = collections.Counter()
            killed: list[dict] = []
            for k in range(kills):
                produce_stage(f"before kill {k + 1}")
                before, t0 = landed_count(server), time.monotonic()
                roll = rng.random()
                if roll < 0.25:  # soon after the last restart: during its rebalance or its restart look
                    mode, delay, threshold = "soon", rng.uniform(0.0, 0.6), None
                elif roll < 0.6:
                    mode, delay, threshold = "time", rng.uniform(0.2, max_delay), None
                else:
                    mode, delay, threshold = "landed", rng.uniform(0.0, 0.3), before + rng.randint(1, max_step)
                while time.monotonic() - t0 < 8:  # a threshold not reached by then: kill anyway
                    for gone in grp.reap():  # ended at its idle timeout: back as it was
                        grp.start(gone.instance_id, f"after {gone.name} exited idle")
                        kinds["after-idle-exit"] += 1
                    if threshold is None and time.monotonic() - t0 >= delay:
                        break
                    if threshold is not None and landed_count(server) >= threshold:
                        time.sleep(delay)
                        break
                    time.sleep(0.01)
                for gone in grp.reap():
                    grp.start(gone.instance_id, f"after {gone.name} exited idle")
                    kinds["after-idle-exit"] += 1
                statics = [m for m in grp.live.values() if m.instance_id]
                want_same = rng.random() < 0.55
                if k == kills - 1 and not kinds["same-id"]:
                    want_same = True
                if k == kills - 1 and not kinds["new-member"]:
                    want_same = False
                kind = "same-id" if want_same and statics else "new-member"
                victim = rng.choice(statics if kind == "same-id" else sorted(grp.live.values(), key=lambda m: m.name))
                acked = landed_count(server)
                grp.kill(victim, f"kill {k + 1}, {mode} after {time.monotonic() - t0:.2f} s, "
                         f"{acked - before} acknowledged meanwhile")
                killed.append(dict(member=victim.name, mode=mode, landed_meanwhile=acked - before))
                time.sleep(rng.choice([0.0, rng.uniform(0.0, 1.5)]))
                # a new member: a new identity, static (a fresh --instance-id) when the victim was, so
                # later kills still find static members to restart with the same id
                fresh = victim.instance_id if kind == "same-id" else (next(static) if victim.instance_id else None)
                grp.start(fresh, f"{kind} for {victim.name}")
                kinds[kind] += 1
            assert kinds["same-id"] and kinds["new-member"], kinds

            # ---- a rolling restart: each old member replaced by a new one that is up before it goes ----
            while len(grp.live) < 3:
                grp.start(None, "to three members again")
            grp.wait_members(60, "after the kills (killed members' sessions ended)")
            produce_stage("before the rolling restart")
            for i, old in enumerate(sorted(grp.live.values(), key=lambda m: m.name)):
                if old.name not in grp.live:
                    continue  # ended at its idle timeout meanwhile (logged by reap)
                grp.start(next(static) if i % 2 == 0 else None, f"rolling restart: replaces {old.name}")
                grp.wait_members(60, f"rolling restart: {old.name}'s replacement joined")
                produce_stage(f"rolling restart of {old.name}")
                if old.name in grp.live:
                    grp.terminate(old)
            while len(grp.live) < 3:
                grp.start(None, "to three members again")
            produce_stage("after the rolling restart")
            assert len(grp.wait_members(60, "after the rolling restart")) == 3
            while plan:
                produce_stage("the rest")

            # ---- let every member run to its idle timeout ----
            deadline = time.monotonic() + 180
            while grp.live and time.monotonic() < deadline:
                grp.reap()
                time.sleep(0.2)
            assert not grp.live, f"members still running after 180 s: {list(grp.live.values())}\n" + "\n".join(log)
        finally:
            grp.stop_all()
        server.faults.clear()
        faults = fault_summary(server)
        context = (f"seed {seed}; topic {topic} ({partitions} partitions), group {group}; stdout/stderr of every "
                   f"member in {tmp_path}; produced: { {p: [f.name for f in fs] for p, fs in produced.items()} }; faults: {faults}\n  " + "\n  ".join(log))
        for member in grp.all:
            no_traceback(member.err.read_text(), f"{member}")
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        assert [s["shard_id"] for s in server.shards(PROJECT, "blob") if s["state"] == "ACTIVE"] == SHARDS
        expected: dict = collections.defaultdict(list)
        for partition, lines in expected_lines.items():
            for line in lines:
                expected[(shard_for(shard_key(orjson.loads(line)), SHARDS), partition)].append(line)
        assert {p for _, p in expected} == set(range(partitions)), "every partition must hold records"
        got, positions = landed_by_shard_partition(server, "blob", topic, lambda r: r["data"])
        compared = compare("blob", got, positions, expected, context)
        ends = end_offsets(kafka_broker, topic, range(partitions))
        committed = group_committed(kafka_broker, group, topic, range(partitions))
        assert committed == ends, f"the group's committed offsets {committed}, the topic's ends {ends}\n{context}"
        assert len(killed) >= kills
        assert any(k["landed_meanwhile"] > 0 for k in killed), f"no kill fell while records were landing\n{context}"
        for kind in ("chaos-5xx", "chaos-throttle", "chaos-ack-lost", "chaos-reset"):
            assert faults.get(kind, 0) > 0, f"chaos never injected {kind}: {faults}"
        envelopes = sum(ends.values())
        found = sum(m.report().get("already_landed") or 0 for m in grp.all)
        print(f"\n[sync group, seed {seed}: {len(grp.all)} processes, {len(killed)} SIGKILLs, restarts {dict(kinds)}, "
              f"{compared} records compared over {len(expected)} (shard, partition) pairs, {envelopes} Envelopes in "
              f"{partitions} partitions, {found} found already there, faults {faults}, "
              f"{time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))
        assert ends == {p: sum(map(envelope_count, produced[p])) for p in range(partitions)}, (ends, context)


def test_three_members_killed_restarted_and_rolled_land_each_record_once(kafka_broker, tmp_path):
    """Three members on 4 partitions, 5 seeded SIGKILLs with restarts (same --instance-id or a new
    dynamic member), a rolling restart of all three, then the idle end: the DataHub topic equals
    `convert` per (shard, partition), in order, each record once; the group committed the ends."""
    _group_scenario(kafka_broker, tmp_path, partitions=4, kills=5, seed=SEED, stages=11,
                    max_delay=2.5, max_step=80, chaos_scale=1.0, idle=25)


@pytest.mark.deep
def test_three_members_killed_restarted_and_rolled_deep(kafka_broker, tmp_path):
    """6 partitions, 16 kills, more stages of data, more chaos."""
    _group_scenario(kafka_broker, tmp_path, partitions=6, kills=16, seed=SEED + 1, stages=24,
                    max_delay=4.0, max_step=200, chaos_scale=1.5, idle=25)


def test_members_started_together_each_get_partitions_before_their_idle_timeout(kafka_broker, tmp_path):
    """Three members started at once with --idle-timeout 5 (chaos on, as above): the group splits
    the partitions between all three before any of them ends; each then runs to its idle timeout
    (exit 0) and the group's committed offsets are the topic's ends. (A member given nothing in the
    cooperative protocol's first round is not idle: its partitions are on their way.)"""
    topic = kafka_broker.create_topic(unique_name("sync-together"), partitions=4)
    group = unique_name("g-together")
    warm_group_coordinator(kafka_broker, topic)
    stage = _stage_files(tmp_path, 4, 1, (1200,))[0]
    produce_many(kafka_broker, topic, stage)
    log: list[str] = []
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        chaos(server, SEED)
        grp = Group(tmp_path, kafka_broker, topic, 4, group, server,
                    ["--to", "blob", "--datahub-topic", "blob", "--idle-timeout", "5", "--commit-interval", "2"], log)
        try:
            grp.start(f"{group}-s1", "first")
            grp.start(f"{group}-s2", "first")
            grp.start(None, "first")
            members = grp.wait_members(60, "three members started together", exits_ok=False)
            assert len(members) == 3 and all(m["partitions"] for m in members), members
            deadline = time.monotonic() + 120
            while grp.live and time.monotonic() < deadline:
                grp.reap()
                time.sleep(0.2)
            assert not grp.live, "members still running after 120 s\n" + "\n".join(log)
        finally:
            grp.stop_all()
        ends = end_offsets(kafka_broker, topic, range(4))
        committed = group_committed(kafka_broker, group, topic, range(4))
        assert committed == ends, f"committed {committed}, ends {ends}\n" + "\n".join(log)


def test_a_member_assigned_late_reads_its_partitions_before_its_idle_timeout(kafka_broker, tmp_path):
    """The idle wait counts from the assignment: a member that joins a group whose rebalance waits for
    a SIGKILLed member's session (8 s) gets its partitions after five times its --idle-timeout, and
    still reads them all before it ends idle (it used to stop at once, having read nothing: seen in
    test_sync_tables under load, where a killed run's member held the rebalance)."""
    topic = kafka_broker.create_topic(unique_name("sync-late"), partitions=2)
    group = unique_name("g-late")
    warm_group_coordinator(kafka_broker, topic)
    small = repack(SAMPLES / "mixed.pb", tmp_path / "mixed-300.pb", 300)
    produce_many(kafka_broker, topic, [(small, 0), (SAMPLES / "large.pb", 1)])
    ends = end_offsets(kafka_broker, topic, range(2))
    member = ("import sys, time, confluent_kafka as ck\n"
              "c = ck.Consumer({'bootstrap.servers': sys.argv[1], 'group.id': sys.argv[2], 'session.timeout.ms': 8000,\n"
              "                 'partition.assignment.strategy': 'cooperative-sticky', 'enable.auto.commit': False})\n"
              "c.subscribe([sys.argv[3]])\n"
              "while not c.assignment():\n"
              "    c.poll(0.2)\n"
              "print('assigned', flush=True)\n"
              "time.sleep(600)\n")
    doomed = subprocess.Popen([sys.executable, "-c", member, kafka_broker.bootstrap, group, topic],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert doomed.stdout.readline().strip() == "assigned", "the first member never got its partitions"
    finally:
        doomed.kill()  # SIGKILL: it never leaves; the group waits for its session to end
        doomed.wait()
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        args = sync_args(kafka_broker, topic, group, server, "--to", "blob", "--datahub-topic", "blob",
                         "--idle-timeout", "1", "--commit-interval", "0.5")
        out, err = tmp_path / "late.out", tmp_path / "late.err"
        started = time.monotonic()
        proc = start_process(args, out, err)
        code = proc.wait(120)
        took = time.monotonic() - started
        text = err.read_text()
        no_traceback(text, "sync")
        assert code == 0, text[-3000:]
        report = json.loads(out.read_text())
        assert report["envelopes"] == sum(ends.values()) and report["stopped"] == "idle", (report, ends, text[-2000:])
        assert took > 5, f"the assignment was not late ({took:.1f} s): the test shows nothing\n{text[-2000:]}"
        assert group_committed(kafka_broker, group, topic, range(2)) == ends


# ---- an idle pipeline shows lag 0 ----------------------------------------------------------------

@pytest.mark.parametrize("empty", [False, True], ids=["every-partition-has-data", "one-partition-empty"])
def test_idle_pipeline_reaches_lag_zero_within_two_commit_intervals(kafka_broker, tmp_path, empty):
    """One member, --commit-interval 1: once every Envelope was read, within 2 s the metrics list
    dts_bridge_lag 0 for every assigned partition (with `empty`, partition 2 holds nothing: listed
    too), and the group's committed offsets are the topic's end offsets while the process still
    runs."""
    topic = kafka_broker.create_topic(unique_name("sync-idle"), partitions=3)
    group = unique_name("g-idle")
    warm_group_coordinator(kafka_broker, topic)
    small = repack(SAMPLES / "mixed.pb", tmp_path / "mixed-1200.pb", 1200)
    stage = [(small, 0), (SAMPLES / "large.pb", 1)] + ([] if empty else [(SAMPLES / "types.pb", 2)])
    produce_many(kafka_broker, topic, stage)
    ends = end_offsets(kafka_broker, topic, range(3))
    total = sum(ends.values())
    port = free_port()
    with StandInDataHub() as server:
        server.create_topic(PROJECT, "blob", shard_count=3)
        args = sync_args(kafka_broker, topic, group, server, "--to", "blob", "--datahub-topic", "blob",
                         "--commit-interval", "1", "--metrics-port", str(port), "--idle-timeout", "120")
        out, err = tmp_path / "idle.out", tmp_path / "idle.err"
        proc = start_process(args, out, err)
        try:
            read_at, metrics, seen, zero_at = None, {}, [], None
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    metrics = scrape(port)
                except OSError:
                    time.sleep(0.1)
                    continue
                envelopes = sum(metrics.get("dts_bridge_envelopes_in_total", {}).values())
                if read_at is None and envelopes >= total:
                    read_at = time.monotonic()
                if read_at is not None:
                    lag = {dict(k)["partition"]: v for k, v in metrics.get("dts_bridge_lag", {}).items()
                           if dict(k).get("topic") == topic}
                    seen.append((round(time.monotonic() - read_at, 2), lag))
                    if sorted(lag) == ["0", "1", "2"] and not any(lag.values()):
                        zero_at = seen[-1][0]
                        break
                    if time.monotonic() - read_at > 8.0:  # four times the bound: was it only late?
                        break
                time.sleep(0.1)
            assert proc.poll() is None, f"sync ended early ({proc.returncode}): {err.read_text()[-3000:]}"
            assert read_at is not None, f"sync never read the {total} Envelopes: {metrics}\n{err.read_text()[-3000:]}"
            committed = group_committed(kafka_broker, group, topic, range(3))
            assert proc.poll() is None, "the group's offsets must be read while sync still runs"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        facts = (f"{total} Envelopes read ({ends}); dts_bridge_lag per partition after the input was read "
                 f"(seconds since: lag): {seen[:3]} ... {seen[-2:]}; metrics: "
                 f"{ {k: v for k, v in metrics.items() if 'lag' in k or 'committed' in k} }; the group's committed "
                 f"offsets {committed}\n{err.read_text()[-2000:]}")
        assert zero_at is not None and zero_at <= 2.0, \
            f"lag 0 on every partition (0, 1, 2) {'never within 8 s' if zero_at is None else f'after {zero_at} s'}: {facts}"
        # partition 2 holds nothing: a commit of 0 or none at all are both its end
        assert {p: (0 if off < 0 and ends[p] == 0 else off) for p, off in committed.items()} == ends, facts
        no_traceback(err.read_text(), "sync")
        assert code == 0, err.read_text()[-3000:]
        print(f"\n[idle lag: {total} Envelopes ({ends}); lag 0 on every partition {zero_at} s after the last was read]")


# ---- usage errors: exit 2, one line --------------------------------------------------------------

class _HtmlPage(http.server.BaseHTTPRequestHandler):
    PAGE = (b"<!DOCTYPE html>\n<html>\n<head><title>Welcome to nginx!</title></head>\n<body>\n<h1>Welcome to nginx!</h1>\n"
            + b"<p>If you see this page, the web server is working.</p>\n" * 40 + b"</body>\n</html>\n")

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.PAGE)))
        self.end_headers()
        self.wfile.write(self.PAGE)

    do_POST = do_PUT = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def html_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed when the block ends: nothing listens there


def _usage(kafka_broker, endpoint: str, env: dict, within: float = 20):
    topic = kafka_broker.create_topic(unique_name("sync-usage"), partitions=1)
    args = ["sync", "--brokers", kafka_broker.bootstrap, "--topic", topic, "--group", unique_name("g-usage"),
            "--to", "blob", "--datahub-endpoint", endpoint, "--project", PROJECT, "--datahub-topic", "blob",
            "--idle-timeout", "1", "--no-progress"]
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bridge", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    took = time.monotonic() - began
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    what = f"sync --datahub-endpoint {endpoint}: exit {proc.returncode} after {took:.1f} s, stderr:\n{proc.stderr[-3000:]}"
    no_traceback(proc.stderr, what)
    assert proc.returncode == 2, what
    assert len(lines) == 1, f"not one line: {what}"
    assert took <= within, what
    return lines[0], took


def test_usage_error_endpoint_without_scheme(kafka_broker):
    for endpoint in (f"127.0.0.1:{_closed_port()}", "dh-cn-hangzhou.aliyuncs.com"):
        line, _ = _usage(kafka_broker, endpoint, ENV)
        assert "http://" in line and endpoint in line, line


@pytest.mark.parametrize("missing", [("DATAHUB_ACCESS_ID", "DATAHUB_ACCESS_KEY"), ("DATAHUB_ACCESS_KEY",),
                                     ("DATAHUB_ACCESS_ID",)])
def test_usage_error_missing_credentials(kafka_broker, missing):
    env = {k: v for k, v in ENV.items() if k not in missing}
    with StandInDataHub() as server:
        line, _ = _usage(kafka_broker, server.endpoint, env)
    for name in missing:
        assert name in line, line


def test_usage_error_endpoint_is_not_datahub(kafka_broker, html_server):
    line, _ = _usage(kafka_broker, html_server, ENV)
    assert html_server in line and "<" not in line and "If you see this page" not in line, line
    assert "DataHub" in line, line


def test_usage_error_unreachable_endpoint_within_seconds(kafka_broker):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    line, took = _usage(kafka_broker, endpoint, ENV, within=6.0)
    assert endpoint in line, line
    # the reason: nothing listens there (a line cut off before it says why is not clear)
    assert "refused" in line.lower(), f"the line does not say why ({took:.1f} s): {line}"


