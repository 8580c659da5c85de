"""Ratios against the targets, the printed table, results.json, docs/performance.md and its chart."""
from __future__ import annotations

import json
import os

# name -> (what, comparison, target, kind); kind: "target", "stretch" or "info" (no target).
TARGETS: dict[str, tuple[str, str, float | None, str]] = {
    "dts_to_blob_vs_naive": ("(b) DTS -> Blob lossless / (a) naive", ">=", 8, "target"),
    "dts_to_blob_strict_vs_naive": ("(b) DTS -> Blob strict / (a) naive", ">=", 8, "target"),
    "dts_to_blob_entry_api_vs_naive": ("(b) pure functions: entry_to_blob + encode_blob / (a) naive", ">=", 8, "target"),
    "dts_to_blob_batch_vs_naive": ("(b) batch form: entries_to_blob_lines / (a) naive", ">=", 8, "target"),
    "shapes_dts_to_blob_min_vs_naive": ("(h) the lowest DTS -> Blob cell of the value-shape matrix / its naive "
                                        "baseline", ">=", 8, "target"),
    "dts_to_blob_entry_api_vs_floor": ("(b) entry_to_blob + encode_blob / its floor (parse + SerializeToString + "
                                       "orjson.dumps: the dicts built for free)", None, None, "info"),
    "entry_api_floor_vs_naive": ("entry API floor / (a) naive: the most a dict API reading the Entry's bytes could "
                                 "reach", None, None, "info"),
    "dts_to_blob_vs_floor": ("(b) lossless / combined floor (parse + orjson.dumps)", ">=", 0.2, "stretch"),
    "dts_to_blob_strict_vs_floor": ("(b) strict / combined floor (strict dicts)", ">=", 0.2, "stretch"),
    "blob_to_dts_vs_naive": ("(d) Blob -> DTS lossless / naive (json.loads + ParseDict)", ">=", 8, "target"),
    "shapes_blob_to_dts_min_vs_naive": ("(h) the lowest Blob -> DTS cell of the value-shape matrix / its naive "
                                        "baseline", ">=", 8, "target"),
    "blob_to_dts_strict_vs_naive": ("(d) Blob -> DTS strict / naive", ">=", 5, "target"),
    "blob_to_dts_vs_floor": ("(d) lossless / floor (orjson.loads + SerializeToString)", None, None, "info"),
    "python_read_floor_vs_naive": ("Python read floor / (a) naive: the most any pure-Python (b) could reach",
                                   None, None, "info"),
    "combined_python_floor_vs_naive": ("(Python read floor + orjson.dumps) / (a) naive", None, None, "info"),
    "python_build_floor_vs_naive": ("Python build floor / (d) naive: the most any pure-Python (d) could reach",
                                    None, None, "info"),
    "dts_to_tuple_vs_dts_to_blob": ("(e) DTS -> Tuple / (b) lossless", ">=", 0.6, "target"),
    "shapes_dts_to_tuple_min_vs_convert_lines": ("(h) the lowest DTS -> Tuple cell of the value-shape matrix / the "
                                                 "same shape's BlobEncoder.convert_lines", ">=", 0.6, "target"),
    "shapes_dts_to_tuple_min_vs_naive": ("(h) the lowest DTS -> Tuple cell of the value-shape matrix / its naive "
                                         "baseline", ">=", 8, "target"),
    "tuple_to_dts_vs_blob_to_dts": ("(e) Tuple -> DTS / (d) Blob -> DTS lossless", ">=", 0.6, "target"),
    "shapes_tuple_to_dts_min_vs_blob_to_dts": ("(h) the lowest Tuple -> DTS cell of the value-shape matrix / the "
                                               "same shape's Blob -> DTS", ">=", 0.6, "target"),
    "shapes_tuple_to_dts_min_vs_naive": ("(h) the lowest Tuple -> DTS cell of the value-shape matrix / the naive "
                                         "JSON -> DTS baseline", None, None, "info"),
    "spark_vs_single_process": ("(f) Spark local[2] dts_to_blob on Kafka-ordered input (ordered=True) / "
                                "single-process (b)", ">=", 0.9, "target"),
    "spark_vs_identity": ("(f) Spark dts_to_blob / mapInArrow identity pass", None, None, "info"),
    "spark_output_floor_vs_single_process": ("(f) Spark output floor (rows of the same count and size, nothing "
                                             "converted) / single-process (b): the most Spark could reach",
                                             None, None, "info"),
    "spark_vs_output_floor": ("(f) Spark dts_to_blob / its output floor", None, None, "info"),
    "dts_to_blob_dicts_vs_naive": ("(b) dict API (convert + encode_blob, images in C) / (a) naive", None, None, "info"),
    "dts_to_blob_python_vs_naive": ("(b) pure-Python path / (a) naive", None, None, "info"),
    "spark_shuffled_vs_single_process": ("(f) Spark dts_to_blob on interleaved input, which it shuffles into "
                                         "Kafka order / single-process (b)", None, None, "info"),
    "spark_streaming_running_vs_floor": ("(f2) the running streaming dts_to_blob query's pace (micro-batches after "
                                         "the first), open tails in state_location's files / Spark's streaming "
                                         "floor on the same files and trigger (repartition by Kafka partition + "
                                         "identity mapInArrow into noop)", ">=", 0.8, "target"),
    "spark_streaming_tuple_running_vs_floor": ("(f2) the same for streaming dts_to_tuple with state_location / the "
                                               "streaming floor", ">=", 0.8, "target"),
    "spark_streaming_state_store_running_vs_floor": ("(f2) the running streaming dts_to_blob query with its open "
                                                     "tails in Spark's state store (the default, "
                                                     "transformWithStateInPandas) / the streaming floor",
                                                     None, None, "info"),
    "spark_streaming_tuple_state_store_running_vs_floor": ("(f2) the same for dts_to_tuple in Spark's state store / "
                                                           "the streaming floor", None, None, "info"),
    "spark_streaming_ceiling_vs_floor": ("(f2) the ceiling: the floor's shuffle with the batch job's dts_to_blob "
                                         "function in its mapInArrow, no state (what no exact streaming design "
                                         "can beat) / the streaming floor", None, None, "info"),
    "spark_streaming_tuple_ceiling_vs_floor": ("(f2) the same ceiling with dts_to_tuple's batch function / the "
                                               "streaming floor", None, None, "info"),
    "spark_streaming_vs_floor": ("(f2) the whole streaming dts_to_blob query (4 micro-batches, query start "
                                 "included) / the whole floor query", None, None, "info"),
    "spark_streaming_vs_batch": ("(f2) Spark streaming dts_to_blob (4 micro-batches, query start included) / the "
                                 "batch job on the same input", None, None, "info"),
    "spark_streaming_running_vs_batch": ("(f2) the running streaming query's pace (micro-batches after the first) "
                                         "/ the batch job", None, None, "info"),
    "reverse_sync_vs_convert": ("(i) sync_to_dts (stand-in DataHub, 3 shards -> Kafka, exactly once) / dts-bridge "
                                "convert of the same Blob lines to .pb", ">=", 0.5, "target"),
    "reverse_sync_cli_vs_convert": ("(i) the dts-bridge sync --to dts process / the dts-bridge convert process",
                                    None, None, "info"),
    "reverse_sync_vs_convert_cpu": ("(i) the same as reverse_sync_vs_convert in CPU seconds (convert_cli's / "
                                    "sync_to_dts'): what a busy machine moves less", None, None, "info"),
    "cli_rss_growth": ("(g) CLI peak RSS, largest / smallest stream", "<=", 1.2, "target"),
    "cli_rss_largest_mib": ("(g) CLI peak RSS of the largest stream, MiB", "<", 200, "target"),
    "cli_vs_single_process": ("(g) CLI rows/s (smallest stream) / in-process (b)", None, None, "info"),
}


