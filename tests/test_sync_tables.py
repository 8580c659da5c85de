"""`dts-bridge sync` over a whole database (docs/kafka.md, "A whole database with `sync`"): routing, schema-change policies, dead letters,
per-table error policies, limits, `replay --from-dlq`; on a real Kafka broker and the stand-in DataHub.

The stream (built with bridge.samples' Binlog, so it is what DTS emits): shop.orders goes through
CREATE TABLE, ALTER TABLE ADD COLUMN, DROP COLUMN, RENAME COLUMN and MODIFY (INT -> VARCHAR);
shop.customers stays plain; bad.poison has good Entries, then Entries with a column type nobody
knows (`frobnicate(3)`: its conversion fails), then good ones again; shop.big has one row whose
TEXT value is over DataHub's 2 MB STRING limit (--oversized dlq). The expected rows of every table
come from `dts-bridge convert --to tuple` of the very file produced (the policies only decide which
versions' rows land and how their fields are named); they are compared per (DataHub shard, Kafka
partition), in order, as tests/test_sync.py does. The dead letters must hold exactly the Entries
the policy leaves out (by the Entry's seqId, parsed back from the letter's bytes), once each.

Runs are killed with SIGKILL at seeded points and restarted (support.sync_runs.kill_loop); the deep
variant runs every schema-change policy x table-error policy with more kills.
"""
from __future__ import annotations

import base64
import collections
import json
import os
import pathlib
import time

import pytest

pytest.importorskip("datahub")
pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.datahub

from bridge.datahub.sink import make_client  # noqa: E402
from bridge.samples import PRIMARY, WORDS, Binlog, Col, Table, insert, serial, words  # noqa: E402
from bridge.sync import topic_name  # noqa: E402
from bridge.wire import subscribe_pb2 as pb  # noqa: E402
from support.datahub_standin import StandInDataHub  # noqa: E402
from support.pipeline import bridge_cli, run_bridge  # noqa: E402
from support.sync_runs import (  # noqa: E402
    PROJECT,
    SEED,
    Sync,
    convert_tuple,
    kill_loop,
    no_traceback,
    produce,
    unique_name,
    warm_group_coordinator,
)
from support.table_stream import (  # noqa: E402
    build_stream,
    check_topics,
    expected_dead,
    expected_topics,
    write_stream,
)


