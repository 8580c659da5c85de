"""DTS -> DataHub rows: the per-partition jobs of `dts_to_blob`, `dts_to_tuple` and
`table_columns` (bridge.spark is the DataFrame face; bridge/spark/jobs_base.py the shared parts).

Kafka records in offset order -> Envelope reassembly per topic -> per Entry, the rows of the Blob
or Tuple conversion in columns (plain DML Entries through the C sink, a whole Entries at a time). The
streaming transforms (bridge/spark/streaming.py) run the same jobs with their reassembly kept in
Spark state.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from decimal import Context, Decimal, InvalidOperation
from operator import itemgetter
from typing import Any

from bridge.blob.encode import FORMAT_VERSION, BlobEncoder
from bridge.errors import BridgeError, ConversionError, OptionsError, TupleFormatError
from bridge.native import speedups
from bridge.native.contract import (
    STRING_KINDS,
    DmlType,
    Kind,
    Out,
    SinkTaken,
    TupleSinkField,
    TupleSinkTable,
    TupleSinkTaken,
    TupleStorage,
    TupleWriter,
)
from bridge.options import Options
from bridge.spark.jobs_base import (
    _OUT_ROWS,
    BLOB_COLUMNS,
    DEFAULT_DECIMAL,
    POSITION_COLUMNS,
    _Job,
    _with_error,
)
from bridge.stream import (
    assembled_entries,
    dts_records_to_assembled,
    entries_to_outputs,
)
from bridge.values import OP_IMAGES, SPARK_TYPES, column_is_boolean, parse_column_type, spark_type, tuple_type
from bridge.values.types import arrow_type as _arrow_type  # Spark type -> Arrow type, the one map's
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Reassembler


class _FromDts(_Job):
    """Kafka records (topic, partition, offset, value) in offset order -> per Entry, rows of
    `convert(entry)` after the positions, written in columns."""

    raw = False  # True: `convert_columns(entry, entry_bytes)` where the bytes are known (the C fast path)

    def __init__(self, mode: str, value_columns) -> None:
        super().__init__(mode, POSITION_COLUMNS + tuple(value_columns))
        self.nvalues = len(value_columns)
        self.width = len(self.columns)  # positions, values (and error): what `chunks` gives
        self.reassemblers: dict[Any, Reassembler] = {}
        self.lazy = False  # how `_topics` builds its Reassemblers (True where `chunks` reads raw Entry bytes)
        # None: the end of the input ends every Entries (a batch job); a streaming job's
        # `settle(topic, reassembler, policy)` keeps what is open for the next micro-batch instead
        self.streaming = None
        self._out: list[list] = []

    def convert(self, entry: pb.Entry) -> list[tuple]:
        raise NotImplementedError

    def convert_columns(self, entry: pb.Entry, raw: bytes | None = None) -> tuple[int, Any]:
        """(number of rows, a sequence of their values per value column) of one Entry: by default
        `convert`'s rows."""
        rows = self.convert(entry)
        return len(rows), (list(zip(*rows)) if rows else [()] * self.nvalues)

    def inputs(self, names):
        missing = [n for n in ("partition", "offset", "value") if n not in names]
        if missing:
            raise OptionsError(f"a DTS DataFrame needs the Kafka columns {', '.join(missing)}")
        # Spark's kafka source gives `headers` with includeHeaders=true: TDSQL's ShardId and ps
        return ["topic" if "topic" in names else None, "partition", "offset", "value"] + \
            (["headers"] if "headers" in names else [])

    def chunks(self, records):
        self._reset()
        for topic, items in self._topics(records):
            yield from self._chunks(topic, assembled_entries(items, self.policy, raw=self.raw))
        if self._held_rows():
            yield self._take()

    # How the output is held until a chunk is full: as columns here (`_out`), extended per Entry.
    def _reset(self) -> None:
        self._out = [[] for _ in range(self.width)]

    def _held_rows(self) -> int:
        return len(self._out[0])

    def _take(self) -> list:
        out = self._out
        self._reset()
        return out

    def _outputs(self):
        """The function of an Entry (and its bytes) -> (number of rows, what `_add_rows` holds)."""
        return self.convert_columns

    def _topics(self, records) -> Iterator[tuple]:
        """(topic, its complete Entries) per run of one topic's records, reassembled per topic
        across runs; at the end each topic again: its unfinished Entries reported (batch), or
        settled by `streaming` (kept for the next micro-batch, or dead-lettered past its limits)."""
        for topic, run in itertools.groupby(records, key=itemgetter(0)):
            reassembler = self.reassemblers.get(topic)
            if reassembler is None:
                reassembler = self.reassemblers[topic] = Reassembler(lazy=self.lazy)
            yield topic, dts_records_to_assembled((r[1:] for r in run), self.policy, reassembler, finish=False)
        for topic, reassembler in self.reassemblers.items():
            if self.streaming is not None:
                yield topic, self.streaming.settle(topic, reassembler, self.policy)
            else:
                yield topic, dts_records_to_assembled((), self.policy, reassembler)

    def _chunks(self, topic, entries) -> Iterator[list]:
        try:
            for where, found in entries_to_outputs(entries, self._outputs(), self.policy, size=itemgetter(0)):
                self._add(topic, where, found)
                if self._held_rows() >= _OUT_ROWS:
                    yield self._take()
            self._error_rows(topic)
        except BridgeError as err:
            raise err.located(topic=topic)

    def _add(self, topic, where: dict, found) -> None:
        """One Entry's rows (or its error row) into the output columns, a column at a time (the
        per-Entry lists die at once: held until the chunk is written, they would fill the
        collector's oldest generation and make every full collection slower)."""
        errors = self.policy.errors
        current = errors.pop() if found is None else None  # this Entry's own error
        if errors:
            self._error_rows(topic)
        if current is not None:
            self._error_row(topic, current, where.get("entry"))
        elif found[0]:
            self._add_rows(topic, where, *found)

    def _add_rows(self, topic, where: dict, n: int, values) -> None:
        """One Entry's `n` rows, `values` a sequence of values per value column."""
        out = self._out
        for column, value in zip(out, (topic, where["partition"], where["offset"], where["entry"])):
            column.extend([value] * n)
        out[4].extend(range(n))
        for column, value in zip(out[5:], values):
            column.extend(value)
        if self.keep:
            out[-1].extend([None] * n)

    def _error_rows(self, topic) -> None:
        while self.policy.errors:
            self._error_row(topic, self.policy.errors.pop(0), None)

    def _error_row(self, topic, err: BridgeError, entry) -> None:
        err.located(topic=topic)
        where = err.where
        row = ((topic, where.get("partition"), where.get("offset"), entry, None)
               + (None,) * self.nvalues + (str(err),))
        for column, value in zip(self._out, row):
            column.append(value)


