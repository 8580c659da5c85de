"""(h) The value-shape matrix (docs/performance.md, "Value shapes (h)"): one workload per shape of value DTS really sends.

Each shape is a list of Entry encodings (the bytes a consumer has after unpacking Entries). The
first five start from the benchmarks' own table (`workload.py`) and change one thing in it, so a
ratio that falls names its cause; the realistic mix is `bridge.samples.values.realistic_entries`
(REAL_ORDERS: one column per documented shape, as DTS writes them, and the gbk table
REAL_SUPPLIERS). Every shape runs the same cases, interleaved in one process, each as a ratio to
its naive baseline on the same bytes.
"""
from __future__ import annotations

import random
from collections.abc import Callable

from bridge import pb
from bridge.samples.values import REAL_ORDERS, REAL_PROPERTIES, REAL_SUPPLIERS, realistic_entries

from . import cases, workload

_TEMPORAL_COLUMNS = ("created_at", "birthday", "updated_at")
_TEXT_COLUMNS = ("customer", "note")


def _canonical(rows: int, seed: int) -> list[bytes]:
    return workload.build(rows, seed=seed).entry_bytes


def _reshaped(change: Callable[[pb.Entry, random.Random], None]) -> Callable[[int, int], list[bytes]]:
    """A shape: the canonical workload with `change` applied to every Entry."""
    def build(rows: int, seed: int) -> list[bytes]:
        rng = random.Random(seed)
        out = []
        for entry in workload.build(rows, seed=seed).entries:
            change(entry, rng)
            out.append(entry.SerializeToString())
        return out
    return build


def _images(entry: pb.Entry):
    for row in entry.event.dmlEvent.rows:
        for image in (row.oldColumns, row.newColumns):
            if image:
                yield image


def _column_indexes(entry: pb.Entry, names) -> list[int]:
    return [i for i, c in enumerate(entry.event.dmlEvent.columns) if c.name in names]


def _temporal_charset(entry: pb.Entry, rng: random.Random) -> None:
    """DATETIME, TIMESTAMP "... +00:00" and DATE as STRING with a charset (utf8mb4 or binary, per Entry)."""
    charset = "utf8mb4" if entry.header.seqId % 2 else "binary"
    for image in _images(entry):
        for i in _column_indexes(entry, _TEMPORAL_COLUMNS):
            if image[i].dataType == pb.STRING:
                image[i].charset = charset


def _datetime6(entry: pb.Entry, rng: random.Random) -> None:
    """created_at as DATETIME(6) with microseconds (a sub-millisecond part in nearly every value)."""
    (index,) = _column_indexes(entry, ("created_at",))
    entry.event.dmlEvent.columns[index].originalType = "datetime(6)"
    for image in _images(entry):
        if image[index].dataType == pb.STRING:
            image[index].bv += b".%06d" % rng.randrange(10 ** 6)


def _gbk_text(entry: pb.Entry, rng: random.Random) -> None:
    """The text columns in charset gbk (characters gbk lacks become '?', as MySQL stores them)."""
    for image in _images(entry):
        for i in _column_indexes(entry, _TEXT_COLUMNS):
            if image[i].dataType == pb.STRING:
                image[i].bv = image[i].bv.decode("utf-8").encode("gbk", errors="replace")
                image[i].charset = "gbk"


def _header_properties(entry: pb.Entry, rng: random.Random) -> None:
    """Header properties on every Entry (the realistic samples' pair)."""
    for key, value in REAL_PROPERTIES:
        entry.header.properties.add(key=key, value=value)


def _realistic(rows: int, seed: int) -> list[bytes]:
    """REAL_ORDERS in Entries of 1 and 3 rows and the gbk table REAL_SUPPLIERS, interleaved in
    the ratio 4 : 4 : 1 Entries, with header properties: DTS's bytes as `realistic_entries` writes them."""
    groups = rows // 17 + 1  # 4 + 12 + 1 rows per group
    one = realistic_entries(4 * groups, seed=seed)
    three = realistic_entries(4 * groups, seed=seed + 1, rows_per_entry=3)
    gbk = realistic_entries(groups, seed=seed + 2, table=REAL_SUPPLIERS)
    out = []
    for g in range(groups):
        out += one[4 * g:4 * g + 4] + three[4 * g:4 * g + 4] + gbk[g:g + 1]
    return out


