/* DTS -> Tuple for Spark (the TupleSink type): the output columns of whole plain DML Entries of one
 * table, written into buffers Arrow takes as they are (sink.c does the same for Blob).
 *
 * Each output field has a storage (its Spark type's Arrow layout, fixed for the job) and, per column
 * set, a writer (LAYOUT_TUPLE_SINK_FIELD) bridge/spark/to_datahub.py chose. A value is written only
 * where it is what the Python path gives: the Tuple plan's value (tuples.c's tuple_object), which
 * the field's check (FIELD_CHECKS) and a Spark decimal's fit (`_fit_decimal`) give back unchanged.
 * Anything else (a value C does not read, one a check would change or refuse, a hole the plan leaves
 * to Python) leaves the whole Entry to Python: the sink is rolled back to before it. */
#include "speedups.h"

#define TUPLE_SINK_LIMIT ((Py_ssize_t)1 << 30) /* bytes of one string column held; Arrow's offsets stop at 2 GiB */
#define N_POS 4                                 /* entry, row, partition (int32), offset (int64) */

typedef struct {
    int storage;            /* TS_* */
    Buf valid, data, offs;  /* validity bits; values (bits for TS_BOOL); TS_STRING: int32 offsets */
    Py_ssize_t nulls;
    Py_ssize_t mark_valid, mark_data, mark_offs, mark_nulls; /* where the Entry being written began */
} OutColumn;

typedef struct {
    int writer;             /* W_* */
    Py_ssize_t column;      /* the plan column of a column writer */
    long long lo, hi;       /* W_INT, W_MICROS: the range; W_DECIMAL: precision, scale */
    PyObject *text;         /* W_IMAGE_TEXT: per DML type a tuple of bytes per image */
} FieldWriter;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nfields;
    OutColumn *cols;
    Buf pos[N_POS];
    Py_ssize_t rows;
    Buf key, scratch;       /* the last table key looked up; scratch space */
    PyObject *last;         /* the table record of `key` (False: another table) */
    PlanObject *plan;       /* its parts (references held by `last`) */
    FieldWriter *writers;
} TupleSinkObject;

static const int STORAGE_WIDTH[] = {0, 1, 2, 4, 8, 4, 8, 16, 0}; /* bytes of a fixed-width value by TS_* */

/* ---- the column buffers ------------------------------------------------------------------------- */

static int put_bit(Buf *b, Py_ssize_t row, int bit) {
    Py_ssize_t byte = row >> 3;
    if (byte >= b->n) { /* rows come in order: the next byte */
        uint8_t zero = 0;
        if (!buf_put(b, &zero, 1)) return 0;
    }
    if (bit) b->p[byte] |= (uint8_t)(1u << (row & 7));
    else b->p[byte] &= (uint8_t)~(1u << (row & 7));
    return 1;
}

static int end_string(OutColumn *c) {
    int32_t end = (int32_t)c->data.n; /* under TUPLE_SINK_LIMIT: put_string checks */
    return buf_put(&c->offs, &end, 4);
}

/* a valid value's bytes: 1, 0 a miss (the column would pass TUPLE_SINK_LIMIT), -1 error */
static int put_value(OutColumn *c, Py_ssize_t row, const void *p, Py_ssize_t n) {
    if (c->storage == TS_STRING && c->data.n + n > TUPLE_SINK_LIMIT) return 0;
    if (!put_bit(&c->valid, row, 1) || !buf_put(&c->data, p, n)) return -1;
    return c->storage != TS_STRING || end_string(c) ? 1 : -1;
}

static int put_null(OutColumn *c, Py_ssize_t row) {
    static const uint8_t zeros[16] = {0};
    c->nulls++;
    if (!put_bit(&c->valid, row, 0)) return -1;
    if (c->storage == TS_STRING) return end_string(c) ? 1 : -1;
    if (c->storage == TS_BOOL) return put_bit(&c->data, row, 0) ? 1 : -1;
    return buf_put(&c->data, zeros, STORAGE_WIDTH[c->storage]) ? 1 : -1;
}

