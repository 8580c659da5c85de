"""Blob lines and messages before they are converted: a line's size and kind (`check_line`), its
parse (`decode_blob`), the envelope shape every converter relies on (`check_shape`), and the op
tables the decoder reads a message by (the ops a message may carry, the images each reads, the
half of an update each carries). The JSON Schema (bridge/blob/blob.schema.json) says the rest.
"""
from __future__ import annotations

import orjson

from bridge.errors import BlobFormatError, LineTooLongError
from bridge.native.contract import PROTO_FIELDS
from bridge.values import DDL_OP_NAMES, DML_IMAGES, OP_IMAGES, OPS_BY_MESSAGE_TYPE
from bridge.wire import subscribe_pb2 as pb

FORMAT_VERSION = "0.0.1"  # the Blob format's version, written in every message ("version")
# the DML ops (values.OP_IMAGES), and UPDATE: one message carrying both images, which readers accept
DML_OP_NAMES = (*OP_IMAGES, "UPDATE")
MESSAGE_TYPE_BY_OP = {op: mt for mt, op in OPS_BY_MESSAGE_TYPE.items() if op}
MESSAGE_TYPE_BY_OP.update({op: pb.DDL for op in DDL_OP_NAMES})
MESSAGE_TYPE_BY_OP.update({op: pb.DML for op in DML_OP_NAMES})
MESSAGE_TYPE_BY_OP["XACOMMIT"] = pb.COMMIT  # an XA transaction's end; the op travels as a fact
# every op a Blob message may carry, from the op tables: DML (OP_IMAGES), the other message types,
# DDL keywords, and the two spellings readers accept besides (XACOMMIT, UPDATE)
ALL_OPS = (*OP_IMAGES, *(op for op in OPS_BY_MESSAGE_TYPE.values() if op), *sorted(DDL_OP_NAMES),
           "XACOMMIT", "UPDATE")
DML_TYPE_BY_OP = {op: i.dml_type for op, i in OP_IMAGES.items()} | {"UPDATE": pb.UPDATE}
_KNOWN_TOP = ("schema", "payload", "version", "dts")
_KNOWN_PAYLOAD = ("before", "after", "op", "sequenceId", "timestamp", "ddl")
_KNOWN_TOP_SET, _KNOWN_PAYLOAD_SET = frozenset(_KNOWN_TOP), frozenset(_KNOWN_PAYLOAD)
# the row images each DML op reads; other ops read none
_IMAGES_OF_OP = {op: (i.image,) for op, i in OP_IMAGES.items()} | {
    "UPDATE": tuple(i.image for i in DML_IMAGES[pb.UPDATE])}
# an image's RowChange field: (name, number), as the op table and the C contract name them
_IMAGE_FIELDS = {i.image: (i.field, PROTO_FIELDS["RowChange." + i.field]) for i in OP_IMAGES.values()}
_FIELD_IMAGES = {name: image for image, (name, _) in _IMAGE_FIELDS.items()}
# the half of an update each half's op carries (an op of one whole row: "both")
_HALF_OF_OP = {i.op: i.image for i in DML_IMAGES[pb.UPDATE]}
_OP_OF_HALF = {image: op for op, image in _HALF_OF_OP.items()}
# a DML op -> the payload keys of a message that needs no shape fact (its images, op, sequenceId, timestamp)
_PLAIN_PAYLOADS = {op: frozenset((*images, "op", "sequenceId", "timestamp")) for op, images in _IMAGES_OF_OP.items()}


def decode_blob(data: bytes | str, *, line: int | None = None, source: str | None = None,
                max_bytes: int | None = None) -> dict:
    """Parse one Blob message (JSON bytes) and check its envelope shape. Before the parse: a line
    longer than `max_bytes` (None: no bound) is a LineTooLongError and one that is no JSON object
    (its first byte past whitespace is not `{`) a BlobFormatError, so that neither is ever
    parsed whole (a JSON parse holds up to ~31x its text: `[{},{},...]`)."""
    check_line(data, max_bytes, line=line, source=source)
    try:
        msg = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BlobFormatError(f"invalid JSON ({exc.msg})", value=data, line=line, column_number=exc.colno,
                              source=source) from None
    check_shape(msg, line=line, source=source)
    return msg


