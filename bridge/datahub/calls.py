"""DataHub calls shared by the writer (bridge/datahub/sink.py) and the reader (bridge/datahub/source.py):
the client, the errors, the shard facts and the retry policy.

`Retrying.call(request, name)` runs one pydatahub call: throttling (LimitExceeded), timeouts, dropped
connections and 5xx answers are retried with exponential backoff and jitter (`backoff` doubling up to
`max_backoff`, at most `max_retries` times); any other DataHub error is a `DataHubError` (or, with
`raw=True`, raised as pydatahub raised it, for the caller to tell apart).

>>> sorted(["10", "2", "x"], key=sort_shard_id)
['2', '10', 'x']
"""
from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from bridge.errors import BridgeError
from bridge.values import digits

__all__ = ["DataHubError", "Retrying", "BY_COUNT", "DEGRADED_AFTER", "make_client", "pydatahub", "shard_state", "sort_shard_id",
           "ACCESS_ID_ENV", "ACCESS_KEY_ENV"]

# `retry_timeout` left at this: retries bounded by `max_retries` (the writer's default, Spark's tasks)
BY_COUNT = "max_retries"
# A request failing this long makes the writer "degraded" (an observer event, the CLI's status line).
DEGRADED_AFTER = 5.0
_FAILING_LOCK = threading.Lock()

ACCESS_ID_ENV = "DATAHUB_ACCESS_ID"
ACCESS_KEY_ENV = "DATAHUB_ACCESS_KEY"


class DataHubError(BridgeError):
    """DataHub refused records or could not be reached within the retries."""


def pydatahub():
    try:
        import datahub
    except ImportError:
        raise DataHubError("the DataHub writer needs pydatahub: pip install 'dts-datahub-bridge[datahub]'") from None
    return datahub


def make_client(endpoint: str, access_id: str | None = None, access_key: str | None = None, compress: str = "lz4"):
    """A pydatahub client in its protobuf protocol (the one PutRecordsByShard needs); credentials
    from the arguments, else DATAHUB_ACCESS_ID / DATAHUB_ACCESS_KEY."""
    dh = pydatahub()
    access_id = access_id or os.environ.get(ACCESS_ID_ENV)
    access_key = access_key or os.environ.get(ACCESS_KEY_ENV)
    if not access_id or not access_key:
        raise DataHubError(f"DataHub credentials missing: set {ACCESS_ID_ENV} and {ACCESS_KEY_ENV}")
    from datahub.models.compress import CompressFormat
    fmt = CompressFormat.NONE if compress == "none" else CompressFormat(compress)
    # stream=True: pydatahub formats every answer's whole body into a debug message unless its
    # RestClient streams (the body is still read whole, by its decompression): about 3 ms of CPU a
    # 200 KB page, 5 % of `sync --to dts`'s CPU (docs/performance.md (i), second round)
    return dh.DataHub(access_id, access_key, endpoint, compress_format=fmt, enable_pb=True, stream=True)


def sort_shard_id(shard_id: str):
    """Shard ids in numeric order (DataHub's are decimal digits), others after them."""
    return (0, int(shard_id), "") if digits(shard_id) else (1, 0, shard_id)


def shard_state(shard) -> str:
    """A ListShard entry's state, upper case (ACTIVE, CLOSED, OPENING, CLOSING)."""
    state = getattr(shard, "state", None)
    return str(getattr(state, "value", state or "ACTIVE")).upper()


