"""The lossless `dts` extension (docs/mapping.md, "The lossless `dts` extension"), both ways:
what the encoder writes into it (dts.header, and the unknown protobuf fields of an Entry as
{path: base64}) and how the decoder reads it back (the extension's parts checked, and the
unknown fields patched back into their messages). The paths of unknown fields are written and
read here side by side, so the two stay one format.
"""
from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

import orjson
from google.protobuf.message import DecodeError as ProtobufDecodeError

from bridge.blob.facts import _kv
from bridge.blob.rows import NATIVE, known_fields
from bridge.blob.shape import _FIELD_IMAGES
from bridge.errors import BlobFormatError
from bridge.values import RESERVED_PREFIX
from bridge.wire import subscribe_pb2 as pb

# ---- writing: dts.header -------------------------------------------------------------------------

# What a message without the extension decodes to (blob_decode): the extension is then left out.
_DEFAULT_HEADER = {"version": 1}
_DEFAULT_HEADER_NO_SOURCE = {"version": 1, "sourceType": int(pb.MYSQL)}
# Header fields the documented envelope expresses (the rest travel in dts.header).
_HEADER_IN_ENVELOPE = {"messageType", "timestamp", "seqId"}
_HEADER_IN_SOURCE = {"schemaName", "tableName", "sourceType"}


def _message_fields(msg, skip=()) -> dict:
    """Non-default scalar fields of a protobuf message, JSON-ready (KVPair lists as [[k, v]])."""
    out = {}
    for fd, value in msg.ListFields():
        if fd.name in skip:
            continue
        out[fd.name] = _kv(value) if fd.name == "properties" else value
    return out


def _compile_fields(descriptor, skip) -> Callable:
    """`_message_fields(msg, skip)` for messages without properties, as one straight function:
    each scalar field read once, in field-number order (ListFields' order)."""
    lines = ["def fields(msg):", "    out = {}"]
    for fd in sorted(descriptor.fields, key=lambda f: f.number):
        if fd.name in skip:
            continue
        if fd.is_repeated or fd.message_type is not None:
            raise TypeError(f"{descriptor.name}.{fd.name} is not a scalar field")
        lines += [f"    v = msg.{fd.name}", "    if v:", f"        out[{fd.name!r}] = v"]
    lines.append("    return out")
    scope: dict = {}
    exec(compile("\n".join(lines), f"<fields of {descriptor.name}>", "exec"), scope)  # noqa: S102
    return scope["fields"]


# dts.header of a DML Entry without header properties (what _ext_header gives it)
wire_ext_header = _compile_fields(pb.Header.DESCRIPTOR, _HEADER_IN_ENVELOPE | _HEADER_IN_SOURCE | {"properties"})


def _wire_header(header: pb.Header, props: list | None) -> dict:
    """dts.header of a DML Entry whose header properties `props` hold no DataHub fact (`_ext_header`'s)."""
    out = wire_ext_header(header)
    if props:
        out["properties"] = props  # field 15: last, as ListFields orders it
    return out


def _ext_header(header: pb.Header, plain_props: list, with_source: bool) -> dict:
    """dts.header: the Header's fields the envelope does not say, and its plain properties."""
    skip = _HEADER_IN_ENVELOPE | (_HEADER_IN_SOURCE if with_source else set()) | {"properties"}
    out = _message_fields(header, skip=skip)
    if plain_props:
        out["properties"] = plain_props
    return out


# ---- unknown protobuf fields: they survive DTS -> Blob -> DTS (docs/mapping.md, "The lossless `dts` extension")

# messages whose `properties` the extension splits into plain pairs and DataHub facts (which are
# rebuilt from their values): a pair's index in a path counts the plain pairs only
_FACTS_APART = frozenset(("Header", "RowChange"))


def unknown_fields(entry: pb.Entry, raw: bytes | None = None, facts_apart: bool = True) -> list[tuple[tuple, bytes]]:
    """The unknown fields protobuf keeps anywhere in an Entry, as (path, bytes): the path of the
    message holding them from the Entry down (field names and list indexes; () is the Entry) and
    their bytes as protobuf writes them (verbatim, in the order they came). `raw`, the Entry's
    bytes, lets C answer "none" without a walk; otherwise only subtrees that hold some are walked.

    >>> e = pb.Entry.FromString(b"\\x0a\\x02\\x08\\x01\\x30\\x05")  # header {version: 1}, field 6 = 5
    >>> unknown_fields(e)
    [((), b'0\\x05')]
    """
    if raw is not None and known_fields(raw) or _subtree_known(entry):
        return []
    out: list = []
    _walk_unknown(entry, (), out, _FACTS_APART if facts_apart else frozenset())
    return out


def _subtree_known(msg) -> bool:
    """Whether a message holds no unknown field at any depth."""
    if NATIVE:
        return known_fields(msg.SerializeToString(), msg.DESCRIPTOR.name)
    bare = type(msg)()
    bare.CopyFrom(msg)
    bare.DiscardUnknownFields()
    return bare.ByteSize() == msg.ByteSize()


