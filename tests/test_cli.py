"""The dts-bridge command line (docs/cli.md): formats, directions, the accounting rule on bad input,
one-line errors with exit codes, help and docs for every command.

Most tests call `bridge.cli.main.main(argv)` in-process; a few run the installed console script.
`DTS_BRIDGE_DEBUG` is set for every test so that an unexpected exception inside the CLI surfaces
as a failing test instead of a tidy one-line message.
"""
from __future__ import annotations

import doctest
import io
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import types
from typing import NamedTuple

import orjson
import pytest

from bridge.blob.encode import entry_to_blob
from bridge.cli import main as cli
from bridge.options import Options, option_specs
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import (
    Assembled,
    Reassembler,
    encode_varint,
    entry_from_json_line,
    iter_pb_messages,
    split_entries,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SAMPLE_NAMES = ("mixed", "types", "large", "mariadb", "realistic")
SCRIPT = ROOT / ".venv" / "bin" / "dts-bridge"
SUMMARY = re.compile(r"converted (\d+), rejected (\d+), not emitted (\d+) \(of (\d+) input records\)")
T0 = 1_605_339_932


@pytest.fixture(autouse=True)
def _debug(monkeypatch):
    monkeypatch.setenv(cli.DEBUG_ENV, "1")


class Run(NamedTuple):
    code: int
    out: bytes
    err: str

    def counts(self) -> dict:
        match = SUMMARY.search(self.err)
        assert match, self.err
        return dict(zip(("converted", "rejected", "not_emitted", "input"), map(int, match.groups())))

    def error_line(self) -> str:
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        return lines[0]


@pytest.fixture
def run(capsysbinary, monkeypatch):
    def run(*argv, stdin: bytes | None = None) -> Run:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = cli.main([str(a) for a in argv])
        out, err = capsysbinary.readouterr()
        err = err.decode()
        assert "Traceback" not in err and "internal error" not in err, err
        return Run(code, out, err)
    return run


# ---- small DTS inputs built with bridge.pb and bridge.wire.framing -------------------------------------

def begin(seq: int) -> pb.Entry:
    e = pb.Entry(header=pb.Header(version=1, messageType=pb.BEGIN, timestamp=T0, seqId=seq))
    e.event.beginEvent.SetInParent()
    return e


def dml(seq: int, rows: int = 2, table: str = "t", datatype: int = pb.INT64, text: str = "x") -> pb.Entry:
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=T0 + seq,
                                  seqId=seq, schemaName="db", tableName=table))
    ev = e.event.dmlEvent
    ev.dmlEventType = pb.INSERT
    ev.columns.add(name="id", originalType="bigint(20)", isKey=True)
    ev.columns.add(name="note", originalType="varchar(64)")
    for i in range(rows):
        ev.rows.add(newColumns=[pb.Data(dataType=datatype, sv=str(seq * 1000 + i)),
                                pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=text.encode())])
    return e


def unknown_type(seq: int) -> pb.Entry:
    e = begin(seq)
    e.header.messageType = 99
    return e


def envelope(entries, **fields) -> bytes:
    env = pb.Envelope(version=1, total=1, index=0, data=pb.Entries(items=entries).SerializeToString())
    for key, value in fields.items():
        setattr(env, key, value)
    return env.SerializeToString()


def segments(entry: pb.Entry) -> list[bytes]:
    envs = split_entries(pb.Entries(items=[entry]).SerializeToString(), 96)
    assert len(envs) >= 3
    return [env.SerializeToString() for env in envs]


class Unit(NamedTuple):
    """One piece of a .pb file and what it stands for, decided here, independently of the CLI."""
    data: bytes               # an Envelope (framed on write), or raw bytes when `raw`
    records: int              # input records: its Entries, or 1 per Envelope framing rejects
    bad: int = 0              # of which rejected
    raw: bool = False
    quiet: int = 0            # of which Blob output does not emit (a DML without rows)
    framing_ok: bool = False  # bad only for the converters: DTS -> DTS re-framing keeps them
    dml: int = 0              # of which good DML Entries with rows: all that Tuple output emits


def _emits_rows(entry: pb.Entry) -> bool:
    return entry.header.messageType == pb.DML and len(entry.event.dmlEvent.rows) > 0


def good(*entries: pb.Entry) -> Unit:
    return Unit(envelope(list(entries)), len(entries), quiet=sum(1 for e in entries if e.header.messageType == pb.DML
                                                                   and not _emits_rows(e)),
                dml=sum(map(_emits_rows, entries)))


def bad_envelope(data: bytes) -> Unit:
    return Unit(data, 1, 1)


BIG = dml(90, rows=6, text="y" * 40)
SEGS = segments(BIG)

# name -> (units, the position the first bad record's message names under --on-error fail)
PB_CASES: dict[str, tuple[list[Unit], str]] = {
    "garbage bytes": ([good(begin(1), dml(2)), bad_envelope(b"\xff\xfegarbage"), good(dml(3))], "offset 1"),
    "wrong Envelope version": ([good(begin(1)), bad_envelope(envelope([dml(2)], version=2)), good(dml(3))],
                               "offset 1"),
    "Envelope total 0": ([bad_envelope(envelope([dml(2)], total=0)), good(dml(3), dml(4))], "offset 0"),
    "index not below total": ([good(begin(1)), bad_envelope(envelope([dml(2)], index=1))], "offset 1"),
    # the gap is seen at the third segment; both Envelopes of the broken run are rejected
    "missing segment": ([good(begin(1)), Unit(SEGS[0], 1, 1), Unit(SEGS[2], 1, 1), good(dml(3))], "offset 2"),
    "segment without its first": ([good(begin(1)), bad_envelope(SEGS[1]), good(dml(3))], "offset 1"),
    # the abandoned first run is one rejected Envelope; the complete second run is one Entry
    "new first segment while one is open": ([Unit(SEGS[0], 1, 1), Unit(SEGS[0], 1, dml=1),
                                             *[Unit(s, 0) for s in SEGS[1:]], good(dml(3))], "offset 1"),
    "segments missing at end of file": ([good(begin(1), dml(2)), *[Unit(s, 1, 1) for s in SEGS[:-1]]], "offset 1"),
    "Entries that do not parse": ([good(begin(1)), bad_envelope(envelope([], data=b"\x0a\xff\xff")),
                                   good(dml(3))], "offset 1"),
    "truncated file": ([good(begin(1), dml(2)), Unit(encode_varint(200) + b"short", 1, 1, raw=True)], "message 1"),
    "truncated length prefix": ([good(dml(2)), Unit(b"\x80", 1, 1, raw=True)], "message 1"),
    "unknown message type": ([good(begin(1)), Unit(envelope([dml(2), unknown_type(3)]), 2, 1, framing_ok=True,
                                                   dml=1), good(dml(4))], "offset 1"),
    "unknown DataType": ([Unit(envelope([dml(1), dml(2, datatype=77)]), 2, 1, framing_ok=True, dml=1),
                          good(dml(3))], "offset 0"),
    "DML without rows": ([good(begin(1), dml(2, rows=0)), good(dml(3))], ""),
}