/* an integer in the column's storage (the writer's range is within it: the unpack checked) */
static int put_int(OutColumn *c, Py_ssize_t row, long long x) {
    switch (c->storage) {
    case TS_INT8: { int8_t v = (int8_t)x; return put_value(c, row, &v, 1); }
    case TS_INT16: { int16_t v = (int16_t)x; return put_value(c, row, &v, 2); }
    case TS_INT32: { int32_t v = (int32_t)x; return put_value(c, row, &v, 4); }
    default: { int64_t v = (int64_t)x; return put_value(c, row, &v, 8); }
    }
}

static void sink_reset(TupleSinkObject *s) {
    for (Py_ssize_t f = 0; f < s->nfields; f++) {
        OutColumn *c = &s->cols[f];
        c->valid.n = c->data.n = c->offs.n = 0;
        c->nulls = 0;
    }
    for (int i = 0; i < N_POS; i++) s->pos[i].n = 0;
    s->rows = 0;
}

/* the first offset of each string column; 0 on a memory error */
static int sink_start(TupleSinkObject *s) {
    sink_reset(s);
    for (Py_ssize_t f = 0; f < s->nfields; f++)
        if (s->cols[f].storage == TS_STRING && !end_string(&s->cols[f])) return 0;
    return 1;
}

static void sink_mark(TupleSinkObject *s, Py_ssize_t *pos_mark) {
    for (Py_ssize_t f = 0; f < s->nfields; f++) {
        OutColumn *c = &s->cols[f];
        c->mark_valid = c->valid.n;
        c->mark_data = c->data.n;
        c->mark_offs = c->offs.n;
        c->mark_nulls = c->nulls;
    }
    for (int i = 0; i < N_POS; i++) pos_mark[i] = s->pos[i].n;
}

/* back to the mark (the bits of a byte past the rows are rewritten before they count) */
static void sink_rollback(TupleSinkObject *s, const Py_ssize_t *pos_mark, Py_ssize_t rows) {
    for (Py_ssize_t f = 0; f < s->nfields; f++) {
        OutColumn *c = &s->cols[f];
        c->valid.n = c->mark_valid;
        c->data.n = c->mark_data;
        c->offs.n = c->mark_offs;
        c->nulls = c->mark_nulls;
    }
    for (int i = 0; i < N_POS; i++) s->pos[i].n = pos_mark[i];
    s->rows = rows;
}

/* ---- the values --------------------------------------------------------------------------------- */

/* Decimal text -?D+(.D+)? as the unscaled integer of a Spark decimal(precision, scale), as
 * `_fit_decimal` lets it through and Arrow stores it: 1 written, 0 a miss (more fraction digits than
 * the scale, more digits than the precision: `_fit_decimal` decides), -1 error. */
static int put_decimal(OutColumn *c, Py_ssize_t row, Span s, int precision, int scale) {
#if defined(__SIZEOF_INT128__)
    const uint8_t *p = s.p, *end = s.p + s.n;
    int neg = p < end && *p == '-';
    p += neg;
    unsigned __int128 u = 0;
    int digits = 0, frac = -1; /* frac: digits after the point, -1 before it */
    for (; p < end; p++) {
        if (*p == '.') {
            if (frac >= 0) return 0;
            frac = 0;
            continue;
        }
        if (*p < '0' || *p > '9') return 0;
        if (frac >= 0) frac++;
        if (u == 0 && *p == '0') continue; /* leading zeros are no digits of the value */
        if (++digits > 38) return 0;
        u = u * 10 + (unsigned)(*p - '0');
    }
    if (frac < 0) frac = 0;
    if (frac > scale) return 0;
    for (; frac < scale; frac++) /* quantize's zeros up to the scale */
        if (u != 0) {
            if (++digits > 38) return 0;
            u *= 10;
        }
    if (digits > precision) return 0;
    __int128 v = neg ? -(__int128)u : (__int128)u;
    return put_value(c, row, &v, 16);
#else
    (void)c, (void)row, (void)s, (void)precision, (void)scale;
    return 0;
#endif
}

/* A text, json or base64 column's str as UTF-8: 1, 0 a miss (bytes that are not UTF-8, a unit the
 * charset's table does not know, a value of another tag), -1 error */
