"""A whole database from Spark, killed with SIGKILL and restarted (docs/decisions.md, "The Spark whole-database kill test"),
written apart from the implementation: a real Spark driver process (tests/pipeline_jobs/driver.py,
kind "database": `dts-kafka` with a small `maxOffsetsPerTrigger` -> `bridge.spark.dts_entries` ->
`writeStream.format("datahub")` in whole-database mode, with a checkpoint) on the real Kafka broker
and the stand-in DataHub with chaos faults (5xx, throttling, resets, lost answers, delays, on every
operation the writer uses, AppendField included), its process group SIGKILLed at seeded points once
records landed, restarted from its checkpoint, then run to the end (availableNow).

The input is tests/test_sync_tables.py's multi-table stream (CREATE; ALTER ADD / DROP / RENAME /
MODIFY COLUMN of shop.orders; shop.customers plain; bad.poison with Entries of a column type nobody
knows; a 2 MB row in shop.big), packed into 300-byte Envelopes (many Entries split) and produced,
the same records, into both partitions of a topic whose partitions run in two Spark tasks.

The oracle is `dts-bridge sync` itself: the same Kafka topic's partition 0, the same policies, no
kill, no fault, into a stand-in of its own. Partition 1 holds the same records at the same offsets,
so each Spark partition must hold exactly what sync landed, position for position:
- every table's topic: the records of each (DataHub shard, Kafka partition), in the order the shard
  holds them (never sorted), equal to sync's (values and `dts.pos`), nothing twice;
- every table's RecordSchema equal to sync's, and shop.orders' data fields those the policy appends
  (DATA_FIELDS, written down here from the stream's DDL);
- the dead-letter topic: per (table, Kafka partition), in the shard's order, the letters of sync's
  file (offset, entry, row, table, topic, error without the partition numbers it names, bytes),
  each once, `dts.pos` = the letter's position; and, computed here from the Entries alone, exactly
  the Entries the policy leaves out, their bytes the Entry's own.

- test_evolve_dlq_killed_and_restarted: evolve + dlq, 1 SIGKILL, lighter chaos (make test).
- test_policies_killed_and_restarted_deep: lenient + dlq, ignore + halt-table, evolve + halt-table,
  3 SIGKILLs each (make test-deep).

Seeds: SPARK_TABLES_KILL_SEED=N (default 1729) changes kill points and chaos.
"""
from __future__ import annotations

import base64
import collections
import json
import os
import re
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = [pytest.mark.spark, pytest.mark.datahub]

from bridge.datahub.sink import make_client  # noqa: E402
from bridge.wire import subscribe_pb2 as pb  # noqa: E402
from bridge.wire.framing import pack_entries  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.pipeline import CHAOS_OPS, bridge_cli, fault_summary, run_bridge  # noqa: E402
from support.spark_driver import (  # noqa: E402
    PROJECT,
    Driver,
    _java,
    _split_ranges,
    _two_task_name,
    chaos,
    checkpoint_cuts,
    commits,
    kill_loop,
    straddling_cuts,
)
from support.table_stream import BIG_BYTES, build_stream  # noqa: E402

SEED = int(os.environ.get("SPARK_TABLES_KILL_SEED", "1729"))
PARTITIONS = (0, 1)
LETTERS = "dts_dead_letters"
ROUNDS = 5  # rounds of transactions per phase of shop.orders (bad.poison's bad Entries: rounds 3 and 4)
MAX_OFFSETS = 122  # per micro-batch over both partitions (61 each): four, two of them ending inside split Entries
KILL_OPS = CHAOS_OPS + ("AppendField",)
DATA_FIELDS = {  # shop.orders' data fields under each policy: CREATE (id, qty, item), ADD note, DROP item,
    # RENAME note TO remark, MODIFY qty varchar
    "evolve": ["id", "qty", "item", "note", "remark"],
    "lenient": ["id", "qty", "item", "note", "remark", "qty__string"],
    "ignore": ["id", "qty", "item"],
}


