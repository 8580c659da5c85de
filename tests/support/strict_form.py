"""Law 4's model (docs/mapping.md, "Strict mode"): what DTS -> Blob(strict) -> DTS(strict) gives back
for one Entry (`strict_normal_form`), restated independently of the bridge's own tables; and
`through_json`, what a consumer reads back of messages. Shared by tests/test_laws.py and
tests/test_temporal_policies.py."""
from __future__ import annotations

import datetime as dt
import re

import bridge
from bridge import pb


def through_json(messages) -> list[dict]:
    """What a consumer reads back: each message as compact JSON bytes, parsed again."""
    return [bridge.decode_blob(bridge.encode_blob(m)) for m in messages]


# Blob type of a DTS column (docs/mapping.md, "Column types"), restated independently of bridge/values/.
_INTEGER = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint"}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry"}
_TEMPORAL = {"date", "datetime", "timestamp"}
# Blob type -> the column a DTS reader gets for it without the extension (docs/mapping.md, "Foreign messages").
FOREIGN_TYPE = {"LONG": "bigint(20)", "DOUBLE": "double", "STRING": "longtext", "BYTES": "longblob",
                "DATE": "datetime(3)"}
_CODECS = {"utf8mb4": "utf-8", "utf8": "utf-8", "utf8mb3": "utf-8", "latin1": "cp1252", "gbk": "gbk",
           "gb18030": "gb18030", "big5": "big5", "ascii": "ascii"}
_TEMPORAL_RE = re.compile(r"(\d{4})-(\d\d)-(\d\d)(?: (\d\d):(\d\d):(\d\d)(?:\.(\d+))?)?(?: ([+-])(\d\d):(\d\d))?\Z")


def family_of(original_type: str) -> tuple[str, bool, int | None]:
    m = re.match(r"([a-z]+)(?:\((\d+)[^)]*\))?( unsigned)?", original_type)
    return m.group(1), bool(m.group(3)), int(m.group(2)) if m.group(2) else None


def strict_blob_type(original_type: str, decimal: str = "string") -> str:
    family, unsigned, length = family_of(original_type)
    if family in _INTEGER:
        return "STRING" if family == "bigint" and unsigned else "LONG"
    if family == "bit":
        return "STRING" if (length or 1) >= 64 else "LONG"  # bit(64) may exceed LONG
    if family == "year":
        return "LONG"
    if family in ("float", "double"):
        return "DOUBLE"
    if family == "decimal":
        return "DOUBLE" if decimal == "double" else "STRING"
    if family in _TEXT or family in ("json", "time"):
        return "STRING"
    if family in _BYTES:
        return "BYTES"
    assert family in _TEMPORAL, original_type
    return "DATE"


def epoch_ms(text: str) -> tuple[int, int] | None:
    """(epoch ms, sub-ms micros) of MySQL date/datetime/timestamp text (UTC unless it has an offset);
    None for a zero date."""
    y, mo, d, hh, mi, ss, frac, sign, oh, om = _TEMPORAL_RE.match(text).groups()
    if int(y) == 0 or int(mo) == 0 or int(d) == 0:
        return None
    moment = dt.datetime(int(y), int(mo), int(d), int(hh or 0), int(mi or 0), int(ss or 0))
    offset = 0 if not sign else (int(oh) * 60 + int(om)) * (1 if sign == "+" else -1)
    micros = int((frac or "").ljust(6, "0") or 0)
    seconds = (moment - dt.datetime(1970, 1, 1)).days * 86400 + (moment - dt.datetime(1970, 1, 1)).seconds
    total = (seconds - offset * 60) * 10**6 + micros
    return total // 1000, total % 1000


def datetime3_text(ms: int) -> str:
    moment = dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)
    return (f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
            f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}.{ms % 1000:03d}")


def strict_rejects(column: pb.Column, data: pb.Data) -> bool:
    """A value strict mode must report rather than change: a zero date or sub-millisecond digits."""
    family = family_of(column.originalType)[0]
    if family not in _TEMPORAL or data.dataType in (pb.NIL, pb.NA):
        return False
    parsed = epoch_ms(data.bv.decode("ascii"))
    return parsed is None or parsed[1] != 0


def strict_value(column: pb.Column, data: pb.Data) -> pb.Data:
    """The Data a strict reader gets back for one value (UTC, decimal as string)."""
    if data.dataType in (pb.NIL, pb.NA):
        return pb.Data(dataType=data.dataType)
    family = family_of(column.originalType)[0]
    blob = strict_blob_type(column.originalType)

    def text(value: str) -> pb.Data:
        return pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=value.encode("utf-8"))

    if blob == "LONG":
        return pb.Data(dataType=pb.INT64, sv=data.sv)
    if blob == "DOUBLE":
        return pb.Data(dataType=pb.FLOAT64, sv=repr(float(data.sv)))
    if blob == "BYTES":
        return pb.Data(dataType=pb.BYTES, bv=data.bv)
    if blob == "DATE":
        return pb.Data(dataType=pb.STRING, bv=datetime3_text(epoch_ms(data.bv.decode("ascii"))[0]).encode())
    if family in _TEXT:
        return text(data.bv.decode(_CODECS[data.charset]))
    if family in ("json", "time"):
        return text(data.bv.decode("utf-8"))
    return text(data.sv)  # bigint unsigned, bit(64), decimal


def strict_normal_form(entry: pb.Entry) -> list[pb.Entry] | None:
    """What DTS -> Blob(strict) -> DTS(strict) gives for one Entry; None when strict mode must
    report it. Only the documented Blob fields survive: the header keeps messageType, timestamp
    and seqId (plus sourceType, schemaName, tableName for DML and DDL), version becomes 1,
    properties go, events keep only what DataHub says (DDL: the sql), every row change of a
    DML event becomes an Entry of its own, columns take the foreign type of their Blob type,
    and values are rewritten as a reader of that type gets them."""
    mtype = entry.header.messageType
    if mtype in (pb.CHECKPOINT, pb.ROLLBACK):
        return []
    header = pb.Header(version=1, messageType=mtype, timestamp=entry.header.timestamp, seqId=entry.header.seqId,
                       sourceType=pb.MYSQL)
    if mtype in (pb.DML, pb.DDL):
        header.sourceType = entry.header.sourceType
        header.schemaName = entry.header.schemaName
        header.tableName = entry.header.tableName
    if mtype != pb.DML:
        out = pb.Entry(header=header)
        field = {pb.BEGIN: "beginEvent", pb.COMMIT: "commitEvent", pb.DDL: "ddlEvent",
                 pb.HEARTBEAT: "heartbeatEvent"}[mtype]
        getattr(out.event, field).SetInParent()
        if mtype == pb.DDL:
            out.event.ddlEvent.sql = entry.event.ddlEvent.sql
        return [out]
    dml = entry.event.dmlEvent
    columns = list(dml.columns)
    if any(strict_rejects(c, d) for row in dml.rows for image in (row.oldColumns, row.newColumns)
           for c, d in zip(columns, image)):
        return None
    out = []
    for row in dml.rows:
        e = pb.Entry(header=header)
        e.event.dmlEvent.dmlEventType = dml.dmlEventType
        for c in columns:
            e.event.dmlEvent.columns.add(name=c.name, isKey=c.isKey,
                                         originalType=FOREIGN_TYPE[strict_blob_type(c.originalType)])
        r = e.event.dmlEvent.rows.add()
        r.oldColumns.extend(strict_value(c, d) for c, d in zip(columns, row.oldColumns))
        r.newColumns.extend(strict_value(c, d) for c, d in zip(columns, row.newColumns))
        out.append(e)
    return out