static int put_text(OutColumn *c, Py_ssize_t row, const Col *col, const Canon *v) {
    Buf *b = &c->data;
    Py_ssize_t start = b->n;
    if (col->out == O_HEX) {
        static const char HEX[] = "0123456789abcdef";
        if (v->tag != C_B64) return 0;
        if (!bridge_buf_grow(b, 2 * v->s.n)) return -1;
        for (Py_ssize_t i = 0; i < v->s.n; i++) {
            b->p[b->n++] = (uint8_t)HEX[v->s.p[i] >> 4];
            b->p[b->n++] = (uint8_t)HEX[v->s.p[i] & 15];
        }
    } else if (v->tag == C_UTF8 || v->tag == C_ASCII) {
        const uint8_t *p = v->s.p, *end = p + v->s.n;
        while (p < end) { /* strictly, as utf8_str decodes it */
            int len = *p < 0x80 ? 1 : utf8_seq(p, end);
            if (!len) return 0;
            p += len;
        }
        if (!buf_put(b, v->s.p, v->s.n)) return -1;
    } else if (v->tag == C_TABLE) {
        int rc = bridge_table_utf8(b, v->table, v->s.p, v->s.n);
        if (rc <= 0) {
            b->n = start;
            return rc;
        }
    } else if (v->tag == C_B64) {
        Py_ssize_t len = ((v->s.n + 2) / 3) * 4;
        if (!bridge_buf_grow(b, len)) return -1;
        bridge_base64_into(b->p + b->n, v->s.p, v->s.n);
        b->n += len;
    } else {
        return 0;
    }
    if (b->n > TUPLE_SINK_LIMIT) {
        b->n = start;
        return 0;
    }
    return put_bit(&c->valid, row, 1) && end_string(c) ? 1 : -1;
}

/* One field of one image: 1, 0 a miss, -1 error */
static int put_field(TupleSinkObject *s, const FieldWriter *fw, OutColumn *c, const Walk *w, int dml_type,
                     Py_ssize_t image, long long seq_base, long long time_ms) {
    Py_ssize_t row = s->rows;
    switch (fw->writer) {
    case W_NULL: return put_null(c, row);
    case W_SEQ: {
        char digits[24];
        return put_value(c, row, digits, bridge_int_text(seq_base + w->index, digits));
    }
    case W_TIME: return put_int(c, row, time_ms);
    case W_IMAGE_TEXT: {
        PyObject *t = PyTuple_GET_ITEM(PyTuple_GET_ITEM(fw->text, dml_type), image);
        return put_value(c, row, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t));
    }
    default: break;
    }
    Col *col = &s->plan->cols[fw->column];
    Canon v;
    DataView d;
    int rc = bridge_classify(col, w->datas[fw->column], &v, &d);
    if (rc == V_NULL || rc == V_SKIP) return put_null(c, row); /* a Tuple row has every field */
    if (rc != V_VALUE) return 0;
    switch (fw->writer) {
    case W_INT:
        if (v.tag != C_INT || v.i < fw->lo || v.i > fw->hi) return 0;
        return put_int(c, row, v.i);
    case W_MICROS:
        if (v.tag != C_INT || v.us > TUPLE_TS_HI || v.us < fw->lo || v.us > fw->hi) return 0;
        return put_int(c, row, v.us);
    case W_DOUBLE:
    case W_FLOAT32: {
        double x;
        if (v.tag != C_FLOAT) return 0;
        if (!bridge_canon_double(&v, &x)) {
            PyErr_Clear(); /* the dict writer would raise: Python's */
            return 0;
        }
        if (!isfinite(x)) return 0;
        if (fw->writer == W_DOUBLE) return put_value(c, row, &x, 8);
        float single = (float)x; /* struct.pack("<f") rounds the same way */
        if (isinf(single)) return 0;
        return put_value(c, row, &single, 4);
    }
    case W_BOOL:
        if (v.tag != C_BOOL) return 0;
        if (!put_bit(&c->valid, row, 1) || !put_bit(&c->data, row, v.i != 0)) return -1;
        return 1;
    case W_DECIMAL:
        if (v.tag != C_ASCII) return 0;
        return put_decimal(c, row, v.s, (int)fw->lo, (int)fw->hi);
    case W_STRING: return put_text(c, row, col, &v);
    default: return 0;
    }
}

/* ---- table records ------------------------------------------------------------------------------ */

/* The writers of a LAYOUT_TUPLE_SINK_TABLE record (contract.TupleSinkTable: plan, one
 * LAYOUT_TUPLE_SINK_FIELD tuple per output field), checked against the storages and the plan: every
 * plan column is read by exactly one field, whose writer takes what the column's out makes. 1, or 0
 * with a Python error set. */