class _Sunk(_FromDts):
    """A job whose plain DML Entries a C sink writes as Arrow buffers, a whole Entries at a time; every
    other Entry, and the first of each table, through `_outputs()` (and its table then registered for
    the sink). Both give the same rows: the sink leaves to Python every Entry it is not sure of."""

    raw = True  # the Entries' bytes: the sink's input, and the encoders' C paths'
    use_sink = True  # the C sink when the extension is there (tests turn it off to compare)

    def __init__(self, mode: str, value_columns) -> None:
        super().__init__(mode, value_columns)
        self.sink: Any = None  # set by the subclass when it has one; then `lazy` too
        self.tables: dict[bytes, Any] = {}  # the sink's table key -> its record
        self._pieces: list = []  # output batches not yet given, in order
        self._pieces_rows = 0  # their rows
        self.sunk = 0  # Entries the sink wrote

    def _sink_entries(self, raws: list, index: int, partition: int, offset: int) -> tuple[int, int, int]:
        """The sink's `entries(...)` from raws[index]: (next, Entries that gave rows, rows)."""
        raise NotImplementedError

    def _counted(self, entries: int, rows: int) -> None:
        """The encoder's counts of what the sink wrote."""
        self.encoder.entries += entries
        self.encoder.emitted += rows

    def _sink_batch(self, topic):
        """An output batch of the sink's rows (`take()`)."""
        raise NotImplementedError

    def _record(self, entry: pb.Entry, raw: bytes):
        """The sink's record of the Entry's table, or None where C cannot take it."""
        raise NotImplementedError

    def _register(self, entry: pb.Entry, raw: bytes) -> None:
        """After `_outputs()` took an Entry, its table's record for the sink, once per table key: a
        None too, which the sink reads as "leave this table's Entries to Python", so a table C cannot
        take is not looked at again for each of its Entries."""
        key = speedups.table_key(raw)
        if key is None or key in self.tables:
            return
        if len(self.tables) >= 4096:
            self.tables.clear()
        self.tables[key] = self._record(entry, raw)

    def chunks(self, records):
        if self.sink is None:
            yield from super().chunks(records)
            return
        import pyarrow as pa
        self._schema = pa.schema([(name, _arrow_type(kind)) for name, kind in self.columns])
        self._reset()
        for topic, items in self._topics(records):
            yield from self._assembled(topic, items)
        self._hold_rows()
        yield from self._give()

    def _assembled(self, topic, items) -> Iterator:
        tally, sink = self.policy.tally, self.sink
        outputs = self._outputs()
        try:
            for item in items:
                if self.policy.errors:  # framing errors before this Entries
                    self._hold_sink(topic)
                    self._error_rows(topic)
                entries, raws = item.entries.items, item.raws
                partition, offset = item.partition, item.first_offset
                n = len(entries)
                plain = raws is not None and type(partition) is int and type(offset) is int
                index = 0
                while index < n:
                    if plain:
                        self._hold_rows()
                        start = index
                        index, converted, rows = self._sink_entries(raws, index, partition, offset)
                        tally.input += index - start
                        tally.converted += converted
                        tally.not_emitted += index - start - converted
                        tally.outputs += rows
                        self._counted(converted, rows)
                        self.sunk += index - start
                        if index >= n:
                            break
                    raw = raws[index] if raws is not None else None
                    self._hold_sink(topic)
                    tally.input += 1
                    where = {"partition": partition, "offset": offset, "entry": index}
                    convert = self._convert_and_register if plain else outputs
                    for at, found in entries_to_outputs([(where, entries[index], raw)], convert, self.policy,
                                                        size=itemgetter(0)):
                        self._add(topic, at, found)
                    index += 1
                if self._pieces_rows + sink.rows() + self._held_rows() >= _OUT_ROWS:
                    self._hold_sink(topic)
                    self._hold_rows()
                    yield from self._give()
            self._hold_sink(topic)
            self._error_rows(topic)
        except BridgeError as err:
            raise err.located(topic=topic)

    def _convert_and_register(self, entry: pb.Entry, raw: bytes) -> tuple[int, Any]:
        """`_outputs()`, then the Entry's table registered for the sink: one step under the error
        policy, so an Entry the policy rejects registers nothing, and a table the sink cannot be
        told of rejects its Entry instead of ending the task."""
        found = self._outputs()(entry, raw)
        try:
            self._register(entry, raw)
        except BridgeError as err:
            h = entry.header
            named = h.schemaName or h.tableName
            raise err.located(seq_id=h.seqId, table=f"{h.schemaName}.{h.tableName}" if named else None)
        return found

    def _hold_sink(self, topic) -> None:
        """The sink's rows become the next output batch (the rows before them are held already)."""
        if self.sink.rows():
            self._hold(self._sink_batch(topic))

    def _hold_rows(self) -> None:
        """The rows Python converted become the next output batch (the sink's rows are held already)."""
        if self._held_rows():
            self._hold(self.batch(self._take(), self._schema))

    def _hold(self, batch) -> None:
        self._pieces.append(batch)
        self._pieces_rows += batch.num_rows

    def _give(self) -> Iterator:
        """The held rows in batches of at most _OUT_ROWS."""
        import pyarrow as pa
        pieces, self._pieces, self._pieces_rows = self._pieces, [], 0
        if len(pieces) > 1:
            pieces = pa.Table.from_batches(pieces, schema=self._schema).combine_chunks().to_batches()
        for batch in pieces:
            for start in range(0, batch.num_rows, _OUT_ROWS):
                yield batch.slice(start, _OUT_ROWS)


