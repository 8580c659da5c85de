"""Spark transforms (docs/spark.md): for every sample, in every direction, the Spark output equals
what the pure functions give; split Envelopes reassemble across Arrow batches; the three modes.

One local[2] session serves every test (getOrCreate); each test is one or two small Spark jobs.
"""
import datetime
import doctest
import os
import pathlib
import shutil
import subprocess
import sys
from decimal import Context, Decimal

import pytest

import bridge
from bridge import pb
from bridge.stream import ErrorPolicy, dts_records_to_entries, entries_to_messages

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("pandas")

import bridge.cli.demo  # noqa: E402
import bridge.spark as bs  # noqa: E402
from bridge.tuple import TupleDecoder, TupleEncoder, record_schema  # noqa: E402

SAMPLES_DIR = pathlib.Path(__file__).resolve().parent.parent / "samples"
SAMPLES = sorted(SAMPLES_DIR.glob("*.pb"))
TOPIC = "dts"
MAX_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"


def _tables():
    out = []
    for path in SAMPLES:
        names = []
        for _, entry in pure_entries(path)[0]:
            h = entry.header
            name = f"{h.schemaName}.{h.tableName}"
            if h.messageType == pb.DML and name not in names:
                names.append(name)
        out += [(path, name) for name in names]
    return out


# ---- pure references ------------------------------------------------------------------------

def envelopes(path) -> list[bytes]:
    return [raw for _, _, raw in bridge.read_pb(path)]


def pure_entries(path_or_envelopes, on_error="fail"):
    """[(where, Entry)] and the policy, as the CLI reads a .pb stream (partition 0)."""
    raws = envelopes(path_or_envelopes) if isinstance(path_or_envelopes, pathlib.Path) else path_or_envelopes
    policy = ErrorPolicy(on_error)
    return list(dts_records_to_entries([(0, n, raw) for n, raw in enumerate(raws)], policy)), policy


def micros(us: int) -> datetime.datetime:
    """A TimestampType value as pyspark collects it (local wall time, naive)."""
    from pyspark.sql.types import TimestampType
    return TimestampType().fromInternal(us)


def pure_blob_rows(path_or_envelopes, on_error="fail"):
    entries, policy = pure_entries(path_or_envelopes, on_error)
    rows = []
    for where, msg in entries_to_messages(entries, bridge.BlobEncoder().convert, policy):
        if msg is None:
            continue
        payload = msg["payload"]
        source = msg["schema"].get("source") or {}
        rows.append((TOPIC, where["partition"], where["offset"], where["entry"], where["row"],
                     payload["sequenceId"], payload["op"], source.get("dbName"), source.get("tableName"),
                     bridge.shard_key(msg), micros(payload["timestamp"]["eventTime"] * 1000),
                     bridge.encode_blob(msg).decode()))
    return rows, policy


def pure_columns(path, table) -> list:
    merged = {}
    for _, entry in pure_entries(path)[0]:
        h = entry.header
        if h.messageType == pb.DML and f"{h.schemaName}.{h.tableName}" == table:
            for column in entry.event.dmlEvent.columns:
                merged[column.name] = column
    return list(merged.values())


def pure_tuple_rows(path, table, options=None):
    """(rows as dicts with positions, policy) under skip: the Tuple side rejects some values."""
    entries, policy = pure_entries(path)
    policy = ErrorPolicy("skip", tally=policy.tally)
    encoder = TupleEncoder(options or bridge.Options())

    def convert(entry):
        h = entry.header
        if h.messageType == pb.DML and f"{h.schemaName}.{h.tableName}" != table:
            return []
        return encoder.convert(entry)
    rows = [(w, row) for w, row in entries_to_messages(entries, convert, policy)]
    return rows, policy


# ---- Spark helpers --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17")
    session = bs.local_session("bridge-tests")
    session.sparkContext.setLogLevel("OFF")  # expected task failures would print Java stack traces
    return session


@pytest.fixture
def conf(spark):
    """Set runtime SQL confs for one test; restored afterwards on the shared session."""
    saved = {}

    def set_conf(key, value):
        saved.setdefault(key, spark.conf.get(key, None))
        spark.conf.set(key, value)
    yield set_conf
    for key, value in saved.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def kafka_df(spark, raws, topic=TOPIC, partition=0):
    stamp = datetime.datetime(2021, 5, 17, tzinfo=datetime.timezone.utc)
    rows = [(None, raw, topic, partition, n, stamp) for n, raw in enumerate(raws)]
    return spark.createDataFrame(rows, bs.KAFKA_SCHEMA)


