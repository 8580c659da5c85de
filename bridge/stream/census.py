"""What `dts-bridge inspect` counts: records by message type and op, tables, row-image kinds,
Envelopes and split Entries, and errors.

>>> census = Census("Entries")
>>> census.entry(pb.Entry(header=pb.Header(messageType=pb.HEARTBEAT)))
>>> census.as_dict()["ops"]
{'MHEARTBEAT': 1}
"""
from __future__ import annotations

from collections import Counter

from bridge.blob.decode import MESSAGE_TYPE_BY_OP
from bridge.values import DML_IMAGES, OPS_BY_MESSAGE_TYPE, ddl_op
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Assembled, Reassembler

__all__ = ["Census", "CountingReassembler"]


class CountingReassembler(Reassembler):
    """A Reassembler that also counts Entries messages and the ones split across Envelopes."""

    def __init__(self) -> None:
        super().__init__()
        self.bundles = self.split = self.segments = 0

    def feed(self, partition, offset: int, value: bytes, headers=None) -> list:
        out = super().feed(partition, offset, value, headers)
        for item in out:
            if isinstance(item, Assembled):
                self.bundles += 1
                if item.segments > 1:
                    self.split += 1
                    self.segments += item.segments
        return out


def _name(enum, number: int) -> str:
    try:
        return enum.Name(number)
    except ValueError:
        return f"UNKNOWN({number})"


def _image_kind(datas, columns: int) -> str:
    if not datas:
        return "none"
    if len(datas) == columns and all(d.dataType != pb.NA for d in datas):
        return "full"
    return "minimal"


class Census:
    """What `inspect` counts: records, message types, ops, tables, row-image kinds, errors."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.records = 0
        self.message_types: Counter = Counter()
        self.ops: Counter = Counter()
        self.tables: dict[str, Counter] = {}
        self.row_images: Counter = Counter()
        self.framing: dict[str, int] = {}
        self.errors: Counter = Counter()
        self.first_errors: list[str] = []

    def error(self, record: dict, message: str) -> None:
        self.errors[record.get("kind", "error")] += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(message)

    def table(self, db: str, table: str) -> Counter:
        return self.tables.setdefault(f"{db}.{table}" if table else db, Counter())

    def entry(self, entry: pb.Entry) -> None:
        header = entry.header
        self.records += 1
        mtype = header.messageType
        self.message_types[_name(pb.MessageType, mtype)] += 1
        if header.schemaName or header.tableName:
            self.table(header.schemaName, header.tableName)["entries"] += 1
        if mtype == pb.DML:
            dml = entry.event.dmlEvent
            images = DML_IMAGES.get(dml.dmlEventType, ())
            op = "UPDATE" if len(images) == 2 else (images[0].op if images else _name(pb.DMLType, dml.dmlEventType))
            self.ops[op] += len(dml.rows)
            self.table(header.schemaName, header.tableName)["rows"] += len(dml.rows)
            for row in dml.rows:
                for image in images:  # the images its op carries (values.DML_IMAGES)
                    self.row_images[f"{image.image} " + _image_kind(getattr(row, image.field), len(dml.columns))] += 1
        elif mtype == pb.DDL:
            self.ops[ddl_op(entry.event.ddlEvent.sql)] += 1
        else:
            self.ops[OPS_BY_MESSAGE_TYPE.get(mtype) or _name(pb.MessageType, mtype)] += 1

    def blob(self, msg: dict) -> None:
        self.records += 1
        payload = msg["payload"]
        op = payload["op"]
        self.ops[op] += 1
        mtype = MESSAGE_TYPE_BY_OP.get(op)
        self.message_types[_name(pb.MessageType, mtype) if mtype is not None else "none"] += 1
        schema = msg.get("schema") or {}
        source = schema.get("source") or {}
        if source:
            self.table(str(source.get("dbName", "")), str(source.get("tableName", "")))["messages"] += 1
        columns = schema.get("dataColumn")
        for image in ("before", "after"):
            body = payload.get(image)
            if isinstance(body, dict) and isinstance(columns, list):
                values = body.get("dataColumn") or {}
                kind = "none" if not values else ("full" if len(values) >= len(columns) else "minimal")
                self.row_images[f"{image} {kind}"] += 1

    def as_dict(self) -> dict:
        return {"records": self.records, "unit": self.unit, "message_types": dict(self.message_types),
                "ops": dict(self.ops), "tables": {k: dict(v) for k, v in sorted(self.tables.items())},
                "row_images": dict(sorted(self.row_images.items())), **self.framing,
                "errors": sum(self.errors.values()), "errors_by_kind": dict(self.errors),
                "first_errors": self.first_errors}

    def text(self, source: str) -> str:
        def line(label, counter):
            items = ", ".join(f"{k} {v}" for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))
            return f"{label:<14}{items or '-'}"
        out = [f"{source}: {self.records} {self.unit}"]
        if self.framing:
            out.append(f"{'framing':<14}" + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.framing.items()))
        out += [line("message types", self.message_types), line("ops", self.ops),
                line("row images", self.row_images), f"{'tables':<14}{len(self.tables)}"]
        for name, counts in sorted(self.tables.items()):
            out.append(f"  {name:<30} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        out.append(line("errors", self.errors))
        out += [f"  {message}" for message in self.first_errors]
        return "\n".join(out)