def write_units(path: pathlib.Path, units: list[Unit]) -> pathlib.Path:
    with open(path, "wb") as fh:
        for unit in units:
            fh.write(unit.data if unit.raw else encode_varint(len(unit.data)) + unit.data)
    return path


def expected(units: list[Unit], target: str) -> dict:
    """The counts a run must print, from the units alone."""
    records = sum(u.records for u in units)
    rejected = sum(u.bad for u in units if not (target == "dts" and u.framing_ok))
    if target == "tuple":
        converted = sum(u.dml for u in units)
        return {"input": records, "rejected": rejected, "not_emitted": records - rejected - converted,
                "converted": converted}
    quiet = sum(u.quiet for u in units) if target == "blob" else 0
    return {"input": records, "rejected": rejected, "not_emitted": quiet, "converted": records - rejected - quiet}


def read_entries(path: pathlib.Path) -> list[bytes]:
    """Serialized Entries of a .pb file, reassembled independently of the CLI."""
    reassembler, out = Reassembler(), []
    with open(path, "rb") as fh:
        for number, _, raw in iter_pb_messages(fh):
            for item in reassembler.feed(0, number, raw):
                assert isinstance(item, Assembled), item
                out += [e.SerializeToString() for e in item.entries.items]
    assert not reassembler.finish()
    return out


def json_lines(data: bytes) -> list:
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


# ---- the accounting rule and the error policy on bad DTS input ----------------------------------

OUTPUTS = {"blob": "out.jsonl", "dts": "out.pb", "dts-json": "out.dts.jsonl", "tuple": "t/{table}.csv"}


@pytest.mark.parametrize("target", sorted(OUTPUTS))
@pytest.mark.parametrize("case", sorted(PB_CASES))
def test_skip_accounts_for_every_input_record(run, tmp_path, case, target):
    units, _ = PB_CASES[case]
    src = write_units(tmp_path / "in.pb", units)
    out = tmp_path / OUTPUTS[target]
    rejects = tmp_path / "rejects.jsonl"
    result = run("convert", src, "-o", out, "--on-error", "skip", "--rejects", rejects, "--to", target)
    want = expected(units, "dts" if target.startswith("dts") else target)
    assert result.counts() == want
    assert result.code == (1 if want["rejected"] else 0)
    lines = json_lines(rejects.read_bytes())
    assert sum(line["records"] for line in lines) == want["rejected"]
    assert all(line["reason"] and ("offset" in line or "message" in line) for line in lines)
    assert out.exists() if target != "tuple" else (tmp_path / "t" / "db.t.csv").exists() == (want["converted"] > 0)


@pytest.mark.parametrize("case", sorted(c for c in PB_CASES if PB_CASES[c][1]))
def test_fail_stops_at_the_first_bad_record_with_one_line(run, tmp_path, case):
    units, position = PB_CASES[case]
    src = write_units(tmp_path / "in.pb", units)
    out = tmp_path / "out.jsonl"
    result = run("convert", src, "-o", out)
    assert result.code == 1
    line = result.error_line()
    assert line.startswith("dts-bridge convert: ") and position in line, line
    assert not out.exists() and not list(tmp_path.glob(".*.part")), "a failed run leaves no output"


def blob_lines() -> list[bytes]:
    """Blob messages of a small stream: a transaction with an update (two messages, one Entry)."""
    upd = dml(5, rows=1)
    upd.event.dmlEvent.dmlEventType = pb.UPDATE
    upd.event.dmlEvent.rows[0].oldColumns.extend(upd.event.dmlEvent.rows[0].newColumns)
    return [orjson.dumps(m) for e in (begin(4), upd, dml(6)) for m in entry_to_blob(e)]


GOOD_BLOB = blob_lines()
HEARTBEAT = {"schema": {}, "payload": {"op": "MHEARTBEAT", "sequenceId": "7", "timestamp": {"eventTime": T0 * 1000}}}
# name -> (lines, bad line count, position named under fail)
BLOB_CASES = {
    "invalid JSON": ([GOOD_BLOB[0], b'{"schema": {', *GOOD_BLOB[1:]], 1, "line 2"),
    "invalid UTF-8": ([*GOOD_BLOB[:2], b'{"a": "\xff\xfe"}', *GOOD_BLOB[2:]], 1, "line 3"),
    "unknown op": ([orjson.dumps({**HEARTBEAT, "payload": {**HEARTBEAT["payload"], "op": "HEARTBEAT"}}),
                    *GOOD_BLOB], 1, "line 1"),
    "not an object": ([*GOOD_BLOB, b"[1, 2, 3]"], 1, f"line {len(GOOD_BLOB) + 1}"),
    "unpaired update half": ([GOOD_BLOB[0], GOOD_BLOB[1], *GOOD_BLOB[3:]], 1, "sequence_id"),
    "incomplete DML event": ([*GOOD_BLOB[:4]], 1, "seqId 6"),
    "blank lines": ([GOOD_BLOB[0], b"", b"   ", *GOOD_BLOB[1:]], 0, ""),
}


@pytest.mark.parametrize("target", ["dts", "dts-json", "tuple"])
@pytest.mark.parametrize("case", sorted(BLOB_CASES))
def test_blob_input_accounts_for_every_line(run, tmp_path, case, target):
    lines, bad, _ = BLOB_CASES[case]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    rejects = tmp_path / "rejects.jsonl"
    result = run("convert", src, "-o", tmp_path / OUTPUTS[target], "--on-error", "skip", "--rejects", rejects,
                 "--to", target)
    records = sum(1 for line in lines if line.strip())
    # Tuple output has no row for the TRANSACTION_BEGIN message every case starts with
    quiet = sum(1 for line in lines if b'"TRANSACTION_BEGIN"' in line) if target == "tuple" else 0
    assert result.counts() == {"input": records, "rejected": bad, "not_emitted": quiet,
                               "converted": records - bad - quiet}
    assert sum(line["records"] for line in json_lines(rejects.read_bytes())) == bad
    assert result.code == (1 if bad else 0)


@pytest.mark.parametrize("case", sorted(c for c in BLOB_CASES if BLOB_CASES[c][1]))
def test_blob_input_fail_names_the_line(run, tmp_path, case):
    lines, _, position = BLOB_CASES[case]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    result = run("convert", src, "-o", tmp_path / "out.pb")
    assert result.code == 1 and position in result.error_line()


def test_a_duplicated_update_half_costs_one_record(run, tmp_path):
    src = tmp_path / "dup.jsonl"
    src.write_bytes(b"\n".join([GOOD_BLOB[0], GOOD_BLOB[1], GOOD_BLOB[1], GOOD_BLOB[2]]) + b"\n")
    result = run("convert", src, "-o", tmp_path / "out.dts.jsonl", "--on-error", "skip")
    assert result.counts() == {"input": 4, "rejected": 1, "not_emitted": 0, "converted": 3}
    assert len((tmp_path / "out.dts.jsonl").read_bytes().splitlines()) == 2


