"""Blob message validation: the JSON Schema (`bridge/blob/blob.schema.json`) plus the one rule a
schema cannot say, that each value matches its column's declared type.

>>> validate_blob({"schema": {}, "payload": {"op": "MHEARTBEAT", "sequenceId": "1",
...                "timestamp": {"eventTime": 1605339932000}}})
>>> validate_blob({"schema": {}, "payload": {"op": "HEARTBEAT", "sequenceId": "1",
...                "timestamp": {"eventTime": 1605339932000}}})
Traceback (most recent call last):
...
bridge.errors.BlobFormatError: does not match the Blob schema at payload/op: 'HEARTBEAT' is not one of [...]
"""
from __future__ import annotations

import base64
import binascii
import json
from functools import lru_cache
from importlib import resources

from bridge.errors import BlobFormatError

__all__ = ["validate_blob", "blob_schema", "iter_blob_errors"]

_VALUE_CHECKS = {
    "LONG": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63),
    "DATE": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63),
    "DOUBLE": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "BOOLEAN": lambda v: isinstance(v, bool),
    "STRING": lambda v: isinstance(v, str),
    "BYTES": lambda v: isinstance(v, str) and _is_base64(v),
}


def _is_base64(text: str) -> bool:
    try:
        # canonical only: 'QR==' decodes, but its padding bits would not survive a round trip
        return base64.b64encode(base64.b64decode(text, validate=True)).decode("ascii") == text
    except (binascii.Error, ValueError):
        return False


@lru_cache(maxsize=1)
def blob_schema() -> dict:
    return json.loads(resources.files("bridge.blob").joinpath("blob.schema.json").read_text("utf-8"))


@lru_cache(maxsize=1)
def _validator():
    import jsonschema  # deferred: only validation needs it
    schema = blob_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def iter_blob_errors(msg) -> list[str]:
    """Every problem of one message as 'path: reason' strings (empty when valid)."""
    problems = []
    for err in sorted(_validator().iter_errors(msg), key=lambda e: list(map(str, e.absolute_path))):
        path = "/".join(map(str, err.absolute_path)) or "(top)"
        problems.append(f"{path}: {err.message}")
    if problems or not isinstance(msg, dict):
        return problems
    types = {c["name"]: c["type"] for c in (msg.get("schema") or {}).get("dataColumn", [])}
    payload = msg["payload"]
    for image in ("before", "after"):
        body = payload.get(image)
        if not body:
            continue
        for name, value in body["dataColumn"].items():
            if name not in types:
                problems.append(f"payload/{image}/dataColumn/{name}: column not in schema.dataColumn")
            elif value is not None and not _VALUE_CHECKS[types[name]](value):
                problems.append(f"payload/{image}/dataColumn/{name}: {value!r:.60} is not a {types[name]} value")
    return problems


def validate_blob(msg, *, line: int | None = None) -> None:
    """Raise BlobFormatError naming the first problem (path and reason) when `msg` is not valid."""
    problems = iter_blob_errors(msg)
    if problems:
        raise BlobFormatError(f"does not match the Blob schema at {problems[0]}", line=line)
