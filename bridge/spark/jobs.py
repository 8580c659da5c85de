"""The per-partition side of the Spark transforms (bridge.spark is the DataFrame face), one module
per direction:

- bridge/spark/to_datahub.py: DTS -> DataHub rows (`_FromDts`, `_DtsToBlob`, `_DtsToTuple`,
  `_ColumnSets`): Kafka records in offset order, reassembled, converted to Blob or Tuple rows;
- bridge/spark/to_dts.py: DataHub rows -> DTS (`_ToDts`, `_BlobToDts`, `_TupleToDts`): Blob lines or
  Tuple rows rebuilt into Entries and packed into Envelopes;
- bridge/spark/jobs_base.py: what both share (schemas, modes, the tally, the job base class, the
  Arrow and pandas adapters).

This module names them all, so `from bridge.spark.jobs import ...` keeps working for the face, the
streaming and table modules and the tests.
"""
from __future__ import annotations

from bridge.spark.jobs_base import (
    _OUT_ROWS,
    BLOB_COLUMNS,
    BLOB_SCHEMA,
    DEFAULT_DECIMAL,
    DTS_COLUMNS,
    DTS_SCHEMA,
    ERROR_COLUMN,
    KAFKA_COLUMNS,
    KAFKA_SCHEMA,
    KEYS,
    MODES,
    POSITION_COLUMNS,
    SparkTally,
    _arrow_column,
    _arrow_type,
    _batch_function,
    _ddl,
    _Job,
    _pack_columns,
    _pandas_column,
    _policy_name,
    _RowPolicy,
    _TallyParam,
    _unpack_columns,
    _utf8_array,
    _with_error,
)
from bridge.spark.to_datahub import (
    _ColumnSets,
    _DtsToBlob,
    _DtsToTuple,
    _fit_decimal,
    _FromDts,
    _op_names,
    _sink_batch,
    _spark_type,
    _tuple_fields,
    _tuple_output,
)
from bridge.spark.to_dts import FROM_SPARK, _BlobToDts, _ToDts, _TupleToDts, _where, _whole

__all__ = [
    "_OUT_ROWS", "BLOB_COLUMNS", "BLOB_SCHEMA", "DEFAULT_DECIMAL", "DTS_COLUMNS", "DTS_SCHEMA", "ERROR_COLUMN",
    "KAFKA_COLUMNS", "KAFKA_SCHEMA", "KEYS", "MODES", "POSITION_COLUMNS", "SparkTally", "_arrow_column",
    "_arrow_type", "_batch_function", "_ddl", "_Job", "_pack_columns", "_pandas_column", "_policy_name",
    "_RowPolicy", "_TallyParam", "_unpack_columns", "_utf8_array", "_with_error",
    "_ColumnSets", "_DtsToBlob", "_DtsToTuple", "_fit_decimal", "_FromDts", "_op_names", "_sink_batch",
    "_spark_type", "_tuple_fields", "_tuple_output",
    "FROM_SPARK", "_BlobToDts", "_TupleToDts", "_ToDts", "_where", "_whole",
]