def ordered(rows, *keys):
    keys = keys or ("partition", "offset", "entry", "row")
    return sorted(rows, key=lambda r: tuple(getattr(r, k) for k in keys))


def broken_stream():
    """large.pb with one middle segment of a split Entries removed: (Envelopes, removed offset)."""
    raws = envelopes(SAMPLES_DIR / "large.pb")
    for n, raw in enumerate(raws):
        env = pb.Envelope.FromString(raw)
        if env.total > 2 and env.index == 1:
            return raws[:n] + raws[n + 1:], n
    raise AssertionError("large.pb has no Entries split into 3 or more segments")


def split_count(raws) -> int:
    return sum(pb.Envelope.FromString(raw).total > 1 for raw in raws)


# ---- no Spark needed --------------------------------------------------------------------------

def test_import_does_not_load_pyspark():
    code = ("import sys, bridge.spark, bridge.cli.demo; "
            "print(sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", [bs, bridge.cli.demo])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_mode_is_checked_up_front():
    with pytest.raises(bridge.OptionsError, match="'mode'"):
        bs.dts_to_blob_batches(mode="LENIENT")
    assert bs.blob_schema("permissive").endswith("`error` STRING")


def test_tuple_schema_types():
    columns = [pb.Column(name="id", originalType="bigint(20) unsigned", isKey=True),
               pb.Column(name="n", originalType="tinyint(4)"),
               pb.Column(name="price", originalType="decimal(12,2)"),
               pb.Column(name="wide", originalType="decimal(65,30)"),
               pb.Column(name="at", originalType="datetime(6)"),
               pb.Column(name="ok", originalType="tinyint(1)",
                         properties=[pb.KVPair(key="datahub:type", value="BOOLEAN")])]
    ddl = bs.tuple_schema(record_schema(columns), columns)
    assert ddl.startswith("`id` DECIMAL(20,0), `n` TINYINT, `price` DECIMAL(12,2), `wide` DECIMAL(38,3), "
                          "`at` TIMESTAMP, `ok` BOOLEAN, `_sequence_id_` STRING")
    assert "`price` DECIMAL(38,18)" in bs.tuple_schema(record_schema(columns))


# ---- DTS -> Blob --------------------------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_dts_to_blob_matches_pure(spark, path):
    expected, policy = pure_blob_rows(path)
    tally = bs.SparkTally(spark)
    got = bs.dts_to_blob(kafka_df(spark, envelopes(path)), tally=tally).collect()
    assert [tuple(r) for r in ordered(got)] == expected
    assert tally.value == policy.tally and tally.value.balanced()


@pytest.mark.spark
def test_split_entries_reassemble_across_arrow_batches(spark, conf):
    raws = envelopes(SAMPLES_DIR / "large.pb")
    assert split_count(raws) > 2
    conf(MAX_BATCH, "1")
    got = bs.dts_to_blob(kafka_df(spark, raws)).collect()
    assert [tuple(r) for r in ordered(got)] == pure_blob_rows(raws)[0]


