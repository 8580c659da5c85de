"""The encoder's one Python writer of DML messages (`MessageWriter._messages`) and its parts: the
column set's codecs and schema (`_TableCodec`, built once per column set), a row image's
dataColumn (`_image`), schema.source, the timestamp and the version, and the shape of a foreign
message restored from its DataHub facts. `BlobEncoder` (bridge/blob/encode.py) is one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bridge.blob.extension import _DEFAULT_HEADER, _row_unknown
from bridge.blob.facts import _NO_FACTS, _kv
from bridge.blob.rows import MISSES, compile_image, native_plan
from bridge.blob.shape import FORMAT_VERSION
from bridge.errors import ConversionError
from bridge.values import (
    DML_IMAGES,
    FOREIGN_COLUMN_TYPES,
    RESERVED_PREFIX,
    ROW_DIGITS,
    SOURCE_TYPES,
    Inexact,
    Substituted,
    codec_for,
    data_to_raw,
    note_substitution,
)
from bridge.wire import subscribe_pb2 as pb

_ROW_SCALE = 10 ** ROW_DIGITS
_NIL, _NA = int(pb.NIL), int(pb.NA)
_MIN_EVENT_TIME, _MAX_EVENT_TIME = 10 ** 12, 10 ** 13 - 1  # the format's 13-digit epoch milliseconds


@dataclass
class _TableCodec:
    """Per column set: names, codecs, the schema part and the extension's column part, built once."""
    names: list
    codecs: list
    schema_columns: list
    primary_key: list
    ext_columns: dict
    # (name, to_blob, Codec.charset, index) per column, for the hot loop (a value's charset other than
    # the codec's travels in dts.charsets; None: none does)
    columns: list = field(default_factory=list)
    foreign_default: bool = False  # the columns are what a message without extension decodes to
    fast_image: Any = None  # compiled converter of canonical images (blob_rows), built when first needed
    native: Any = None  # C converter of canonical images on an Entry's bytes (blob_rows.native_plan)
    reserved: bool = False  # a column property has the reserved prefix (mode "ask": decided per Entry)

    def plain_extension_redundant(self, nrows: int, ext_header: dict) -> bool:
        """Whether an extension of only header, columns and row says nothing beyond what a
        message without one decodes to (then it is left out): foreign-default columns, a
        one-row event, the default header."""
        return self.foreign_default and nrows == 1 and ext_header == _DEFAULT_HEADER