# name -> (what, builder(rows, seed) -> Entry encodings); the order is the table's
SHAPES: dict[str, tuple[str, Callable[[int, int], list[bytes]]]] = {
    "canonical": ("the benchmarks' own 12-column table (workload.py)", _canonical),
    "temporal_charset": ("DATETIME, TIMESTAMP '... +00:00' and DATE as STRING with a charset (utf8mb4, binary)",
                         _reshaped(_temporal_charset)),
    "datetime6": ("DATETIME(6) with microseconds", _reshaped(_datetime6)),
    "gbk_text": ("text as STRING in charset gbk", _reshaped(_gbk_text)),
    "header_properties": ("Entries with header properties", _reshaped(_header_properties)),
    "realistic": (f"the realistic mix: {REAL_ORDERS.schema}.{REAL_ORDERS.name} (text in utf8/utf8mb4/gbk/latin1, "
                  "temporals with and without a charset, DATETIME(6), zero dates, NULL as NIL and as an empty "
                  "Data, a double as '1', BIT, YEAR, json/blob/geometry) and the gbk table "
                  f"{REAL_SUPPLIERS.schema}.{REAL_SUPPLIERS.name}, header properties", _realistic),
}

# case -> (what, function, the naive case it is a ratio to); the order is the matrix's columns
MATRIX_CASES: dict[str, tuple[str, Callable, str]] = {
    "entry_to_blob": ("DTS -> Blob: entry_to_blob + encode_blob", cases.bridge_entry_to_blob, "naive_dts_to_blob"),
    "entry_api_floor": ("its floor: parse + SerializeToString + orjson.dumps of prebuilt dicts (no target)",
                        cases.entry_api_floor, "naive_dts_to_blob"),
    "entries_to_blob_lines": ("DTS -> Blob: entries_to_blob_lines (batch)", cases.bridge_entries_to_blob_lines,
                              "naive_dts_to_blob"),
    "convert_lines": ("DTS -> Blob: BlobEncoder.convert_lines", cases.CASES["dts_to_blob"][1], "naive_dts_to_blob"),
    "dts_to_tuple": ("DTS -> Tuple: TupleEncoder.convert(entry, raw)", cases.bridge_dts_to_tuple, "naive_dts_to_blob"),
    "blob_to_dts": ("Blob -> DTS: BlobDecoder.feed_line + serialise", cases.CASES["blob_to_dts"][1],
                    "naive_blob_to_dts"),
    "tuple_to_dts": ("Tuple -> DTS: TupleDecoder.feed + serialise", cases.bridge_tuple_to_dts, "naive_blob_to_dts"),
}
BASELINES = {"naive_dts_to_blob": cases.naive_dts_to_blob, "naive_blob_to_dts": cases.naive_blob_to_dts}
TARGET = 8  # every DTS -> Blob cell, as a ratio to the naive baseline (docs/performance.md, "Targets")
BLOB_CELLS = ("entry_to_blob", "entries_to_blob_lines", "convert_lines")
# each direction's Tuple cell -> the same shape's Blob cell it is a ratio to ("tuple_vs_blob");
# target: >= TUPLE_TARGET (issue 18, point 3: Tuple as fast as Blob, both directions)
TUPLE_VS_BLOB = {"dts_to_tuple": "convert_lines", "tuple_to_dts": "blob_to_dts"}
TUPLE_TARGET = 0.6


def chunks(raws: list[bytes], chunk_rows: int):
    """cases.Chunk of about `chunk_rows` rows each, over the shape's own bytes (the realistic mix's
    non-canonical spellings, such as NIL written out, stay as sent)."""
    part: list[bytes] = []
    rows = 0
    for raw in raws:
        part.append(raw)
        rows += len(pb.Entry.FromString(raw).event.dmlEvent.rows)
        if rows >= chunk_rows or raw is raws[-1]:
            chunk = cases.prepare([pb.Entry.FromString(r) for r in part], rows)
            chunk.entry_bytes = part
            yield chunk
            part, rows = [], 0


def run(rows: int, seed: int, chunk_rows: int, repeat: int, names: list[str], log) -> dict:
    """Time every matrix case and its baseline on every shape in `names`; ratios per shape."""
    from .timing import interleaved
    functions = {**BASELINES, **{name: fn for name, (_, fn, _) in MATRIX_CASES.items()}}
    out = {}
    for shape in names:
        what, build = SHAPES[shape]
        raws = build(rows, seed)
        log(f"shape {shape}: {len(raws):,} Entries")
        timings = interleaved(functions, chunks(raws, chunk_rows), repeat)
        rates = {name: round(t.rate("best")) for name, t in timings.items()}
        ratios = {name: round(rates[name] / rates[base], 3) for name, (_, _, base) in MATRIX_CASES.items()}
        tuple_vs_blob = {name: round(rates[name] / rates[blob], 3) for name, blob in TUPLE_VS_BLOB.items()}
        out[shape] = {"description": what, "rows": timings["naive_dts_to_blob"].rows, "entries": len(raws),
                      "rows_per_s": rates, "ratios": ratios, "tuple_vs_blob": tuple_vs_blob,
                      "met": all(ratios[c] >= TARGET for c in BLOB_CELLS)}
        log(f"shape {shape}: " + ", ".join(f"{n} {r:.1f}x" for n, r in ratios.items())
            + "; Tuple / Blob: " + ", ".join(f"{n} {r:.2f}" for n, r in tuple_vs_blob.items()))
    return out
