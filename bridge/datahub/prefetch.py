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

Reader processes (`processes`, the default): the readers' requests run in a fetch process, one
per source, started with `subprocess` (not a fork: the process has confluent-kafka's threads) once
the readers have fetched `process_after` (8) pages' worth of records themselves, so a short read
does not pay its start, and a reader goes on fetching itself until the process says it is ready.
The HTTP request through pydatahub (requests, signing), the frame's CRC-32C (`crc32c_function`:
google-crc32c's, else crcmod's, made once), the lz4 decompression and the protobuf parse are then
its CPU, not the loop's interpreter's. Each reader thread has a socket of its own to it and waits on it with the GIL
released; a page comes back as (sequence, system time, attributes, data) tuples that the reader
thread makes records of. The scheduling, the bounds, the order and what an answer means are the
reader threads' as without it, and so are the retries (an error comes back as the exception
pydatahub raised). It serves Blob topics through pydatahub's protobuf client; for another client or
a Tuple topic (or `processes=False`, or when it cannot start) the reader threads fetch themselves.
It ends with `close()`, with the last reader ending idle, or when the parent ends (its stdin
closes).

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
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections import deque

__all__ = ["Prefetch", "crc32c_function"]


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
    None when the answer did not say (not a `_RowsPage`, no Date)."""
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


_CRC32C: list = []


def _get_blob_page(client, project: str, topic: str, shard_id: str, cursor: str, limit: int):
    """GetRecords of a Blob shard through pydatahub's protobuf client (its request, signing,
    compression and errors), the answer as `page_of_frame` makes it; None when `client` is not
    pydatahub's protobuf client (then its own `get_blob_records` is called)."""
    frame = _get_blob_frame(client, project, topic, shard_id, cursor, limit)
    return None if frame is None else page_of_frame(*frame)


NATIVE_PAGES = True  # False: every page through `_rows_of` (the reference), as without the C extension
_BLOB_PAGE: list = []


def _blob_page_function():
    """The C extension's `blob_page` (bridge/native/src/pages.c), else None (not built, or
    NATIVE_PAGES off). Imported here, not at the top: a fetch process runs this file without the
    bridge package."""
    if not NATIVE_PAGES:
        return None
    if not _BLOB_PAGE:
        from bridge.native import speedups  # (None without the extension)
        _BLOB_PAGE.append(getattr(speedups, "blob_page", None))
    return _BLOB_PAGE[0]


def page_of_frame(pb: bytes, date: str | None):
    """A Blob GetRecords answer's bytes as a page: a `_RawPage` (its records made in C when they are
    taken) with the C extension, else a `_RowsPage` parsed by `_rows_of`."""
    return _RawPage(pb, date) if _blob_page_function() is not None else _RowsPage(*_rows_of(pb, date))


def crc32c_function():
    """The CRC-32C of bytes: google-crc32c's (SSE4.2 / ARMv8 CRC instructions, about 0.05 ms for a
    1.5 MB page) when it is installed with its C extension, else crcmod's C table (about 3 ms),
    which pydatahub itself uses."""
    try:
        import google_crc32c
        if google_crc32c.implementation == "c":
            return google_crc32c.value
    except ImportError:
        pass
    import crcmod.predefined
    return crcmod.predefined.mkCrcFun("crc-32c")


def _get_blob_frame(client, project: str, topic: str, shard_id: str, cursor: str, limit: int):
    """(GetRecordsResponse bytes, Date header or None) of a Blob shard's GetRecords through
    pydatahub's protobuf client, its frame's CRC-32C checked; None when `client` is not pydatahub's
    protobuf client."""
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
        _CRC32C.append(crc32c_function())
    body = bytes(content)
    pb = body[12:]  # after "DHUB", the crc32c and the length, as pydatahub's unwrap_pb_frame reads it
    if int.from_bytes(body[4:8], "big") != _CRC32C[0](pb) & 0xFFFFFFFF:
        raise DatahubException("Parse pb response body fail, error: crc check error")
    return pb, headers.get("Date") if headers is not None else None


# -- reader processes ---------------------------------------------------------------------------
# A fetch process serves the reader threads' requests (GetCursor, a Blob GetRecords page) over one
# socket each: the HTTP request through pydatahub (signing, requests), the frame's CRC-32C, the
# decompression and the protobuf parse run in its interpreter, not the loop's; it answers a page
# as plain tuples (`_rows_of`) that `_records_of` turns into records.
# The retries stay in the reader threads (the policy of `Retrying.call`, the observer): an error
# comes back as the exception pydatahub raised. The process runs this file as a module of its own
# (only the standard library at its top, pydatahub lazily): it imports neither the bridge package
# nor the parent's main module, and is started with subprocess (no fork of a process with
# confluent-kafka's threads). It ends when the parent closes its stdin (close(), its readers idle,
# or the parent's end).

