"""Blob messages -> the parts of their Entries (`EntryBuilder`): a non-DML message's Entry
(`_feed`), a DML message's Entry and row (`_dml`, which hands the row to `BlobDecoder._complete`),
and the parts they are built from (header, schema.source, sequenceId, the shape facts, the column
set, a row image). `BlobDecoder` (bridge/blob/decode.py) is one.
"""
from __future__ import annotations

import orjson

from bridge.blob.extension import (
    _ABSENT_KEYS,
    _ABSENT_PARTS,
    _BOOL_FIELDS,
    _COLUMNS_KEYS,
    _DML_EVENT_KEYS,
    _DML_EXTENSION_KEYS,
    _ONE_ROW,
    _add_kv,
    _check_extension,
    _check_row_patches,
    _pairs,
    _patch,
    _set_field,
    _unknown_patches,
)
from bridge.blob.facts import _add_facts, _ext_header_reserved
from bridge.blob.rows import native_plan
from bridge.blob.shape import (
    _HALF_OF_OP,
    _IMAGE_FIELDS,
    _IMAGES_OF_OP,
    _KNOWN_PAYLOAD,
    _KNOWN_PAYLOAD_SET,
    _KNOWN_TOP,
    _KNOWN_TOP_SET,
    DML_TYPE_BY_OP,
    FORMAT_VERSION,
    MESSAGE_TYPE_BY_OP,
    _usual_shape,
    check_shape,
    images_of,
)
from bridge.errors import BlobFormatError, BridgeError
from bridge.values import (
    EVENT_FIELDS,
    FOREIGN_COLUMN_TYPES,
    OPS_BY_MESSAGE_TYPE,
    RESERVED_PREFIX,
    SOURCE_TYPES,
    SOURCE_TYPES_BY_NAME,
    codec_for,
    column_is_boolean,
    ddl_op,
    raw_to_data,
    seq_id_of,
    sequence_id,
)
from bridge.wire import subscribe_pb2 as pb

_ABSENT = object()
_UPDATE = int(pb.UPDATE)
_DML = int(pb.DML)
_NIL_DATA = pb.Data(dataType=pb.NIL)  # copied by extend, so one instance serves every row
_NA_DATA = pb.Data(dataType=pb.NA)
_RESERVED_FLAG = ""  # (a key no fact has) in a column set's facts: a column's own reserved-prefix property


_INDEX_KEYS: dict[int, frozenset] = {}


def _index_keys(n: int) -> frozenset:
    keys = _INDEX_KEYS.get(n)
    if keys is None:
        keys = _INDEX_KEYS[n] = frozenset(str(i) for i in range(n))
    return keys


