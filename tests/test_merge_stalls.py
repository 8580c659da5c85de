"""The shard merge of `sync --to dts` never stalls for good (issue 40, item 4; docs/kafka.md,
"Reading DataHub: stalls"), with the C merge (when built) and its Python reference alike:

- shards whose heads hold each other back (two streams whose records crossed between shards: a
  routing change, BEGIN/COMMIT records against a table's rows, a retried batch landing twice) are
  decided at once, at the record that closes the cycle, not at a bound; what then comes out of
  order is rejected with its shard, sequence and reason, copies are dropped and counted, and
  `finish()` leaves nothing held. Every record read is accounted for: in an Entry handed on (the
  Entry `convert` makes of the same lines), rejected, or a duplicate; and the tally balances
  (input == converted + rejected + not emitted) through `entries_to_outputs`. So are the cycles
  no record read closes (a hand-on uncovers one, or moves a third shard's hold-back), which the
  merge finds by walking from the shards whose hold-back changed (`stuck(True)`, checked against
  `stuck()` over random operations, C against Python);
- under `ErrorPolicy("fail")` the same input raises `StallError` naming the shard and sequence, at
  once, never a spin;
- the records bound: a stall with no cycle (a shard that never shows its end) holds at most
  `max_buffered` records (held() never above it: single-line Entries, so no open Entry adds to it)
  and the memory stays flat past that (40,000 records with a small bound, measured by tracemalloc;
  400,000 with the default bound, by the resident memory: about 10 s per merge);
- the seconds bound, with an injected clock: `stall` says shard, sequence, stream, records held and
  seconds while it waits; `stall_seconds` without a hand-on decides;
- the issue's measured case: heads blocking each other, then 100,000 later records: before, nothing
  came out and `finish()` ended with everything held (tally.input 0); now all is accounted for.

The assemblers here run on a constant clock unless a test injects one, so no time bound decides
anything a test does not mean it to.
"""
from __future__ import annotations

import collections
import os
import random
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.blob.encode import BlobEncoder
from bridge.native import speedups
from bridge.options import Options
from bridge.samples import build_sample_entries
from bridge.stream import ErrorPolicy, blob_lines_to_entries, entries_to_outputs
from bridge.stream.merge import PyMerge
from bridge.stream.shards import DataHubAssembler, DataHubRecord, ShardMark, StallError, stream_of

HAS_C = speedups is not None and hasattr(speedups, "Merge")
MERGES = [pytest.param(True, id="c-merge", marks=pytest.mark.skipif(not HAS_C, reason="no C extension")),
          pytest.param(False, id="py-merge")]

CYCLE = "hold each other back"

_LINES = None


def sample_lines() -> list:
    """`convert_lines` of each Entry of the mixed sample (a list of lines per Entry)."""
    global _LINES
    if _LINES is None:
        encoder = BlobEncoder(Options())
        _LINES = [encoder.convert_lines(e) for e in build_sample_entries()["mixed"]]
    return _LINES


def _entry_bytes(lines: list) -> bytes:
    """The Entry `convert` makes of one Entry's lines."""
    policy = ErrorPolicy("fail")
    got = [e.SerializeToString() for _, e in blob_lines_to_entries(lines, policy, Options())]
    assert len(got) == 1
    return got[0]


def _rec(shard, seq, pos, line, read_at, topic="t"):
    attrs = {"dts.topic": "k", "dts.pos": pos} if pos is not None else {}
    return ((topic, shard), seq, DataHubRecord(topic, shard, seq, int(read_at * 1000), attrs, data=line,
                                               read_at=read_at), {})


def _mark(kind, shard, seq, at, topic="t"):
    return ((topic, shard), seq, ShardMark(kind, topic, shard, (), at, int(at * 1000)), {})


