"""`dts-bridge deliver` (a lossless Blob JSON Lines file -> DataHub) SIGKILLed at seeded random points
and rerun while the DataHub topic's shards are split and merged under it (docs/kafka.md, "`dts-bridge
deliver`: DataHub out" and "Writing through splits and merges"): the stand-in DataHub with chaos
faults and PutRecordsByShard slowed as over a long network path, `deliver` as a subprocess resuming
from its state file, as in tests/test_deliver_resume.py, the `Reshaper` of tests/support/resharding.py
as in tests/test_writer_resharding_sync.py.

Checked afterwards, never sorted within a shard: the final run exits 0 and its state file stands at
the file's last line; per shard the positions (`dts.pos`, 0:FIRST:0:ROW) rise record by record (order
per shard, what the reverse reader needs); no position lands twice in the topic; the records in
position order are exactly the file's lines (nothing lost, nothing twice); splits, merges and kills
in the middle of runs all happened; and `dts-bridge sync --to dts` of the topic, into a real Kafka
topic, gives back exactly the Entries `dts-bridge convert` makes of the file, per table in order.
SYNC_TEST_SEED changes the seed.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import time

import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.datahub

from bridge.cli.deliver import DELIVER_STATE_SUFFIX  # noqa: E402
from bridge.wire.framing import pack_entries, write_pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.landing import compare  # noqa: E402
from support.pipeline import ENV, ROOT, bridge_cli, fault_summary  # noqa: E402
from support.resharding import Reshaper, read_back_exact  # noqa: E402
from support.sync_runs import (  # noqa: E402
    PROJECT,
    SEED,
    chaos,
    convert_blob,
    entries_of,
    landed_by_shard_partition,
    no_traceback,
)

SAMPLES = ROOT / "samples"
TOPIC = "blob"


def blob_file(tmp_path: pathlib.Path, mixed: int, large: int, max_message_bytes: int = 1200) -> pathlib.Path:
    """The lossless Blob lines `dts-bridge convert` makes of samples/mixed.pb `mixed` times over and
    samples/large.pb `large` times over, repacked as one stream (more Envelopes, Entries in segments)."""
    pb = tmp_path / f"mixed{mixed}-large{large}.pb"
    entries = entries_of(SAMPLES / "mixed.pb") * mixed + entries_of(SAMPLES / "large.pb") * large
    with open(pb, "wb") as out:
        write_pb(out, pack_entries(entries, max_message_bytes))
    lines = convert_blob(pb, tmp_path)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def deliver_cmd(server, path: pathlib.Path, batch_size: int) -> list[str]:
    return bridge_cli("deliver", str(path), "--datahub-endpoint", server.endpoint, "--project", PROJECT,
                      "--topic", TOPIC, "--batch-size", str(batch_size), "--status-interval", "0", "--no-progress")


def landed(server) -> int:
    return sum(s["records"] for s in server.shards(PROJECT, TOPIC))


def kill_rounds(server, cmd: list[str], total: int, kills: int, seed: int, tmp_path: pathlib.Path,
                log: list[str]) -> list[dict]:
    """Run `cmd` until `kills` runs were SIGKILLed mid-run: each, once its first record landed, killed
    after a random further share of the records landed (plus a small random delay) or after a random
    time; the first early, once its first few records landed."""
    rng = random.Random(seed)
    done: list[dict] = []
    attempt = 0
    while len(done) < kills:
        attempt += 1
        assert attempt <= kills * 3, f"only {len(done)} of {kills} kills after {attempt - 1} runs\n" + "\n".join(log)
        before = landed(server)
        err_path = tmp_path / f"deliver-{attempt}.err"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
        started = time.monotonic()
        if attempt == 1:
            mode, delay, target = "early", rng.uniform(0.0, 0.1), before + rng.randint(1, 8)
        elif rng.random() < 0.5:
            mode, delay, target = "time", rng.uniform(0.2, 2.0), None
        else:
            mode, delay, target = "landed", rng.uniform(0.0, 0.3), before + rng.uniform(0.05, 0.25) * total
        while proc.poll() is None and time.monotonic() - started < 60 and landed(server) == before:
            time.sleep(0.01)  # the interpreter starting, the restart's tail look: a kill there proves little
        writing = time.monotonic()
        while proc.poll() is None and time.monotonic() - started < 60:
            if target is None and time.monotonic() - writing >= delay:
                break
            if target is not None and landed(server) >= target:
                time.sleep(delay)
                break
            time.sleep(0.01)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            at = landed(server)
            done.append(dict(run=attempt, mode=mode, after=round(time.monotonic() - started, 2),
                             landed_in_run=at - before))
            log.append(f"run {attempt}: SIGKILL ({mode}) after {done[-1]['after']} s, {at - before} records "
                       f"landed during the run, {at} in all")
        else:
            log.append(f"run {attempt}: ended by itself with {proc.returncode} before the kill ({mode})")
            assert proc.returncode == 0, f"deliver run {attempt} exited {proc.returncode}: " \
                f"{err_path.read_text()[-3000:]}\n" + "\n".join(log)
        no_traceback(err_path.read_text(), f"deliver run {attempt}")
    return done


def _deliver_through_reshards(kafka_broker, tmp_path, *, kills: int, seed: int, mixed: int, large: int,
                              batch_size: int = 40) -> None:
    began = time.monotonic()
    path = blob_file(tmp_path, mixed, large)
    lines = path.read_bytes().splitlines()
    source = "file:" + os.path.abspath(path)
    cmd = deliver_cmd(server := StandInDataHub().__enter__(), path, batch_size)
    log: list[str] = []
    try:
        server.create_topic(PROJECT, TOPIC, shard_count=3)
        chaos(server, seed, 0.5)
        server.faults.delay("PutRecordsByShard", seconds=0.03)  # a distant region's answers
        with Reshaper(server, TOPIC, seed) as reshaper:
            killed = kill_rounds(server, cmd, len(lines), kills, seed, tmp_path, log)
            final = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
            log.append(f"final run: exit {final.returncode}, {time.monotonic() - began:.1f} s from the start")
        server.faults.clear()
        shards = server.shards(PROJECT, TOPIC)
        context = (f"seed {seed}; {len(lines)} lines; stderr of every run in {tmp_path}; faults: "
                   f"{fault_summary(server)}\n  reshards: {reshaper.log}\n  " + "\n  ".join(log))
        no_traceback(final.stderr, "the final deliver run")
        assert final.returncode == 0, f"final deliver run exited {final.returncode}: {final.stderr[-3000:]}\n{context}"
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        assert reshaper.count("split") >= 2 and reshaper.count("merge") >= 2, context
        assert len(killed) >= kills and sum(k["landed_in_run"] > 0 for k in killed) >= min(kills, 3), context
        state = json.loads(pathlib.Path(str(path) + DELIVER_STATE_SUFFIX).read_text())
        assert state["line"] == len(lines) and state["rejected"] == 0, (state, context)
        got, positions = landed_by_shard_partition(server, TOPIC, source, lambda r: r["data"])
        # order per shard: positions rise record by record per shard; none twice in the topic
        compare(TOPIC, got, positions, got, context)
        # exactly once: what landed, in position order, is the file's lines
        everything = sorted((pos, data) for key in got for pos, data in zip(positions[key], got[key]))
        have = [data for _, data in everything]
        if have != lines:
            first = next((i for i, (a, b) in enumerate(zip(have, lines)) if a != b), min(len(have), len(lines)))
            raise AssertionError(f"{len(have)} records landed, {len(lines)} lines in the file; first difference "
                                 f"at line {first + 1}\n{context}")
        read_back_exact(kafka_broker, server, {0: lines}, context, topic=TOPIC)
        used = {s["shard_id"] for s in shards if s["records"]}
        print(f"\n[deliver kill loop through reshards, seed {seed}: {len(killed)} kills in {len(killed) + 1}+ runs, "
              f"{len(lines)} records over {len(used)} shards ({len(shards)} in all), "
              f"{reshaper.count('split')} splits, {reshaper.count('merge')} merges, "
              f"{time.monotonic() - began:.1f} s]\n  reshards: {reshaper.log}\n  " + "\n  ".join(log))
    finally:
        server.__exit__(None, None, None)


def test_deliver_writes_through_splits_and_merges(kafka_broker, tmp_path):
    """One run, no kill: shards split and merged every 0.4-1.6 s under it; chaos at half the sync
    tests' rates, PutRecordsByShard held 30 ms."""
    _deliver_through_reshards(kafka_broker, tmp_path, kills=0, seed=SEED, mixed=8, large=4)