# name -> (line, whether it is a readable Entry, bad only for the Blob and Tuple encoders)
DTS_JSON_CASES = {
    "invalid JSON": (b'{"header": ', False),
    "not an Entry": (b'{"header": {"seqId": "nope"}}', False),
    "unknown field": (b'{"header": {"noSuchField": 1}}', False),
    "unknown message type": (orjson.dumps({"header": {"messageType": 99, "seqId": "3", "timestamp": T0}}), True),
}


def _dml_with_rows(line: bytes) -> bool:
    obj = json.loads(line)
    return obj["header"].get("messageType") == "DML" and bool(obj.get("event", {}).get("dmlEvent", {}).get("rows"))


@pytest.mark.parametrize("target", ["blob", "dts", "tuple"])
def test_dts_json_input_accounts_for_every_line(run, tmp_path, target):
    good_lines = [line for line in (SAMPLES / "mariadb.dts.jsonl").read_bytes().splitlines()[:12]]
    bad_lines = [line for line, _ in DTS_JSON_CASES.values()]
    # an unknown MessageType is an Entry: re-framing keeps it, the Blob and Tuple encoders reject it
    bad = sum(1 for _, readable in DTS_JSON_CASES.values() if not readable or target != "dts")
    src = tmp_path / "in.dts.jsonl"
    src.write_bytes(b"\n".join(good_lines[:5] + bad_lines + good_lines[5:]) + b"\n")
    out = tmp_path / OUTPUTS[target]
    result = run("convert", src, "-o", out, "--on-error", "skip", "--rejects", tmp_path / "r.jsonl", "--to", target)
    total = len(good_lines) + len(bad_lines)
    quiet = sum(not _dml_with_rows(line) for line in good_lines) if target == "tuple" else 0
    assert result.counts() == {"input": total, "rejected": bad, "not_emitted": quiet,
                               "converted": total - bad - quiet}
    lines = json_lines((tmp_path / "r.jsonl").read_bytes())
    assert len(lines) == bad and [line["line"] for line in lines][:3] == [6, 7, 8]

    failed = run("convert", src, "-o", out)
    assert failed.code == 1 and "line 6" in failed.error_line()


# ---- a line over --max-line-bytes (docs/decisions.md, "Streams and accounting"), and an Entry whose lines are never all held ---

def _long_lines(run, kind: str, tmp_path) -> tuple[list[bytes], pathlib.Path]:
    """Good lines of one JSON Lines input kind, and the path to write them to."""
    if kind == "blob":
        return list(GOOD_BLOB), tmp_path / "in.jsonl"
    if kind == "dts-json":
        return (SAMPLES / "mariadb.dts.jsonl").read_bytes().splitlines()[:6], tmp_path / "in.dts.jsonl"
    src, rows = _tuple_input(run, tmp_path)  # (its RecordSchema next to it)
    return rows[:6], src


@pytest.mark.parametrize("kind", ["blob", "dts-json", "tuple"])
def test_a_line_over_max_line_bytes_is_one_rejected_record_named_by_its_line(run, tmp_path, kind):
    """The line is rejected under the skip policy with its number (the rejects file keeps its first
    4 KiB and its length), the lines after it are converted, and under fail it stops the run."""
    lines, src = _long_lines(run, kind, tmp_path)
    source = kind
    limit = max(len(line) for line in lines)
    long_line = b'{"x":"' + b"y" * (3 * limit + 10_000) + b'"}'
    data = lines[:2] + [long_line] + lines[2:]
    src.write_bytes(b"\n".join(data) + b"\n")
    target = "tuple" if kind != "tuple" else "dts"
    out, rejects = tmp_path / OUTPUTS[target], tmp_path / "r.jsonl"
    result = run("convert", src, "--from", source, "-o", out, "--to", target, "--max-line-bytes", limit,
                 "--on-error", "skip", "--rejects", rejects)
    assert result.counts()["rejected"] == 1 and result.counts()["input"] == len(data), result.err
    [record] = [r for r in json_lines(rejects.read_bytes()) if r["kind"] == "LineTooLongError"]
    assert record["line"] == 3 and record["raw_truncated_from"] == len(long_line)
    assert base64_decode(record["raw_base64"]) == long_line[:min(4096, limit + 1)]
    assert f"max_line_bytes ({limit})" in record["reason"]
    fine = run("convert", src, "--from", source, "-o", out, "--to", target, "--max-line-bytes", len(long_line),
               "--on-error", "skip")
    assert fine.counts()["input"] == len(data)  # the same line under a limit it fits: read, then judged
    failed = run("convert", src, "--from", source, "-o", out, "--to", target, "--max-line-bytes", limit)
    assert failed.code == 1 and "line 3" in failed.error_line() and "max_line_bytes" in failed.error_line()


def base64_decode(text: str) -> bytes:
    import base64
    return base64.b64decode(text)


def test_max_line_bytes_applies_to_json_lines_input_only(run, tmp_path):
    result = run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "x.jsonl", "--max-line-bytes", "100")
    assert result.code == 2 and "--max-line-bytes" in result.error_line()


class _EndlessLine(io.RawIOBase):
    """A stream whose second line is `size` bytes long, made up as it is read; it records the
    largest read asked of it."""

    def __init__(self, size: int) -> None:
        self.first, self.left, self.largest = b'{"a":1}\n', size, 0

    def readable(self) -> bool:
        return True

    def readline(self, size: int = -1) -> bytes:
        self.largest = max(self.largest, size)
        if self.first:
            line, self.first = self.first, b""
            return line
        if self.left <= 0:
            return b""
        take = min(self.left, size)
        self.left -= take
        return b"z" * take + (b"\n" if self.left == 0 else b"")


def test_a_long_line_is_read_past_in_chunks_never_held_whole():
    """1 GiB of line read with a 1 MiB limit: no read asks for more than the limit and a chunk."""
    from bridge.wire.framing import read_lines
    stream = _EndlessLine(1 << 30)
    items = list(read_lines(stream, 1 << 20, "s"))
    assert items[0] == (1, b'{"a":1}\n')
    number, err = items[1]
    assert number == 2 and err.length == 1 << 30 and err.where == {"line": 2, "source": "s"}
    assert stream.largest <= (1 << 20) + 1


def _wide_entry(columns: int, rows: int) -> pb.Entry:
    """The issue's amplifier: one Entry, many int columns, empty rows (each message repeats the schema)."""
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=T0,
                                  schemaName="db", tableName="wide", seqId=1))
    dml_event = e.event.dmlEvent
    for i in range(columns):
        dml_event.columns.add(name=f"c{i}", originalType="int(11)")
    for _ in range(rows):
        dml_event.rows.add()
    return e


