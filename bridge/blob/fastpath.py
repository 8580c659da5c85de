"""The encoder's C fast path for plain DML Entries (`FastPath._plain`): the row images read off
the Entry's bytes in C, and written as message dicts, as JSON lines from per-table templates, or
as the columns Spark writes; the same output as the dict path (tests/test_speedups.py).
`BlobEncoder` (bridge/blob/encode.py) is one.
"""
from __future__ import annotations

import orjson

from bridge.blob.extension import _DEFAULT_HEADER, _wire_header
from bridge.blob.facts import _NO_FACTS, _plain_properties
from bridge.blob.messages import _MAX_EVENT_TIME, _MIN_EVENT_TIME, _ROW_SCALE, _TableCodec
from bridge.blob.shape import FORMAT_VERSION
from bridge.native import speedups
from bridge.values import DML_IMAGES, DML_OPS, OP_IMAGES
from bridge.wire import subscribe_pb2 as pb

# DMLType -> the Blob payload keys of its messages' images (values.DML_IMAGES), as C's Plan.messages takes them
_IMAGE_KEYS = {dml_type: tuple(i.image for i in images) for dml_type, images in DML_IMAGES.items()}
_VERSION_BYTES = FORMAT_VERSION.encode()


class _WireTable:
    """What the C fast path keeps per column set and source: the codecs, the schema dict, and the
    JSON templates of the lines around each op's dataColumn."""

    __slots__ = ("table", "schema", "ext_columns_json", "key_indexes", "table_shard", "_templates")

    def __init__(self, table: _TableCodec, schema: dict) -> None:
        self.table = table
        self.schema = schema
        self.ext_columns_json = b",\"columns\":" + orjson.dumps(table.ext_columns)
        # shard_key: the primary-key columns' values, else "db.table"
        self.key_indexes = tuple(table.names.index(k) for k in table.primary_key)
        source = schema["source"]
        self.table_shard = f"{source.get('dbName', '')}.{source.get('tableName', '')}"
        self._templates: dict = {}

    def templates(self, dml_type: int) -> tuple[tuple, tuple]:
        """(pre, post) per op of the DML type: the bytes before and after its dataColumn JSON."""
        found = self._templates.get(dml_type)
        if found is None:
            head = b"{\"schema\":" + orjson.dumps(self.schema) + b",\"payload\":{"
            ops = DML_OPS[dml_type]
            pre = tuple(head + orjson.dumps(OP_IMAGES[op].image) + b":{\"dataColumn\":" for op in ops)
            post = tuple(b"},\"op\":" + orjson.dumps(op) + b",\"sequenceId\":\"" for op in ops)
            found = self._templates[dml_type] = (pre, post)
        return found