class Run:
    """One assembler fed through `entries_to_outputs` as `sync --to dts` feeds it, one record at a
    time: the Entries handed on ((where, [bytes])), the records read, the most held after any."""

    def __init__(self, native, policy="skip", clock=lambda: 0.0, **kw) -> None:
        self.asm = DataHubAssembler(settle=1.0, native=native, clock=clock, **kw)
        self.policy = ErrorPolicy(policy)
        self.out: list = []
        self.read = 0
        self.held_max = 0

    def feed(self, records) -> list:
        got = []
        for record in records:
            if type(record[2]) is DataHubRecord:
                self.read += 1
            got += entries_to_outputs(self.asm.entries([record], self.policy), _to_bytes, self.policy)
            self.held_max = max(self.held_max, self.asm.held())
        self.out += got
        return got

    def finish(self) -> list:
        got = list(entries_to_outputs(self.asm.finish(self.policy), _to_bytes, self.policy))
        self.out += got
        return got


def _to_bytes(entry):
    return [entry.SerializeToString()]


def _accounted(run: Run, written: dict, entries: dict) -> None:
    """Every record read is in an Entry handed on, rejected (named: shard, sequence, reason) or a
    duplicate; each Entry handed on is convert's, once, in order per stream; the tally balances.
    `written`: (shard, sequence) -> (stream, Entry index); `entries`: (stream, index) -> (lines, bytes)."""
    tally, asm = run.policy.tally, run.asm
    assert asm.held() == 0 and asm.buffered == 0, "finish() left records held"
    assert tally.balanced(), tally.summary()
    handed = collections.defaultdict(list)
    lines_out = 0
    for where, outputs in run.out:
        stream, index = written[(where["shard"].rsplit(":", 1)[1], where["sequence"])]
        lines, raw = entries[(stream, index)]
        assert outputs[0] == raw, f"Entry {index} of stream {stream} differs from convert's"
        handed[stream].append(index)
        lines_out += len(lines)
    for stream, indexes in handed.items():
        assert indexes == sorted(set(indexes)), f"stream {stream}: {indexes} (twice or out of order)"
    for reject in run.policy.rejects:
        assert reject.get("reason"), reject
        if reject.get("shard") is not None:  # a record's own rejection: its shard and sequence
            assert (str(reject["shard"]), reject["sequence"]) in written, reject
            assert f"shard {reject['shard']} sequence {reject['sequence']}" in reject["reason"], reject
        else:  # an Entry that can never complete (its stream moved on): the rows it had
            assert "incomplete" in reject["reason"], reject
    assert tally.converted == len(run.out)
    assert lines_out + tally.rejected + tally.duplicates == run.read, (
        f"{run.read} records read: {lines_out} in Entries handed on, {tally.rejected} rejected, "
        f"{tally.duplicates} duplicates")
    assert asm.duplicates == tally.duplicates


# -- 1. heads blocking each other -------------------------------------------------------------------
def _crossing(shard0: list, shard1: list, pos: bool = True):
    """Records of shard 0 and 1 read alternately (one each), from lists of (stream, sample Entry
    index); with `pos`, streams are source partitions ("dts.pos"), else the lines' own tables (the
    stream names are then labels for the check only). Gives (records, written: (shard, sequence) ->
    (stream, Entry index), entries: (stream, Entry index) -> (its lines, convert's Entry))."""
    lines = sample_lines()
    records = [_mark("shard", "0", 0, 0.0), _mark("shard", "1", 0, 0.0)]
    written, entries = {}, {}
    per = {"0": [], "1": []}
    for shard, layout in (("0", shard0), ("1", shard1)):
        for stream, index in layout:
            ls = lines[index]
            entries[(stream, index)] = (ls, _entry_bytes(ls))
            for row, line in enumerate(ls):
                per[shard].append((stream, index, row, line))
    seqs = {"0": 0, "1": 0}
    at = 0.0
    while any(seqs[s] < len(per[s]) for s in per):
        for shard in ("0", "1"):
            if seqs[shard] < len(per[shard]):
                stream, index, row, line = per[shard][seqs[shard]]
                at += 0.001
                records.append(_rec(shard, seqs[shard], f"{stream}:{index}:0:{row}" if pos else None, line, at))
                written[(shard, seqs[shard])] = (stream, index)
                seqs[shard] += 1
    return records, written, entries


_TX = list(range(9, 21))  # BEGIN, a 4-row INSERT, COMMIT, heartbeat, GTID, BEGIN, 5 rows, ..., an UPDATE, COMMIT


