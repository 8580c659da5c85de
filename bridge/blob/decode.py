"""DataHub Blob messages -> DTS Entries (docs/mapping.md).

Messages written by the bridge carry the `"dts"` extension and rebuild their Entries exactly:
the rows of one DML event are regrouped, BEGIN/COMMIT/DDL/heartbeat/checkpoint/rollback entries
come back with every header field. Foreign messages (e.g. written by DataWorks) get the
documented DTS types of their Blob types, and whatever DataHub says that DTS cannot (millisecond
eventTime, systemTime, checkpointTime, ddlMeta, version, dbVersion, BOOLEAN, the sequenceId)
travels in `properties` under the reserved prefix `datahub:`, so Blob -> DTS -> Blob is exact.

Update halves are paired by sequenceId. A half whose partner has not come within `max_pending`
messages, or by the end of input, is reported (ConversionError naming its sequenceId), never
dropped silently.

>>> msg = decode_blob(b'{"schema":{},"payload":{"op":"MHEARTBEAT","sequenceId":"9000000",'
...                   b'"timestamp":{"eventTime":1605339932000,"checkpointTime":1605339932000}},"version":"0.0.1"}')
>>> [(e.header.messageType == pb.HEARTBEAT, e.header.seqId, e.header.timestamp) for e in blob_to_entries([msg])]
[(True, 9, 1605339932)]
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import orjson

from bridge.blob.entries import EntryBuilder
from bridge.blob.facts import _add_facts, _ext_header_reserved, facts_hold, read_back_with
from bridge.blob.pairing import Pairing
from bridge.blob.shape import (
    _HALF_OF_OP,
    _IMAGE_FIELDS,
    ALL_OPS,
    DML_OP_NAMES,
    DML_TYPE_BY_OP,
    MESSAGE_TYPE_BY_OP,
    _seq_of,
    _usual_shape,
    check_line,
    check_shape,
    decode_blob,
    images_of,
)
from bridge.errors import BlobFormatError, BridgeError, ConversionError, OptionsError
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.values import FOREIGN_COLUMN_TYPES, OP_IMAGES
from bridge.wire import subscribe_pb2 as pb

# the public names of the Blob decoder, where they have always been imported from (the line checks
# and op tables live in bridge/blob/shape.py)
__all__ = ["decode_blob", "blob_to_entries", "BlobDecoder", "FOREIGN_COLUMN_TYPES", "ALL_OPS", "MESSAGE_TYPE_BY_OP",
           "DML_TYPE_BY_OP", "DML_OP_NAMES", "check_line", "check_shape", "images_of"]

_UPDATE = int(pb.UPDATE)
# the lane's ops (one image each): op -> (image, its RowChange field number, DMLType)
_LANE_IMAGES = {op: (i.image, _IMAGE_FIELDS[i.image][1], i.dml_type) for op, i in OP_IMAGES.items()}
_LANE_EXTENSION_KEYS = frozenset(("header", "columns", "row", "charsets", "values"))
_ENTRY_FROM, _ROW_FROM = pb.Entry.FromString, pb.RowChange.FromString


class BlobDecoder(EntryBuilder):
    """Stream-level Blob -> DTS converter: `feed` messages, collect Entries; `finish` at end of input.

    bridge/blob/shape.py checks a line before it is parsed and a message's envelope,
    bridge/blob/entries.py (`EntryBuilder`) builds Entries and rows from messages,
    bridge/blob/pairing.py (`Pairing`) holds the update halves and events' rows waiting for their
    partners, the lane's (bytes) and the Python path's; this class feeds lines and messages
    through them, and takes the usual DML line in one C call (`_lane`)."""

    def __init__(self, options: Options = DEFAULT_OPTIONS, max_pending: int = 100_000) -> None:
        if type(max_pending) is not int or max_pending < 1:
            raise OptionsError(f"max_pending = {max_pending!r}: the update halves waiting for their partner, "
                               "a whole number of at least 1")
        self.options = options
        # the update halves and the events' rows waiting for their partners, the lane's and the
        # Python path's, and what was lost from them (`evicted`)
        self._pairing = Pairing(max_pending)
        self.messages = 0
        self.entries = 0
        self._line: int | None = None
        self._column_sets: dict = {}  # JSON of (dataColumn, primaryKey, dts.columns) -> built columns
        self._native = True  # the C image encoder where it applies (tests switch it off to compare)
        self._lane_last: tuple | None = None  # _lane's last column set and the JSON texts naming it
        self._sources: dict = {}  # schema.source JSON -> ((sourceType, schemaName, tableName), facts)
        self._schema_prefix: bytes | None = None  # b'{"schema":<JSON>,' of the last line parsed whole
        self._schema_value: dict | None = None  # and its schema, shared by the lines that repeat it
        self._schema_known: dict = {}  # what is cached for that schema object ("columns", "source")
        # the message being read holds reserved-prefix properties in its extension (or its Entry's
        # other messages did): its Entry is checked against the encoder's reading (`_check_plain`)
        self._reserved = False
        self._check_reserved = True  # (False in `facts_hold`'s own decoder)

    def feed_line(self, data: bytes | str, *, line: int | None = None, source: str | None = None
                  ) -> list[pb.Entry]:
        """`feed(decode_blob(data))`: what the stream layer and Spark call for each line.

        Messages of one table repeat their schema byte for byte, so a line that begins with the
        same `{"schema":...,` bytes as the last one parsed whole has only the rest parsed, shares
        that schema object (never seen outside the decoder, never changed) and the facts cached
        for it (a second "schema" key later in the line still wins, as in JSON). A line whose
        rest does not parse so is parsed whole, as `decode_blob` does (errors name the same line
        and column). A line over `options.max_line_bytes`, or one that is no JSON object, is an
        error before any parse (`check_line`): what one line costs is bounded here as well as by
        the readers that split lines."""
        check_line(data, self.options.max_line_bytes, line=line, source=source)
        prefix = self._schema_prefix
        if prefix is not None and type(data) is bytes and data.startswith(prefix):
            try:
                rest = orjson.loads(b"{" + data[len(prefix):])
            except orjson.JSONDecodeError:
                rest = None  # parsed whole below, for the error's position
            if type(rest) is dict and rest:  # `{"schema":..., }` is no JSON, though `{ }` is
                if self._native:  # the usual DML message: one C call (what `feed` does, in short)
                    payload = rest.get("payload")
                    ext = rest.get("dts") if self.options.lossless else None
                    if type(payload) is dict and (ext is None or type(ext) is dict):
                        self._line = line
                        try:
                            out = self._lane(rest, payload, payload.get("op"), ext)
                        except BridgeError as exc:
                            raise exc.located(line=line, sequence_id=_seq_of(rest))
                        if out is not None:
                            self.messages += 1
                            self.entries += len(out)
                            return out
                msg = {"schema": self._schema_value}
                msg.update(rest)
                check_shape(msg, line=line, source=source)
                return self.feed(msg, line=line, checked=True)
        msg = decode_blob(data, line=line, source=source)
        schema = msg.get("schema")
        if type(data) is bytes and type(schema) is dict and data.startswith(b'{"schema":{'):
            try:
                prefix = b'{"schema":' + orjson.dumps(schema) + b","
            except TypeError:
                prefix = None
            if prefix is not None and data.startswith(prefix):
                self._schema_prefix, self._schema_value, self._schema_known = prefix, schema, {}
        return self.feed(msg, line=line, checked=True)

    def feed(self, msg: dict, *, line: int | None = None, checked: bool = False) -> list[pb.Entry]:
        """Entries completed by this message; `checked`: `decode_blob` already checked its shape."""
        self._line = line
        try:
            out = self._feed(msg, checked)
        except BridgeError as exc:
            raise exc.located(line=line, sequence_id=_seq_of(msg))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise BlobFormatError(f"malformed Blob message ({type(exc).__name__}: {exc})",
                                  line=line, sequence_id=_seq_of(msg)) from None
        self.messages += 1
        self.entries += len(out)
        return out


    @property
    def pending(self) -> int:
        return self._pairing.pending

    @property
    def pending_messages(self) -> int:
        """Messages fed but not yet part of a returned Entry (update halves, rows of open events)."""
        return self._pairing.pending

    @property
    def max_pending(self) -> int:
        return self._pairing.max_pending

    @property
    def evicted(self) -> list[ConversionError]:
        """Errors for the update halves pushed out of the pairing window and the messages lost with
        a rejected one (`Pairing.evicted`): the caller reports them and clears the list."""
        return self._pairing.evicted

    def finish(self) -> list[ConversionError]:
        """Errors for every update half or partial event still waiting at end of input."""
        return self._pairing.finish()

    # -- a message's row -> its Entry ------------------------------------------------------------
    def _complete(self, seq, half, entry, row, facts, partner, ext, row_index, nrows, columns_key,
                  unknown_key=None) -> list[pb.Entry]:
        """A message's row, its images in: an update half meets its partner (or waits), the facts
        go into the row (lossless), and the row completes its Entry, or its event (`Pairing.regroup`)."""
        if partner is not None and partner[0].reserved:
            self._reserved = True
        if self._reserved:
            self._check_facts(facts)
        pairing = self._pairing
        pairing.completed = 0
        if half != "both":
            row, facts, done = pairing.pair(seq, half, row, facts, entry, partner, columns_key, unknown_key,
                                            self._line, self._reserved)
            if not done:
                return []
        try:
            if self._reserved and half != "both":
                self._check_facts(facts)
            if facts and self.options.lossless:
                _add_facts(row.properties, facts)
            if not ext or nrows == 1:  # (`entry`, not a DMLEvent held before: a before half that completes
                # its update has had the waiting after half's Entry copied into `entry`)
                entry.event.dmlEvent.rows.append(row)
                return self._check_plain([entry])
            event = pairing.regroup(entry, row, row_index, nrows, columns_key, unknown_key, self._reserved)
            if event is None:
                return []
            self._reserved = event.reserved
            return self._check_plain([event.entry])
        except BridgeError:
            pairing.lost(seq, self._line)
            raise

    def _check_facts(self, facts: dict) -> None:
        """A message whose extension holds reserved-prefix properties (the Entry's own: the bridge
        writes its facts nowhere else than outside the extension) and that needs DataHub facts as
        well is no message the bridge writes: its Entry would mix the two kinds, which no
        conversion back could tell apart."""
        if facts and self._check_reserved:
            raise ConversionError("the 'dts' extension holds reserved-prefix (datahub:) properties, and the "
                                  f"message needs DataHub facts besides ({', '.join(sorted(facts))}): "
                                  "no message the bridge writes")

    def _check_plain(self, out: list) -> list:
        """Entries whose messages' extensions held reserved-prefix properties: the bridge writes
        those only for an Entry whose such properties do not read as its DataHub facts
        (`facts_hold`); an Entry that would read so would come back as another message."""
        if self._reserved and self._check_reserved:
            for entry in out:
                if facts_hold(entry, None, self.options, BlobDecoder):
                    raise ConversionError("the 'dts' extension holds reserved-prefix (datahub:) properties that "
                                          "read as DataHub facts of the bridge's own: no message the bridge writes")
        return out

    def _lane(self, rest: dict, payload: dict, op: str, ext) -> list[pb.Entry] | None:
        """The usual DML message in one C call (`Plan.lane`), for `feed_line` before any other
        check (it takes only messages `check_shape` and `_feed` pass): a line of a table whose schema,
        source and column set were seen before and need no fact, one image, our version, no key
        beyond what the encoder writes, and no extension part but header, columns, row, charsets
        and values. C builds the Entry (without rows) and the row, or returns None wherever the
        message needs a fact or holds a value it leaves to the codecs; then this returns None and
        `feed_line` goes on as for any line (`check_shape`, `feed`). `rest`: the line's keys but the
        shared schema. The halves of an update and the rows of one event meet in `Pairing`: on bytes
        (`Pairing.assemble`) while it holds nothing in Python, else as they do in `_dml`."""
        self._reserved = False
        lane = _LANE_IMAGES.get(op) if type(op) is str else None  # (an op of any JSON type: check_shape's)
        if ext and _ext_header_reserved(ext.get("header")):
            return None  # reserved-prefix properties of the Entry's own: `_feed` checks them
        if (lane is None or "schema" in rest or not _usual_shape(rest, payload, op)
                or (ext and (not ext.keys() <= _LANE_EXTENSION_KEYS or None in ext.values()))):
            return None
        known = self._schema_known
        source, own = known.get("source"), known.get("columns")
        if source is None or source[1] or own is None:
            return None
        try:
            columns_json = orjson.dumps(ext.get("columns") if ext else None)
        except (TypeError, orjson.JSONEncodeError):
            return None
        last = self._lane_last  # (schema JSON, columns JSON, column set) of the last line taken
        if last is not None and last[0] is own and last[1] == columns_json:
            cached = last[2]
        else:
            cached = self._column_sets.get(own + columns_json)
            if cached is None or cached[3] or cached[4] is None:  # table facts, or no C plan
                return None
            self._lane_last = (own, columns_json, cached)
        columns_key = cached[5]
        got = cached[4].lane(payload, ext, lane[0], lane[1], source[0], lane[2], cached[6])
        if got is None:
            return None
        entry_bytes, row_bytes, row_index, nrows = got
        seq = payload["sequenceId"]
        half = _HALF_OF_OP.get(op, "both")
        pairing = self._pairing
        out = pairing.assemble(entry_bytes, row_bytes, row_index, nrows, seq, half, columns_key, bool(ext),
                               lane[2] == _UPDATE, self._line)
        if out is not None:  # held or completed on bytes
            return out
        entry = _ENTRY_FROM(entry_bytes)  # (what the lane held is in the Python state now)
        partner = pairing.partner(seq, half, entry, columns_key) if half != "both" else None
        if partner is None:
            row = _ROW_FROM(row_bytes)
        else:
            row = partner[0].row  # the waiting half's row takes this half's image
            row.MergeFromString(row_bytes)
            if half == "after":  # the joined row keeps the after half's properties: none
                del row.properties[:]
        return self._complete(seq, half, entry, row, {}, partner, ext, row_index, nrows, columns_key)


read_back_with(BlobDecoder)  # facts_hold's decoder (bridge.blob.facts cannot import this module)


def blob_to_entries(messages: Iterable[dict], options: Options = DEFAULT_OPTIONS) -> Iterator[pb.Entry]:
    """Entries rebuilt from a stream of Blob message dicts; unpaired halves raise at the end."""
    decoder = BlobDecoder(options)
    for msg in messages:
        yield from decoder.feed(msg)
    errors = decoder.finish()
    if errors:
        raise errors[0]