class FastPath:
    """The part of `BlobEncoder` that converts a plain DML Entry on its bytes in C; it uses the
    encoder's `options`, `_mode`, `_tables`, `_wire_tables`, `_source`, `_timestamp` and `_messages`."""

    def _wire_table(self, entry: pb.Entry, header: pb.Header, raw: bytes):
        """The C fast path's view of a plain DML Entry: (cache entry, dmlEventType, rows, header
        properties or None), or None.

        Plain: no DataHub facts among the header properties (the others travel in dts.header), no
        event or row properties, one dmlEvent and nothing else in the Event, 1 to 10**6 rows, and a
        column set the C plan covers."""
        scanned = speedups.scan(raw)  # under NATIVE only: bridge.native's wrappers are left out here
        if scanned is None:
            return None
        props = speedups.header_properties(raw)  # C reads them off the Entry's bytes; Python when not sure
        if props is False and (props := _plain_properties(header, self._mode == "plain")) is False:
            return None
        key, dml_type, nrows = scanned
        if not 0 < nrows <= _ROW_SCALE:
            return None
        slot = (key, header.sourceType, header.schemaName, header.tableName)
        cached = self._wire_tables.get(slot)
        if cached is None:
            table = self._tables.get(entry.event.dmlEvent.columns, slot[2:])
            if table.native is None or table.reserved and self._mode == "ask":
                return None
            if len(self._wire_tables) >= 1024:
                self._wire_tables.clear()
            source = self._source(header, _NO_FACTS)
            schema = {"dataColumn": table.schema_columns, "primaryKey": table.primary_key, "source": source}
            cached = self._wire_tables[slot] = _WireTable(table, schema)
        return cached, dml_type, nrows, props

    def _wire_stamp(self, header: pb.Header) -> dict:
        event_time = header.timestamp * 1000
        if _MIN_EVENT_TIME <= event_time <= _MAX_EVENT_TIME and not self.options.system_time:
            return {"eventTime": event_time, "checkpointTime": event_time}
        return self._timestamp(header, _NO_FACTS)

    def _plain(self, entry: pb.Entry, header: pb.Header, raw: bytes, form: str = "messages"):
        """The output of a plain DML Entry (`_wire_table`) in one of its forms, its row images read
        off the wire in C, or None (not plain, or an image C leaves to Python where the form has no
        Python half): the same as the dict path's (tests/test_speedups.py).

        "messages": the message dicts (C builds them when every image is plain, else
        `_messages` writes them around C's images); "lines": the JSON lines, written in C from
        per-table templates (the bytes orjson gives for the same dicts); "columns": the lines
        and shard keys as `convert_columns` gives them. Every form starts from the same layout:
        the table's cache entry, DML type, rows, timestamp and dts.header."""
        found = self._wire_table(entry, header, raw)
        if found is None:
            return None
        cached, dml_type, nrows, props = found
        table, native = cached.table, cached.table.native
        lossless = self.options.lossless
        if form == "messages":
            # C reads the timestamp and seqId off the Header's bytes (stamp None; not under system_time,
            # which stamps in Python) and, lossless, dts.header (given as (props,)), leaving the
            # extension out where the header is the default one and the table's columns say the rest
            quiet = table.plain_extension_redundant(nrows, _DEFAULT_HEADER) if lossless else None
            stamp = self._wire_stamp(header) if self.options.system_time else None
            seq_id = header.seqId if stamp is not None else 0
            out = native.messages(raw, dml_type, cached.schema, _IMAGE_KEYS[dml_type], DML_OPS[dml_type],
                                  str(seq_id).encode() if seq_id else b"", bool(seq_id), stamp, FORMAT_VERSION,
                                  (props,) if lossless else None, table.ext_columns, quiet, nrows)
            if out is not None:  # every image plain: C built the message dicts themselves
                return out
            images = native.rows(raw, dml_type)
            if images is None:
                return None
            stamp = self._wire_stamp(header)
            ext_base = {"header": _wire_header(header, props), "columns": table.ext_columns} if lossless else None
            return self._messages(entry, header, table, cached.schema, dml_type, 0, nrows, stamp, ext_base,
                                  images=images)
        ext_header = _wire_header(header, props) if lossless else None
        stamp, seq_id = self._wire_stamp(header), header.seqId
        args = self._lines_args(cached, dml_type, nrows, stamp, ext_header, raw, seq_id)
        lines = native.lines(*args, cached.key_indexes) if form == "columns" else native.lines(*args)
        if lines is None or form == "lines":
            return lines
        lines, shards = lines
        ops = DML_OPS[dml_type]
        source = cached.schema["source"]
        n, k = len(lines), len(ops)
        seq_base = seq_id * _ROW_SCALE
        seqs = [str(seq_base + i) for i in range(n // k)]
        if k > 1:  # an update's two messages share their row's sequenceId
            seqs = [seq for seq in seqs for _ in range(k)]
        fallback = cached.table_shard  # no key value: the table's name, as shard_key gives it
        return (seqs, list(ops) * (n // k), [source.get("dbName")] * n, [source.get("tableName")] * n,
                [shard or fallback for shard in shards], [stamp["eventTime"]] * n, lines)

    def _wire_layout(self, entry: pb.Entry, header: pb.Header, raw: bytes):
        """(the table's cache entry, dmlEventType, timestamp, the arguments of `Plan.lines`) of a plain
        DML Entry, or None: the layout `_plain` starts from, for the streamed pieces (`_pieces`)."""
        found = self._wire_table(entry, header, raw)
        if found is None:
            return None
        cached, dml_type, nrows, props = found
        ext_header = _wire_header(header, props) if self.options.lossless else None
        stamp = self._wire_stamp(header)
        return cached, dml_type, stamp, self._lines_args(cached, dml_type, nrows, stamp, ext_header, raw,
                                                         header.seqId)

    @staticmethod
    def _lines_args(cached: _WireTable, dml_type: int, nrows: int, stamp: dict, ext_header: dict | None,
                    raw: bytes, seq_id: int) -> tuple:
        """The arguments of `Plan.lines` for a plain DML Entry: the bytes around each dataColumn,
        sequenceId and row index, from the table's templates (`ext_header` None: strict)."""
        pre, post = cached.templates(dml_type)
        head = b"\",\"timestamp\":" + orjson.dumps(stamp) + b"},\"version\":\"" + _VERSION_BYTES + b"\""
        quiet_tail = head + b"}"
        if ext_header is not None:
            loud_tail = (head + b",\"dts\":{\"header\":" + orjson.dumps(ext_header)
                         + cached.ext_columns_json + b",\"row\":[")
            nrows_text = str(nrows).encode()
            # a redundant extension is left out, unless an image's values need one after all
            quiet = cached.table.plain_extension_redundant(nrows, ext_header)
            post_seq = (quiet_tail, loud_tail) if quiet else loud_tail
        else:
            post_seq, nrows_text = quiet_tail, None
        return (raw, dml_type, pre, post, str(seq_id).encode() if seq_id else b"", bool(seq_id), post_seq, nrows_text)