def _partitions_crossing():
    """Two source partitions (0, 1) each writing the sample's Entries 9-20: partition 0's later
    Entries on shard 0 ahead of partition 1's earlier ones, and the other way round on shard 1 (a
    routing change with a retried batch)."""
    a, b = [(0, i) for i in _TX], [(1, i) for i in _TX]
    return _crossing(a[6:] + b[:6], b[6:] + a[:6])


def _begin_commit_crossing():
    """Lines without attributes (DataWorks', a user's writer): streams are tables; the BEGIN/COMMIT,
    heartbeat and GTID records (no table) crossing a table's rows between shards."""
    lines = sample_lines()

    def table(i):
        return stream_of(DataHubRecord("t", "0", 0, 0, {}, data=lines[i][0]))[0][2]

    txn = [i for i in _TX if table(i) == (None, None)]
    customers = [i for i in _TX if table(i) == ("shop", "customers")]
    orders = [i for i in _TX if table(i) == ("shop", "orders")]
    assert len(customers) == 2 and len(orders) == 2 and len(txn) == 8
    # shard 0: the later BEGIN/COMMITs, the orders rows, then the earlier customers rows;
    # shard 1: the later customers rows, then the earlier BEGIN/COMMITs
    shard0 = [("x", i) for i in txn[4:]] + [("o", i) for i in orders] + [("c", customers[0])]
    shard1 = [("c", customers[1])] + [("x", i) for i in txn[:4]]
    return _crossing(shard0, shard1, pos=False)


def _retried_twice():
    """A retried batch after a routing change: partition 0's Entries 9-14 on shard 1 (the old
    route) behind partition 1's later Entries; 12-14 of them on shard 0 too (the new route, ahead of
    partition 1's earlier Entries), and 12-13 landed once more on shard 1: the same `dts.pos` on two
    shards and twice on one, besides the two streams crossing."""
    a, b = [(0, i) for i in _TX], [(1, i) for i in _TX]
    return _crossing(a[3:] + b[:6], b[6:] + a[:6] + a[3:5])


CROSSINGS = {"partitions": _partitions_crossing, "begin-commit": _begin_commit_crossing,
             "retried-twice": _retried_twice}
# what one decision costs in each: the records rejected (the earlier records of the decided head's
# stream, stuck behind the other shard's head), and the copies of the retried batch dropped
COSTS = {"partitions": (9, 0), "begin-commit": (4, 0), "retried-twice": (6, 5)}


def _first_cycle_at(records, native) -> int:
    """The index of the record after which the heads of both shards hold each other back (looked
    at on a bare merge, fed the records' streams and orders only: no decision taken)."""
    m = PyMerge(1.0) if not native else speedups.Merge(1.0)
    m.add_shard(0), m.add_shard(0)
    sids: dict = {}
    for n, (key, seq, rec, _) in enumerate(records):
        if type(rec) is not DataHubRecord:
            continue
        stream, order, _ = stream_of(rec)
        m.push(int(key[1]), sids.setdefault(stream, len(sids)), order, rec.read_at, rec.system_time, seq)
        while m.next() is not None:
            pass
        if m.stuck() >= 0:
            return n
    raise AssertionError("the input has no cycle")


@pytest.mark.parametrize("native", MERGES)
@pytest.mark.parametrize("case", sorted(CROSSINGS))
def test_heads_holding_each_other_back_are_decided_at_once(case, native):
    records, written, entries = CROSSINGS[case]()
    closes = _first_cycle_at(records, native)
    run = Run(native, max_buffered=100_000, stall_seconds=None)  # a constant clock: no bound can decide
    run.feed(records[:closes])
    assert run.asm.stalls == 0 and run.asm.last_stall is None
    run.feed(records[closes:closes + 1])
    # decided at the record that closed the cycle, not at a bound
    decided = run.asm.last_stall
    assert run.asm.stalls == 1 and decided is not None and CYCLE in decided["reason"], decided
    assert decided["shard"] in ("t:0", "t:1") and type(decided["sequence"]) is int
    run.feed(records[closes + 1:])
    # every shard seen at its end `settle` after the last read: everything in order goes on
    run.feed([_mark("end", "0", 0, 10.0), _mark("end", "1", 0, 10.0)])
    assert run.asm.held() == 0, f"{run.asm.held()} records still held with every shard seen at its end"
    assert run.asm.stalls == 1, run.asm.stalls  # one decision undoes the crossing
    run.finish()
    _accounted(run, written, entries)
    rejected, duplicates = COSTS[case]
    tally = run.policy.tally
    assert (tally.rejected, tally.duplicates) == (rejected, duplicates), [r["reason"] for r in run.policy.rejects]
    assert all("a stall was decided past it" in r["reason"] for r in run.policy.rejects)
    assert run.asm.late == rejected and tally.converted == len(run.out) > 0