def _read_exact(stream, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) < size:
        raise EOFError("the parent went away")
    return data


def _portable_error(exc: BaseException) -> bytes:
    """An answer carrying `exc`, pickled (the class with its state; its text if it cannot be)."""
    try:
        data = pickle.dumps(("error", exc), protocol=5)
        pickle.loads(data)
        return data
    except Exception:
        cls = type(exc)
        state = {}
        for k, v in getattr(exc, "__dict__", {}).items():
            try:
                pickle.dumps(v)
            except Exception:
                continue
            state[k] = v
        return pickle.dumps(("error-parts", (cls.__module__, cls.__qualname__, str(exc), state)), protocol=5)


def _rebuilt_error(parts) -> BaseException:
    import importlib
    module, name, text, state = parts
    try:
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        exc = cls.__new__(cls)
        exc.args = (text,)
        exc.__dict__.update(state)
        return exc
    except Exception:
        return RuntimeError(f"{module}.{name}: {text}")


_BUSY = threading.Condition()  # (in a fetch process) its requests under way, in _BUSY.count
_BUSY.count = 0


def _rows_of(pb: bytes, date: str | None) -> tuple:
    """(rows, next cursor, date) of a GetRecordsResponse's bytes: the rows (sequence, system time,
    attributes, data) tuples, each text that repeats one str object (pickled once, then referenced:
    the reader unpickles a page in about half the time)."""
    answer = _pb_response_class().FromString(pb)
    same: dict = {}
    rows = [(r.sequence, r.system_time,
             {same.setdefault(a.key, a.key): same.setdefault(a.value, a.value) for a in r.attributes.attributes},
             r.data.data[0].value) for r in answer.records]
    return rows, answer.next_cursor, date


class _RowsPage:
    """A Blob GetRecords answer (`_get_blob_page`, or a fetch process): `records` are (sequence, system time,
    attributes, data) tuples, `date` the answer's Date header (or None)."""
    __slots__ = ("records", "next_cursor", "date")

    def __init__(self, records, next_cursor, date) -> None:
        self.records, self.next_cursor, self.date = records, next_cursor, date


class _RawPage:
    """A Blob GetRecords answer still in its bytes (`raw`, the GetRecordsResponse; `date` its Date
    header), as a fetch process or `_get_blob_frame` gives it: `take` makes the source's records of
    it in one C pass (bridge/native/src/pages.c), and sets `records` (how many the answer held) and
    `next_cursor`; where C is not sure (malformed bytes, text that is not UTF-8, ...), `records`
    and `next_cursor` become `_rows_of`'s, the reference, which the caller then reads as from a
    `_RowsPage` (and which raises what protobuf raises)."""
    __slots__ = ("raw", "date", "records", "next_cursor")

    def __init__(self, raw: bytes, date: str | None) -> None:
        self.raw, self.date = raw, date
        self.records = self.next_cursor = None

    def take(self, key, topic: str, shard_id: str, next_: int, now: float, record):
        """(records, position after them) as DataHubSource._records_of gives them, or None: then
        `records` holds `_rows_of`'s rows."""
        fast = _blob_page_function()
        got = fast(self.raw, key, topic, shard_id, next_, now, record) if fast is not None else None
        if got is None:
            self.records, self.next_cursor, _ = _rows_of(self.raw, self.date)
            return None
        out, self.next_cursor, self.records = got
        return out, (out[-1][1] + 1 if out else next_)


def _serve_channel(client_bytes: bytes, fd: int) -> None:
    """A fetch process's thread: answer one reader thread's requests until its socket closes."""
    from multiprocessing.connection import Connection
    conn = Connection(fd)
    client = pickle.loads(client_bytes)  # a client (requests session) of this thread's own
    try:
        conn.send_bytes(b"ready")  # (pydatahub imported: the reader switches to this channel)
    except OSError:
        return
    while True:
        try:
            op, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        with _BUSY:
            _BUSY.count += 1
        try:
            if op == "cursor":
                from datahub.models import CursorType
                project, topic, shard_id, sequence = args
                reply = pickle.dumps(("ok", client.get_cursor(project, topic, shard_id, CursorType.SEQUENCE,
                                                              sequence).cursor), protocol=5)
            elif op == "page":
                reply = pickle.dumps(("ok", _rows_of(*_get_blob_frame(client, *args))), protocol=5)
            elif op == "frame":  # the answer's bytes: the parent makes its records (`_RawPage`)
                reply = pickle.dumps(("ok", _get_blob_frame(client, *args)), protocol=5)
            else:
                raise ValueError(f"no request {op!r}")
        except BaseException as exc:
            reply = _portable_error(exc)
        finally:
            with _BUSY:
                _BUSY.count -= 1
                _BUSY.notify_all()
        try:
            conn.send_bytes(reply)
        except OSError:
            return