_JSON_SPACE = b" \t\r\n"


def check_line(data: bytes | str, max_bytes: int | None, *, line: int | None = None,
               source: str | None = None) -> None:
    """What `decode_blob` checks of a line before it is parsed: its size against `max_bytes` (a
    line break at its end aside) and that it holds a JSON object. O(1) but for the whitespace
    before its first byte."""
    text = type(data) is str
    if max_bytes is not None and len(data) > max_bytes:
        length = len(data) - data.endswith("\n" if text else b"\n")
        if length > max_bytes:
            head = data[:_HEAD_BYTES]
            raise LineTooLongError(f"line of {length} bytes is longer than max_line_bytes ({max_bytes})",
                                   head=head.encode("utf-8", "replace") if text else bytes(head),
                                   length=length, line=line, source=source)
    first = data[:1]
    if first != b"{" and first != "{":
        start = data.lstrip(" \t\r\n" if text else _JSON_SPACE)[:1] if first in _SPACES else first
        if start in _OTHER_JSON:  # JSON of another kind (`[{},{},...]`); what is no JSON: orjson names it
            raise BlobFormatError("a Blob message must be a JSON object", value=data[:64], line=line,
                                  source=source)


_SPACES = frozenset((b" ", b"\t", b"\r", b"\n", " ", "\t", "\r", "\n"))
# the first character of a JSON text that is no object: an array, a string, a number, a literal
_OTHER_JSON = frozenset([*(c.encode() for c in '["-0123456789tfn'), *'["-0123456789tfn'])
_HEAD_BYTES = 4096  # what a LineTooLongError keeps of its line, as read_lines keeps


def check_shape(msg, *, line: int | None = None, source: str | None = None) -> None:
    """The minimal shape every converter relies on; the JSON Schema says the rest."""
    if not isinstance(msg, dict):
        raise BlobFormatError("a Blob message must be a JSON object", value=msg, line=line, source=source)
    payload = msg.get("payload")
    if not isinstance(payload, dict):
        raise BlobFormatError("payload must be an object", value=payload, line=line, source=source)
    op = payload.get("op")
    if op not in ALL_OPS:
        raise BlobFormatError("unknown op", value=op, line=line, source=source)
    seq = payload.get("sequenceId")
    if seq is None and op == "MHEARTBEAT" and "sequenceId" not in payload:
        pass  # DataWorks heartbeats carry no sequenceId (docs/mapping.md, "Message kinds")
    elif not isinstance(seq, str) or not seq.isdigit() or not seq.isascii():
        raise BlobFormatError("sequenceId must be a string of digits", value=seq, line=line, source=source)
    stamp = payload.get("timestamp")
    if not isinstance(stamp, dict) or not _is_int(stamp.get("eventTime")):
        raise BlobFormatError("timestamp.eventTime must be an integer", value=stamp, line=line, source=source)
    for key in ("systemTime", "checkpointTime"):
        if key in stamp and not _is_int(stamp[key]):
            raise BlobFormatError(f"timestamp.{key} must be an integer", value=stamp, line=line, source=source)
    if not isinstance(msg.get("schema", _NO_SCHEMA), dict):
        raise BlobFormatError("schema must be an object", value=msg.get("schema"), line=line, source=source)


_NO_SCHEMA: dict = {}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def images_of(op: str) -> tuple:
    """The row images a DML op's message holds."""
    return _IMAGES_OF_OP[op]


def _usual_shape(msg: dict, payload: dict, op) -> bool:
    """The usual DML message, which needs no shape fact: our version, no top-level key but ours,
    and a payload of only the images its op reads, op, sequenceId and timestamp."""
    return (payload.keys() == _PLAIN_PAYLOADS.get(op) and msg.get("version") == FORMAT_VERSION
            and msg.keys() <= _KNOWN_TOP_SET)


def _seq_of(msg) -> str | None:
    try:
        return msg["payload"]["sequenceId"]
    except (KeyError, TypeError):
        return None
