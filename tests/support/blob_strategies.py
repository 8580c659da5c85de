"""Hypothesis strategies for the Blob side of the bridge, on top of the shared `strategies` module.

Two things live here:

* DTS Entries the Blob format can carry. The shared strategies draw `Header.timestamp` from the
  whole uint32 range, but a Blob `eventTime` is 13-digit epoch milliseconds (docs/mapping.md, "Envelope fields"), so
  `timestamp * 1000` must be >= 10**12: `blob_entries()` and friends map every timestamp into
  [10**9, 2**32) (`blob_time`). Everything else is the shared strategies' canonical Entry.
* DataWorks-shaped ("foreign") Blob messages, written the way DataWorks' real-time sync writes
  them, with none of the bridge's `dts` extension: random column sets of the six Blob types with
  valid values (LONG in int64, DOUBLE finite, DATE 13-digit epoch ms, BYTES standard base64,
  STRING any text), every op shape (insert, an update pair, one UPDATE with both images, delete,
  begin, commit, heartbeat, DDL), and the optional parts (systemTime, checkpointTime, dbVersion,
  schemaName, ddlMeta, `ddl: null`, a null image, a missing `version`).

>>> from hypothesis import find
>>> find(foreign_messages(), lambda ms: len(ms) == 2)[0]["payload"]["op"]
'UPDATE_BEFOR'
"""
from __future__ import annotations

import base64
import copy

import orjson
from hypothesis import strategies as st

import bridge
from bridge.samples.values import realistic_entries
from bridge.wire import subscribe_pb2 as pb
from support.strategies import ddl_statements, dml_entries, entries

__all__ = [
    "event_messages", "shuffled_windows", "MIN_TIMESTAMP", "MAX_TIMESTAMP", "blob_time", "blob_entries", "blob_dml_entries", "blob_entry_streams",
    "FOREIGN_VALUES", "foreign_columns", "foreign_messages", "foreign_streams", "DDL_OPS_FOREIGN",
]

# Header.timestamp range whose eventTime (x 1000) has the format's 13 digits; the top is uint32's.
MIN_TIMESTAMP = 10**9
MAX_TIMESTAMP = 2**32 - 1


def blob_time(entry: pb.Entry) -> pb.Entry:
    """A copy of `entry` whose header timestamp is mapped into [MIN_TIMESTAMP, MAX_TIMESTAMP]."""
    out = pb.Entry()
    out.CopyFrom(entry)
    out.header.timestamp = MIN_TIMESTAMP + entry.header.timestamp % (MAX_TIMESTAMP - MIN_TIMESTAMP + 1)
    return out


def blob_entries() -> st.SearchStrategy[pb.Entry]:
    """`strategies.entries()` with a 13-digit eventTime."""
    return entries().map(blob_time)


def blob_dml_entries(**kwargs) -> st.SearchStrategy[pb.Entry]:
    return dml_entries(**kwargs).map(blob_time)


@st.composite
def blob_entry_streams(draw, min_size: int = 0, max_size: int = 8, elements=None) -> list[pb.Entry]:
    """Like `strategies.entry_streams()` (strictly increasing seqIds), of Blob-ready Entries."""
    items = draw(st.lists(blob_entries() if elements is None else elements, min_size=min_size, max_size=max_size))
    seq_ids = draw(st.lists(st.integers(0, 2**64 - 1), min_size=len(items), max_size=len(items), unique=True))
    for entry, seq_id in zip(items, sorted(seq_ids)):
        entry.header.seqId = seq_id
    return items


# ---- DataWorks-shaped messages ---------------------------------------------------------------

_MS13 = st.integers(10**12, 10**13 - 1)
# eventTime must also fit a DTS header (uint32 seconds); tests/test_blob_decode.py covers the rest.
_EVENT_TIME = st.integers(10**12, (2**32) * 1000 - 1)
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=16)
_NAME = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=10)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


# Blob type -> valid values of that type, as DataWorks writes them.
FOREIGN_VALUES: dict[str, st.SearchStrategy] = {
    "LONG": st.integers(-(2**63), 2**63 - 1),
    "DOUBLE": st.floats(allow_nan=False, allow_infinity=False),
    "BOOLEAN": st.booleans(),
    "DATE": _MS13,
    "BYTES": st.binary(max_size=24).map(_b64),
    "STRING": _TEXT,
}

