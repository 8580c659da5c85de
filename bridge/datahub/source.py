"""DataHub in: a pipeline `Source` (bridge/stream/pipeline.py) over every shard of DataHub topics.

`DataHubSource` reads one Blob topic, or many Tuple topics (a list, or a `{db}_{table}` template
matched against the project's topics with ListTopic), shard by shard with GetCursor + GetRecords
pages, under the writer's retry policy (bridge/datahub/calls.py: throttling and 5xx back off).

Keys are `(topic, shard_id)` pairs (`key_text` / `parse_key` turn them into JSON-storable text);
a position is the next DataHub sequence to read in that shard. Each record is
`(key, sequence, DataHubRecord, attributes)`: the record's Blob bytes or Tuple row (field name ->
value, with the topic's RecordSchema), its attributes (the forward `sync` writes `dts.topic` and
`dts.pos`), its system time, and when it was read.

Where it starts, per shard: the committed position (a SEQUENCE cursor); without one, the oldest
record (`from_beginning`), the first record written at or after `since_ms` (a SYSTEM_TIME cursor),
else the shard's end (only what is written from now on). A run that resumes (some shard has a
committed position) reads a shard without one from its oldest record: it appeared after the last
commit (a split's or a merge's child). A committed position below a shard's oldest record means
records past the topic's lifecycle were never read: a `DataLossError`, unless
`fail_on_data_loss=False` (then the reader starts at the oldest record and counts the loss in
`lost`).

A shard's end (`end_of`, the lag's `ends`) is its last record's sequence + 1, 0 when it holds
none: GetCursor LATEST answers sequence 0 without an error on an empty shard (a new topic's, a
split's child not written yet) as on a shard of one record, so a LATEST of 0 on a shard not known
to hold a record is told apart by reading there (one GetRecords of one record, only then).

Splits and merges: a CLOSED shard is read to its end before its children; a child is read once
every parent is finished. The shards are listed again every `relist_interval` seconds and whenever
a shard answers that it is closed (InvalidShardOperation / ShardSealed / NoSuchShard), so children
of a split mid-run are found. A shard no longer listed is gone: DataHub deletes a CLOSED shard once
its records are past the lifecycle. Gone after it was read to its end, nothing is lost; gone
before, its records from the reader's position on were never read: a `DataLossError`, or with
`fail_on_data_loss=False` counted in `lost` (what the reader knew of its end) and the shard
finished, so its children and the merge go on.

Besides records, `poll` hands on `ShardMark` values (same tuple shape) that tell the assembler what
it cannot see in records: "shard" (a shard and its parents, when first known), "end" (the shard
is read to its current end, observed at `at`), "finished" (a CLOSED shard read to its end). A
mark's position is the shard's next position less one, so the loop's read position stays right.
"end" marks come when a shard reaches its end and, while `wants_tick()` says the assembler waits
for fresh observations, again each time a shard at its end is polled (every `interval` seconds);
otherwise an idle topic yields nothing and the loop's idle timeout works.

Prefetch (`poll` only): GetRecords pages are fetched ahead of the loop by reader threads, bounded
in pages and records (bridge/datahub/prefetch.py); `read_range` reads in the caller's thread.

pydatahub 2.29.0's `merge_shard` merges on the server and then raises TypeError building its
result: `merge_shards` does the call and lists the shards to find the new one.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.datahub.calls import DataHubError, Retrying, pydatahub, shard_state, sort_shard_id
from bridge.datahub.prefetch import (
    Prefetch,
    _blob_page_function,
    _Channel,
    _get_blob_page,
    _RawPage,
    _RowsPage,
    server_clock_at,
)
from bridge.stream.shards import DataHubRecord, ShardMark

__all__ = ["DataHubSource", "DataHubRecord", "ShardMark", "DataLossError", "key_text", "parse_key",
           "template_pattern", "merge_shards"]

_RESHARD_CODES = frozenset({"InvalidShardOperation", "ShardSealed", "NoSuchShard"})


class DataLossError(DataHubError):
    """Records were never read and are gone (a committed position below the shard's oldest record)."""


class ShardGoneError(DataHubError):
    """A request named a shard DataHub no longer has (NoSuchShard: deleted past the lifecycle)."""


def key_text(key: tuple[str, str]) -> str:
    """A key as text ("topic:shard"), for positions stored as JSON. DataHub topic names hold only
    letters, digits and underscores, so the colon is unambiguous.

    >>> key_text(("orders", "3")), parse_key("orders:3")
    ('orders:3', ('orders', '3'))
    """
    return f"{key[0]}:{key[1]}"


def parse_key(text: str) -> tuple[str, str]:
    topic, sep, shard = text.rpartition(":")
    if not sep or not topic or not shard:
        raise ValueError(f"not a DataHub shard key: {text!r}")
    return topic, shard


def template_pattern(template: str) -> re.Pattern:
    """A topic-name template (`{db}_{table}`) as a pattern over topic names (case-insensitive: the
    forward `sync` writes names lower case).

    >>> template_pattern("{db}_{table}").fullmatch("shop_orders") is not None
    True
    """
    pattern = re.escape(template).replace(r"\{db\}", "(?P<db>.+?)").replace(r"\{table\}", "(?P<table>.+)")
    return re.compile(pattern, re.IGNORECASE)


@dataclass
class _Shard:
    topic: str
    shard_id: str
    parents: tuple
    state: str
    phase: str = "waiting"  # waiting (parents not finished) | reading | finished
    next: int | None = None  # next sequence to read (None: not decided yet)
    committed: int | None = None
    cursor: str | None = None
    at_end: bool = False
    polled: float = 0.0
    known_end: int = -1
    marked: bool = False  # the "shard" mark was handed on
    closed_seen: float = float("inf")  # when a listing first said CLOSED (monotonic, after its answer)
    retry_at: float = 0.0  # after a failed page: when its reader asks again (monotonic)
    gone: bool = False  # no longer listed (a CLOSED shard deleted past the lifecycle)
    extra: dict = field(default_factory=dict)


class DataHubSource(Prefetch, Retrying):
    """A pipeline Source over the shards of DataHub topics (see the module docstring).

    `topics`: a topic name, a list of names, or a template with `{db}` / `{table}` matched against
    the project's topics. `from_beginning` / `since_ms` choose where shards without a committed
    position start. `page`: records per GetRecords. `interval`: how often a shard at its end is
    asked again (seconds). `relist_interval`: how often the shards are listed again. `readers`:
    threads fetching pages ahead for `poll` (0: none, every page is fetched in `poll`), `prefetch`:
    pages fetched ahead per shard. `processes`: the readers' requests (HTTP, the frame's check, the
    decompression and the parse) run in a fetch process of their own, off this interpreter (Blob
    topics through pydatahub's protobuf client; else, or False, the reader threads fetch)."""

    mark_type = ShardMark  # what `poll` yields beside records: no progress for the loop's idle timeout

    def __init__(self, client, project: str, topics: str | list[str], *, from_beginning: bool = False,
                 since_ms: int | None = None, fail_on_data_loss: bool = True, page: int = 1000,
                 interval: float = 0.2, relist_interval: float = 10.0, max_retries: int = 12,
                 backoff: float = 0.1, max_backoff: float = 10.0, sleep: Callable[[float], None] = time.sleep,
                 seed: int | None = None, observer: Callable[..., None] | None = None,
                 wants_tick: Callable[[], bool] | None = None, readers: int = 3, prefetch: int = 2,
                 processes: bool = True) -> None:
        pydatahub()
        if page < 1:
            raise DataHubError("page must be at least 1")
        if readers < 0 or prefetch < 1:
            raise DataHubError("readers must be at least 0 and prefetch at least 1")
        self.init_retrying(max_retries=max_retries, backoff=backoff, max_backoff=max_backoff, sleep=sleep,
                           seed=seed, observer=observer)
        self.client, self.project = client, project
        self.from_beginning, self.since_ms, self.fail_on_data_loss = from_beginning, since_ms, fail_on_data_loss
        self.page, self.interval, self.relist_interval = page, interval, relist_interval
        self.wants_tick = wants_tick
        self.lost: dict[tuple, int] = {}  # key -> records past the lifecycle, skipped (fail_on_data_loss=False)
        self.relists = 0
        self.ends_interval = 5.0  # how often ends() asks each shard being read for its end (lag)
        self._ends_at = 0.0
        self.topics = self._resolve(topics)
        self.kinds: dict[str, str] = {}
        self.schemas: dict[str, Any] = {}
        for topic in self.topics:
            info = self.call(lambda t=topic: self.client.get_topic(self.project, t), "GetTopic")
            kind = str(getattr(info.record_type, "value", info.record_type)).upper()
            self.kinds[topic] = kind
            self.schemas[topic] = info.record_schema if kind == "TUPLE" else None
        self._shards: dict[tuple, _Shard] = {}
        self._opened = False
        self._resuming = False
        self._marks: list = []
        self._relist_at = 0.0
        self._initial: dict = {}
        self._rr = 0  # round-robin start
        self.readers, self.prefetch, self.processes = readers, prefetch, processes
        self._shared_lock: threading.Lock | None = None
        self._init_prefetch()
        self._relist(initial=True)

    # -- topics and shards ----------------------------------------------------------------------
    def _resolve(self, topics) -> list[str]:
        if isinstance(topics, (list, tuple)):
            names = [str(t) for t in topics]
        elif "{" in topics:
            pattern = template_pattern(topics)
            listed = self.call(lambda: self.client.list_topic(self.project), "ListTopic").topic_names
            names = sorted(t for t in listed if pattern.fullmatch(t))
            if not names:
                raise DataHubError(f"no topic of project {self.project} matches the template {topics!r}")
        else:
            names = [topics]
        if not names:
            raise DataHubError("no DataHub topic to read")
        return names

    def _relist(self, initial: bool = False) -> None:
        self._relist_at = time.monotonic() + self.relist_interval
        self.relists += 0 if initial else 1
        listed = set()
        for topic in self.topics:
            shards = self.call(lambda t=topic: self.client.list_shard(self.project, t), "ListShard").shards
            for s in sorted(shards, key=lambda s: sort_shard_id(s.shard_id)):
                key = (topic, s.shard_id)
                listed.add(key)
                state = shard_state(s)
                known = self._shards.get(key)
                if known is None:
                    parents = tuple(str(p) for p in (getattr(s, "parent_shard_ids", None) or ()))
                    known = self._shards[key] = _Shard(topic, s.shard_id, parents, state)
                else:
                    known.state = state
                if state == "CLOSED" and known.closed_seen == float("inf"):
                    known.closed_seen = time.monotonic()
        for key, st in self._shards.items():
            if key not in listed:
                st.gone = True
        if self._opened:
            for st in list(self._shards.values()):
                if st.gone and st.phase == "waiting":  # never read: its records expired unread
                    self._vanished(st)
            self._advance()

    def _vanished(self, st: _Shard, end: int | None = None) -> None:
        """Shard `st` is gone before it was read to its end (a reading shard learns it from its
        next page's NoSuchShard, so what its reader fetched before is handed on first; `end`: the
        end of the range `read_range` was asked for): its records from the reader's position on
        were never read."""
        key = (st.topic, st.shard_id)
        at = st.next if st.next is not None else (st.committed or 0)
        known = max(st.known_end, at, end or 0)
        text = (f"DataHub {self.project}/{st.topic} shard {st.shard_id} no longer exists (deleted past the topic's "
                f"lifecycle) and was not read to its end: records from {at} on were never read"
                + (f" ({known - at} at least: its end was {known} when last seen)" if known > at else ""))
        if self.fail_on_data_loss:
            raise DataLossError(text + "; fail_on_data_loss=False (--no-fail-on-data-loss) reads on without them")
        self.lost[key] = self.lost.get(key, 0) + known - at
        self._observe("data-loss", topic=st.topic, shard=st.shard_id, committed=at, oldest=known)
        st.next, st.gone = known, True
        if self._opened:
            self._finish(st)
        else:  # (read_range's: no marks, no other shard started)
            st.phase = "finished"

    def _advance(self) -> None:
        """Open the shards whose parents are all finished; hand on marks for shards first known."""
        changed = True
        while changed:
            changed = False
            for key, st in self._shards.items():
                if st.phase != "waiting":
                    continue
                parents = [self._shards.get((st.topic, p)) for p in st.parents]
                if all(p is None or p.phase == "finished" for p in parents):
                    self._start(st)
                    changed = True
        for key, st in self._shards.items():
            if not st.marked:
                st.marked = True
                pos = (st.next if st.next is not None else (st.committed or 0)) - 1
                self._marks.append((key, pos, ShardMark("shard", st.topic, st.shard_id, st.parents,
                                                        time.monotonic()), {}))
                if st.phase == "finished":
                    self._marks.append((key, pos, ShardMark("finished", st.topic, st.shard_id, st.parents,
                                                            time.monotonic()), {}))

    def _start(self, st: _Shard) -> None:
        """Decide where a shard that can be read starts."""
        st.phase = "reading"
        if st.committed is not None:
            oldest = self._sequence(st, "OLDEST")
            if oldest is not None and st.committed < oldest:
                self._lost(st, st.committed, oldest)
                st.next = oldest
            elif st.committed == 1 and self._end(st) == 0:
                st.next = 0  # what earlier versions committed for an empty shard they started at its "end" 1
            else:
                st.next = st.committed
        elif self._resuming or self.from_beginning or not self._initial.get((st.topic, st.shard_id), False):
            st.next = self._sequence(st, "OLDEST") or 0
        elif self.since_ms is not None:
            st.next = self._since(st)
        else:  # from now on: a CLOSED shard has nothing new, an ACTIVE one starts at its end
            st.next = self._end(st)
            if st.state == "CLOSED":
                st.phase = "finished"
        st.cursor = None

    def _lost(self, st: _Shard, committed: int, oldest: int) -> None:
        key = (st.topic, st.shard_id)
        text = (f"DataHub {self.project}/{st.topic} shard {st.shard_id}: records {committed}..{oldest - 1} are past "
                f"the topic's lifecycle and were never read (committed position {committed}, oldest record "
                f"{oldest})")
        if self.fail_on_data_loss:
            raise DataLossError(text + "; fail_on_data_loss=False (--no-fail-on-data-loss) reads on from the oldest")
        self.lost[key] = self.lost.get(key, 0) + oldest - committed
        self._observe("data-loss", topic=st.topic, shard=st.shard_id, committed=committed, oldest=oldest)

    def _cursor(self, st: _Shard, kind: str, param: int = -1):
        """GetCursor's answer (sequence, cursor), or None where DataHub answers that there is no
        such position (a time past the last record, or a sequence out of range)."""
        from datahub import exceptions as dx
        from datahub.models import CursorType
        try:
            result = self.call(lambda: self.client.get_cursor(self.project, st.topic, st.shard_id, CursorType[kind],
                                                               param), "GetCursor", raw=True)
        except (dx.SeekOutOfRangeException, dx.InvalidCursorException, dx.InvalidParameterException):
            return None
        except dx.ResourceNotFoundException as exc:
            if getattr(exc, "error_code", None) == "NoSuchShard":
                raise ShardGoneError(f"GetCursor {st.topic}/{st.shard_id} failed: NoSuchShard: {exc}") from None
            raise DataHubError(f"GetCursor {st.topic}/{st.shard_id} failed: {exc}") from None
        except dx.DatahubException as exc:
            raise DataHubError(f"GetCursor {st.topic}/{st.shard_id} failed: {exc}") from None
        sequence = getattr(result, "sequence", -1)
        return None if sequence is None or sequence < 0 else result

    def _sequence(self, st: _Shard, kind: str, param: int = -1) -> int | None:
        result = self._cursor(st, kind, param)
        return None if result is None else result.sequence

    def _end(self, st: _Shard) -> int:
        """Shard `st`'s next sequence to be written: its last record's + 1, 0 when it holds none.
        LATEST answers sequence 0 on an empty shard as on a shard of one record: unless the shard
        is known to hold a record, one record is read there to tell them apart."""
        latest = self._cursor(st, "LATEST")
        if latest is None:
            end = 0
        elif latest.sequence > 0 or st.known_end >= 1:  # (sequences never go back)
            end = latest.sequence + 1
        else:
            end = 1 if self._holds_a_record(st, latest.cursor) else 0
        st.known_end = max(st.known_end, end)
        return end

    def _holds_a_record(self, st: _Shard, cursor: str) -> bool:
        """Whether a GetRecords of one record at `cursor` (shard `st`'s LATEST when it answered 0)
        gives a record; a CLOSED shard at its end answers InvalidShardOperation (ShardSealed)."""
        from datahub import exceptions as dx
        try:
            _, result = self._get_page(self.client, st.topic, st.shard_id, 0, cursor, 1)
        except dx.ShardSealedException:
            return False
        except dx.ResourceNotFoundException as exc:
            code = getattr(exc, "error_code", None) or type(exc).__name__
            raise (ShardGoneError if code == "NoSuchShard" else DataHubError)(
                f"GetRecords {st.topic}/{st.shard_id} at 0 failed: {code}: {exc}") from None
        except dx.DatahubException as exc:
            raise DataHubError(f"GetRecords {st.topic}/{st.shard_id} at 0 failed: "
                               f"{getattr(exc, 'error_code', None) or type(exc).__name__}: {exc}") from None
        records, _ = self._records_of(st.topic, st.shard_id, result, 0, time.monotonic())
        return bool(records)

    def _since(self, st: _Shard) -> int:
        seq = self._sequence(st, "SYSTEM_TIME", self.since_ms)
        return seq if seq is not None else self._end(st)  # nothing at or after the time: the shard's end

    # -- the Source protocol ----------------------------------------------------------------------
    def keys(self) -> list:
        return sorted(self._shards, key=lambda k: (k[0], sort_shard_id(k[1])))

    def open(self, committed: Mapping[Any, int | None]) -> None:
        self._initial = {k: True for k in self._shards}
        self._resuming = any(v is not None for v in committed.values())
        for key, pos in committed.items():
            st = self._shards.get(tuple(key) if not isinstance(key, str) else parse_key(key))
            if st is not None and pos is not None:
                st.committed = int(pos)
        self._opened = True
        self._prestart()
        self._advance()

    def poll(self, budget: int, timeout: float) -> list:
        if not self._opened:
            self.open({})
        deadline = time.monotonic() + timeout
        out: list = []
        while True:
            self._polled_at = time.monotonic()
            if self._polled_at >= self._relist_at:
                self._relist()
            if self._marks:
                out.extend(self._marks)
                self._marks.clear()
            reading = [st for st in self._shards.values() if st.phase == "reading"]
            arrivals = self._arrivals
            if reading:
                self._rr = (self._rr + 1) % len(reading)
                for st in reading[self._rr:] + reading[:self._rr]:
                    if len(out) >= budget:
                        break
                    if self.readers:
                        self._take(st, budget - len(out), out)
                        continue
                    if st.at_end and time.monotonic() - st.polled < self.interval:
                        continue
                    self._read(st, budget - len(out), out)
            if self._marks:
                out.extend(self._marks)
                self._marks.clear()
            now = time.monotonic()
            if out or now >= deadline:
                return out
            if not self.readers:
                self.sleep(min(self.interval, max(0.0, deadline - now)))
                continue
            with self._cond:  # until a reader brings a page (or the deadline, or the next listing)
                self._kick()
                if self._arrivals == arrivals:
                    self._cond.wait(max(0.0, min(deadline, self._relist_at) - now))

    def caught_up(self) -> bool:
        return all(st.phase == "finished" or (st.phase == "reading" and st.at_end)
                   for st in self._shards.values())

    def ends(self) -> dict:
        """Each shard's end (its next sequence to be written, `end_of`'s: 0 for an empty shard),
        asked about every `ends_interval` seconds for the shards still being read, so the lag (end
        less the committed sequence) counts what is not read yet, not only what was. A shard gone
        past the lifecycle keeps the end last known (its position is moved there once it is
        finished, so its lag is 0)."""
        now = time.monotonic()
        if now - self._ends_at >= self.ends_interval:
            self._ends_at = now
            for key, st in self._shards.items():
                if st.phase == "reading" and not st.at_end and st.next is not None and not st.gone:
                    try:
                        self._end(st)
                    except ShardGoneError:
                        st.gone = True  # (its reader's next page says so, and poll decides what was lost)
        return {k: max(st.known_end, st.next or 0) for k, st in self._shards.items() if st.next is not None}

    def close(self) -> None:
        """Stop the readers (each is joined for up to a second; they are daemon threads), their
        fetch process (waited for up to a second, then killed) and any retry under way."""
        self._closing = True
        with self._cond:
            fetchers, self._fetchers = self._fetchers, None
            self._stopping = True
            for feed in self._feeds.values():
                feed.cancelled = True
            self._feeds.clear()
            self._ready.clear()
            self._later.clear()
            self._cond.notify_all()
        if fetchers is not None:
            fetchers.stop()  # a request under way fails at once
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(1.0)
        if fetchers is not None:
            fetchers.stop(wait=1.0)

    # -- for planners that read shard ranges themselves (the Spark source) ----------------------
    def shard_facts(self, relist: bool = True) -> list[tuple[tuple, tuple, str]]:
        """(key, parents, state) of every shard of the topics still there, listed again unless
        `relist` is false; keys in `keys()` order."""
        if relist:
            self._relist()
        return [(k, self._shards[k].parents, self._shards[k].state) for k in self.keys() if not self._shards[k].gone]

    def sequence(self, key: tuple, kind: str, param: int = -1) -> int | None:
        """GetCursor of `kind` (OLDEST, LATEST, SYSTEM_TIME with `param` ms) on shard `key`: the
        sequence it points at, or None where there is none (a time past its last record). An empty
        shard answers 0 (OLDEST and LATEST alike): its end is `end_of`'s."""
        return self._sequence(self._shards[tuple(key)], kind, param)

    def end_of(self, key: tuple) -> int:
        """The shard's next sequence to be written (its last record's + 1; 0 when it is empty).
        A shard DataHub no longer has (past the lifecycle): ShardGoneError."""
        return self._end(self._shards[tuple(key)])

    def start_at(self, key: tuple, since_ms: int) -> int:
        """The first sequence of shard `key` written at or after `since_ms`, else the shard's end."""
        seq = self.sequence(key, "SYSTEM_TIME", since_ms)
        return seq if seq is not None else self.end_of(key)

    def read_range(self, key: tuple, start: int, end: int) -> Iterator[DataHubRecord]:
        """The records of shard `key` with sequences in [start, end), in order, read with GetRecords
        pages under the retry policy. Records below the shard's oldest are past the lifecycle:
        `DataLossError`, or with `fail_on_data_loss=False` skipped and counted in `lost`. A shard
        that ends before `end` (a topic deleted and created again) is a DataHubError. A shard no
        longer there (deleted past the lifecycle since the range was planned) is lost data too."""
        st = self._shards.get(tuple(key))
        if st is None or st.gone:
            self._relist()
            st = self._shards.get(tuple(key))
        if end <= start:
            return
        if st is None:  # never listed by this reader: gone before it looked
            st = _Shard(key[0], key[1], (), "CLOSED", gone=True)
        st.next, st.cursor, st.at_end = start, None, False
        try:
            oldest = None if st.gone else self._sequence(st, "OLDEST")
        except ShardGoneError:
            oldest, st.gone = None, True
        if st.gone:
            self._vanished(st, end)
            return
        if oldest is not None and start < oldest:
            self._lost(st, start, min(oldest, end))
            st.next = min(oldest, end)
        while st.next < end:
            out: list = []
            before = st.next
            self._read(st, min(self.page, end - st.next), out)
            self._marks.clear()
            for _, seq, rec, _ in out:
                if seq >= end:
                    return
                yield rec
            if st.gone:  # (a NoSuchShard answer, and the listing agreed)
                self._vanished(st, end)
                return
            if st.next == before and not out:
                raise DataHubError(f"DataHub {self.project}/{st.topic} shard {st.shard_id} ends at {st.next}, "
                                   f"before the planned end {end} (was the topic created again?)")

    # -- reading ----------------------------------------------------------------------------------
    def _get_page(self, client, topic: str, shard_id: str, next_: int, cursor: str | None, limit: int):
        """(cursor asked with, GetRecords answer) of the page at `next_` (a SEQUENCE cursor first
        when `cursor` is None), under the retry policy; DataHub errors raised as pydatahub raised them."""
        if type(client) is _Channel:  # a fetch process (prefetch.py): a Blob topic
            if cursor is None:
                cursor = self.call(lambda: client.request("cursor", self.project, topic, shard_id, next_),
                                   "GetCursor", raw=True)
            if _blob_page_function() is not None:  # the answer's bytes; its records made in C (_records_of)
                result = self.call(lambda: _RawPage(*client.request("frame", self.project, topic, shard_id, cursor,
                                                                    limit)), "GetRecords", raw=True)
            else:
                result = self.call(lambda: _RowsPage(*client.request("page", self.project, topic, shard_id, cursor,
                                                                     limit)), "GetRecords", raw=True)
            return cursor, result
        from datahub.models import CursorType
        if cursor is None:
            cursor = self.call(lambda: client.get_cursor(self.project, topic, shard_id, CursorType.SEQUENCE, next_),
                               "GetCursor", raw=True).cursor
        if self.kinds[topic] == "BLOB":
            result = self.call(lambda: _get_blob_page(client, self.project, topic, shard_id, cursor, limit)
                               or client.get_blob_records(self.project, topic, shard_id, cursor, limit),
                               "GetRecords", raw=True)
        else:
            result = self.call(lambda: client.get_tuple_records(self.project, topic, shard_id, self.schemas[topic],
                                                                 cursor, limit), "GetRecords", raw=True)
        return cursor, result

    def _records_of(self, topic: str, shard_id: str, result, next_: int, now: float) -> tuple[list, int]:
        """The records of a GetRecords answer from position `next_` on, as `poll` hands them on,
        and the position after them."""
        key = (topic, shard_id)
        out = []
        if type(result) is _RawPage:
            got = result.take(key, topic, shard_id, next_, now, DataHubRecord)
            if got is not None:
                return got
        if type(result) is _RowsPage or type(result) is _RawPage:  # (a _RawPage C was not sure of: its rows)
            record = DataHubRecord
            for seq, system_time, attributes, data in result.records:
                if seq < next_:
                    continue  # (a cursor placed before the position: already handed on)
                out.append((key, seq, record(topic, shard_id, seq, system_time, attributes, data, None, None, now),
                            attributes))
            if out:
                next_ = out[-1][1] + 1
        elif self.kinds[topic] == "BLOB":
            for r in result.records or ():
                seq = r.sequence
                if seq < next_:
                    continue  # (a cursor placed before the position: already handed on)
                value = DataHubRecord(topic, shard_id, seq, r.system_time, dict(r.attributes or {}),
                                      data=bytes(r.blob_data), read_at=now)
                out.append((key, seq, value, value.attributes))
                next_ = seq + 1
        else:
            schema = self.schemas[topic]
            for r in result.records or ():
                seq = r.sequence
                if seq < next_:
                    continue
                row = {f.name: v for f, v in zip(r.field_list, r.values)}
                value = DataHubRecord(topic, shard_id, seq, r.system_time, dict(r.attributes or {}),
                                      row=row, schema=schema, read_at=now)
                out.append((key, seq, value, value.attributes))
                next_ = seq + 1
        return out, next_

    def _read(self, st: _Shard, want: int, out: list) -> None:
        """One page of shard `st`, read in this thread (`read_range`, and `poll` without readers)."""
        from datahub import exceptions as dx
        st.polled = time.monotonic()
        try:
            st.cursor, result = self._get_page(self.client, st.topic, st.shard_id, st.next, st.cursor,
                                               min(self.page, want))
        except (dx.DatahubException, DataHubError) as exc:
            self._failed_page(st, exc)
            return
        answered = time.monotonic()
        records, st.next = self._records_of(st.topic, st.shard_id, result, st.next, answered)
        out.extend(records)
        st.known_end = max(st.known_end, st.next)
        if result.records:
            st.cursor = result.next_cursor
        if records:
            st.at_end = False
            return
        if st.state == "CLOSED":
            self._finish(st)
            return
        self._at_end(st, (st.topic, st.shard_id), server_ms=server_clock_at(result, st.polled, answered))

    def _failed_page(self, st: _Shard, exc: BaseException) -> None:
        """What a GetRecords (or its GetCursor) that raised `exc` at `st.next` means: a reshard (the
        shard is listed again, finished when CLOSED), a cursor expired or a position past the
        lifecycle (lost records, or the shard's end), else a DataHubError naming the shard."""
        from datahub import exceptions as dx
        key = (st.topic, st.shard_id)
        if isinstance(exc, DataHubError):  # retries used up (or stopped): which shard it was
            raise type(exc)(f"DataHub {self.project}/{st.topic} shard {st.shard_id} at {st.next}: {exc}") from None
        if isinstance(exc, (dx.ShardSealedException, dx.ResourceNotFoundException)):
            code = getattr(exc, "error_code", None) or type(exc).__name__
            if code not in _RESHARD_CODES and not isinstance(exc, dx.ShardSealedException):
                raise DataHubError(f"GetRecords {st.topic}/{st.shard_id} failed: {code}: {exc}") from None
            self._relist()
            if st.gone:
                if self._opened:  # (read_range decides itself)
                    self._vanished(st)
            elif st.state == "CLOSED":
                self._finish(st)
            return
        if isinstance(exc, (dx.SeekOutOfRangeException, dx.InvalidCursorException)):
            # the cursor expired (or the position is past the lifecycle): check for loss, start again
            st.cursor = None
            oldest = self._sequence(st, "OLDEST")
            if oldest is not None and st.next is not None and st.next < oldest:
                self._lost(st, st.next, oldest)
                st.next = oldest
                return
            end = self._end(st)
            if st.next is not None and st.next > end:
                raise DataHubError(f"DataHub {self.project}/{st.topic} shard {st.shard_id}: position {st.next} is "
                                   f"past the shard's end ({end}): was the topic created again? ({exc})") from None
            if st.next == end:
                self._at_end(st, key)  # a cursor past the last record (real DataHub refuses one)
                return
            raise DataHubError(f"GetRecords {st.topic}/{st.shard_id} at {st.next} failed: {exc}") from None
        if isinstance(exc, dx.DatahubException):
            raise DataHubError(f"GetRecords {st.topic}/{st.shard_id} failed: "
                               f"{getattr(exc, 'error_code', None) or type(exc).__name__}: {exc}") from None
        raise exc

    # -- prefetch (poll with readers) ----------------------------------------------------------
    def _take(self, st: _Shard, want: int, out: list) -> None:
        """Hand on up to `want` records of shard `st` from what its reader fetched, in order; decide
        what an answer without records means when it is reached."""
        key = (st.topic, st.shard_id)
        feed = self._feeds.get(key)
        if feed is None or feed.st is not st:
            feed = self._start_feed(st)
        while want > 0:
            rest = feed.rest
            if rest:
                n = min(want, len(rest))
                for _ in range(n):
                    out.append(rest.popleft())
                want -= n
                st.next = out[-1][1] + 1
                st.at_end = False
                continue
            with self._cond:
                if not feed.pages:
                    self._schedule(feed)
                    return
                page = feed.pages.popleft()
                self._held -= len(page.records)
                self._schedule(feed)
            st.polled = page.answered
            if page.error is not None:
                with self._cond:
                    feed.cancelled = True
                    self._feeds.pop(key, None)
                st.retry_at = time.monotonic() + self.interval  # as a read in the loop would, after a pause
                self._failed_page(st, page.error)
                return
            st.known_end = max(st.known_end, page.next)
            if page.records:
                feed.rest.extend(page.records)
                continue
            if st.state == "CLOSED" and page.asked >= st.closed_seen:
                with self._cond:
                    feed.cancelled = True
                    self._feeds.pop(key, None)
                self._finish(st)
                return
            self._at_end(st, key, at=page.asked, server_ms=page.server_ms)
            return

    def _at_end(self, st: _Shard, key, at: float | None = None, server_ms: int | None = None) -> None:
        """The shard was read to its end (asked at `at`, monotonic, default now; DataHub's clock was
        then at least `server_ms` when known)."""
        fresh = not st.at_end
        st.at_end = True
        if fresh or (self.wants_tick is not None and self.wants_tick()):
            self._marks.append((key, st.next - 1, ShardMark("end", st.topic, st.shard_id, st.parents,
                                                            time.monotonic() if at is None else at, server_ms), {}))

    def _finish(self, st: _Shard) -> None:
        st.phase = "finished"
        st.at_end = True
        key = (st.topic, st.shard_id)
        self._marks.append((key, (st.next or 0) - 1, ShardMark("finished", st.topic, st.shard_id, st.parents,
                                                               time.monotonic()), {}))
        self._advance()


def merge_shards(client, project: str, topic: str, shard_id: str, adjacent_shard_id: str) -> str:
    """MergeShard, then the new shard's id from ListShard (pydatahub 2.29.0's `merge_shard` merges on
    the server and then raises TypeError building its result)."""
    try:
        result = client.merge_shard(project, topic, shard_id, adjacent_shard_id)
        got = getattr(result, "shard_id", None)
        if got:
            return str(got)
    except TypeError:
        pass
    for s in client.list_shard(project, topic).shards:
        parents = {str(p) for p in (getattr(s, "parent_shard_ids", None) or ())}
        if parents == {str(shard_id), str(adjacent_shard_id)}:
            return str(s.shard_id)
    raise DataHubError(f"MergeShard {topic} {shard_id}+{adjacent_shard_id}: no merged shard listed")
