"""Deterministic sample streams that look like Tencent DTS reading a MySQL (or MariaDB) binlog.

Tables are declared as data (column name, MySQL type, value generator); a small binlog model turns
scripted sessions (DDL, transactions, idle time) into Entries with realistic headers: GTIDs,
binlog file and position, seqId, heartbeats while idle and a checkpoint about every 10 s. Every
random choice comes from `random.Random(seed)` and time is simulated, so the bytes written are the
same on every run (the tests compare them with the committed files in `samples/`).

>>> streams = build_sample_entries()
>>> sorted(streams)
['large', 'mariadb', 'mixed', 'realistic', 'types']
>>> streams["mixed"][0].event.ddlEvent.sql
'CREATE DATABASE IF NOT EXISTS `shop` DEFAULT CHARACTER SET utf8mb4'
"""
from __future__ import annotations

import pathlib
import random
from collections import Counter
from dataclasses import dataclass, replace

from bridge.samples.values import (
    ALL_TYPES_EDGE_ROWS,
    CHARSET_EDGE_ROWS,
    MINIMAL,
    NA,
    NULL,
    NULL_ON_WIRE,
    REAL_ORDERS,
    REAL_PROPERTIES,
    REAL_SUPPLIERS,
    TEXTS,
    Change,
    Col,
    RowContext,
    Table,
    clock,
    decimal,
    delete,
    insert,
    integer,
    json_doc,
    moment,
    nullable,
    one_of,
    raw_bytes,
    real,
    serial,
    update,
    wire_bytes,
    wkb_point,
    words,
)
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Assembled, Reassembler, pack_entries, write_dts_json, write_pb

__all__ = ["build_sample_entries", "build_sample_wire", "write_samples", "stream_summary", "STREAM_MESSAGE_BYTES"]

# Kafka message size per stream: "large" uses a small limit so that big Entries get split.
STREAM_MESSAGE_BYTES = {"mixed": 16384, "types": 16384, "mariadb": 16384, "large": 4096, "realistic": 16384}

# ---- tables as data ------------------------------------------------------------------------------

SURNAMES = ("王", "李", "Müller", "García", "O'Brien", "Nguyễn", "Smith", "Kowalski")
GIVEN = ("伟", "芳", "José", "Zoë", "Ann", "Łukasz", "Søren", "🦄 Uni")
WORDS = ("fast", "delivery", "gift", "wrap", "please", "call", "before", "送货", "谢谢", "😀", "fragile")

CUSTOMERS = Table("shop", "customers", (
    Col("id", "bigint(20) unsigned", serial(10001), key=True),
    Col("email", "varchar(128)", lambda c: f"user{c.n}@example.com"),
    Col("name", "varchar(64)", lambda c: f"{c.rng.choice(GIVEN)} {c.rng.choice(SURNAMES)}"),
    Col("phone", "varchar(20)", one_of(NULL, "", "+86 138 0013 8000", "+49 30 901820")),
    Col("level", "tinyint(3) unsigned", integer(0, 5)),
    Col("balance", "decimal(12,2)", decimal(-500, 99999, 2)),
    Col("is_vip", "tinyint(1)", integer(0, 1)),
    Col("birthday", "date", nullable(moment("date", within=60 * 365 * 86400))),
    Col("tags", "set('new','vip','wholesale','blocked')", one_of("", "new", "new,vip", "vip,wholesale")),
    Col("profile", "json", nullable(json_doc(lambda c: {"lang": c.rng.choice(["zh-CN", "en", "de"]),
                                                        "newsletter": c.rng.random() < 0.5}))),
    Col("created_at", "timestamp", moment("timestamp")),
    Col("updated_at", "timestamp(3)", moment("timestamp", 3)),
))

ORDERS = Table("shop", "orders", (
    Col("shop_id", "int(10) unsigned", integer(1, 3), key=True),
    Col("order_id", "bigint(20)", serial(202105170001), key=True),
    Col("customer_id", "bigint(20) unsigned", integer(10001, 10004)),
    Col("status", "enum('NEW','PAID','SHIPPED','DONE','CANCELLED')", one_of("NEW", "PAID")),
    Col("amount", "decimal(12,2)", decimal(1, 5000, 2)),
    Col("currency", "char(3)", one_of("CNY", "EUR", "USD"), charset="latin1"),
    Col("fx_rate", "decimal(30,9)", decimal(0, 10, 9)),
    Col("items", "smallint(5) unsigned", integer(1, 12)),
    Col("weight_kg", "float", real(0.1, 30, 2)),
    Col("paid_at", "datetime(6)", nullable(moment("datetime", 6, within=600), 0.4)),
    Col("created_at", "datetime", moment("datetime", within=600)),
    Col("remark", "varchar(255)", nullable(lambda c: c.rng.choice(["请尽快发货", "周末送货", "无"]), 0.5),
        charset="gbk"),
))
ORDERS_V2 = ORDERS.with_column(Col("note", "varchar(255)", nullable(words(WORDS, 1, 5), 0.3)))
ORDERS_2020 = replace(ORDERS, name="orders_2020")

