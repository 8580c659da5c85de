"""DataHub subscription offsets mirrored from the reverse pipeline's commits, for DataHub's own lag
view (`dts-bridge sync --to dts --subscription ID`, docs/kafka.md, step 9 "DataHub's lag view").

The Kafka offsets topic (or the offsets file) stays the one source of truth: nothing here is ever
read back as a position. After each commit of the pipeline, the committed position of every shard
of a topic with a subscription is copied to it, DataHub's way: a subscription's offset names the
LAST CONSUMED record (`Sequence` = committed position - 1, `Timestamp` = that record's system time,
ms; pydatahub's own consumer resumes at `Sequence + 1`), committed under an offset session
(`init_and_get_subscription_offset`: a `SessionId` and `Version` per shard).

Copying happens on a thread of its own, so DataHub being slow, throttling or refusing never slows
or stops the pipeline; `committed()` only records the newest positions (a later one replaces one not
yet sent). Each attempt retries throttling, 5xx answers and dropped connections a few times
(`Retrying`, bounded); what still fails is counted (`failures`, by error code in `reasons`), told to
`log` once per change of state, and tried again with the next commit:

- `OffsetSessionChanged` / `OffsetSessionClosed` (another consumer opened a session on the shard:
  each open invalidates the one before) and `OffsetReseted` (someone reset the offset, which bumps
  its Version): the session is opened again at the next commit, which takes the shard back.
- `NoSuchSubscription` (deleted), `SubscriptionOffline` (set INACTIVE), throttling beyond the
  retries: counted, tried again at the next commit.
- `NoSuchShard` (a CLOSED shard expired past the lifecycle): the shards gone are found one by one
  and left out from then on, so the others' commits go through.

Shards that appear after a split or merge get a session when their first position is committed.
A position whose record's system time was not seen while reading (the shard started at its end, or
skipped records past the lifecycle) has it looked up with GetCursor (SEQUENCE), which answers the
record's time.

    subs = SubscriptionOffsets(client, "proj", find_subscriptions(client, "proj", ["orders"], ["1565...XSY8"]))
    subs.start()
    subs.seen(("orders", "0"), 41, 1700000000000)   # a record read (key, sequence, system time)
    subs.committed({("orders", "0"): 42})           # after the Kafka commit: next position 42
    subs.close(wait=5.0)                            # sends what is pending, within `wait` seconds
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from bridge.datahub.calls import DataHubError, Retrying, pydatahub

__all__ = ["SubscriptionOffsets", "UnknownSubscription", "find_subscriptions"]

# error codes meaning "this subscription id is not one of this topic's"
_NOT_HERE = frozenset({"NoSuchSubscription", "InvalidSubscription"})
# the offset session is no longer ours: open it again at the next commit
_SESSION_LOST = frozenset({"OffsetSessionChanged", "OffsetSessionClosed", "OffsetReseted"})


# pydatahub's exception classes for the errors Retrying retries, as DataHub's error codes
_TRANSIENT_CODES = {"LimitExceededException": "LimitExceeded", "InternalServerException": "InternalServerError",
                    "TimeoutException": "Timeout"}


class UnknownSubscription(DataHubError):
    """A subscription id that is no subscription of any topic read."""


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "error_code", None) or type(exc).__name__)


def find_subscriptions(client, project: str, topics: Iterable[str], ids: Iterable[str], *,
                       max_retries: int = 3) -> dict[str, str]:
    """{topic: subscription id} for each of `ids`, found among `topics` of `project` (a DataHub
    subscription belongs to one topic). An id of none of them: `UnknownSubscription` naming it;
    two ids of one topic: `UnknownSubscription` too (one subscription per topic is mirrored).
    (pydatahub 2.29's `get_subscription` cannot parse its own answer: offsets are asked instead.)"""
    pydatahub()
    from datahub import exceptions as dx
    caller = Retrying()
    caller.init_retrying(max_retries=max_retries, backoff=0.2, max_backoff=2.0)
    topics = list(topics)
    found: dict[str, str] = {}
    for sub_id in ids:
        home = None
        for topic in topics:
            try:
                caller.call(lambda t=topic: client.get_subscription_offset(project, t, sub_id),
                            "GetSubscriptionOffset", raw=True)
            except dx.DatahubException as exc:
                if _code(exc) in _NOT_HERE:
                    continue
                raise DataHubError(f"GetSubscriptionOffset {project}/{topic} {sub_id} failed: {_code(exc)}: "
                                   f"{exc}") from None
            home = topic
            break
        if home is None:
            where = topics[0] if len(topics) == 1 else f"any of {len(topics)} topics ({', '.join(topics[:5])}" + \
                (", ...)" if len(topics) > 5 else ")")
            raise UnknownSubscription(f"--subscription {sub_id}: no such DataHub subscription of {project}/{where}")
        if home in found:
            raise UnknownSubscription(f"--subscription {sub_id}: topic {home} has subscription {found[home]} "
                                      f"already (one per topic)")
        found[home] = sub_id
    return found


class SubscriptionOffsets(Retrying):
    """Committed positions copied to DataHub subscriptions on a thread of its own (the module's
    doc). `subscriptions`: {topic: subscription id}; keys are (topic, shard id) pairs and positions
    the next sequence to read, as the DataHub source's. `log(text)` hears failures and recoveries.
    Counts: `commits` (requests that went through), `failures` (attempts that did not, by code in
    `reasons`), `sessions` (sessions opened), `last_error`."""

    def __init__(self, client, project: str, subscriptions: Mapping[str, str], *, max_retries: int = 3,
                 backoff: float = 0.2, max_backoff: float = 2.0, log: Callable[[str], None] | None = None) -> None:
        pydatahub()
        self.init_retrying(max_retries=max_retries, backoff=backoff, max_backoff=max_backoff, observer=self._retrying)
        self._retry_code: str | None = None  # the code of the last retried error (LimitExceeded, ...)
        self.client, self.project = client, project
        self.subscriptions = dict(subscriptions)
        self.log = log
        self.commits = self.failures = self.sessions = 0
        self.reasons: collections.Counter = collections.Counter()
        self.last_error: str | None = None
        self.sent: dict[tuple, int] = {}       # key -> sequence the subscription holds (as we committed it)
        self._times: dict[tuple, collections.deque] = {}  # key -> (sequence, system time) seen, not yet committed
        self._known: dict[tuple, tuple[int, int]] = {}    # key -> the last (sequence, time) taken off _times
        self._target: dict[tuple, tuple[int, int | None]] = {}  # key -> (sequence, time or None) to send
        self._session: dict[str, dict[str, object]] = {}  # topic -> shard -> pydatahub offset with session
        self._state: dict[str, str | None] = {}  # topic -> the failing code last told (None: fine)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._busy = False
        self._force = False   # close(): one more attempt even if the last one failed
        self._attempts = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- the pipeline's side (its own thread) ------------------------------------------------------
    def seen(self, key: tuple, sequence: int, system_time: int) -> None:
        """A record read: its system time is the Timestamp when its position is committed."""
        if key[0] in self.subscriptions:
            self._times.setdefault(key, collections.deque()).append((sequence, system_time))

    def committed(self, positions: Mapping[tuple, int | None]) -> None:
        """The pipeline committed these next positions: copy them (never blocks)."""
        targets = {}
        for key, pos in positions.items():
            key = tuple(key)
            if key[0] not in self.subscriptions or pos is None or pos <= 0:
                continue
            last = pos - 1
            seen = self._times.get(key)
            while seen and seen[0][0] <= last:
                self._known[key] = seen.popleft()
            known = self._known.get(key)
            targets[key] = (last, known[1] if known is not None and known[0] == last else None)
        if not targets:
            return
        with self._lock:
            self._target.update(targets)
            self._wake.notify_all()

    def start(self) -> SubscriptionOffsets:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="datahub-subscription", daemon=True)
            self._thread.start()
        return self

    def close(self, wait: float = 5.0) -> None:
        """Send what is pending (one more attempt, even after a failure), within `wait` seconds;
        then stop the thread."""
        deadline = time.monotonic() + wait
        with self._lock:
            attempts = self._attempts
            self._force = True
            self._wake.notify_all()
            while self._thread is not None and self._thread.is_alive() and \
                    (self._busy or (self._pending() and self._attempts == attempts)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.wait(min(left, 0.1))
            self._stopped = True
            self._closing = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)

    def report(self) -> dict:
        """For the --json document: the ids, counts and the last error."""
        return {"subscriptions": dict(self.subscriptions), "commits": self.commits, "failures": self.failures,
                "failure_reasons": dict(self.reasons), "sessions_opened": self.sessions,
                "last_error": self.last_error,
                "offsets": {f"{k[0]}/{k[1]}": seq for k, seq in sorted(dict(self.sent).items())}}

    # -- the thread ---------------------------------------------------------------------------------
    def _pending(self) -> dict:
        return {k: v for k, v in self._target.items() if self.sent.get(k) != v[0]}

    def _run(self) -> None:
        tried: dict = {}  # what the last attempt tried and failed: wait for a newer commit to try again
        while True:
            with self._lock:
                while not self._stopped and (not self._pending() or (self._pending() == tried and not self._force)):
                    self._wake.wait(1.0)
                if self._stopped:
                    return
                work = self._pending()
                self._force = False
                self._busy = True
            try:
                ok = self._send(work)
            except Exception as exc:  # noqa: BLE001 - a mirror for a lag view never stops the pipeline
                ok = False
                self._refused("*", type(exc).__name__, f"{type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    self._busy = False
                    self._attempts += 1
                    self._wake.notify_all()
            tried = {} if ok else work

    def _send(self, work: dict) -> bool:
        from datahub.models import OffsetWithSession
        by_topic: dict[str, dict] = {}
        for key, target in work.items():
            by_topic.setdefault(key[0], {})[key[1]] = target
        ok = True
        for topic, shards in sorted(by_topic.items()):
            sub_id = self.subscriptions[topic]
            try:
                self._open(topic, sub_id, [s for s in shards if s not in self._session.get(topic, {})])
                offsets = {}
                for shard, (seq, when) in shards.items():
                    if when is None:
                        when = self._time_of(topic, shard, seq)
                    held = self._session[topic][shard]
                    offsets[shard] = OffsetWithSession(seq, when, held.version, held.session_id)
                self.call(lambda: self.client.update_subscription_offset(self.project, topic, sub_id, offsets),
                          "CommitSubscriptionOffset", raw=True)
            except DataHubError as exc:  # transient errors past the retries (or a stop while retrying)
                ok = False
                self._refused(topic, str(self._retry_code or "Unreachable"), str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - pydatahub's refusals, and anything else
                ok = False
                code = _code(exc)
                if code in _SESSION_LOST:
                    self._session.pop(topic, None)  # opened again at the next commit
                gone = self._gone(topic, sub_id, list(shards)) if code == "NoSuchShard" else []
                self._refused(topic, code, f"{code}: {exc}" + (f" (shard {', '.join(gone)} no longer exists: "
                                                               f"left out from now on)" if gone else ""))
                continue
            for shard, (seq, _) in shards.items():
                self.sent[(topic, shard)] = seq
            if self._state.get(topic):
                self._say(f"DataHub subscription {sub_id} of {topic}: offsets committed again")
            self._state[topic] = None
            self.commits += 1
        return ok

    def _gone(self, topic: str, sub_id: str, shards: list[str]) -> list[str]:
        """After NoSuchShard: the shards of `shards` DataHub no longer has (a CLOSED shard past the
        topic's lifecycle), asked one by one; their positions are not mirrored any more, so the
        other shards' commits go through again."""
        gone = []
        for shard in shards:
            try:
                self._open(topic, sub_id, [shard])
            except Exception as exc:  # noqa: BLE001 - only NoSuchShard counts here
                if _code(exc) == "NoSuchShard":
                    gone.append(shard)
        with self._lock:
            for shard in gone:
                self._target.pop((topic, shard), None)
                self._session.get(topic, {}).pop(shard, None)
        return gone

    def _open(self, topic: str, sub_id: str, shards: list[str]) -> None:
        if not shards:
            return
        got = self.call(lambda: self.client.init_and_get_subscription_offset(self.project, topic, sub_id, shards),
                        "OpenSubscriptionSession", raw=True)
        self.sessions += 1
        held = self._session.setdefault(topic, {})
        for shard in shards:
            offset = got.offsets.get(shard)
            if offset is None:
                raise DataHubError(f"OpenSubscriptionSession {topic} {sub_id}: no offset of shard {shard} answered")
            held[shard] = offset

    def _retrying(self, event: str, **facts) -> None:
        if event == "retry":  # Retrying names transient errors by their pydatahub class: DataHub's codes here
            code = str(facts.get("code") or "Unreachable")
            self._retry_code = _TRANSIENT_CODES.get(code, code)

    def _time_of(self, topic: str, shard: str, sequence: int) -> int:
        """The system time of record `sequence` (GetCursor SEQUENCE answers it); -1 if it is gone."""
        from datahub import exceptions as dx
        from datahub.models import CursorType
        try:
            got = self.call(lambda: self.client.get_cursor(self.project, topic, shard, CursorType.SEQUENCE, sequence),
                            "GetCursor", raw=True)
        except (dx.SeekOutOfRangeException, dx.InvalidCursorException, dx.InvalidParameterException):
            return -1
        when = getattr(got, "record_time", None)
        return int(when) if isinstance(when, int) and got.sequence == sequence else -1

    def _refused(self, topic: str, code: str, text: str) -> None:
        """Count a failed attempt (told once per change of state); `failures` moves last, so a
        reader that sees it move sees the rest."""
        self.reasons[code] += 1
        self.last_error = text
        if self._state.get(topic) != code:
            self._state[topic] = code
            sub = self.subscriptions.get(topic, "?")
            then = ("its session is opened again at the next commit" if code in _SESSION_LOST
                    else "tried again at the next commit")
            self._say(f"DataHub subscription {sub} of {topic}: offset commit failed ({text}); {then} "
                      f"(the Kafka positions are not affected)")
        self.failures += 1

    def _say(self, text: str) -> None:
        if self.log is not None:
            try:
                self.log(text)
            except Exception:  # noqa: BLE001 - telling must not break the mirror
                pass