@pytest.mark.spark
def test_streams_of_several_topics_and_partitions(spark):
    """One stream per sample as (topic, partition) pairs over two topics, some sharing a Spark
    partition: each reassembles on its own, and dts -> blob -> dts gives back every stream's Entries."""
    frames = [kafka_df(spark, envelopes(path), topic=f"t{i % 2}", partition=i // 2)
              for i, path in enumerate(SAMPLES)]
    df = frames[0]
    for frame in frames[1:]:
        df = df.unionByName(frame)
    from pyspark.sql import functions as F
    blob = bs.dts_to_blob(df).withColumn("stream", F.concat_ws("/", "topic", "partition"))
    back = bs.blob_to_dts(blob, key="stream").collect()
    assert len(SAMPLES) >= 4
    assert sorted(bytes(r.key) for r in back) == sorted(f"t{i % 2}/{i // 2}".encode() for i in range(len(SAMPLES)))
    got = sorted(bytes(r.value) for r in back)
    want = sorted(env.SerializeToString() for path in SAMPLES
                  for env in bridge.pack_entries(e for _, e in pure_entries(path)[0]))
    assert got == want


@pytest.mark.spark
def test_dts_to_blob_through_map_in_pandas(spark):
    path = SAMPLES_DIR / "mixed.pb"
    df = bs.kafka_order(kafka_df(spark, envelopes(path)))
    got = df.mapInPandas(bs.dts_to_blob_batches(), bs.BLOB_SCHEMA).collect()
    assert [tuple(r) for r in ordered(got)] == pure_blob_rows(path)[0]


@pytest.mark.spark
def test_failfast_names_partition_and_offset(spark):
    raws, removed = broken_stream()
    with pytest.raises(bridge.FramingError) as pure:
        pure_entries(raws)
    with pytest.raises(Exception) as caught:
        bs.dts_to_blob(kafka_df(spark, raws)).collect()
    text = str(caught.value)
    assert "FramingError" in text and pure.value.reason in text
    assert f"(partition 0, offset {removed}, topic {TOPIC})" in text


@pytest.mark.spark
def test_permissive_keeps_a_row_with_the_error(spark):
    raws, removed = broken_stream()
    got = bs.dts_to_blob(kafka_df(spark, raws), mode="PERMISSIVE").collect()
    errors = [r for r in got if r.error is not None]
    good = [tuple(r)[:-1] for r in ordered([r for r in got if r.error is None])]
    expected, policy = pure_blob_rows(raws, on_error="keep")
    assert good == expected
    assert [(r.partition, r.offset) for r in errors] == [(p["partition"], p["offset"]) for p in policy.rejects]
    assert errors[0].offset == removed and f"offset {removed}" in errors[0].error
    assert all(r.blob is None and r.op is None for r in errors)


@pytest.mark.spark
def test_dropmalformed_drops_and_counts(spark):
    raws, _ = broken_stream()
    tally = bs.SparkTally(spark)
    got = bs.dts_to_blob(kafka_df(spark, raws), mode="DROPMALFORMED", tally=tally).collect()
    expected, policy = pure_blob_rows(raws, on_error="skip")
    assert [tuple(r) for r in ordered(got)] == expected
    assert tally.value == policy.tally
    assert tally.value.rejected > 0 and tally.value.balanced()


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


@pytest.mark.spark
def test_ordered_input_skips_the_shuffle(spark):
    """`ordered=True` on input already in Kafka order (as Spark's Kafka source reads it): no
    Exchange in the plan, and the rows of the shuffling default."""
    path = SAMPLES_DIR / "large.pb"
    df = kafka_df(spark, envelopes(path)).coalesce(1)  # one Spark partition, offsets in order
    tally = bs.SparkTally(spark)
    fast = bs.dts_to_blob(df, ordered=True, tally=tally)
    assert "Exchange" not in _plan(fast) and "Exchange" in _plan(bs.dts_to_blob(df))
    expected, policy = pure_blob_rows(path)
    assert [tuple(r) for r in fast.collect()] == expected  # already in stream order
    assert tally.value == policy.tally
    table = "shop.orders" if "shop.orders" in _tables_of(path) else _tables_of(path)[0]
    assert bs.table_columns(df, table, ordered=True) == bs.table_columns(df, table)
    with pytest.raises(bridge.OptionsError):
        bs.dts_to_blob(df, ordered="yes")


def _tables_of(path) -> list:
    return sorted({f"{e.header.schemaName}.{e.header.tableName}" for _, e in pure_entries(path)[0]
                   if e.header.messageType == pb.DML})


@pytest.mark.spark
def test_ordered_true_on_input_out_of_order_reports_never_drops(spark):
    """The promise broken (offsets backwards in one Spark partition): framing errors with partition
    and offset, and every Envelope accounted for."""
    raws = envelopes(SAMPLES_DIR / "large.pb")
    stamp = datetime.datetime(2021, 5, 17, tzinfo=datetime.timezone.utc)
    rows = [(None, raw, TOPIC, 0, n, stamp) for n, raw in enumerate(raws)][::-1]
    df = spark.createDataFrame(rows, bs.KAFKA_SCHEMA).coalesce(1)
    tally = bs.SparkTally(spark)
    got = bs.dts_to_blob(df, mode="PERMISSIVE", ordered=True, tally=tally).collect()
    errors = [r for r in got if r.error is not None]
    assert errors and all(r.partition == 0 and r.offset is not None for r in errors)
    assert any("offset not after the previous one" in r.error for r in errors)
    assert tally.value.balanced() and tally.value.rejected > 0
    with pytest.raises(Exception) as caught:
        bs.dts_to_blob(df, ordered=True).collect()
    assert "FramingError" in str(caught.value) and "partition 0" in str(caught.value)


# ---- Blob -> DTS --------------------------------------------------------------------------------

def blob_df(spark, lines, partition=0):
    rows = [(TOPIC, partition, n, line) for n, line in enumerate(lines)]
    return spark.createDataFrame(rows, "topic STRING, partition INT, offset BIGINT, value STRING")


def pure_blob_lines(path) -> list[str]:
    return [row[-1] for row in pure_blob_rows(path)[0]]


@pytest.mark.spark
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_blob_to_dts_matches_pure(spark, path):
    lines = pure_blob_lines(path)
    limit = 4096
    entries = list(bridge.blob_to_entries(bridge.decode_blob(line) for line in lines))
    got = bs.blob_to_dts(blob_df(spark, lines), key="single", max_message_bytes=limit).collect()
    assert [bytes(r.value) for r in got] == [e.SerializeToString() for e in bridge.pack_entries(entries, limit)]
    assert {bytes(r.key) for r in got} == {b""}


@pytest.mark.spark
def test_blob_to_dts_keys_by_table_across_arrow_batches(spark, conf):
    """Update halves and the rows of one event arrive in different Arrow batches; Envelopes hold
    runs of Entries of one table, keyed db.table."""
    path = SAMPLES_DIR / "mixed.pb"
    entries = list(bridge.blob_to_entries(bridge.decode_blob(line) for line in pure_blob_lines(path)))
    want = []
    for key, run in _runs(entries):
        want += [(key, env.SerializeToString()) for env in bridge.pack_entries(run)]
    conf(MAX_BATCH, "1")
    got = bs.blob_to_dts(blob_df(spark, pure_blob_lines(path))).collect()
    assert [(bytes(r.key), bytes(r.value)) for r in got] == want


def _runs(entries):
    import itertools

    def key(entry):
        h = entry.header
        return f"{h.schemaName}.{h.tableName}".encode() if h.schemaName or h.tableName else b""
    return [(k, list(run)) for k, run in itertools.groupby(entries, key=key)]


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["FAILFAST", "PERMISSIVE", "DROPMALFORMED"])
def test_blob_to_dts_modes(spark, mode):
    lines = pure_blob_lines(SAMPLES_DIR / "mariadb.pb")
    bad = 3
    lines[bad] = '{"payload": {"op": "INSERT"'
    tally = bs.SparkTally(spark)
    out = bs.blob_to_dts(blob_df(spark, lines), mode=mode, key="single", tally=tally)
    if mode == "FAILFAST":
        with pytest.raises(Exception, match=f"invalid JSON.*partition 0, offset {bad}"):
            out.collect()
        return
    got = out.collect()
    policy = ErrorPolicy("skip")
    entries = [e for _, e in bridge.stream.blob_lines_to_entries(
        [(n, line.encode()) for n, line in enumerate(lines)], policy)]
    values = [bytes(r.value) for r in got if r.value is not None]
    assert values == [env.SerializeToString() for env in bridge.pack_entries(entries)]
    assert (tally.value.input, tally.value.converted, tally.value.rejected) == (
        policy.tally.input, policy.tally.converted, policy.tally.rejected)
    errors = [r.error for r in got if r.value is None]
    if mode == "PERMISSIVE":
        assert len(errors) == policy.tally.rejected and f"partition 0, offset {bad}" in errors[0]
    else:
        assert errors == [] and tally.value.rejected == policy.tally.rejected > 0