EMPLOYEES = Table("hr", "employees", (
    Col("emp_no", "int(11)", serial(10001), key=True),
    Col("first_name", "varchar(14)", one_of(*GIVEN[:7])),
    Col("last_name", "varchar(16)", one_of(*SURNAMES)),
    Col("gender", "enum('M','F')", one_of("M", "F")),
    Col("birth_date", "date", moment("date", within=40 * 365 * 86400)),
    Col("hire_date", "date", moment("date", within=5 * 365 * 86400)),
    Col("salary", "decimal(10,2)", decimal(3000, 90000, 2)),
    Col("dept", "char(4)", one_of("d001", "d002", "d005"), charset="latin1"),
    Col("shift_start", "time", clock(6, 22)),
    Col("photo", "mediumblob", nullable(raw_bytes(16, 64), 0.5)),
    Col("bio", "text", nullable(words(WORDS[:9], 3, 9))),  # no emoji: utf8 is 3-byte UTF-8
    Col("rating", "double", real(0, 5, 3)),
), charset="utf8")

ACCESS_LOG = Table("logs", "access_log", (  # MyISAM, no primary key: every column is the row's identity
    Col("ts", "datetime(3)", moment("datetime", 3)),
    Col("ip", "varbinary(16)", lambda c: bytes([10, 0, c.rng.randint(0, 255), c.rng.randint(1, 254)])),
    Col("method", "char(7)", one_of("GET", "POST", "DELETE")),
    Col("path", "varchar(255)", lambda c: c.rng.choice(["/", "/cart", "/café/menü", "/prix-€"])),
    Col("status", "smallint(5) unsigned", one_of(200, 201, 304, 404, 500)),
    Col("bytes", "int(10) unsigned", integer(0, 4_000_000)),
    Col("latency_ms", "mediumint(8) unsigned", integer(1, 16777215)),
), charset="latin1", engine="MyISAM")

ALL_TYPES = Table("typedb", "all_types", (
    Col("id", "int(10) unsigned", serial(100), key=True),
    Col("c_tinyint", "tinyint(4)", integer(-128, 127)),
    Col("c_tinyint_u", "tinyint(3) unsigned", integer(0, 255)),
    Col("c_bool", "tinyint(1)", integer(0, 1)),
    Col("c_smallint", "smallint(6)", integer(-32768, 32767)),
    Col("c_smallint_u", "smallint(5) unsigned", integer(0, 65535)),
    Col("c_mediumint", "mediumint(9)", integer(-8388608, 8388607)),
    Col("c_mediumint_u", "mediumint(8) unsigned", integer(0, 16777215)),
    Col("c_int", "int(11)", integer(-2 ** 31, 2 ** 31 - 1)),
    Col("c_int_u", "int(10) unsigned", integer(0, 2 ** 32 - 1)),
    Col("c_bigint", "bigint(20)", integer(-2 ** 63, 2 ** 63 - 1)),
    Col("c_bigint_u", "bigint(20) unsigned", integer(0, 2 ** 64 - 1)),
    Col("c_float", "float", real(-1000, 1000, 2)),
    Col("c_double", "double", real(-1e6, 1e6, 6)),
    Col("c_decimal", "decimal(30,9)", decimal(-10 ** 12, 10 ** 12, 9)),
    Col("c_money", "decimal(10,2)", decimal(0, 9999, 2)),
    Col("c_bit1", "bit(1)", integer(0, 1)),
    Col("c_bit8", "bit(8)", integer(0, 255)),
    Col("c_bit64", "bit(64)", integer(0, 2 ** 64 - 1)),
    Col("c_year", "year(4)", integer(1901, 2155)),
    Col("c_date", "date", moment("date", within=10 ** 9)),
    Col("c_datetime", "datetime", moment("datetime", within=10 ** 8)),
    Col("c_datetime6", "datetime(6)", moment("datetime", 6, within=10 ** 8)),
    Col("c_timestamp", "timestamp", moment("timestamp", within=10 ** 8)),
    Col("c_timestamp3", "timestamp(3)", moment("timestamp", 3, within=10 ** 8)),
    Col("c_time", "time", clock()),
    Col("c_time3", "time(3)", lambda c: f"{c.rng.choice(('', '-'))}{c.rng.randint(1, 838):02d}:"
                                          f"{c.rng.randint(0, 59):02d}:07.250"),
    Col("c_char", "char(8)", words(("ab", "中", "é"), 1, 2)),
    Col("c_varchar", "varchar(64)", words(WORDS, 1, 4)),
    Col("c_tinytext", "tinytext", words(WORDS, 1, 3)),
    Col("c_text", "text", words(WORDS, 2, 8)),
    Col("c_mediumtext", "mediumtext", words(WORDS, 2, 8)),
    Col("c_longtext", "longtext", words(WORDS, 2, 8)),
    Col("c_enum", "enum('draft','published','archived')", one_of("draft", "published", "archived")),
    Col("c_set", "set('red','green','blue')", one_of("", "red", "green,blue")),
    Col("c_binary", "binary(16)", lambda c: c.rng.randbytes(16)),
    Col("c_varbinary", "varbinary(255)", raw_bytes(0, 24)),
    Col("c_tinyblob", "tinyblob", raw_bytes(0, 16)),
    Col("c_blob", "blob", raw_bytes(0, 32)),
    Col("c_mediumblob", "mediumblob", raw_bytes(0, 32)),
    Col("c_longblob", "longblob", raw_bytes(0, 32)),
    Col("c_json", "json", json_doc(lambda c: {"n": c.n, "ok": True, "who": c.rng.choice(GIVEN)})),
    Col("c_geometry", "geometry", lambda c: wkb_point(c.rng.randint(-180, 180), c.rng.randint(-90, 90))),
))

