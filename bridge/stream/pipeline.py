"""The pipeline's seams: Source, Assembler, Sink, Positions (the loop that drives them, with the
commit rule, is `bridge.pipeline.run`, above the ends that implement them).

Every continuous face is a choice of parts wired into that loop:

| face                    | Source                         | Assembler        | Sink                          | Positions                       |
|-------------------------|--------------------------------|------------------|-------------------------------|---------------------------------|
| `dts-bridge consume`    | `kafka.KafkaSource`            | `DtsAssembler`   | the CLI's resumable files     | group / file, under the files'  |
| `dts-bridge sync`       | `kafka.KafkaSource`            | `DtsAssembler`   | `sync.BlobSink` / `TupleSink` | group / file (+ dead letters)   |
| `dts-bridge deliver`    | `stream.files.FileLines`       | `LineRecords`    | `cli.deliver._DeliverSink`    | `cli.deliver._DeliverState` file |
| `dts-bridge sync --to dts` | `datahub.source.DataHubSource` | `stream.shards.DataHubAssembler` | `kafka.DtsKafkaSink` | `kafka.TransactionalPositions` |
| Spark `format("datahub")` task | `spark.task.TaskRows`   | `spark.task.TaskRecords` | `spark.task.RowsTask` / `sync.BlobSink`, `TupleSink` | `MemoryPositions` (Spark commits) |

A record is `(key, position, value, headers)`: a Kafka partition and offset, a DataHub shard and
sequence. Positions are "the next one to read", so a commit of position p means every record
below p was handed on whole and acknowledged by the sink.

The commit rule (`bridge.pipeline.run`), once for every face: per key, commit the next position to read, but never past the
first record the assembler still holds (an Entries whose Envelopes have not all come, an update
half waiting for its partner), and only after the sink acknowledged everything written before
(`Sink.flush`). A sink may still hold a commit back (`may_commit`) or record its own state with
the positions (`mark`, called after `flush` and before `Positions.save`).

>>> Overlay(MemoryPositions({0: (5, 7)}), lambda: {0: 9}).load([0, 1])
{0: (9, 7), 1: (None, None)}
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bridge.errors import BridgeError
from bridge.stream import ErrorPolicy, dts_records_to_entries
from bridge.wire.framing import Reassembler

__all__ = ["Record", "Source", "Assembler", "Sink", "Positions", "Report", "DtsAssembler", "Overlay",
           "MemoryPositions", "KeysLost"]

Key = Hashable
# (key, position, value, headers): what a Source yields and an Assembler takes
Record = tuple


class KeysLost(BridgeError):
    """A positions store refused a commit because the keys are no longer this reader's (a consumer
    group moved them on: its session ended while it was paused). Nothing is lost: the next owner
    reads them from the last commit; the loop forgets them instead of stopping."""


@runtime_checkable
class Source(Protocol):
    """Yields positioned raw records from its keys (Kafka partitions, DataHub shards) and knows how
    far each key goes. `open` is called once, with the committed positions (None: never
    committed, start where the source was told to); `poll` gives what is there now, in position
    order per key."""

    def keys(self) -> list:
        """The keys this source reads (what the positions are loaded for)."""

    def open(self, committed: Mapping[Key, int | None]) -> None:
        """Start reading each key at its committed position, else at the source's start."""

    def poll(self, budget: int, timeout: float) -> list[Record]:
        """Up to `budget` records, waiting at most `timeout` seconds for the first."""

    def caught_up(self) -> bool:
        """Every key has been read to its end as far as the source knows (idle means this)."""

    def ends(self) -> dict[Key, int]:
        """The position after the last record of each key, as last seen (for lag)."""

    def close(self) -> None:
        """Let go of the connection."""

    # optional, for a group member whose keys the group hands out (KafkaSource with a group):
    # dynamic (True: keys come and go; listen(assigned, revoked) before open), assigned_once (False
    # until the first assignment: never idle before it), assigned_at (time.monotonic() when keys
    # were last gained: the idle wait counts from it)


@runtime_checkable
class Assembler(Protocol):
    """Raw records -> whole Entries as (where, Entry[, raw bytes]), counted under the error policy;
    holds what cannot be handed on yet and says from where (the commit stops there)."""

    def entries(self, records: Iterable[Record], policy: ErrorPolicy) -> Iterator[tuple]:
        """The Entries of `records`, in order, as each completes."""

    def resume_at(self, key: Key) -> None:
        """`key` is read from a committed position (what came before it was handed out)."""

    def held_from(self, key: Key) -> int | None:
        """The first position of `key` not handed out whole yet, or None."""

    def held(self) -> int:
        """How many records it holds (for the report)."""

    # optional: commit_safe() -> bool, False while a commit at the held positions would not be
    # exact (the loop then commits later); DataHubAssembler has it
    # optional: forget(key): drop what is held of `key` (it went to another member of the group)


