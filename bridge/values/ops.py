"""DataHub words for DTS events: MessageType -> op, DMLType -> ops and the images they carry,
DDL statement -> op, SourceType -> dbType (docs/mapping.md, "Message kinds"), each one table.

>>> [i.op for i in DML_IMAGES[pb.UPDATE]], OP_IMAGES["DELETE"].image
(['UPDATE_BEFOR', 'UPDATE_AFTER'], 'before')
>>> ddl_op("/* x */ create   TABLE `t` (id int)")
'CREATE'
"""
from __future__ import annotations

import re
from typing import NamedTuple

from bridge.wire import subscribe_pb2 as pb

# None: the op depends on the event (DML, DDL); CHECKPOINT and ROLLBACK travel only in lossless mode.
OPS_BY_MESSAGE_TYPE: dict[int, str | None] = {
    pb.BEGIN: "TRANSACTION_BEGIN",
    pb.COMMIT: "TRANSACTION_END",
    pb.DML: None,
    pb.DDL: None,
    pb.ROLLBACK: "XAROLLBACK",
    pb.HEARTBEAT: "MHEARTBEAT",
    pb.CHECKPOINT: "GTID",
}
CONTROL_MESSAGE_TYPES = frozenset({pb.ROLLBACK, pb.CHECKPOINT})


class OpImage(NamedTuple):
    """One message (Blob) or row (Tuple) a DML row change gives: its op and the image it carries."""
    dml_type: int     # DMLType
    op: str           # Blob payload.op
    image: str        # "before" / "after": the Blob payload key, the half of an update
    field: str        # the RowChange field holding that image: "oldColumns" / "newColumns"
    tuple_op: str     # Tuple _operation_type_: I, U, D
    before_flag: str  # Tuple _before_image_: Y / N
    after_flag: str   # Tuple _after_image_: Y / N


_BEFORE, _AFTER = ("before", "oldColumns"), ("after", "newColumns")

# DMLType -> what each of its row changes gives, in order: the one op -> image table, which Blob
# encode and decode, Tuple encode and decode, the census and the C plan setup read (docs/mapping.md, "Envelope fields").
DML_IMAGES: dict[int, tuple[OpImage, ...]] = {
    pb.INSERT: (OpImage(pb.INSERT, "INSERT", *_AFTER, "I", "N", "Y"),),
    pb.UPDATE: (OpImage(pb.UPDATE, "UPDATE_BEFOR", *_BEFORE, "U", "Y", "N"),
                OpImage(pb.UPDATE, "UPDATE_AFTER", *_AFTER, "U", "N", "Y")),
    pb.DELETE: (OpImage(pb.DELETE, "DELETE", *_BEFORE, "D", "Y", "N"),),
}
DML_OPS: dict[int, tuple[str, ...]] = {t: tuple(i.op for i in images) for t, images in DML_IMAGES.items()}
# Blob op -> its OpImage; UPDATE (one message with both images, which readers accept) is not in it
OP_IMAGES: dict[str, OpImage] = {i.op: i for images in DML_IMAGES.values() for i in images}
# (_operation_type_, _before_image_, _after_image_) of a Tuple row -> its OpImage
TUPLE_OP_IMAGES: dict[tuple[str, str, str], OpImage] = {
    (i.tuple_op, i.before_flag, i.after_flag): i for images in DML_IMAGES.values() for i in images}

# Leading keywords (upper case, single spaces) -> op; the longest matching prefix wins.
DDL_OPS: dict[str, str] = {
    "CREATE TABLE": "CREATE",
    "CREATE TEMPORARY TABLE": "CREATE",
    "CREATE OR REPLACE TABLE": "CREATE",
    "CREATE OR REPLACE TEMPORARY TABLE": "CREATE",
    "ALTER TABLE": "ALTER",
    "ALTER ONLINE TABLE": "ALTER",
    "ALTER IGNORE TABLE": "ALTER",
    "DROP TABLE": "ERASE",
    "DROP TEMPORARY TABLE": "ERASE",
    "TRUNCATE": "TRUNCATE",
    "TRUNCATE TABLE": "TRUNCATE",
    "RENAME TABLE": "RENAME",
    "CREATE INDEX": "CINDEX",
    "CREATE UNIQUE INDEX": "CINDEX",
    "CREATE FULLTEXT INDEX": "CINDEX",
    "CREATE SPATIAL INDEX": "CINDEX",
    "CREATE ONLINE INDEX": "CINDEX",
    "CREATE OR REPLACE INDEX": "CINDEX",
    "CREATE OR REPLACE UNIQUE INDEX": "CINDEX",
    "CREATE OR REPLACE FULLTEXT INDEX": "CINDEX",
    "CREATE OR REPLACE SPATIAL INDEX": "CINDEX",
    "DROP INDEX": "DINDEX",
    "DROP ONLINE INDEX": "DINDEX",
}
DDL_DEFAULT_OP = "QUERY"
DDL_OP_NAMES = frozenset(DDL_OPS.values()) | {DDL_DEFAULT_OP}

SOURCE_TYPES: dict[int, str] = {
    pb.ORACLE: "Oracle",
    pb.MYSQL: "MySQL",
    pb.PGSQL: "PostgreSQL",
    pb.MARIADB: "MariaDB",
}
SOURCE_TYPES_BY_NAME = {v.lower(): k for k, v in SOURCE_TYPES.items()}

_COMMENTS = re.compile(r"\s+|/\*(?!!).*?\*/|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$)", re.S)
_EXEC_COMMENT = re.compile(r"/\*!\d*\s*")
_WORD = re.compile(r"[A-Za-z_]+")
_DDL_PREFIX_WORDS = max(len(k.split()) for k in DDL_OPS)


def ddl_op(sql: str) -> str:
    """The op of a DDL statement from its leading keywords, after comments and whitespace.

    MySQL's executable comments (`/*!40101 ALTER TABLE ... */`) count as the statement they hold.
    """
    pos, n = 0, len(sql)
    while pos < n:
        m = _COMMENTS.match(sql, pos)
        if m and m.end() > pos:
            pos = m.end()
            continue
        m = _EXEC_COMMENT.match(sql, pos)
        if m:
            pos = m.end()
            continue
        break
    words = []
    while pos < n and len(words) < _DDL_PREFIX_WORDS:
        m = _WORD.match(sql, pos)
        if not m:
            break
        words.append(m.group().upper())
        pos = m.end()
        while pos < n:
            c = _COMMENTS.match(sql, pos)
            if not c or c.end() == pos:
                break
            pos = c.end()
    for size in range(len(words), 0, -1):
        op = DDL_OPS.get(" ".join(words[:size]))
        if op:
            return op
    return DDL_DEFAULT_OP
