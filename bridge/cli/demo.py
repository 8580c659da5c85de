"""The Spark part of `make demo`: the sample streams through `bridge.spark.dts_to_blob` on local[2].

Each sample `.pb` file becomes one partition of a Kafka-shaped DataFrame (topic `dts`, offset =
message number), as if DTS had written the streams to a four-partition topic; the summary counts
Blob messages per table and op.

    python -m bridge.cli.demo samples
"""
from __future__ import annotations

import argparse
import datetime
import pathlib

from bridge.blob.decode import ALL_OPS
from bridge.wire.framing import read_pb

__all__ = ["spark_summary", "kafka_rows", "summary_table", "main"]

TOPIC = "dts"


def kafka_rows(paths, topic: str = TOPIC) -> list[tuple]:
    """Rows of the Kafka source schema: file i is partition i, each Envelope one record."""
    stamp = datetime.datetime(2021, 5, 17, tzinfo=datetime.timezone.utc)
    return [(None, raw, topic, partition, number, stamp)
            for partition, path in enumerate(paths)
            for number, _, raw in read_pb(path)]


def _table_label(db, table) -> str:
    if table:
        return f"{db}.{table}"
    return f"{db} (database)" if db else "(none)"


def summary_table(counts) -> str:
    """A text table of (db, table, op, messages): one line per table, ops in the format's order.

    >>> print(summary_table([("shop", "orders", "INSERT", 3), ("shop", "orders", "DELETE", 1),
    ...                      (None, None, "TRANSACTION_BEGIN", 2)]))
    table        messages  by op
    -----------  --------  -----
    (none)              2  TRANSACTION_BEGIN 2
    shop.orders         4  INSERT 3, DELETE 1
    """
    order = {op: i for i, op in enumerate(ALL_OPS)}
    tables: dict[str, list] = {}
    for db, table, op, n in counts:
        tables.setdefault(_table_label(db, table), []).append((order.get(op, len(order)), op, n))
    width = max([len("table")] + [len(label) for label in tables])
    lines = [f"{'table':<{width}}  messages  by op", f"{'-' * width}  --------  -----"]
    for label in sorted(tables):
        ops = sorted(tables[label])
        detail = ", ".join(f"{op} {n}" for _, op, n in ops)
        lines.append(f"{label:<{width}}  {sum(n for _, _, n in ops):>8}  {detail}")
    return "\n".join(lines)


def spark_summary(samples_dir) -> str:
    """Run dts_to_blob over every `.pb` file in `samples_dir` on a local[2] session; return the
    per-table, per-op message counts and the run's accounting."""
    from bridge import spark as bridge_spark
    paths = sorted(pathlib.Path(samples_dir).glob("*.pb"))
    if not paths:
        raise FileNotFoundError(f"no .pb files in {samples_dir}")
    session = bridge_spark.local_session("dts-bridge demo")
    session.sparkContext.setLogLevel("ERROR")
    rows = kafka_rows(paths)
    df = session.createDataFrame(rows, bridge_spark.KAFKA_SCHEMA)
    tally = bridge_spark.SparkTally(session)
    blob = bridge_spark.dts_to_blob(df, tally=tally)
    counts = [tuple(r) for r in blob.groupBy("db", "table", "op").count().collect()]
    t = tally.value
    streams = ", ".join(f"{i}={p.stem}" for i, p in enumerate(paths))
    head = (f"Spark {session.version} ({session.sparkContext.master}): dts_to_blob over topic {TOPIC!r}, "
            f"partitions {streams}\n"
            f"{len(rows)} Envelopes -> {t.input} Entries -> {t.outputs} Blob messages "
            f"(converted {t.converted}, rejected {t.rejected}, not emitted {t.not_emitted})")
    return f"{head}\n\n{summary_table(counts)}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridge.cli.demo", description=__doc__.split("\n\n")[0],
                                     epilog="example: python -m bridge.cli.demo samples")
    parser.add_argument("samples_dir", nargs="?", default="samples", help="folder of .pb files (default: samples)")
    args = parser.parse_args(argv)
    print(spark_summary(args.samples_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