def test_convert_streams_an_entry_s_messages_in_flat_memory(tmp_path):
    """An Entry of 2,000 int columns and 4,000 empty rows (the issue's 90 KB input, a fifth of its
    rows) gives 325 MB of Blob lines, which held at once peak near 370 MB; `convert` writes them
    as it makes them, under 300 MB whatever the output size (the whole input: 1.6 GB, 122 MB)."""
    src = tmp_path / "wide.pb"
    with open(src, "wb") as fh:
        cli.write_pb(fh, cli.pack_entries([_wide_entry(2000, 4000)]))
    out = tmp_path / "wide.jsonl"
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    argv = [sys.executable, "-m", "bridge", "convert", str(src), "-o", str(out), "--to", "blob"]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    status, peak_kib = map(int, done.stdout.split())
    assert status == 0, done.stderr
    assert peak_kib < 300 * 1024, f"peak RSS {peak_kib // 1024} MiB"
    with open(out, "rb") as fh:
        first = fh.readline()
        count = 1 + sum(1 for _ in fh)
    assert count == 4000 and len(first) > 60_000
    assert orjson.loads(first)["dts"]["row"] == [0, 4000]


# ---- round trips and the committed samples -------------------------------------------------------

@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_pb_to_blob_to_pb_gives_the_same_entries(run, tmp_path, name):
    blob, back = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.pb"
    first = run("convert", SAMPLES / f"{name}.pb", "-o", blob, "--to", "blob")
    assert first.code == 0 and first.counts()["rejected"] == 0
    second = run("convert", blob, "-o", back)
    assert second.code == 0 and second.counts()["input"] == len(blob.read_bytes().splitlines())
    assert read_entries(back) == read_entries(SAMPLES / f"{name}.pb")


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_dts_json_and_pb_samples_convert_alike(run, tmp_path, name):
    from_pb = run("convert", SAMPLES / f"{name}.pb", "-o", tmp_path / "a.jsonl")
    from_json = run("convert", SAMPLES / f"{name}.dts.jsonl", "-o", tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert from_pb.counts() == from_json.counts()
    reframed = run("convert", SAMPLES / f"{name}.pb", "-o", tmp_path / "c.dts.jsonl")
    assert reframed.code == 0
    assert (tmp_path / "c.dts.jsonl").read_bytes() == (SAMPLES / f"{name}.dts.jsonl").read_bytes()


def test_reframing_with_a_smaller_message_size_splits_entries(run, tmp_path):
    out = tmp_path / "small.pb"
    result = run("convert", SAMPLES / "mixed.pb", "-o", out, "--max-message-bytes", "512")
    assert result.code == 0 and "Envelopes" in result.err
    with open(out, "rb") as fh:
        sizes = [len(raw) for _, _, raw in iter_pb_messages(fh)]
    assert max(sizes) <= 512 and len(sizes) > 8
    assert read_entries(out) == read_entries(SAMPLES / "mixed.pb")


def test_stdin_and_stdout_need_from_and_to(run):
    data = (SAMPLES / "mariadb.pb").read_bytes()
    result = run("convert", "-", "--from", "dts", "--to", "blob", stdin=data)
    assert result.code == 0 and result.counts()["input"] == 19
    messages = json_lines(result.out)
    assert messages and all(m["payload"]["op"] for m in messages)
    assert run("convert", "-", "--to", "blob", stdin=data).code == 2
    assert run("convert", SAMPLES / "mariadb.pb").code == 2


def test_strict_and_other_options_reach_the_library(run, tmp_path):
    lossless = json_lines(run("convert", SAMPLES / "types.pb", "--to", "blob").out)
    strict = json_lines(run("convert", SAMPLES / "types.pb", "--to", "blob", "--strict").out)
    assert all("dts" in m for m in lossless) and not any("dts" in m for m in strict)
    versioned = json_lines(run("convert", SAMPLES / "mariadb.pb", "--to", "blob", "--db-version", "10.6").out)
    assert {m["schema"]["source"]["dbVersion"] for m in versioned if m["schema"].get("source")} == {"10.6"}


def _non_default(name: str, type_name: str, default, choices):
    if type_name == "bool":
        return not default, [f"--{'no-' if default else ''}{name.replace('_', '-')}"]
    value = {"timezone": "Asia/Shanghai", "max_message_bytes": 4096, "max_line_bytes": 4096}.get(name)
    if value is None:
        value = next((c for c in (cli.CLI_CHOICES.get(name) or choices or ()) if c != default), "8.0.32")
    return value, [f"--{name.replace('_', '-')}", str(value)]


@pytest.mark.parametrize("spec", option_specs(), ids=lambda spec: spec[0])
def test_every_option_has_a_flag_that_sets_it(spec):
    name, type_name, default, choices, _ = spec
    value, flags = _non_default(name, type_name, default, choices)
    args = cli.build_parser().parse_args(["convert", "in.pb", "-o", "out.jsonl", *flags])
    options = cli.options_from(args, {"blob", "tuple", "pb", "lines"})
    assert getattr(options, name) == value and options == Options(**{name: value})


@pytest.mark.parametrize("argv, names", [
    (["--timezone", "Mars/Olympus_Mons"], "timezone"),
    (["--max-message-bytes", "4096"], "--max-message-bytes"),
    (["--on-error", "keep"], "--on-error"),
    (["--strict", "--control-events", "emit"], "control_events"),
    (["--rejects", "r.jsonl"], "--on-error skip"),
    (["--table", "db.t"], "--table"),
])
def test_bad_options_are_usage_errors_naming_the_option(run, tmp_path, argv, names):
    result = run("convert", SAMPLES / "mariadb.pb", "-o", tmp_path / "x.jsonl", *argv)
    assert result.code == 2 and names in result.err and len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("argv, says", [
    (["convert", "in.data", "-o", "x.jsonl"], "--from"),
    (["convert", "SAMPLES/mixed.pb", "-o", "x.data"], "--to"),
    (["convert", "SAMPLES/mixed.pb", "-o", "x.jsonl", "--from", "dts-json"], "does not fit"),
    (["convert", "SAMPLES/mixed.pb", "-o", "x.pb", "--to", "blob"], "does not fit"),
    (["convert", "missing.pb", "-o", "x.jsonl"], "cannot read missing.pb"),
    (["convert", "x.jsonl", "-o", "y.jsonl"], "nothing to convert"),
    (["convert", "SAMPLES/mixed.pb", "-o", "x.pb", "--max-message-bytes", "1"], "max_message_bytes"),
    (["inspect", "x.csv"], "inspect reads"),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_exit_2(run, tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    result = run(*[a.replace("SAMPLES", str(SAMPLES)) for a in argv])
    assert result.code == 2 and says in result.err, result.err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags, says", [
    (["--subscription", "s1"], "--subscription"),
    (["--since", "0", "--no-transactions"], "--since, --no-transactions"),
    (["--partition-by", "key", "--accept-data-loss"], "--partition-by, --accept-data-loss"),
    (["--transactional-id", "t"], "--transactional-id"),
    (["--fetch-process", "never"], "--fetch-process"),
])
def test_sync_refuses_the_to_dts_flags_in_the_forward_direction(run, flags, says):
    """Flags of `sync --to dts` would be ignored by sync --to blob / tuple: refused, before any
    broker or DataHub is asked (the addresses here answer nothing)."""
    result = run("sync", "--brokers", "127.0.0.1:1", "--topic", "t", "--offsets-file", "o.json", "--to", "blob",
                 "--datahub-endpoint", "http://127.0.0.1:1", "--project", "p", "--datahub-topic", "b", *flags)
    assert result.code == 2 and says in result.err and "only with --to dts" in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1, result.err


def test_an_internal_error_is_one_line_and_exit_1(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli.BlobEncoder, "convert_lines", lambda self, entry, raw=None: 1 / 0)
    argv = ["convert", str(SAMPLES / "mariadb.pb"), "-o", str(tmp_path / "x.jsonl")]
    with pytest.raises(ZeroDivisionError):  # under DTS_BRIDGE_DEBUG (set for every test) it surfaces
        cli.main(argv)
    monkeypatch.delenv(cli.DEBUG_ENV)
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "internal error: ZeroDivisionError" in err and cli.DEBUG_ENV in err
    assert not (tmp_path / "x.jsonl").exists()


# ---- Tuple files ---------------------------------------------------------------------------------

def tuple_files(folder: pathlib.Path, ext: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob(f"*.{ext}"))}


@pytest.mark.parametrize("ext", ["csv", "jsonl"])
def test_tuple_to_dts_to_tuple_gives_the_same_rows(run, tmp_path, ext):
    first = run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "t" / f"{{table}}.{ext}", "--to", "tuple")
    assert first.code == 0
    files = tuple_files(tmp_path / "t", ext)
    # shop.orders gains a column mid-stream: its later rows go to a second file with its own schema
    assert {"shop.orders." + ext, "shop.orders.v2." + ext, "shop.customers." + ext} <= set(files)
    assert (tmp_path / "t" / "shop.orders.v2.schema.json").exists()
    for name, data in files.items():
        rows = sum(1 for line in data.splitlines()[(1 if ext == "csv" else 0):] if line.strip())
        back = run("convert", tmp_path / "t" / name, "--from", "tuple", "-o", tmp_path / "back.pb")
        assert back.code == 0 and back.counts() == {"input": rows, "converted": rows, "rejected": 0, "not_emitted": 0}
        again = run("convert", tmp_path / "back.pb", "-o", tmp_path / "again" / f"x.{ext}", "--to", "tuple", "--mkdir")
        assert again.code == 0 and (tmp_path / "again" / f"x.{ext}").read_bytes() == data, name


