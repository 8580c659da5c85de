"""The Tuple law's model (docs/tuple.md, "The laws"): what DTS -> Tuple -> DTS gives back for one Entry
(`tuple_normal_form`), which temporal values a Tuple TIMESTAMP field can hold (`holdable`), and the small
Entry builders the Tuple tests write with. Shared by tests/test_tuple.py and tests/test_temporal_policies.py."""
from __future__ import annotations

from datetime import datetime, timedelta

from bridge import pb
from bridge.options import Options
from bridge.tuple import TIMESTAMP_RANGE
from support.strategies import MYSQL_CHARSETS, parse_mysql_type


def dml(columns, dml_type, rows, seq=7, ts=1605339932, db="shop", table="orders", props=()):
    """An Entry from ([(name, type)], DMLType, [(old image, new image)]) with Data given as sv/bv."""
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=ts,
                                      seqId=seq, schemaName=db, tableName=table))
    event = entry.event.dmlEvent
    event.dmlEventType = dml_type
    for name, type_text in columns:
        event.columns.add(name=name, originalType=type_text)
    for old, new in rows:
        event.rows.add(oldColumns=old, newColumns=new)
    for key, value in props:
        entry.header.properties.add(key=key, value=value)
    return entry


def text(s, charset="utf8mb4"):
    return pb.Data(dataType=pb.STRING, charset=charset, bv=s.encode("utf-8"))


def ascii_(s):
    return pb.Data(dataType=pb.STRING, bv=s.encode("ascii"))


_TEXT_FAMILIES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_TEMPORAL_FAMILIES = {"date", "datetime", "timestamp"}
_EPOCH = datetime(1970, 1, 1)


def _parse_mysql_time(family: str, text: str) -> datetime:
    if family == "date":
        return datetime.strptime(text, "%Y-%m-%d")
    stamp, _, offset = text.partition(" +") if " +" in text else text.partition(" -")
    value = datetime.fromisoformat(stamp if family == "datetime" else text[:len(stamp)])
    if family == "timestamp":
        sign = -1 if text[len(stamp):].startswith(" -") else 1
        hours, minutes = map(int, offset.split(":"))
        value -= sign * timedelta(hours=hours, minutes=minutes)
    return value


def holdable_micros(family: str, text: str) -> int | None:
    """Epoch microseconds (UTC) of temporal text, or None for what a TIMESTAMP field cannot hold."""
    if text.startswith("0000-00-00"):
        return None
    value = _parse_mysql_time(family, text)
    micros = (value - _EPOCH) // timedelta(microseconds=1)
    return micros if micros <= TIMESTAMP_RANGE[1] else None


def rewritten(entry: pb.Entry, rewrite) -> pb.Entry:
    """A copy of the Entry with `rewrite(family, data)` applied to every value of its row images."""
    out = pb.Entry()
    out.CopyFrom(entry)
    families = [parse_mysql_type(c.originalType).family for c in out.event.dmlEvent.columns]
    for row in out.event.dmlEvent.rows:
        for image in (row.oldColumns, row.newColumns):
            for family, data in zip(families, image):
                rewrite(family, data)
    return out


def _null_if_not_holdable(family: str, data: pb.Data) -> None:
    if family in _TEMPORAL_FAMILIES and data.dataType == pb.STRING \
            and holdable_micros(family, data.bv.decode()) is None:
        data.Clear()


def holdable(entry: pb.Entry) -> pb.Entry:
    """The entry with zero dates and times beyond DataHub's TIMESTAMP range set to NULL, as the
    default zero_dates policy writes both (tested above)."""
    return rewritten(entry, _null_if_not_holdable)


def _normal_data(family: str, data: pb.Data) -> pb.Data:
    if data.dataType == pb.NA:
        return pb.Data()
    if data.dataType == pb.NIL:
        return data
    if family in _TEXT_FAMILIES:
        return text(data.bv.decode(MYSQL_CHARSETS[data.charset][0]))
    if family == "timestamp":
        raw = data.bv.decode()
        utc = _parse_mysql_time(family, raw)
        fraction = raw[19:].split(" ")[0]
        return ascii_(utc.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0") + fraction + " +00:00")
    return data


def tuple_normal_form(entry: pb.Entry, options: Options, by_source: bool) -> list[pb.Entry]:
    """What DTS -> Tuple -> DTS gives back (docs/tuple.md, "The laws"): one Entry per row change; a
    header of version 1, MySQL, the timestamp, seqId, schema and table (split at the first dot when
    read from `_source_table_`); the columns as given; NA as NULL, text re-encoded as utf8mb4,
    TIMESTAMP text at the time zone's offset; no properties but the facts of lossless mode."""
    if entry.header.messageType != pb.DML:
        return []
    event, header = entry.event.dmlEvent, entry.header
    families = [parse_mysql_type(c.originalType).family for c in event.columns]
    db, table = header.schemaName, header.tableName
    if by_source:
        db, _, table = f"{db}.{table}".partition(".")
    out = []
    for index, row in enumerate(event.rows):
        expected = dml([], event.dmlEventType, [], seq=header.seqId, ts=header.timestamp, db=db, table=table)
        expected.event.dmlEvent.columns.extend(event.columns)
        new_row = expected.event.dmlEvent.rows.add()
        new_row.oldColumns.extend(_normal_data(f, d) for f, d in zip(families, row.oldColumns))
        new_row.newColumns.extend(_normal_data(f, d) for f, d in zip(families, row.newColumns))
        if index and options.lossless:
            new_row.properties.add(key="datahub:sequenceId", value=str(header.seqId * 10**6 + index))
        out.append(expected)
    return out
