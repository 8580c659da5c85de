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

import os
import random
import time
from collections.abc import Callable
from typing import Any

from bridge.errors import BridgeError

__all__ = ["DataHubError", "Retrying", "make_client", "pydatahub", "shard_state", "sort_shard_id",
           "ACCESS_ID_ENV", "ACCESS_KEY_ENV"]

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
    return dh.DataHub(access_id, access_key, endpoint, compress_format=fmt, enable_pb=True)


def sort_shard_id(shard_id: str):
    """Shard ids in numeric order (DataHub's are decimal digits), others after them."""
    return (0, int(shard_id), "") if shard_id.isdigit() else (1, 0, shard_id)


def shard_state(shard) -> str:
    """A ListShard entry's state, upper case (ACTIVE, CLOSED, OPENING, CLOSING)."""
    state = getattr(shard, "state", None)
    return str(getattr(state, "value", state or "ACTIVE")).upper()


class Retrying:
    """The retry policy of a DataHub client's user. Subclasses set `max_retries`, `backoff`,
    `max_backoff`, `sleep`, `rng` (a random.Random, for the jitter), `observer` (or None) and
    `_closing`; `requests` and `retries` count."""

    requests = 0
    retries = 0
    max_retries = 12
    backoff = 0.1
    max_backoff = 10.0
    observer: Callable[..., None] | None = None
    _closing = False

    def init_retrying(self, *, max_retries: int = 12, backoff: float = 0.1, max_backoff: float = 10.0,
                      sleep: Callable[[float], None] = time.sleep, seed: int | None = None,
                      observer: Callable[..., None] | None = None) -> None:
        self.max_retries, self.backoff, self.max_backoff, self.sleep = max_retries, backoff, max_backoff, sleep
        self.rng = random.Random(seed)
        self.observer = observer
        self.requests = self.retries = 0
        self._closing = False

    def call(self, request: Callable[[], Any], name: str, raw: bool = False):
        """`request()` (a pydatahub call named `name` in messages) under the retry policy:
        throttling, timeouts and server errors retried with backoff; any other DataHub error is a
        DataHubError, or raised as pydatahub raised it with `raw`."""
        import requests
        from datahub import exceptions as dx
        transient = (dx.LimitExceededException, dx.InternalServerException, dx.TimeoutException,
                     requests.ConnectionError, requests.Timeout, ConnectionError)
        attempt = 0
        while True:
            try:
                self.requests += 1
                return request()
            except transient as exc:
                attempt = self._wait(attempt, f"{name}: {exc}", type(exc).__name__)
            except dx.DatahubException as exc:
                if (getattr(exc, "status_code", 0) or 0) >= 500:
                    attempt = self._wait(attempt, f"{name}: {exc}", getattr(exc, "error_code", None))
                    continue
                if raw:
                    raise
                code = getattr(exc, "error_code", None) or type(exc).__name__
                raise DataHubError(f"{name} failed: {code}: {exc}") from None

    def _wait(self, attempt: int, reason: str, code=None) -> int:
        if self._closing:
            raise DataHubError(f"writer stopped: {reason}")
        if attempt >= self.max_retries:
            raise DataHubError(f"giving up after {attempt} retries: {reason}")
        self.retries += 1
        self._observe("retry", reason=reason, code=code)
        ceiling = min(self.max_backoff, self.backoff * (2 ** attempt))
        self.sleep(ceiling * self.rng.uniform(0.5, 1.0))  # jitter: writers that failed together spread out
        return attempt + 1

    def _observe(self, event: str, **facts) -> None:
        if self.observer is not None:
            self.observer(event, **facts)