class _DtsToBlob(_Sunk):
    """Plain DML Entries (`BlobEncoder.sink_table`) go through `_speedups.Sink`, which writes their
    output columns as Arrow buffers in C, a whole Entries at a time; every other Entry, and the first
    of each table, through `convert_columns`. Both give the same rows (tests/test_spark_sink.py)."""

    utf8_bytes = frozenset({"blob"})

    def __init__(self, options: Options, mode: str) -> None:
        super().__init__(mode, BLOB_COLUMNS[len(POSITION_COLUMNS):])
        self.encoder = BlobEncoder(options)
        self.options = options
        self.sink = speedups.Sink() if speedups is not None and self.use_sink and not options.system_time else None
        self.lazy = self.sink is not None  # the sink reads each Entry's bytes, parsed only when it cannot

    def convert_columns(self, entry, raw=None):
        seqs, ops, dbs, tables, shards, times, lines = self.encoder.convert_columns(entry, raw)
        return len(lines), (seqs, ops, dbs, tables, shards, [t * 1000 for t in times], lines)

    def _sink_entries(self, raws, index, partition, offset):
        return self.sink.entries(raws, index, self.tables, partition, offset, self.options.lossless, _VERSION)

    def _sink_batch(self, topic):
        return _sink_batch(self.sink.take(), topic, self._schema, self.keep)

    def _record(self, entry: pb.Entry, raw: bytes):
        return self.encoder.sink_table(entry, raw)