class MessageWriter:
    """The part of `BlobEncoder` that writes DML message dicts in Python and the parts every message
    has (schema.source, timestamp, version); it uses the encoder's `options`, `_split` (its mode's
    reading of properties), `_sources` and `_mode`."""

    def _messages(self, entry: pb.Entry, header: pb.Header, table: _TableCodec, schema: dict, dml_type: int,
                  first: int, stop: int, stamp: dict, ext_base: dict | None, facts: dict = _NO_FACTS,
                  unknown: tuple | None = None, images: list | None = None) -> list[dict]:
        """The one Python writer of DML messages: the message dicts of rows `first` to `stop` of a
        DML Entry, one per op of its DML type (values.DML_IMAGES), in order.

        `images` (C's `Plan.rows` of a plain Entry) gives each image as its dataColumn dict, as
        (dataColumn, raws, charsets) when its values need the extension, or None: converted here
        (`_image`), as every image is without it. `facts` (the header's DataHub facts) and each
        row's properties shape the messages of foreign Entries (a plain Entry has neither);
        `ext_base` is the extension every message shares (None: strict), `unknown` the unknown
        fields it carries (`_unknown_parts`)."""
        lossless = ext_base is not None
        ops = DML_IMAGES[dml_type]
        all_rows = entry.event.dmlEvent.rows
        nrows = len(all_rows)
        # an extension saying only header, columns and row is left out when it says nothing new
        quiet = lossless and table.plain_extension_redundant(nrows, ext_base["header"])
        seq_base = header.seqId * _ROW_SCALE
        plain = images is not None  # C's scan found no row properties
        out: list = []
        n = 0
        for index in range(first, stop):
            row = None if plain else all_rows[index]
            row_plain = own_facts = None
            if row is not None and row.properties:
                row_plain, own_facts = self._split(row.properties)
            row_facts = {**facts, **own_facts} if own_facts else facts
            row_schema, row_stamp = schema, stamp
            if own_facts:
                row_schema = {**schema, "source": self._source(header, row_facts)}
                row_stamp = self._timestamp(header, row_facts)
            seq = (row_facts.get("sequenceId") if row_facts else None) or str(seq_base + index)
            for op in ops:
                half_facts, msg_stamp, msg_schema = row_facts, row_stamp, row_schema
                if row_facts and op.op == "UPDATE_BEFOR" and any(k.startswith("before.") for k in row_facts):
                    half_facts = _before_facts(row_facts)
                    msg_stamp = self._timestamp(header, half_facts)
                    msg_schema = {**schema, "source": self._source(header, half_facts)}
                values = images[n] if plain else None
                n += 1
                raws = charsets = None
                empty = False
                if type(values) is tuple:  # values that need the extension (lossless)
                    values, raws, charsets = values
                elif values is None:  # no C image, or C was not sure: the codecs decide
                    datas = getattr(row if row is not None else all_rows[index], op.field)
                    values, raws, charsets = self._image(table, datas, lossless)
                    empty = not datas
                msg = {"schema": msg_schema,
                       "payload": {op.image: {"dataColumn": values}, "op": op.op, "sequenceId": seq,
                                   "timestamp": msg_stamp}}
                if half_facts:
                    self._version(msg, half_facts)
                    _apply_shape_facts(msg, half_facts)
                else:
                    msg["version"] = FORMAT_VERSION
                if lossless:
                    ext = dict(ext_base)
                    ext["row"] = [index, nrows]
                    if row_plain:
                        ext["rowProperties"] = row_plain
                    if charsets:
                        ext["charsets"] = charsets
                    if raws:
                        ext["values"] = raws
                    if empty:
                        ext["image"] = "empty"  # no Data at all, unlike an image of NA values
                    if unknown is not None:
                        patch = _row_unknown(*unknown, index, op.op)
                        if patch:
                            ext["unknown"] = patch
                    if not (quiet and len(ext) == 3):
                        msg["dts"] = ext
                out.append(msg)
            if row_facts and row_facts.get("op") == "UPDATE":
                if len(ops) != 2:  # only an update's two halves can have come as one message
                    raise ConversionError(f"datahub:op UPDATE on a row of a {pb.DMLType.Name(dml_type)} Entry: "
                                          "no message the bridge writes")
                out[-2:] = [_merge_update(out[-2], out[-1])]
        return out

    def _image(self, table: _TableCodec, datas, lossless: bool):
        """(dataColumn dict, raw Data by column index for inexact values, charsets by column)."""
        if not datas:
            return {}, None, None
        fast = table.fast_image
        if fast is None:  # compiled on first use: a table the C path takes never needs it
            fast = table.fast_image = compile_image(table.names, table.codecs)
        try:
            return fast(datas), None, None
        except MISSES:
            pass  # not all canonical: the per-value path below decides value by value
        if len(datas) != len(table.names):
            raise ConversionError(f"row image has {len(datas)} values for {len(table.names)} columns")
        values = {}
        raws = None
        charsets = None
        for d, (name, to_blob, own_charset, index) in zip(datas, table.columns):
            dt = d.dataType
            if not 0 < dt < _NA:  # NIL, NA, or a number the enum does not know
                if dt == _NIL:
                    values[name] = None
                elif dt != _NA:
                    raise ConversionError(f"unknown DataType {dt}", column=name)
                if d.charset or d.sv or d.bv:
                    raws = raws or {}
                    raws[index] = data_to_raw(d)
                continue
            try:
                values[name] = to_blob(d)
                if own_charset is not None and d.charset != own_charset:
                    charsets = charsets or {}
                    charsets[index] = d.charset
            except Inexact as inexact:
                if not lossless:
                    if inexact.changed:
                        raise ConversionError(inexact.reason, value=d.sv or d.bv, column=name) from None
                    values[name] = inexact.best
                    if isinstance(inexact, Substituted):  # a temporal policy's: counted by the stream
                        note_substitution(inexact, name)
                    continue
                values[name] = inexact.best
                raws = raws or {}
                raws[index] = data_to_raw(d)
            except ConversionError as exc:
                if not lossless:
                    raise exc.located(column=name, value=None)
                values[name] = None
                raws = raws or {}
                raws[index] = data_to_raw(d)
        return values, raws, charsets

    def _build_table(self, columns) -> _TableCodec:
        columns_in = columns
        names, codecs, schema_columns, pkey = [], [], [], []
        seen = set()
        for c in columns:
            if c.name in seen:
                raise ConversionError("duplicate column name", column=c.name)
            seen.add(c.name)
            try:
                codec = codec_for(c, self.options, self._mode != "plain")
            except ConversionError as exc:
                raise exc.located(column=c.name)
            names.append(c.name)
            codecs.append(codec)
            schema_columns.append({"name": c.name, "type": codec.blob_type})
            if c.isKey:
                pkey.append(c.name)
        ext = {"types": [c.originalType for c in columns]}
        props = {str(i): _kv(c.properties) for i, c in enumerate(columns) if c.properties}
        if props:
            ext["properties"] = props
        foreign = {"types": [FOREIGN_COLUMN_TYPES[c["type"]][0] for c in schema_columns]}
        foreign_props = {str(i): [list(kv) for kv in FOREIGN_COLUMN_TYPES[c["type"]][1]]
                         for i, c in enumerate(schema_columns) if FOREIGN_COLUMN_TYPES[c["type"]][1]}
        if foreign_props:
            foreign["properties"] = foreign_props
        columns = [(n, c.to_blob, c.charset, str(i)) for i, (n, c) in enumerate(zip(names, codecs))]
        table = _TableCodec(names, codecs, schema_columns, pkey, ext, columns, ext == foreign)
        table.reserved = any(p.key.startswith(RESERVED_PREFIX) for c in columns_in for p in c.properties)
        table.native = native_plan(names, codecs, self.options.timezone == "UTC", self.options.lossless)
        return table

    def _source(self, header: pb.Header, facts: dict) -> dict:
        if facts:
            return self._build_source(header, facts)
        key = (header.sourceType, header.schemaName, header.tableName)
        source = self._sources.get(key)
        if source is None:
            if len(self._sources) > 10_000:
                self._sources.clear()
            source = self._sources[key] = self._build_source(header, facts)
        return source

    def _build_source(self, header: pb.Header, facts: dict) -> dict:
        db_type = SOURCE_TYPES.get(header.sourceType)
        if db_type is None:
            raise ConversionError(f"unknown SourceType {header.sourceType}")
        if "source" in facts:
            return orjson.loads(facts["source"])
        source = {"dbType": db_type}
        version = facts.get("dbVersion", self.options.db_version)
        if version:
            source["dbVersion"] = version
        source.update(dbName=header.schemaName, schemaName=header.schemaName, tableName=header.tableName)
        return source

    def _timestamp(self, header: pb.Header, facts: dict) -> dict:
        event_time = int(facts["eventTime"]) if "eventTime" in facts else header.timestamp * 1000
        if not _MIN_EVENT_TIME <= event_time <= _MAX_EVENT_TIME:
            raise ConversionError("timestamp gives no 13-digit eventTime (before 2001-09-09)",
                                  value=header.timestamp)
        stamp = {"eventTime": event_time}
        if "systemTime" in facts:
            stamp["systemTime"] = int(facts["systemTime"])
        elif self.options.system_time:
            stamp["systemTime"] = time.time_ns() // 1_000_000
        checkpoint = facts.get("checkpointTime")
        if checkpoint is None:
            stamp["checkpointTime"] = event_time
        elif checkpoint != "none":
            stamp["checkpointTime"] = int(checkpoint)
        return stamp

    @staticmethod
    def _version(msg: dict, facts: dict) -> None:
        version = facts.get("version", FORMAT_VERSION)
        if version != "none":
            msg["version"] = version