def _fetch_process() -> None:
    """A fetch process's main: the client and its sockets from stdin, a thread per socket, until
    stdin closes (then the requests under way end first, for up to a second)."""
    stdin = sys.stdin.buffer
    size = int.from_bytes(_read_exact(stdin, 4), "big")
    client_bytes, fds = pickle.loads(_read_exact(stdin, size))
    for fd in fds:
        threading.Thread(target=_serve_channel, args=(client_bytes, fd), daemon=True).start()
    try:
        while stdin.read(65536):
            pass
        with _BUSY:
            _BUSY.wait_for(lambda: _BUSY.count == 0, 1.0)
    finally:
        os._exit(0)


class _Channel:
    """A reader thread's way to its fetch process (one request at a time)."""

    def __init__(self, sock, fetchers) -> None:
        from multiprocessing.connection import Connection
        self.sock, self.fetchers = sock, fetchers
        self.conn = Connection(os.dup(sock.fileno()))
        self.ready = False  # the fetch process said it is ready on this channel

    def is_ready(self) -> bool:
        """Whether the fetch process has said it is ready (never blocks); a process that ended
        before is never ready."""
        if not self.ready:
            try:
                if self.conn.poll(0):
                    self.conn.recv_bytes()
                    self.ready = True
            except (EOFError, OSError):
                return False
        return self.ready

    def request(self, op: str, *args):
        try:
            if not self.ready:
                self.conn.recv_bytes()
                self.ready = True
            self.conn.send_bytes(pickle.dumps((op, args), protocol=5))
            kind, value = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            from bridge.datahub.calls import DataHubError
            raise DataHubError(f"the DataHub reader process {self.fetchers.pid} stopped answering "
                               f"({type(exc).__name__}: {exc})") from None
        if kind == "ok":
            return value
        raise value if kind == "error" else _rebuilt_error(value)

    def shut(self) -> None:
        """Wake a request under way (it fails) and close the socket."""
        for step in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close, self.conn.close):
            try:
                step()
            except OSError:
                pass


