"""The whole-database stream of the table tests and what must land of it under each policy: shared by
tests/test_sync_tables.py (`dts-bridge sync`), tests/test_spark_tables.py and
tests/test_spark_tables_kill.py (Spark's `datahub` sink).

`build_stream` (bridge.samples' Binlog, so it is what DTS emits): shop.orders goes through CREATE
TABLE, ALTER TABLE ADD COLUMN, DROP COLUMN, RENAME COLUMN and MODIFY (INT -> VARCHAR); shop.customers
stays plain; bad.poison has good Entries, then Entries with a column type nobody knows, then good
ones again; shop.big has one row over DataHub's 2 MB STRING limit. `expected_dead` and
`expected_topics` apply a schema-change and table-error policy to the file conversion;
`check_topics` puts every topic beside it, per (DataHub shard, Kafka partition), in order.
"""
from __future__ import annotations

import collections
import pathlib

from bridge.datahub.sink import make_client, shard_for, tuple_shard_key
from bridge.samples import PRIMARY, WORDS, Binlog, Col, Table, insert, integer, serial, update, words
from bridge.sync import topic_name
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import pack_entries, write_pb
from support.landing import compare
from support.pipeline import text_or_none
from support.sync_runs import PROJECT, landed_by_shard_partition

BIG_BYTES = 2 * 1024 * 1024 + 4096  # over DataHub's 2 MB STRING limit

ORDERS = Table("shop", "orders", (Col("id", "bigint(20)", serial(1), key=True), Col("qty", "int(11)", integer(1, 9)),
                                  Col("item", "varchar(40)", words(WORDS, 1, 2))))
CUSTOMERS = Table("shop", "customers", (Col("id", "int(11)", serial(1), key=True),
                                        Col("name", "varchar(40)", words(WORDS, 1, 3))))
POISON = Table("bad", "poison", (Col("id", "int(11)", serial(1), key=True), Col("v", "int(11)", integer(1, 99))))
BIG = Table("shop", "big", (Col("id", "int(11)", serial(1), key=True), Col("body", "longtext", words(WORDS, 1, 2))))


def _with(table: Table, cols) -> Table:
    return Table(table.schema, table.name, tuple(cols))


def build_stream(rounds: int = 12) -> tuple[list, dict]:
    """The Entries, and facts the expectations need: seqIds of the bad poison Entries, of the
    orders Entries after MODIFY, of the oversized one, and of every Entry per table."""
    b = Binlog(PRIMARY, seed=2020)
    facts: dict = {"poison_bad": set(), "orders_modified": set(), "big": set()}
    for t in (ORDERS, CUSTOMERS, POISON, BIG):
        b.ddl(t.create_sql(), schema=t.schema, table=t.name)
    orders = ORDERS
    phases = [
        (None, lambda r: r),
        ("ALTER TABLE `shop`.`orders` ADD COLUMN `note` varchar(64) DEFAULT NULL",
         lambda t: _with(t, t.cols + (Col("note", "varchar(64)", words(WORDS, 1, 2)),))),
        ("ALTER TABLE `shop`.`orders` DROP COLUMN `item`", lambda t: _with(t, [c for c in t.cols if c.name != "item"])),
        ("ALTER TABLE `shop`.`orders` RENAME COLUMN `note` TO `remark`",
         lambda t: _with(t, [Col("remark", c.type, c.gen) if c.name == "note" else c for c in t.cols])),
        ("ALTER TABLE `shop`.`orders` MODIFY COLUMN `qty` varchar(20)",
         lambda t: _with(t, [Col("qty", "varchar(20)", words(WORDS, 1, 1)) if c.name == "qty" else c for c in t.cols])),
    ]
    poison_round = 0
    for phase, (sql, change) in enumerate(phases):
        if sql:
            b.ddl(sql, schema="shop", table="orders")
            orders = change(orders)
        for r in range(rounds):
            rows = [b.row(orders) for _ in range(3)]
            before = len(b.entries)
            b.transaction(insert(orders, rows), insert(CUSTOMERS, [b.row(CUSTOMERS)]), insert(POISON, [b.row(POISON)]))
            b.transaction(update(orders, [(rows[0], {**rows[0], **{c.name: b.row(orders)[c.name] for c in orders.cols
                                                                   if not c.key}})]))
            poison_round += 1
            for e in b.entries[before:]:
                if e.header.tableName == "orders" and phase == 4 and e.header.messageType == pb.DML:
                    facts["orders_modified"].add(e.header.seqId)
                if e.header.tableName == "poison" and e.header.messageType == pb.DML and phase == 2 and r in (3, 4):
                    e.event.dmlEvent.columns[1].originalType = "frobnicate(3)"  # a type nobody knows
                    facts["poison_bad"].add(e.header.seqId)
        if phase == 1:
            before = len(b.entries)
            b.transaction(insert(BIG, [b.row(BIG, body="x" * BIG_BYTES)]))
            facts["big"] = {e.header.seqId for e in b.entries[before:] if e.header.messageType == pb.DML}
    entries = b.finish()
    facts["tables"] = collections.defaultdict(list)  # table -> [(seqId, is DML)] in order
    for e in entries:
        if e.header.tableName:
            facts["tables"][f"{e.header.schemaName}.{e.header.tableName}"].append(
                (e.header.seqId, e.header.messageType == pb.DML))
    return entries, facts