def _own_unknown(msg) -> bytes:
    """The unknown fields of `msg` itself (not of its sub-messages): what is left once every
    known field is cleared, which protobuf writes verbatim."""
    bare = type(msg)()
    bare.CopyFrom(msg)
    for fd, _ in bare.ListFields():
        bare.ClearField(fd.name)
    return bare.SerializeToString()


def _walk_unknown(msg, path: tuple, out: list, apart: frozenset = _FACTS_APART) -> None:
    own = _own_unknown(msg)
    if own:
        out.append((path, own))
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if not fd.is_repeated:
            if not _subtree_known(value):
                _walk_unknown(value, path + (fd.name,), out, apart)
            continue
        facts_apart = fd.name == "properties" and msg.DESCRIPTOR.name in apart
        index = 0
        for item in value:
            if facts_apart and item.key.startswith(RESERVED_PREFIX):
                continue  # a DataHub fact of the bridge's own: rebuilt, its unknown fields are not carried
            if not _subtree_known(item):
                _walk_unknown(item, path + (fd.name, index), out, apart)
            index += 1


_ROWS_PATH = ("event", "dmlEvent", "rows")


def _unknown_parts(found: list) -> tuple[dict, dict]:
    """`unknown_fields` as the extension carries them: ({path text: base64} of what the Entry holds
    once, {row index: [(path below the row, base64)]}). Path texts: "entry", "header", "event",
    "event.dmlEvent.columns.3", ...; a row's own are written "row", "row.newColumns.2", ..."""
    once: dict = {}
    rows: dict = {}
    for path, data in found:
        text = base64.b64encode(data).decode("ascii")
        if path[:3] == _ROWS_PATH and len(path) > 3:
            rows.setdefault(path[3], []).append((path[4:], text))
        else:
            once[".".join(map(str, path)) or "entry"] = text
    return once, rows


def _row_unknown(once: dict, rows: dict, index: int, op: str) -> dict:
    """The `dts.unknown` of one message of a DML row: the Entry's own, and the row's the message
    holds (an update's before half: its image's only; the after half the rest)."""
    out = dict(once)
    for below, text in rows.get(index, ()):
        image = below[0] if below else None
        if op == "UPDATE_BEFOR" and image != "oldColumns" or op == "UPDATE_AFTER" and image == "oldColumns":
            continue
        out[".".join(("row",) + tuple(map(str, below)))] = text
    return out


# ---- reading: the extension's parts checked ------------------------------------------------------

# the top level of the `dts` extension as the encoder writes it (bridge/blob/blob.schema.json, dtsExtension)
_EXTENSION_TYPES = {"header": dict, "event": dict, "columns": dict, "row": list, "rowProperties": list,
                    "charsets": dict, "values": dict, "image": str, "unknown": dict}

_DML_ONLY = frozenset(("columns", "row", "rowProperties", "charsets", "values", "image"))
_DML_EXTENSION_KEYS = frozenset(_EXTENSION_TYPES)


def _check_extension(ext: dict, dml: bool) -> None:
    """An unknown key, or a part of another JSON type or of another kind of message, is an error: read
    leniently, it would be dropped or misread. `_feed` calls this for every message but a DML one
    whose keys are all known and none null; that one's parts are checked where they are read
    (`_header`, `_build_columns`, `_dml`, `_image`), off the path of a plain message."""
    for key, value in ext.items():
        if type(value) is not _EXTENSION_TYPES.get(key) or not dml and key in _DML_ONLY:
            raise BlobFormatError(f"the 'dts' extension's {key!r} is not what the bridge writes", value=value)


_DML_EVENT_KEYS = frozenset(("properties",))
# dts.event.absent (a non-DML Entry whose Event lacks the sub-message its messageType names, or has
# no Event at all): what else that part may then say
_ABSENT_PARTS = ("sub", "event")
_ABSENT_KEYS = {"sub": frozenset(("absent", "properties")), "event": frozenset(("absent",))}
_ONE_ROW = (0, 1)
_COLUMNS_KEYS = frozenset(("types", "properties"))


# protobuf takes any int for a bool field (-1 becomes true): the extension's must be JSON booleans
_BOOL_FIELDS = frozenset(
    f.name for d in (pb.Header.DESCRIPTOR, *(e.message_type for e in pb.Event.DESCRIPTOR.fields if e.message_type))
    for f in d.fields if f.type == f.TYPE_BOOL)


def _set_field(message, key: str, value) -> None:
    """A field of the `dts` extension onto its protobuf message, its JSON type kept."""
    if key in _BOOL_FIELDS and type(value) is not bool:
        raise BlobFormatError(f"extension field {key} must be true or false", value=value)
    setattr(message, key, value)