# ---- DTS -> Tuple -> DTS -----------------------------------------------------------------------

def spark_values(row: dict, fields) -> tuple:
    """A pure Tuple row as pyspark collects it (TIMESTAMP as datetime, DECIMAL at its scale)."""
    out = []
    for name, _, kind in fields:
        v = row.get(name)
        if v is not None and kind == "timestamp":
            v = micros(v)
        elif v is not None and kind.startswith("decimal("):
            v = v.quantize(Decimal(1).scaleb(-int(kind[:-1].split(",")[1])), context=Context(prec=100))
        out.append(v)
    return tuple(out)


@pytest.mark.spark
@pytest.mark.parametrize("path,table", _tables(), ids=lambda v: v.stem if isinstance(v, pathlib.Path) else v)
def test_dts_to_tuple_and_back_match_pure(spark, path, table):
    df = kafka_df(spark, envelopes(path))
    tally = bs.SparkTally(spark)
    out = bs.dts_to_tuple(df, table, mode="PERMISSIVE", positions=True, tally=tally)
    got = out.collect()

    columns = pure_columns(path, table)
    schema = record_schema(columns)
    fields = bs._tuple_fields(schema, columns)
    expected, policy = pure_tuple_rows(path, table)
    good = ordered([r for r in got if r.error is None])
    assert [tuple(r)[5:-1] for r in good] == [spark_values(row, fields) for _, row in expected]
    assert [tuple(r)[1:5] for r in good] == [(w["partition"], w["offset"], w["entry"], w["row"])
                                             for w, _ in expected]
    errors = [r for r in got if r.error is not None]
    assert len(errors) == policy.tally.rejected
    assert tally.value == policy.tally

    # Tuple -> DTS, with the derived columns restoring the DTS types; rows go in stream order
    back = bs.tuple_to_dts(spark.createDataFrame(good, out.schema), table, columns=columns,
                           key="single").collect()
    decoder = TupleDecoder(schema, table=table, columns=columns)
    entries = [e for _, row in expected for e in decoder.feed(row)]
    assert not decoder.finish()
    assert [bytes(r.value) for r in back] == [e.SerializeToString() for e in bridge.pack_entries(entries)]


