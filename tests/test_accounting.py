"""The accounting law through the moves a pipeline makes after a record was counted (the Tally's
`took`, `withdrew`, `undelivered`; `ErrorPolicy.reject_input`), and what a rejects line says."""
from __future__ import annotations

import io

import orjson

from bridge import sync
from bridge.cli.base import rejects_sink
from bridge.errors import ConversionError
from bridge.stream import ErrorPolicy, Tally


def test_an_entry_not_delivered_is_one_record_in_its_rejects_line():
    """A converted Entry the sink cannot deliver moves to rejected, and its rejects line says one
    record (the line is written after the count moved, as rejects_sink reads it)."""
    tally = Tally()
    out = io.BytesIO()
    policy = ErrorPolicy("skip", tally=tally, sink=rejects_sink(out, tally), keep_records=False)
    tally.took(2)
    sink = sync.TupleSink(None, "{db}_{table}", "topic", policy)
    sink.policy.tally.withdrew(2)
    sink._not_delivered({"partition": 0, "offset": 5, "entry": 0}, ConversionError("cannot"), None)
    tally.took(1)  # the next Entry, delivered
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert [line["records"] for line in lines] == [1]
    assert (tally.input, tally.converted, tally.rejected, tally.outputs) == (2, 1, 1, 1) and tally.balanced()


def test_reject_input_counts_the_record_and_its_line():
    tally = Tally()
    out = io.BytesIO()
    policy = ErrorPolicy("skip", tally=tally, sink=rejects_sink(out, tally), keep_records=False)
    policy.reject_input(ConversionError("bad", line=3), b"raw")
    tally.took(0)
    line = orjson.loads(out.getvalue())
    assert line["records"] == 1 and line["line"] == 3
    assert (tally.input, tally.rejected, tally.not_emitted) == (2, 1, 1) and tally.balanced()