@runtime_checkable
class Sink(Protocol):
    """Writes converted records with their source positions. `flush` returns once everything
    written so far is acknowledged (durable); what landed beyond the committed positions before a
    crash is the sink's to recognise (`resume`), so a replay writes nothing twice."""

    def write(self, where: dict, outputs: Any) -> None:
        """One converted item (or, with `size`, one Entry's outputs whole) at `where`."""

    def flush(self) -> None:
        """Wait until everything written is acknowledged."""

    # optional: resume(committed): the committed positions of the keys read from now on (after a
    # restart, or keys gained in a rebalance): what landed past them is the sink's to recognise.
    # optional: acknowledged() -> the acknowledgement watermark, {key: the first position whose
    # outputs are not all acknowledged yet} (keys with nothing outstanding absent): the loop's
    # periodic commits go up to it without waiting for a flush.
    # optional: mark(positions), may_commit(positions) -> bool (see the module docstring).


@runtime_checkable
class Positions(Protocol):
    """Where committed positions live (a consumer group, a file, a Kafka offsets topic): per key
    the committed position and how far the run that committed it had read (None where unknown)."""

    def load(self, keys: list) -> dict[Key, tuple[int | None, int | None]]:
        """Committed (position, read mark) per key."""

    def save(self, commit: dict[Key, int], read: dict[Key, int]) -> None:
        """Store these positions durably (after the sink acknowledged everything below them)."""


class MemoryPositions:
    """Positions kept in memory (tests, and runs that keep no state)."""

    def __init__(self, initial: Mapping[Key, tuple[int | None, int | None]] | None = None) -> None:
        self.stored: dict = dict(initial or {})

    def load(self, keys: list) -> dict:
        return {k: self.stored.get(k, (None, None)) for k in keys}

    def save(self, commit: dict, read: dict) -> None:
        for k, off in commit.items():
            self.stored[k] = (off, read.get(k, off))


class Overlay:
    """A Positions store whose loaded positions are overridden by `ahead()` where it has them: a
    sink that writes its own state (output files' lengths, dead letters) before the store commits,
    so a crash between the two leaves that state ahead, and it wins."""

    def __init__(self, store: Positions, ahead: Callable[[], Mapping[Key, int]]) -> None:
        self.store, self.ahead = store, ahead

    @property
    def times(self) -> dict:
        return getattr(self.store, "times", {})

    def load(self, keys: list) -> dict:
        got = self.store.load(keys)
        ahead = self.ahead()
        for k in keys:
            if k in ahead:
                got[k] = (ahead[k], got.get(k, (None, None))[1])
        return got

    def save(self, commit: dict, read: dict) -> None:
        self.store.save(commit, read)


class DtsAssembler:
    """DTS Envelopes -> Entries: the framing `Reassembler` (per partition, or per TDSQL shard)
    through `bridge.stream` under the error policy. An Entries still incomplete when the run ends
    is read again by the next run, not rejected."""

    def __init__(self, raw: bool = False, reassembler: Reassembler | None = None) -> None:
        self.raw = raw
        self.reassembler = reassembler or Reassembler()

    def entries(self, records: Iterable[Record], policy: ErrorPolicy) -> Iterator[tuple]:
        return dts_records_to_entries(records, policy, self.reassembler, finish=False, raw=self.raw)

    def resume_at(self, key: Key) -> None:
        self.reassembler.resume_at(key)

    def held_from(self, key: Key) -> int | None:
        return self.reassembler.held_from(key)

    def held(self) -> int:
        return self.reassembler.held_segments()

    def forget(self, key: Key) -> None:
        self.reassembler.forget(key)


@dataclass
class Report:
    """What a run did, besides the Tally: records read (`envelopes`: Envelopes for a DTS source),
    those read again (below the previous run's read position, when the store kept it; None when
    unknown), commits. Live while the run goes on (watch it from another thread): `committed`,
    `position` (the next position to read per key) and `high` (each key's end as the source last
    saw it)."""
    envelopes: int = 0
    reread: int | None = 0
    held: int = 0
    commits: int = 0
    deferred: int = 0  # commits a sink held back (`sink.may_commit`)
    committed: dict = field(default_factory=dict)
    started: dict = field(default_factory=dict)
    stopped: str = "end"
    position: dict = field(default_factory=dict)
    high: dict = field(default_factory=dict)
    last_commit_at: float | None = None  # time.time() of the last commit
    source_time_ms: int | None = None  # the source's time of the last Entry handed on (DTS header timestamp)
    silent_since: float | None = None  # time.time() since when the source's server does not answer (if it says)
    waiting: tuple | None = None  # (what, since time.time()) while the loop waits for the sink or the positions

    def source_lag_ms(self) -> int | None:
        """How far behind the source the run is: now less the last Entry's source time (Debezium's
        MilliSecondsBehindSource); None before the first Entry with a time."""
        import time
        return None if self.source_time_ms is None else max(0, int(time.time() * 1000) - self.source_time_ms)

    def lag(self) -> dict:
        """Per key: records between the committed (else the read) position and the end."""
        out = {}
        for k, high in list(self.high.items()):  # a status thread reads it while the run fills it
            base = self.committed.get(k, self.position.get(k, self.started.get(k)))
            if base is None and high == 0:
                base = 0  # an empty key, never committed: nothing behind
            if base is not None and high >= 0:
                out[k] = max(0, high - base)
        return out

    def as_dict(self) -> dict:
        return {"envelopes": self.envelopes, "reread": self.reread, "held_segments": self.held,
                "commits": self.commits, "deferred": self.deferred, "started": {str(k): v for k, v in sorted(self.started.items())},
                "committed": {str(k): v for k, v in sorted(self.committed.items())}, "stopped": self.stopped}
