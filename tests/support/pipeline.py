"""What every pipeline test shares, whether `dts-bridge sync` or a Spark driver does the work: the
repository's root, the environment a `python -m bridge` subprocess runs in (its credentials for the
stand-in DataHub), running the command line, the `dts.pos` attribute every landed record carries,
and the stand-in's chaos: which operations may fail, and what hit."""
from __future__ import annotations

import collections
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT), DATAHUB_ACCESS_ID="test-id", DATAHUB_ACCESS_KEY="test-secret")
# every operation may fail: writes (PutRecordsByShard), the tail reads of a restart and the
# answer-less-attempt check (GetCursor, GetRecords), ListShard, GetTopic, CreateTopic
CHAOS_OPS = ("PutRecords", "PutRecordsByShard", "GetCursor", "GetRecords", "ListShard", "GetTopic", "CreateTopic")


def bridge_cli(*args: str) -> list[str]:
    """The command line of `dts-bridge ARGS` run by this interpreter."""
    return [sys.executable, "-m", "bridge", *args]


def run_bridge(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def dts_pos(record: dict) -> tuple[int, int, int, int]:
    """(partition, offset, entry, row) of a landed record's `dts.pos` attribute."""
    text = record["attributes"].get("dts.pos", "")
    parts = text.split(":")
    assert len(parts) == 4 and all(p.isdigit() for p in parts), f"record without a dts.pos attribute: {record}"
    return tuple(int(p) for p in parts)


def text_or_none(value):
    """A Tuple value as the comparisons hold it: its text, None for NULL."""
    return None if value is None else str(value)


def fault_summary(server) -> dict:
    """{fault kind: how many} of what the stand-in's chaos injected."""
    return dict(collections.Counter(kind for _, kind in server.faults.injected))