def write_stream(path: pathlib.Path, entries) -> pathlib.Path:
    with open(path, "wb") as out:
        write_pb(out, pack_entries(entries, 4096))
    return path


# ---- expectations -------------------------------------------------------------------------------

def expected_dead(facts: dict, schema_change: str, table_error: str) -> set[int]:
    """seqIds of the Entries the dead letters must hold."""
    bad = {"bad.poison": set(facts["poison_bad"])}
    if schema_change == "evolve":
        bad["shop.orders"] = set(facts["orders_modified"])
    dead = set(facts["big"])  # --oversized dlq, whatever the table policy
    for table, seqs in bad.items():
        if table_error == "halt-table":  # the first bad one and everything later of that table
            first = min(seqs)
            dead |= {s for s, _ in facts["tables"][table] if s >= first}
        else:
            dead |= seqs
    return dead


def expected_topics(converted: dict, schema_change: str, dead: set[int]) -> dict:
    """{table: (topic fields [(name, TYPE)], [(partition, row, key columns)])} under the policy:
    the topic is created from the first delivered row's RecordSchema; evolve/lenient append a
    column the topic lacks before the first row that has it, lenient moves a value whose type
    changed to `<column>__<newtype>` (text); ignore leaves such values out."""
    out = {}
    for table, parts in converted.items():
        if table == "shop.big":
            out[table] = (None, [])
            continue
        fields: list = []
        rows_out = []
        for partition, versions in parts:
            for doc, rows in versions:
                vfields = [(f["name"], f["type"].upper()) for f in doc["fields"]]
                keys = [c["name"] for c in doc["dtsColumns"] if c.get("isKey")]
                for row in rows:
                    if int(row["_sequence_id_"]) // 1_000_000 in dead:  # Header.seqId x 10^6 + row index
                        continue
                    if not fields:
                        fields = list(vfields)
                    have = dict(fields)
                    row = dict(row)
                    if schema_change == "ignore":
                        row = {k: v for k, v in row.items() if k in have and have[k] == dict(vfields)[k]}
                    else:
                        added = [(n, t) for n, t in vfields if n not in have and n in row]
                        alts = []
                        for n, t in vfields:
                            if n in have and have[n] != t:  # lenient (under evolve such rows are dead letters)
                                alt = f"{n}__{t.lower()}"
                                if n in row:
                                    value = row.pop(n)
                                    row[alt] = None if value is None else str(value)
                                    if alt not in have:
                                        alts.append((alt, "STRING"))
                        fields += added + alts
                    rows_out.append((partition, row, keys))
        out[table] = (fields, rows_out)
    return out


def check_topics(server, source: str, converted: dict, schema_change: str, dead: set[int], context: str,
                 shards: int = 2) -> int:
    client = make_client(server.endpoint, "test-id", "test-secret")
    want_topics = {t: topic_name("{db}_{table}", *t.split(".", 1)) for t in converted}
    listed = set(client.list_topic(PROJECT).topic_names)
    assert listed == set(want_topics.values()), f"topics {sorted(listed)}, tables {want_topics}\n{context}"
    compared = 0
    for table, (fields, rows) in expected_topics(converted, schema_change, dead).items():
        name = want_topics[table]
        info = client.get_topic(PROJECT, name)
        have = [(f.name, str(getattr(f.type, "value", f.type)).upper()) for f in info.record_schema.field_list]
        if fields is not None:
            assert have == fields, f"{name} ({schema_change}): RecordSchema {have}, expected {fields}\n{context}"
        shard_ids = sorted((s["shard_id"] for s in server.shards(PROJECT, name) if s["state"] == "ACTIVE"), key=int)
        expected: dict = collections.defaultdict(list)
        for partition, row, keys in rows:
            shard = shard_for(tuple_shard_key(row, table, keys), shard_ids)
            expected[(shard, partition)].append([text_or_none(row.get(f)) for f, _ in have])
        got, positions = landed_by_shard_partition(server, name, source, lambda r: [text_or_none(v) for v in r["values"]])
        compare(name, got, positions, expected, f"table {table} ({schema_change}); {context}")
        compared += len(rows)
    return compared