_VERSION = FORMAT_VERSION.encode()


def _sink_batch(taken: tuple, topic, schema, keep: bool):
    """An output batch of `_speedups.Sink.take()`'s buffers (contract.SinkTaken). Its lines are UTF-8
    by construction (the C writer checks every string it copies, and the templates are orjson's), so no
    check here."""
    import pyarrow as pa
    t = SinkTaken(*taken)
    rows = t.rows
    strings = {"blob": (t.blob_offsets, t.blob), "shard_key": (t.shard_key_offsets, t.shard_key),
               "sequence_id": (t.sequence_id_offsets, t.sequence_id), "db": (t.db_offsets, t.db),
               "table": (t.table_offsets, t.table)}
    fixed = {"entry": (pa.int32(), t.entry), "row": (pa.int32(), t.row), "partition": (pa.int32(), t.partition),
             "offset": (pa.int64(), t.offset), "event_time": (schema.field("event_time").type, t.event_time)}
    arrays = {name: pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(data)]) for name, (kind, data) in fixed.items()}
    arrays.update((name, pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]))
                  for name, (offsets, data) in strings.items())
    arrays["op"] = _op_names().take(pa.Array.from_buffers(pa.uint8(), rows, [None, pa.py_buffer(t.op)]))
    arrays["topic"] = pa.nulls(rows, pa.string()) if topic is None else pa.repeat(pa.scalar(topic, pa.string()), rows)
    if keep:
        arrays["error"] = pa.nulls(rows, pa.string())
    return pa.RecordBatch.from_arrays([arrays[f.name] for f in schema], schema=schema)


def _op_names():
    """The ops by the C Sink's op codes (its op column indexes this array): values.OP_IMAGES, in that order."""
    import pyarrow as pa
    return pa.array(list(OP_IMAGES), pa.string())


def _spark_type(field_type: str, column: pb.Column | None) -> str:
    """The Spark type of a Tuple field: its DTS column's row's, when the column is known and its
    row gives this field type; else by the field type (DECIMAL: DEFAULT_DECIMAL without a column,
    a 64-bit unsigned integer's decimal(20,0) with one of another type)."""
    if column is not None:
        ct = parse_column_type(column.originalType, column_is_boolean(column))
        if tuple_type(ct) == field_type:
            return spark_type(ct)
    if field_type == "DECIMAL":
        return "decimal(%d,%d)" % (DEFAULT_DECIMAL if column is None else (20, 0))
    return SPARK_TYPES[field_type]


def _tuple_fields(schema, columns=None) -> list[tuple[str, str, str]]:
    """(name, field type, Spark type) of every RecordSchema field."""
    from bridge.tuple import load_record_schema
    by_name = {c.name: c for c in columns or ()}
    out = []
    for f in load_record_schema(schema)["fields"]:
        out.append((f["name"], f["type"], _spark_type(f["type"], by_name.get(f["name"]))))
    return out


def _tuple_output(fields, mode: str, positions: bool) -> tuple:
    columns = (POSITION_COLUMNS if positions else ()) + tuple((name, kind) for name, _, kind in fields)
    names = [name for name, _ in _with_error(columns, mode)]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise OptionsError("Tuple fields clash with the output's own columns (positions, error)", value=clash)
    return columns


_DEC_CONTEXT = Context(prec=100)


