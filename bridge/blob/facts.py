"""Reserved-prefix (`datahub:`) properties: the DataHub facts the bridge writes into an Entry's
properties, and whether an Entry's such properties are those facts (docs/decisions.md,
"Reserved-prefix properties in DTS input").

An encoder reads an Entry's properties one of three ways (its mode, `SPLITS`): "ask" (a
reserved-prefix key raises `_Reserved`, and the whole Entry is decided by `facts_hold`), "facts"
(they are the bridge's own facts and shape the message) or "plain" (the Entry's own, carried in
the extension like any other). The decoder writes its facts back with `_add_facts`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from bridge.errors import BridgeError
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.values import RESERVED_PREFIX
from bridge.wire import subscribe_pb2 as pb


def _kv(props) -> list:
    return [[p.key, p.value] for p in props]


_NO_PROPS: tuple = ([], {})
_NO_FACTS: dict = {}


def _split_props(props) -> tuple[list, dict]:
    """(ordinary KVPairs, DataHub facts) of a properties list (an encoder of mode "facts")."""
    if not props:
        return _NO_PROPS
    plain, facts = [], {}
    for p in props:
        if p.key.startswith(RESERVED_PREFIX):
            facts[p.key[len(RESERVED_PREFIX):]] = p.value
        else:
            plain.append([p.key, p.value])
    return plain, facts


def _all_plain(props) -> tuple[list, dict]:
    """`_split_props` of an encoder of mode "plain": every pair is the Entry's own."""
    return (_kv(props), _NO_FACTS) if props else _NO_PROPS


class _Reserved(Exception):
    """An Entry holds reserved-prefix properties: whether they are the bridge's facts is decided
    for the whole Entry (`BlobEncoder._decide`)."""


def _ask_props(props) -> tuple[list, dict]:
    """`_split_props` of an encoder of mode "ask": a reserved-prefix key asks for the decision."""
    if not props:
        return _NO_PROPS
    for p in props:
        if p.key.startswith(RESERVED_PREFIX):
            raise _Reserved
    return _kv(props), _NO_FACTS


_SPLITS = {"ask": _ask_props, "facts": _split_props, "plain": _all_plain}


def _plain_properties(header: pb.Header, all_plain: bool = False) -> list | None | bool:
    """The header's properties as [[key, value], ...] (None: none), or False when one has the
    reserved prefix (the dict path decides those), read in Python: where C's `header_properties` is
    not sure. `all_plain` (an encoder of mode "plain"): every pair is the Entry's own."""
    props = header.properties
    if not all_plain and any(p.key.startswith(RESERVED_PREFIX) for p in props):
        return False
    return _kv(props) or None


def _ext_header_reserved(fields) -> bool:
    """Whether a `dts.header` holds a property of reserved prefix (any JSON: checked where read)."""
    props = fields.get("properties") if type(fields) is dict else None
    return type(props) is list and any(type(p) is list and p and type(p[0]) is str
                                       and p[0].startswith(RESERVED_PREFIX) for p in props)


def _add_facts(target, facts: dict) -> None:
    for key in sorted(facts):
        target.add(key=RESERVED_PREFIX + key, value=facts[key])


# The converters `facts_hold` writes an Entry's messages with and reads them back with. This module
# is below bridge.blob.encode and bridge.blob.decode (both import it), so it imports neither (an
# import circle, tests/test_layout.py): each names its converter here as it loads (`write_with`,
# `read_back_with`), and every way into the package loads both (bridge/__init__.py).
_WRITE: list = []
_READ_BACK: list = []


def write_with(encoder_for: Callable[[Options], Any]) -> None:
    """Name the per-options encoder (`bridge.blob.encode._encoder`) `facts_hold` writes an Entry's
    messages with (bridge.blob.encode calls this as it loads)."""
    _WRITE[:] = [encoder_for]


def read_back_with(decoder: Callable[[Options], Any]) -> None:
    """Name the decoder class (`BlobDecoder`) `facts_hold` reads an Entry's messages back with when
    it is given none (bridge.blob.decode calls this as it loads)."""
    _READ_BACK[:] = [decoder]


def facts_hold(entry: pb.Entry, raw: bytes | None = None, options: Options = DEFAULT_OPTIONS,
               decoder: Callable[[Options], Any] | None = None) -> bool:
    """Whether the reserved-prefix properties of an Entry are the bridge's own DataHub facts: the
    messages that read them so (lossless, whatever `options.strict` says) decode back to exactly
    this Entry. What `BlobEncoder` and `BlobDecoder` ask of an Entry that holds such properties;
    `decoder` (the `BlobDecoder` class; by default the one bridge.blob.decode named) reads back."""
    if decoder is None:
        if not _READ_BACK:
            raise RuntimeError("bridge.blob.decode is not loaded: facts_hold has no decoder to read back with")
        decoder = _READ_BACK[0]
    if not _WRITE:
        raise RuntimeError("bridge.blob.encode is not loaded: facts_hold has no encoder to write with")
    lossless = dataclasses.replace(options, strict=False, control_events="emit", system_time=False)
    encoder = _WRITE[0](lossless)._twin("facts")
    try:
        messages = encoder._convert(entry, entry.header, raw)
        reader = decoder(lossless)
        reader._check_reserved = False  # (what it decodes is the facts' reading, never a user's)
        out = [e for m in messages for e in reader.feed(m)]
        if reader.finish():
            return False
    except (BridgeError, ValueError, TypeError, OverflowError, UnicodeError, KeyError):
        return False
    return len(out) == 1 and out[0].SerializeToString() == entry.SerializeToString()