@pytest.mark.spark
def test_tuple_to_dts_schema_from_spark_types(spark):
    """Without schema or columns the RecordSchema comes from the Spark types, and the DTS columns
    from the field types, as bridge.tuple does without columns."""
    path, table = SAMPLES_DIR / "mixed.pb", "shop.orders"
    typed = bs.dts_to_tuple(kafka_df(spark, envelopes(path)), table)
    schema = bs.record_schema_of(typed)
    assert schema == record_schema(pure_columns(path, table))
    rows = [row for _, row in pure_tuple_rows(path, table)[0]]
    want = [e.SerializeToString() for e in bridge.pack_entries(bridge.tuple.tuples_to_entries(rows, schema,
                                                                                             table=table))]
    got = bs.tuple_to_dts(typed.coalesce(1), table, key="single").collect()
    assert [bytes(r.value) for r in got] == want


@pytest.mark.spark
def test_tuple_batches_through_map_in_pandas(spark, conf):
    """The pandas path: nullable integers arrive as floats, timestamps as naive datetimes (UTC
    session time zone), decimals as Decimal. pandas holds no timestamp before 1677: the Entry with
    types' extremes (1000-01-01 beside 9999-12-31 23:59:59) is dropped under zero_dates=error."""
    conf("spark.sql.session.timeZone", "UTC")
    path, table = SAMPLES_DIR / "types.pb", "typedb.all_types"
    columns = pure_columns(path, table)
    schema = record_schema(columns)
    options = bridge.Options(zero_dates="error")
    df = bs.kafka_order(kafka_df(spark, envelopes(path)))
    fn = bs.dts_to_tuple_batches(table, schema, options, mode="DROPMALFORMED", columns=columns)
    typed = df.mapInPandas(fn, bs.tuple_schema(schema, columns, "DROPMALFORMED"))
    via_arrow = bs.dts_to_tuple(kafka_df(spark, envelopes(path)), table, schema, options, mode="DROPMALFORMED",
                                columns=columns)
    assert typed.collect() == via_arrow.collect()
    rows = [row for _, row in pure_tuple_rows(path, table, options)[0]]
    want = [e.SerializeToString() for e in bridge.pack_entries(
        bridge.tuple.tuples_to_entries(rows, schema, table=table, columns=columns))]
    fn = bs.tuple_to_dts_batches(table, schema, columns=columns, key="single")
    got = typed.coalesce(1).mapInPandas(fn, bs.DTS_SCHEMA).collect()
    assert [bytes(r.value) for r in got] == want


@pytest.mark.spark
def test_tuple_to_dts_bad_rows(spark):
    path, table = SAMPLES_DIR / "mariadb.pb", "blog.posts"
    typed = bs.dts_to_tuple(kafka_df(spark, envelopes(path)), table, positions=True)
    rows = [r.asDict() for r in typed.collect()]
    bad = next(r for r in rows if r["_operation_type_"] == "I")
    bad["_operation_type_"] = "X"
    broken = spark.createDataFrame(rows, typed.schema)
    where = f"partition 0, offset {bad['offset']}"
    with pytest.raises(Exception, match=f"_operation_type_ must be I, U or D.*{where}"):
        bs.tuple_to_dts(broken, table).collect()
    tally = bs.SparkTally(spark)
    got = bs.tuple_to_dts(broken, table, mode="PERMISSIVE", tally=tally).collect()
    errors = [r.error for r in got if r.error is not None]
    assert len(errors) == 1 == tally.value.rejected and where in errors[0]
    assert tally.value.balanced() and tally.value.input == len(rows)