static int unpack_table(TupleSinkObject *s, PyObject *rec, FieldWriter *out) {
    PyObject *plan, *fields;
    if (!PyTuple_Check(rec) || !PyArg_ParseTuple(rec, "O!O!:TupleSink table", &bridge_PlanType, &plan, &PyTuple_Type,
                                                 &fields))
        goto bad;
    PlanObject *pl = (PlanObject *)plan;
    if (pl->decimal == NULL || PyTuple_GET_SIZE(fields) != s->nfields) goto bad;
    Py_ssize_t read = 0;
    for (Py_ssize_t f = 0; f < s->nfields; f++) {
        FieldWriter *fw = &out[f];
        PyObject *field = PyTuple_GET_ITEM(fields, f);
        if (!PyTuple_Check(field)
            || !PyArg_ParseTuple(field, "inLLO:TupleSink field", &fw->writer, &fw->column, &fw->lo, &fw->hi, &fw->text))
            goto bad;
        int st = s->cols[f].storage, w = fw->writer, reads = w >= W_INT && w <= W_STRING;
        if (reads != (fw->column >= 0) || fw->column >= pl->ncols) goto bad;
        const Col *col = reads ? &pl->cols[fw->column] : NULL;
        for (Py_ssize_t g = 0; reads && g < f; g++)
            if (out[g].column == fw->column) goto bad;
        read += reads;
        int ok;
        switch (w) {
        case W_NULL: ok = 1; break;
        case W_INT: {
            static const long long LIMIT[] = {0, 127, 32767, 2147483647LL, LLONG_MAX};
            ok = col->kind == K_LONG && col->out == O_SAME && st >= TS_INT8 && st <= TS_INT64 && fw->lo <= fw->hi
                 && fw->hi <= LIMIT[st] && fw->lo >= -LIMIT[st] - 1;
            break;
        }
        case W_MICROS: ok = col->out == O_MICROS && st == TS_INT64 && fw->lo <= fw->hi; break;
        case W_DOUBLE: ok = col->kind == K_DOUBLE && col->out == O_SAME && st == TS_FLOAT64; break;
        case W_FLOAT32: ok = col->kind == K_DOUBLE && col->out == O_FLOAT32 && st == TS_FLOAT32; break;
        case W_BOOL: ok = col->kind == K_BOOL && col->out == O_SAME && st == TS_BOOL; break;
        case W_DECIMAL:
            ok = col->out == O_DECIMAL && st == TS_DECIMAL128 && fw->lo >= 1 && fw->lo <= 38 && fw->hi >= 0
                 && fw->hi <= fw->lo;
            break;
        case W_STRING:
            ok = (col->kind == K_TEXT || col->kind == K_UTF8 || col->kind == K_BASE64)
                 && (col->out == O_SAME || (col->out == O_HEX && col->kind == K_BASE64)) && st == TS_STRING;
            break;
        case W_SEQ: ok = st == TS_STRING; break;
        case W_TIME: ok = st == TS_INT64; break;
        case W_IMAGE_TEXT:
            ok = st == TS_STRING && PyTuple_Check(fw->text) && PyTuple_GET_SIZE(fw->text) == 3;
            for (int t = 0; ok && t < 3; t++) {
                PyObject *images = PyTuple_GET_ITEM(fw->text, t);
                ok = PyTuple_Check(images) && PyTuple_GET_SIZE(images) == (t == DML_UPDATE ? 2 : 1);
                for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(images); k++)
                    ok = PyBytes_Check(PyTuple_GET_ITEM(images, k));
            }
            break;
        default: ok = 0;
        }
        if (!ok) goto bad;
    }
    if (read != pl->ncols) goto bad; /* a column no field reads: Python's row has a key the schema lacks */
    s->plan = pl;
    return 1;
bad:
    /* whatever was wrong with it (a parse's TypeError, OverflowError, SystemError): the record's ValueError */
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError)) PyErr_Clear();
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a TupleSink table record that does not fit its fields");
    return 0;
}

/* ---- whole Entries ------------------------------------------------------------------------------ */