class Input:
    """The stream as produced: its Entries, the Envelopes (the same in each partition) and the topic."""

    def __init__(self, entries: list, envelopes: list[bytes], topic: str) -> None:
        self.entries, self.envelopes, self.topic = entries, envelopes, topic


@pytest.fixture(scope="module")
def produced(kafka_broker) -> Input:
    """build_stream's Entries in 300-byte Envelopes (the 2 MB Entry alone in 512 KB ones, under the
    broker's 1 MB), every Envelope to partition 0 and to partition 1, in order."""
    from confluent_kafka import Producer
    entries, _ = build_stream(rounds=ROUNDS)
    big = next(i for i, e in enumerate(entries) if e.ByteSize() > BIG_BYTES)
    envelopes = [env.SerializeToString() for env in
                 [*pack_entries(entries[:big], 300), *pack_entries(entries[big:big + 1], 1 << 19),
                  *pack_entries(entries[big + 1:], 300)]]
    name = kafka_broker.create_topic(_two_task_name("tables-kill"), partitions=len(PARTITIONS))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5, "enable.idempotence": True,
                         "message.max.bytes": 1 << 20})
    failed: list = []
    for partition in PARTITIONS:
        for raw in envelopes:
            producer.produce(name, raw, partition=partition, on_delivery=lambda err, _: err and failed.append(err))
    assert producer.flush(60) == 0 and not failed, failed
    return Input(entries, envelopes, name)


# ---- what the policy leaves out, from the Entries alone ---------------------------------------------

def _table(entry) -> str:
    return f"{entry.header.schemaName}.{entry.header.tableName}"


def _bad_reasons(entries, schema_change: str) -> dict[int, str]:
    """seqId -> why, for every DML Entry that cannot land: a column type nobody knows (bad.poison),
    a value over DataHub's 2 MB STRING limit (oversized, --oversized dlq), and under evolve the
    shop.orders rows after `MODIFY COLUMN qty varchar` (a changed type is an error there)."""
    bad, modified = {}, False
    for e in entries:
        if e.header.messageType == pb.DDL and "MODIFY COLUMN" in e.event.ddlEvent.sql:
            modified = _table(e) == "shop.orders" or modified
        if e.header.messageType != pb.DML:
            continue
        if any(c.originalType == "frobnicate(3)" for c in e.event.dmlEvent.columns):
            bad[e.header.seqId] = "unknown type"
        elif any(len(d.bv) > 2 * 1024 * 1024 for r in e.event.dmlEvent.rows for d in r.newColumns):
            bad[e.header.seqId] = "oversized"
        elif schema_change == "evolve" and modified and _table(e) == "shop.orders":
            bad[e.header.seqId] = "type changed"
    return bad


def dead_entries(entries, schema_change: str, table_error: str) -> dict[int, str]:
    """seqId -> table of the Entries the dead letters must hold: the bad ones; under halt-table
    also every later Entry of a table from its first bad one on (DDL included)."""
    bad = _bad_reasons(entries, schema_change)
    halted: set[str] = set()
    out = {}
    for e in entries:
        table = _table(e)
        if e.header.seqId in bad or (table_error == "halt-table" and table in halted):
            out[e.header.seqId] = table
            if table_error == "halt-table":
                halted.add(table)
    return out


# ---- the oracle: dts-bridge sync on partition 0 ------------------------------------------------------

class Landed:
    """What one run left in a stand-in: per topic its RecordSchema [(name, type, nullable)] and its
    records per (shard, partition) in shard order as (dts.pos, values); the dead letters."""

    def __init__(self, schemas: dict, records: dict, letters: list[dict]) -> None:
        self.schemas, self.records, self.letters = schemas, records, letters

    def count(self) -> int:
        return sum(len(v) for by in self.records.values() for v in by.values()) + len(self.letters)


def _schema(client, topic: str) -> list[tuple]:
    return [(f.name, str(getattr(f.type, "value", f.type)).upper(), bool(getattr(f, "allow_null", True)))
            for f in client.get_topic(PROJECT, topic).record_schema.field_list]


