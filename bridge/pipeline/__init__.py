"""The one pipeline loop: source -> reassemble -> convert -> write -> acknowledge -> commit.

It drives the seams of `bridge.stream.pipeline` (Source, Assembler, Sink, Positions), which the
ends implement (`bridge.kafka`, `bridge.datahub`); the faces (`bridge.sync`, the CLI) choose the
parts. It sits between them: it may know the ends, they never know it (.importlinter).

A commit stores, per key, the next position to read, but never past the first record the
assembler still holds, and only after the sink acknowledged everything written before it
(`Sink.flush`); a sink may hold a commit back (`may_commit`) or record its own state with the
positions (`mark`, after `flush`, before `Positions.save`).
"""
from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bridge.kafka import KafkaSource
from bridge.stream import ErrorPolicy, entries_to_messages, entries_to_outputs
from bridge.stream.pipeline import Assembler, DtsAssembler, KeysLost, Positions, Record, Report, Sink, Source
from bridge.wire import subscribe_pb2 as pb

__all__ = ["run", "consume", "Report"]


# Python's collector runs a generation-0 pass every 700 container allocations (default), and each
# pass walks the young objects; a run makes several per record (the record, its attributes, the
# decoder's dicts, the Entry), with hundreds of thousands of records alive in the prefetched pages
# and the merge, so the older generations' passes follow them: measured in reverse_bench (100,000
# rows), 0.35-0.44 CPU s of a 2.9 s run in the collector, and the pages' records made in half the
# time without it. While a run's loop goes, the first threshold is raised to GC_THRESHOLD0 (the
# others stay): cycles are still collected, after 50,000 allocations instead of 700. It is restored
# when the last run of the process ends; a threshold the user set higher (or 0, collection off) is
# left as it is. docs/performance.md, "The collector".
GC_THRESHOLD0 = 50_000
_gc_lock = threading.Lock()
_gc_runs = [0, None]  # runs under way, the thresholds before the first