/* The rows of one plain DML Entry of the job's table: 1, 0 (a miss: the sink is as before) or -1. */
static int sink_entry(TupleSinkObject *s, const uint8_t *start, const uint8_t *end, const PlainEntry *e,
                      int32_t entry_index, int32_t partition, int64_t offset) {
    uint64_t seq_id = e->h.v[F_HEADER_SEQID];
    if (seq_id > (uint64_t)(LLONG_MAX - e->rows) / 1000000u) return 0; /* Python writes the big number */
    long long seq_base = (long long)seq_id * 1000000LL, time_ms = (long long)e->h.v[F_HEADER_TIMESTAMP] * 1000;
    Py_ssize_t pos_mark[N_POS], rows = s->rows;
    sink_mark(s, pos_mark);
    Walk w = {0};
    int rc = bridge_walk_start(&w, start, end, e->dml_type, s->plan->ncols);
    if (rc <= 0) goto finish;
    Py_ssize_t count;
    int32_t out_row = 0;
    while ((rc = bridge_walk_next(&w, &count)) == 1) {
        if (count != s->plan->ncols) { /* an image without its values, or another number of them: Python's */
            rc = 0;
            goto finish;
        }
        Py_ssize_t image = e->dml_type == DML_UPDATE ? walk_image(&w) : 0;
        for (Py_ssize_t f = 0; f < s->nfields; f++) {
            rc = put_field(s, &s->writers[f], &s->cols[f], &w, e->dml_type, image, seq_base, time_ms);
            if (rc <= 0) goto finish;
        }
        int32_t at[3] = {entry_index, out_row++, partition};
        for (int i = 0; i < 3; i++)
            if (!buf_put(&s->pos[i], &at[i], 4)) {
                rc = -1;
                goto finish;
            }
        if (!buf_put(&s->pos[3], &offset, 8)) {
            rc = -1;
            goto finish;
        }
        s->rows++;
    }
    rc = rc < 0 ? 0 : 1; /* walk_next's -1: an Entry for Python */
finish:
    if (rc <= 0) sink_rollback(s, pos_mark, rows);
    PyMem_Free(w.datas);
    return rc;
}