CHARSETS = Table("typedb", "charsets", (
    Col("id", "int(11)", serial(1), key=True),
    *(Col(f"c_{cs}", "varchar(64)", one_of(TEXTS[cs]), charset=cs) for cs in TEXTS),
    Col("c_gbk_char", "char(4)", one_of("中文"), charset="gbk"),
    Col("c_latin1_text", "text", one_of("ça coûte 5 €"), charset="latin1"),
))

POSTS = Table("blog", "posts", (
    Col("id", "int(11)", serial(1), key=True),
    Col("title", "varchar(200)", words(WORDS, 2, 5)),
    Col("body", "longtext", words(WORDS, 10, 30)),
    Col("meta", "longtext", json_doc(lambda c: {"lang": "en", "draft": c.rng.random() < 0.3})),  # MariaDB JSON
    Col("views", "int(10) unsigned", integer(0, 100000)),
    Col("rating", "decimal(3,1)", decimal(0, 5, 1)),
    Col("published", "datetime", nullable(moment("datetime", within=86400))),
    Col("created_at", "timestamp", moment("timestamp")),
))

ATTACHMENTS = Table("media", "attachments", (
    Col("id", "bigint(20) unsigned", serial(1), key=True),
    Col("owner_id", "int(11)", integer(1, 500)),
    Col("file_name", "varchar(255)", lambda c: f"scan-{c.n:04d}-扫描件.pdf"),
    Col("mime", "varchar(64)", one_of("application/pdf", "image/png"), charset="latin1"),
    Col("sha256", "binary(32)", lambda c: c.rng.randbytes(32)),
    Col("body", "longblob", raw_bytes(200, 600)),
    Col("caption", "longtext", words(WORDS, 3, 10)),
    Col("created_at", "datetime(6)", moment("datetime", 6)),
))

THUMBNAILS = Table("media", "thumbnails", (
    Col("id", "int(10) unsigned", serial(1), key=True),
    Col("attachment_id", "bigint(20) unsigned", integer(1, 3)),
    Col("width", "smallint(5) unsigned", one_of(64, 128, 256)),
    Col("height", "smallint(5) unsigned", one_of(64, 128, 256)),
    Col("png", "blob", raw_bytes(20, 40)),
))

# ---- the binlog model ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One source server as DTS sees it."""
    kind: int                # SourceType
    server_id: int
    uuid: str                # MySQL server_uuid; MariaDB GTIDs are domain-server-sequence instead
    zone: int                # time_zone offset in minutes, for DATETIME/TIMESTAMP text
    file_prefix: str
    file_no: int
    position: int
    gtid_no: int             # number of the first GTID this stream writes
    start: int               # header time of the first event
    prior_gtids: str = ""    # GTIDs executed by earlier primaries, carried in checkpoints
    fake_gtid: bool = False  # what checkpoints say in fakeGtid (see samples/README.md)
    properties: tuple = ()   # (key, value) header properties on every Entry


_GTID_EVENT, _BEGIN_EVENT, _XID_EVENT, _FIRST_EVENT = 65, 80, 31, 194  # bytes / offset in a binlog


