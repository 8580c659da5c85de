"""DataHubSource's prefetch (bridge/datahub/source.py): GetRecords pages read ahead of the loop.

Prefetch (`poll` only): GetRecords pages of `page` records are fetched ahead of the loop by up to
`readers` reader threads, each with its own copy of the pydatahub client (a requests session is
not shared between threads), at most `prefetch` pages per shard and `page * prefetch * readers`
records in all, so memory stays bounded while the loop assembles. A shard's pages are fetched one
after the other and handed on in order; everything a page's answer decides (records, the shard at
its end, finished, a reshard, a lost range, an error naming the shard) is decided on the loop's
thread when the loop reaches that page, exactly as a read in the loop would. A shard at its end is
asked again every `interval` seconds while the loop polls. The readers are daemon threads and end
with `close()` (or after 10 s without work); `read_range` reads in the caller's thread.

The Blob pages are asked through pydatahub's protobuf client (its request, signing, compression
and errors) and parsed with the protobuf runtime from pydatahub's own GetRecordsResponse fields
(`_get_blob_page`), a fraction of pydatahub's cost per page; another client, and Tuple topics, use
pydatahub's own get_*_records.

`Prefetch` holds the readers' state and code; `DataHubSource` (which decides what every page
means, on the loop's thread) builds on it.
"""
from __future__ import annotations

import copy
import heapq
import itertools
import threading
import time
from collections import deque

__all__ = ["Prefetch"]


class _Page:
    """One GetRecords answer fetched ahead: the records (as `poll` hands them on), the position and
    cursor after them, or the exception the request raised; when it was asked and answered, and
    DataHub's clock when it was asked (`server_ms`: a lower bound, or None; `server_clock_at`)."""
    __slots__ = ("records", "next", "cursor", "error", "asked", "answered", "server_ms")

    def __init__(self, records, next_, cursor, error, asked, answered, server_ms=None) -> None:
        self.records, self.next, self.cursor, self.error = records, next_, cursor, error
        self.asked, self.answered, self.server_ms = asked, answered, server_ms


def server_clock_at(result, asked: float, answered: float) -> int | None:
    """A lower bound of DataHub's clock (ms since the epoch) at local time `asked` (monotonic), from
    the Date of an answer received at `answered`: the server's clock was at least that Date (whole
    seconds, rounded down) when it answered, so at least that less the round trip when it was asked.
    None when the answer did not say (not a `_PbPage`, no Date)."""
    date = getattr(result, "date", None)
    if not date:
        return None
    from email.utils import mktime_tz, parsedate_tz
    parsed = parsedate_tz(date)
    if parsed is None or parsed[9] is None:  # not a date, or no zone
        return None
    return int((mktime_tz(parsed) - (answered - asked)) * 1000)


class _Feed:
    """A shard's prefetch: `next`/`cursor` where its reader fetches next (reader-owned while
    `fetching`), `pages` fetched and not yet taken, `rest` of the page being handed on. Guarded by
    the source's condition, except `rest` (the loop's)."""
    __slots__ = ("st", "key", "next", "cursor", "pages", "rest", "queued", "fetching", "halted", "cancelled",
                 "empty", "answered")

    def __init__(self, st) -> None:
        self.st, self.key = st, (st.topic, st.shard_id)
        self.next, self.cursor = st.next, None
        self.pages: deque = deque()
        self.rest: deque = deque()
        self.queued = self.fetching = self.halted = self.cancelled = False
        self.empty = False  # the last answer had no records: ask again `interval` after it
        self.answered = 0.0


class _Locked:
    """A client that cannot be copied, shared by the loop and the readers one call at a time."""

    def __init__(self, client, lock) -> None:
        self._client, self._lock = client, lock

    def __getattr__(self, name):
        target = getattr(self._client, name)
        if not callable(target):
            return target

        def locked(*args, **kwargs):
            with self._lock:
                return target(*args, **kwargs)
        return locked


def _client_copy(client):
    """A copy of a pydatahub `DataHub` client with its own requests session (same endpoint, account,
    protocol, compression, timeouts and adapters), for another thread; None when `client` is not one."""
    impl = getattr(client, "_datahub_impl", None)
    rest = getattr(impl, "_rest_client", None)
    session = getattr(rest, "_session", None)
    if session is None:
        return None
    import requests
    from requests.adapters import HTTPAdapter
    new_session = requests.Session()
    new_session.headers.clear()
    new_session.headers.update(session.headers)
    for prefix, adapter in session.adapters.items():
        if type(adapter) is not HTTPAdapter:
            return None
        new_session.mount(prefix, HTTPAdapter(pool_connections=adapter._pool_connections,
                                              pool_maxsize=adapter._pool_maxsize, max_retries=adapter.max_retries))
    new_rest = copy.copy(rest)
    new_rest._session = new_session
    new_impl = copy.copy(impl)
    new_impl._rest_client = new_rest
    new = copy.copy(client)
    new._datahub_impl = new_impl
    return new


_PB_RESPONSE: list = []  # the GetRecordsResponse class below, built once