@contextlib.contextmanager
def gc_spaced():
    """While inside, the collector's first threshold is at least GC_THRESHOLD0 (see above)."""
    with _gc_lock:
        if _gc_runs[0] == 0:
            before = gc.get_threshold()
            _gc_runs[1] = before
            if 0 < before[0] < GC_THRESHOLD0:
                gc.set_threshold(GC_THRESHOLD0, *before[1:])
        _gc_runs[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_runs[0] -= 1
            if _gc_runs[0] == 0:
                before, now = _gc_runs[1], gc.get_threshold()
                if now[0] == GC_THRESHOLD0 and 0 < before[0] < GC_THRESHOLD0:
                    gc.set_threshold(before[0], *now[1:])  # (the others as they are now: the user's)


def run(source: Source, positions: Positions, assembler: Assembler, convert: Callable, sink: Sink,
        policy: ErrorPolicy, *, max_records: int | None = None, idle_timeout: float | None = None,
        stop: Callable[[], bool] = lambda: False, poll_timeout: float = 0.2, report: Report | None = None,
        size: Callable[[Any], int] | None = None, commit_interval: float | None = None) -> Report:
    """Read `source` from the committed positions, reassemble, convert, write to `sink`, commit.

    `convert(entry[, raw])` gives an Entry's outputs; without `size` the sink takes them one by one
    (`sink.write(where with "row", item)`), with it whole (`sink.write(where, outputs)`, `size(outputs)`
    of them). Commits come at every CHECKPOINT Entry, every `commit_interval` seconds (between
    records, and while nothing comes, so an idle pipeline commits its tail), and at the end; every
    ending but an exception commits. A sink that keeps an acknowledgement watermark
    (`acknowledged()`) is committed up to it without waiting (reading never stops for a commit);
    else every commit waits for `sink.flush()`. The run ends after `max_records` records,
    after `idle_timeout` seconds without progress (no record read for the first time and no Entry
    handed on: a source's marks of shards at their end do not count), once the source is caught up
    or after five times the timeout, or when `stop()` turns true.

    A source whose keys change while it runs (`source.dynamic`: a consumer group's member) is
    told `source.listen(assigned, revoked)`: keys it gains are loaded from `positions`, the sink
    is told the committed positions of every key it has now (`sink.resume`, the restart look; for
    a fixed set of keys that is the caller's, before the run), and the source starts
    them there; before keys go, everything of theirs is flushed and committed, and the assembler
    forgets what it held of them (the next owner reads it again from the commit).
    """
    report = report if report is not None else Report()
    read: dict = {}
    committed: dict = {}
    marks: dict = {}
    checkpoint = [False]
    finished = [False]
    mark_sink = getattr(sink, "mark", None)
    may_commit = getattr(sink, "may_commit", None)
    acknowledged = getattr(sink, "acknowledged", None)
    resume_sink = getattr(sink, "resume", None)
    forget = getattr(assembler, "forget", None)
    # an assembler may know that a commit now would not be exact (DataHubAssembler: an Entry split
    # across shards is incomplete while later records of one of its shards were handed on)
    commit_safe = getattr(assembler, "commit_safe", None)
    last_commit = [time.monotonic()]

    def load(keys: list) -> dict:
        stored = positions.load(keys)
        starts = {k: stored.get(k, (None, None))[0] for k in keys}
        report.started.update(starts)
        for k, (off, mark) in stored.items():
            marks[k] = mark
            if off is not None:
                assembler.resume_at(k)
                if mark is None:
                    report.reread = None  # committed before, but how far that run read is unknown
        return starts

    def commit(wait: bool = True, only=None) -> None:
        last_commit[0] = time.monotonic()
        pending: dict = {}
        report.waiting = ("sink", time.time())
        try:
            if wait or acknowledged is None:
                sink.flush()
            else:
                pending = acknowledged()
        finally:
            report.waiting = None
        safe = {}
        for k, nxt in read.items():
            if only is not None and k not in only:
                continue
            held = assembler.held_from(k)
            limit = nxt if held is None else held
            if k in pending and pending[k] is not None:
                limit = min(limit, pending[k])
            safe[k] = limit
        changed = {k: off for k, off in safe.items() if committed.get(k) != off}
        if changed and commit_safe is not None and not commit_safe():
            report.deferred += 1  # the assembler cannot vouch for these positions yet: commit later
            return
        if changed and may_commit is not None and not may_commit({**committed, **changed}):
            report.deferred += 1  # the sink cannot vouch for these positions yet: commit later
            return
        if mark_sink is not None:
            mark_sink({**committed, **changed})
        if changed:
            report.waiting = ("positions", time.time())
            try:
                positions.save(changed, {k: read[k] for k in changed})
            except KeysLost:
                if not getattr(source, "dynamic", False):
                    raise
                report.deferred += 1  # a rebalance is under way: the source hears of it at its next poll
                return
            finally:
                report.waiting = None
            committed.update(changed)
            report.committed = dict(committed)
            report.commits += 1
            report.last_commit_at = time.time()

    def assigned(keys: list) -> dict:
        starts = load(keys)
        if resume_sink is not None:
            resume_sink({**committed, **{k: v for k, v in starts.items()}})
        return starts

    def revoked(keys: list, lost: bool = False) -> None:
        if finished[0]:
            return
        if not lost:
            commit(wait=True, only=set(keys))
        for k in keys:
            read.pop(k, None)
            committed.pop(k, None)
            report.committed.pop(k, None)
            report.position.pop(k, None)
            report.high.pop(k, None)
            if forget is not None:
                forget(k)

    if getattr(source, "dynamic", False):
        source.listen(assigned, revoked)
        source.open({})
    else:
        source.open(load(source.keys()))  # a fixed set of keys: the caller resumed the sink already

    def due() -> bool:
        return commit_interval is not None and time.monotonic() - last_commit[0] >= commit_interval

    def idle(since: float) -> bool:
        if not getattr(source, "assigned_once", True):
            return False  # a group member not yet given its partitions: nothing is known yet
        gained = getattr(source, "assigned_at", None)  # partitions gained late: their wait starts then
        waited = time.monotonic() - (since if gained is None else max(since, gained))
        return waited >= idle_timeout and (source.caught_up() or waited >= 5 * idle_timeout)

    progress = [time.monotonic()]  # when a record was read or an Entry handed on (idleness counts from it)
    mark_type = getattr(source, "mark_type", None)  # what a source yields beside records (DataHub's ShardMark)

    def records() -> Iterator[Record]:
        while True:
            wanted = 500 if max_records is None else min(500, max_records - report.envelopes)
            if wanted <= 0:
                report.stopped = "max-messages"
                return
            if stop():
                report.stopped = "signal"
                return
            batch = source.poll(wanted, poll_timeout)
            moved = False
            report.high.update(source.ends())
            report.silent_since = getattr(source, "silent_since", None)
            if not batch and due():  # nothing comes: what was read is committed, so an idle pipeline shows lag 0
                commit(wait=False)
            for record in batch:
                if checkpoint[0] or due():  # everything up to the checkpoint's Entries has been written
                    commit(wait=checkpoint[0])
                    checkpoint[0] = False
                if stop():
                    report.stopped = "signal"
                    return
                key, position = record[0], record[1]
                if mark_type is None or type(record[2]) is not mark_type:  # progress: a record (a source's
                    progress[0] = time.monotonic()  # marks of a shard at its end are none)
                    moved = True
                report.envelopes += 1
                mark = marks.get(key)
                if report.reread is not None and mark is not None and position < mark:
                    report.reread += 1
                read[key] = report.position[key] = position + 1
                yield record
            if idle_timeout is not None and not moved and idle(progress[0]):  # (a batch of marks only is none)
                report.stopped = "idle"
                return

    def entries() -> Iterator[tuple]:
        for item in assembler.entries(records(), policy):
            progress[0] = time.monotonic()
            header = getattr(item[1], "header", None)  # None: a record that is no Entry (a Blob line)
            if header is None:
                yield item
                continue
            if header.messageType == pb.CHECKPOINT:
                checkpoint[0] = True
            if header.timestamp:
                report.source_time_ms = header.timestamp * 1000
            yield item

    try:
        with gc_spaced():
            if size is None:
                for where, item in entries_to_messages(entries(), convert, policy):
                    sink.write(where, item)
            else:
                for where, outputs in entries_to_outputs(entries(), convert, policy, size=size):
                    if outputs is not None:
                        sink.write(where, outputs)
        commit()
    finally:
        finished[0] = True
        report.held = assembler.held()
        report.committed = dict(committed)
    return report


def consume(consumer, topic: str, store: Positions, convert: Callable[[pb.Entry], list], sink, policy: ErrorPolicy, *,
            partitions: list[int] | None = None, start: str = "latest", max_messages: int | None = None,
            idle_timeout: float | None = None, stop: Callable[[], bool] = lambda: False,
            poll_timeout: float = 0.2, raw: bool = False, report: Report | None = None,
            size: Callable[[Any], int] | None = None, commit_interval: float | None = None,
            subscribe: bool = False) -> Report:
    """A DTS Kafka topic through `run`: a `KafkaSource` (the consumer is assigned the partitions,
    all or `partitions`, or with `subscribe` is a member of its group and given some, from the
    stored offsets, else from `start`) and a `DtsAssembler` (`raw`:
    `convert(entry, entry_bytes)` where the bytes are known, for a converter's C fast path).
    Give the consumer `enable.partition.eof=True`, so idleness knows every partition is read to
    its end. The consumer stays open."""
    source = KafkaSource(consumer, topic, partitions=partitions, start=start, subscribe=subscribe)
    return run(source, store, DtsAssembler(raw=raw), convert, sink, policy, max_records=max_messages,
               idle_timeout=idle_timeout, stop=stop, poll_timeout=poll_timeout, report=report, size=size,
               commit_interval=commit_interval)