def _met(value, comparison, target):
    if value is None or comparison is None:
        return None
    return {">=": value >= target, "<=": value <= target, "<": value < target}[comparison]


def compute_ratios(results: dict) -> dict:
    cases, floors = results["cases"], results["floors"]

    def rate(name, which="rows_per_s"):
        return (cases.get(name) or floors.get(name) or {}).get(which)

    def div(a, b):
        return a / b if a is not None and b else None

    values: dict[str, tuple] = {}
    for which in ("rows_per_s", "rows_per_s_median"):
        for name, num, den in (
                ("dts_to_blob_vs_naive", "dts_to_blob", "naive_dts_to_blob"),
                ("dts_to_blob_strict_vs_naive", "dts_to_blob_strict", "naive_dts_to_blob"),
                ("dts_to_blob_entry_api_vs_naive", "dts_to_blob_entry_api", "naive_dts_to_blob"),
                ("dts_to_blob_batch_vs_naive", "dts_to_blob_batch", "naive_dts_to_blob"),
                ("dts_to_blob_dicts_vs_naive", "dts_to_blob_dicts", "naive_dts_to_blob"),
                ("dts_to_blob_python_vs_naive", "dts_to_blob_python", "naive_dts_to_blob"),
                ("dts_to_blob_entry_api_vs_floor", "dts_to_blob_entry_api", "entry_api_floor"),
                ("entry_api_floor_vs_naive", "entry_api_floor", "naive_dts_to_blob"),
                ("dts_to_blob_vs_floor", "dts_to_blob", "combined_floor"),
                ("dts_to_blob_strict_vs_floor", "dts_to_blob_strict", "combined_floor_strict"),
                ("blob_to_dts_vs_naive", "blob_to_dts", "naive_blob_to_dts"),
                ("blob_to_dts_strict_vs_naive", "blob_to_dts_strict", "naive_blob_to_dts"),
                ("blob_to_dts_vs_floor", "blob_to_dts", "blob_to_dts_floor"),
                ("python_read_floor_vs_naive", "python_read_floor", "naive_dts_to_blob"),
                ("combined_python_floor_vs_naive", "combined_python_floor", "naive_dts_to_blob"),
                ("python_build_floor_vs_naive", "python_build_floor", "naive_blob_to_dts"),
                ("dts_to_tuple_vs_dts_to_blob", "dts_to_tuple", "dts_to_blob"),
                ("tuple_to_dts_vs_blob_to_dts", "tuple_to_dts", "blob_to_dts")):
            values.setdefault(name, []).append(div(rate(num, which), rate(den, which)))
    matrix = results.get("shapes") or {}
    if matrix:
        from .shapes import BLOB_CELLS
        values["shapes_dts_to_blob_min_vs_naive"] = [min(s["ratios"][c] for s in matrix.values() for c in BLOB_CELLS)]
        values["shapes_dts_to_tuple_min_vs_convert_lines"] = [
            min(s["ratios"]["dts_to_tuple"] / s["ratios"]["convert_lines"] for s in matrix.values())]
        values["shapes_dts_to_tuple_min_vs_naive"] = [min(s["ratios"]["dts_to_tuple"] for s in matrix.values())]
        values["shapes_blob_to_dts_min_vs_naive"] = [min(s["ratios"]["blob_to_dts"] for s in matrix.values())]
        if all("tuple_vs_blob" in s for s in matrix.values()):
            values["shapes_tuple_to_dts_min_vs_blob_to_dts"] = [
                min(s["tuple_vs_blob"]["tuple_to_dts"] for s in matrix.values())]
            values["shapes_tuple_to_dts_min_vs_naive"] = [min(s["ratios"]["tuple_to_dts"] for s in matrix.values())]
    spark = results.get("spark") or {}
    if "rows_per_s" in spark:
        r = spark["rows_per_s"]
        values["spark_vs_single_process"] = [div(r["dts_to_blob"], r["single_process"])]
        values["spark_vs_identity"] = [div(r["dts_to_blob"], r["identity"])]
        if "output_floor" in r:
            values["spark_output_floor_vs_single_process"] = [div(r["output_floor"], r["single_process"])]
            values["spark_vs_output_floor"] = [div(r["dts_to_blob"], r["output_floor"])]
        values["spark_shuffled_vs_single_process"] = [div(r.get("dts_to_blob_shuffled"), r["single_process"])]
    streaming = results.get("spark_streaming") or {}
    if "rows_per_s" in streaming:
        values["spark_streaming_vs_batch"] = [streaming.get("streaming_vs_batch")]
        values["spark_streaming_running_vs_floor"] = [streaming.get("tails_running_vs_floor")]
        values["spark_streaming_tuple_running_vs_floor"] = [streaming.get("tails_tuple_running_vs_floor")]
        values["spark_streaming_state_store_running_vs_floor"] = [streaming.get("streaming_running_vs_floor")]
        values["spark_streaming_tuple_state_store_running_vs_floor"] = [
            streaming.get("streaming_tuple_running_vs_floor")]
        values["spark_streaming_vs_floor"] = [streaming.get("streaming_vs_floor")]
        values["spark_streaming_running_vs_batch"] = [streaming.get("streaming_running_vs_batch")]
        values["spark_streaming_ceiling_vs_floor"] = [streaming.get("ceiling_running_vs_floor")]
        values["spark_streaming_tuple_ceiling_vs_floor"] = [streaming.get("ceiling_tuple_running_vs_floor")]
    reverse = results.get("reverse") or {}
    if "ratios" in reverse:
        values["reverse_sync_vs_convert"] = [reverse["ratios"].get("sync_to_dts_vs_convert_cli")]
        values["reverse_sync_cli_vs_convert"] = [reverse["ratios"].get("sync_cli_vs_convert_cli")]
        values["reverse_sync_vs_convert_cpu"] = [reverse["ratios"].get("sync_to_dts_vs_convert_cli_cpu")]
    cli = results.get("cli") or {}
    if "streams" in cli:
        streams = sorted(cli["streams"].values(), key=lambda s: s["bytes"])
        small, large = streams[0], streams[-1]
        if len(streams) > 1:
            values["cli_rss_growth"] = [div(large["max_rss_mib"], small["max_rss_mib"])]
        values["cli_rss_largest_mib"] = [large["max_rss_mib"]]
        values["cli_vs_single_process"] = [div(small["rows_per_s"], rate("dts_to_blob"))]
    out = {}
    for name, (what, comparison, target, kind) in TARGETS.items():
        got = values.get(name)
        value = got[0] if got else None
        entry = {"what": what, "value": None if value is None else round(value, 4), "comparison": comparison,
                 "target": target, "kind": kind, "met": _met(value, comparison, target)}
        if got and len(got) > 1 and got[1] is not None:
            entry["value_from_medians"] = round(got[1], 4)
        if value is None:
            entry["note"] = "not measured in this run"
        out[name] = entry
    return out