def read_letters(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def check_letters(path: pathlib.Path, dead: set[int], context: str, topics: dict | None = None) -> list[dict]:
    """The dead letters: each Entry once (whole bytes, parsing back to an Entry of its table), and
    exactly the expected Entries."""
    letters = read_letters(path)
    seen = collections.Counter()
    for letter in letters:
        entry = pb.Entry.FromString(base64.b64decode(letter["entry_base64"]))
        assert f"{entry.header.schemaName}.{entry.header.tableName}" == letter["table"], letter["table"]
        assert letter["error"], letter
        for key in ("partition", "offset", "entry", "source"):
            assert key in letter, (key, letter)
        assert letter["datahub_topic"] == topic_name("{db}_{table}", *letter["table"].split(".", 1)), letter
        seen[(entry.header.seqId, letter.get("row"))] += 1
    twice = {k: n for k, n in seen.items() if n > 1}
    assert not twice, f"dead letters written twice: {twice}\n{context}"
    got = {seq for seq, _ in seen}
    assert got == dead, (f"dead letters: {len(got - dead)} unexpected {sorted(got - dead)[:10]}, "
                         f"{len(dead - got)} missing {sorted(dead - got)[:10]}\n{context}")
    return letters


# ---- the runs -----------------------------------------------------------------------------------

def _setup(kafka_broker, tmp_path, entries, label: str, convert: bool = True):
    topic = kafka_broker.create_topic(unique_name(label), partitions=1)
    warm_group_coordinator(kafka_broker, topic)
    path = write_stream(tmp_path / f"{label}.pb", entries)
    produce(kafka_broker, topic, path, 0)
    converted = collections.defaultdict(list)
    for table, versions in (convert_tuple(path, tmp_path) if convert else {}).items():
        converted[table].append((0, versions))
    return topic, path, converted


def _policy_run(kafka_broker, tmp_path, entries, facts, *, schema_change: str, table_error: str, kills: int,
                seed: int) -> None:
    began = time.monotonic()
    topic, _, converted = _setup(kafka_broker, tmp_path, entries, f"tables-{schema_change}-{table_error}")
    dead_path = tmp_path / f"dead-{schema_change}-{table_error}.jsonl"
    with StandInDataHub() as server:
        server.faults.delay("PutRecordsByShard", seconds=0.01)  # runs long enough to be killed mid-way
        sync = Sync(tmp_path, kafka_broker, topic, "g-tables", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--shards", "2", "--idle-timeout", "1", "--commit-interval", "0.3",
                    "--batch-size", "8", "--schema-change", schema_change, "--on-table-error", table_error,
                    "--dead-letters", str(dead_path), "--oversized", "dlq")
        log: list[str] = []
        if kills:
            kill_loop(sync, server, kills=kills, seed=seed, stages=[], produce_stage=lambda s: None, max_delay=2.5,
                      max_step=60, log=log, ok_codes=(0, 1))
        code, report, err = sync.run()
        context = f"{schema_change}/{table_error}, seed {seed}, stderr in {tmp_path}\n  " + "\n  ".join(log)
        no_traceback(err, "the final sync run")
        assert code in (0, 1) and report.get("stopped") == "idle", f"final run exited {code}: {err[-3000:]}\n{context}"
        assert report["input"] == report["converted"] + report["rejected"] + report["not_emitted"], report
        dead = expected_dead(facts, schema_change, table_error)
        check_letters(dead_path, dead, context)
        compared = check_topics(server, topic, converted, schema_change, dead, context)
        if table_error == "halt-table":
            assert set(report["halted_tables"]) >= {"bad.poison"}, report
        if schema_change == "ignore" and not kills:
            assert report["schema_ignored"]["shop.orders"]["fields"] == ["note", "qty", "remark"], report
        print(f"\n[{schema_change}/{table_error}: {kills} kills in {sync.runs} runs, {compared} rows compared, "
              f"{len(dead)} dead letters, {time.monotonic() - began:.1f} s]\n  " + "\n  ".join(log))


@pytest.fixture(scope="module")
def stream():
    return build_stream()


def test_evolve_dlq_killed_and_restarted(kafka_broker, tmp_path, stream):
    """evolve + dlq: added/renamed columns appended, dropped ones NULL, the MODIFY'd rows, the
    poisoned Entries and the oversized one in the dead letters, once each, across SIGKILLs."""
    _policy_run(kafka_broker, tmp_path, *stream, schema_change="evolve", table_error="dlq", kills=2, seed=SEED + 20)


def test_evolve_halt_table_killed_and_restarted(kafka_broker, tmp_path, stream):
    """evolve + halt-table: shop.orders halts at its first MODIFY'd Entry and bad.poison at its
    first bad one (every later Entry of them a dead letter, the halts kept across restarts; the
    rows put before a halt still land), shop.customers goes on."""
    _policy_run(kafka_broker, tmp_path, *stream, schema_change="evolve", table_error="halt-table", kills=2,
                seed=SEED + 23)


def test_lenient_dlq_killed_and_restarted(kafka_broker, tmp_path, stream):
    """lenient: qty's new type goes to qty__string, everything else lands."""
    _policy_run(kafka_broker, tmp_path, *stream, schema_change="lenient", table_error="dlq", kills=1,
                seed=SEED + 21)


def test_ignore_halt_table(kafka_broker, tmp_path, stream):
    """ignore: the topic keeps its first RecordSchema; values it has no field for are left out and
    counted per table in --json; bad.poison halts."""
    _policy_run(kafka_broker, tmp_path, *stream, schema_change="ignore", table_error="halt-table", kills=0,
                seed=SEED + 22)


@pytest.mark.deep
@pytest.mark.parametrize("schema_change", ["evolve", "lenient", "ignore"])
@pytest.mark.parametrize("table_error", ["dlq", "halt-table"])
def test_every_policy_killed_and_restarted_deep(kafka_broker, tmp_path, stream, schema_change, table_error):
    _policy_run(kafka_broker, tmp_path, *stream, schema_change=schema_change, table_error=table_error, kills=6,
                seed=SEED + 30)


def test_schema_change_fail_and_halt_all_stop_naming_table_and_position(kafka_broker, tmp_path, stream):
    """fail: the first row whose RecordSchema differs from its topic's stops the run (exit 1, one
    line naming the table, the field and the Kafka position); a rerun stops at the same place.
    halt-all: the first poisoned Entry stops the run, naming it; no dead letter is written."""
    entries, facts = stream
    topic, _, _ = _setup(kafka_broker, tmp_path, entries, "tables-fail")
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic, "g-fail", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--idle-timeout", "1", "--schema-change", "fail", "--oversized", "dlq",
                    "--on-table-error", "dlq", "--dead-letters", str(tmp_path / "dead-fail.jsonl"),
                    "--exclude", "bad.*")
        stops = []
        for run in range(2):
            code, _, err = sync.run()
            no_traceback(err, f"fail run {run + 1}")
            assert code == 1, err[-2000:]
            line = next(x for x in err.splitlines() if "--schema-change fail" in x)
            assert "shop.orders" in line and "added note STRING" in line and "partition 0 offset" in line, line
            stops.append(line)
        assert stops[0] == stops[1], stops
        landed = {r["attributes"]["dts.pos"] for r in server.records(PROJECT, "shop_orders")}
        assert landed, "the rows before the ALTER landed"
    topic2, _, _ = _setup(kafka_broker, tmp_path, entries, "tables-halt-all")
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic2, "g-halt", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--idle-timeout", "1", "--on-table-error", "halt-all", "--oversized", "dlq",
                    "--dead-letters", str(tmp_path / "dead-halt.jsonl"), "--include", "bad.*", "--include", "shop.big")
        code, _, err = sync.run()
        no_traceback(err, "halt-all run")
        assert code == 1 and "frobnicate(3)" in err and "bad.poison" in err, err[-2000:]
        letters = read_letters(tmp_path / "dead-halt.jsonl")
        assert [x["table"] for x in letters] == ["shop.big"], letters  # oversized follows --oversized
        client = make_client(server.endpoint, "test-id", "test-secret")
        assert set(client.list_topic(PROJECT).topic_names) <= {"bad_poison", "shop_big"}