# ---- one bad Entry under each mode (docs/spark.md, "Bad records: `mode`") ------------------------

ORDERS = [("id", "bigint(20)", True), ("name", "varchar(32)", False), ("price", "decimal(10,2)", False)]


def orders_entry(seq: int) -> pb.Entry:
    """A one-row INSERT into shop.orders: plain, so the C sink writes it once it knows the table."""
    entry = pb.Entry()
    h = entry.header
    h.version, h.sourceType, h.messageType, h.timestamp = 1, pb.MYSQL, pb.DML, 1_700_000_000 + seq
    h.schemaName, h.tableName, h.seqId = "shop", "orders", seq
    dml = entry.event.dmlEvent
    dml.dmlEventType = pb.INSERT
    for name, kind, key in ORDERS:
        dml.columns.add(name=name, originalType=kind, isKey=key)
    dml.rows.add().newColumns.extend([pb.Data(dataType=pb.INT64, sv=str(seq)),
                                      pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=f"n{seq}".encode()),
                                      pb.Data(dataType=pb.DECIMAL, sv=f"{seq}.50")])
    return entry


def _set_column_type(index: int, text: str):
    def set_type(entry):
        entry.event.dmlEvent.columns[index].originalType = text
    return set_type


# case -> (what breaks the Entry, the error's reason, the column it names)
BAD_ENTRIES = {
    "unknown-source-type": (lambda entry: setattr(entry.header, "sourceType", 4), "unknown SourceType 4", None),
    "unknown-column-type": (_set_column_type(1, "frobnicate(3)"), "unknown MySQL column type: frobnicate(3)",
                            "name"),
    "unparsable-column-type": (_set_column_type(2, "decimal(x,"), "unknown MySQL column type: decimal(x,", "price"),
}


def bad_stream(case):
    """Three single-Entry Envelopes, the middle one broken as `case` says: (Envelopes, the error
    text the Spark transforms give for it)."""
    entries = [orders_entry(seq) for seq in (1, 2, 3)]
    breaks, reason, column = BAD_ENTRIES[case]
    breaks(entries[1])
    raws = [env.SerializeToString() for entry in entries for env in bridge.pack_entries([entry])]
    assert len(raws) == 3
    named = f", column {column}" if column else ""
    return raws, f"{reason} (partition 0, offset 1, seqId 2, table shop.orders{named}, topic {TOPIC})"


@pytest.mark.spark
@pytest.mark.parametrize("case", BAD_ENTRIES)
def test_dts_to_blob_one_bad_entry_under_each_mode(spark, case):
    """The C sink (on in this build when the extension is there) registers a table only from an
    Entry the mode let through: FAILFAST raises the bridge error, DROPMALFORMED gives 2 rows,
    PERMISSIVE 3 with the error in its place; converted + rejected + not emitted == input."""
    raws, error = bad_stream(case)
    with pytest.raises(Exception) as caught:
        bs.dts_to_blob(kafka_df(spark, raws)).collect()
    assert f"ConversionError: {error}" in str(caught.value)

    good, policy = pure_blob_rows(raws, on_error="skip")
    assert [row[2] for row in good] == [0, 2]
    tally = bs.SparkTally(spark)
    got = bs.dts_to_blob(kafka_df(spark, raws), mode="DROPMALFORMED", tally=tally).collect()
    assert [tuple(r) for r in got] == good
    assert tally.value == policy.tally
    assert (tally.value.input, tally.value.converted, tally.value.rejected) == (3, 2, 1) and tally.value.balanced()

    tally = bs.SparkTally(spark)
    got = bs.dts_to_blob(kafka_df(spark, raws), mode="PERMISSIVE", tally=tally).collect()
    kept = (TOPIC, 0, 1, 0, None) + (None,) * 7 + (error,)
    assert [tuple(r) for r in got] == [good[0] + (None,), kept, good[1] + (None,)]
    assert tally.value == policy.tally