def _fit_decimal(v: Decimal, precision: int, scale: int) -> Decimal:
    sign, digits, exponent = v.as_tuple()
    if exponent == -scale and len(digits) <= precision:
        return v  # already at the scale, and fits: what quantize would give back
    try:
        q = v.quantize(Decimal(1).scaleb(-scale), context=_DEC_CONTEXT)
    except InvalidOperation:
        q = None
    if q is None or q != v or len(q.as_tuple().digits) > precision and q != 0:
        raise ConversionError(f"DECIMAL value does not fit Spark's decimal({precision},{scale})", value=v)
    return q


def _plain_test(ftype: str, kind: str, v: str, scope: dict) -> str | None:
    """Python source testing a value (named `v`) under which its field's check in `_DtsToTuple`
    (FIELD_CHECKS, then `_fit_decimal` for a Spark decimal) returns the value itself, unchanged;
    None where no such test is given (FLOAT's check rounds). What the test passes is sure; what it
    does not is left to the check, which decides (and names the error)."""
    from bridge.tuple.encode import INT_RANGES
    decimal = kind.startswith("decimal(")
    if ftype in INT_RANGES and not decimal:
        lo, hi = INT_RANGES[ftype]
        return f"type({v}) is int and {lo} <= {v} <= {hi}"  # not a bool: type(True) is bool
    if ftype == "DOUBLE" and not decimal:
        return f"type({v}) is float and {v} - {v} == 0.0"  # finite: inf - inf and nan - nan are nan
    if ftype == "BOOLEAN" and not decimal:
        return f"({v} is True or {v} is False)"
    if ftype == "STRING" and not decimal:
        return f"type({v}) is str"
    if ftype == "DECIMAL" and decimal:
        # `_fit_decimal`'s first case without building `as_tuple`: the exponent of 1E-scale (which
        # no inf or nan has), and at that exponent the digits are the adjusted exponent + scale + 1
        # (zero's one digit too), at most the precision
        precision, scale = map(int, kind[len("decimal("):-1].split(","))
        scope.setdefault(f"quantum{scale}", Decimal(1).scaleb(-scale))
        return (f"type({v}) is Decimal and quantum{scale}.same_quantum({v}) "
                f"and {v}.adjusted() <= {precision - scale - 1}")
    if ftype == "DECIMAL":
        return f"type({v}) is Decimal and {v}.is_finite()"
    return None


def _compile_sure(fields) -> Callable[[list], list | None]:
    """`sure(rows) -> [tuple of values per row] or None` for (name, field type, Spark type) fields:
    each row's values in field order when the row holds every field and no other key and each
    value is None or passes `_plain_test` (so `_DtsToTuple._values` would give that very tuple),
    else None (the rows go to `_values`). A FLOAT field's values go through FIELD_CHECKS here; one
    that raises also gives None."""
    from bridge.tuple import FIELD_CHECKS
    names = [name for name, _, _ in fields]
    scope: dict = {"Decimal": Decimal, "getter": itemgetter(*names) if len(names) > 1 else None,
                   "float_check": FIELD_CHECKS["FLOAT"]}
    n = len(fields)
    if not n:
        return lambda rows: None
    tests, rounded = [], []
    for i, (_, ftype, kind) in enumerate(fields):
        test = _plain_test(ftype, kind, f"v{i}", scope)
        if test is None:
            if ftype != "FLOAT" or kind.startswith("decimal("):
                return lambda rows: None
            rounded.append(i)
        else:
            tests.append(f"(v{i} is None or {test})")
    values = ", ".join(f"v{i}" for i in range(n))
    lines = ["def sure(rows):", "    out = []", "    append = out.append", "    for row in rows:",
             f"        if len(row) != {n}: return None",
             "        try:",
             "            t = getter(row)" if n > 1 else f"            t = (row[{names[0]!r}],)",
             "        except KeyError:",
             "            return None",
             f"        {values}, = t"]
    if tests:
        lines.append("        if not (" + " and ".join(tests) + "): return None")
    if rounded:
        lines += ["        try:"]
        lines += [f"            if v{i} is not None: v{i} = float_check(v{i})" for i in rounded]
        lines += ["        except Exception:  # the check one row at a time raises it, naming the field",
                  "            return None",
                  f"        t = ({values},)"]
    lines += ["        append(t)", "    return out"]
    exec(compile("\n".join(lines), f"<Spark Tuple values of {n} fields>", "exec"), scope)  # noqa: S102
    return scope["sure"]


