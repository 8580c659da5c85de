"""(g) The CLI's peak memory and throughput converting large `.pb` streams to Blob.

The streams repeat the workload's Envelopes up to the asked size and are kept under
benchmarks/work/ (git-ignored) for the next run. Each conversion runs in its own process,
`dts-bridge convert FILE.pb -o - --to blob` with standard output sent to /dev/null, under
`/usr/bin/time -v` when present, else under a small Python wrapper reading
`getrusage(RUSAGE_CHILDREN)` (a fresh process, so no earlier child, e.g. Spark's JVM, counts).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import bridge
from bridge.wire.framing import encode_varint

MIB = 1 << 20
_WRAPPER = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print('Maximum resident set size (kbytes):', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
            "file=sys.stderr); sys.exit(rc)")


def _rows_per_envelope(envelope_bytes: list) -> list:
    """DML rows each Envelope completes (a segmented Entries counts at its last segment)."""
    reassembler = bridge.Reassembler()
    out = []
    for offset, raw in enumerate(envelope_bytes):
        rows = 0
        for item in reassembler.feed(0, offset, raw):
            rows += sum(len(e.event.dmlEvent.rows) for e in item.entries.items)
        out.append(rows)
    return out


def make_stream(envelope_bytes: list, size_mib: int, path: str) -> dict:
    """Write (or reuse) a `.pb` stream of at least `size_mib` MiB; returns its facts."""
    facts_path = path + ".json"
    if os.path.exists(path) and os.path.exists(facts_path):
        with open(facts_path) as fh:
            facts = json.load(fh)
        if facts.get("bytes") == os.path.getsize(path):
            return facts
    framed = [encode_varint(len(raw)) + raw for raw in envelope_bytes]
    rows = _rows_per_envelope(envelope_bytes)
    target, written, total_rows, envelopes = size_mib * MIB, 0, 0, 0
    tmp = path + ".part"
    with open(tmp, "wb") as fh:
        while written < target:
            for item, n in zip(framed, rows):
                fh.write(item)
                written += len(item)
                total_rows += n
                envelopes += 1
                if written >= target:
                    break
    os.replace(tmp, path)
    facts = {"bytes": written, "rows": total_rows, "envelopes": envelopes}
    with open(facts_path, "w") as fh:
        json.dump(facts, fh)
    return facts


def _cli() -> list:
    script = os.path.join(os.path.dirname(sys.executable), "dts-bridge")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "bridge"]


def convert(path: str) -> dict:
    """Peak RSS (KiB) and wall seconds of one CLI conversion of `path` to Blob."""
    command = _cli() + ["convert", path, "-o", "-", "--to", "blob"]
    timer = shutil.which("time", path="/usr/bin")
    if timer:
        wrapped, how = [timer, "-v"] + command, "/usr/bin/time -v"
    else:
        wrapped, how = [sys.executable, "-c", _WRAPPER] + command, "getrusage(RUSAGE_CHILDREN)"
    start = time.perf_counter()
    done = subprocess.run(wrapped, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if not found:
        raise RuntimeError(f"no peak RSS in the output of {how}: {done.stderr[-2000:]}")
    return {"max_rss_kib": int(found.group(1)), "seconds": seconds, "measured_with": how}


def run(envelope_bytes: list, rows: int, sizes_mib: list, work_dir: str, log: Callable[[str], None]) -> dict:
    out = {}
    for size in sizes_mib:
        path = os.path.join(work_dir, f"workload_{rows}r_{size}MiB.pb")
        facts = make_stream(envelope_bytes, size, path)
        log(f"rss: converting {path} ({facts['bytes'] / MIB:,.0f} MiB, {facts['rows']:,} rows)")
        result = convert(path)
        out[str(size)] = {**facts, "file_mib": round(facts["bytes"] / MIB, 1),
                          "max_rss_mib": round(result["max_rss_kib"] / 1024, 1),
                          "seconds": round(result["seconds"], 2),
                          "rows_per_s": round(facts["rows"] / result["seconds"]),
                          "measured_with": result["measured_with"]}
        log(f"rss: {size} MiB -> peak {out[str(size)]['max_rss_mib']} MiB, {out[str(size)]['rows_per_s']:,} rows/s")
    return out