@pytest.mark.parametrize("case", sorted(CROSSINGS))
def test_both_merges_decide_the_same(case):
    if not HAS_C:
        pytest.skip("no C extension")
    records = CROSSINGS[case]()[0]
    runs = [Run(True, max_buffered=100_000, stall_seconds=None), Run(False, max_buffered=100_000, stall_seconds=None)]
    for record in records + [_mark("end", "0", 0, 10.0), _mark("end", "1", 0, 10.0)]:
        got = [r.feed([record]) for r in runs]
        assert got[0] == got[1], record
        assert runs[0].asm.last_stall == runs[1].asm.last_stall
    assert runs[0].finish() == runs[1].finish()
    assert runs[0].policy.rejects == runs[1].policy.rejects
    assert runs[0].policy.tally == runs[1].policy.tally


# -- 2. the same under --on-error fail ------------------------------------------------------------------
@pytest.mark.parametrize("native", MERGES)
@pytest.mark.parametrize("case", sorted(CROSSINGS))
def test_under_fail_a_cycle_is_a_stall_error_at_once(case, native):
    records = CROSSINGS[case]()[0]
    closes = _first_cycle_at(records, native)
    run = Run(native, policy="fail", max_buffered=100_000, stall_seconds=None)
    run.feed(records[:closes])
    started = time.monotonic()
    with pytest.raises(StallError) as caught:
        run.feed(records[closes:closes + 1])
    assert time.monotonic() - started < 5
    err = caught.value
    shard, seq = err.where["shard"], err.where["sequence"]
    assert shard in ("0", "1") and type(seq) is int
    assert f"DataHub t shard {shard} sequence {seq}: the merge stalled" in str(err)
    assert CYCLE in str(err) and "records held" in str(err)
    assert run.asm.last_stall["shard"] == f"t:{shard}" and run.asm.last_stall["sequence"] == seq


@pytest.mark.parametrize("native", MERGES)
def test_under_fail_the_bounds_are_a_stall_error(native):
    """No cycle, a shard that never shows its end: past max_buffered, and past stall_seconds."""
    line = sample_lines()[12][0]
    run = Run(native, policy="fail", max_buffered=50, stall_seconds=None)
    run.feed([_mark("shard", "0", 0, 0.0), _mark("shard", "1", 0, 0.0)])
    run.feed([_rec("0", i, f"0:{i}:0:0", line, 0.0) for i in range(50)])
    assert run.asm.held() == 50 and not run.out
    with pytest.raises(StallError, match=r"DataHub t shard 0 sequence 0: the merge stalled, more than "
                                         r"max_buffered = 50 records held: 51 records held"):
        run.feed([_rec("0", 50, "0:50:0:0", line, 0.0)])
    now = [100.0]
    run = Run(native, policy="fail", clock=lambda: now[0], stall_seconds=30.0)
    run.feed([_mark("shard", "0", 0, 100.0), _mark("shard", "1", 0, 100.0), _rec("0", 0, "0:0:0:0", line, 100.0)])
    now[0] = 129.9
    run.feed([_mark("end", "0", 0, now[0])])
    now[0] = 130.0
    with pytest.raises(StallError, match=r"shard 0 sequence 0: the merge stalled, nothing handed on for "
                                         r"stall_seconds = 30.0 s"):
        run.feed([_mark("end", "0", 0, now[0])])


# -- 3. the records bound -----------------------------------------------------------------------------
_CHEAP = (12, 16, 23, 43)  # one-line Entries (heartbeats, COMMITs) that decode fastest