class EntryBuilder:
    """The part of `BlobDecoder` that builds Entries from messages; it uses the decoder's `options`,
    `_native`, `_pairing`, its caches (`_column_sets`, `_sources`, `_schema_value`, `_schema_known`),
    the per-message `_reserved`, and `_complete`, `_check_facts`, `_check_plain`."""

    # -- a message -> its Entry, or its row ---------------------------------------------------------------------------
    def _feed(self, msg: dict, checked: bool) -> list[pb.Entry]:
        self._reserved = False
        pairing = self._pairing
        if pairing.lane_halves or pairing.lane_events:  # what the lane holds joins the Python state first
            pairing.unassemble()
        if not checked:
            check_shape(msg)
        payload = msg["payload"]
        op = payload["op"]
        ext = msg.get("dts") if self.options.lossless else None
        if ext is not None and not isinstance(ext, dict):
            raise BlobFormatError("the 'dts' extension must be an object", value=ext)
        mtype = MESSAGE_TYPE_BY_OP[op]
        if ext and (mtype != _DML or not ext.keys() <= _DML_EXTENSION_KEYS or None in ext.values()):
            _check_extension(ext, mtype == _DML)  # (a DML message's parts are checked where read)
        if mtype == pb.DML:
            return self._dml(msg, payload, op, ext)
        entry = pb.Entry()
        header = entry.header
        seq = payload.get("sequenceId")
        facts: dict = {}
        if OPS_BY_MESSAGE_TYPE.get(mtype) not in (None, op):
            facts["op"] = op  # XACOMMIT travels as a COMMIT
        self._header(header, msg, payload, mtype, ext, facts, with_source=mtype == pb.DDL)
        sub = getattr(entry.event, EVENT_FIELDS[mtype])
        event = (ext or {}).get("event") or {}
        absent = event.get("absent") if event else None
        if absent is None:
            sub.SetInParent()
        elif absent not in _ABSENT_PARTS or event.keys() - _ABSENT_KEYS[absent]:
            raise BlobFormatError("the 'dts' extension's event.absent is \"sub\" (the Event holds no "
                                  f"{EVENT_FIELDS[mtype]}: nothing of it travels) or \"event\" (no Event at all)",
                                  value=event)
        elif absent == "sub":
            entry.event.SetInParent()
        for key, value in event.items():
            if key == "properties":
                _add_kv(entry.event.properties, value)
            elif key != "absent":
                _set_field(sub, key, value)
        if mtype == pb.DDL:
            ddl = payload.get("ddl")
            if not isinstance(ddl, dict) or not isinstance(ddl.get("text"), str):
                raise BlobFormatError("a DDL message needs payload.ddl.text", value=ddl)
            if absent is None:
                sub.sql = ddl["text"]
            elif ddl["text"]:
                raise BlobFormatError("a DDL message whose extension says its Event holds no ddlEvent has no "
                                      "statement", value=ddl)
            if "ddlMeta" in ddl:
                facts["ddlMeta"] = ddl["ddlMeta"]
            if ddl_op(sub.sql) != op:
                facts["op"] = op
            expected_schema = {"source": None}
        else:
            expected_schema = {}
        schema = msg.get("schema", None)
        if mtype != pb.DDL and schema != expected_schema:
            facts["schema"] = orjson.dumps(schema).decode()
        elif mtype == pb.DDL and set((schema or {}).keys()) != {"source"}:
            facts["schema"] = orjson.dumps(schema).decode()
        self._sequence(header, seq, 0, ext, facts)
        self._shape_facts(msg, payload, facts, ddl_extra=mtype != pb.DDL)
        if self._reserved:
            self._check_facts(facts)
        if self.options.lossless:
            _add_facts(header.properties, facts)
        unknown = ext.get("unknown") if ext else None
        if unknown:
            once, rows, _ = _unknown_patches(unknown)
            if rows:
                raise BlobFormatError("the 'dts' extension's unknown fields name a row; only a DML message has one",
                                      value=sorted(unknown))
            _patch(entry, once)
        return self._check_plain([entry])

    def _dml(self, msg: dict, payload: dict, op: str, ext) -> list[pb.Entry]:
        schema = msg.get("schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("dataColumn"), list):
            raise BlobFormatError("a DML message needs schema.dataColumn", value=schema)
        seq = payload["sequenceId"]
        entry = pb.Entry()
        header = entry.header
        facts: dict = {}
        self._header(header, msg, payload, pb.DML, ext, facts, with_source=True)
        dml = entry.event.dmlEvent
        codecs, names, plan, columns_key = self._columns(dml, schema, ext, facts)  # copies the columns in first
        dml.dmlEventType = DML_TYPE_BY_OP[op]
        event_ext = ext.get("event") if ext else None
        if event_ext is not None:
            if type(event_ext) is not dict or not event_ext.keys() <= _DML_EVENT_KEYS:
                raise BlobFormatError("the 'dts' extension's event of a DML message holds only properties",
                                      value=event_ext)
            _add_kv(entry.event.properties, event_ext.get("properties", []))
        unknown = ext.get("unknown") if ext else None
        once = below = unknown_key = None
        if unknown:  # the Entry's own now (compared below as the halves' and rows' key), the row's once built
            once, below, unknown_key = _unknown_patches(unknown)
            _patch(entry, once)
        row = ext.get("row", _ONE_ROW) if ext else _ONE_ROW
        if (type(row) is not list and row is not _ONE_ROW or len(row) != 2 or type(row[0]) is not int
                or type(row[1]) is not int or not 0 <= row[0] < row[1]):
            raise BlobFormatError("the 'dts' extension's row must be [index, count]", value=row)
        row_index, nrows = row
        self._sequence(header, seq, row_index, ext, facts)
        self._shape_facts(msg, payload, facts, ddl_extra=True)
        half = _HALF_OF_OP.get(op, "both")
        partner = self._pairing.partner(seq, half, entry, columns_key, unknown_key) if half != "both" else None
        row_properties = ext.get("rowProperties") if ext else None
        properties = [pb.KVPair(key=k, value=v) for k, v in _pairs(row_properties)] if row_properties is not None \
            else ()
        if properties and any(p.key.startswith(RESERVED_PREFIX) for p in properties):
            self._reserved = True
        if below:  # checked before a waiting half's row is touched
            _check_row_patches(below, half, images_of(op), ext.get("image") is None, len(names), len(properties))
        if partner is None:  # (a constructor with keywords costs three times one without)
            row = pb.RowChange(properties=properties) if properties else pb.RowChange()
        else:
            row = partner[0].row  # the waiting half's row takes this half's image: no copy of either
        images = images_of(op)
        raws, charsets = (ext.get("values"), ext.get("charsets")) if ext else (None, None)
        if raws is not None and type(raws) is not dict or charsets is not None and type(charsets) is not dict:
            raise BlobFormatError("the 'dts' extension's values and charsets are objects", value=[raws, charsets])
        for image in images:
            self._image(row, image, payload, codecs, names, ext, plan, raws, charsets)
        if op == "UPDATE":
            facts["op"] = "UPDATE"
        if partner is not None and half == "after":  # the joined row keeps the after half's properties
            del row.properties[:]
            row.properties.extend(properties)
        if below:
            _patch(row, below)
        return self._complete(seq, half, entry, row, facts, partner, ext, row_index, nrows, columns_key, unknown_key)

    # -- parts ---------------------------------------------------------------------------------
    def _header(self, header, msg, payload, mtype, ext, facts, with_source) -> None:
        header.messageType = mtype
        fields = ext.get("header") if ext else None
        if fields is not None and type(fields) is not dict:  # (null: the `_check_extension` gate)
            raise BlobFormatError("the 'dts' extension's 'header' is not what the bridge writes", value=fields)
        if fields:
            if "properties" in fields:
                for key, value in fields.items():
                    if key == "properties":
                        _add_kv(header.properties, value)
                        if _ext_header_reserved(fields):
                            self._reserved = True
                    else:
                        _set_field(header, key, value)
            elif _BOOL_FIELDS.isdisjoint(fields):  # (the usual header: no bool field to check)
                for key, value in fields.items():
                    setattr(header, key, value)
            else:
                for key, value in fields.items():
                    _set_field(header, key, value)
        elif not ext:
            header.version = 1
            if not with_source:
                header.sourceType = pb.MYSQL
        stamp = payload["timestamp"]
        event_time = stamp["eventTime"]
        if event_time < 0:
            raise BlobFormatError("eventTime before 1970 has no DTS timestamp", value=event_time)
        # A uint32 of seconds ends in 2106; a later eventTime travels whole as a fact.
        header.timestamp = min(event_time // 1000, (1 << 32) - 1)
        if event_time % 1000 or event_time // 1000 != header.timestamp:
            facts["eventTime"] = str(event_time)
        if "systemTime" in stamp:
            facts["systemTime"] = str(stamp["systemTime"])
        if "checkpointTime" not in stamp:
            facts["checkpointTime"] = "none"
        elif stamp["checkpointTime"] != event_time:
            facts["checkpointTime"] = str(stamp["checkpointTime"])
        if with_source:
            source = (msg.get("schema") or {}).get("source")
            if not isinstance(source, dict):
                raise BlobFormatError("schema.source must be an object", value=source)
            shared = msg.get("schema") is self._schema_value  # a schema feed_line shares
            known = self._schema_known.get("source") if shared else None
            try:  # the JSON text as the key: True and 1, 1.0 and 1 stay apart
                key = None if known is not None else orjson.dumps(source)
                if key is not None:
                    known = self._sources.get(key)
            except TypeError:  # a value JSON cannot hold (a dict built in Python): not cached
                key, known = None, None
            if known is None:
                known = self._source_fields(source)
                if key is not None:
                    if len(self._sources) > 4096:
                        self._sources.clear()
                    self._sources[key] = known
            if shared:
                self._schema_known["source"] = known
            header.sourceType, header.schemaName, header.tableName = known[0]
            facts.update(known[1])

    def _source_fields(self, source: dict) -> tuple[tuple, dict]:
        """((sourceType, schemaName, tableName), facts) of a schema.source object."""
        facts = {}
        db_type = source.get("dbType")
        source_type = SOURCE_TYPES_BY_NAME.get(str(db_type).lower())
        source_type = pb.MYSQL if source_type is None else source_type
        schema_name = str(source.get("dbName") or "")
        table_name = str(source.get("tableName") or "")
        version = source.get("dbVersion", "")
        if not isinstance(version, str):
            raise BlobFormatError("schema.source.dbVersion must be a string", value=version)
        if version != self.options.db_version:
            facts["dbVersion"] = version
        expected = {"dbType": SOURCE_TYPES[source_type]}
        if version:
            expected["dbVersion"] = version
        expected.update(dbName=schema_name, schemaName=schema_name, tableName=table_name)
        if source != expected or list(source) != list(expected):
            facts["source"] = orjson.dumps(source).decode()
        return (source_type, schema_name, table_name), facts

    def _sequence(self, header, seq: str | None, row_index: int, ext, facts) -> None:
        if seq is None:
            facts["sequenceId"] = "none"
            return
        seq_id = seq_id_of(int(seq))  # (the Entry the shard merge's entry_group groups its rows into)
        header.seqId = seq_id
        if sequence_id(seq_id, row_index) != seq:
            facts["sequenceId"] = seq

    def _shape_facts(self, msg, payload, facts, ddl_extra: bool) -> None:
        """Facts for what the message holds beyond what its Entry says: a version other than
        ours, unknown keys, a `ddl` where the op has none (`ddl_extra`), images the op does not
        read, null images. Every extra payload key goes into one `payloadExtra`."""
        if _usual_shape(msg, payload, payload["op"]):
            return
        version = msg.get("version", None)
        if version is None and "version" not in msg:
            facts["version"] = "none"
        elif version != FORMAT_VERSION:
            if not isinstance(version, str):
                raise BlobFormatError("version must be a string", value=version)
            facts["version"] = version
        if not msg.keys() <= _KNOWN_TOP_SET:
            extra = {k: v for k, v in msg.items() if k not in _KNOWN_TOP}
            facts["extra"] = orjson.dumps(extra).decode()
        pextra = {} if payload.keys() <= _KNOWN_PAYLOAD_SET else {
            k: v for k, v in payload.items() if k not in _KNOWN_PAYLOAD}
        if ddl_extra and "ddl" in payload:
            if payload["ddl"] is None:
                facts["ddlNull"] = "1"
            else:
                pextra["ddl"] = payload["ddl"]
        used = _IMAGES_OF_OP.get(payload.get("op"), ())
        for key in ("before", "after"):  # an image the op has no use for travels as it came
            if key not in used and payload.get(key) is not None:
                pextra[key] = payload[key]
        if pextra:
            facts["payloadExtra"] = orjson.dumps(pextra).decode()
        if payload.get("before", 0) is None or payload.get("after", 0) is None:
            facts["nullImage"] = ",".join(k for k in ("before", "after") if k in payload and payload[k] is None)

    def _columns(self, dml, schema, ext, facts):
        """Columns of the DML event, codecs and names; built once per column set and reused."""
        columns_ext = ext.get("columns") if ext else None
        try:  # two JSON texts one after the other: the schema's columns, the extension's
            if schema is self._schema_value:
                own = self._schema_known.get("columns")
                if own is None:
                    own = self._schema_known["columns"] = orjson.dumps([schema["dataColumn"],
                                                                        schema.get("primaryKey", False)])
            else:
                own = orjson.dumps([schema["dataColumn"], schema.get("primaryKey", False)])
            key = own + orjson.dumps(columns_ext)
        except (TypeError, orjson.JSONEncodeError):
            key = None
        cached = self._column_sets.get(key) if key is not None else None
        if cached is None:
            template = pb.DMLEvent()
            table_facts: dict = {}
            codecs, names = self._build_columns(template, schema, ext, table_facts)
            plan = native_plan(names, codecs, self.options.timezone == "UTC") if self._native else None
            cached = (template, codecs, names, table_facts, plan, key, template.SerializeToString())
            if key is not None:
                if len(self._column_sets) > 4096:
                    self._column_sets.clear()
                self._column_sets[key] = cached
        template, codecs, names, table_facts, plan, key, _ = cached
        dml.CopyFrom(template)  # several times faster than extending the repeated field
        if _RESERVED_FLAG in table_facts:
            self._reserved = True
            table_facts = {k: v for k, v in table_facts.items() if k != _RESERVED_FLAG}
        facts.update(table_facts)
        return codecs, names, plan, key

    def _build_columns(self, dml, schema, ext, facts):
        cols = schema["dataColumn"]
        columns_ext = ext.get("columns") if ext else None
        if columns_ext is not None and (type(columns_ext) is not dict or type(columns_ext.get("types")) is not list
                                        or not columns_ext.keys() <= _COLUMNS_KEYS):
            raise BlobFormatError("the 'dts' extension's columns hold types (a list) and properties",
                                  value=columns_ext)
        types = columns_ext["types"] if columns_ext is not None else None
        props = columns_ext.get("properties", {}) if columns_ext is not None else {}
        pkey = schema.get("primaryKey")
        pkey = [] if pkey is None else pkey  # null: no key columns, and a fact keeps the null
        if not isinstance(pkey, list):
            raise BlobFormatError("schema.primaryKey must be a list", value=pkey)
        if types is not None and len(types) != len(cols):
            raise BlobFormatError("the extension's column types do not match schema.dataColumn", value=types)
        names, codecs = [], []
        for i, col in enumerate(cols):
            if not isinstance(col, dict) or not isinstance(col.get("name"), str):
                raise BlobFormatError("schema.dataColumn entries need a name", value=col)
            column = dml.columns.add(name=col["name"], isKey=col["name"] in pkey)
            if types is not None:
                column.originalType = types[i]
                _add_kv(column.properties, props.get(str(i), []))
            else:
                mapped = FOREIGN_COLUMN_TYPES.get(col.get("type"))
                if mapped is None:
                    raise BlobFormatError("unknown Blob column type", value=col.get("type"), column=col["name"])
                column.originalType = mapped[0]
                for key, value in mapped[1]:
                    column.properties.add(key=key, value=value)
            codec = codec_for(column, self.options)
            if types is not None and codec.blob_type != col.get("type") and column_is_boolean(column):
                # the extension's own `datahub:type` property on a column DataHub does not call
                # BOOLEAN: the Entry's property, not the bridge's marker (`facts_hold` decides)
                codec = codec_for(column, self.options, facts=False)
                facts[_RESERVED_FLAG] = True
            if not self.options.lossless:
                # strict: no reserved properties; a BOOLEAN column stays tinyint(1) holding 0/1
                kept = [p for p in column.properties if not p.key.startswith(RESERVED_PREFIX)]
                del column.properties[:]
                column.properties.extend(kept)
            if codec.blob_type != col.get("type"):
                raise BlobFormatError(f"column type {col.get('type')} does not match {column.originalType}",
                                      column=col["name"])
            names.append(col["name"])
            codecs.append(codec)
        if "primaryKey" not in schema:
            facts["primaryKey"] = "none"
        elif schema["primaryKey"] is None or pkey != [n for n in names if n in pkey]:
            facts["primaryKey"] = orjson.dumps(schema["primaryKey"]).decode()
        return codecs, names

    def _image(self, row, image, payload, codecs, names, ext, plan, raws, charsets) -> None:
        """Add one image's Data to `row`. `plan`: the C encoder of the column set (None: Python
        only), which takes the extension's raw Data and charsets too; `raws` and `charsets`: the
        extension's `values` and `charsets` (dicts or None, checked by _dml)."""
        body = payload.get(image)
        if not isinstance(body, dict) or not isinstance(body.get("dataColumn"), dict):
            raise BlobFormatError(f"payload.{image}.dataColumn must be an object", value=body)
        values = body["dataColumn"]
        image_ext = ext.get("image") if ext else None
        if image_ext is not None:
            if image_ext != "empty":
                raise BlobFormatError("the 'dts' extension's image can only be \"empty\"", value=image_ext)
            return
        if plan is not None:
            wire = plan.encode(values, _IMAGE_FIELDS[image][1], raws, charsets)
            if wire is not None:  # else the codecs below decide (and name what is wrong)
                row.MergeFromString(wire)
                return
        target = getattr(row, _IMAGE_FIELDS[image][0])
        unknown = set(values) - set(names)
        if unknown:
            raise BlobFormatError("image names columns not in schema.dataColumn", value=sorted(unknown))
        for by_index in (raws, charsets):  # keyed by column index: one that no column has is no value
            if by_index and not by_index.keys() <= _index_keys(len(names)):
                raise BlobFormatError("the 'dts' extension names a column index the message does not have",
                                      value=sorted(by_index))
        out = []
        get = values.get
        for i, name in enumerate(names):
            if raws and str(i) in raws:
                out.append(raw_to_data(raws[str(i)]))
                continue
            value = get(name, _ABSENT)
            if value is None:
                out.append(_NIL_DATA)
            elif value is _ABSENT:
                out.append(_NA_DATA)
            else:
                try:
                    own = codecs[i].charset or ""  # a value's charset when dts.charsets names none
                    out.append(codecs[i].from_blob(value, charsets.get(str(i), own) if charsets else own))
                except BridgeError as exc:
                    raise exc.located(column=name)
        target.extend(out)