def _pb_response_class():
    """pydatahub's GetRecordsResponse (datahub/proto/datahub_record_proto_pb.py, the same field
    numbers and types) as a message of the protobuf runtime (upb), in a pool of its own: a 1,000
    record page parses in a fraction of a millisecond instead of pydatahub's several (cprotobuf
    objects, then a BlobRecord per record)."""
    if _PB_RESPONSE:
        return _PB_RESPONSE[0]
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    fdp = descriptor_pb2.FileDescriptorProto(name="dts_bridge_datahub_get_records.proto",
                                             package="dts_bridge_datahub", syntax="proto2")
    f = descriptor_pb2.FieldDescriptorProto
    one, many = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    messages = {
        "StringPair": [("key", 1, f.TYPE_STRING, one, ""), ("value", 2, f.TYPE_STRING, one, "")],
        "FieldData": [("value", 1, f.TYPE_BYTES, one, "")],
        "RecordAttributes": [("attributes", 1, f.TYPE_MESSAGE, many, "StringPair")],
        "RecordData": [("data", 1, f.TYPE_MESSAGE, many, "FieldData")],
        "RecordEntry": [("shard_id", 1, f.TYPE_STRING, one, ""), ("hash_key", 2, f.TYPE_STRING, one, ""),
                        ("partition_key", 3, f.TYPE_STRING, one, ""), ("cursor", 4, f.TYPE_STRING, one, ""),
                        ("next_cursor", 5, f.TYPE_STRING, one, ""), ("sequence", 6, f.TYPE_INT64, one, ""),
                        ("system_time", 7, f.TYPE_INT64, one, ""),
                        ("attributes", 8, f.TYPE_MESSAGE, one, "RecordAttributes"),
                        ("data", 9, f.TYPE_MESSAGE, one, "RecordData")],
        "GetRecordsResponse": [("next_cursor", 1, f.TYPE_STRING, one, ""), ("record_count", 2, f.TYPE_INT32, one, ""),
                               ("start_sequence", 3, f.TYPE_INT64, one, ""),
                               ("records", 4, f.TYPE_MESSAGE, many, "RecordEntry")],
    }
    for name, fields in messages.items():
        message = fdp.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            added = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = f".dts_bridge_datahub.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    _PB_RESPONSE.append(message_factory.GetMessageClass(pool.FindMessageTypeByName(
        "dts_bridge_datahub.GetRecordsResponse")))
    return _PB_RESPONSE[0]


class _PbPage:
    """A Blob GetRecords answer parsed by `_get_blob_page`: `records` are RecordEntry messages,
    `date` the answer's Date header (or None)."""
    __slots__ = ("records", "next_cursor", "date")

    def __init__(self, records, next_cursor, date=None) -> None:
        self.records, self.next_cursor, self.date = records, next_cursor, date


_CRC32C: list = []


def _get_blob_page(client, project: str, topic: str, shard_id: str, cursor: str, limit: int):
    """GetRecords of a Blob shard through pydatahub's protobuf client (its request, signing,
    compression and errors), the answer parsed by `_pb_response_class`; None when `client` is not
    pydatahub's protobuf client (then its own `get_blob_records` is called)."""
    impl = getattr(client, "_datahub_impl", None)
    rest = getattr(impl, "_rest_client", None)
    if rest is None or type(impl).__name__ != "DataHubPB":
        return None
    from datahub.exceptions import DatahubException
    from datahub.models.params import GetPBRecordsRequestParams
    from datahub.rest import Path
    request = GetPBRecordsRequestParams(cursor, limit)
    content, headers = rest.post(Path.SHARD % (project, topic, shard_id), data=request.content(),
                           headers=request.extra_headers(None), compress_format=impl._compress_format)
    if not _CRC32C:
        import crcmod.predefined
        _CRC32C.append(crcmod.predefined.mkCrcFun("crc-32c"))
    body = bytes(content)
    pb = body[12:]  # after "DHUB", the crc32c and the length, as pydatahub's unwrap_pb_frame reads it
    if int.from_bytes(body[4:8], "big") != _CRC32C[0](pb) & 0xFFFFFFFF:
        raise DatahubException("Parse pb response body fail, error: crc check error")
    answer = _pb_response_class().FromString(pb)
    return _PbPage(answer.records, answer.next_cursor, headers.get("Date") if headers is not None else None)