def _behind(count: int, *, start: int = 0):
    """Records of one stream on shard 0, in order; shard 1 exists and never shows its end (a shard
    the reader never gets to): every head waits for it, and no cycle can decide."""
    lines = sample_lines()
    cheap = [lines[i][0] for i in _CHEAP]
    if start == 0:
        yield _mark("shard", "0", 0, 0.0)
        yield _mark("shard", "1", 0, 0.0)
    for i in range(start, start + count):
        yield _rec("0", i, f"0:{i}:0:0", cheap[i % len(cheap)], 0.0)


def _read_behind(native, count, max_buffered, dup_window=10_000, sample=None):
    """`count` records behind a shard that never shows its end, read one by one; held() after
    each. `sample(n)` is called every 1,000 records. Returns the run."""
    run = Run(native, max_buffered=max_buffered, stall_seconds=None, dup_window=dup_window)
    asm, policy, entries = run.asm, run.policy, 0
    for n, record in enumerate(_behind(count)):
        for _ in entries_to_outputs(asm.entries([record], policy), _to_bytes, policy):
            entries += 1
        held = asm.held()
        if held > run.held_max:
            run.held_max = held
        if sample is not None and n % 1000 == 0:
            sample(n)
    run.read = count
    assert asm.stalls == count - max_buffered and entries == count - max_buffered
    assert "max_buffered" in asm.last_stall["reason"]
    for _ in entries_to_outputs(asm.finish(policy), _to_bytes, policy):
        entries += 1
    assert entries == count == policy.tally.converted and policy.tally.balanced() and asm.held() == 0
    assert policy.tally.rejected == 0  # one stream on one shard: nothing comes out of order
    return run


@pytest.mark.parametrize("native", MERGES)
def test_a_stall_without_a_cycle_holds_at_most_max_buffered(native):
    """40,000 records with max_buffered = 1,000 (dup_window 1,000): held() never above the bound
    and, measured by tracemalloc over the last 10,000 records read (records allocated there and
    still alive, the peak), the memory is what 2,000 records take (the held ones and the copies
    window), not what 10,000 take."""
    window = 10_000

    def sample(n):
        if n == 40_000 - window:
            tracemalloc.start()

    started = time.monotonic()
    try:
        run = _read_behind(native, 40_000, 1_000, dup_window=1_000, sample=sample)
        alive, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert run.held_max == 1_000, run.held_max
    # what keeping every record read in the window would take, measured on the same records
    tracemalloc.start()
    try:
        kept = list(_behind(window, start=40_000))
        everything = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    assert peak < everything / 2, (f"peak {peak / 1e6:.1f} MB over the last {window} records read, against "
                                   f"{everything / 1e6:.1f} MB to keep them all")
    print(f"\n{'C' if native else 'Python'} merge: 40,000 records, held at most {run.held_max}; tracemalloc over "
          f"the last {window}: peak {peak / 1e6:.2f} MB, alive {alive / 1e6:.2f} MB (keeping them all: "
          f"{everything / 1e6:.2f} MB); {time.monotonic() - started:.1f} s")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
@pytest.mark.parametrize("native", MERGES)
def test_a_stall_of_400000_records_stays_within_the_default_bound(native):
    """400,000 records behind a shard that never shows its end, the default bounds (max_buffered
    100,000 records, dup_window 10,000): held() never above 100,000, and the resident memory once
    the bound is reached (records 150,000-250,000) is the memory at the end (records 300,000-400,000)
    within 16 MB. (Without the bound: 387 MB at 400,000 records, issue 40.)"""
    rss = {}

    def sample(n):
        rss[n] = _rss()

    started = time.monotonic()
    base = _rss()
    run = _read_behind(native, 400_000, 100_000, sample=sample)
    assert run.held_max == 100_000
    reached = max(v for n, v in rss.items() if 150_000 <= n < 250_000)
    end = max(v for n, v in rss.items() if 300_000 <= n)
    assert end <= reached + 16 * 2**20, f"RSS grew from {reached / 2**20:.0f} MB to {end / 2**20:.0f} MB"
    print(f"\n{'C' if native else 'Python'} merge: 400,000 records, held at most {run.held_max}; RSS "
          f"{base / 2**20:.0f} MB before, {reached / 2**20:.0f} MB at the bound, {end / 2**20:.0f} MB at the end; "
          f"{time.monotonic() - started:.1f} s")


