"""A loopback stand-in for Alibaba Cloud DataHub, for tests (docs/testing.md, "Stand-in DataHub").

DataHub has no emulator. This module serves DataHub's REST protocol on 127.0.0.1 so that the REAL
pydatahub client (2.29) can be driven over HTTP: projects, topics (BLOB and TUPLE with a schema),
shards with hash ranges, split and merge, PutRecords (JSON and protobuf), PutRecordsByShard
(protobuf: pydatahub's JSON client refuses it locally), GetCursor and GetRecords (JSON and protobuf),
subscriptions and their offsets (below), request and response compression (lz4, zlib), and fault
injection (`server.faults`).

Subscriptions (pydatahub's create/get/list/update/delete_subscription, init_and_get_subscription_offset,
get/update/reset_subscription_offset), as DataHub documents them: a subscription belongs to one topic
and keeps, per shard, an offset {Sequence, Timestamp, Version, SessionId}: Sequence is the LAST
CONSUMED record's (a consumer resumes at Sequence + 1; -1 and -1: nothing committed yet). Opening a
session (`Action=open`, per shard) hands out a new SessionId (0 the first time, then +1) and
invalidates the one held before, so a commit (`PUT .../offsets`, `Action=commit`) with a stale
SessionId is refused with `OffsetSessionChanged`, one on a shard never opened with
`OffsetSessionClosed`, one with an old Version (the offset was reset since: `Action=reset` bumps it)
with `OffsetReseted`, on an INACTIVE subscription with `SubscriptionOffline`, on an unknown one with
`NoSuchSubscription`; a commit is all or nothing. `Action=get` reads offsets without a SessionId.

    with StandInDataHub() as server:
        server.create_topic("p", "t", shard_count=3)
        client = DataHub("id", "key", server.endpoint)          # JSON protocol (pydatahub's default)
        client.put_records("p", "t", [BlobRecord(blob_data=b"x")])  # with shard_id / partition_key
        server.records("p", "t")                                 # what landed, per shard in order

Run alone: `python -m tests.support.datahub_standin --port 8080 [--state-file s.json]`.
"""
from __future__ import annotations

import argparse
import base64
import binascii
import decimal
import hashlib
import hmac
import itertools
import json
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

# ---------------------------------------------------------------------------------------------
# protocol constants
# ---------------------------------------------------------------------------------------------

WRITE_OPS = ("PutRecords", "PutRecordsByShard")
ALL_OPS = ("ListProject", "CreateProject", "GetProject", "UpdateProject", "DeleteProject",
           "ListTopic", "CreateTopic", "GetTopic", "UpdateTopic", "DeleteTopic", "AppendField",
           "ListShard", "SplitShard", "MergeShard", "ExtendShard", "GetCursor", "PutRecords",
           "PutRecordsByShard", "GetRecords")
SUBSCRIPTION_OPS = ("CreateSubscription", "ListSubscription", "GetSubscription", "UpdateSubscription",
                    "UpdateSubscriptionState", "DeleteSubscription", "OpenSubscriptionSession",
                    "GetSubscriptionOffset", "CommitSubscriptionOffset", "ResetSubscriptionOffset")
ALL_OPS = ALL_OPS + SUBSCRIPTION_OPS

HASH_SPACE = 1 << 128
NO_SHARD = "4294967295"  # DataHub's "no neighbour" shard id (0xFFFFFFFF)
FIELD_TYPES = ("tinyint", "smallint", "integer", "bigint", "string", "boolean", "timestamp", "float",
               "double", "decimal")
_INT_BOUNDS = {"tinyint": (-128, 127), "smallint": (-32768, 32767),
               "integer": (-2147483648, 2147483647),
               "bigint": (-9223372036854775808, 9223372036854775807),
               "timestamp": (-62135798400000000, 253402271999000000)}
_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_STATUS = {"InvalidParameter": 400, "InvalidSchema": 400, "InvalidCursor": 400, "MalformedRecord": 400,
           "InvalidShardOperation": 400, "SeekOutOfRange": 400, "InvalidOperation": 400,
           "OperationDenied": 403, "ProjectAlreadyExist": 400, "TopicAlreadyExist": 400,
           "NoSuchProject": 404, "NoSuchTopic": 404, "NoSuchShard": 404, "InvalidUriSpec": 400,
           "Unauthorized": 401, "NoPermission": 403, "LimitExceeded": 429, "InternalServerError": 500,
           "ServiceUnavailable": 503, "NoSuchSubscription": 404, "InvalidSubscription": 400,
           "SubscriptionOffline": 400, "OffsetReseted": 400, "OffsetSessionChanged": 400,
           "OffsetSessionClosed": 400}


class DataHubError(Exception):
    """An error answer: HTTP status, DataHub ErrorCode and ErrorMessage."""

    def __init__(self, code: str, message: str, status: int | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status if status is not None else _STATUS.get(code, 400)


class _Reset(Exception):
    """Close the connection without an answer."""


# ---------------------------------------------------------------------------------------------
# state
# ---------------------------------------------------------------------------------------------

def _now_ms() -> int:
    return int(time.time() * 1000)


def _hash_hex(value: int) -> str:
    return "%032X" % min(value, HASH_SPACE - 1)


@dataclass
class _Record:
    sequence: int
    system_time: int
    attributes: dict[str, str]
    data: bytes | None = None          # BLOB
    values: list[str | None] | None = None  # TUPLE, as wire strings (None = null)
    # its GetRecords protobuf entry, encoded once (a record never changes once written): (width, bytes),
    # width the number of TUPLE fields it was padded to (AppendField widens later answers), 0 for BLOB
    pb_entry: tuple[int, bytes] | None = field(default=None, repr=False, compare=False)


@dataclass
class _Shard:
    shard_id: str
    begin: int
    end: int  # exclusive; HASH_SPACE for the last shard
    state: str = "ACTIVE"
    closed_time: int = 0
    parents: list[str] = field(default_factory=list)
    records: list[_Record] = field(default_factory=list)
    left: str = NO_SHARD
    right: str = NO_SHARD


@dataclass
class _Offset:
    """A subscription's offset in one shard: the last consumed record's sequence and system time."""
    sequence: int = -1
    timestamp: int = -1
    batch_index: int = 0
    version: int = 0          # bumped by every reset
    session: int | None = None  # the SessionId a commit must carry (None: no session opened)
    sessions: int = 0         # sessions opened so far (the next SessionId)


@dataclass
class _Subscription:
    sub_id: str
    topic: str
    comment: str
    create_time: int
    modify_time: int
    state: int = 1  # 1 ACTIVE, 0 INACTIVE (pydatahub's SubscriptionState)
    offsets: dict[str, _Offset] = field(default_factory=dict)

    def info(self) -> dict:
        return {"SubId": self.sub_id, "TopicName": self.topic, "Comment": self.comment, "CreateTime": self.create_time,
                "LastModifyTime": self.modify_time, "State": self.state, "IsOwner": True, "Owner": True, "Type": 0}


@dataclass
class _Topic:
    name: str
    record_type: str  # BLOB | TUPLE
    fields: list[dict]  # [{"name", "type", "notnull", "comment"}], TUPLE only
    lifecycle: int
    comment: str
    create_time: int
    modify_time: int
    shards: dict[str, _Shard] = field(default_factory=dict)
    next_shard: int = 0
    expand_mode: str = "split"
    subscriptions: dict[str, _Subscription] = field(default_factory=dict)

    def active(self) -> list[_Shard]:
        return sorted((s for s in self.shards.values() if s.state == "ACTIVE"), key=lambda s: s.begin)


@dataclass
class _Project:
    name: str
    comment: str
    create_time: int
    modify_time: int
    topics: dict[str, _Topic] = field(default_factory=dict)


def _schema_fields(schema: Any) -> list[dict]:
    """Accept a pydatahub RecordSchema, its JSON (str or dict) or a list of (name, type[, nullable])."""
    if schema is None:
        raise DataHubError("InvalidParameter", "a TUPLE topic needs a RecordSchema")
    if hasattr(schema, "to_json") and not isinstance(schema, (str, dict, list)):
        schema = schema.to_json()
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise DataHubError("InvalidSchema", "RecordSchema is not JSON") from None
    if isinstance(schema, list):
        schema = {"fields": [
            {"name": f[0], "type": getattr(f[1], "value", f[1]), "notnull": len(f) > 2 and not f[2]}
            for f in schema]}
    if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list) or not schema["fields"]:
        raise DataHubError("InvalidSchema", "RecordSchema needs a non-empty 'fields' list")
    fields, names = [], set()
    for f in schema["fields"]:
        name, ftype = f.get("name"), str(f.get("type", "")).lower()
        if not name or ftype not in FIELD_TYPES:
            raise DataHubError("InvalidSchema", f"invalid field {f!r}")
        if name.lower() in names:
            raise DataHubError("InvalidSchema", f"duplicate field name {name!r}")
        names.add(name.lower())
        fields.append({"name": name, "type": ftype, "notnull": bool(f.get("notnull", False)),
                       "comment": f.get("comment", "")})
    return fields