def _records(server, topic: str, source: str) -> dict:
    out: dict = collections.defaultdict(list)
    for record in server.records(PROJECT, topic):
        attrs = record["attributes"]
        assert attrs.get("dts.topic") == source, (topic, attrs)
        pos = tuple(int(p) for p in attrs["dts.pos"].split(":"))
        out[(record["shard"], pos[0])].append((pos, record["values"]))
    return out


def _tables(server, source: str, skip: str | None) -> tuple[dict, dict]:
    client = make_client(server.endpoint, "test-id", "test-secret")
    names = sorted(n for n in client.list_topic(PROJECT).topic_names if n != skip)
    return {n: _schema(client, n) for n in names}, {n: _records(server, n, source) for n in names}


def sync_oracle(broker, topic: str, tmp_path, schema_change: str, table_error: str) -> Landed:
    letters_path = tmp_path / "sync-letters.jsonl"
    with StandInDataHub() as server:
        proc = run_bridge(bridge_cli("sync", "--brokers", broker.bootstrap, "--topic", topic, "--partitions", "0",
                         "--offsets-file", str(tmp_path / "sync-offsets.json"), "--from-beginning",
                         "--datahub-endpoint", server.endpoint, "--project", PROJECT, "--to", "tuple",
                         "--datahub-topic", "{db}_{table}", "--shards", "2", "--batch-size", "8",
                         "--idle-timeout", "1", "--schema-change", schema_change, "--on-table-error", table_error,
                         "--oversized", "dlq", "--dead-letters", str(letters_path), "--json", "--no-progress"),
                    timeout=300)
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, \
            f"dts-bridge sync exited {proc.returncode}: {proc.stderr[-3000:]}"
        report = json.loads(proc.stdout)
        assert report["stopped"] == "idle" and report["rejected"] > 0, report
        schemas, records = _tables(server, topic, None)
    letters = [json.loads(line) for line in letters_path.read_bytes().splitlines()]
    return Landed(schemas, records, letters)


# ---- the checks ----------------------------------------------------------------------------------

def _first_difference(have: list, want: list) -> str:
    i = next((i for i, (h, w) in enumerate(zip(have, want)) if h != w), min(len(have), len(want)))
    show = lambda xs: repr(xs[i])[:300] if i < len(xs) else "(end)"  # noqa: E731
    return f"{len(have)} landed, {len(want)} expected; first difference at #{i}:\n    landed:   " \
           f"{show(have)}\n    expected: {show(want)}"


def check_tables(spark: Landed, oracle: Landed, schema_change: str, context: str) -> int:
    """Every table's topic: RecordSchema and records per (shard, partition) equal to sync's
    partition 0, in order; no position twice."""
    assert set(spark.schemas) == set(oracle.schemas), f"topics {sorted(spark.schemas)}, sync made " \
                                                      f"{sorted(oracle.schemas)}\n{context}"
    problems, compared = [], 0
    for name, fields in oracle.schemas.items():
        if spark.schemas[name] != fields:
            problems.append(f"{name}: RecordSchema {spark.schemas[name]}, sync's {fields}")
        got = spark.records[name]
        positions = collections.Counter(pos for rows in got.values() for pos, _ in rows)
        twice = [":".join(map(str, p)) for p, n in positions.items() if n > 1]
        if twice:
            problems.append(f"{name}: {len(twice)} positions landed twice, e.g. {twice[:5]}")
        for (shard, _), rows in oracle.records[name].items():
            for partition in PARTITIONS:
                want = [((partition, *pos[1:]), values) for pos, values in rows]
                have = got.get((shard, partition), [])
                compared += len(have)
                if have != want:
                    problems.append(f"{name} shard {shard} partition {partition}: {_first_difference(have, want)}")
        extra = set(got) - {(s, p) for s, _ in oracle.records[name] for p in PARTITIONS}
        if extra:
            problems.append(f"{name}: records in (shard, partition) {sorted(extra)} where sync has none")
    assert not problems, f"{context}\n" + "\n".join(problems[:20])
    orders = [n for n, _, _ in spark.schemas["shop_orders"] if not n.startswith("_")]
    assert orders == DATA_FIELDS[schema_change], f"shop_orders' data fields {orders} ({schema_change})\n{context}"
    return compared