# DDL ops a foreign message may carry (the text usually agrees, sometimes it does not).
DDL_OPS_FOREIGN = ("CREATE", "ALTER", "ERASE", "QUERY", "TRUNCATE", "RENAME", "CINDEX", "DINDEX")


def foreign_columns(min_size: int = 1, max_size: int = 6) -> st.SearchStrategy[list[dict]]:
    """`schema.dataColumn`: unique names, each of the six Blob types."""
    return st.lists(st.fixed_dictionaries({"name": _NAME, "type": st.sampled_from(sorted(FOREIGN_VALUES))}),
                    min_size=min_size, max_size=max_size, unique_by=lambda c: c["name"])


@st.composite
def _image(draw, columns: list[dict], full: bool = False) -> dict:
    """`{"dataColumn": {...}}`: every column (full) or a subset (a MINIMAL image), values or null."""
    values = {}
    for col in columns:
        if not full and draw(st.integers(0, 5)) == 0:
            continue  # absent: NA on the DTS side
        values[col["name"]] = None if draw(st.integers(0, 6)) == 0 else draw(FOREIGN_VALUES[col["type"]])
    return {"dataColumn": values}


@st.composite
def _timestamp(draw) -> dict:
    event_time = draw(_EVENT_TIME)
    if draw(st.booleans()):
        event_time -= event_time % 1000  # DTS-born: whole seconds
    stamp = {"eventTime": event_time}
    if draw(st.booleans()):
        stamp["systemTime"] = draw(_MS13)
    checkpoint = draw(st.sampled_from(["same", "same", "absent", "other"]))
    if checkpoint == "same":
        stamp["checkpointTime"] = event_time
    elif checkpoint == "other":
        stamp["checkpointTime"] = draw(_MS13)
    return stamp


@st.composite
def _source(draw, table: bool = True) -> dict:
    db = draw(_NAME)
    source = {"dbType": draw(st.sampled_from(["MySQL", "MySQL", "MariaDB", "Oracle", "PostgreSQL", "PolarDB"]))}
    if draw(st.booleans()):
        source["dbVersion"] = draw(st.sampled_from(["5.7.34-log", "8.0.25", "10.5.9-MariaDB", ""]))
    source["dbName"] = db
    schema_name = draw(st.sampled_from(["same", "same", "absent", "other"]))
    if schema_name == "same":
        source["schemaName"] = db
    elif schema_name == "other":
        source["schemaName"] = draw(_NAME)
    source["tableName"] = draw(_NAME) if table else draw(st.sampled_from(["", "t"]))
    return source


def _sequence_ids() -> st.SearchStrategy[str]:
    return st.one_of(st.integers(0, 2**64 - 1).map(str),
                     st.integers(0, 10**18).map(lambda n: f"{n:020d}"),  # DataWorks pads some
                     st.integers(2**64 * 10**6, 10**30).map(str))


def _envelope(draw, schema: dict, payload: dict) -> dict:
    msg = {"schema": schema, "payload": payload}
    version = draw(st.sampled_from(["0.0.1", "0.0.1", "0.0.1", None, "1.0"]))
    if version is not None:
        msg["version"] = version
    return msg


