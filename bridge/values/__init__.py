"""The value layer: every mapping table of the bridge, and the per-value converters built from them.

One module per job:
- `bridge/values/types.py`: one row per MySQL type family (its DTS DataType, Blob type and codec,
  Tuple field type and converters, Spark type, C kind). "Where is DATETIME mapped?": there.
  `columns.py`, below the converters: the shapes the table is made of (`ColumnType`, `TypeRow`,
  `NativeKind`) and the registry of rows.
- `bridge/values/codecs.py`: the Blob value codecs the rows name; `tuples.py`: the Tuple value
  converters they name; `temporal.py`: date/time text <-> epoch time; `charsets.py`: MySQL
  charset -> Python codec (`CHARSETS`).
- `bridge/values/ops.py`: MessageType -> op (`OPS_BY_MESSAGE_TYPE`), DMLType -> ops and images
  (`DML_IMAGES`), DDL keywords -> op (`DDL_OPS`), SourceType -> dbType (`SOURCE_TYPES`).
- `bridge/values/events.py`: what Blob and Tuple share about an event (sequence ids, the DML
  event checks, the Event field of each MessageType) and the `Decoder` protocol both decoders keep.

Every name the faces use is importable from `bridge.values` itself.

>>> t = parse_column_type("bigint(20) unsigned")
>>> (t.family, t.unsigned, t.kind, blob_type(t))
('bigint', True, 'integer', 'STRING')
>>> ddl_op("/* x */ create   TABLE `t` (id int)")
'CREATE'
"""
from __future__ import annotations

from bridge.values.charsets import CHARSETS, DEFAULT_CHARSET, MYSQL_LATIN1, charset_codec
from bridge.values.codecs import (
    BYTES,
    DECIMAL_DT,
    DECIMAL_TEXT,
    DT,
    FLOAT_TEXT,
    INT_TEXT,
    NA,
    NIL,
    STRING,
    SUBSTITUTION_NOTES,
    SUBSTITUTIONS,
    Codec,
    ColumnSetCache,
    Inexact,
    Substituted,
    data_to_raw,
    discard_substitutions,
    note_substitution,
    raw_to_data,
)
from bridge.values.events import (
    EVENT_FIELDS,
    RESERVED_PREFIX,
    ROW_DIGITS,
    Decoder,
    check_dml_event,
    check_row_images,
    digits,
    entry_group,
    seq_id_of,
    sequence_id,
    signed_digits,
)
from bridge.values.ops import (
    CONTROL_MESSAGE_TYPES,
    DDL_DEFAULT_OP,
    DDL_OP_NAMES,
    DDL_OPS,
    DML_IMAGES,
    DML_OPS,
    OP_IMAGES,
    OPS_BY_MESSAGE_TYPE,
    SOURCE_TYPES,
    SOURCE_TYPES_BY_NAME,
    TUPLE_OP_IMAGES,
    OpImage,
    ddl_op,
)
from bridge.values.temporal import (
    TEMPORAL_KINDS,
    InvalidDate,
    format_temporal,
    parse_temporal,
    temporal_as_text,
    utc_micros,
)
from bridge.values.tuples import BINARY_TEXT, TIMESTAMP_RANGE, decimal_text, float32
from bridge.values.types import (
    BLOB_TYPES,
    BOOLEAN_PROPERTY,
    CODECS,
    FAMILIES,
    FOREIGN_COLUMN_TYPES,
    FROM_TUPLE,
    INT_TUPLE_TYPES,
    INT_WIDTHS,
    KIND_DATATYPES,
    SPARK_TYPES,
    TO_TUPLE,
    TUPLE_TYPES,
    TYPES,
    ColumnType,
    NativeKind,
    TypeRow,
    blob_type,
    codec_for,
    column_is_boolean,
    native_kind,
    native_of,
    parse_column_type,
    spark_type,
    tuple_type,
    type_row,
)

__all__ = [
    "CHARSETS", "DEFAULT_CHARSET", "MYSQL_LATIN1", "charset_codec",
    "BYTES", "DECIMAL_DT", "DECIMAL_TEXT", "DT", "FLOAT_TEXT", "INT_TEXT", "NA", "NIL", "STRING",
    "SUBSTITUTION_NOTES", "SUBSTITUTIONS", "Codec", "ColumnSetCache", "Inexact", "Substituted", "data_to_raw",
    "discard_substitutions", "note_substitution", "raw_to_data",
    "EVENT_FIELDS", "RESERVED_PREFIX", "ROW_DIGITS", "Decoder", "check_dml_event", "check_row_images", "sequence_id",
    "seq_id_of", "entry_group", "digits", "signed_digits",
    "CONTROL_MESSAGE_TYPES", "DDL_DEFAULT_OP", "DDL_OP_NAMES", "DDL_OPS", "DML_IMAGES", "DML_OPS", "OP_IMAGES",
    "OPS_BY_MESSAGE_TYPE", "SOURCE_TYPES", "SOURCE_TYPES_BY_NAME", "TUPLE_OP_IMAGES", "OpImage", "ddl_op",
    "TEMPORAL_KINDS", "InvalidDate", "format_temporal", "parse_temporal", "temporal_as_text", "utc_micros",
    "BINARY_TEXT", "TIMESTAMP_RANGE", "decimal_text", "float32",
    "BLOB_TYPES", "BOOLEAN_PROPERTY", "CODECS", "FAMILIES", "FOREIGN_COLUMN_TYPES", "FROM_TUPLE",
    "INT_TUPLE_TYPES", "INT_WIDTHS", "KIND_DATATYPES", "SPARK_TYPES", "TO_TUPLE", "TUPLE_TYPES", "TYPES",
    "ColumnType", "NativeKind", "TypeRow", "blob_type", "codec_for", "column_is_boolean", "native_kind", "native_of",
    "parse_column_type",
    "spark_type", "tuple_type", "type_row",
]