def test_blob_to_tuple_goes_through_dts_and_counts_blob_messages(run, tmp_path):
    run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "direct" / "{table}.csv", "--to", "tuple")
    run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "mixed.jsonl")
    messages = [json.loads(line) for line in (tmp_path / "mixed.jsonl").read_bytes().splitlines()]
    chained = run("convert", tmp_path / "mixed.jsonl", "-o", tmp_path / "chained" / "{table}.csv", "--to", "tuple")
    dml_ops = ("INSERT", "UPDATE_BEFOR", "UPDATE_AFTER", "DELETE")
    dml_messages = sum(1 for m in messages if m["payload"]["op"] in dml_ops)
    assert chained.counts() == {"input": len(messages), "converted": dml_messages, "rejected": 0,
                                "not_emitted": len(messages) - dml_messages}
    assert tuple_files(tmp_path / "chained", "csv") == tuple_files(tmp_path / "direct", "csv")

    to_blob = run("convert", tmp_path / "direct" / "shop.customers.csv", "-o", tmp_path / "c.jsonl", "--to", "blob")
    assert to_blob.code == 0 and to_blob.counts()["rejected"] == 0
    assert run("validate", tmp_path / "c.jsonl").code == 0


def _tuple_input(run, tmp_path) -> tuple[pathlib.Path, list[bytes]]:
    run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "c.jsonl", "--to", "tuple", "--table", "shop.customers")
    return tmp_path / "c.jsonl", (tmp_path / "c.jsonl").read_bytes().splitlines()


def test_tuple_input_accounts_for_every_row(run, tmp_path):
    src, rows = _tuple_input(run, tmp_path)
    first = json.loads(rows[0])
    update_half = next(line for line in rows if b'"_operation_type_":"U"' in line)
    broken = [
        b"{not json",
        orjson.dumps({**first, "no_such_field": 1}),
        orjson.dumps({**first, "_operation_type_": "X"}),
        orjson.dumps({**first, "id": "not a number"}),
        update_half,  # a second copy: its partner pairs with the first one, this one is left over
    ]
    lines = rows[:2] + broken[:2] + [b""] + rows[2:] + broken[2:]
    src.write_bytes(b"\n".join(lines) + b"\n")
    result = run("convert", src, "--from", "tuple", "-o", tmp_path / "out.pb", "--on-error", "skip",
                 "--rejects", tmp_path / "r.jsonl")
    records = sum(1 for line in lines if line.strip())
    assert result.counts() == {"input": records, "rejected": len(broken), "not_emitted": 0,
                               "converted": records - len(broken)}
    assert sum(line["records"] for line in json_lines((tmp_path / "r.jsonl").read_bytes())) == len(broken)
    failed = run("convert", src, "--from", "tuple", "-o", tmp_path / "out.pb")
    assert failed.code == 1 and "line 3" in failed.error_line()


def test_tuple_csv_input_skips_one_bad_row_at_a_time(run, tmp_path):
    run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "c.csv", "--to", "tuple", "--table", "shop.customers")
    header, *rows = (tmp_path / "c.csv").read_bytes().splitlines()
    bad = [b"1,2,3", rows[0].replace(b"10001", b"ten", 1)]
    (tmp_path / "c.csv").write_bytes(b"\n".join([header, rows[0], bad[0], *rows[1:3], bad[1], *rows[3:]]) + b"\n")
    result = run("convert", tmp_path / "c.csv", "-o", tmp_path / "out.pb", "--on-error", "skip")
    total = len(rows) + len(bad)
    assert result.counts() == {"input": total, "rejected": 2, "not_emitted": 0, "converted": total - 2}
    failed = run("convert", tmp_path / "c.csv", "-o", tmp_path / "out.pb")
    assert failed.code == 1 and "row 2" in failed.error_line()


