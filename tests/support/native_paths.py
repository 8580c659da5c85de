"""The C path against the Python path (the reference), one Entry at a time: `assert_same` runs the four
ways through a BlobEncoder (`convert(entry)` in Python, `convert(entry, raw)` with C reading row images
off the wire, `convert_lines` writing whole JSON lines in C, `convert_columns` filling Spark's columns)
and requires the same messages, bytes, errors and counts. Shared by tests/test_speedups.py and
tests/test_temporal_policies.py."""
from __future__ import annotations

import orjson
import pytest

import bridge
from bridge import pb
from bridge.errors import BridgeError


def outcome(call):
    try:
        return call()
    except BridgeError as exc:
        return ("error", type(exc).__name__, str(exc))


def is_error(result) -> bool:
    return isinstance(result, tuple) and len(result) == 3 and result[0] == "error"


def assert_outcomes(got, expected, what: str) -> None:
    """`got == expected`, saying plainly when only one side raised (and what it raised)."""
    if is_error(got) != is_error(expected):
        raiser, other = ("the C path", "the Python path") if is_error(got) else ("the Python path", "the C path")
        error = got if is_error(got) else expected
        pytest.fail(f"{what}: only {raiser} raised {error[1]}: {error[2]} ({other} gave a result)")
    assert got == expected, what


def record(msg: dict) -> tuple:
    payload, source = msg["payload"], msg["schema"].get("source") or {}
    return (payload["sequenceId"], payload["op"], source.get("dbName"), source.get("tableName"),
            bridge.shard_key(msg), payload["timestamp"]["eventTime"], orjson.dumps(msg))


def assert_same(raw: bytes, options=bridge.DEFAULT_OPTIONS, encoders=None) -> list:
    """The four ways through the encoder agree on one Entry; returns the Python path's messages."""
    python, wire, lines, records = encoders or (bridge.BlobEncoder(options) for _ in range(4))
    entry = pb.Entry.FromString(raw)
    expected = outcome(lambda: python.convert(entry))
    got = outcome(lambda: wire.convert(pb.Entry.FromString(raw), raw))
    assert_outcomes(got, expected, "convert(entry, raw)")
    expected_lines = expected if is_error(expected) else [orjson.dumps(m) for m in expected]
    got_lines = outcome(lambda: lines.convert_lines(pb.Entry.FromString(raw), raw))
    assert_outcomes(got_lines, expected_lines, "convert_lines(entry, raw)")
    expected_records = expected if is_error(expected) else [record(m) for m in expected]
    got_columns = outcome(lambda: records.convert_columns(pb.Entry.FromString(raw), raw))
    got_records = got_columns if is_error(got_columns) else list(zip(*got_columns))
    assert_outcomes(got_records, expected_records, "convert_columns(entry, raw)")
    if not is_error(got_columns):
        assert all(isinstance(column, list) for column in got_columns)
    counts = {(e.entries, e.emitted) for e in (python, wire, lines, records)}
    assert len(counts) == 1
    return expected