# Spark type -> how `TupleSink` stores its column (the Arrow layout of `_arrow_type`); a decimal(p,s)
# (p <= 38) is DECIMAL128. A field of any other type keeps the job off the sink.
_STORAGES = {"boolean": TupleStorage.BOOL, "tinyint": TupleStorage.INT8, "smallint": TupleStorage.INT16,
             "int": TupleStorage.INT32, "bigint": TupleStorage.INT64, "timestamp": TupleStorage.INT64,
             "float": TupleStorage.FLOAT32, "double": TupleStorage.FLOAT64, "string": TupleStorage.STRING}

# integer storage -> the integers it holds
_STORED_INTS = {TupleStorage.INT8: (-(1 << 7), (1 << 7) - 1), TupleStorage.INT16: (-(1 << 15), (1 << 15) - 1),
                TupleStorage.INT32: (-(1 << 31), (1 << 31) - 1), TupleStorage.INT64: (-(1 << 63), (1 << 63) - 1)}


def _storage(kind: str) -> int | None:
    if kind.startswith("decimal("):
        return TupleStorage.DECIMAL128 if int(kind[len("decimal("):-1].split(",")[0]) <= 38 else None
    return _STORAGES.get(kind)


def _column_writer(ftype: str, kind: str, storage: int, index: int, column) -> TupleSinkField | None:
    """How `TupleSink` writes a field's values read from Plan column `index` (a PlanColumn), or None
    where it has no writer that gives what the field's check gives: each writer takes only the value
    the check returns unchanged (an int of the field's range, a finite double, a bool, a str, a
    decimal `_fit_decimal` lets through, a float32 as FLOAT's check rounds it), else C gives the
    Entry back (tuple_sink.c)."""
    from bridge.tuple.encode import INT_RANGES
    k, out = column.kind, column.out
    if ftype in INT_RANGES and ftype != "TIMESTAMP" and k == Kind.LONG and out == Out.SAME and storage in _STORED_INTS:
        (lo, hi), (slo, shi) = INT_RANGES[ftype], _STORED_INTS[storage]
        return TupleSinkField(TupleWriter.INT, index, max(lo, slo), min(hi, shi), None)
    if ftype == "TIMESTAMP" and out == Out.MICROS and kind == "timestamp":
        return TupleSinkField(TupleWriter.MICROS, index, *INT_RANGES["TIMESTAMP"], None)
    if ftype == "DOUBLE" and k == Kind.DOUBLE and out == Out.SAME and kind == "double":
        return TupleSinkField(TupleWriter.DOUBLE, index, 0, 0, None)
    if ftype == "FLOAT" and k == Kind.DOUBLE and out == Out.FLOAT32 and kind == "float":
        return TupleSinkField(TupleWriter.FLOAT32, index, 0, 0, None)
    if ftype == "BOOLEAN" and k == Kind.BOOL and out == Out.SAME and kind == "boolean":
        return TupleSinkField(TupleWriter.BOOL, index, 0, 0, None)
    if ftype == "DECIMAL" and out == Out.DECIMAL and storage == TupleStorage.DECIMAL128:
        precision, scale = map(int, kind[len("decimal("):-1].split(","))
        return TupleSinkField(TupleWriter.DECIMAL, index, precision, scale, None)
    if (ftype == "STRING" and k in STRING_KINDS and out in (Out.SAME, Out.HEX)
            and kind == "string"):
        return TupleSinkField(TupleWriter.STRING, index, 0, 0, None)
    return None


def _meta_writer(name: str, storage: int, header: pb.Header) -> TupleSinkField | None:
    """How `TupleSink` writes a meta column TupleEncoder gives every row: `_sequence_id_` and
    `_execute_time_` from the Entry's header, any other by its extractor per DML type and image."""
    from bridge.tuple.encode import META_COLUMNS, ROW_IMAGES, RowMeta
    if name == "_sequence_id_":
        return TupleSinkField(TupleWriter.SEQ, -1, 0, 0, None) if storage == TupleStorage.STRING else None
    if name == "_execute_time_":
        return TupleSinkField(TupleWriter.TIME, -1, 0, 0, None) if storage == TupleStorage.INT64 else None
    extract = META_COLUMNS[name][1]
    source = f"{header.schemaName}.{header.tableName}"
    # per DmlType, its images in the order C walks them (before, then after)
    texts = tuple(tuple(extract(RowMeta("", op, 0, before, after, source)) for op, before, after, _ in ROW_IMAGES[t])
                  for t in DmlType)
    if storage != TupleStorage.STRING or not all(type(x) is str for images in texts for x in images):
        return None
    assert [image for *_, image in ROW_IMAGES[DmlType.UPDATE]] == ["old", "new"]
    return TupleSinkField(TupleWriter.IMAGE_TEXT, -1, 0, 0,
                          tuple(tuple(x.encode() for x in images) for images in texts))