def test_tuple_output_takes_one_table_per_file(run, tmp_path):
    several = run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "all.csv", "--to", "tuple")
    assert several.code == 2 and "--table" in several.error_line() and not list(tmp_path.iterdir())
    one = run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "orders.csv", "--to", "tuple", "--table", "shop.orders")
    assert one.code == 0 and (tmp_path / "orders.csv").exists() and (tmp_path / "orders.v2.csv").exists()
    side = json.loads((tmp_path / "orders.schema.json").read_bytes())
    assert side["table"] == "shop.orders" and side["fields"][0] == {"name": "shop_id", "type": "BIGINT"}

    src = write_units(tmp_path / "shards.pb", [good(dml(1, table="t_1"), dml(2, table="t_2"))])
    shards = run("convert", src, "-o", tmp_path / "shards.jsonl", "--to", "tuple", "--source-table")
    assert shards.code == 0
    rows = json_lines((tmp_path / "shards.jsonl").read_bytes())
    assert [r["_source_table_"] for r in rows] == ["db.t_1"] * 2 + ["db.t_2"] * 2
    back = run("convert", tmp_path / "shards.jsonl", "--from", "tuple", "-o", tmp_path / "shards.dts.jsonl")
    assert back.code == 0
    tables = [e["header"]["tableName"] for e in json_lines((tmp_path / "shards.dts.jsonl").read_bytes())]
    assert tables == ["t_1", "t_1", "t_2", "t_2"]
    mixed = run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "m.jsonl", "--to", "tuple", "--source-table")
    assert mixed.code == 2 and "different RecordSchemas" in mixed.error_line()


def test_tuple_input_needs_its_schema(run, tmp_path):
    (tmp_path / "rows.jsonl").write_bytes(b"{}\n")
    result = run("convert", tmp_path / "rows.jsonl", "--from", "tuple", "-o", tmp_path / "x.pb")
    assert result.code == 2 and "--schema" in result.error_line()


def test_parquet_round_trip(run, tmp_path):
    pytest.importorskip("pyarrow")
    run("convert", SAMPLES / "mariadb.pb", "-o", tmp_path / "p" / "{table}.parquet", "--to", "tuple")
    back = run("convert", tmp_path / "p" / "blog.posts.parquet", "-o", tmp_path / "back.pb")
    assert back.code == 0
    again = run("convert", tmp_path / "back.pb", "-o", tmp_path / "again.jsonl", "--to", "tuple")
    direct = run("convert", SAMPLES / "mariadb.pb", "-o", tmp_path / "direct.jsonl", "--to", "tuple")
    assert again.code == direct.code == 0
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "direct.jsonl").read_bytes()


# ---- inspect, validate, samples, demo ------------------------------------------------------------

def _sample_entries(name: str) -> list[pb.Entry]:
    lines = (SAMPLES / f"{name}.dts.jsonl").read_bytes().splitlines()
    return [entry_from_json_line(line) for line in lines]


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_inspect_counts_what_the_file_holds(run, name):
    entries = _sample_entries(name)
    result = run("inspect", SAMPLES / f"{name}.pb", "--json")
    assert result.code == 0
    report = json.loads(result.out)
    kinds = {}
    for e in entries:
        kinds[pb.MessageType.Name(e.header.messageType)] = kinds.get(pb.MessageType.Name(e.header.messageType), 0) + 1
    assert report["records"] == len(entries) and report["message_types"] == kinds and report["errors"] == 0
    with open(SAMPLES / f"{name}.pb", "rb") as fh:
        assert report["envelopes"] == sum(1 for _ in iter_pb_messages(fh))
    rows = sum(len(e.event.dmlEvent.rows) for e in entries)
    assert sum(t.get("rows", 0) for t in report["tables"].values()) == rows
    assert sum(v for k, v in report["ops"].items() if k in ("INSERT", "UPDATE", "DELETE")) == rows
    same = json.loads(run("inspect", SAMPLES / f"{name}.dts.jsonl", "--json").out)
    assert {k: same[k] for k in ("records", "message_types", "ops", "tables", "row_images")} == \
        {k: report[k] for k in ("records", "message_types", "ops", "tables", "row_images")}


def test_inspect_reports_split_entries_and_row_images(run, tmp_path):
    report = json.loads(run("inspect", SAMPLES / "large.pb", "--json").out)
    # samples/README.md: Entries split across Envelopes: seqId 8 (4), seqId 13 (6), seqId 23 (4)
    assert (report["split_entries"], report["segments_of_split"]) == (3, 14)
    minimal = dml(3, rows=1)
    minimal.event.dmlEvent.rows[0].newColumns[1].CopyFrom(pb.Data(dataType=pb.NA))
    src = write_units(tmp_path / "m.pb", [good(dml(1), minimal, dml(2, rows=0))])
    report = json.loads(run("inspect", src, "--json").out)
    assert report["row_images"] == {"after full": 2, "after minimal": 1}
    blob = run("convert", src, "--to", "blob").out
    (tmp_path / "m.jsonl").write_bytes(blob)
    report = json.loads(run("inspect", tmp_path / "m.jsonl", "--json").out)
    assert report["row_images"] == {"after full": 2, "after minimal": 1} and report["ops"] == {"INSERT": 3}
    text = run("inspect", tmp_path / "m.jsonl")
    assert text.code == 0 and "db.t" in text.out.decode() and "after minimal 1" in text.out.decode()


def test_inspect_counts_xa_commit_as_the_commit_it_travels_as(run, tmp_path):
    xa = {**HEARTBEAT, "payload": {**HEARTBEAT["payload"], "op": "XACOMMIT"}}
    (tmp_path / "xa.jsonl").write_bytes(orjson.dumps(xa) + b"\n" + GOOD_BLOB[0] + b"\n")
    report = json.loads(run("inspect", tmp_path / "xa.jsonl", "--json").out)
    assert report["ops"] == {"XACOMMIT": 1, "TRANSACTION_BEGIN": 1}
    assert report["message_types"] == {"COMMIT": 1, "BEGIN": 1}


def test_inspect_counts_errors_and_exits_1(run, tmp_path):
    units, _ = PB_CASES["garbage bytes"]
    src = write_units(tmp_path / "bad.pb", units + [Unit(b"\x80", 1, 1, raw=True)])
    result = run("inspect", src, "--json")
    report = json.loads(result.out)
    assert result.code == 1 and report["errors"] == 2 and len(report["first_errors"]) == 2
    assert report["records"] == sum(u.records - u.bad for u in units)
    text = run("inspect", src)
    assert text.code == 1 and "DecodeError 2" in text.out.decode()


def test_validate_names_the_bad_lines(run, tmp_path):
    bad_type = orjson.loads(GOOD_BLOB[-1])
    bad_type["payload"]["after"]["dataColumn"]["id"] = "not a long"
    lines = [*GOOD_BLOB, b"{nope", orjson.dumps({**HEARTBEAT, "payload": {**HEARTBEAT["payload"], "op": "BEAT"}}),
             b"", orjson.dumps(bad_type)]
    src = tmp_path / "m.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    result = run("validate", src)
    out = result.out.decode().splitlines()
    n = len(GOOD_BLOB)
    assert result.code == 1
    assert {line.split(":")[1] for line in out} == {str(n + 1), str(n + 2), str(n + 4)}
    assert any(f":{n + 2}: payload/op" in line for line in out)
    assert any(f":{n + 4}: payload/after/dataColumn/id" in line for line in out)
    assert f"{n + 3} messages, 3 invalid" in result.err
    src.write_bytes(b"\n".join(GOOD_BLOB))
    assert run("validate", src).code == 0