def _check_value(value: Any, fdef: dict) -> str | None:
    """Validate one tuple value (wire form) against its field; return the stored string."""
    if value is None:
        if fdef["notnull"]:
            raise DataHubError("MalformedRecord", f"field {fdef['name']} can not be null")
        return None
    ftype = fdef["type"]
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif not isinstance(value, str):
        value = str(value)
    if ftype == "string":
        return value
    bad = DataHubError("MalformedRecord", f"value {value!r} is not a valid {ftype.upper()} "
                                          f"for field {fdef['name']}")
    if value == "" and not fdef["notnull"]:
        return None
    if ftype in _INT_BOUNDS:
        if not _INT_RE.match(value.strip()):
            raise bad
        low, high = _INT_BOUNDS[ftype]
        if not low <= int(value) <= high:
            raise bad
        return str(int(value))
    if ftype in ("double", "float"):
        try:
            float(value)
        except ValueError:
            raise bad from None
        return value
    if ftype == "decimal":
        try:
            decimal.Decimal(value)
        except decimal.InvalidOperation:
            raise bad from None
        return value
    if ftype == "boolean":
        low = value.strip().lower()
        if low in ("true", "1"):
            return "true"
        if low in ("false", "0"):
            return "false"
        raise bad
    raise bad  # pragma: no cover


def _decode_value(value: str | None, ftype: str) -> Any:
    """A stored tuple value as pydatahub's TupleRecord hands it out."""
    if value is None:
        return None
    if ftype in _INT_BOUNDS:
        return int(value)
    if ftype in ("double", "float"):
        return float(value)
    if ftype == "decimal":
        return decimal.Decimal(value)
    if ftype == "boolean":
        return value == "true"
    return value


# ---------------------------------------------------------------------------------------------
# fault injection
# ---------------------------------------------------------------------------------------------

@dataclass
class _Plan:
    delay_before: float = 0.0
    delay_after: float = 0.0
    before: tuple | None = None   # ("error", status, code, message, raw) | ("reset",)
    after: tuple | None = None
    partial: tuple | None = None  # (indexes: set[int], code, message)
    kinds: list[str] = field(default_factory=list)