def spark_letters(server, source: str) -> list[dict]:
    """The dead-letter topic in shard order: each letter's document with its record's attributes."""
    out = []
    for record in server.records(PROJECT, LETTERS):
        letter = json.loads(record["data"])
        attrs = record["attributes"]
        assert attrs.get("dts.topic") == source and letter["source"] == source, (attrs, letter["source"])
        row = -1 if letter["row"] is None else letter["row"]
        assert attrs["dts.pos"] == f"{letter['partition']}:{letter['offset']}:{letter['entry']}:{row}", (attrs, letter)
        out.append(letter)
    return out


def _cause(letter: dict) -> str:
    """A letter's error without the Kafka partitions it names (sync's run read partition 0; a
    table halted in an earlier micro-batch names the letter that halted it, of either partition,
    and that micro-batch): the cause and the offsets stay."""
    text = re.sub(r"halted in micro-batch \d+ at \d+:", "halted at _:", letter["error"])
    text = re.sub(r"halted at \d+:", "halted at _:", text)
    return re.sub(r"\(partition \d+, offset ", "(partition _, offset ", text)


def check_letters(letters: list[dict], oracle: Landed, entries, dead: dict[int, str], context: str) -> int:
    """Per (table, Kafka partition), in the topic's order: sync's letters, moved to the partition;
    every letter once; the Entries exactly `dead`, each letter's bytes its Entry's own."""
    by_seq = {e.header.seqId: e.SerializeToString() for e in entries}
    keys = ("offset", "entry", "row", "table", "datahub_topic", "error", "entry_base64")
    want: dict = collections.defaultdict(list)
    for letter in oracle.letters:
        assert letter["partition"] == 0, letter
        for partition in PARTITIONS:
            want[(letter["table"], partition)].append({k: letter[k] for k in keys} | {"partition": partition,
                                                                                      "error": _cause(letter)})
    have: dict = collections.defaultdict(list)
    seen = collections.Counter()
    for letter in letters:
        assert f"(partition {letter['partition']}, offset {letter['offset']}" in letter["error"], letter["error"]
        have[(letter["table"], letter["partition"])].append({k: letter[k] for k in (*keys, "partition")}
                                                            | {"error": _cause(letter)})
        seen[(letter["partition"], letter["offset"], letter["entry"], letter["row"])] += 1
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"dead letters written twice: {twice}\n{context}"
    for key in sorted(set(want) | set(have)):
        assert have[key] == want[key], f"dead letters of {key}: {_first_difference(have[key], want[key])}\n{context}"
    for partition in PARTITIONS:
        seqs = {}
        for letter in letters:
            if letter["partition"] != partition:
                continue
            raw = base64.b64decode(letter["entry_base64"])
            entry = pb.Entry.FromString(raw)
            assert raw == by_seq[entry.header.seqId], f"letter at {letter['offset']}: not the Entry's own bytes"
            assert _table(entry) == letter["table"] and letter["error"], letter
            seqs[entry.header.seqId] = letter["table"]
        assert seqs == dead, (f"partition {partition}: dead letters for {len(set(seqs) - set(dead))} Entries not "
                              f"expected {sorted(set(seqs) - set(dead))[:8]}, {len(set(dead) - set(seqs))} missing "
                              f"{sorted(set(dead) - set(seqs))[:8]}\n{context}")
    return len(letters)


# ---- the run ---------------------------------------------------------------------------------------

def _count(server):
    client = make_client(server.endpoint, "test-id", "test-secret")

    def count() -> int:
        return sum(len(server.records(PROJECT, name)) for name in client.list_topic(PROJECT).topic_names)
    return count