class Binlog:
    """Turns a scripted session into Entries the way DTS emits them; see the module docstring."""
    HEARTBEAT_SECONDS = 5
    CHECKPOINT_SECONDS = 10

    def __init__(self, source: Source, seed: int) -> None:
        self.src = source
        self.rng = random.Random(seed)
        self.now = source.start
        self.file_no = source.file_no
        self.position = source.position
        self.gtid_no = source.gtid_no - 1
        self.entries: list[pb.Entry] = []
        self._last_checkpoint = source.start
        self._unsaved = False  # a transaction or DDL came after the last checkpoint
        self._rows: Counter = Counter()
        self._txns: Counter = Counter()  # transactions begun per header second, for transactionId

    def row(self, table: Table, **fixed) -> dict:
        """A new row from the table's generators; `fixed` values win (and skip their generator)."""
        self._rows[table.name] += 1
        ctx = RowContext(self.rng, self._rows[table.name], self.now, self.src.zone)
        return {c.name: fixed[c.name] if c.name in fixed else c.gen(ctx) for c in table.cols}

    def ddl(self, sql: str, *, schema: str, table: str = "", session_db: str | None = None,
            seconds: int = 0) -> None:
        self._next_unit()
        session_db = schema if session_db is None else session_db
        gtid = self._next_gtid()
        self.position += _GTID_EVENT
        self._emit(pb.DDL, gtid=gtid, schema=schema, table=table,
                   ddlEvent=pb.DDLEvent(schemaName=session_db, sql=sql, executionTime=seconds))
        self.position += 73 + len(session_db) + len(sql.encode())

    def transaction(self, *changes: Change, thread: int = 4107, rollback: bool = False) -> None:
        self._next_unit()
        gtid = self._next_gtid()
        self._txns[self.now] += 1
        txid = f"{self.now}:{self._txns[self.now]}"
        self.position += _GTID_EVENT
        self._emit(pb.BEGIN, gtid=gtid, beginEvent=pb.BeginEvent(transactionId=txid, threadId=thread))
        self.position += _BEGIN_EVENT
        for change in changes:
            self._emit_rows(change, gtid)
        if rollback:
            self._emit(pb.ROLLBACK, gtid=gtid, rollbackEvent=pb.RollbackEvent())
        else:
            self._emit(pb.COMMIT, gtid=gtid, commitEvent=pb.CommitEvent(transactionId=txid))
        self.position += _XID_EVENT

    def idle(self, seconds: int) -> None:
        """Nothing written for a while: DTS sends heartbeats (and still checkpoints)."""
        for _ in range(seconds // self.HEARTBEAT_SECONDS):
            self.now += self.HEARTBEAT_SECONDS
            self._checkpoint_if_due()
            self._emit(pb.HEARTBEAT, heartbeatEvent=pb.HeartbeatEvent(epoch=self.now))
        self.now += seconds % self.HEARTBEAT_SECONDS

    def rotate(self) -> None:
        """FLUSH LOGS: the next event is in the next file, and positions start over."""
        self.file_no += 1
        self.position = _FIRST_EVENT

    def finish(self) -> list[pb.Entry]:
        """The Entries so far, ending at a checkpoint (a safe commit point) if anything needs one."""
        if self._unsaved:
            self.now += 1
            self._checkpoint()
        return self.entries

    # -- internals

    @property
    def file_name(self) -> str:
        return f"{self.src.file_prefix}.{self.file_no:06d}"

    def _next_unit(self) -> None:
        self.now += self.rng.randint(0, 2)
        self._checkpoint_if_due()
        self._unsaved = True

    def _next_gtid(self) -> str:
        self.gtid_no += 1
        if self.src.kind == pb.MARIADB:
            return f"0-{self.src.server_id}-{self.gtid_no}"
        return f"{self.src.uuid}:{self.gtid_no}"

    def _checkpoint_if_due(self) -> None:
        if self.now - self._last_checkpoint >= self.CHECKPOINT_SECONDS:
            self._checkpoint()

    def _checkpoint(self) -> None:
        self._last_checkpoint = self.now
        self._unsaved = False
        if self.src.kind == pb.MARIADB:
            synced = f"0-{self.src.server_id}-{self.gtid_no}"
        else:
            synced = f"{self.src.prior_gtids}{self.src.uuid}:1-{self.gtid_no}"
        self._emit(pb.CHECKPOINT, checkpointEvent=pb.CheckpointEvent(
            syncedGtid=synced, fakeGtid=self.src.fake_gtid, fileName=self.file_name, position=self.position))

    def _emit_rows(self, change: Change, gtid: str) -> None:
        t = change.table
        self.position += 40 + len(t.schema) + len(t.name) + 2 * len(t.cols)  # Table_map event
        size = -(-len(change.images) // change.pieces)
        parts = [change.images[i:i + size] for i in range(0, len(change.images), size)]
        written = 0
        for index, part in enumerate(parts):
            event = pb.DMLEvent(dmlEventType=change.kind, columns=t.columns())
            for old, new in part:
                event.rows.add(oldColumns=t.encode(old) if old else [], newColumns=t.encode(new) if new else [])
            self._emit(pb.DML, gtid=gtid, schema=t.schema, table=t.name, event_index=index,
                       is_last=index == len(parts) - 1, dmlEvent=event)
            written += event.ByteSize()
        self.position += 29 + written  # one rows event, however DTS cut it

    def _emit(self, kind: int, *, gtid: str = "", schema: str = "", table: str = "", event_index: int = 0,
              is_last: bool = True, **event) -> None:
        header = pb.Header(version=1, sourceType=self.src.kind, messageType=kind, timestamp=self.now,
                           serverId=self.src.server_id, fileName=self.file_name, position=self.position,
                           gtid=gtid, schemaName=schema, tableName=table, seqId=len(self.entries) + 1,
                           eventIndex=event_index, isLast=is_last,
                           properties=[pb.KVPair(key=k, value=v) for k, v in self.src.properties])
        self.entries.append(pb.Entry(header=header, event=pb.Event(**event)))


# ---- the streams ---------------------------------------------------------------------------------

_T0 = 1621236162  # 2021-05-17 07:22:42 UTC
PRIMARY = Source(pb.MYSQL, 2462516103, "8c3e6a2e-b6f2-11eb-8f5a-5254006e1a7d", 480, "mysql-bin", 123,
                 2408117, 3310, _T0, prior_gtids="0d4a8f32-5a17-11ea-9c6b-525400cf2a94:1-88211,")
TYPES_HOST = replace(PRIMARY, server_id=1140037211, uuid="f1f2a3b4-0c1d-11ec-a1b2-5254003c7e11", zone=0,
                     file_no=7, position=_FIRST_EVENT, gtid_no=1, start=_T0 + 86400, prior_gtids="")
BLOB_HOST = replace(TYPES_HOST, server_id=3306001, uuid="5e0f9c10-1f2e-11ec-8e8e-5254001a2b3c", zone=480,
                    file_no=42, position=1048576, gtid_no=501, start=_T0 + 2 * 86400)
REAL_HOST = replace(TYPES_HOST, server_id=3306101, uuid="7d2c4e1a-3b9f-11ec-9a41-5254006a1c2f", file_no=31,
                    position=4, gtid_no=9001, start=_T0 + 4 * 86400, properties=REAL_PROPERTIES)
MARIADB_HOST = Source(pb.MARIADB, 3306, "", 120, "mariadb-bin", 7, 90210, 1201, _T0 + 3 * 86400,
                      fake_gtid=True)


def _mixed() -> list[pb.Entry]:
    """Shop, HR and log databases from first DDL to cleanup; every DDL kind and a ROLLBACK."""
    b = Binlog(PRIMARY, seed=101)
    b.ddl("CREATE DATABASE IF NOT EXISTS `shop` DEFAULT CHARACTER SET utf8mb4", schema="shop", session_db="")
    b.ddl(CUSTOMERS.create_sql(), schema="shop", table="customers")
    b.ddl(ORDERS.create_sql(), schema="shop", table="orders")
    b.ddl("create database hr default character set utf8", schema="hr", session_db="shop")
    b.ddl(EMPLOYEES.create_sql(), schema="hr", table="employees")
    b.ddl("CREATE DATABASE `logs`", schema="logs", session_db="hr")
    b.ddl(ACCESS_LOG.create_sql(), schema="logs", table="access_log")
    b.ddl("GRANT SELECT ON `shop`.* TO 'report'@'10.0.%'", schema="shop", session_db="logs")
    customers = [b.row(CUSTOMERS) for _ in range(4)]
    b.transaction(insert(CUSTOMERS, customers), thread=4107)
    b.idle(8)
    orders = [b.row(ORDERS, customer_id=c["id"]) for c in customers for _ in range(2)]
    b.transaction(insert(ORDERS, orders[:5]), thread=4107)
    b.transaction(insert(ORDERS, orders[5:]),
                  update(CUSTOMERS, [(customers[0], {**customers[0], "level": 3, "tags": "new,vip"})]),
                  thread=4111)
    emps = [b.row(EMPLOYEES) for _ in range(3)]
    b.transaction(insert(EMPLOYEES, emps), thread=5120)
    for _ in range(3):  # MyISAM: each statement is its own transaction in the binlog
        b.transaction(insert(ACCESS_LOG, [b.row(ACCESS_LOG) for _ in range(2)]), thread=77)
    b.ddl("/* ApplicationName=DBeaver 21.0.3 - SQLEditor <Script-7.sql> */ ALTER TABLE `shop`.`orders` "
          "ADD COLUMN `note` varchar(255) DEFAULT NULL", schema="shop", table="orders", seconds=3)
    orders = [{**o, "note": NULL} for o in orders]
    paid = [{**o, "status": "PAID", "paid_at": "2021-05-17 15:23:01.000250", "note": "已付款 ✓"} for o in orders[:3]]
    b.transaction(update(ORDERS_V2, list(zip(orders[:3], paid))), thread=4107)
    b.ddl("-- ticket OPS-1234: speed up customer lookups\nCREATE INDEX idx_orders_customer ON shop.orders "
          "(customer_id)", schema="shop", table="orders", seconds=1)
    b.transaction(update(CUSTOMERS, [(customers[1], {**customers[1], "phone": NULL}),
                                     (customers[2], {**customers[2], "phone": ""})]), thread=4111)
    b.idle(14)
    moved = {**paid[0], "shop_id": paid[0]["shop_id"] % 3 + 1}  # an update of the primary key itself
    b.transaction(update(ORDERS_V2, [(paid[0], moved)]), delete(ORDERS_V2, orders[6:8]), thread=4107)
    # A transaction touching MyISAM is logged even when rolled back (the MyISAM rows stay changed).
    b.transaction(insert(ORDERS_V2, [b.row(ORDERS_V2)]), insert(ACCESS_LOG, [b.row(ACCESS_LOG)]),
                  thread=4120, rollback=True)
    b.ddl("create UNIQUE index `uk_email` ON `customers` (`email`)", schema="shop", table="customers",
          seconds=1)
    b.rotate()
    # hr runs with binlog_row_image=MINIMAL: key-only before images, changed-only after images.
    raise_ = [(e, {**e, "salary": "99999.99", "rating": "4.75"}) for e in emps[:2]]
    b.transaction(update(EMPLOYEES, raise_, image=MINIMAL), thread=5120)
    raised = raise_[0][1]
    b.transaction(delete(EMPLOYEES, [emps[2]], image=MINIMAL), thread=5120)
    new_emp = {**{c.name: NA for c in EMPLOYEES.cols}, "emp_no": 10004, "first_name": "Ann",
               "last_name": "Smith", "hire_date": "2021-05-17", "photo": NULL}
    b.transaction(insert(EMPLOYEES, [new_emp]), thread=5120)
    b.ddl("  \n\tdrop index idx_orders_customer on `shop`.`orders`", schema="shop", table="orders")
    b.ddl(ORDERS_2020.create_sql(), schema="shop", table="orders_2020")
    b.transaction(insert(ORDERS_2020, [b.row(ORDERS_2020) for _ in range(3)]), thread=4130)
    b.ddl("RENAME TABLE `shop`.`orders_2020` TO `shop`.`orders_archive_2020`", schema="shop",
          table="orders_2020")
    b.ddl("DROP TABLE IF EXISTS `orders_archive_2020` /* generated by server */", schema="shop",
          table="orders_archive_2020")
    b.idle(11)
    b.ddl("/* sql-audit: job=42 */\n-- rotate the log table\n  TrUnCaTe TABLE `logs`.`access_log`",
          schema="logs", table="access_log", session_db="shop")
    b.transaction(insert(ACCESS_LOG, [b.row(ACCESS_LOG) for _ in range(3)]), thread=77)
    b.transaction(insert(CUSTOMERS, [b.row(CUSTOMERS)]), insert(ORDERS_V2, [b.row(ORDERS_V2)]),
                  update(EMPLOYEES, [(raised, {**raised, "dept": "d005"})]), thread=4107)
    b.idle(6)
    return b.finish()


def _types() -> list[pb.Entry]:
    """Every MySQL type family with its edge values; FULL and MINIMAL images; every charset."""
    b = Binlog(TYPES_HOST, seed=202)
    b.ddl("CREATE DATABASE `typedb`", schema="typedb", session_db="")
    b.ddl(ALL_TYPES.create_sql(), schema="typedb", table="all_types")
    b.ddl(CHARSETS.create_sql(), schema="typedb", table="charsets")
    blank = {c.name: NULL for c in ALL_TYPES.cols}
    edges = [{**blank, **r} for r in ALL_TYPES_EDGE_ROWS]
    b.transaction(insert(ALL_TYPES, edges[:4]))
    b.transaction(insert(ALL_TYPES, edges[4:]))
    texts = [{**{c.name: NULL for c in CHARSETS.cols}, **r} for r in CHARSET_EDGE_ROWS]
    b.transaction(insert(CHARSETS, texts))
    plain = [b.row(ALL_TYPES) for _ in range(4)]
    b.transaction(insert(ALL_TYPES, plain))
    b.idle(7)
    swapped = {**edges[1], "id": edges[0]["id"]}  # every column changes, min -> max
    b.transaction(update(ALL_TYPES, [(edges[0], swapped), (edges[2], {**edges[2], "c_varchar": NULL})]))
    b.transaction(update(CHARSETS, [(texts[0], {**texts[0], "c_latin1": "Ÿ€", "c_big5": NULL}),
                                    (texts[2], {**texts[2], "c_gb18030": TEXTS["gb18030"]})]))
    # binlog_row_image=MINIMAL from here on
    b.transaction(update(ALL_TYPES, [(plain[0], {**plain[0], "c_int": 7, "c_varchar": "", "c_json": NULL}),
                                     (edges[3], {**edges[3], "c_date": "2021-05-17"})], image=MINIMAL))
    defaults = {**{c.name: NA for c in ALL_TYPES.cols}, "id": 200, "c_int": 5, "c_varchar": "defaults",
                "c_timestamp": "2021-05-18 07:22:43 +00:00", "c_blob": NULL}
    b.transaction(insert(ALL_TYPES, [defaults]))
    b.transaction(delete(ALL_TYPES, [plain[1], defaults], image=MINIMAL))
    b.idle(9)
    b.transaction(delete(ALL_TYPES, [edges[4], plain[2]]))  # FULL again: before images with NULLs
    b.ddl("ALTER TABLE `all_types` ENGINE=InnoDB", schema="typedb", table="all_types", seconds=2)
    return b.finish()


def _large() -> list[pb.Entry]:
    """Entries bigger than the 4 KiB message limit, split across Envelopes, and a split rows event."""
    b = Binlog(BLOB_HOST, seed=303)
    b.ddl("CREATE DATABASE `media`", schema="media", session_db="")
    b.ddl(ATTACHMENTS.create_sql(), schema="media", table="attachments")
    b.ddl(THUMBNAILS.create_sql(), schema="media", table="thumbnails")
    small = [b.row(ATTACHMENTS) for _ in range(3)]
    b.transaction(insert(ATTACHMENTS, small))
    big = b.row(ATTACHMENTS, body=random.Random(7).randbytes(9000), caption="扫描件说明。" * 250)
    b.transaction(insert(ATTACHMENTS, [big]))
    b.idle(6)
    b.transaction(update(ATTACHMENTS, [(big, {**big, "caption": "short caption"})]))
    thumbs = [b.row(THUMBNAILS) for _ in range(90)]
    b.transaction(insert(THUMBNAILS, thumbs, pieces=3))
    b.idle(5)
    b.transaction(delete(ATTACHMENTS, [big]), delete(THUMBNAILS, thumbs[:2]))
    for row in small:
        b.transaction(update(ATTACHMENTS, [(row, {**row, "owner_id": 1})]))
    return b.finish()


def _mariadb() -> list[pb.Entry]:
    """A MariaDB source: domain-server-sequence GTIDs, JSON as longtext, '#' comment DDL."""
    b = Binlog(MARIADB_HOST, seed=404)
    b.ddl("CREATE DATABASE IF NOT EXISTS blog", schema="blog", session_db="")
    b.ddl(POSTS.create_sql(), schema="blog", table="posts")
    posts = [b.row(POSTS) for _ in range(4)]
    b.transaction(insert(POSTS, posts[:2]), thread=31)
    b.transaction(insert(POSTS, posts[2:]), thread=32)
    b.ddl("# deploy 2021-05-20\nALTER TABLE posts ADD INDEX idx_published (published)", schema="blog",
          table="posts")
    b.idle(12)
    b.transaction(update(POSTS, [(p, {**p, "views": p["views"] + 1}) for p in posts]), thread=31)
    b.transaction(delete(POSTS, [posts[3]]), thread=33)
    return b.finish()


def _realistic() -> list[pb.Entry]:
    """A subscription as DTS writes it (samples/README.md, `realistic`): the documented value shapes (`REAL_ORDERS`), a gbk
    table, zero dates, NULL both ways on the wire, header properties on every Entry."""
    b = Binlog(REAL_HOST, seed=505)
    b.ddl("CREATE DATABASE IF NOT EXISTS `mall` DEFAULT CHARACTER SET utf8mb4", schema="mall", session_db="")
    b.ddl(REAL_ORDERS.create_sql(), schema="mall", table="orders")
    b.ddl(REAL_SUPPLIERS.create_sql(), schema="mall", table="suppliers")
    suppliers = [b.row(REAL_SUPPLIERS) for _ in range(4)]
    b.transaction(insert(REAL_SUPPLIERS, suppliers), thread=812)
    orders = [b.row(REAL_ORDERS) for _ in range(8)]
    b.transaction(insert(REAL_ORDERS, orders[:5]), thread=812)
    b.transaction(insert(REAL_ORDERS, orders[5:]), thread=813)
    b.idle(7)
    shipped = [{**o, "shipped_on": "2021-05-21", "paid_at": "2021-05-21 09:30:00.250001", "note": NULL_ON_WIRE}
               for o in orders[:3]]
    b.transaction(update(REAL_ORDERS, list(zip(orders[:3], shipped))), thread=812)
    b.transaction(update(REAL_SUPPLIERS, [(suppliers[0], {**suppliers[0], "contact": "王总", "rating": "4.5"})]),
                  thread=814)
    b.transaction(delete(REAL_ORDERS, [orders[7]]), thread=813)
    b.idle(12)
    b.transaction(insert(REAL_ORDERS, [b.row(REAL_ORDERS) for _ in range(3)]), thread=815)
    return b.finish()


_STREAMS = {"mixed": _mixed, "types": _types, "large": _large, "mariadb": _mariadb, "realistic": _realistic}


class _Wire:
    """An Entry as `pack_entries` takes it, with the bytes the producer wrote (`wire_bytes`)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def SerializeToString(self) -> bytes:
        return self.raw


def build_sample_wire() -> dict[str, list[bytes]]:
    """Every sample stream by name as the bytes of each Entry the producer writes."""
    return {name: [wire_bytes(e) for e in build()] for name, build in _STREAMS.items()}


def build_sample_entries() -> dict[str, list[pb.Entry]]:
    """Every sample stream by name, built afresh (same content on every call).

    >>> [e.header.seqId for e in build_sample_entries()["types"][:3]]
    [1, 2, 3]
    """
    return {name: [pb.Entry.FromString(raw) for raw in raws] for name, raws in build_sample_wire().items()}


def write_samples(out_dir, *, max_message_bytes: int | None = None) -> list[pathlib.Path]:
    """Write `NAME.pb` (delimited Envelopes) and `NAME.dts.jsonl` for every stream; return the paths.

    `max_message_bytes` overrides the per-stream Kafka limits in STREAM_MESSAGE_BYTES.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     names = [p.name for p in write_samples(tmp)]
    >>> names[:2]
    ['large.pb', 'large.dts.jsonl']
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, raws in sorted(build_sample_wire().items()):
        limit = max_message_bytes or STREAM_MESSAGE_BYTES[name]
        pb_path, json_path = out / f"{name}.pb", out / f"{name}.dts.jsonl"
        with open(pb_path, "wb") as fh:
            write_pb(fh, pack_entries(map(_Wire, raws), limit))
        with open(json_path, "wb") as fh:
            write_dts_json(fh, (pb.Entry.FromString(raw) for raw in raws))
        written += [pb_path, json_path]
    return written


def stream_summary(name: str, entries: list[pb.Entry], raws: list[bytes] | None = None) -> str:
    """One Markdown table row describing a stream, as samples/README.md lists it (a test checks);
    `raws`: the Entries' bytes as written (`build_sample_wire`), when they are not protobuf's own.

    >>> stream_summary("types", build_sample_entries()["types"]).startswith("| types | MYSQL |")
    True
    """
    kinds = Counter(e.header.messageType for e in entries)
    rows = sum(len(e.event.dmlEvent.rows) for e in entries)
    raws = raws if raws is not None else [e.SerializeToString() for e in entries]
    envelopes = [env.SerializeToString() for env in pack_entries(map(_Wire, raws), STREAM_MESSAGE_BYTES[name])]
    reassembler, split = Reassembler(), []
    for offset, raw in enumerate(envelopes):
        for out in reassembler.feed(0, offset, raw):
            if isinstance(out, Assembled) and out.segments > 1:
                split.append(f"seqId {out.entries.items[0].header.seqId} ({out.segments})")
    counts = " | ".join(str(kinds[t]) for t in pb.MessageType.values())
    return (f"| {name} | {pb.SourceType.Name(entries[0].header.sourceType)} | {len(entries)} | {counts} | "
            f"{rows} | {len(envelopes)} | {', '.join(split) or '-'} |")