class Faults:
    """Thread-safe, scriptable faults. `op` is a DataHub operation name (ALL_OPS), a tuple of them, or "*".

    Scripted rules are used in the order they were added; `times=None` means until `clear()`.
    `after_apply=True` makes a fault hit after the operation took effect (the write landed but the
    answer is lost): the case that makes a writer send the same records twice.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[dict] = []
        self._throttle: dict | None = None
        self._chaos: dict | None = None
        self._chaos_counts: dict[str, int] = {}
        self.injected: list[tuple[str, str]] = []  # (op, kind), in the order they hit

    # -- scripted ------------------------------------------------------------------------------
    def fail_next(self, op: str | Iterable[str] = "*", status: int = 500, code: str = "InternalServerError",
                  message: str = "injected failure", times: int | None = 1, *, after_apply: bool = False,
                  raw_body: bytes | None = None, shard: str | None = None) -> None:
        """Answer the next `times` matching requests with `status` and a DataHub error body
        (or `raw_body` verbatim, e.g. a gateway's HTML page). `shard` limits the rule to requests whose
        URL names that shard (GetCursor, GetRecords, PutRecordsByShard)."""
        self._add(dict(kind="error", op=op, times=times, after=after_apply, shard=shard,
                       error=("error", status, code, message, raw_body)))

    def reset_connection(self, op: str | Iterable[str] = "*", times: int | None = 1, *,
                         after_apply: bool = False, shard: str | None = None) -> None:
        """Close the socket without an answer (the client sees a connection error)."""
        self._add(dict(kind="reset", op=op, times=times, after=after_apply, shard=shard, error=("reset",)))

    def partial_failure(self, indexes: Iterable[int] | Callable[[int], Iterable[int]] = (0,),
                        code: str = "LimitExceeded", message: str = "The rate of traffic exceeds the limit",
                        times: int | None = 1) -> None:
        """The next `times` PutRecords calls fail the records at `indexes` (or `indexes(n)` for a
        request of n records) with `code` in FailedRecords; the other records land, in order."""
        self._add(dict(kind="partial", op="PutRecords", times=times, after=False,
                       partial=(indexes, code, message)))

    def delay(self, op: str | Iterable[str] = "*", seconds: float = 0.1, times: int | None = None, *,
              after_apply: bool = False, shard: str | None = None) -> None:
        """Wait `seconds` before answering (before or after the operation takes effect)."""
        self._add(dict(kind="delay", op=op, times=times, after=after_apply, shard=shard, seconds=seconds))

    def throttle(self, rate: float | None, op: str | Iterable[str] = WRITE_OPS, burst: float | None = None) -> None:
        """Allow `rate` matching requests per second (token bucket of `burst`, default max(1, rate));
        the rest get 429 LimitExceeded. rate=0 throttles every request; rate=None removes it."""
        with self._lock:
            if rate is None:
                self._throttle = None
                return
            cap = burst if burst is not None else max(1.0, float(rate))
            self._throttle = dict(rate=float(rate), op=op, cap=cap, tokens=cap, at=time.monotonic())

    def chaos(self, seed: int | None, p_5xx: float = 0.0, p_throttle: float = 0.0, p_partial: float = 0.0,
              p_delay: float = 0.0, p_reset: float = 0.0, p_ack_lost: float = 0.0, max_delay: float = 0.05,
              op: str | Iterable[str] = WRITE_OPS) -> None:
        """Random faults on matching requests, deterministic per seed: the n-th request of an operation
        always draws the same fault (so a sequential client replays exactly). `p_ack_lost`: the write
        lands, then the connection is reset. seed=None switches chaos off."""
        with self._lock:
            self._chaos_counts = {}
            if seed is None:
                self._chaos = None
                return
            total = p_5xx + p_throttle + p_partial + p_reset + p_ack_lost
            if total > 1.0 or min(p_5xx, p_throttle, p_partial, p_delay, p_reset, p_ack_lost) < 0:
                raise ValueError("chaos probabilities must be >= 0 and the terminal ones sum to <= 1")
            self._chaos = dict(seed=seed, p_5xx=p_5xx, p_throttle=p_throttle, p_partial=p_partial,
                               p_delay=p_delay, p_reset=p_reset, p_ack_lost=p_ack_lost,
                               max_delay=max_delay, op=op)

    def clear(self) -> None:
        """Remove every rule, the throttle and chaos (the `injected` log is kept)."""
        with self._lock:
            self._rules.clear()
            self._throttle = None
            self._chaos = None
            self._chaos_counts = {}

    def count(self, kind: str | None = None, op: str | None = None) -> int:
        """How many faults hit so far, optionally of one kind (error, reset, partial, delay, throttle,
        chaos-5xx, chaos-throttle, chaos-partial, chaos-delay, chaos-reset, chaos-ack-lost) or op."""
        with self._lock:
            return sum(1 for o, k in self.injected if (kind is None or k == kind) and (op is None or o == op))

    @property
    def pending(self) -> int:
        """Scripted rules with uses left (rules with times=None count as pending)."""
        with self._lock:
            return len(self._rules)

    # -- internals -----------------------------------------------------------------------------
    def _add(self, rule: dict) -> None:
        if rule["times"] is not None and rule["times"] < 1:
            return
        with self._lock:
            self._rules.append(rule)

    @staticmethod
    def _matches(spec: str | Iterable[str], op: str) -> bool:
        if spec == "*" or spec == op:
            return True
        return not isinstance(spec, str) and op in spec

    def _use(self, rule: dict) -> None:
        if rule["times"] is not None:
            rule["times"] -= 1
            if rule["times"] <= 0:
                self._rules.remove(rule)

    def _plan(self, op: str, n_records: int, shard: str = "") -> _Plan:
        plan = _Plan()
        with self._lock:
            matching = [r for r in self._rules if self._matches(r["op"], op)
                        and (r.get("shard") is None or str(r["shard"]) == shard)]
            order = {"error": 0, "reset": 0, "partial": 1, "delay": 2}
            for rule in sorted(matching, key=lambda r: order[r["kind"]]):  # stable: insertion order kept
                kind = rule["kind"]
                if kind == "delay":
                    if rule["after"]:
                        plan.delay_after += rule["seconds"]
                    else:
                        plan.delay_before += rule["seconds"]
                elif kind == "partial":
                    if plan.partial is not None or plan.before is not None:
                        continue  # the request fails as a whole: the partial rule waits for the next one
                    indexes, code, message = rule["partial"]
                    chosen = indexes(n_records) if callable(indexes) else indexes
                    plan.partial = ({i for i in chosen if 0 <= i < n_records}, code, message)
                else:
                    if plan.before is not None or plan.after is not None:
                        continue
                    if rule["after"]:
                        plan.after = rule["error"]
                    else:
                        plan.before = rule["error"]
                self._use(rule)
                plan.kinds.append(kind)
            th = self._throttle
            if th is not None and plan.before is None and self._matches(th["op"], op):
                now = time.monotonic()
                th["tokens"] = min(th["cap"], th["tokens"] + (now - th["at"]) * th["rate"])
                th["at"] = now
                if th["rate"] > 0 and th["tokens"] >= 1.0:
                    th["tokens"] -= 1.0
                else:
                    plan.before = ("error", 429, "LimitExceeded", "The rate of traffic exceeds the limit", None)
                    plan.kinds.append("throttle")
            ch = self._chaos
            if ch is not None and self._matches(ch["op"], op):
                n = self._chaos_counts.get(op, 0)
                self._chaos_counts[op] = n + 1
                rng = random.Random(f"{ch['seed']}/{op}/{n}")
                u = rng.random()
                edges = itertools.accumulate((ch["p_reset"], ch["p_ack_lost"], ch["p_5xx"], ch["p_throttle"],
                                              ch["p_partial"]))
                choice = next((k for k, e in zip(("reset", "ack-lost", "5xx", "throttle", "partial"), edges)
                               if u < e), None)
                if plan.before is None and plan.after is None and plan.partial is None and choice:
                    if choice == "reset":
                        plan.before = ("reset",)
                    elif choice == "ack-lost":
                        plan.after = ("reset",)
                    elif choice == "5xx":
                        status, code = rng.choice(((500, "InternalServerError"), (503, "ServiceUnavailable")))
                        plan.before = ("error", status, code, "chaos", None)
                    elif choice == "throttle":
                        plan.before = ("error", 429, "LimitExceeded", "The rate of traffic exceeds the limit",
                                       None)
                    elif op == "PutRecords" and n_records > 0:
                        first = rng.randrange(n_records)
                        failed = {first} | {i for i in range(n_records) if rng.random() < 0.25}
                        plan.partial = (failed, "LimitExceeded", "The rate of traffic exceeds the limit")
                    else:
                        choice = None
                    if choice:
                        plan.kinds.append("chaos-" + choice)
                if rng.random() < ch["p_delay"]:
                    plan.delay_before += rng.uniform(0, ch["max_delay"])
                    plan.kinds.append("chaos-delay")
            for kind in plan.kinds:
                self.injected.append((op, kind))
        return plan


# ---------------------------------------------------------------------------------------------
# wire helpers: compression, protobuf frames
# ---------------------------------------------------------------------------------------------

def _decompress(data: bytes, encoding: str, raw_size: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity", "deflate"):  # pydatahub's "deflate" compressor is the identity
        return data
    if encoding == "lz4":
        import lz4.block
        return lz4.block.decompress(data, uncompressed_size=raw_size)
    if encoding == "zlib":
        return zlib.decompress(data)
    raise DataHubError("InvalidParameter", f"unsupported Content-Encoding {encoding!r}")


def _compress(data: bytes, encoding: str) -> bytes | None:
    if encoding == "lz4":
        import lz4.block
        return lz4.block.compress(data, store_size=False)
    if encoding == "zlib":
        return zlib.compress(data)
    return None


_CRC32C_TABLE: list[int] = []
_CRC32C_FUN: list[Callable] = []  # crcmod's function, made once: making it builds its table in Python


def _crc32c(data: bytes) -> int:
    try:
        if not _CRC32C_FUN:
            try:  # the hardware CRC (a real DataHub's CPU is not this machine's: keep the stand-in's small)
                import google_crc32c
                if google_crc32c.implementation == "c":
                    _CRC32C_FUN.append(google_crc32c.value)
            except ImportError:
                pass
        if not _CRC32C_FUN:
            import crcmod.predefined
            _CRC32C_FUN.append(crcmod.predefined.mkCrcFun("crc-32c"))
        return _CRC32C_FUN[0](bytes(data)) & 0xFFFFFFFF
    except ImportError:  # pragma: no cover - crcmod comes with pydatahub
        if not _CRC32C_TABLE:
            for i in range(256):
                c = i
                for _ in range(8):
                    c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
                _CRC32C_TABLE.append(c)
        crc = 0xFFFFFFFF
        for b in data:
            crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF


def _pb_wrap(pb: bytes) -> bytes:
    pb = bytes(pb)
    return b"DHUB" + struct.pack(">I", _crc32c(pb)) + struct.pack(">I", len(pb)) + pb


def _pb_unwrap(frame: bytes) -> bytes:
    if len(frame) < 12 or frame[:4] != b"DHUB":
        raise DataHubError("InvalidParameter", "protobuf body lacks the DHUB frame header")
    crc, length = struct.unpack(">II", frame[4:12])
    pb = frame[12:]
    if length != len(pb) or crc != _crc32c(pb):
        raise DataHubError("InvalidParameter", "protobuf frame crc or length mismatch")
    return pb


def _pb():
    from datahub.proto import datahub_record_proto_pb as pbmod  # pydatahub's own message definitions
    return pbmod


# ---------------------------------------------------------------------------------------------
# the server
# ---------------------------------------------------------------------------------------------

@dataclass
class _Request:
    method: str
    path: str
    headers: Any
    body: bytes
    op: str = ""
    project: str = ""
    topic: str = ""
    shard: str = ""
    sub: str = ""
    payload: Any = None
    pb: bool = False
    n_records: int = 0


class StandInDataHub:
    """DataHub's REST protocol on 127.0.0.1 for the real pydatahub client.

    auto_create_projects: a project named in any request exists (CreateProject still answers
        ProjectAlreadyExist for a project that exists).
    credentials: {access_id: access_key} to verify pydatahub's request signatures; None accepts any
        id/key but still requires an `Authorization: DATAHUB id:signature` header.
    compress_responses: answer lz4/zlib-compressed bodies when the client accepts them (as DataHub does).
    max_request_bytes: a PutRecords body (decompressed) above this is refused (InvalidParameter).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, auto_create_projects: bool = True,
                 credentials: dict[str, str] | None = None, compress_responses: bool = True,
                 max_request_bytes: int = 4 * 1024 * 1024, max_get_limit: int = 1000) -> None:
        self.host, self._port = host, port
        self.auto_create_projects = auto_create_projects
        self.credentials = credentials
        self.compress_responses = compress_responses
        self.max_request_bytes = max_request_bytes
        self.max_get_limit = max_get_limit
        self.faults = Faults()
        self.requests: list[dict] = []  # {"op", "project", "topic", "shard", "status", "records", "faults"}
        self.errors: list[BaseException] = []  # the stand-in's own bugs (answered as 500 InternalServerError)
        self._lock = threading.RLock()
        self._projects: dict[str, _Project] = {}
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> StandInDataHub:
        """Bind (port 0: any free port) and serve in a daemon thread."""
        if self._httpd is not None:
            return self
        self._httpd = _HTTPServer((self.host, self._port), _Handler, self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"datahub-standin:{self._port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop every open connection; the state is kept (start() again serves it on
        the same port)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> StandInDataHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint(self) -> str:
        if self._httpd is None and self._port == 0:
            raise RuntimeError("start() the stand-in first")
        return f"http://{self.host}:{self._port}"

    # -- direct (no HTTP) helpers for tests -----------------------------------------------------
    def create_project(self, project: str, comment: str = "") -> None:
        with self._lock:
            if project in self._projects:
                raise DataHubError("ProjectAlreadyExist", f"The specified project {project} already exists.")
            now = int(time.time())
            self._projects[project] = _Project(project, comment, now, now)

    def create_topic(self, project: str, topic: str, shard_count: int = 1, record_type: str = "BLOB",
                     schema: Any = None, lifecycle: int = 1, comment: str = "") -> None:
        """Create a topic without a client. `schema` (TUPLE): a pydatahub RecordSchema, its JSON, or a
        list of (name, type[, nullable]) with type a pydatahub FieldType or its name."""
        with self._lock:
            self._create_topic(self._project(project), topic, shard_count, record_type.upper(), schema,
                               lifecycle, comment)

    def split(self, project: str, topic: str, shard_id: str, split_key: str | None = None) -> list[str]:
        """Split an ACTIVE shard (at the middle of its range by default); returns the two new ids."""
        with self._lock:
            return [s["ShardId"] for s in self._split(self._topic(project, topic), shard_id, split_key)]

    def merge(self, project: str, topic: str, shard_id: str, adjacent_shard_id: str) -> str:
        """Merge two adjacent ACTIVE shards; returns the new shard id."""
        with self._lock:
            return self._merge(self._topic(project, topic), shard_id, adjacent_shard_id)["ShardId"]

    def expire_shard(self, project: str, topic: str, shard_id: str) -> None:
        """A CLOSED shard whose records are all past the lifecycle, dropped as DataHub drops it:
        from now on it is not listed and requests naming it answer NoSuchShard."""
        with self._lock:
            t = self._topic(project, topic)
            if self._shard(t, shard_id).state != "CLOSED":
                raise DataHubError("InvalidShardOperation", f"shard {shard_id} is not CLOSED")
            del t.shards[shard_id]

    def shards(self, project: str, topic: str) -> list[dict]:
        """Every shard (ACTIVE and CLOSED) as ListShard reports it, plus its record count."""
        with self._lock:
            t = self._topic(project, topic)
            return [dict(shard_id=s.shard_id, state=s.state, begin_hash_key=_hash_hex(s.begin),
                         end_hash_key=_hash_hex(s.end), parent_shard_ids=list(s.parents),
                         left_shard_id=s.left, right_shard_id=s.right, closed_time=s.closed_time,
                         records=len(s.records))
                    for s in sorted(t.shards.values(), key=lambda s: int(s.shard_id))]

    def records(self, project: str, topic: str, shard: str | None = None) -> list[dict]:
        """What landed, shard by shard (by shard id) and in sequence order within each shard:
        {"shard", "sequence", "system_time", "attributes", "data": bytes} for BLOB topics, or
        {..., "values": [...]} for TUPLE topics, values typed as pydatahub's TupleRecord gives them
        (int, float, bool, decimal.Decimal, str, None), padded with None for fields appended later."""
        with self._lock:
            t = self._topic(project, topic)
            shards = sorted(t.shards.values(), key=lambda s: int(s.shard_id))
            out = []
            for s in shards:
                if shard is not None and s.shard_id != str(shard):
                    continue
                for r in s.records:
                    item = dict(shard=s.shard_id, sequence=r.sequence, system_time=r.system_time,
                                attributes=dict(r.attributes))
                    if t.record_type == "BLOB":
                        item["data"] = r.data
                    else:
                        padded = list(r.values) + [None] * (len(t.fields) - len(r.values))
                        item["values"] = [_decode_value(v, f["type"]) for v, f in zip(padded, t.fields)]
                    out.append(item)
            if shard is not None and str(shard) not in t.shards:
                raise DataHubError("NoSuchShard", f"The specified shard {shard} does not exist.")
            return out

    def create_subscription(self, project: str, topic: str, comment: str = "") -> str:
        """A new ACTIVE subscription of `topic`; returns its id (as DataHub's: milliseconds and 5 letters)."""
        with self._lock:
            return self._create_subscription(self._topic(project, topic), comment)

    def subscription_offsets(self, project: str, topic: str, sub_id: str) -> dict[str, dict]:
        """{shard id: {"sequence", "timestamp", "version", "session"}} of the shards that have an offset
        (opened, committed or reset at least once)."""
        with self._lock:
            sub = self._subscription(self._topic(project, topic), sub_id)
            return {k: {"sequence": o.sequence, "timestamp": o.timestamp, "version": o.version, "session": o.session}
                    for k, o in sorted(sub.offsets.items(), key=lambda kv: int(kv[0]))}

    def set_subscription_state(self, project: str, topic: str, sub_id: str, active: bool) -> None:
        with self._lock:
            sub = self._subscription(self._topic(project, topic), sub_id)
            sub.state, sub.modify_time = (1 if active else 0), int(time.time())

    def delete_subscription(self, project: str, topic: str, sub_id: str) -> None:
        with self._lock:
            t = self._topic(project, topic)
            self._subscription(t, sub_id)
            del t.subscriptions[sub_id]

    def reset(self) -> None:
        """Forget every project, topic and record, the request log and all faults."""
        with self._lock:
            self._projects.clear()
            self.requests.clear()
            self.errors.clear()
        self.faults.clear()
        with self.faults._lock:
            self.faults.injected.clear()

    # -- state file (process mode) --------------------------------------------------------------
    def dump_state(self) -> dict:
        with self._lock:
            return {"projects": [{
                "name": p.name, "comment": p.comment, "create_time": p.create_time,
                "topics": [{
                    "name": t.name, "record_type": t.record_type, "fields": t.fields, "lifecycle": t.lifecycle,
                    "comment": t.comment, "create_time": t.create_time, "next_shard": t.next_shard,
                    "shards": [{
                        "shard_id": s.shard_id, "begin": str(s.begin), "end": str(s.end), "state": s.state,
                        "closed_time": s.closed_time, "parents": s.parents, "left": s.left, "right": s.right,
                        "records": [{"sequence": r.sequence, "system_time": r.system_time,
                                     "attributes": r.attributes,
                                     "data": None if r.data is None else base64.b64encode(r.data).decode(),
                                     "values": r.values} for r in s.records]}
                        for s in t.shards.values()],
                    "subscriptions": [{
                        "sub_id": u.sub_id, "comment": u.comment, "create_time": u.create_time,
                        "modify_time": u.modify_time, "state": u.state,
                        "offsets": {k: [o.sequence, o.timestamp, o.batch_index, o.version, o.session, o.sessions]
                                    for k, o in u.offsets.items()}}
                        for u in t.subscriptions.values()]}
                    for t in p.topics.values()]}
                for p in self._projects.values()]}

    def load_state(self, state: dict) -> None:
        with self._lock:
            self._projects.clear()
            for p in state.get("projects", []):
                proj = _Project(p["name"], p.get("comment", ""), p.get("create_time", 0), p.get("create_time", 0))
                for t in p.get("topics", []):
                    topic = _Topic(t["name"], t["record_type"], t["fields"], t["lifecycle"], t["comment"],
                                   t["create_time"], t["create_time"], next_shard=t["next_shard"])
                    for s in t["shards"]:
                        shard = _Shard(s["shard_id"], int(s["begin"]), int(s["end"]), s["state"], s["closed_time"],
                                       s["parents"], left=s["left"], right=s["right"])
                        shard.records = [_Record(r["sequence"], r["system_time"], r["attributes"],
                                                 None if r["data"] is None else base64.b64decode(r["data"]),
                                                 r["values"]) for r in s["records"]]
                        topic.shards[shard.shard_id] = shard
                    for u in t.get("subscriptions", []):
                        sub = _Subscription(u["sub_id"], topic.name, u["comment"], u["create_time"],
                                            u["modify_time"], u["state"])
                        sub.offsets = {k: _Offset(*v) for k, v in u["offsets"].items()}
                        topic.subscriptions[sub.sub_id] = sub
                    proj.topics[topic.name] = topic
                self._projects[proj.name] = proj

    # -- lookups --------------------------------------------------------------------------------
    def _project(self, name: str) -> _Project:
        proj = self._projects.get(name)
        if proj is None:
            if not self.auto_create_projects:
                raise DataHubError("NoSuchProject", f"The specified project {name} does not exist.")
            now = int(time.time())
            proj = self._projects[name] = _Project(name, "", now, now)
        return proj

    def _topic(self, project: str, topic: str) -> _Topic:
        t = self._project(project).topics.get(topic)
        if t is None:
            raise DataHubError("NoSuchTopic", f"The specified topic {topic} does not exist.")
        return t

    @staticmethod
    def _subscription(t: _Topic, sub_id: str) -> _Subscription:
        sub = t.subscriptions.get(sub_id)
        if sub is None:
            raise DataHubError("NoSuchSubscription", f"The specified subscription {sub_id} does not exist.")
        return sub

    @staticmethod
    def _shard(t: _Topic, shard_id: str) -> _Shard:
        s = t.shards.get(shard_id)
        if s is None:
            raise DataHubError("NoSuchShard", f"The specified shard {shard_id} does not exist.")
        return s

    # -- topic and shard operations ----------------------------------------------------------------
    def _create_topic(self, proj: _Project, name: str, shard_count: Any, record_type: str, schema: Any,
                      lifecycle: Any, comment: str, expand_mode: str = "split") -> None:
        if name in proj.topics:
            raise DataHubError("TopicAlreadyExist", f"The specified topic {name} already exists.")
        if not isinstance(shard_count, int) or isinstance(shard_count, bool) or shard_count < 1:
            raise DataHubError("InvalidParameter", f"ShardCount must be a positive integer, got {shard_count!r}")
        if not isinstance(lifecycle, int) or isinstance(lifecycle, bool) or lifecycle < 1:
            raise DataHubError("InvalidParameter", f"Lifecycle must be a positive integer, got {lifecycle!r}")
        if record_type not in ("BLOB", "TUPLE"):
            raise DataHubError("InvalidParameter", f"RecordType must be BLOB or TUPLE, got {record_type!r}")
        fields = _schema_fields(schema) if record_type == "TUPLE" else []
        now = int(time.time())
        t = _Topic(name, record_type, fields, lifecycle, comment or "", now, now, expand_mode=expand_mode)
        for i in range(shard_count):
            sid = str(i)
            t.shards[sid] = _Shard(sid, i * HASH_SPACE // shard_count, (i + 1) * HASH_SPACE // shard_count)
        t.next_shard = shard_count
        self._relink(t)
        proj.topics[name] = t

    @staticmethod
    def _relink(t: _Topic) -> None:
        active = t.active()
        for i, s in enumerate(active):
            s.left = active[i - 1].shard_id if i > 0 else NO_SHARD
            s.right = active[i + 1].shard_id if i + 1 < len(active) else NO_SHARD

    def _new_shard(self, t: _Topic, begin: int, end: int, parents: list[str]) -> _Shard:
        sid = str(t.next_shard)
        t.next_shard += 1
        s = t.shards[sid] = _Shard(sid, begin, end, parents=parents)
        return s

    def _close(self, s: _Shard) -> None:
        s.state = "CLOSED"
        s.closed_time = int(time.time())

    def _split(self, t: _Topic, shard_id: str, split_key: str | None) -> list[dict]:
        s = self._shard(t, shard_id)
        if s.state != "ACTIVE":
            raise DataHubError("InvalidShardOperation", f"The specified shard {shard_id} is not active.")
        if split_key:
            try:
                key = int(split_key, 16)
            except ValueError:
                raise DataHubError("InvalidParameter", f"invalid SplitKey {split_key!r}") from None
        else:
            key = (s.begin + min(s.end, HASH_SPACE - 1)) // 2
        if not s.begin < key < s.end:
            raise DataHubError("InvalidParameter", f"SplitKey {split_key!r} is outside shard {shard_id}'s range")
        self._close(s)
        left = self._new_shard(t, s.begin, key, [s.shard_id])
        right = self._new_shard(t, key, s.end, [s.shard_id])
        self._relink(t)
        return [{"ShardId": n.shard_id, "BeginHashKey": _hash_hex(n.begin), "EndHashKey": _hash_hex(n.end)}
                for n in (left, right)]

    def _merge(self, t: _Topic, shard_id: str, adjacent: str) -> dict:
        a, b = self._shard(t, shard_id), self._shard(t, adjacent)
        for s in (a, b):
            if s.state != "ACTIVE":
                raise DataHubError("InvalidShardOperation", f"The specified shard {s.shard_id} is not active.")
        if a.end != b.begin and b.end != a.begin:
            raise DataHubError("InvalidParameter", f"shards {shard_id} and {adjacent} are not adjacent")
        lo, hi = (a, b) if a.end == b.begin else (b, a)
        self._close(a)
        self._close(b)
        merged = self._new_shard(t, lo.begin, hi.end, [lo.shard_id, hi.shard_id])
        self._relink(t)
        return {"ShardId": merged.shard_id, "BeginHashKey": _hash_hex(merged.begin),
                "EndHashKey": _hash_hex(merged.end)}

    # -- subscriptions ---------------------------------------------------------------------------
    _sub_rng = random.Random()

    def _create_subscription(self, t: _Topic, comment: str) -> str:
        while True:
            letters = "".join(self._sub_rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
            sub_id = f"{_now_ms()}{letters}"
            if sub_id not in t.subscriptions:
                break
        now = int(time.time())
        t.subscriptions[sub_id] = _Subscription(sub_id, t.name, comment, now, now)
        return sub_id

    @staticmethod
    def _shard_ids(t: _Topic, raw: Any, required: bool) -> list[str]:
        if raw is None and not required:
            return sorted(t.shards, key=int)
        if not isinstance(raw, list) or not raw:
            raise DataHubError("InvalidParameter", "ShardIds must be a non-empty list")
        ids = [str(i) for i in raw]
        for sid in ids:
            StandInDataHub._shard(t, sid)
        return ids

    @staticmethod
    def _offset_out(o: _Offset, session: bool) -> dict:
        out = {"Sequence": o.sequence, "Timestamp": o.timestamp, "BatchIndex": o.batch_index, "Version": o.version}
        if session:
            out["SessionId"] = o.session
        return out

    def _offsets_op(self, t: _Topic, sub: _Subscription, op: str, body: dict) -> dict:
        if op == "GetSubscriptionOffset":
            ids = self._shard_ids(t, body.get("ShardIds"), required=False)
            return {"Offsets": {k: self._offset_out(sub.offsets.get(k) or _Offset(), False) for k in ids}}
        if op == "OpenSubscriptionSession":
            ids = self._shard_ids(t, body.get("ShardIds"), required=True)
            if sub.state != 1:
                raise DataHubError("SubscriptionOffline", f"The specified subscription {sub.sub_id} is offline.")
            out = {}
            for k in ids:
                o = sub.offsets.setdefault(k, _Offset())
                o.session, o.sessions = o.sessions, o.sessions + 1  # the session held before is invalid now
                out[k] = self._offset_out(o, True)
            return {"Offsets": out}
        offsets = body.get("Offsets")
        if not isinstance(offsets, dict) or not offsets:
            raise DataHubError("InvalidParameter", "Offsets must be a non-empty object")
        checked = []
        for k, v in offsets.items():
            self._shard(t, str(k))
            if not isinstance(v, dict):
                raise DataHubError("InvalidParameter", f"offset of shard {k} must be an object")
            try:
                seq, ts = int(v.get("Sequence", -1)), int(v.get("Timestamp", -1))
                batch = int(v.get("BatchIndex", 0) or 0)
            except (TypeError, ValueError):
                raise DataHubError("InvalidParameter", f"invalid offset of shard {k}: {v!r}") from None
            checked.append((str(k), v, seq, ts, batch))
        if op == "ResetSubscriptionOffset":
            for k, _, seq, ts, batch in checked:
                o = sub.offsets.setdefault(k, _Offset())
                o.sequence, o.timestamp, o.batch_index, o.version = seq, ts, batch, o.version + 1
            sub.modify_time = int(time.time())
            return {}
        if sub.state != 1:  # CommitSubscriptionOffset: every shard checked before any is written
            raise DataHubError("SubscriptionOffline", f"The specified subscription {sub.sub_id} is offline.")
        for k, v, *_ in checked:
            o = sub.offsets.get(k)
            if o is None or o.session is None:
                raise DataHubError("OffsetSessionClosed", f"no offset session is open on shard {k}.")
            if str(v.get("Version")) != str(o.version):
                raise DataHubError("OffsetReseted", f"the offset of shard {k} was reset (version {o.version}).")
            if str(v.get("SessionId")) != str(o.session):
                raise DataHubError("OffsetSessionChanged", f"the offset session of shard {k} was taken over "
                                                           f"(session {o.session}).")
        for k, _, seq, ts, batch in checked:
            o = sub.offsets[k]
            o.sequence, o.timestamp, o.batch_index = seq, ts, batch
        return {}

    def _subscription_op(self, req: _Request) -> tuple[int, bytes, str]:
        op, body = req.op, req.payload or {}
        t = self._topic(req.project, req.topic)
        if op == "CreateSubscription":
            return self._ok({"SubId": self._create_subscription(t, str(body.get("Comment", "")))}, 201)
        if op == "ListSubscription":
            index, size = body.get("PageIndex"), body.get("PageSize")
            if not isinstance(index, int) or index < 1 or not isinstance(size, int) or size < 0:
                raise DataHubError("InvalidParameter", f"invalid PageIndex {index!r} / PageSize {size!r}")
            search = str(body.get("Search") or "")
            subs = [u for u in sorted(t.subscriptions.values(), key=lambda u: u.sub_id)
                    if search in u.sub_id or search in u.comment]
            page = subs[(index - 1) * size:index * size]
            return self._ok({"TotalCount": len(subs), "Subscriptions": [u.info() for u in page]})
        sub = self._subscription(t, req.sub)
        if op == "GetSubscription":
            return self._ok(sub.info())
        if op == "UpdateSubscription":
            sub.comment, sub.modify_time = str(body.get("Comment", "")), int(time.time())
            return self._ok({})
        if op == "UpdateSubscriptionState":
            if body.get("State") not in (0, 1):
                raise DataHubError("InvalidParameter", f"invalid State {body.get('State')!r}")
            sub.state, sub.modify_time = body["State"], int(time.time())
            return self._ok({})
        if op == "DeleteSubscription":
            del t.subscriptions[sub.sub_id]
            return self._ok({})
        return self._ok(self._offsets_op(t, sub, op, body))

    # -- records ---------------------------------------------------------------------------------
    def _route(self, t: _Topic, rec: dict) -> _Shard:
        """The shard a PutRecords entry goes to: ShardId, else HashKey, else MD5(PartitionKey)."""
        sid = rec.get("shard_id")
        if sid:
            if not str(sid).isdigit():
                raise DataHubError("InvalidShardId", f"The specified shard id {sid} is invalid.")
            s = t.shards.get(str(sid))
            if s is None:
                raise DataHubError("NoSuchShard", f"The specified shard {sid} does not exist.")
            if s.state != "ACTIVE":
                raise DataHubError("InvalidShardOperation", f"The specified shard {sid} is not active.")
            return s
        if rec.get("hash_key"):
            try:
                h = int(rec["hash_key"], 16)
            except ValueError:
                raise DataHubError("InvalidParameter", f"invalid HashKey {rec['hash_key']!r}") from None
            if not 0 <= h < HASH_SPACE:
                raise DataHubError("InvalidParameter", f"invalid HashKey {rec['hash_key']!r}")
        elif rec.get("partition_key"):
            h = int(hashlib.md5(rec["partition_key"].encode("utf-8")).hexdigest(), 16)
        else:
            raise DataHubError("InvalidParameter", "a record needs a ShardId, a HashKey or a PartitionKey")
        for s in t.active():
            if s.begin <= h < s.end:
                return s
        raise DataHubError("InvalidShardOperation", "no active shard covers the hash key")  # pragma: no cover

    def _check_record(self, t: _Topic, rec: dict) -> tuple[bytes | None, list | None]:
        if t.record_type == "BLOB":
            if rec["blob"] is None:
                raise DataHubError("MalformedRecord", "a BLOB topic takes blob data, got tuple values")
            return rec["blob"], None
        values = rec["values"]
        if values is None:
            raise DataHubError("MalformedRecord", "a TUPLE topic takes tuple values, got blob data")
        if len(values) != len(t.fields):
            raise DataHubError("MalformedRecord", f"record has {len(values)} fields, the topic's schema "
                                                  f"has {len(t.fields)}")
        return None, [_check_value(v, f) for v, f in zip(values, t.fields)]

    @staticmethod
    def _append(s: _Shard, blob: bytes | None, values: list | None, attributes: dict) -> _Record:
        now = _now_ms()
        if s.records and s.records[-1].system_time > now:
            now = s.records[-1].system_time
        r = _Record(len(s.records), now, attributes, blob, values)
        s.records.append(r)
        return r

    def _put_records(self, t: _Topic, recs: list[dict], partial: tuple | None) -> list[dict]:
        failed = []
        fail_idx, fail_code, fail_msg = partial if partial else (set(), "", "")
        for i, rec in enumerate(recs):
            if i in fail_idx:
                failed.append({"Index": i, "ErrorCode": fail_code, "ErrorMessage": fail_msg})
                continue
            try:
                if rec.get("error"):
                    raise rec["error"]
                s = self._route(t, rec)
                blob, values = self._check_record(t, rec)
            except DataHubError as e:
                failed.append({"Index": i, "ErrorCode": e.code, "ErrorMessage": e.message})
                continue
            self._append(s, blob, values, rec["attributes"])
        return failed

    def _put_by_shard(self, t: _Topic, shard_id: str, recs: list[dict]) -> None:
        s = self._shard(t, shard_id)
        if s.state != "ACTIVE":
            raise DataHubError("InvalidShardOperation", f"The specified shard {shard_id} is not active.")
        checked = []
        for rec in recs:
            if rec.get("error"):
                raise rec["error"]
            checked.append(self._check_record(t, rec) + (rec["attributes"],))
        for blob, values, attributes in checked:  # every record valid: all land, in order
            self._append(s, blob, values, attributes)

    @staticmethod
    def _cursor(shard_id: str, seq: int) -> str:
        return "3%07x%024x" % (int(shard_id), seq)

    @staticmethod
    def _parse_cursor(cursor: Any, shard: _Shard) -> int:
        if not isinstance(cursor, str) or len(cursor) != 32 or cursor[0] != "3":
            raise DataHubError("InvalidCursor", f"The cursor {cursor!r} is invalid.")
        try:
            sid, seq = int(cursor[1:8], 16), int(cursor[8:], 16)
        except ValueError:
            raise DataHubError("InvalidCursor", f"The cursor {cursor!r} is invalid.") from None
        if sid != int(shard.shard_id) or seq > len(shard.records):
            raise DataHubError("InvalidCursor", f"The cursor {cursor!r} is invalid for shard {shard.shard_id}.")
        return seq

    def _get_cursor(self, s: _Shard, ctype: str, body: dict) -> dict:
        recs = s.records
        if ctype == "OLDEST":
            seq = 0
        elif ctype == "LATEST":
            seq = max(len(recs) - 1, 0)  # an empty shard: 0 and no error, as on a shard of one record (DataHub's)
        elif ctype == "SEQUENCE":
            seq = body.get("Sequence")
            if not isinstance(seq, int) or seq < 0:
                raise DataHubError("InvalidParameter", f"invalid Sequence {seq!r}")
            if seq > len(recs):
                raise DataHubError("SeekOutOfRange", f"The specified sequence {seq} is out of range.")
        elif ctype == "SYSTEM_TIME":
            ts = body.get("SystemTime")
            if not isinstance(ts, int) or ts < 0:
                raise DataHubError("InvalidParameter", f"invalid SystemTime {ts!r}")
            if ts > _now_ms():
                raise DataHubError("SeekOutOfRange", f"The specified time {ts} is out of range.")
            seq = next((r.sequence for r in recs if r.system_time >= ts), len(recs))
        else:
            raise DataHubError("InvalidParameter", f"invalid cursor Type {ctype!r}")
        time_ = recs[seq].system_time if seq < len(recs) else 0
        return {"Cursor": self._cursor(s.shard_id, seq), "RecordTime": time_, "Sequence": seq}

    def _get_records(self, s: _Shard, cursor: Any, limit: Any) -> tuple[int, list[_Record]]:
        seq = self._parse_cursor(cursor, s)
        if not isinstance(limit, int) or limit <= 0 or limit > self.max_get_limit:
            limit = self.max_get_limit
        out = s.records[seq:seq + limit]
        if not out and s.state == "CLOSED":
            raise DataHubError("InvalidShardOperation", f"The specified shard {s.shard_id} is closed and "
                                                        "all its records have been read.")
        return seq, out

    def _pb_entry(self, t: _Topic, s: _Shard, r: _Record) -> bytes:
        """The record as GetRecordsResponse's field 4 (tag, length, RecordEntry), encoded on its first read."""
        width = 0 if t.record_type == "BLOB" else len(t.fields)
        if r.pb_entry is None or r.pb_entry[0] != width:
            if t.record_type == "BLOB":
                data = [{"value": r.data}]
            else:
                data = [{} if v is None else {"value": v.encode("utf-8")} for v in self._tuple_out(t, r)]
            entry = _encode(_pb().RecordEntry, {
                "sequence": r.sequence, "system_time": r.system_time,
                "cursor": self._cursor(s.shard_id, r.sequence), "next_cursor": self._cursor(s.shard_id, r.sequence + 1),
                "attributes": {"attributes": [{"key": k, "value": v} for k, v in r.attributes.items()]},
                "data": {"data": data}})
            r.pb_entry = (width, b"\x22" + _varint(len(entry)) + entry)
        return r.pb_entry[1]

    def _tuple_out(self, t: _Topic, r: _Record) -> list:
        return list(r.values) + [None] * (len(t.fields) - len(r.values))

    # -- request parsing ---------------------------------------------------------------------------
    @staticmethod
    def _json(body: bytes) -> dict:
        if not body:
            return {}
        try:
            data = json.loads(body)
        except ValueError:
            raise DataHubError("InvalidParameter", "request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise DataHubError("InvalidParameter", "request body is not a JSON object")
        return data

    @staticmethod
    def _attrs(raw: Any) -> dict[str, str]:
        if not raw:
            return {}
        if not isinstance(raw, dict):
            raise DataHubError("MalformedRecord", "Attributes must be an object of strings")
        return {str(k): (json.dumps(v) if isinstance(v, bool) else str(v)) for k, v in raw.items()}

    def _json_records(self, body: dict) -> list[dict]:
        items = body.get("Records")
        if not isinstance(items, list):
            raise DataHubError("InvalidParameter", "Records must be a list")
        out = []
        for item in items:
            rec: dict = {"shard_id": None, "hash_key": None, "partition_key": None, "blob": None,
                         "values": None, "attributes": {}}
            try:
                if not isinstance(item, dict):
                    raise DataHubError("MalformedRecord", "a record must be a JSON object")
                rec.update(shard_id=item.get("ShardId"), hash_key=item.get("HashKey"),
                           partition_key=item.get("PartitionKey"))
                rec["attributes"] = self._attrs(item.get("Attributes"))
                data = item.get("Data")
                if isinstance(data, str):
                    try:
                        rec["blob"] = base64.b64decode(data, validate=True)
                    except (binascii.Error, ValueError):
                        raise DataHubError("MalformedRecord", "blob Data is not base64") from None
                elif isinstance(data, list):
                    rec["values"] = data
                else:
                    raise DataHubError("MalformedRecord", "a record needs Data")
            except DataHubError as e:
                rec["error"] = e
            out.append(rec)
        return out

    @staticmethod
    def _pb_records(pb_body: bytes) -> list[dict]:
        m = _pb().PutRecordsRequest()
        try:
            m.ParseFromString(pb_body)
        except Exception:  # noqa: BLE001 - any decode failure is a malformed request
            raise DataHubError("InvalidParameter", "protobuf PutRecordsRequest does not decode") from None
        out = []
        for e in m.records:
            fields = list(e.data.data) if e.data else []
            raw = [f.__dict__.get("value") for f in fields]  # absent value = null
            rec = {"shard_id": e.shard_id or None, "hash_key": e.hash_key or None,
                   "partition_key": e.partition_key or None,
                   "attributes": {a.key: a.value for a in e.attributes.attributes} if e.attributes else {},
                   "blob": bytes(raw[0] or b"") if len(raw) == 1 else None, "values": None}
            try:
                rec["values"] = [None if v is None else bytes(v).decode("utf-8") for v in raw]
            except UnicodeDecodeError:
                if rec["blob"] is None:
                    rec["error"] = DataHubError("MalformedRecord", "tuple values must be UTF-8")
            out.append(rec)
        return out

    def _parse(self, req: _Request) -> None:
        """Find the operation, its target and its payload (DataHub's URL scheme, Action and headers)."""
        parts = [unquote(p) for p in urlsplit(req.path).path.split("/") if p]
        ctype = (req.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        action_header = (req.headers.get("x-datahub-request-action") or "").lower()
        req.pb = ctype == "application/x-protobuf"
        if ctype == "application/x-binary":
            raise DataHubError("InvalidParameter", "the stand-in does not speak the BATCH protocol; use "
                                                   "protocol_type=DatahubProtocolType.JSON or PB")
        m, n = req.method, len(parts)
        if n == 0 or parts[0] != "projects":
            raise DataHubError("InvalidUriSpec", f"unknown resource {req.path}")
        if n >= 2:
            req.project = parts[1]
        if n >= 5 and parts[2] == "topics" and parts[4] == "subscriptions":
            self._parse_subscription(req, parts)
            return
        if n >= 4:
            if parts[2] != "topics":
                raise DataHubError("InvalidUriSpec", f"unknown resource {req.path}")
            req.topic = parts[3]
        if n >= 6:
            if parts[4] != "shards":
                raise DataHubError("InvalidUriSpec", f"unknown resource {req.path}")
            req.shard = parts[5]
        if n > 6 or n == 3 and parts[2] != "topics" or n == 5 and parts[4] != "shards":
            raise DataHubError("InvalidUriSpec", f"unknown resource {req.path}")
        body = req.body
        if req.pb:
            action = action_header
            payload = None
        else:
            payload = self._json(body) if m in ("POST", "PUT") else {}
            action = str(payload.get("Action", "")).lower()
        table = {
            (1, "GET"): "ListProject",
            (2, "GET"): "GetProject", (2, "POST"): "CreateProject", (2, "PUT"): "UpdateProject",
            (2, "DELETE"): "DeleteProject",
            (3, "GET"): "ListTopic",
            (4, "GET"): "GetTopic", (4, "PUT"): "UpdateTopic", (4, "DELETE"): "DeleteTopic",
            (5, "GET"): "ListShard",
        }
        op = table.get((n, m))
        if n == 4 and m == "POST":
            op = "AppendField" if action == "appendfield" else "CreateTopic"
        elif n == 5 and m == "POST":
            op = {"pub": "PutRecords", "split": "SplitShard", "merge": "MergeShard",
                  "extend": "ExtendShard"}.get(action)
        elif n == 6 and m == "POST":
            op = {"cursor": "GetCursor", "sub": "GetRecords", "meter": "GetMeteringInfo"}.get(action)
            if action == "pub":  # pydatahub sends it as protobuf only; JSON is accepted as well
                op = "PutRecordsByShard"
        if op is None:
            raise DataHubError("InvalidParameter", f"unsupported request: {m} {req.path} Action={action!r}")
        req.op = op
        if op in WRITE_OPS:
            if len(body) > self.max_request_bytes:
                raise DataHubError("InvalidParameter", f"request body of {len(body)} bytes exceeds "
                                                       f"{self.max_request_bytes} bytes")
            recs = self._pb_records(_pb_unwrap(body)) if req.pb else self._json_records(payload)
            req.payload = recs
            req.n_records = len(recs)
        elif op == "GetRecords" and req.pb:
            g = _pb().GetRecordsRequest()
            try:
                g.ParseFromString(_pb_unwrap(body))
            except DataHubError:
                raise
            except Exception:  # noqa: BLE001
                raise DataHubError("InvalidParameter", "protobuf GetRecordsRequest does not decode") from None
            req.payload = {"Cursor": g.cursor, "Limit": g.limit}
        else:
            req.payload = payload

    def _parse_subscription(self, req: _Request, parts: list[str]) -> None:
        """/projects/P/topics/T/subscriptions[/ID[/offsets]]: JSON bodies, an Action for POSTs and the
        offsets' PUTs."""
        m, n = req.method, len(parts)
        req.topic = parts[3]
        if n >= 6:
            req.sub = parts[5]
        if n > 7 or n == 7 and parts[6] != "offsets":
            raise DataHubError("InvalidUriSpec", f"unknown resource {req.path}")
        payload = self._json(req.body) if m in ("POST", "PUT") else {}
        action = str(payload.get("Action", "")).lower()
        if n == 5:
            op = {"create": "CreateSubscription", "list": "ListSubscription"}.get(action) if m == "POST" else None
        elif n == 6:
            op = {"GET": "GetSubscription", "DELETE": "DeleteSubscription",
                  "PUT": "UpdateSubscriptionState" if "State" in payload else "UpdateSubscription"}.get(m)
        elif m == "POST":
            op = {"open": "OpenSubscriptionSession", "get": "GetSubscriptionOffset"}.get(action)
        else:
            op = {"commit": "CommitSubscriptionOffset", "reset": "ResetSubscriptionOffset"}.get(action) \
                if m == "PUT" else None
        if op is None:
            raise DataHubError("InvalidParameter", f"unsupported request: {m} {req.path} Action={action!r}")
        req.op, req.payload = op, payload

    def _authorized(self, req: _Request) -> None:
        auth = req.headers.get("Authorization") or ""
        m = re.match(r"DATAHUB ([^:]+):(.+)\Z", auth)
        if not m:
            raise DataHubError("Unauthorized", "missing or malformed Authorization header")
        if self.credentials is None:
            return
        key = self.credentials.get(m.group(1))
        if key is None:
            raise DataHubError("Unauthorized", f"unknown access id {m.group(1)}")
        url = urlsplit(unquote(req.path))
        lines = [req.method, req.headers.get("Content-Type", ""), req.headers.get("Date", "")]
        signed = sorted((k.lower(), v) for k, v in req.headers.items() if k.lower().startswith("x-datahub-"))
        lines += [f"{k}:{v}" for k, v in signed]
        query = "&".join(sorted(url.query.split("&"))) if url.query else ""
        lines.append(url.path + "?" + query if query else url.path)
        want = base64.b64encode(hmac.new(key.encode("latin-1"), "\n".join(lines).encode("latin-1"),
                                         hashlib.sha1).digest()).decode()
        if not hmac.compare_digest(want, m.group(2)):
            raise DataHubError("Unauthorized", "the request signature does not match")

    # -- execution ------------------------------------------------------------------------------------
    def _execute(self, req: _Request, plan: _Plan) -> tuple[int, bytes, str]:
        """Apply the operation; return (status, body, content type)."""
        op, body = req.op, req.payload
        with self._lock:
            if op == "ListProject":
                return self._ok({"ProjectNames": sorted(self._projects)})
            if op == "CreateProject":
                self.create_project(req.project, str(body.get("Comment", "")))
                return self._ok({}, 201)
            if op == "GetProject":
                p = self._project(req.project)
                return self._ok({"ProjectName": p.name, "Comment": p.comment, "CreateTime": p.create_time,
                                 "LastModifyTime": p.modify_time})
            if op == "UpdateProject":
                p = self._project(req.project)
                p.comment, p.modify_time = str(body.get("Comment", "")), int(time.time())
                return self._ok({})
            if op == "DeleteProject":
                if req.project not in self._projects:
                    raise DataHubError("NoSuchProject", f"The specified project {req.project} does not exist.")
                if self._projects[req.project].topics:
                    raise DataHubError("InvalidOperation", f"project {req.project} still has topics")
                del self._projects[req.project]
                return self._ok({})
            proj = self._project(req.project)
            if op == "ListTopic":
                return self._ok({"TopicNames": sorted(proj.topics)})
            if op == "CreateTopic":
                mode = "extend" if body.get("ExpandMode") == "extend" else "split"
                self._create_topic(proj, req.topic, body.get("ShardCount"), str(body.get("RecordType", "")).upper(),
                                   body.get("RecordSchema"), body.get("Lifecycle"), str(body.get("Comment", "")),
                                   mode)
                return self._ok({}, 201)
            if op in SUBSCRIPTION_OPS:
                return self._subscription_op(req)
            t = self._topic(req.project, req.topic)
            if op == "GetTopic":
                out = {"ShardCount": len(t.active()), "Lifecycle": t.lifecycle, "RecordType": t.record_type,
                       "Comment": t.comment, "CreateTime": t.create_time, "LastModifyTime": t.modify_time,
                       "ExpandMode": t.expand_mode}
                if t.record_type == "TUPLE":
                    out["RecordSchema"] = json.dumps({"fields": [
                        {k: v for k, v in f.items() if k != "notnull" or v} for f in t.fields]})
                return self._ok(out)
            if op == "UpdateTopic":
                lc = body.get("Lifecycle")
                if lc is not None:
                    if not isinstance(lc, int) or lc < 1:
                        raise DataHubError("InvalidParameter", f"invalid Lifecycle {lc!r}")
                    t.lifecycle = lc
                if "Comment" in body:
                    t.comment = str(body["Comment"])
                t.modify_time = int(time.time())
                return self._ok({})
            if op == "DeleteTopic":
                del proj.topics[t.name]
                return self._ok({})
            if op == "AppendField":
                if t.record_type != "TUPLE":
                    raise DataHubError("InvalidOperation", "AppendField needs a TUPLE topic")
                name, ftype = body.get("FieldName"), str(body.get("FieldType", "")).lower()
                if not name or ftype not in FIELD_TYPES:
                    raise DataHubError("InvalidParameter", f"invalid field {name!r} of type {ftype!r}")
                if any(f["name"].lower() == str(name).lower() for f in t.fields):
                    raise DataHubError("InvalidParameter", f"field {name} already exists")
                t.fields.append({"name": name, "type": ftype, "notnull": False, "comment": ""})
                t.modify_time = int(time.time())
                return self._ok({})
            if op == "ListShard":
                shards = sorted(t.shards.values(), key=lambda s: int(s.shard_id))
                return self._ok({"Shards": [
                    {"ShardId": s.shard_id, "State": s.state, "ClosedTime": s.closed_time,
                     "BeginHashKey": _hash_hex(s.begin), "EndHashKey": _hash_hex(s.end),
                     "ParentShardIds": list(s.parents), "LeftShardId": s.left, "RightShardId": s.right}
                    for s in shards], "Protocol": "http1.1", "Interval": 500})
            if op == "SplitShard":
                return self._ok({"NewShards": self._split(t, str(body.get("ShardId", "")), body.get("SplitKey"))})
            if op == "MergeShard":
                return self._ok(self._merge(t, str(body.get("ShardId", "")), str(body.get("AdjacentShardId", ""))))
            if op == "PutRecords":
                failed = self._put_records(t, body, plan.partial)
                if req.pb:
                    msg = {"failed_count": len(failed), "failed_records": [
                        {"index": f["Index"], "error_code": f["ErrorCode"], "error_message": f["ErrorMessage"]}
                        for f in failed]}
                    return 200, _pb_wrap(_encode(_pb().PutRecordsResponse, msg)), "application/x-protobuf"
                return self._ok({"FailedRecordCount": len(failed), "FailedRecords": failed})
            if op not in ("PutRecordsByShard", "GetCursor", "GetRecords"):
                raise DataHubError("InvalidOperation", f"the stand-in does not serve {op}")
            s = self._shard(t, req.shard)
            if op == "PutRecordsByShard":
                self._put_by_shard(t, req.shard, body)
                if req.pb:
                    return 200, _pb_wrap(_encode(_pb().PutRecordsResponse, {"failed_count": 0})), \
                        "application/x-protobuf"
                return self._ok({})
            if op == "GetCursor":
                return self._ok(self._get_cursor(s, str(body.get("Type", "")).upper(), body))
            if op == "GetRecords":
                seq, recs = self._get_records(s, body.get("Cursor"), body.get("Limit"))
                nxt = self._cursor(s.shard_id, seq + len(recs))
                if req.pb:
                    head = _encode(_pb().GetRecordsResponse, {"next_cursor": nxt, "record_count": len(recs),
                                                              "start_sequence": seq})
                    # records (field 4) come last: the page is its head and the entries' encodings, each
                    # made once per record, as one encoder would have written the whole message
                    body = b"".join([head] + [self._pb_entry(t, s, r) for r in recs])
                    return 200, _pb_wrap(body), "application/x-protobuf"
                return self._ok({"NextCursor": nxt, "RecordCount": len(recs), "StartSeq": seq, "Records": [
                    {"Data": base64.b64encode(r.data).decode() if t.record_type == "BLOB" else self._tuple_out(t, r),
                     "Sequence": r.sequence, "SystemTime": r.system_time, "Attributes": dict(r.attributes),
                     "Cursor": self._cursor(s.shard_id, r.sequence),
                     "NextCursor": self._cursor(s.shard_id, r.sequence + 1)} for r in recs]})
        raise DataHubError("InvalidOperation", f"the stand-in does not serve {op}")  # pragma: no cover

    @staticmethod
    def _ok(body: dict, status: int = 200) -> tuple[int, bytes, str]:
        return status, json.dumps(body).encode(), "application/json"

    def _serve(self, method: str, path: str, headers: Any, raw: bytes) -> tuple[int, dict, bytes]:
        """One HTTP exchange; raises _Reset to drop the connection."""
        rid = "standin-%012d" % next(self._ids)
        req = _Request(method, path, headers, raw)
        log = {"op": None, "project": None, "topic": None, "shard": None, "status": None, "records": 0,
               "faults": []}
        plan = _Plan()
        try:
            try:
                enc = headers.get("Content-Encoding") or ""
                if enc:
                    req.body = _decompress(raw, enc, int(headers.get("x-datahub-content-raw-size") or 0))
                self._authorized(req)
                self._parse(req)
            except DataHubError:
                raise
            except Exception as e:  # noqa: BLE001 - a body the stand-in cannot read
                raise DataHubError("InvalidParameter", f"cannot decode the request: {e}") from None
            log.update(op=req.op, project=req.project, topic=req.topic, shard=req.shard, records=req.n_records)
            plan = self.faults._plan(req.op, req.n_records, req.shard)
            log["faults"] = list(plan.kinds)
            if plan.delay_before:
                threading.Event().wait(plan.delay_before)
            self._fault(plan.before)
            status, body, ctype = self._execute(req, plan)
            if plan.delay_after:
                threading.Event().wait(plan.delay_after)
            self._fault(plan.after)
        except _Reset:
            log["status"] = "reset"
            self._log(log)
            raise
        except _RawAnswer as e:
            log["status"] = e.status
            self._log(log)
            return e.status, {"x-datahub-request-id": rid, "Content-Type": "text/html"}, e.body
        except DataHubError as e:
            status, ctype = e.status, "application/json"
            body = json.dumps({"ErrorCode": e.code, "ErrorMessage": e.message, "RequestId": rid}).encode()
        except Exception as e:  # noqa: BLE001 - a bug of the stand-in: answer 500 and keep it for the test
            with self._lock:
                self.errors.append(e)
            status, ctype = 500, "application/json"
            body = json.dumps({"ErrorCode": "InternalServerError", "ErrorMessage": f"stand-in bug: {e!r}",
                               "RequestId": rid}).encode()
        log["status"] = status
        self._log(log)
        out_headers = {"x-datahub-request-id": rid, "Content-Type": ctype}
        accept = (headers.get("Accept-Encoding") or "").strip().lower()
        if self.compress_responses and accept in ("lz4", "zlib") and len(body) >= 64:
            packed = _compress(body, accept)
            if packed is not None and len(packed) < len(body):
                out_headers["Content-Encoding"] = accept
                out_headers["x-datahub-content-raw-size"] = str(len(body))
                body = packed
        return status, out_headers, body

    @staticmethod
    def _fault(action: tuple | None) -> None:
        if action is None:
            return
        if action[0] == "reset":
            raise _Reset()
        _, status, code, message, raw = action
        if raw is not None:
            raise _RawAnswer(status, raw)
        raise DataHubError(code, message, status)

    def _log(self, entry: dict) -> None:
        with self._lock:
            self.requests.append(entry)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode(message_cls: Any, data: dict) -> bytes:
    from cprotobuf import encode_data
    return bytes(encode_data(message_cls, data))


class _RawAnswer(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(status)
        self.status, self.body = status, body


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler, standin: StandInDataHub):
        self.standin = standin
        super().__init__(address, handler)

    def handle_error(self, request, client_address) -> None:
        """A client gone before its answer (a SIGKILLed run, a client's timeout) is the client's
        business, as for a real DataHub: no traceback on the tests' output. Anything else is printed."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    timeout = 60
    # TCP_NODELAY: an answer goes out as its headers and its body (two writes); with Nagle the body
    # waited for the client's delayed ACK of the headers, 40 ms per small answer (GetCursor, ListShard)
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.standin._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.standin._track(self.connection, False)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            status, headers, body = self.server.standin._serve(self.command, self.path, self.headers, raw)
        except _Reset:
            self.close_connection = True
            try:  # RST rather than FIN: the client sees "connection reset by peer"
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            return
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


# ---------------------------------------------------------------------------------------------
# process mode
# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.datahub_standin",
                                     description="Serve a stand-in DataHub on 127.0.0.1 until SIGINT/SIGTERM.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--state-file", help="JSON state loaded at start (if present) and saved at exit")
    parser.add_argument("--topic", action="append", default=[], metavar="PROJECT/TOPIC[:SHARDS]",
                        help="create a BLOB topic at start (repeatable)")
    args = parser.parse_args(argv)
    server = StandInDataHub(args.host, args.port)
    if args.state_file:
        try:
            with open(args.state_file, encoding="utf-8") as f:
                server.load_state(json.load(f))
        except FileNotFoundError:
            pass
    for spec in args.topic:
        name, _, shards = spec.partition(":")
        project, _, topic = name.partition("/")
        try:
            server.create_topic(project, topic, int(shards or 1))
        except DataHubError as e:
            if e.code != "TopicAlreadyExist":
                raise
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(server.endpoint, flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
        if args.state_file:
            with open(args.state_file, "w", encoding="utf-8") as f:
                json.dump(server.dump_state(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