# -- 4. the seconds bound -----------------------------------------------------------------------------
@pytest.mark.parametrize("native", MERGES)
def test_stall_seconds_decide_and_stall_says_what_waits(native):
    line = sample_lines()[12][0]
    now = [1000.0]
    run = Run(native, clock=lambda: now[0], stall_seconds=30.0, max_buffered=100_000)
    run.feed([_mark("shard", "0", 0, now[0]), _mark("shard", "1", 0, now[0])])
    run.feed([_rec("0", i, f"0:{i}:0:0", line, now[0]) for i in range(5)])
    assert run.asm.stall is None  # records held, but not longer than settle (at least 1 s)
    seen = []
    for t in (0.5, 1.5, 10.0, 29.9):
        now[0] = 1000.0 + t
        run.feed([_mark("end", "0", 4, now[0])])  # shard 0 is at its end; shard 1 never shows its end
        seen.append(run.asm.stall)
    assert seen[0] is None
    for t, stall in zip((1.5, 10.0, 29.9), seen[1:]):
        assert stall == {"shard": "t:0", "sequence": 0, "stream": "k partition 0", "held": 5, "seconds": t}
    assert not run.out and run.asm.stalls == 0
    now[0] = 1030.0
    run.feed([_mark("end", "0", 4, now[0])])
    assert [w for w, _ in run.out] == [{"shard": "t:0", "sequence": 0}]
    assert run.asm.last_stall == {"shard": "t:0", "sequence": 0, "stream": "k partition 0", "held": 5,
                                  "reason": "nothing handed on for stall_seconds = 30.0 s"}
    assert run.asm.stall is None and run.asm.held() == 4  # the decision is progress: the clock starts again
    now[0] = 1059.9
    run.feed([_mark("end", "0", 4, now[0])])
    assert len(run.out) == 1 and run.asm.stall["seconds"] == 29.9 and run.asm.stall["sequence"] == 1
    now[0] = 1060.0
    run.feed([_mark("end", "0", 4, now[0])])
    assert len(run.out) == 2 and run.asm.last_stall["sequence"] == 1
    # shard 1 shows its end: the rest goes on in order, nothing more decided
    now[0] = 1062.0
    run.feed([_mark("end", "1", 0, now[0])])
    assert len(run.out) == 5 and run.asm.stalls == 2 and run.asm.stall is None and run.asm.held() == 0
    run.finish()
    assert run.policy.tally.balanced() and run.policy.tally.converted == 5 and not run.policy.rejects