def test_routing_include_exclude_and_collisions(kafka_broker, tmp_path, stream):
    """--include/--exclude pick tables (the rest counted as not emitted); a Blob '{db}' template
    makes one topic per database; two tables whose names clean to one topic are a usage error (exit
    2) naming both, found when the second table appears."""
    entries, facts = stream
    topic, path, _ = _setup(kafka_broker, tmp_path, entries, "tables-routing")
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic, "g-route", server, "--to", "blob", "--datahub-topic",
                    "dts_{db}", "--idle-timeout", "1", "--exclude", "bad.*", "--exclude", "shop.big")
        code, report, err = sync.run()
        no_traceback(err, "blob per db")
        assert code == 0, err[-2000:]
        assert report["input"] == report["converted"] + report["rejected"] + report["not_emitted"], report
        client = make_client(server.endpoint, "test-id", "test-secret")
        names = set(client.list_topic(PROJECT).topic_names)
        assert names == {"dts_shop", "dts"}, names  # transaction markers (no database) go to 'dts'
        tables = collections.Counter(json.loads(r["data"])["schema"].get("source", {}).get("tableName")
                                     for r in server.records(PROJECT, "dts_shop"))
        assert set(tables) == {"orders", "customers"}, tables  # DDL of excluded tables left out too
        left_out = sum(1 for e in entries if e.header.schemaName == "bad" or e.header.tableName == "big")
        assert report["not_emitted"] >= left_out, report
    # two tables whose topic names clean to one: shop.x_y and shop_x.y under '{db}_{table}'
    b = Binlog(PRIMARY, seed=9)
    one = Table("shop", "x_y", (Col("id", "int(11)", serial(1), key=True),))
    two = Table("shop_x", "y", (Col("id", "int(11)", serial(1), key=True),))
    b.transaction(insert(one, [b.row(one)]))
    b.transaction(insert(two, [b.row(two)]))
    topic2, _, _ = _setup(kafka_broker, tmp_path, b.finish(), "tables-collide")
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic2, "g-collide", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--idle-timeout", "1")
        code, _, err = sync.run()
        no_traceback(err, "collision")
        assert code == 2 and "shop.x_y" in err and "shop_x.y" in err and "'shop_x_y'" in err, err[-2000:]
        assert len(server.records(PROJECT, "shop_x_y")) <= 1  # the first table's row, nothing of the second
        # Blob, one topic per database: databases 'shop_x' and 'Shop-X' clean to one name
        sync = Sync(tmp_path, kafka_broker, topic2, "g-collide-blob", server, "--to", "blob", "--datahub-topic",
                    "dts_{db}", "--idle-timeout", "1")
        code, _, err = sync.run()
        assert code == 0, err[-2000:]  # 'shop' and 'shop_x': no collision
    b = Binlog(PRIMARY, seed=10)
    three = Table("Shop-X", "y", (Col("id", "int(11)", serial(1), key=True),))
    b.transaction(insert(two, [b.row(two)]))
    b.transaction(insert(three, [b.row(three)]))
    topic3, _, _ = _setup(kafka_broker, tmp_path, b.finish(), "tables-collide-db", convert=False)
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic3, "g-collide-db", server, "--to", "blob", "--datahub-topic",
                    "dts_{db}", "--idle-timeout", "1")
        code, _, err = sync.run()
        no_traceback(err, "blob collision")
        assert code == 2 and "'shop_x'" in err and "'Shop-X'" in err and "'dts_shop_x'" in err, err[-2000:]