def test_samples_writes_the_committed_samples(run, tmp_path):
    result = run("samples", tmp_path / "s")
    assert result.code == 0
    for name in SAMPLE_NAMES:
        for ext in (".pb", ".dts.jsonl"):
            assert (tmp_path / "s" / f"{name}{ext}").read_bytes() == (SAMPLES / f"{name}{ext}").read_bytes()


def test_demo_converts_every_sample_and_guards_spark(run, tmp_path, monkeypatch):
    samples = tmp_path / "samples"
    samples.mkdir()
    for name in ("mariadb", "types"):
        shutil.copy(SAMPLES / f"{name}.pb", samples)
    monkeypatch.setattr(cli, "_have", lambda module: module != "pyspark")
    result = run("demo", samples, "--out", tmp_path / "out")
    assert result.code == 0 and "pyspark is not installed" in result.err
    assert (tmp_path / "out" / "mariadb.blob.jsonl").exists() and (tmp_path / "out" / "types.blob.jsonl").exists()
    assert len(SUMMARY.findall(result.err)) >= 2

    monkeypatch.setattr(cli, "_have", lambda module: True)
    monkeypatch.setitem(sys.modules, "bridge.cli.demo", None)  # not installed
    result = run("demo", samples, "--out", tmp_path / "out")
    assert result.code == 0 and "bridge.cli.demo is not available" in result.err

    calls = []
    monkeypatch.setitem(sys.modules, "bridge.cli.demo",
                        types.SimpleNamespace(spark_summary=lambda d: calls.append(d) or "spark: 2 streams"))
    result = run("demo", samples, "--out", tmp_path / "out")
    assert result.code == 0 and b"spark: 2 streams" in result.out and calls == [str(samples)]


def test_progress_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    from bridge.cli import observe
    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        progress = observe.progress(unit="records", desc="x", stream=stream, delay=0, mininterval=0,
                                    describe=lambda: "5 rejected")
        assert list(progress.wrap(range(1000))) == list(range(1000))
        progress.close()
    assert "768 records" in tty.getvalue() and "5 rejected" in tty.getvalue() and pipe.getvalue() == ""


class _WatchedInput(io.RawIOBase):
    """Input that records, at every read, how much output had been written by then."""

    def __init__(self, data: bytes, out) -> None:
        self.data, self.pos, self.out, self.log = data, 0, out, []

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), 4096, len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        self.log.append((self.pos, self.out.tell()))
        return n