# -- 5. the issue's measured case ---------------------------------------------------------------------
def _blocked_then(later: int):
    """Two partitions' records crossing between two shards (the heads block each other), then
    `later` records of both partitions on both shards, read one shard after the other, 1 ms apart,
    every shard seen at its end every 1,000 records (as the source lists them)."""
    lines = sample_lines()
    cheap = [lines[i][0] for i in _CHEAP]
    # shard 0: partition 0 from Entry 3, partition 1's Entries 0-2; shard 1 the other way round
    per = {"0": [(0, 3), (1, 0), (1, 1), (1, 2)], "1": [(1, 3), (0, 0), (0, 1), (0, 2)]}
    for n in range(later):
        per[str(n % 2)].append((n % 2, 4 + n // 2))
    records = [_mark("shard", "0", 0, 0.0), _mark("shard", "1", 0, 0.0)]
    written, entries = {}, {}
    at, seqs = 0.0, {"0": 0, "1": 0}
    for n in range(max(len(v) for v in per.values())):
        for shard in ("0", "1"):
            if n < len(per[shard]):
                stream, index = per[shard][n]
                line = cheap[index % len(cheap)]
                at += 0.001
                records.append(_rec(shard, n, f"{stream}:{index}:0:0", line, at))
                written[(shard, n)] = (stream, index)
                entries[(stream, index)] = ([line], None)
                seqs[shard] = n
        if n % 500 == 499:
            records += [_mark("end", s, seqs[s], at) for s in ("0", "1")]
    return records, written, entries


@pytest.mark.parametrize("native", MERGES)
def test_the_issues_case_heads_blocking_each_other_then_100000_records(native):
    """Issue 40 measured: nothing handed on, every later record buffered (100,000 records: 116 MB),
    `finish()` ending with the records still held, tally.input 0. Now: decided at once, the later
    records go on as the shards are seen at their end, and every record is accounted for."""
    records, written, entries = _blocked_then(100_000)
    cheap = {line: _entry_bytes([line]) for line in {ls[0] for ls, _ in entries.values()}}
    entries = {k: (ls, cheap[ls[0]]) for k, (ls, _) in entries.items()}
    started = time.monotonic()
    run = Run(native, stall_seconds=None)  # the default max_buffered; a constant clock
    run.feed(records)
    assert run.asm.stalls == 1 and CYCLE in run.asm.last_stall["reason"]
    assert run.held_max < 3_000, run.held_max  # about a second's records (settle): nothing piles up
    run.finish()
    _accounted(run, written, entries)
    tally = run.policy.tally
    # the partition whose earlier records sat behind the other's head: those 3 records are rejected
    # as out of order, everything else is handed on
    assert tally.rejected == 3 and run.asm.late == 3 and tally.converted == 100_005 and tally.input == 100_008
    print(f"\n{'C' if native else 'Python'} merge: {run.read} records read, {tally.converted} Entries handed on, "
          f"{tally.rejected} rejected, held at most {run.held_max}; {time.monotonic() - started:.1f} s")


# -- stuck(True): walking from what changed, C against Python ------------------------------------------
@st.composite
def _ops(draw):
    ops = []
    for _ in range(draw(st.integers(1, 80))):
        kind = draw(st.sampled_from(["push", "push", "push", "push", "next", "force", "mark", "released"]))
        if kind == "push":
            ops.append(("push", draw(st.integers(0, 3)), draw(st.integers(0, 2)),
                        (draw(st.integers(0, 6)),), draw(st.sampled_from([0.0, 1.0, 2.0]))))
        elif kind == "force":
            ops.append(("force", draw(st.integers(0, 3))))
        elif kind == "mark":
            ops.append(("mark", draw(st.integers(0, 3)), draw(st.booleans())))
        elif kind == "released":
            ops.append(("released", draw(st.integers(0, 2)), (draw(st.integers(0, 6)),)))
        else:
            ops.append(("next",))
    return ops


def _do(m, op, counter):
    if op[0] == "push":
        counter[0] += 1
        return m.push(op[1], op[2], op[3], op[4], 0, counter[0])
    if op[0] == "force":
        return m.force(op[1])
    if op[0] == "mark":
        return m.mark(op[1], op[2], float("inf") if op[2] else 0.0, 0.0)
    if op[0] == "released":
        return m.set_released(op[1], op[2])
    return m.next()


@settings(max_examples=300)
@given(_ops())
def test_walking_from_what_changed_finds_every_new_cycle(ops):
    """`stuck(True)` walks only from the shards whose hold-back may have changed since it last did:
    after any operation it finds a cycle whenever one closed since (`stuck()`, every shard, found
    none before and finds one now), names only shards in a cycle, and answers in C as in Python."""
    merges = [PyMerge(1.0)] + ([speedups.Merge(1.0)] if HAS_C else [])
    counters = [[0] for _ in merges]
    for m in merges:
        for _ in range(4):
            m.add_shard(0)
    before = -1
    for op in ops:
        got = [_do(m, op, c) for m, c in zip(merges, counters)]
        assert len(set(map(repr, got))) == 1, op
        answers = [(m.stuck(), m.stuck(True), m.oldest()) for m in merges]
        assert all(a == answers[0] for a in answers), op
        whole, changed, _ = answers[0]
        if changed >= 0:
            assert whole >= 0, op
        if before < 0 and whole >= 0:
            assert changed >= 0, f"a cycle closed by {op} and walking from what changed missed it"
        before = whole


def test_stuck_answers_without_records():
    for m in [PyMerge(1.0)] + ([speedups.Merge(1.0)] if HAS_C else []):
        assert m.stuck() == m.stuck(True) == m.oldest() == -1
        m.add_shard(0)
        assert m.stuck() == m.stuck(True) == m.stuck(False) == -1


@pytest.mark.parametrize("native", MERGES)
def test_a_cycle_a_hand_on_closes_is_decided_at_once(native):
    """The cycles no record read closes: a head handed on uncovers one behind it (shard 0's first
    record waits for shard 1's end; once it goes, the next head and shard 1's hold each other back),
    and a hand-on that moves a third shard's hold-back (shard 2's head waits on shard 0's earlier
    record of its stream; once that goes, on shard 1's, whose head waits on shard 2)."""
    lines = sample_lines()
    one = [lines[i][0] for i in _CHEAP]
    # shard 0: C0 (waits: nothing else of stream 2), A2, B1; shard 1: B2, A1 -> after C0, a cycle
    run = Run(native, stall_seconds=None)
    run.feed([_mark("shard", s, 0, 0.0) for s in "01"])
    run.feed([_rec("0", 0, "2:0:0:0", one[0], 0.1), _rec("0", 1, "0:2:0:0", one[1], 0.2),
              _rec("0", 2, "1:1:0:0", one[2], 0.3), _rec("1", 0, "1:2:0:0", one[3], 0.4),
              _rec("1", 1, "0:1:0:0", one[0], 0.5)])
    assert run.asm.stalls == 0 and not run.out
    run.feed([_mark("end", "1", 1, 5.0)])  # C0 goes: A2 (shard 0) and B2 (shard 1) hold each other back
    assert run.asm.stalls == 1 and CYCLE in run.asm.last_stall["reason"], run.asm.last_stall
    _settle(run, "01")
    # shard 0: Z0 (waits), X3; shard 1: Y7, X4; shard 2: X5, Y6 -> shard 2 waits on shard 0's X3 first;
    # once Z0 and X3 go, on shard 1's X4, and shard 1's Y7 waits on shard 2's Y6
    run = Run(native, stall_seconds=None)
    run.feed([_mark("shard", s, 0, 0.0) for s in "012"])
    run.feed([_rec("0", 0, "9:0:0:0", one[0], 0.1), _rec("0", 1, "0:3:0:0", one[1], 0.2),
              _rec("2", 0, "0:5:0:0", one[2], 0.3), _rec("1", 0, "1:7:0:0", one[3], 0.4),
              _rec("1", 1, "0:4:0:0", one[0], 0.5), _rec("2", 1, "1:6:0:0", one[1], 0.6)])
    assert run.asm.stalls == 0 and not run.out
    run.feed([_mark("end", "1", 1, 5.0), _mark("end", "2", 1, 5.0)])  # Z0 goes, then X3
    assert run.asm.stalls == 1 and CYCLE in run.asm.last_stall["reason"], run.asm.last_stall
    _settle(run, "012")


def _settle(run: Run, shards: str) -> None:
    """Every shard seen at its end long after the last read, then the end: nothing held, all counted."""
    run.feed([_mark("end", s, 0, 100.0) for s in shards])
    assert run.asm.held() == 0
    run.finish()
    tally = run.policy.tally
    assert tally.balanced() and tally.converted + tally.rejected == run.read, tally.summary()


def test_a_random_crossing_is_accounted_for_in_both_merges():
    """Many shapes of crossing: partitions' Entries routed at random over two shards with one
    routing change (everything of a partition before it on one shard, after it on the other), the
    second shard's older records landing late (a retried batch): decided, accounted for, alike."""
    rng = random.Random(40)
    for _ in range(30):
        a, b = [(0, i) for i in _TX], [(1, i) for i in _TX]
        cut_a, cut_b = rng.randint(1, len(a) - 1), rng.randint(1, len(b) - 1)
        shard0 = a[cut_a:] + b[:cut_b]
        shard1 = b[cut_b:] + a[:cut_a]
        records, written, entries = _crossing(shard0, shard1)
        natives = [True, False] if HAS_C else [False]
        runs = [Run(n, stall_seconds=None) for n in natives]
        for run in runs:
            run.feed(records + [_mark("end", "0", 0, 10.0), _mark("end", "1", 0, 10.0)])
            assert run.asm.held() == 0
            run.finish()
            _accounted(run, written, entries)
        assert all(r.out == runs[0].out and r.policy.rejects == runs[0].policy.rejects for r in runs)