class Prefetch:
    """The reader threads of a DataHubSource and what they fetched ahead (see the module docstring).
    The source gives `client`, `project`, `page`, `prefetch`, `readers`, `interval`,
    `_shared_lock`, `_get_page` and `_records_of`."""

    def _init_prefetch(self) -> None:
        """The readers' shared state (see the module docstring), under _cond: none running yet."""
        self._cond = threading.Condition()
        self._feeds: dict[tuple, _Feed] = {}
        self._ready: deque = deque()  # feeds to fetch now
        self._later: list = []  # heap of (when, n, feed): shards at their end, asked again later
        self._tick = itertools.count()
        self._threads: list = []
        self._held = 0  # records in fetched pages not yet taken
        self._arrivals = 0  # pages fetched so far (poll waits for the next)
        self._polled_at = 0.0
        self._stopping = False

    _PREFETCH_STATE = ("_cond", "_feeds", "_ready", "_later", "_tick", "_threads", "_held", "_arrivals",
                       "_polled_at", "_stopping")

    def __getstate__(self) -> dict:
        """Picklable (Spark ships a source to its tasks): without the readers and what they fetched
        ahead; a copy fetches again from each shard's position when it polls."""
        state = {k: v for k, v in self.__dict__.items() if k not in self._PREFETCH_STATE}
        if state.get("_shared_lock") is not None:
            state["client"], state["_shared_lock"] = self.client._client, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_prefetch()

    def _start_feed(self, st) -> _Feed:
        feed = _Feed(st)
        if st.retry_at > time.monotonic():
            feed.empty, feed.answered = True, st.retry_at - self.interval
        with self._cond:
            old = self._feeds.get(feed.key)
            if old is not None:
                old.cancelled = True
            self._feeds[feed.key] = feed
            self._schedule(feed)
            self._ensure_readers()
        return feed

    def _schedule(self, feed: _Feed) -> None:
        """(Under _cond.) Queue the feed's next fetch if it has room and is not queued or fetching;
        a shard at its end is asked again `interval` after its last answer, while the loop polls."""
        if feed.queued or feed.fetching or feed.halted or feed.cancelled or self._stopping:
            return
        if len(feed.pages) >= self.prefetch or self._held >= self.page * self.prefetch * max(1, self.readers):
            return
        if feed.empty:
            if feed.pages:
                return  # its answer without records is not taken yet: nothing to ask for now
            if time.monotonic() - self._polled_at > max(1.0, 5 * self.interval):
                return  # nobody polls: asked again at the next poll (_kick)
            feed.queued = True
            heapq.heappush(self._later, (feed.answered + self.interval, next(self._tick), feed))
        else:
            feed.queued = True
            self._ready.append(feed)
        self._cond.notify_all()

    def _kick(self) -> None:
        """(Under _cond.) Queue every feed that has room (after taking pages, or a pause in polling)."""
        for feed in self._feeds.values():
            self._schedule(feed)
        self._ensure_readers()

    def _ensure_readers(self) -> None:
        """(Under _cond.) Start reader threads up to `readers` (one per shard at most)."""
        self._threads = [t for t in self._threads if t.is_alive()]
        want = min(self.readers, len(self._feeds))
        while len(self._threads) < want and not self._stopping:
            client = self._reader_client()
            thread = threading.Thread(target=self._reader, args=(client,), daemon=True,
                                      name=f"datahub-reader-{self.project}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def _reader_client(self):
        client = _client_copy(self.client)
        if client is not None:
            return client
        if self._shared_lock is None:  # not a pydatahub client: shared, one call at a time
            self._shared_lock = threading.Lock()
            self.client = _Locked(self.client, self._shared_lock)
        return self.client

    def _reader(self, client) -> None:
        """A reader thread: fetch the next page of the feed due first, until close() or 10 s idle."""
        cond = self._cond
        while True:
            with cond:
                idle_since = time.monotonic()
                while True:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    while self._later and self._later[0][0] <= now:
                        self._ready.append(heapq.heappop(self._later)[2])
                    feed = None
                    while self._ready:
                        candidate = self._ready.popleft()
                        candidate.queued = False
                        if not candidate.cancelled:
                            feed = candidate
                            break
                    if feed is not None:
                        break
                    if now - idle_since >= 10.0:
                        self._threads = [t for t in self._threads if t is not threading.current_thread()]
                        return
                    cond.wait(min(self._later[0][0] - now, 10.0) if self._later else 10.0)
                feed.fetching = True
                topic, shard_id, next_, cursor = feed.st.topic, feed.st.shard_id, feed.next, feed.cursor
            asked = time.monotonic()
            try:
                used, result = self._get_page(client, topic, shard_id, next_, cursor, self.page)
                answered = time.monotonic()
                records, after = self._records_of(topic, shard_id, result, next_, answered)
                page = _Page(records, after, result.next_cursor if result.records else used, None, asked, answered,
                             server_clock_at(result, asked, answered))
            except BaseException as exc:  # decided on the loop's thread when it reaches this page
                page = _Page([], next_, cursor, exc, asked, time.monotonic())
            with cond:
                feed.fetching = False
                if feed.cancelled:
                    continue
                if page.error is not None:
                    feed.halted = True
                else:
                    feed.next, feed.cursor = page.next, page.cursor
                    feed.empty, feed.answered = not page.records, page.answered
                last = feed.pages[-1] if feed.pages else None
                if last is not None and page.error is None and not page.records and not last.records \
                        and last.error is None:
                    feed.pages[-1] = page  # a newer look at the same end replaces the one not taken yet
                else:
                    feed.pages.append(page)
                    self._held += len(page.records)
                self._arrivals += 1
                self._schedule(feed)
                cond.notify_all()
