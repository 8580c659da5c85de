"""A stalled shard merge in the Spark face (issue 40): `blob_to_dts` on a streaming
`format("datahub")` query over two shards whose heads hold each other back (a cycle, as
tests/test_reverse_foreign_writers.py `_crossing` builds it for `sync --to dts`). The merge in
Spark state decides at once (docs/kafka.md, "Reading DataHub: stalls"): under DROPMALFORMED /
PERMISSIVE the query ends with 3 Entries and the record that then comes out of order reported
(counted in the tally / an `error` row naming shard and sequence); under FAILFAST the query fails
with the StallError naming shard and sequence. Never a hang. Plus the options' checks
(`max_held`, `stall_seconds`, docs/spark.md)."""
from __future__ import annotations

import uuid

import pytest

pytest.importorskip("datahub")
pytest.importorskip("pyspark")


from bridge.errors import OptionsError  # noqa: E402
from support.crossing import write_crossing  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402

PROJECT = "stalls"


def _crossing(server, topic: str) -> None:
    write_crossing(server, PROJECT, topic)


@pytest.fixture(scope="module")
def server():
    with StandInDataHub() as s:
        yield s


def _run(spark, server, tmp_path, topic, mode, **kwargs):
    """The crossing topic read by an availableNow query into the memory sink: (query, rows, tally)."""
    import bridge.spark as bs
    server.create_topic(PROJECT, topic, shard_count=2)
    _crossing(server, topic)
    df = (spark.readStream.format("datahub").option("endpoint", server.endpoint).option("project", PROJECT)
          .option("topic", topic).option("accessId", "id").option("accessKey", "key").option("settle", 0.2).load())
    tally = bs.SparkTally(spark)
    name = f"stall_{uuid.uuid4().hex[:6]}"
    q = (bs.blob_to_dts(df, mode=mode, tally=tally, **kwargs).writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    from pyspark.errors import StreamingQueryException
    try:
        ended = q.awaitTermination(90)
    except StreamingQueryException:
        ended = True  # failed: q.exception() has it
    if not ended:
        q.stop()
    assert ended, "the query hung on the stall"
    rows = spark.sql(f"select * from {name}").collect() if q.exception() is None else []
    return q, rows, tally


def _entries(rows) -> list:
    from bridge.spark.kafka_sink import entries_of
    return list(entries_of(r["value"] for r in rows if r["value"] is not None))


def test_skip_decides_the_cycle_and_counts_the_out_of_order_record(spark, server, tmp_path):
    q, rows, tally = _run(spark, server, tmp_path, "cross_skip", "DROPMALFORMED", max_held=1000, stall_seconds=30)
    assert q.exception() is None, q.exception()
    assert len(_entries(rows)) == 3
    t = tally.value
    assert t.rejected == 1, t


def test_permissive_reports_the_out_of_order_record_in_an_error_row(spark, server, tmp_path):
    q, rows, _ = _run(spark, server, tmp_path, "cross_keep", "PERMISSIVE")
    assert q.exception() is None, q.exception()
    assert len(_entries(rows)) == 3
    errors = [r["error"] for r in rows if r["error"] is not None]
    assert len(errors) == 1, errors
    assert "shard" in errors[0] and "sequence" in errors[0], errors


def test_failfast_fails_the_query_with_the_stall(spark, server, tmp_path):
    q, _, _ = _run(spark, server, tmp_path, "cross_fail", "FAILFAST")
    err = q.exception()
    assert err is not None
    text = str(err)
    assert "StallError" in text and "the merge stalled" in text, text[-2000:]
    assert "shard" in text and "sequence" in text, text[-2000:]


@pytest.mark.parametrize("bad", [{"max_held": 0}, {"max_held": 1.5}, {"max_held": True},
                                 {"stall_seconds": 0}, {"stall_seconds": -1.0}, {"stall_seconds": "5"},
                                 {"stall_seconds": float("nan")}])
def test_bad_bounds_are_refused_naming_the_option(spark, bad):
    """Checked when the plan is built, on any input (they are used on `format("datahub")` rows)."""
    import bridge.spark as bs
    with pytest.raises(OptionsError, match=next(iter(bad))):
        bs.blob_to_dts(spark.createDataFrame([("x",)], "blob string"), **bad)
    with pytest.raises(OptionsError, match=next(iter(bad))):
        bs.tuple_to_dts(spark.createDataFrame([(1,)], "id int"), "db.t", **bad)
