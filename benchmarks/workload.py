"""The one generated workload every benchmark runs on: DML on a 12-column MySQL table.

A quarter of the row changes are updates (full before and after images, as
`binlog_row_image=FULL` writes them), the rest inserts. Each Entry holds one to five row
changes of one kind; the Entries are packed into Envelopes with `bridge.pack_entries`, as the DTS
producer does. Values are canonical DTS values (what the producer writes), so every converter runs
its common path. Fixed seed and simulated time: the same bytes on every run.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import orjson

import bridge
from bridge import pb

SCHEMA_NAME, TABLE_NAME = "shop", "orders"
START_TIME = 1_700_000_000  # binlog seconds of the first event
ROWS_PER_ENTRY = (1, 1, 1, 2, 3, 5)  # drawn per Entry: about half the Entries hold one row
UPDATE_SHARE = 0.25

_WORDS = ("order", "gift", "coffee", "tea", "订单", "礼物", "咖啡", "Müller", "café", "naïve", "🚀", "data",
          "bridge", "Kafka", "DataHub", "北京", "東京", "Zürich", "São Paulo", "item")
_CITIES = ("Shanghai", "Beijing", "Hangzhou", "Shenzhen", "Chengdu", "Berlin", "Paris")


@dataclass(frozen=True)
class ColumnDef:
    name: str
    original_type: str
    datatype: int
    key: bool = False


# (name, MySQL column type, DataType the producer writes): the mix of a real CDC table.
COLUMNS = (
    ColumnDef("id", "bigint(20)", pb.INT64, key=True),
    ColumnDef("customer", "varchar(64)", pb.STRING),
    ColumnDef("amount", "decimal(12,2)", pb.DECIMAL),
    ColumnDef("quantity", "int(11)", pb.INT32),
    ColumnDef("created_at", "datetime", pb.STRING),
    ColumnDef("score", "double", pb.FLOAT64),
    ColumnDef("active", "tinyint(1)", pb.INT8),
    ColumnDef("note", "text", pb.STRING),
    ColumnDef("counter", "bigint(20) unsigned", pb.UINT64),
    ColumnDef("birthday", "date", pb.STRING),
    ColumnDef("updated_at", "timestamp", pb.STRING),
    ColumnDef("attrs", "json", pb.BYTES),
)
_TEXT_COLUMNS = {"customer", "note"}


@dataclass
class Workload:
    entries: list          # pb.Entry
    entry_bytes: list      # each Entry's encoding (what a consumer has after unpacking Entries)
    envelopes: list        # pb.Envelope, from bridge.pack_entries
    rows: int              # DML row changes (an update counts once)
    updates: int

    @property
    def envelope_bytes(self) -> list:
        return [env.SerializeToString() for env in self.envelopes]


def _text(rng: random.Random, words: int) -> bytes:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).encode("utf-8")


def _datetime(seconds: int) -> str:
    import datetime as dt
    return (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")


def _row_values(rng: random.Random, key: int, now: int) -> dict:
    """Python values of one row image, by column name (None is SQL NULL)."""
    cents = rng.randint(0, 10 ** 9)
    return {
        "id": key,
        "customer": _text(rng, rng.randint(1, 3)),
        "amount": f"{cents // 100}.{cents % 100:02d}",
        "quantity": rng.randint(1, 500),
        "created_at": _datetime(now - rng.randint(0, 86_400 * 30)),
        "score": round(rng.uniform(-1000, 1000), rng.randint(0, 6)),
        "active": rng.randint(0, 1),
        "note": None if rng.random() < 0.1 else _text(rng, rng.randint(5, 40)),
        "counter": rng.randint(0, (1 << 64) - 1) if rng.random() < 0.2 else rng.randint(0, 10 ** 9),
        "birthday": None if rng.random() < 0.05 else _datetime(rng.randint(0, 40 * 365 * 86_400))[:10],
        "updated_at": _datetime(now) + " +00:00",
        "attrs": orjson.dumps({"city": rng.choice(_CITIES), "tags": [rng.choice(_WORDS) for _ in range(2)],
                               "vip": rng.random() < 0.1, "points": rng.randint(0, 10_000)}),
    }


def _data(col: ColumnDef, value) -> pb.Data:
    if value is None:
        return pb.Data(dataType=pb.NIL)
    if col.datatype == pb.STRING:
        if col.name in _TEXT_COLUMNS:
            return pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=value)
        return pb.Data(dataType=pb.STRING, bv=value.encode("ascii"))  # temporal text
    if col.datatype == pb.BYTES:
        return pb.Data(dataType=pb.BYTES, bv=value)
    return pb.Data(dataType=col.datatype, sv=repr(value) if isinstance(value, float) else str(value))


def _image(values: dict) -> list:
    return [_data(col, values[col.name]) for col in COLUMNS]


def _changed(rng: random.Random, before: dict, now: int) -> dict:
    after = dict(before)
    cents = rng.randint(0, 10 ** 9)
    after["amount"] = f"{cents // 100}.{cents % 100:02d}"
    after["quantity"] = rng.randint(1, 500)
    after["active"] = 1 - before["active"]
    after["updated_at"] = _datetime(now) + " +00:00"
    if rng.random() < 0.5:
        after["note"] = _text(rng, rng.randint(5, 40))
    return after


def build(rows: int, seed: int = 20240517, max_message_bytes: int = 1 << 20) -> Workload:
    """At least `rows` DML row changes (the last Entry may round up by a few)."""
    rng = random.Random(seed)
    columns = [pb.Column(name=c.name, originalType=c.original_type, isKey=c.key) for c in COLUMNS]
    entries, made, updates, next_key, now = [], 0, 0, 1, START_TIME
    live: list[dict] = []  # rows inserted so far that an update may change
    seq = 1_000
    while made < rows:
        count = rng.choice(ROWS_PER_ENTRY)
        update = bool(live) and rng.random() < UPDATE_SHARE
        now += rng.randint(0, 2)
        seq += 1
        entry = pb.Entry(header=pb.Header(
            version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=now, serverId=3306,
            fileName="mysql-bin.000123", position=4 + seq * 512, gtid=f"8a7b6c5d-1111-2222-3333-444455556666:{seq}",
            schemaName=SCHEMA_NAME, tableName=TABLE_NAME, seqId=seq))
        dml = entry.event.dmlEvent
        dml.dmlEventType = pb.UPDATE if update else pb.INSERT
        dml.columns.extend(columns)
        for _ in range(count):
            if update:
                index = rng.randrange(len(live))
                before = live[index]
                live[index] = after = _changed(rng, before, now)
                dml.rows.add(oldColumns=_image(before), newColumns=_image(after))
                updates += 1
            else:
                values = _row_values(rng, next_key, now)
                next_key += 1
                if len(live) < 10_000:
                    live.append(values)
                else:
                    live[rng.randrange(len(live))] = values
                dml.rows.add(newColumns=_image(values))
        made += count
        entries.append(entry)
    entry_bytes = [e.SerializeToString() for e in entries]
    envelopes = list(bridge.pack_entries(entries, max_message_bytes))
    return Workload(entries, entry_bytes, envelopes, made, updates)