/* TupleSink(storages): one TS_* per output field (contract.TupleStorage, by its Spark type) */
static int TupleSink_init(TupleSinkObject *self, PyObject *args, PyObject *kwds) {
    PyObject *storages;
    if (self->cols != NULL || !PyArg_ParseTuple(args, "O!:TupleSink", &PyTuple_Type, &storages)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "TupleSink() is made once");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(storages);
    self->cols = PyMem_Calloc((size_t)(n ? n : 1), sizeof(OutColumn));
    self->writers = PyMem_Calloc((size_t)(n ? n : 1), sizeof(FieldWriter));
    if (self->cols == NULL || self->writers == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->nfields = n;
    for (Py_ssize_t f = 0; f < n; f++) {
        long st = PyLong_AsLong(PyTuple_GET_ITEM(storages, f));
        if (st == -1 && PyErr_Occurred()) return -1;
        if (st < TS_BOOL || st > TS_STRING) {
            PyErr_Format(PyExc_ValueError, "bad TupleSink storage %zd", f);
            return -1;
        }
        self->cols[f].storage = (int)st;
    }
    return sink_start(self) ? 0 : -1;
}

static void TupleSink_dealloc(TupleSinkObject *self) {
    for (Py_ssize_t f = 0; self->cols != NULL && f < self->nfields; f++) {
        PyMem_Free(self->cols[f].valid.p);
        PyMem_Free(self->cols[f].data.p);
        PyMem_Free(self->cols[f].offs.p);
    }
    for (int i = 0; i < N_POS; i++) PyMem_Free(self->pos[i].p);
    PyMem_Free(self->cols);
    PyMem_Free(self->writers);
    PyMem_Free(self->key.p);
    PyMem_Free(self->scratch.p);
    Py_XDECREF(self->last);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* TupleSink.entries(raws, start, tables, partition, offset) -> (next, entries, rows) (LAYOUT_SINK_ENTRIES):
 * the plain DML Entries raws[start:] into the sink, in order, up to the first one it leaves to Python
 * (`next`; len(raws) when none). tables: table key -> a TupleSinkTable record, False (another
 * table's: no rows), or anything else (Python converts its Entries). `entries`: those that gave rows. */
static PyObject *TupleSink_entries(TupleSinkObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "entries(raws: list, start, tables: dict, partition, offset)");
        return NULL;
    }
    if (self->cols == NULL) {
        PyErr_SetString(PyExc_TypeError, "TupleSink() was not initialised");
        return NULL;
    }
    PyObject *raws = args[0], *tables = args[2];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long partition = PyLong_AsLong(args[3]);
    long long offset = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (partition < INT32_MIN || partition > INT32_MAX) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(raws), i = start < 0 ? 0 : start, entries = 0, before = self->rows;
    for (; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        if (!PyBytes_Check(raw) || i > INT32_MAX || self->rows >= INT32_MAX - 2000000) break; /* an UPDATE Entry's rows: two an image pair */
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(raw), *end = p + PyBytes_GET_SIZE(raw);
        PlainEntry e;
        if (!bridge_plain_entry(p, end, &e)) break;
        PyObject *rec;
        int found = bridge_sink_table(&self->scratch, &self->key, self->last, tables, &e, &rec);
        if (found < 0) return NULL;
        if (found == 0) break;
        if (found == 2) {
            if (rec != Py_False) {
                if (!PyTuple_Check(rec)) break; /* a column set C does not take */
                if (!unpack_table(self, rec, self->writers)) {
                    Py_CLEAR(self->last); /* the writers are half made: looked up again next time */
                    return NULL;
                }
            }
            if (!bridge_sink_hold(&self->key, &self->last, &self->scratch, rec)) {
                Py_CLEAR(self->last);
                return NULL;
            }
        }
        if (self->last == Py_False) continue; /* another table's DML Entry: no rows, as `_DtsToTuple._rows` */
        int rc = sink_entry(self, p, end, &e, (int32_t)i, (int32_t)partition, offset);
        if (rc < 0) return NULL;
        if (rc == 0) break;
        entries++;
    }
    return Py_BuildValue("(nnn)", i, entries, self->rows - before);
}

static PyObject *bytes_of(const Buf *b) {
    return PyBytes_FromStringAndSize(b->n ? (const char *)b->p : "", b->n);
}

/* TupleSink.take() -> a LAYOUT_TUPLE_SINK_TAKEN tuple (contract.TupleSinkTaken): rows, the entry,
 * row and partition columns (int32) and offset (int64), then per field (validity bits, null count,
 * int32 offsets or None, data), all in native byte order; the sink starts empty again. */
static PyObject *TupleSink_take(TupleSinkObject *self, PyObject *unused) {
    if (self->cols == NULL) {
        PyErr_SetString(PyExc_TypeError, "TupleSink() was not initialised");
        return NULL;
    }
    PyObject *columns = PyTuple_New(self->nfields);
    if (columns == NULL) return NULL;
    for (Py_ssize_t f = 0; f < self->nfields; f++) {
        OutColumn *c = &self->cols[f];
        PyObject *offs = c->storage == TS_STRING ? bytes_of(&c->offs) : (Py_INCREF(Py_None), Py_None);
        PyObject *item = offs == NULL ? NULL : Py_BuildValue("(NnNN)", bytes_of(&c->valid), c->nulls, offs,
                                                             bytes_of(&c->data));
        if (item == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyTuple_SET_ITEM(columns, f, item);
    }
    PyObject *out = Py_BuildValue("(nNNNNN)", self->rows, bytes_of(&self->pos[0]), bytes_of(&self->pos[1]),
                                  bytes_of(&self->pos[2]), bytes_of(&self->pos[3]), columns);
    if (out == NULL) return NULL;
    if (!sink_start(self)) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *TupleSink_rows(TupleSinkObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(self->rows);
}

static PyMethodDef TupleSink_methods[] = {
    {"entries", (PyCFunction)(void (*)(void))TupleSink_entries, METH_FASTCALL,
     "entries(raws, start, tables, partition, offset) -> (next, entries, rows)"},
    {"take", (PyCFunction)TupleSink_take, METH_NOARGS, "take() -> (rows, entry, row, partition, offset, columns), "
     "and start empty"},
    {"rows", (PyCFunction)TupleSink_rows, METH_NOARGS, "rows held"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject bridge_TupleSinkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bridge.native._speedups.TupleSink",
    .tp_basicsize = sizeof(TupleSinkObject),
    .tp_dealloc = (destructor)TupleSink_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Spark's dts_to_tuple output columns of plain DML Entries, written as Arrow buffers.",
    .tp_methods = TupleSink_methods,
    .tp_init = (initproc)TupleSink_init,
    .tp_new = PyType_GenericNew,
};