class _Fetchers:
    """A fetch process and its channels, one per reader thread (`free` not in use)."""

    def __init__(self, client_bytes: bytes, channels: int) -> None:
        pairs = [socket.socketpair() for _ in range(channels)]
        theirs = [b.fileno() for _, b in pairs]
        path = os.path.abspath(__file__)
        code = ("import importlib.util, sys\n"
                f"spec = importlib.util.spec_from_file_location('_dts_bridge_datahub_fetch', {path!r})\n"
                "module = importlib.util.module_from_spec(spec)\n"
                "sys.modules[spec.name] = module\n"
                "spec.loader.exec_module(module)\n"
                "module._fetch_process()\n")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, pass_fds=theirs,
                                         close_fds=True)
        finally:
            for _, b in pairs:
                b.close()
        self.pid = self.proc.pid
        payload = pickle.dumps((client_bytes, theirs), protocol=5)
        self.proc.stdin.write(len(payload).to_bytes(4, "big") + payload)
        self.proc.stdin.flush()
        self.channels = [_Channel(a, self) for a, _ in pairs]
        self.free = list(self.channels)
        self.stopped = False

    def stop(self, wait: float = 0.0) -> None:
        """Close the channels (a request under way fails) and the process's stdin (it ends);
        wait up to `wait` seconds for it, then kill it."""
        self.stopped = True
        for channel in self.channels:
            channel.shut()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if wait > 0:
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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
        self._fetched = 0  # records fetched so far
        self._polled_at = 0.0
        self._stopping = False
        self._fetchers: _Fetchers | None = None  # the fetch process of the readers (processes)
        self._client_bytes: bytes | bool | None = None  # the client pickled for it; False: threads only

    reader_idle = 10.0  # seconds without work after which a reader thread ends (the fetch process with the last)
    # full pages' worth of records (`page` each) the readers fetch themselves before the fetch
    # process is started: its start (pydatahub's imports, about 0.35 CPU s of its own) pays only
    # over a longer read (issue 32, third round: a 20,000-row run, 25 pages, lost by it; shards
    # asked again at their end do not count, so a short run's idle end does not start it). 32 until
    # the pages' records were made in C (pages.c); since then 8 (fifth round, docs/performance.md:
    # 100,000 rows 2.90-3.01 s against 3.03-3.09 s, 20,000 rows 0.72-0.77 s against 0.72-0.82 s)
    process_after = 8

    _PREFETCH_STATE = ("_cond", "_feeds", "_ready", "_later", "_tick", "_threads", "_held", "_arrivals",
                       "_polled_at", "_stopping", "_fetchers", "_client_bytes", "_fetched")

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
            client, channel = self._reader_client()
            thread = threading.Thread(target=self._reader, args=(client, channel), daemon=True,
                                      name=f"datahub-reader-{self.project}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def _use_processes(self) -> bool:
        """Whether the readers fetch through a fetch process: asked for (`processes`), a pydatahub
        protobuf client that pickles, Blob topics only (else reader threads fetch themselves)."""
        if not getattr(self, "processes", False) or self._shared_lock is not None:
            return False
        if self._client_bytes is None:
            self._client_bytes = False
            impl = getattr(self.client, "_datahub_impl", None)
            if type(impl).__name__ == "DataHubPB" and all(k == "BLOB" for k in self.kinds.values()):
                try:
                    self._client_bytes = pickle.dumps(self.client, protocol=5)
                except Exception:
                    pass
        return bool(self._client_bytes)

    def _start_fetchers(self) -> _Fetchers | None:
        """(Under _cond.) The running fetch process, started if there is none (None: it could not
        be started, and reader threads fetch themselves from now on)."""
        fetchers = self._fetchers
        if fetchers is not None and not fetchers.stopped and fetchers.proc.poll() is None:
            return fetchers
        if fetchers is not None:
            fetchers.stop()
        try:
            self._fetchers = _Fetchers(self._client_bytes, max(1, self.readers))
        except (OSError, ValueError):
            self._fetchers, self.processes = None, False
        return self._fetchers

    def _prestart(self) -> None:
        """Start the fetch process ahead of the first poll (its start overlaps the caller's) when it
        is wanted from the first page (`process_after` 0)."""
        if self.readers and self.process_after <= 0 and self._use_processes():
            with self._cond:
                if not self._stopping:
                    self._start_fetchers()

    def _release_client(self, client) -> None:
        """(Under _cond.) A reader thread ending idle gives back its channel; the fetch process
        ends with the last reader."""
        if type(client) is not _Channel:
            return
        fetchers = client.fetchers
        if fetchers is self._fetchers and not fetchers.stopped:
            fetchers.free.append(client)
            if not self._threads:
                fetchers.stop()
                self._fetchers = None
                threading.Thread(target=fetchers.proc.wait, daemon=True).start()  # (reaped when it ends)

    def _channel(self):
        """(Under _cond.) A channel to the fetch process (started if need be) for a reader thread,
        once `process_after` pages were fetched; else None."""
        if self._fetched < self.process_after * self.page or not self._use_processes():
            return None
        fetchers = self._start_fetchers()
        return fetchers.free.pop() if fetchers is not None and fetchers.free else None

    def _reader_client(self):
        """(Under _cond.) The client of a new reader thread, and the channel to the fetch process it
        switches to once that process is ready (None: it fetches itself)."""
        client = _client_copy(self.client)
        if client is not None:
            return client, self._channel()
        if self._shared_lock is None:  # not a pydatahub client: shared, one call at a time
            self._shared_lock = threading.Lock()
            self.client = _Locked(self.client, self._shared_lock)
        return self.client, None

    def _reader(self, client, channel=None) -> None:
        """A reader thread: fetch the next page of the feed due first, until close() or
        `reader_idle` seconds without work. With a `channel` to the fetch process it fetches itself
        until that process is ready (its start does not hold up the first pages), then through it."""
        idle = self.reader_idle
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
                    if now - idle_since >= idle:
                        self._threads = [t for t in self._threads if t is not threading.current_thread()]
                        self._release_client(client if channel is None else channel)
                        return
                    cond.wait(min(self._later[0][0] - now, idle) if self._later else idle)
                feed.fetching = True
                topic, shard_id, next_, cursor = feed.st.topic, feed.st.shard_id, feed.next, feed.cursor
                if channel is None and type(client) is not _Channel \
                        and self._fetched >= self.process_after * self.page and self._use_processes():
                    channel = self._channel()
            if channel is not None and channel.is_ready():
                client, channel = channel, None
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
                self._fetched += len(page.records)
                self._schedule(feed)
                cond.notify_all()