@pytest.mark.parametrize("source, argv", [
    ("pb", ["--from", "dts", "--to", "blob"]),
    ("blob", ["--from", "blob", "--to", "dts", "--max-message-bytes", "4096"]),
])
def test_convert_streams_output_before_the_input_ends(capsysbinary, monkeypatch, tmp_path, source, argv):
    data = (SAMPLES / "mixed.pb").read_bytes() * 20
    if source == "blob":
        (tmp_path / "in.pb").write_bytes(data)
        assert cli.main(["convert", str(tmp_path / "in.pb"), "-o", str(tmp_path / "in.jsonl")]) == 0
        data = (tmp_path / "in.jsonl").read_bytes()
    capsysbinary.readouterr()
    watched = _WatchedInput(data, sys.stdout.buffer)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(watched)))
    assert cli.main(["convert", "-", *argv]) == 0
    assert watched.pos == len(data)
    assert any(written > 0 for read, written in watched.log if read < len(data) // 2)


def test_the_module_docstring_example_runs():
    assert doctest.testmod(cli, optionflags=doctest.ELLIPSIS).failed == 0


# ---- help and docs -------------------------------------------------------------------------------

def _subcommands() -> dict:
    return dict(cli.build_parser()._subparsers._group_actions[0].choices)


@pytest.mark.parametrize("name", sorted(_subcommands()) + [""])
def test_every_help_ends_with_an_example_that_the_docs_show(run, name):
    result = run(*([name] if name else []), "--help")
    assert result.code == 0
    help_text = result.out.decode().rstrip().splitlines()
    example = help_text[-1].strip()
    assert example.startswith(f"dts-bridge {name}".strip() + " "), help_text[-1]
    block = help_text[help_text.index("example:") + 1:]
    docs = (ROOT / "docs" / "cli.md").read_text()
    assert all(line.strip() in docs for line in block), "docs/cli.md shows every help example"
    readme = (ROOT / "README.md").read_text()
    assert all(line.strip() in readme for line in block), "README.md shows every help example"
    if name:
        assert f"## `dts-bridge {name}`" in docs


def test_docs_mention_every_convert_flag():
    docs = (ROOT / "docs" / "cli.md").read_text()
    convert = _subcommands()["convert"]
    flags = [opt for action in convert._actions for opt in action.option_strings if opt.startswith("--")]
    assert len(flags) > len(option_specs())
    assert [flag for flag in flags if f"`{flag}" not in docs and flag != "--help"] == []


# ---- the installed console script ---------------------------------------------------------------

def test_console_script_pipes_and_fails_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    converted = subprocess.run([str(SCRIPT), "convert", str(SAMPLES / "mixed.pb"), "--to", "blob"],
                               capture_output=True, env=env, timeout=60)
    assert converted.returncode == 0 and SUMMARY.search(converted.stderr.decode())
    checked = subprocess.run([sys.executable, "-m", "bridge", "validate", "-"], input=converted.stdout,
                             capture_output=True, env=env, timeout=60)
    assert checked.returncode == 0 and b"118 messages, 0 invalid" in checked.stderr

    bad = write_units(tmp_path / "bad.pb", PB_CASES["wrong Envelope version"][0])
    failed = subprocess.run([str(SCRIPT), "convert", str(bad), "-o", str(tmp_path / "x.jsonl")],
                            capture_output=True, env=env, timeout=60)
    err = failed.stderr.decode()
    assert failed.returncode == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "unsupported Envelope version 2" in err and "offset 1" in err


def test_output_to_a_device_or_fifo_is_written_in_place_never_renamed_over(run, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    import threading
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    result = run("convert", ROOT / "samples" / "mixed.pb", "-o", fifo, "--to", "blob")
    reader.join(10)
    assert result.code == 0 and fifo.exists() and stat.S_ISFIFO(fifo.stat().st_mode)
    assert got and got[0].count(b"\n") == 118
    assert not list(tmp_path.glob(".*.part"))


def test_output_into_a_missing_directory_is_an_error_unless_mkdir(run, tmp_path):
    target = tmp_path / "missing" / "deeper" / "out.jsonl"
    refused = run("convert", SAMPLES / "mixed.pb", "-o", target)
    assert refused.code == 2 and "does not exist" in refused.err and "--mkdir" in refused.err
    assert not (tmp_path / "missing").exists()
    made = run("convert", SAMPLES / "mixed.pb", "-o", target, "--mkdir")
    reference = run("convert", SAMPLES / "mixed.pb", "-o", tmp_path / "here.jsonl")
    assert made.code == reference.code == 0 and target.read_bytes() == (tmp_path / "here.jsonl").read_bytes()


# ---- temporal policies (docs/cli.md): zero dates and fractional seconds --------------------------

def _realistic_zero_dates() -> int:
    """Zero dates in the DML row images of samples/realistic, counted from the file itself."""
    zero = 0
    for entry in _sample_entries("realistic"):
        dml_event = entry.event.dmlEvent
        for row in dml_event.rows:
            for image in (row.oldColumns, row.newColumns):
                zero += sum(d.bv.startswith(b"0000-00-00") for d in image)
    return zero


def test_tuple_of_zero_dates_exits_0_and_reports_them(run, tmp_path):
    """Issue 18: the default writes NULL for a zero date, counts it on the summary line and in the ledger."""
    zero = _realistic_zero_dates()
    assert zero > 5
    result = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "t" / "{table}.jsonl", "--to", "tuple",
                 "--ledger", tmp_path / "ledger.jsonl")
    assert result.code == 0 and result.counts()["rejected"] == 0
    assert f"; {zero} zero or invalid dates written as null" in result.err
    ledger = [orjson.loads(line) for line in (tmp_path / "ledger.jsonl").read_bytes().splitlines()]
    assert len(ledger) == zero and {r["kind"] for r in ledger} == {"zero_dates"}
    assert {r["column"] for r in ledger} == {"shipped_on", "closed_at", "joined_on"}
    assert all(r["value"].startswith("0000-00-00") and r["written"] is None and r["partition"] == 0
               and "offset" in r and "entry" in r for r in ledger)
    rows = [orjson.loads(line) for line in (tmp_path / "t" / "mall.orders.jsonl").read_bytes().splitlines()]
    assert any(r["shipped_on"] is None for r in rows) and any(isinstance(r["shipped_on"], int) for r in rows)


def test_tuple_of_dates_beyond_datahubs_range_exits_0_and_reports_them(run, tmp_path):
    """samples/types holds MySQL's largest DATETIME, past DataHub's TIMESTAMP range: NULL under the
    default policy, counted apart from the zero dates and named in the ledger; an error under error."""
    result = run("convert", SAMPLES / "types.pb", "-o", tmp_path / "t" / "{table}.jsonl", "--to", "tuple",
                 "--ledger", tmp_path / "ledger.jsonl")
    assert result.code == 0 and result.counts()["rejected"] == 0, result.err
    ledger = [orjson.loads(line) for line in (tmp_path / "ledger.jsonl").read_bytes().splitlines()]
    beyond = [r for r in ledger if r["kind"] == "out_of_range"]
    assert beyond and all(r["value"].startswith("9999-12-31 23:59:59") and r["written"] is None for r in beyond)
    assert f"; {len(beyond)} dates beyond DataHub's TIMESTAMP range written as null" in result.err
    failed = run("convert", SAMPLES / "types.pb", "-o", tmp_path / "u" / "{table}.jsonl", "--to", "tuple",
                 "--zero-dates", "error")
    assert failed.code == 1 and re.search(r"(zero or invalid date|TIMESTAMP range).*\(partition 0, offset \d+, "
                                          r"seqId \d+, table typedb\.all_types, column \w+, source \S+, entry \d+\)",
                                          failed.error_line())


def test_zero_dates_error_fails_naming_the_position(run, tmp_path):
    result = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "t" / "{table}.jsonl", "--to", "tuple",
                 "--zero-dates", "error")
    assert result.code == 1
    line = result.error_line()
    assert "zero or invalid date" in line and "0000-00-00" in line
    assert re.search(r"\(partition 0, offset \d+, seqId \d+, table mall\.\w+, column (joined_on|shipped_on|"
                     r"closed_at)", line), line
    # the Entry is named by its index in its Entries message too: the first the ledger names
    run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "n" / "{table}.jsonl", "--to", "tuple",
        "--ledger", tmp_path / "ledger.jsonl")
    first = orjson.loads((tmp_path / "ledger.jsonl").read_bytes().splitlines()[0])
    assert f"offset {first['offset']}, " in line and line.endswith(f", entry {first['entry']})"), (first, line)
    skipped = run("convert", SAMPLES / "realistic.dts.jsonl", "-o", tmp_path / "u" / "{table}.jsonl", "--to", "tuple",
                  "--zero-dates", "error", "--on-error", "skip", "--rejects", tmp_path / "rejects.jsonl")
    assert skipped.code == 1 and skipped.counts()["rejected"] > 0
    first = orjson.loads((tmp_path / "rejects.jsonl").read_bytes().splitlines()[0])
    assert first["line"] and first["column"] in ("joined_on", "shipped_on", "closed_at")


def test_zero_dates_string_writes_the_text_as_sent(run, tmp_path):
    result = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "t" / "{table}.jsonl", "--to", "tuple",
                 "--zero-dates", "string")
    assert result.code == 0 and "zero or invalid" not in result.err
    schema = orjson.loads((tmp_path / "t" / "mall.orders.schema.json").read_bytes())
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types["shipped_on"] == types["paid_at"] == "STRING"
    rows = [orjson.loads(line) for line in (tmp_path / "t" / "mall.orders.jsonl").read_bytes().splitlines()]
    assert "0000-00-00" in {r["shipped_on"] for r in rows}


def test_strict_blob_truncates_sub_millisecond_digits_and_counts_them(run, tmp_path):
    result = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "s.jsonl", "--to", "blob", "--strict")
    assert result.code == 0 and re.search(r"; \d+ sub-millisecond fractions truncated or rounded", result.err)
    exact = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "e.jsonl", "--to", "blob", "--strict",
                "--temporal-precision", "exact")
    assert exact.code == 1 and "sub-millisecond" in exact.error_line() and "column paid_at" in exact.error_line()
    lossless = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "l.jsonl", "--to", "blob")
    assert lossless.code == 0 and "truncated" not in lossless.err and "zero or invalid" not in lossless.err


def test_blob_to_tuple_counts_substitutions_too(run, tmp_path):
    run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "r.jsonl", "--to", "blob")
    result = run("convert", tmp_path / "r.jsonl", "-o", tmp_path / "t" / "{table}.csv", "--to", "tuple")
    assert result.code == 0 and f"; {_realistic_zero_dates()} zero or invalid dates written as null" in result.err


def test_temporal_policy_flags_apply_to_strict_blob_and_tuple_only(run, tmp_path):
    result = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "x.dts.jsonl", "--zero-dates", "error")
    assert result.code == 2 and "--zero-dates has no effect" in result.error_line()
    lossless = run("convert", SAMPLES / "realistic.pb", "-o", tmp_path / "x.jsonl", "--temporal-precision", "round")
    assert lossless.code == 2 and "--temporal-precision has no effect without --strict" in lossless.error_line()