# ---- text ----------------------------------------------------------------------------------------

def _fmt_rate(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _fmt_ratio(name: str, v) -> str:
    if v is None:
        return "not measured"
    return f"{v:,.1f} MiB" if name.endswith("_mib") else f"{v:.3g}x"


def _target_text(entry: dict) -> str:
    if entry["comparison"] is None:
        return ""
    unit = " MiB" if entry["what"].endswith("MiB") else "x"
    return f"{entry['comparison']} {entry['target']:g}{unit}" + (" (stretch)" if entry["kind"] == "stretch" else "")


def _met_text(entry: dict) -> str:
    return {True: "met", False: "NOT met", None: "-" if entry["comparison"] is None else "not measured"}[entry["met"]]


def case_rows(results: dict) -> list[tuple]:
    rows = []
    for name, c in {**results["cases"], **results["floors"]}.items():
        rows.append((name, c["description"], c["rows_per_s"], c.get("rows_per_s_median")))
    return rows


def text_table(results: dict) -> str:
    lines = [f"{'case':<30} {'rows/s (best)':>14} {'rows/s (median)':>16}  what"]
    for name, what, best, median in case_rows(results):
        lines.append(f"{name:<30} {_fmt_rate(best):>14} {_fmt_rate(median):>16}  {what}")
    spark = results.get("spark") or {}
    if "rows_per_s" in spark:
        for name, v in spark["rows_per_s"].items():
            lines.append(f"{'spark_' + name:<30} {_fmt_rate(v):>14} {'':>16}  (f) {spark['rows']:,} rows, local[2]")
    for name, p in ((results.get("reverse") or {}).get("passes") or {}).items():
        lines.append(f"{'reverse_' + name:<30} {_fmt_rate(p['rows_per_s']):>14} {_fmt_rate(p['rows_per_s_median']):>16}  "
                     f"(i) {results['reverse']['rows']:,} rows, stand-in DataHub -> Kafka")
    cli = results.get("cli") or {}
    for size, s in (cli.get("streams") or {}).items():
        lines.append(f"{'cli_' + size + 'MiB':<30} {_fmt_rate(s['rows_per_s']):>14} {'':>16}  (g) peak RSS "
                     f"{s['max_rss_mib']} MiB, {s['rows']:,} rows, {s['seconds']} s")
    lines.append("")
    lines.append(f"{'ratio':<36} {'measured':>12} {'target':>18}  {'':8} what")
    for name, r in results["ratios"].items():
        lines.append(f"{name:<36} {_fmt_ratio(name, r['value']):>12} {_target_text(r):>18}  {_met_text(r):8} {r['what']}")
    return "\n".join(lines)


# ---- files ---------------------------------------------------------------------------------------

def write_json(results: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(results, fh, indent=2, ensure_ascii=False)
        fh.write("\n")


def chart(results: dict, path: str) -> str | None:
    """A PNG of the target ratios (as a share of their target) and the throughput of every case;
    returns why not when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (.venv/bin/pip install matplotlib): no chart"
    ratios = [(n, r) for n, r in results["ratios"].items() if r["comparison"] and r["value"] is not None]
    matrix = results.get("shapes") or {}
    if matrix:
        fig = plt.figure(figsize=(14, 12))
        grid = fig.add_gridspec(2, 2, height_ratios=[1.2, 0.8], width_ratios=[1.1, 1])
        left, right, bottom = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
        _shape_panel(bottom, matrix)
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6.5), gridspec_kw={"width_ratios": [1.1, 1]})
    labels, scores, colours, notes = [], [], [], []
    for name, r in ratios:
        v, t = r["value"], r["target"]
        score = v / t if r["comparison"] == ">=" else (t / v if v else 0)
        labels.append(r["what"].replace(" / ", "\n/ ", 1) if len(r["what"]) > 46 else r["what"])
        scores.append(score)
        colours.append("#2e8b57" if r["met"] else ("#d4a017" if r["kind"] == "stretch" else "#c0392b"))
        notes.append(f"{_fmt_ratio(name, v)} (target {_target_text(r).replace(' (stretch)', ', stretch')})")
    y = range(len(labels))[::-1]
    low = min(scores + [1.0]) / 3
    left.barh(list(y), [s - low for s in scores], left=low, color=colours)
    left.axvline(1.0, color="black", linewidth=1)
    for yi, s, note in zip(y, scores, notes):
        left.text(s * 1.05, yi, note, va="center", fontsize=8)
    left.set_yticks(list(y), labels, fontsize=8)
    left.set_xscale("log")
    left.set_xlim(low, max(scores + [1.0]) * 6)
    left.set_xlabel("share of target, log scale (1 = met; 'at most' targets: target / measured)")
    left.set_title("Targets")
    names = [n for n, *_ in case_rows(results)]
    rates = [r for _, _, r, _ in case_rows(results)]
    spark = results.get("spark") or {}
    if "rows_per_s" in spark:
        names += ["spark_" + n for n in spark["rows_per_s"]]
        rates += list(spark["rows_per_s"].values())
    for size, s in ((results.get("cli") or {}).get("streams") or {}).items():
        names.append(f"cli_{size}MiB")
        rates.append(s["rows_per_s"])
    yy = range(len(names))[::-1]
    right.barh(list(yy), rates, color=["#7f8c8d" if "floor" in n or "naive" in n or "identity" in n else "#2c6fbb"
                                       for n in names])
    right.set_xscale("log")
    right.set_yticks(list(yy), names, fontsize=8)
    right.set_xlabel("rows/s (log scale; grey: baselines and floors)")
    right.set_title(f"Throughput, {results['workload']['rows']:,} DML rows")
    fig.suptitle(f"dts-datahub-bridge benchmarks ({results['generated'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _shape_panel(ax, matrix: dict) -> None:
    """(h): per value shape, each case's ratio to its naive baseline, grouped; the 8x line."""
    from .shapes import MATRIX_CASES, TARGET
    names = list(matrix)
    cells = list(MATRIX_CASES)
    width = 0.8 / len(cells)
    colours = ["#2c6fbb", "#5b9bd5", "#9dc3e6", "#d4a017", "#7f8c8d", "#b07aa1"]
    for k, cell in enumerate(cells):
        xs = [i + (k - (len(cells) - 1) / 2) * width for i in range(len(names))]
        values = [matrix[n]["ratios"][cell] for n in names]
        ax.bar(xs, values, width, label=MATRIX_CASES[cell][0], color=colours[k % len(colours)])
        for x, v in zip(xs, values):
            ax.text(x, v * 1.03, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    top = max([TARGET] + [s["ratios"][c] for s in matrix.values() for c in cells])
    ax.set_ylim(0, top * 1.3)  # room for the legend above the bars
    ax.axhline(TARGET, color="#c0392b", linewidth=1, linestyle="--")
    ax.text(len(names) - 0.5, TARGET * 1.04, f"target for DTS -> Blob: {TARGET}x", color="#c0392b", ha="right",
            fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=9)
    ax.set_ylabel("x the naive baseline (same bytes, same process)")
    ax.set_title("Value shapes (h): ratio to naive per shape")
    ax.legend(fontsize=8, ncol=3, loc="upper left")


def shape_rows(results: dict) -> list[tuple]:
    """(h) as table rows: shape, each cell's ratio, the Tuple cells over the same shape's Blob cells,
    whether the DTS -> Blob cells meet the target, what."""
    from .shapes import MATRIX_CASES, TARGET, TUPLE_VS_BLOB
    rows = []
    for name, shape in (results.get("shapes") or {}).items():
        cells = [f"{shape['ratios'][c]:.1f}x" for c in MATRIX_CASES]
        versus = shape.get("tuple_vs_blob") or {}
        tuple_cells = " / ".join(f"{versus[c]:.2f}" if c in versus else "-" for c in TUPLE_VS_BLOB)
        rows.append((f"`{name}`", *cells, tuple_cells, f"{shape['rows_per_s']['naive_dts_to_blob']:,}",
                     f">= {TARGET}x: " + ("met" if shape["met"] else "NOT met"), shape["description"]))
    return rows


NOTES_MARKER = "<!-- Hand-written notes below this line are kept when `make bench` rewrites this page. -->"


def _md_table(header: list, rows: list) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _floor_ratio(streaming: dict, name: str) -> str:
    """A streaming pass's time against the floor's (the running paces against the running floor)."""
    seconds = streaming["seconds"]
    floor = seconds.get("floor_running" if name.endswith("_running") else "floor")
    if name.startswith(("batch", "streaming_one")) or not floor or name not in seconds:
        return "-"
    return f"{floor / seconds[name]:.3f}x"


def markdown(results: dict, chart_name: str | None, old_page: str | None, method: str) -> str:
    env, params, work = results["environment"], results["parameters"], results["workload"]
    parts = [
        "# Performance",
        "",
        f"Generated by `{results['command']}` (`make bench` runs it with the defaults) on {results['generated']}. "
        "Re-run it to refresh every figure on this page and in `benchmarks/results.json`.",
        "",
        f"Machine: {env['cpus']} CPUs, Python {env['python']}, protobuf {env['protobuf']} "
        f"({env['protobuf_backend']} backend), orjson {env['orjson']}, pyspark {env.get('pyspark') or '-'}; "
        f"load average {env['load_before']} before the run and {env['load_after']} after it (other processes "
        "share this machine, which is why every figure that matters is a ratio measured in one process).",
        "",
        f"Workload: {work['rows']:,} DML row changes ({work['updates']:,} updates with before and after images, "
        f"the rest inserts) in {work['entries']:,} Entries and {work['envelopes']:,} Envelopes; "
        f"{work['entry_bytes_per_row']:.0f} bytes of Entry per row; {work['blob_messages']:,} Blob messages "
        f"(lossless, {work['blob_bytes_per_message']:.0f} bytes each).",
        "",
        "## Targets",
        "",
        _md_table(["ratio", "measured", "target", "", "what"],
                  [(f"`{n}`", _fmt_ratio(n, r["value"]), _target_text(r), _met_text(r), r["what"])
                   for n, r in results["ratios"].items()]),
        "",
    ]
    if chart_name:
        parts += [f"![ratios and throughput]({chart_name})", ""]
    parts += ["## Throughput", "",
              _md_table(["case", "rows/s (best)", "rows/s (median)", "what"],
                        [(f"`{n}`", _fmt_rate(b), _fmt_rate(m), w) for n, w, b, m in case_rows(results)]), ""]
    if results.get("shapes"):
        from .shapes import MATRIX_CASES
        first = next(iter(results["shapes"].values()))
        parts += ["## Value shapes (h): what DTS really sends", "",
                  f"One workload per value shape ({first['rows']:,} DML rows each, `--shape-rows`), every case as "
                  "a ratio to the naive baseline on the same bytes in the same process (DTS -> Blob and "
                  "DTS -> Tuple: parse + MessageToDict + json.dumps; Blob -> DTS and Tuple -> DTS: json.loads + "
                  "ParseDict + serialise). Target: every DTS -> Blob cell (the first three) >= 8x. Tuple / Blob: "
                  "DTS -> Tuple over `convert_lines`, Tuple -> DTS over Blob -> DTS, rows/s of the same shape "
                  "(target >= 0.6 both).", "",
                  _md_table(["shape", *(MATRIX_CASES[c][0] for c in MATRIX_CASES), "Tuple / Blob",
                             "naive rows/s", "DTS -> Blob", "what"], shape_rows(results)), ""]
    spark = results.get("spark") or {}
    parts += ["### Spark (f)", ""]
    if "rows_per_s" in spark:
        cpu = spark.get("cpu_seconds") or {}

        def cpu_of(name, kind):
            return cpu[name][kind] if name in cpu else "-"
        parts += [_md_table(["pass", "rows/s (best)", "seconds", "CPU s: JVM", "CPU s: Python workers",
                             "CPU s: driver"],
                            [(n, _fmt_rate(v), spark["seconds"][n], cpu_of(n, "jvm"), cpu_of(n, "python"),
                              cpu_of(n, "driver")) for n, v in spark["rows_per_s"].items()]), "",
                  f"{spark['rows']:,} rows in {spark['envelopes']} Envelopes on 2 Kafka partitions. Envelopes per "
                  f"Spark task: {spark['envelopes_per_spark_task']} in the Kafka-ordered input, "
                  f"{spark.get('envelopes_per_spark_task_shuffled')} after the shuffle of `dts_to_blob_shuffled`.",
                  ""]
    else:
        parts += [f"Not measured: {spark.get('skipped', 'skipped')}.", ""]
    streaming = results.get("spark_streaming") or {}
    parts += ["### Spark streaming (f2)", ""]
    if "rows_per_s" in streaming:
        parts += [_md_table(["pass", "rows/s (best)", "seconds", "/ streaming floor"],
                            [(n, _fmt_rate(v), streaming["seconds"][n], _floor_ratio(streaming, n))
                             for n, v in streaming["rows_per_s"].items()]), "",
                  f"{streaming['rows']:,} rows in {streaming['envelopes']} Envelopes on 2 Kafka partitions, "
                  f"{streaming['files']} files read one per micro-batch ({streaming['cuts_inside_entries']} cuts "
                  "inside an Entries). `*_running`: the micro-batches after the first, the query's start left out; "
                  "`floor`: the stream shuffled by Kafka partition through an identity `mapInArrow` into `noop`. "
                  "Running paces per round (rows/s): "
                  + "; ".join(f"{n} {', '.join(_fmt_rate(v) for v in vs)}"
                              for n, vs in (streaming.get("running_samples") or {}).items()) + ".", ""]
    else:
        parts += [f"Not measured: {streaming.get('skipped', 'skipped')}.", ""]
    reverse = results.get("reverse") or {}
    parts += ["### DataHub -> Kafka, `sync --to dts` (i)", ""]
    if "passes" in reverse:
        parts += [_md_table(["pass", "rows/s (best)", "rows/s (median)", "seconds (best)", "/ convert_cli"],
                            [(f"`{n}`", _fmt_rate(p["rows_per_s"]), _fmt_rate(p["rows_per_s_median"]),
                              p["seconds_best"], f"{p['rows_per_s'] / reverse['passes']['convert_cli']['rows_per_s']:.3f}x")
                             for n, p in reverse["passes"].items()]), "",
                  f"{reverse['rows']:,} rows in {reverse['entries']:,} Entries, {reverse['blob_lines']:,} Blob lines "
                  f"on {reverse['shards']} DataHub shards (stand-in) -> {reverse['kafka_partitions']} Kafka partitions "
                  f"(Kafka {reverse.get('kafka_version')}), best of {reverse['repeat']}.", ""]
    else:
        parts += [f"Not measured: {reverse.get('skipped', 'skipped')}.", ""]
    cli = results.get("cli") or {}
    parts += ["### CLI memory and throughput (g)", ""]
    if "streams" in cli:
        parts += [_md_table(["stream", "rows", "peak RSS (MiB)", "seconds", "rows/s"],
                            [(f"{s['file_mib']} MiB", f"{s['rows']:,}", s["max_rss_mib"], s["seconds"],
                              _fmt_rate(s["rows_per_s"])) for s in cli["streams"].values()]), "",
                  f"Measured with {next(iter(cli['streams'].values()))['measured_with']}.", ""]
    else:
        parts += [f"Not measured: {cli.get('skipped', 'skipped')}.", ""]
    parts += ["## Hot spots", ""]
    if not results.get("profile"):
        parts += ["Not profiled in this run (`--profile-rows 0`).", ""]
    for name, prof in (results.get("profile") or {}).items():
        parts += [f"### `{name}` ({prof['rows']:,} rows under cProfile, {prof['total_seconds']} s of own time)", "",
                  _md_table(["function", "calls", "tottime (s)", "share"],
                            [(f"`{f['function']}`", f"{f['calls']:,}", f["tottime"], f"{f['share']:.1%}")
                             for f in prof["functions"]]), ""]
    parts += ["## Method", "", method.strip(), "",
              f"Parameters of this run: {', '.join(f'{k}={v}' for k, v in params.items())}.", ""]
    notes = ""
    if old_page and NOTES_MARKER in old_page:
        notes = old_page.split(NOTES_MARKER, 1)[1].strip("\n")
    parts += [NOTES_MARKER, "", notes or "## Notes\n\n(none yet)", ""]
    return "\n".join(parts)


def write_markdown(results: dict, path: str, chart_name: str | None, method: str) -> None:
    old = open(path).read() if os.path.exists(path) else None
    with open(path, "w") as fh:
        fh.write(markdown(results, chart_name, old, method))
