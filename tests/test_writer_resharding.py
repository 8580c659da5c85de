"""The DataHub writer through shard splits and merges made while it writes (docs/kafka.md, "Writing
through splits and merges"), against the loopback stand-in DataHub that the real pydatahub client
talks to over HTTP, PutRecordsByShard slowed as a distant region answers it:

- the writer never hangs: a refused request on a CLOSED shard (two at once, when two shards are
  merged under two requests in flight) makes it list the shards, route anew and go on, and a flush
  returns within a bound;
- per shard, records land in the order the writer was given them: checked record by record on
  what the stand-in stored per shard (each record carries its put index), not only the content;
- nothing is lost or written twice.
"""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("datahub")
pytestmark = pytest.mark.datahub

from bridge.datahub.sink import DataHubWriter, Position, make_client  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402

SOURCE = "kafka-topic"
BOUND = 60.0  # seconds a run may take before it counts as hung (it takes a few)


@pytest.fixture
def datahub(monkeypatch):
    with StandInDataHub() as server:
        server.create_topic("p", "t", shard_count=3)
        monkeypatch.setenv("DATAHUB_ACCESS_ID", "test-id")
        monkeypatch.setenv("DATAHUB_ACCESS_KEY", "test-secret")
        yield server


def _active_by_range(server) -> list[dict]:
    """The ACTIVE shards in hash-key order (neighbours are adjacent, as a merge needs)."""
    return sorted((s for s in server.shards("p", "t") if s["state"] == "ACTIVE"), key=lambda s: s["begin_hash_key"])


def _reshape(server, plan: list[tuple[float, str]], log: list) -> threading.Thread:
    """At each (seconds from now, "split" | "merge"): split the ACTIVE shard with the most records,
    or merge the first two adjacent ACTIVE shards that both hold records (both with requests in
    flight, likely: the case of two shards closing at once)."""
    began = time.monotonic()

    def run():
        for at, what in plan:
            time.sleep(max(0.0, began + at - time.monotonic()))
            active = _active_by_range(server)
            if what == "split":
                shard = max(active, key=lambda s: s["records"])["shard_id"]
                log.append(("split", shard, server.split("p", "t", shard)))
            else:
                pairs = [(a, b) for a, b in zip(active, active[1:]) if a["records"] and b["records"]] or \
                        list(zip(active, active[1:]))
                a, b = pairs[0]
                log.append(("merge", (a["shard_id"], b["shard_id"]), server.merge("p", "t", a["shard_id"], b["shard_id"])))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _write(server, count: int, plan: list[tuple[float, str]], *, delay: float = 0.04, slow: tuple = (None,),
           **kw) -> dict:
    """`count` records (two source partitions, 97 keys) put into a writer while `plan` reshapes the
    topic; every PutRecordsByShard (to the shards `slow`, None: all) held `delay` s. Returns what it
    saw; fails if the writer hangs."""
    for shard in slow:
        server.faults.delay("PutRecordsByShard", seconds=delay, shard=shard)
    kw.setdefault("batch_records", 20)
    writer = DataHubWriter(make_client(server.endpoint), "p", **kw)
    writer.topic("t")
    log: list = []
    done = threading.Event()
    failed: list = []

    def put_all():
        try:
            for i in range(count):
                writer.put("t", f"k{i % 97}", b"%07d" % i, Position(SOURCE, i % 2, i // 2, 0, 0))
            writer.flush()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)
        finally:
            done.set()

    reshaping = _reshape(server, plan, log)
    began = time.monotonic()
    worker = threading.Thread(target=put_all, daemon=True)
    worker.start()
    finished = done.wait(BOUND)
    took = time.monotonic() - began
    reshaping.join(BOUND)
    writer.stop(wait=5.0)
    assert finished, (f"the writer hung: {writer.queued} records queued after {took:.0f} s, "
                      f"{writer.acked} acknowledged, {writer.resplits} reshards; reshaped: {log}")
    assert not failed, failed
    refused = [r for r in list(server.requests) if r["op"] == "PutRecordsByShard" and r["status"] == 400]
    print(f"\n[{count} records in {took:.1f} s; reshaped {log}; {len(refused)} PutRecordsByShard refused "
          f"(shards {[r['shard'] for r in refused]}); {writer.resplits} reshards]")
    return {"writer": writer, "log": log, "took": took, "refused": refused}


def _check_order_and_content(server, count: int) -> int:
    """Per shard, the put index of every record stored there rises record by record (a record never
    lands after a later one on its shard); every index landed exactly once. Returns the shards."""
    problems, seen = [], {}
    shards: dict[str, list[tuple[int, int]]] = {}
    for record in server.records("p", "t"):
        shards.setdefault(record["shard"], []).append((int(record["data"]), record["sequence"]))
    for shard, got in shards.items():
        for (a, seq_a), (b, seq_b) in zip(got, got[1:]):
            if b <= a:
                problems.append(f"shard {shard} sequence {seq_b}: record #{b} "
                                f"(dts.pos {b % 2}:{b // 2}:0:0) landed after record #{a} at sequence {seq_a}")
        for i, _ in got:
            seen[i] = seen.get(i, 0) + 1
    twice = sorted(i for i, n in seen.items() if n > 1)
    lost = sorted(set(range(count)) - set(seen))
    assert not problems and not twice and not lost, (
        f"{len(problems)} out of order, {len(twice)} twice, {len(lost)} lost\n" + "\n".join(problems[:10]) +
        f"\ntwice: {twice[:10]}\nlost: {lost[:10]}")
    return len(shards)


def test_a_split_then_a_merge_while_writing_keeps_order_per_shard_and_finishes(datahub):
    """The measured run, shortened: a split, then two busy shards merged while the writer has a
    backlog; it must finish (it hung after the merge), each record once, in put order per shard."""
    count = 9000
    seen = _write(datahub, count, [(0.4, "split"), (1.2, "merge")])
    assert [what for what, *_ in seen["log"]] == ["split", "merge"], seen["log"]
    assert seen["writer"].resplits >= 2
    _check_order_and_content(datahub, count)


def test_two_merges_and_splits_in_quick_succession(datahub):
    """Reshaped four times, the last two while requests of the shards concerned are in flight."""
    count = 9000
    seen = _write(datahub, count, [(0.3, "split"), (0.6, "merge"), (0.9, "split"), (1.1, "merge")])
    assert len(seen["log"]) == 4, seen["log"]
    _check_order_and_content(datahub, count)


def test_a_merge_of_two_shards_under_requests_in_flight_does_not_hang(datahub):
    """Only the merge, at a moment both shards have requests in flight (theirs are slow, the third
    shard's fast), with nothing put after it: both requests are refused (their shards are CLOSED),
    the last requests in flight of the topic, and the writer must go on (it waited for ever for a
    word that the second refused shard was idle)."""
    count = 3000
    seen = _write(datahub, count, [(0.5, "merge")], delay=0.1, slow=("0", "1"))
    merged = set(seen["log"][0][1])
    assert merged <= {r["shard"] for r in seen["refused"]}, (seen["log"], seen["refused"])  # both refused
    _check_order_and_content(datahub, count)