def _run_policy(broker, produced: Input, tmp_path, *, schema_change: str, table_error: str, kills: int,
                seed: int, faults) -> None:
    _java()
    began = time.monotonic()
    oracle = sync_oracle(broker, produced.topic, tmp_path, schema_change, table_error)
    dead = dead_entries(produced.entries, schema_change, table_error)
    assert {"unknown type", "oversized"} <= set(_bad_reasons(produced.entries, schema_change).values())
    total = oracle.count() * len(PARTITIONS)
    log: list[str] = []
    with StandInDataHub() as server:
        faults(server, seed)
        options = dict(to="tuple", createTopics="true", shards=2, schemaChange=schema_change,
                       onTableError=table_error, oversized="dlq", deadLetters=LETTERS)
        driver = Driver(tmp_path, kind="database", source="dts-kafka", bootstrap=broker.bootstrap,
                        topic=produced.topic, maxOffsetsPerTrigger=MAX_OFFSETS, endpoint=server.endpoint,
                        project=PROJECT, datahub_topic="{db}_{table}", batchSize=8, maxRetries=30, options=options)
        killed = kill_loop(driver, _count(server), kills=kills, total=total, seed=seed, log=log)
        server.faults.clear()
        hit = fault_summary(server)
        context = (f"{schema_change}/{table_error}, seed {seed}; driver logs in {tmp_path}; faults {hit}\n  "
                   + "\n  ".join(log))
        assert server.errors == [], f"the stand-in's own errors: {server.errors}"
        assert len(killed) == kills and all(k["landed_in_run"] > 0 for k in killed), context
        assert all(hit.get(f"chaos-{kind}", 0) > 0 for kind in ("5xx", "throttle", "ack-lost")), \
            f"chaos too quiet: {hit}"
        cuts = checkpoint_cuts(driver.checkpoint, produced.topic)
        # both partitions hold the same records and lag alike: each micro-batch takes as many offsets
        # of each, so a halt-table decision in one task never reaches the other's partition earlier
        assert cuts[0] == cuts[1], f"micro-batch ends differ between the partitions: {dict(cuts)}"
        inside = straddling_cuts(cuts, {p: _split_ranges(produced.envelopes) for p in PARTITIONS})
        assert inside, f"no micro-batch ended inside a split Entries: {dict(cuts)}"
        letters = spark_letters(server, produced.topic)
        schemas, records = _tables(server, produced.topic, LETTERS)
        compared = check_tables(Landed(schemas, records, letters), oracle, schema_change, context)
        n_letters = check_letters(letters, oracle, produced.entries, dead, context)
        summaries = [c for c in commits(driver.commit_log) if c["outcome"] == "commit"]
        skipped = sum(c.get("skipped", 0) for c in summaries)
        print(f"\n[{schema_change}/{table_error}, seed {seed}: {len(killed)} kills in {driver.runs} runs, {compared} "
              f"rows and {n_letters} dead letters equal to sync's, {len(cuts[0])} micro-batches, {len(inside)} ends "
              f"inside split Entries, {skipped} records found landed by replays, faults {hit}, "
              f"{time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


def light_chaos(server, seed: int) -> None:
    """Every fault of `chaos`, less often (each failed request backs off, up to 10 s): make test's."""
    server.faults.chaos(seed, p_5xx=0.02, p_throttle=0.02, p_reset=0.01, p_ack_lost=0.03, p_delay=0.1,
                        max_delay=0.03, op=KILL_OPS)


def full_chaos(server, seed: int) -> None:
    chaos(server, seed, KILL_OPS)


def test_evolve_dlq_killed_and_restarted(kafka_broker, produced, tmp_path):
    _run_policy(kafka_broker, produced, tmp_path, schema_change="evolve", table_error="dlq", kills=1, seed=SEED,
                faults=light_chaos)


@pytest.mark.deep
@pytest.mark.parametrize("schema_change, table_error", [("lenient", "dlq"), ("ignore", "halt-table"),
                                                        ("evolve", "halt-table")])
def test_policies_killed_and_restarted_deep(kafka_broker, produced, tmp_path, schema_change, table_error):
    _run_policy(kafka_broker, produced, tmp_path, schema_change=schema_change, table_error=table_error, kills=3,
                seed=SEED + 1, faults=full_chaos)