class Retrying:
    """The retry policy of a DataHub client's user. Subclasses set `max_retries`, `backoff`,
    `max_backoff`, `sleep`, `rng` (a random.Random, for the jitter), `observer` (or None) and
    `_closing`; `requests` and `retries` count.

    How long a failing request is retried: `retry_timeout` seconds since its first failure (None or
    negative: for ever, as Kafka Connect's errors.retry.timeout=-1), else, left `BY_COUNT`, at most
    `max_retries` times. A request failing for DEGRADED_AFTER seconds makes the user "degraded": the
    observer hears ("degraded", request, reason, since) once, and ("recovered", request, seconds)
    when requests succeed again; `degraded` says it meanwhile. A request made on behalf of another
    (a look at a shard's tail while a PutRecordsByShard's answer was lost) names that other one in
    its errors and shares its deadline (`on_behalf_of`)."""

    requests = 0
    retries = 0
    max_retries = 12
    backoff = 0.1
    max_backoff = 10.0
    retry_timeout: float | None | str = BY_COUNT
    observer: Callable[..., None] | None = None
    _closing = False
    _local = threading.local()  # per thread: the request a call is made on behalf of, and since when
    _failing: dict | None = None
    _degraded: dict | None = None

    def init_retrying(self, *, max_retries: int = 12, backoff: float = 0.1, max_backoff: float = 10.0,
                      sleep: Callable[[float], None] = time.sleep, seed: int | None = None,
                      observer: Callable[..., None] | None = None,
                      retry_timeout: float | None | str = BY_COUNT) -> None:
        self.max_retries, self.backoff, self.max_backoff, self.sleep = max_retries, backoff, max_backoff, sleep
        self.retry_timeout = retry_timeout
        self.rng = random.Random(seed)
        self.observer = observer
        self.requests = self.retries = 0
        self._closing = False

    @property
    def degraded(self) -> dict | None:
        """While requests keep failing (DEGRADED_AFTER seconds or more): {"request", "reason",
        "seconds"} of the oldest failing one; else None."""
        failing = self._failing or {}
        if self._degraded is None or not failing:
            return None
        name, reason, since = min(list(failing.values()), key=lambda f: f[2])
        return {"request": name, "reason": reason, "seconds": time.monotonic() - since}

    @contextlib.contextmanager
    def on_behalf_of(self, name: str, since: float | None):
        """Calls made inside are part of request `name` (failing since `since`, monotonic): their
        errors name it and its retry deadline holds for them."""
        saved = getattr(self._local, "outer", None)
        self._local.outer = (name, since)
        try:
            yield
        finally:
            self._local.outer = saved

    def call(self, request: Callable[[], Any], name: str, raw: bool = False):
        """`request()` (a pydatahub call named `name` in messages) under the retry policy:
        throttling, timeouts and server errors retried with backoff; any other DataHub error is a
        DataHubError, or raised as pydatahub raised it with `raw`."""
        import requests
        from datahub import exceptions as dx
        transient = (dx.LimitExceededException, dx.InternalServerException, dx.TimeoutException,
                     requests.ConnectionError, requests.Timeout, ConnectionError)
        attempt, since = 0, None
        while True:
            try:
                self.requests += 1
                result = request()
                if since is not None:
                    self._succeeded()
                return result
            except transient as exc:
                since = since or time.monotonic()
                attempt = self._wait(attempt, f"{name}: {exc}", type(exc).__name__, since=since)
            except dx.DatahubException as exc:
                if (getattr(exc, "status_code", 0) or 0) >= 500:
                    since = since or time.monotonic()
                    attempt = self._wait(attempt, f"{name}: {exc}", getattr(exc, "error_code", None), since=since)
                    continue
                if raw:
                    raise
                code = getattr(exc, "error_code", None) or type(exc).__name__
                outer = getattr(self._local, "outer", None)
                within = f"{outer[0]} ({name} to see whether it landed) failed" if outer else f"{name} failed"
                raise DataHubError(f"{within}: {code}: {exc}") from None

    def _wait(self, attempt: int, reason: str, code=None, since: float | None = None) -> int:
        """After a failed attempt: give up (DataHubError naming the request), or back off and return
        the next attempt's number. `since`: when the request first failed (monotonic)."""
        outer = getattr(self._local, "outer", None)
        if outer is not None:  # a call made for another request: named after it, within its deadline
            reason = f"{outer[0]} (while checking whether it landed: {reason})"
            since = outer[1] if outer[1] is not None else since
        now = time.monotonic()
        since = since if since is not None else now
        if self._closing:
            raise DataHubError(f"writer stopped: {reason}")
        timeout = self.retry_timeout
        if timeout == BY_COUNT:
            if attempt >= self.max_retries:
                raise DataHubError(f"giving up after {attempt} retries: {reason}")
        elif timeout is not None and timeout >= 0 and now - since >= timeout:
            raise DataHubError(f"giving up after {attempt} retries in {now - since:.0f} s (retry timeout "
                               f"{timeout:g} s): {reason}")
        self.retries += 1
        self._observe("retry", reason=reason, code=code)
        self._failed(reason, since, now)
        ceiling = min(self.max_backoff, self.backoff * (2 ** attempt))
        self._pause(ceiling * self.rng.uniform(0.5, 1.0))  # jitter: writers that failed together spread out
        return attempt + 1

    def _pause(self, seconds: float) -> None:
        """Back off; with the default sleep, in short steps that notice a stop (`_closing`, and the
        `_before_wait` hook a user may define, e.g. the restart look's stop)."""
        hook = getattr(self, "_before_wait", None)
        if hook is not None:
            hook()
        if self.sleep is not time.sleep:
            self.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.2))
            if hook is not None:
                hook()

    def _failed(self, reason: str, since: float, now: float) -> None:
        name = reason.split(":", 1)[0].split(" (", 1)[0]
        with _FAILING_LOCK:
            if self._failing is None:
                self._failing = {}
            self._failing[threading.get_ident()] = (name, reason, since)
            start = self._degraded is None and now - since >= DEGRADED_AFTER
            if start:
                self._degraded = {"request": name, "since": time.time() - (now - since)}
        if start:
            self._observe("degraded", request=name, reason=reason, seconds=now - since)

    def _succeeded(self) -> None:
        """The calling thread's request went through after failing."""
        with _FAILING_LOCK:
            if not self._failing:
                return
            self._failing.pop(threading.get_ident(), None)
            ended = self._degraded if not self._failing else None
            if ended is not None:
                self._degraded = None
        if ended is not None:
            self._observe("recovered", request=ended["request"], seconds=time.time() - ended["since"])

    def _observe(self, event: str, **facts) -> None:
        if self.observer is not None:
            self.observer(event, **facts)