def _apply_shape_facts(msg: dict, facts: dict) -> None:
    """Restore the shape of a foreign (e.g. DataWorks-written) message from its DataHub facts."""
    payload = msg["payload"]
    if "op" in facts and facts["op"] != "UPDATE":
        payload["op"] = facts["op"]
    if "schema" in facts:
        msg["schema"] = orjson.loads(facts["schema"])
    elif facts.get("primaryKey") == "none":
        msg["schema"] = {k: v for k, v in msg["schema"].items() if k != "primaryKey"}
    elif "primaryKey" in facts:
        msg["schema"] = {**msg["schema"], "primaryKey": orjson.loads(facts["primaryKey"])}
    for name in facts.get("nullImage", "").split(","):
        if name:
            payload[name] = None
    if "ddlNull" in facts:
        payload["ddl"] = None
    if "payloadExtra" in facts:
        payload.update(orjson.loads(facts["payloadExtra"]))
    if "extra" in facts:
        msg.update(orjson.loads(facts["extra"]))


def _before_facts(facts: dict) -> dict:
    """Facts of an update's before-half: the after-half's, overridden by `before.` keys."""
    out = {k: v for k, v in facts.items() if not k.startswith("before.")}
    for key, value in facts.items():
        if key.startswith("before."):
            if value == "default":
                out.pop(key[7:], None)
            else:
                out[key[7:]] = value
    return out


def _merge_update(before: dict, after: dict) -> dict:
    """One UPDATE message holding both images (restores a foreign message that came that way)."""
    payload = dict(after["payload"])
    payload = {"before": before["payload"]["before"], "after": payload["after"], **{
        k: v for k, v in payload.items() if k not in ("before", "after")}}
    payload["op"] = "UPDATE"
    msg = dict(after)
    msg["payload"] = payload
    before_unknown = (before.get("dts") or {}).get("unknown")
    if before_unknown:  # the before image's unknown fields join the after half's
        ext = after.get("dts") or before["dts"]
        msg["dts"] = {**ext, "unknown": {**before_unknown, **ext.get("unknown", {})}}
    return msg