class _DtsToTuple(_Sunk):
    """One table's Tuple rows (TupleEncoder), each value checked against its field (FIELD_CHECKS,
    and a Spark decimal's precision and scale: `_values`). Plain DML Entries of the table whose every
    value C is sure of go through `_speedups.TupleSink`, which writes their output columns as Arrow
    buffers (tuple_sink.c); another table's plain DML Entries give no rows there either. Every other
    Entry, and the first of each column set, goes through `convert`: an Entry's rows whose every
    value a compiled test is sure of (`_compile_sure`, the values its checks give back unchanged)
    skip the checks' calls; any other Entry's rows go through them row by row, which give the same
    values and raise the Entry's own error. All give the same rows (tests/test_spark_tuple_sink.py)."""

    def __init__(self, options: Options, mode: str, table: str, fields, positions: bool) -> None:
        super().__init__(mode, _tuple_output(fields, mode, False))
        self.columns = _with_error(_tuple_output(fields, mode, positions), mode)
        from bridge.tuple import FIELD_CHECKS, TupleEncoder
        self.encoder = TupleEncoder(options)
        self.table = table
        self.positions = positions
        self.known = frozenset(name for name, _, _ in fields)
        self.fields = []
        for name, ftype, kind in fields:
            check = FIELD_CHECKS[ftype]
            if kind.startswith("decimal("):
                p, s = map(int, kind[len("decimal("):-1].split(","))
                check = (lambda c, p, s: lambda v: _fit_decimal(c(v), p, s))(check, p, s)
            self.fields.append((name, check))
        self.sure = _compile_sure(fields)
        self.field_types = list(fields)
        self.storages = tuple(_storage(kind) for _, _, kind in fields)
        if speedups is not None and self.use_sink and None not in self.storages:
            self.sink = speedups.TupleSink(self.storages)
        self.lazy = self.sink is not None  # the sink reads each Entry's bytes, parsed only when it cannot

    def _rows(self, entry, raw=None) -> list[dict]:
        """The Entry's rows as TupleEncoder gives them (none for a DML Entry of another table)."""
        h = entry.header
        if h.messageType == pb.DML and f"{h.schemaName}.{h.tableName}" != self.table:
            return []
        return self.encoder.convert(entry, raw)

    def convert(self, entry, raw=None):
        rows = self._rows(entry, raw)
        sure = self.sure(rows)
        return sure if sure is not None else [self._values(row) for row in rows]

    def convert_columns(self, entry, raw=None):
        rows = self.convert(entry, raw)
        return len(rows), (list(zip(*rows)) if rows else [()] * self.nvalues)

    def _values(self, row: dict) -> tuple:
        unknown = set(row) - self.known
        if unknown:
            raise TupleFormatError("row has fields not in the RecordSchema", value=sorted(unknown))
        out = []
        for name, check in self.fields:
            value = row.get(name)
            try:
                out.append(None if value is None else check(value))
            except BridgeError as exc:
                raise exc.located(column=name)
        return tuple(out)

    # The output is held as rows, not columns: the value tuples of `convert` as they are, and per
    # Entry (or error row) one span (topic, partition, offset, entry, row numbers, error text), made
    # into columns once per chunk (`_columns`) instead of extending every column per Entry.

    def _reset(self) -> None:
        self._spans, self._values_out, self._held = [], [], 0

    def _held_rows(self) -> int:
        return self._held

    def _outputs(self):
        return self._convert_rows

    def _convert_rows(self, entry, raw=None) -> tuple[int, list]:
        rows = self.convert(entry, raw)
        return len(rows), rows

    def _add_rows(self, topic, where: dict, n: int, rows) -> None:
        self._spans.append((topic, where["partition"], where["offset"], where["entry"], range(n), None))
        self._values_out += rows
        self._held += n

    def _error_row(self, topic, err: BridgeError, entry) -> None:
        err.located(topic=topic)
        where = err.where
        self._spans.append((topic, where.get("partition"), where.get("offset"), entry, (None,), str(err)))
        self._values_out.append((None,) * self.nvalues)
        self._held += 1

    def _take(self) -> list:
        """The held rows as output columns (positions if asked, values, error under PERMISSIVE)."""
        spans, rows = self._spans, self._values_out
        self._reset()
        repeat, chain = itertools.repeat, itertools.chain.from_iterable
        out = []
        if self.positions:
            for i in range(4):
                out.append(list(chain(repeat(span[i], len(span[4])) for span in spans)))
            out.append(list(chain(span[4] for span in spans)))
        out += list(zip(*rows)) if rows else [() for _ in range(self.nvalues)]
        if self.keep:
            out.append(list(chain(repeat(span[5], len(span[4])) for span in spans)))
        return out


    # The sink's side: its table records, its counts and its batches.

    def _sink_entries(self, raws, index, partition, offset):
        return self.sink.entries(raws, index, self.tables, partition, offset)

    def _record(self, entry: pb.Entry, raw: bytes):
        h = entry.header
        # another table's Entries give no rows (`_rows`): False tells the sink so
        return False if f"{h.schemaName}.{h.tableName}" != self.table else self._sink_table(entry, raw)

    def _sink_table(self, entry: pb.Entry, raw: bytes) -> TupleSinkTable | None:
        """The sink's record of this table's column set (a TupleSinkTable): its C plan and how each
        output field is written; None where C cannot write every field as `_values` gives it (no C
        plan, a column the RecordSchema does not have, a field no writer takes)."""
        native = self.encoder.native_plan(entry, raw)
        if native is None:
            return None
        plan, columns = native
        index = {c.name: i for i, c in enumerate(columns)}
        meta = set(self.encoder.meta_names)
        if (index.keys() | meta) - self.known:  # `_values` rejects such rows
            return None
        out = []
        for (name, ftype, kind), storage in zip(self.field_types, self.storages):
            if name in index:
                writer = _column_writer(ftype, kind, storage, index[name], columns[index[name]])
            elif name in meta:
                writer = _meta_writer(name, storage, entry.header)
            else:  # a field the rows do not have: None (`_values`' row.get)
                writer = TupleSinkField(TupleWriter.NULL, -1, 0, 0, None)
            if writer is None:
                return None
            out.append(tuple(writer))
        return TupleSinkTable(plan, tuple(out))

    def _sink_batch(self, topic):
        """An output batch of `TupleSink.take()`'s buffers (contract.TupleSinkTaken). Its strings are
        UTF-8 by construction (C writes only text it checked or decoded), so no check here."""
        import pyarrow as pa
        t = TupleSinkTaken(*self.sink.take())
        rows, schema, arrays = t.rows, self._schema, []
        if self.positions:
            arrays.append(pa.nulls(rows, pa.string()) if topic is None
                          else pa.repeat(pa.scalar(topic, pa.string()), rows))
            arrays += [pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(data)])
                       for kind, data in ((pa.int32(), t.partition), (pa.int64(), t.offset), (pa.int32(), t.entry),
                                          (pa.int32(), t.row))]
        for field, (valid, nulls, offsets, data) in zip(list(schema)[len(arrays):], t.columns):
            buffers = [pa.py_buffer(valid)] + ([] if offsets is None else [pa.py_buffer(offsets)]) + [pa.py_buffer(data)]
            arrays.append(pa.Array.from_buffers(field.type, rows, buffers, null_count=nulls))
        if self.keep:
            arrays.append(pa.nulls(rows, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _ColumnSets(_FromDts):
    """The distinct DTS column sets of one table's DML entries, where each first appears. A set
    the Tuple side builds no table of (an unknown or unparsable column type) is dropped here as
    the bad record it is, so that it fails its own Entry under the conversion's mode rather than
    the RecordSchema of the whole job."""

    def __init__(self, table: str, options: Options) -> None:
        super().__init__("DROPMALFORMED", (("columns", "binary"),))
        self.table, self.options, self.seen = table, options, set()

    def convert(self, entry):
        from bridge.tuple import record_schema
        h = entry.header
        if h.messageType != pb.DML or f"{h.schemaName}.{h.tableName}" != self.table:
            return []
        columns = entry.event.dmlEvent.columns
        raw = pb.DMLEvent(columns=columns).SerializeToString()
        if raw in self.seen:
            return []
        record_schema(columns, self.options)
        self.seen.add(raw)
        return [(raw,)]
