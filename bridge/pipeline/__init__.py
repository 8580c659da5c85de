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

import time
from collections.abc import Callable, Iterator
from typing import Any

from bridge.kafka import KafkaSource
from bridge.stream import ErrorPolicy, entries_to_messages, entries_to_outputs
from bridge.stream.pipeline import Assembler, DtsAssembler, Positions, Record, Report, Sink, Source
from bridge.wire import subscribe_pb2 as pb

__all__ = ["run", "consume", "Report"]


def run(source: Source, positions: Positions, assembler: Assembler, convert: Callable, sink: Sink,
        policy: ErrorPolicy, *, max_records: int | None = None, idle_timeout: float | None = None,
        stop: Callable[[], bool] = lambda: False, poll_timeout: float = 0.2, report: Report | None = None,
        size: Callable[[Any], int] | None = None, commit_interval: float | None = None) -> Report:
    """Read `source` from the committed positions, reassemble, convert, write to `sink`, commit.

    `convert(entry[, raw])` gives an Entry's outputs; without `size` the sink takes them one by one
    (`sink.write(where with "row", item)`), with it whole (`sink.write(where, outputs)`, `size(outputs)`
    of them). Commits come at every CHECKPOINT Entry, every `commit_interval` seconds (between
    records), and at the end; every ending but an exception commits. The run ends after
    `max_records` records, after `idle_timeout` seconds without one (once the source is caught
    up, or after five times the timeout), or when `stop()` turns true.
    """
    keys = source.keys()
    stored = positions.load(keys)
    report = report if report is not None else Report()
    report.started = {k: stored.get(k, (None, None))[0] for k in keys}
    source.open(dict(report.started))
    marks = {k: mark for k, (_, mark) in stored.items()}
    if any(off is not None and mark is None for off, mark in stored.values()):
        report.reread = None  # committed before, but how far that run read is unknown
    for k, (off, _) in stored.items():
        if off is not None:
            assembler.resume_at(k)
    read: dict = {}
    committed: dict = {}
    checkpoint = [False]
    flush = sink.flush
    mark_sink = getattr(sink, "mark", None)
    may_commit = getattr(sink, "may_commit", None)
    # an assembler may know that a commit now would not be exact (DataHubAssembler: an Entry split
    # across shards is incomplete while later records of one of its shards were handed on)
    commit_safe = getattr(assembler, "commit_safe", None)
    last_commit = [time.monotonic()]

    def commit() -> None:
        last_commit[0] = time.monotonic()
        flush()
        safe = {}
        for k, nxt in read.items():
            held = assembler.held_from(k)
            safe[k] = nxt if held is None else held
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
            positions.save(changed, {k: read[k] for k in changed})
            committed.update(changed)
            report.committed = dict(committed)
            report.commits += 1
            report.last_commit_at = time.time()

    def idle(since: float) -> bool:
        waited = time.monotonic() - since
        return waited >= idle_timeout and (source.caught_up() or waited >= 5 * idle_timeout)

    def records() -> Iterator[Record]:
        last = time.monotonic()
        while True:
            wanted = 500 if max_records is None else min(500, max_records - report.envelopes)
            if wanted <= 0:
                report.stopped = "max-messages"
                return
            if stop():
                report.stopped = "signal"
                return
            batch = source.poll(wanted, poll_timeout)
            report.high.update(source.ends())
            if idle_timeout is not None and not batch and idle(last):
                report.stopped = "idle"
                return
            for record in batch:
                due = commit_interval is not None and time.monotonic() - last_commit[0] >= commit_interval
                if checkpoint[0] or due:  # everything up to the checkpoint's Entries has been written
                    commit()
                    checkpoint[0] = False
                if stop():
                    report.stopped = "signal"
                    return
                key, position = record[0], record[1]
                last = time.monotonic()
                report.envelopes += 1
                mark = marks.get(key)
                if report.reread is not None and mark is not None and position < mark:
                    report.reread += 1
                read[key] = report.position[key] = position + 1
                yield record

    def entries() -> Iterator[tuple]:
        for item in assembler.entries(records(), policy):
            if item[1].header.messageType == pb.CHECKPOINT:
                checkpoint[0] = True
            yield item

    try:
        if size is None:
            for where, item in entries_to_messages(entries(), convert, policy):
                sink.write(where, item)
        else:
            for where, outputs in entries_to_outputs(entries(), convert, policy, size=size):
                if outputs is not None:
                    sink.write(where, outputs)
        commit()
    finally:
        report.held = assembler.held()
        report.committed = dict(committed)
    return report


def consume(consumer, topic: str, store: Positions, convert: Callable[[pb.Entry], list], sink, policy: ErrorPolicy, *,
            partitions: list[int] | None = None, start: str = "latest", max_messages: int | None = None,
            idle_timeout: float | None = None, stop: Callable[[], bool] = lambda: False,
            poll_timeout: float = 0.2, raw: bool = False, report: Report | None = None,
            size: Callable[[Any], int] | None = None, commit_interval: float | None = None) -> Report:
    """A DTS Kafka topic through `run`: a `KafkaSource` (the consumer is assigned the partitions,
    all or `partitions`, from the stored offsets, else from `start`) and a `DtsAssembler` (`raw`:
    `convert(entry, entry_bytes)` where the bytes are known, for a converter's C fast path).
    Give the consumer `enable.partition.eof=True`, so idleness knows every partition is read to
    its end. The consumer stays open."""
    source = KafkaSource(consumer, topic, partitions=partitions, start=start)
    return run(source, store, DtsAssembler(raw=raw), convert, sink, policy, max_records=max_messages,
               idle_timeout=idle_timeout, stop=stop, poll_timeout=poll_timeout, report=report, size=size,
               commit_interval=commit_interval)