@st.composite
def foreign_messages(draw, sequence_id: str | None = None) -> list[dict]:
    """One foreign Blob message, or two for an update pair (UPDATE_BEFOR then UPDATE_AFTER, same
    sequenceId), as a list."""
    seq = sequence_id if sequence_id is not None else draw(_sequence_ids())
    kind = draw(st.sampled_from(["INSERT", "DELETE", "UPDATE_PAIR", "UPDATE", "TRANSACTION_BEGIN",
                                 "TRANSACTION_END", "MHEARTBEAT", "DDL"]))
    if kind in ("INSERT", "DELETE", "UPDATE_PAIR", "UPDATE"):
        columns = draw(foreign_columns())
        schema = {"dataColumn": columns}
        if draw(st.integers(0, 4)):
            schema["primaryKey"] = [c["name"] for c in columns if draw(st.booleans())]
        schema["source"] = draw(_source())
        with_ddl_null = draw(st.booleans())

        def payload(op, before, after, stamp):
            out = {}
            if before is not None:
                out["before"] = before
            elif draw(st.booleans()):
                out["before"] = None
            if after is not None:
                out["after"] = after
            elif draw(st.booleans()):
                out["after"] = None
            out.update(op=op, sequenceId=seq, timestamp=stamp)
            if with_ddl_null:
                out["ddl"] = None
            return out

        stamp = draw(_timestamp())
        if kind == "INSERT":
            return [_envelope(draw, schema, payload("INSERT", None, draw(_image(columns)), stamp))]
        if kind == "DELETE":
            return [_envelope(draw, schema, payload("DELETE", draw(_image(columns)), None, stamp))]
        if kind == "UPDATE":
            return [_envelope(draw, schema, payload("UPDATE", draw(_image(columns)), draw(_image(columns)), stamp))]
        after_stamp = stamp if draw(st.booleans()) else draw(_timestamp())
        return [_envelope(draw, schema, payload("UPDATE_BEFOR", draw(_image(columns)), None, stamp)),
                _envelope(draw, schema, payload("UPDATE_AFTER", None, draw(_image(columns)), after_stamp))]
    payload = {"op": kind, "sequenceId": seq, "timestamp": draw(_timestamp())}
    if kind == "DDL":
        sql, op = draw(ddl_statements())
        if draw(st.integers(0, 5)) == 0:
            op = draw(st.sampled_from(DDL_OPS_FOREIGN))  # the writer decided otherwise
        payload["op"] = op
        ddl = {"text": sql}
        if draw(st.booleans()):
            ddl["ddlMeta"] = _b64(draw(st.binary(min_size=1, max_size=48)))  # opaque Java serialisation
        payload["ddl"] = ddl
        return [_envelope(draw, {"source": draw(_source(table=False))}, payload)]
    schema = {}
    if kind != "MHEARTBEAT" and draw(st.integers(0, 3)) == 0:
        schema = {"source": draw(_source())}
    if draw(st.integers(0, 4)) == 0:
        payload["ddl"] = None
    return [_envelope(draw, schema, payload)]


@st.composite
def foreign_streams(draw, max_size: int = 6) -> list[dict]:
    """A stream of foreign messages with distinct sequenceIds; update pairs stay adjacent."""
    seqs = draw(st.lists(_sequence_ids(), max_size=max_size, unique=True))
    return [msg for seq in seqs for msg in draw(foreign_messages(sequence_id=seq))]


def event_messages(seed: int, events: int = 9) -> list[dict]:
    """One table's Blob messages (the bridge's lossless lines, parsed): 3 events of 1 or 2 rows,
    then `events` of 3 rows, each third one an INSERT, an UPDATE (two halves a row) or a DELETE,
    with the two parts' seqIds apart."""
    encoder = bridge.BlobEncoder(bridge.DEFAULT_OPTIONS)
    out = []
    for i, raw in enumerate(realistic_entries(3, seed=seed, rows_per_entry=1 + seed % 2)
                            + realistic_entries(events, seed=seed + 1, rows_per_entry=3)):
        entry = pb.Entry.FromString(raw)
        entry.header.seqId += 100 * (i // 3)  # (the two parts' seqIds apart)
        dml = entry.event.dmlEvent
        if i % 3:
            dml.dmlEventType = pb.UPDATE if i % 3 == 1 else pb.DELETE
            for row in dml.rows:
                row.oldColumns.extend(row.newColumns)
                if i % 3 == 2:
                    del row.newColumns[:]
                else:
                    row.newColumns[0].CopyFrom(row.newColumns[-1])
        out += [orjson.loads(line) for line in encoder.convert_lines(entry, entry.SerializeToString())]
    return out


def shuffled_windows(draw, messages: list[dict]) -> list[dict]:
    """A deep copy of `messages` with up to 3 windows of 2 to 7 messages each in another order
    (`draw`: a composite strategy's), the start of the tests' disturbed message streams."""
    out = copy.deepcopy(messages)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(out) - 2))
        j = min(len(out), i + draw(st.integers(2, 7)))
        out[i:j] = draw(st.permutations(out[i:j]))
    return out