@pytest.mark.spark
@pytest.mark.parametrize("case", [c for c in BAD_ENTRIES if BAD_ENTRIES[c][2]])
def test_dts_to_tuple_one_bad_entry_under_each_mode(spark, case):
    """dts_to_tuple without a schema: `table_columns` leaves the bad column set to the conversion
    (the RecordSchema comes from the good one), which reports it under the mode. (A SourceType
    the Tuple side never reads is no error there.)"""
    raws, error = bad_stream(case)
    table = "shop.orders"
    columns = [pb.Column(name=name, originalType=kind, isKey=key) for name, kind, key in ORDERS]
    assert bs.table_columns(kafka_df(spark, raws), table) == columns
    with pytest.raises(Exception) as caught:
        bs.dts_to_tuple(kafka_df(spark, raws), table).collect()
    assert f"ConversionError: {error}" in str(caught.value)

    fields = bs._tuple_fields(record_schema(columns), columns)
    entries = [e for _, e in pure_entries(raws)[0] if e.header.seqId != 2]
    good = [(TOPIC, 0, offset, 0, 0) + spark_values(row, fields)
            for offset, entry in zip((0, 2), entries) for row in TupleEncoder().convert(entry)]
    for mode in ("DROPMALFORMED", "PERMISSIVE"):
        tally = bs.SparkTally(spark)
        got = bs.dts_to_tuple(kafka_df(spark, raws), table, mode=mode, positions=True, tally=tally).collect()
        if mode == "DROPMALFORMED":
            assert [tuple(r) for r in got] == good
        else:
            kept = (TOPIC, 0, 1, 0, None) + (None,) * len(fields) + (error,)
            assert [tuple(r) for r in got] == [good[0] + (None,), kept, good[1] + (None,)]
        assert (tally.value.input, tally.value.converted, tally.value.rejected) == (3, 2, 1)
        assert tally.value.balanced()


@pytest.mark.spark
def test_a_key_column_of_other_values_is_an_options_error(spark):
    lines = pure_blob_lines(SAMPLES_DIR / "mariadb.pb")
    df = blob_df(spark, lines)
    with pytest.raises(bridge.OptionsError, match="'key' names column 'offset' of Spark type long"):
        bs.blob_to_dts(df, key="offset")
    # the per-partition function on its own: bytes(3) would have been three zero bytes
    import pyarrow as pa
    batch = pa.RecordBatch.from_pydict({"blob": lines[:1], "k": [3]})
    with pytest.raises(bridge.OptionsError, match="neither string nor binary"):
        list(bs.blob_to_dts_batches(key="k", arrow=True)(iter([batch])))


# ---- the demo --------------------------------------------------------------------------------

@pytest.mark.spark
def test_demo_summary_counts(spark):
    from collections import Counter
    text = bridge.cli.demo.spark_summary(SAMPLES_DIR)
    counts, entries, messages = Counter(), 0, 0
    for path in SAMPLES:
        rows, policy = pure_blob_rows(path)
        counts.update((row[7], row[8], row[6]) for row in rows)
        entries, messages = entries + policy.tally.input, messages + policy.tally.outputs
    assert f"-> {entries} Entries -> {messages} Blob messages" in text
    assert text.endswith(bridge.cli.demo.summary_table([(*key, n) for key, n in counts.items()]))


@pytest.mark.parametrize("value, precision, scale, expected", [
    ("9099250.47", 12, 2, "9099250.47"),   # at the scale and fits: the value itself (the fast path)
    ("1.5", 12, 2, "1.50"),               # fewer digits after the point: padded, as Spark holds it
    ("0.00", 3, 2, "0.00"),
    ("-12345678901.25", 12, 2, None),     # 13 digits > precision 12
    ("1.234", 12, 2, None),               # would lose a digit
    ("123.45", 4, 2, None),               # at the scale but too many digits
])
def test_decimals_fit_sparks_decimal_type_or_are_refused(value, precision, scale, expected):
    from decimal import Decimal

    from bridge.errors import ConversionError
    from bridge.spark.to_datahub import _fit_decimal
    if expected is None:
        with pytest.raises(ConversionError, match="does not fit Spark's decimal"):
            _fit_decimal(Decimal(value), precision, scale)
    else:
        got = _fit_decimal(Decimal(value), precision, scale)
        assert str(got) == expected and got.as_tuple().exponent == -scale