def _pairs(pairs) -> list:
    """The [key, value] pairs of an extension's properties, checked: a dict or a two-letter string
    would unpack as well, and mean something else; and both are strings (protobuf takes a null
    for an empty string, which would change the value without a word)."""
    if type(pairs) is not list or any(type(p) is not list or len(p) != 2 or type(p[0]) is not str
                                      or type(p[1]) is not str for p in pairs):
        raise BlobFormatError("the 'dts' extension's properties are a list of [key, value] pairs of strings",
                              value=pairs)
    return pairs


def _add_kv(target, pairs) -> None:
    for key, value in _pairs(pairs):
        target.add(key=key, value=value)


# ---- reading: unknown protobuf fields (`unknown_fields` above) back into their messages -------------

_MESSAGE_CLASSES = {cls.DESCRIPTOR.name: cls for cls in (
    pb.Entry, pb.Header, pb.Event, pb.BeginEvent, pb.CommitEvent, pb.DDLEvent, pb.RollbackEvent, pb.HeartbeatEvent,
    pb.CheckpointEvent, pb.DMLEvent, pb.Column, pb.RowChange, pb.Data, pb.KVPair)}
_ALWAYS_THERE = frozenset(("header", "event"))  # an Entry the decoder builds always has these


def _unknown_patches(unknown) -> tuple[list, list, bytes]:
    """The extension's `unknown` ({path: base64}) checked: (patches of the Entry, patches of the
    message's row, the Entry's part as a key that the halves and rows of one Entry share). A patch
    is (steps, bytes): steps are (field name, list index or None) from the Entry or the row down to
    a message, and the bytes hold only fields protobuf keeps as unknown there."""
    if type(unknown) is not dict:
        raise BlobFormatError("the 'dts' extension's unknown is an object of base64 strings", value=unknown)
    once, below = [], []
    for text, data in unknown.items():
        root, steps, descriptor = _patch_path(text)
        try:
            raw = base64.b64decode(data, validate=True) if type(data) is str else b""
        except (binascii.Error, ValueError):
            raw = b""
        probe = _MESSAGE_CLASSES[descriptor.name]()
        try:
            probe.MergeFromString(raw)
        except ProtobufDecodeError:
            raw = b""
        if not raw or probe.ListFields():  # nothing, or fields the message knows: not unknown ones
            raise BlobFormatError(f"the 'dts' extension's unknown {text!r} is not what the bridge writes", value=data)
        (below if root == "row" else once).append((steps, raw))
    key = orjson.dumps(sorted((k, v) for k, v in unknown.items() if not k.startswith("row"))) if once else None
    return once, below, key


def _patch_path(text) -> tuple[str, tuple, object]:
    """(root, steps, descriptor of the message reached) of a path such as "header",
    "event.dmlEvent.columns.3" or "row.newColumns.2"; "entry" is the Entry itself."""
    names = text.split(".") if type(text) is str else [""]
    root = "row" if names[0] == "row" else "entry"
    if names[0] in ("row", "entry"):
        names = names[1:] if names[0] == "row" or names == ["entry"] else [""]
    descriptor = pb.RowChange.DESCRIPTOR if root == "row" else pb.Entry.DESCRIPTOR
    steps = []
    at = 0
    while at < len(names):
        fd = descriptor.fields_by_name.get(names[at])
        if fd is None or fd.message_type is None or root == "entry" and fd.name == "rows":
            raise BlobFormatError(f"the 'dts' extension's unknown names no message: {text!r}", value=text)
        index = None
        if fd.is_repeated:
            at += 1
            if at == len(names) or not names[at].isdigit() or not names[at].isascii():
                raise BlobFormatError(f"the 'dts' extension's unknown names no message: {text!r}", value=text)
            index = int(names[at])
        steps.append((fd.name, index))
        descriptor = fd.message_type
        at += 1
    return root, tuple(steps), descriptor


def _check_row_patches(patches, half: str, images: tuple, with_data: bool, columns: int, properties: int) -> None:
    """A row's patches name only what this message brings to the row, so that none can fail once
    a waiting half's row is touched: the Data of its images, and (all but a before half) the row
    itself and its properties."""
    for steps, _ in patches:
        name, index = steps[0] if steps else (None, None)
        if name in _FIELD_IMAGES:
            ok = _FIELD_IMAGES[name] in images and with_data and index < columns
        else:
            ok = half != "before" and (name is None or index < properties)
        if not ok:
            raise BlobFormatError("the 'dts' extension's unknown names a part of the row this message does not hold",
                                  value=".".join(["row"] + [f"{n}.{i}" if i is not None else n for n, i in steps]))


def _patch(message, patches) -> None:
    """Merge each patch's unknown fields into the message its steps reach from `message`."""
    for steps, raw in patches:
        target = message
        for name, index in steps:
            if index is None:
                if name not in _ALWAYS_THERE and not target.HasField(name):
                    raise BlobFormatError(f"the 'dts' extension's unknown names a {name} the message has not")
                target = getattr(target, name)
            else:
                items = getattr(target, name)
                if index >= len(items):
                    raise BlobFormatError(f"the 'dts' extension's unknown names {name} {index}, which is not there")
                target = items[index]
        target.MergeFromString(raw)