def test_refused_records_go_to_dead_letters_and_replay_sends_them_once(kafka_broker, tmp_path, stream):
    """DataHub refuses records as malformed (MalformedRecord on the first requests to a shard): the
    refused batch is sent again one record per request, the record refused alone is a dead letter
    (with its row), every other record lands in order; `replay --from-dlq` after the fault is gone
    lands exactly the dead-lettered records, a second replay lands nothing; the MODIFY'd Entries
    dead-lettered under evolve land through a replay with --schema-change lenient."""
    entries, facts = stream
    topic, _, converted = _setup(kafka_broker, tmp_path, entries, "tables-refused")
    dead_path = tmp_path / "dead-refused.jsonl"
    with StandInDataHub() as server:
        server.faults.fail_next("PutRecordsByShard", status=400, code="MalformedRecord", message="bad record",
                                times=3, shard="0")
        sync = Sync(tmp_path, kafka_broker, topic, "g-refused", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--shards", "2", "--idle-timeout", "1", "--on-table-error", "dlq",
                    "--dead-letters", str(dead_path), "--oversized", "dlq", "--include", "shop.*")
        code, report, err = sync.run()
        no_traceback(err, "refused run")
        assert code == 1 and report["stopped"] == "idle", err[-2000:]
        letters = read_letters(dead_path)
        refused = [x for x in letters if x["row"] is not None]
        assert refused and report["refused_by_datahub"] == len(refused), (report, refused)
        # every refused record is missing from DataHub, every other one landed
        landed = collections.Counter()
        for name in ("shop_orders", "shop_customers"):
            for r in server.records(PROJECT, name):
                landed[r["attributes"]["dts.pos"]] += 1
        for x in refused:
            assert f"{x['partition']}:{x['offset']}:{x['entry']}:{x['row']}" not in landed, x
        assert all(n == 1 for n in landed.values())
        want = expected_topics({t: v for t, v in converted.items() if t.startswith("shop.")}, "evolve",
                               set(facts["orders_modified"]) | set(facts["big"]))
        assert sum(landed.values()) == sum(len(rows) for _, rows in want.values()) - len(refused), report
        before = sum(landed.values())
        args = ("--from-dlq", str(dead_path), "--to", "tuple", "--datahub-endpoint", server.endpoint, "--project",
                PROJECT, "--datahub-topic", "{db}_{table}", "--on-error", "skip", "--json")
        first = run_bridge(bridge_cli("replay", *args, "--schema-change", "lenient"))
        no_traceback(first.stderr, "replay")
        done = json.loads(first.stdout)
        big = sum(1 for x in letters if x["table"] == "shop.big")
        assert done["rejected"] == big, (done, first.stderr)  # still oversized
        replayed = collections.Counter()
        for name in ("shop_orders", "shop_customers"):
            for r in server.records(PROJECT, name):
                if r["attributes"]["dts.topic"].endswith("#dead-letters"):
                    replayed[r["attributes"]["dts.pos"]] += 1
        for x in refused:
            assert replayed[f"{x['partition']}:{x['offset']}:{x['entry']}:{x['row']}"] == 1, x
        modified_rows = sum(len(x["entry_base64"]) > 0 for x in letters if x["table"] == "shop.orders"
                            and x["row"] is None)
        assert modified_rows == len(facts["orders_modified"]), modified_rows
        assert sum(replayed.values()) > len(refused)
        again = run_bridge(bridge_cli("replay", *args, "--schema-change", "lenient"))
        second = json.loads(again.stdout)
        assert second["written"] == 0 and second["already_landed"] == done["written"], (second, again.stderr)
        total = sum(1 for name in ("shop_orders", "shop_customers") for _ in server.records(PROJECT, name))
        assert total == before + done["written"]


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _records_in(port: int) -> float:
    """Input records (Entries) the run has read so far, from its --metrics-port."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("dts_bridge_records_in_total"))


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_memory_stays_flat_while_datahub_throttles_everything(kafka_broker, tmp_path):
    """The stand-in answers LimitExceeded to every write for a while: the writer's buffer fills
    (--max-buffered 2000 of 20,000 rows), the Kafka loop blocks (the consumer is not polled), RSS
    stays flat (converting the other 18,000 rows would not); once the throttling ends every record
    lands, once."""
    b = Binlog(PRIMARY, seed=7)
    t = Table("shop", "wide", (Col("id", "bigint(20)", serial(1), key=True), Col("body", "varchar(255)",
                                                                               words(WORDS, 5, 10))))
    b.ddl(t.create_sql(), schema="shop", table="wide")
    for _ in range(200):
        b.transaction(insert(t, [b.row(t) for _ in range(100)]))
    # no CHECKPOINT Entries and --commit-interval 0: no commit (whose flush would wait for DataHub
    # too) comes before the end, so only the writer's buffer can hold the loop back
    entries = [e for e in b.finish() if e.header.messageType != pb.CHECKPOINT]
    began = time.monotonic()
    topic, _, _ = _setup(kafka_broker, tmp_path, entries, "tables-rss", convert=False)
    print(f"\n[set-up {time.monotonic() - began:.1f} s]")
    rows = sum(len(e.event.dmlEvent.rows) for e in entries if e.header.messageType == pb.DML)
    with StandInDataHub() as server:
        server.faults.throttle(0)
        sync = Sync(tmp_path, kafka_broker, topic, "g-rss", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--idle-timeout", "1", "--max-retries", "200", "--commit-interval", "0",
                    "--max-buffered", os.environ.get("SYNC_TEST_MAX_BUFFERED", "2000"))
        port = _free_port()
        proc, out, err = sync.start("--metrics-port", str(port))
        try:
            time.sleep(3.5)  # the buffer fills (2,000 records), then the loop blocks
            samples = []
            read_before = _records_in(port)
            for _ in range(7):
                samples.append(_rss_kb(proc.pid))
                time.sleep(0.5)
            read_after = _records_in(port)
            assert proc.poll() is None, err.read_text()[-2000:]
            landed_while = sum(s["records"] for s in server.shards(PROJECT, "shop_wide"))
            server.faults.throttle(None)
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        no_traceback(err.read_text(), "throttled run")
        assert code == 0, err.read_text()[-2000:]
        assert landed_while == 0
        # the loop waits for the writer: it stopped reading Kafka well before the end of the topic
        print(f"\n[read {read_before} -> {read_after} of {len(entries)} Entries while throttled]")
        assert read_before == read_after < len(entries) / 2, (read_before, read_after, len(entries))
        growth = max(samples) - samples[0]
        assert growth < 15_000, f"RSS grew {growth} kB while throttled: {samples}"
        got = server.records(PROJECT, "shop_wide")
        assert len(got) == rows and len({r["attributes"]["dts.pos"] for r in got}) == rows
        print(f"\n[throttled: RSS {samples[0]}..{max(samples)} kB over 3 s, {rows} rows landed after]")


def test_a_refused_record_halts_its_table_under_halt_table(kafka_broker, tmp_path, stream):
    """halt-table and a record DataHub refuses: the table halts there; the refused record, the
    table's records still waiting in the writer and every later Entry of it are dead letters (a
    row letter or an Entry letter each, none twice), nothing of it lands after the refused one; a
    replay then lands every row of the table exactly once."""
    entries, facts = stream
    topic, _, converted = _setup(kafka_broker, tmp_path, entries, "tables-refused-halt")
    dead_path = tmp_path / "dead-refused-halt.jsonl"
    customers = [row for _, versions in converted["shop.customers"] for _, rows in versions for row in rows]
    with StandInDataHub() as server:
        server.faults.fail_next("PutRecordsByShard", status=400, code="MalformedRecord", message="bad record",
                                times=2, shard="0")
        sync = Sync(tmp_path, kafka_broker, topic, "g-refused-halt", server, "--to", "tuple", "--datahub-topic",
                    "{db}_{table}", "--idle-timeout", "1", "--on-table-error", "halt-table",
                    "--dead-letters", str(dead_path), "--include", "shop.customers", "--batch-size", "5")
        code, report, err = sync.run()
        no_traceback(err, "refused run under halt-table")
        assert code == 1 and report["stopped"] == "idle", err[-2000:]
        assert list(report["halted_tables"]) == ["shop.customers"], report
        assert report["input"] == report["converted"] + report["rejected"] + report["not_emitted"], report
        letters = read_letters(dead_path)
        assert server.records(PROJECT, "shop_customers") == [], "the first record was refused: nothing lands after"
        rows = collections.Counter()
        for x in letters:
            entry = pb.Entry.FromString(base64.b64decode(x["entry_base64"]))
            assert x["table"] == "shop.customers"
            n = len(entry.event.dmlEvent.rows)
            for row in ([x["row"]] if x["row"] is not None else range(n)):
                rows[(x["partition"], x["offset"], x["entry"], row)] += 1
        assert all(n == 1 for n in rows.values()), [k for k, n in rows.items() if n > 1]
        assert len(rows) == len(customers), (len(rows), len(customers))
        assert report["refused_by_datahub"] >= 1, report
        args = ("--from-dlq", str(dead_path), "--to", "tuple", "--datahub-endpoint", server.endpoint, "--project",
                PROJECT, "--datahub-topic", "{db}_{table}", "--json")
        done = run_bridge(bridge_cli("replay", *args))
        no_traceback(done.stderr, "replay")
        assert done.returncode == 0, done.stderr
        got = collections.Counter(tuple(int(p) for p in r["attributes"]["dts.pos"].split(":"))
                                  for r in server.records(PROJECT, "shop_customers"))
        assert got == rows, (len(got), len(rows))
        values = collections.Counter(str(r["values"][0]) for r in server.records(PROJECT, "shop_customers"))
        assert values == collections.Counter(str(row["id"]) for row in customers)


def _throttled_answers(server, *, aimd: bool, n: int = 40) -> tuple[int, float]:
    from bridge.datahub.sink import DataHubWriter
    client = make_client(server.endpoint, "test-id", "test-secret")
    topic = f"aimd_{int(aimd)}"
    server.create_topic(PROJECT, topic, shard_count=1)
    # without AIMD: the rate never drops (min_rate = max_rate), only the jittered backoff spaces retries
    writer = DataHubWriter(client, PROJECT, batch_records=1, workers=1, max_retries=200, backoff=0.02,
                           max_backoff=0.2, seed=3, **({} if aimd else {"min_rate": 2000.0}))
    began = time.monotonic()
    try:
        for i in range(n):
            writer.put(topic, str(i), b"x%d" % i)
        writer.flush()
    finally:
        writer.stop()
    got = [r["data"] for r in server.records(PROJECT, topic)]
    assert got == [b"x%d" % i for i in range(n)], "every record once, in order"
    return writer.throttled, time.monotonic() - began


def test_aimd_rate_limiter_backs_off_on_throttling(tmp_path):
    """The stand-in lets 8 writes a second through a shard (token bucket); the rest get
    LimitExceeded. With the per-shard AIMD rate the writer settles near that rate and is refused
    far less often than with the jittered backoff alone; either way every record lands once, in
    order."""
    with StandInDataHub() as server:
        server.faults.throttle(8.0, burst=2)
        with_aimd, secs_aimd = _throttled_answers(server, aimd=True)
        without, secs_without = _throttled_answers(server, aimd=False)
    print(f"\n[LimitExceeded answers for 40 requests at 8/s: {with_aimd} with AIMD ({secs_aimd:.1f} s), "
          f"{without} without ({secs_without:.1f} s)]")
    assert with_aimd * 2 < without, (with_aimd, without)


def test_blob_dead_letters_hold_the_entries_bytes_whole(kafka_broker, tmp_path, stream):
    """Blob with --on-table-error dlq: the poisoned Entries are dead letters holding the Entry's
    bytes exactly as they came (the C fast path's raw bytes), once each; the 2 MB row is no Blob
    limit (a message under 4 MB) and lands; every other table lands, per database."""
    entries, facts = stream
    topic, _, _ = _setup(kafka_broker, tmp_path, entries, "tables-blob-dlq", convert=False)
    dead_path = tmp_path / "dead-blob.jsonl"
    by_seq = {e.header.seqId: e.SerializeToString() for e in entries}
    with StandInDataHub() as server:
        sync = Sync(tmp_path, kafka_broker, topic, "g-blob-dlq", server, "--to", "blob", "--datahub-topic",
                    "dts_{db}", "--idle-timeout", "1", "--on-table-error", "dlq", "--dead-letters", str(dead_path))
        code, report, err = sync.run()
        no_traceback(err, "blob dlq run")
        assert code == 1 and report["stopped"] == "idle", err[-2000:]
        assert report["rejected"] == len(facts["poison_bad"]), report
        letters = read_letters(dead_path)
        seqs = []
        for x in letters:
            raw = base64.b64decode(x["entry_base64"])
            entry = pb.Entry.FromString(raw)
            assert raw == by_seq[entry.header.seqId], "the Entry's bytes, whole"
            assert x["datahub_topic"] == "dts_bad" and x["table"] == "bad.poison" and x["row"] is None, x
            seqs.append(entry.header.seqId)
        assert sorted(seqs) == seqs and set(seqs) == facts["poison_bad"] and len(seqs) == len(set(seqs)), seqs
        big = [r for r in server.records(PROJECT, "dts_shop") if len(r["data"]) > 2 * 1024 * 1024]
        assert len(big) == 1, len(big)