# Seen on this code (seeds 1729, two runs): a rerun routes the lines the killed run had not landed by
# DataWorks' rule over the shards ACTIVE now, which may name a shard that already holds later lines
# the killed run landed there (it routed them over the shards ACTIVE then): e.g. "shard 3: record #35
# at 0:331:0:0 follows 0:359:0:0 (reordered)", and `sync --to dts` of the topic then exits 1 with
# "DML event incomplete at end of input: 3 of 4 rows". Nothing lost or duplicated; per-shard order
# broken across the restart. Not strict: whether a seed's kills hit this depends on timing.
RESTART_REORDER = pytest.mark.xfail(
    strict=False, reason="deliver rerun after a reshard lands unacknowledged lines after later ones on a shard")


@RESTART_REORDER
def test_deliver_killed_while_shards_are_split_and_merged(kafka_broker, tmp_path):
    """3 SIGKILLs mid-run (each after the run's first record landed) while shards are split and merged
    every 0.4-1.6 s; chaos at half the sync tests' rates, PutRecordsByShard held 30 ms."""
    _deliver_through_reshards(kafka_broker, tmp_path, kills=3, seed=SEED, mixed=12, large=6)


@RESTART_REORDER
@pytest.mark.deep
def test_deliver_killed_many_times_while_shards_are_split_and_merged(kafka_broker, tmp_path):
    """10 SIGKILLs, a bigger file, smaller batches."""
    _deliver_through_reshards(kafka_broker, tmp_path, kills=10, seed=SEED + 1, mixed=40, large=20, batch_size=25)
