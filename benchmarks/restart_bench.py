"""The cost of a `sync` restart's look at the DataHub shards' tails (issue 31, point 3), on the stand-in
DataHub (tests/support/datahub_standin.py) through the real pydatahub client.

Each case writes `--committed` records per Kafka partition (2 partitions, 3 shards; the offsets the
restart takes as committed) and then `since` more that landed after the commit, then a new writer
resumes at the commit (`DataHubWriter.resume(source, committed, since_ms=commit time - margin)`, as
`bridge.sync.run` does) and the look is timed and counted: seconds, GetRecords requests (the
stand-in's request log) and records read, against the records since the commit. The look reads each
shard back per partition to its committed record, so its cost follows the records since the commit,
not what the shards hold. Two more cases show what the time bound costs when it is what ends the
look: a committed partition with no record in the shards (idle); the look then reads back every
record written within the margin before the commit (here all of them, written in seconds), with
the margin at 60 s (CLOCK_MARGIN_MS) and at the former 5 minutes.

    python -m benchmarks.restart_bench [--committed 20000] [--since 0,100,1000,5000]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

SOURCE = "bench-topic"


def _standin():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
    from support.datahub_standin import StandInDataHub
    return StandInDataHub


def _put(writer, offsets, partitions=(0, 1)) -> None:
    from bridge.datahub.sink import Position
    for offset in offsets:
        for p in partitions:
            writer.put("t", f"k{offset % 101}", b"%d:%d" % (p, offset), Position(SOURCE, p, offset))


def one(committed: int, since: int, *, idle: bool = False, margin_ms: int = 60_000) -> dict:
    """Seconds, GetRecords and records read by one restart look."""
    from bridge.datahub.sink import DataHubWriter, make_client
    os.environ.setdefault("DATAHUB_ACCESS_ID", "bench")
    os.environ.setdefault("DATAHUB_ACCESS_KEY", "bench")
    with _standin()() as server:
        server.create_topic("p", "t", shard_count=3)
        writer = DataHubWriter(make_client(server.endpoint), "p", linger=0)
        _put(writer, range(committed))
        writer.flush()
        commit_ms = int(time.time() * 1000)
        _put(writer, range(committed, committed + since))
        writer.close()
        stops = {0: committed, 1: committed}
        if idle:
            stops[2] = 0  # committed long ago, no record since: the time bound ends its look
        events = []
        again = DataHubWriter(make_client(server.endpoint), "p", observer=lambda e, **f: events.append((e, f)))
        again.topic("t")
        before = sum(1 for r in server.requests if r["op"] == "GetRecords")
        began = time.perf_counter()
        again.resume(SOURCE, stops, since_ms=commit_ms - margin_ms)
        seconds = time.perf_counter() - began
        gets = sum(1 for r in server.requests if r["op"] == "GetRecords") - before
        found = sum(len(t.landed or ()) for t in again._topics.values())
        again.stop()
        assert found == 2 * since, (found, since)
        return {"committed_per_partition": committed, "since_commit": 2 * since, "idle_partition": idle,
                "margin_s": margin_ms / 1000, "seconds": round(seconds, 3), "get_records": gets,
                "records_read": sum(f["records"] for e, f in events if e == "look" and f["state"] == "done")}


def measure(committed: int, since_list: list[int]) -> list[dict]:
    out = []
    for since in since_list:
        out.append(one(committed, since))
    for margin in (60_000, 300_000):
        out.append(one(committed, 100, idle=True, margin_ms=margin))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--committed", type=int, default=20_000, help="records per partition before the commit")
    parser.add_argument("--since", default="0,100,1000,5000", help="records per partition after the commit")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = measure(args.committed, [int(x) for x in args.since.split(",")])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'since commit':>12} {'idle':>5} {'margin':>7} {'seconds':>8} {'GetRecords':>10} {'read':>8}")
    for r in rows:
        print(f"{r['since_commit']:>12,} {'yes' if r['idle_partition'] else 'no':>5} {r['margin_s']:>6.0f}s "
              f"{r['seconds']:>8.3f} {r['get_records']:>10} {r['records_read']:>8,}")
    print(f"(every case: {2 * args.committed:,} records committed before, 2 partitions, 3 shards)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
