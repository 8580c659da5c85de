/* DTS -> Blob for Spark (the Sink type): the output columns of whole Entries, written into buffers
 * Arrow takes as they are. */
#include "speedups.h"

static int is_int32(uint64_t v) { return v <= 0x7fffffffull || v >= 0xffffffff80000000ull; }

/* 1: the Header holds only fields 1..13, none repeated, each with its wire type, the int32 and
 * enum fields in range, timestamp a uint32 and isLast 0 or 1 (what protobuf reads the same way
 * the bridge's Python path does); 0: leave the Entry to Python. */
static int read_header(Span h, PlainHeader *hv) {
    const uint8_t *p = h.p, *end = h.p + h.n;
    unsigned seen = 0;
    memset(hv, 0, sizeof(*hv));
    for (int f = 0; f <= F_HEADER_ISLAST; f++) hv->s[f].p = (const uint8_t *)"";
    while (p < end) {
        uint64_t tag;
        if (!read_tag(&p, end, &tag)) return 0;
        uint64_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if (field < F_HEADER_VERSION || field > F_HEADER_ISLAST || (seen & (1u << field))) return 0;
        seen |= 1u << field;
        if (field == F_HEADER_FILENAME || field == F_HEADER_GTID || field == F_HEADER_SCHEMANAME
            || field == F_HEADER_TABLENAME) {
            if (wt != WT_LEN || !read_span(&p, end, &hv->s[field])) return 0;
        } else if (wt != WT_VARINT || !read_varint(&p, end, &hv->v[field])) {
            return 0;
        }
    }
    return is_int32(hv->v[F_HEADER_VERSION]) && is_int32(hv->v[F_HEADER_SOURCETYPE])
           && is_int32(hv->v[F_HEADER_MESSAGETYPE])
           && hv->v[F_HEADER_TIMESTAMP] <= 0xffffffffull && hv->v[F_HEADER_ISLAST] <= 1;
}

/* dts.header of a plain DML Entry as orjson writes `wire_ext_header(header)`: the non-default
 * fields outside the envelope and source, in field-number order. 1, 0 (a string that is not
 * UTF-8: protobuf would not have parsed it) or -1. *plain: the header is the default {"version": 1}. */
static int ext_header_json(Buf *b, const PlainHeader *hv, int *plain) {
    int first = 1, n = 0;
    static const struct { int field; const char *key; int kind; } F[] = {
        {F_HEADER_VERSION, "\"version\":", 0},   {F_HEADER_SERVERID, "\"serverId\":", 1},
        {F_HEADER_FILENAME, "\"fileName\":", 2}, {F_HEADER_POSITION, "\"position\":", 3},
        {F_HEADER_GTID, "\"gtid\":", 2},         {F_HEADER_EVENTINDEX, "\"eventIndex\":", 3},
        {F_HEADER_ISLAST, "\"isLast\":", 4}};
    if (!buf_put(b, "{", 1)) return -1;
    for (size_t i = 0; i < sizeof(F) / sizeof(F[0]); i++) {
        int f = F[i].field;
        if (F[i].kind == 2 ? hv->s[f].n == 0 : hv->v[f] == 0) continue;
        if ((!first && !buf_put(b, ",", 1)) || !buf_put(b, F[i].key, (Py_ssize_t)strlen(F[i].key))) return -1;
        first = 0;
        n++;
        char digits[32];
        Py_ssize_t nd;
        switch (F[i].kind) {
        case 0: nd = bridge_int_text((int32_t)(uint32_t)hv->v[f], digits); break;
        case 1: nd = bridge_int_text((long long)hv->v[f], digits); break;
        case 3: nd = bridge_u64_text(hv->v[f], digits); break;
        case 4: memcpy(digits, "true", 4); nd = 4; break;
        default: {
            int rc = bridge_json_string(b, hv->s[f].p, hv->s[f].n);
            if (rc <= 0) return rc;
            continue;
        }
        }
        if (!buf_put(b, digits, nd)) return -1;
    }
    *plain = n == 1 && hv->v[F_HEADER_VERSION] == 1;
    return buf_put(b, "}", 1) ? 1 : -1;
}

/* The cache key of a plain DML Entry's table: sourceType, schemaName, tableName, columns bytes. */
int bridge_table_key_into(Buf *b, const PlainHeader *hv, Span columns) {
    const Span *db = &hv->s[F_HEADER_SCHEMANAME], *table = &hv->s[F_HEADER_TABLENAME];
    return bridge_put_varint(b, hv->v[F_HEADER_SOURCETYPE]) && bridge_put_varint(b, (uint64_t)db->n)
           && buf_put(b, db->p, db->n)
           && bridge_put_varint(b, (uint64_t)table->n) && buf_put(b, table->p, table->n)
           && buf_put(b, columns.p, columns.n);
}

/* A sink's `entries` loop, per plain DML Entry: the key of its table (bridge_table_key_into) into
 * `scratch`, against the key `held` of the record the sink holds (`last`, NULL for none). 1: that
 * record still applies; 2: `*rec` (borrowed) is the record `tables` has for the new key, for the
 * caller to unpack and then keep with bridge_sink_hold; 0: `tables` has none, or None (a table C
 * cannot take: the Entry is left to Python); -1 on error. */
int bridge_sink_table(Buf *scratch, const Buf *held, PyObject *last, PyObject *tables, const PlainEntry *e,
                      PyObject **rec) {
    scratch->n = 0;
    if (!bridge_table_key_into(scratch, &e->h, e->columns)) return -1;
    if (last != NULL && scratch->n == held->n && memcmp(scratch->p, held->p, (size_t)scratch->n) == 0) return 1;
    PyObject *k = PyBytes_FromStringAndSize((const char *)scratch->p, scratch->n);
    if (k == NULL) return -1;
    *rec = PyDict_GetItemWithError(tables, k);
    Py_DECREF(k);
    if (*rec == NULL) return PyErr_Occurred() ? -1 : 0;
    return *rec == Py_None ? 0 : 2;
}

/* The record bridge_sink_table found, unpacked by the caller, kept with its key; 0 on a memory error. */
int bridge_sink_hold(Buf *held, PyObject **last, const Buf *scratch, PyObject *rec) {
    held->n = 0;
    if (!buf_put(held, scratch->p, scratch->n)) return 0;
    Py_INCREF(rec);
    Py_XSETREF(*last, rec);
    return 1;
}

int bridge_plain_entry(const uint8_t *start, const uint8_t *end, PlainEntry *e) {
    Span header = {(const uint8_t *)"", 0};
    if (bridge_only_submessage(start, end, F_ENTRY_HEADER, &header) < 0) return 0;
    /* Entry: the header and the event, nothing else */
    const uint8_t *p = start;
    while (p < end) {
        uint64_t tag;
        if (!read_tag(&p, end, &tag) || (TAG_FIELD(tag) != F_ENTRY_HEADER && TAG_FIELD(tag) != F_ENTRY_EVENT)
            || !skip_field(&p, end, TAG_WT(tag)))
            return 0;
    }
    return read_header(header, &e->h) && e->h.v[F_HEADER_MESSAGETYPE] == MT_DML
           && bridge_scan_dml(start, end, &e->columns, &e->dml_type, &e->rows) && e->rows > 0 && e->rows <= 1000000;
}

/* table_key(entry_bytes) -> the bytes the Sink looks a plain DML Entry's table up by, or None. */
PyObject *bridge_table_key(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    PlainEntry e;
    PyObject *result = NULL;
    if (bridge_plain_entry(buf.buf, (const uint8_t *)buf.buf + buf.len, &e)) {
        Buf key = {NULL, 0, 0};
        if (bridge_table_key_into(&key, &e.h, e.columns))
            result = PyBytes_FromStringAndSize((const char *)key.p, key.n);
        PyMem_Free(key.p);
    } else {
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&buf);
    return result;
}

/* The parts of a table record, a LAYOUT_SINK_TABLE tuple (contract.SinkTable: plan, (pre, post) per
 * dmlEventType, ext columns JSON, key indexes, foreign default, db, table, table shard). */
typedef struct {
    PlanObject *plan;
    PyObject *templates, *ext_columns, *keys, *db, *table, *table_shard;
    int foreign_default;
} Table;

static int unpack_table(PyObject *rec, Table *t) {
    PyObject *plan, *fd;
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 8
        || !PyArg_ParseTuple(rec, "O!O!SO!OSSS", &bridge_PlanType, &plan, &PyTuple_Type, &t->templates, &t->ext_columns,
                             &PyTuple_Type, &t->keys, &fd, &t->db, &t->table, &t->table_shard)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a Sink table record is an 8-tuple");
        return 0;
    }
    t->plan = (PlanObject *)plan;
    t->foreign_default = PyObject_IsTrue(fd);
    if (t->foreign_default < 0) return 0;
    if (PyTuple_GET_SIZE(t->templates) != 3) {
        PyErr_SetString(PyExc_TypeError, "a Sink table record has (pre, post) for each dmlEventType");
        return 0;
    }
    return 1;
}

#define SINK_LIMIT ((Py_ssize_t)1 << 30) /* blob bytes held; Arrow's int32 offsets stop at 2 GiB */

enum { S_BLOB, S_SHARD, S_SEQ, S_DB, S_TABLE, S_STRINGS }; /* string columns: data and int32 offsets */
enum { S_OP, S_ENTRY, S_ROW, S_PART, S_OFFSET, S_TIME, S_FIXED }; /* fixed-width columns */

typedef struct {
    PyObject_HEAD
    Buf data[S_STRINGS], offs[S_STRINGS];
    Buf fixed[S_FIXED];
    Py_ssize_t rows;
    Buf key, scratch, tail, hdr, spans; /* the last table key looked up; scratch space */
    PyObject *last;            /* the table record of `key` */
    Table table;               /* its parts (references held by `last`) */
    Py_ssize_t *keys;          /* its shard key's column indexes */
    Py_ssize_t nkeys;
} SinkObject;

static int put_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }
static int put_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }

static int sink_reset(SinkObject *s) {
    for (int i = 0; i < S_STRINGS; i++) {
        s->data[i].n = 0;
        s->offs[i].n = 0;
        if (!put_i32(&s->offs[i], 0)) return 0;
    }
    for (int i = 0; i < S_FIXED; i++) s->fixed[i].n = 0;
    s->rows = 0;
    return 1;
}

/* close one string value: its end offset (the data stays under 2 GiB: callers take often) */
static int sink_end_string(SinkObject *s, int col) {
    if (s->data[col].n > 0x7fffffff) {
        PyErr_SetString(PyExc_OverflowError, "Sink column over 2 GiB: take() more often");
        return 0;
    }
    return put_i32(&s->offs[col], (int32_t)s->data[col].n);
}

static int sink_string(SinkObject *s, int col, const void *p, Py_ssize_t n) {
    return buf_put(&s->data[col], p, n) && sink_end_string(s, col);
}

typedef struct {
    Py_ssize_t data[S_STRINGS], offs[S_STRINGS], fixed[S_FIXED], rows;
} SinkMark;

static void sink_mark(SinkObject *s, SinkMark *m) {
    for (int i = 0; i < S_STRINGS; i++) {
        m->data[i] = s->data[i].n;
        m->offs[i] = s->offs[i].n;
    }
    for (int i = 0; i < S_FIXED; i++) m->fixed[i] = s->fixed[i].n;
    m->rows = s->rows;
}

static void sink_rollback(SinkObject *s, const SinkMark *m) {
    for (int i = 0; i < S_STRINGS; i++) {
        s->data[i].n = m->data[i];
        s->offs[i].n = m->offs[i];
    }
    for (int i = 0; i < S_FIXED; i++) s->fixed[i].n = m->fixed[i];
    s->rows = m->rows;
}

static void Sink_dealloc(SinkObject *self) {
    for (int i = 0; i < S_STRINGS; i++) {
        PyMem_Free(self->data[i].p);
        PyMem_Free(self->offs[i].p);
    }
    for (int i = 0; i < S_FIXED; i++) PyMem_Free(self->fixed[i].p);
    PyMem_Free(self->key.p);
    PyMem_Free(self->scratch.p);
    PyMem_Free(self->tail.p);
    PyMem_Free(self->hdr.p);
    PyMem_Free(self->spans.p);
    PyMem_Free(self->keys);
    Py_XDECREF(self->last);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Sink_init(SinkObject *self, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, ":Sink")) return -1;
    return sink_reset(self) ? 0 : -1;
}

/* The messages of one plain DML Entry into the sink: 1, 0 (a miss: the sink is as before) or -1. */
static int sink_entry(SinkObject *s, const uint8_t *start, const uint8_t *end, const PlainEntry *e,
                      const Table *t, int lossless, PyObject *version, int32_t entry_index, int32_t partition,
                      int64_t offset) {
    const PlainHeader *h = &e->h;
    long long event_time = (long long)h->v[4] * 1000;
    if (event_time < 1000000000000LL || event_time > 9999999999999LL) return 0;
    PyObject *pair = PyTuple_GET_ITEM(t->templates, e->dml_type);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "a Sink template is a (pre, post) pair");
        return -1;
    }
    Layout L = {0};
    L.pre = PyTuple_GET_ITEM(pair, 0);
    L.post = PyTuple_GET_ITEM(pair, 1);
    if (!bridge_check_templates(L.pre, L.post, e->dml_type == DML_UPDATE ? 2 : 1)) return -1;
    /* the sequenceId's prefix, then the bytes after it: timestamp, version, extension head */
    Buf *tail = &s->tail;
    char seq_digits[32], nrows_digits[32];
    uint64_t seq_id = h->v[11];
    L.seq_pad = seq_id != 0;
    L.seq_prefix = seq_digits;
    L.seq_prefix_n = seq_id ? bridge_u64_text(seq_id, seq_digits) : 0;
    tail->n = 0;
    char stamp[24];
    Py_ssize_t ns = bridge_int_text(event_time, stamp);
    if (!buf_put(tail, "\",\"timestamp\":{\"eventTime\":", 27) || !buf_put(tail, stamp, ns)
        || !buf_put(tail, ",\"checkpointTime\":", 18) || !buf_put(tail, stamp, ns)
        || !buf_put(tail, "}},\"version\":\"", 14)
        || !buf_put(tail, PyBytes_AS_STRING(version), PyBytes_GET_SIZE(version)))
        return -1;
    int quiet = 1;
    if (lossless) {
        Buf *hdr = &s->hdr;
        int plain = 0;
        hdr->n = 0;
        int rc = ext_header_json(hdr, h, &plain);
        quiet = t->foreign_default && e->rows == 1 && plain;
        if (rc > 0 && !quiet)
            rc = buf_put(tail, "\",\"dts\":{\"header\":", 18) && buf_put(tail, hdr->p, hdr->n)
                 && buf_put(tail, PyBytes_AS_STRING(t->ext_columns), PyBytes_GET_SIZE(t->ext_columns))
                 && buf_put(tail, ",\"row\":[", 8) ? 1 : -1;
        if (rc <= 0) return rc;
    }
    if (quiet && !buf_put(tail, "\"}", 2)) return -1;
    if (!quiet) {
        L.nrows_text = nrows_digits;
        L.nrows_n = bridge_int_text(e->rows, nrows_digits);
    }
    L.post_seq = (const char *)tail->p;
    L.post_seq_n = tail->n;
    L.keys = s->keys;
    L.nkeys = s->nkeys;
    static const uint8_t OPS[3][2] = {{OP_INSERT, 0}, {OP_UPDATE_BEFOR, OP_UPDATE_AFTER}, {OP_DELETE, 0}};
    SinkMark mark;
    sink_mark(s, &mark);
    Walk w = {0};
    Py_ssize_t *spans = NULL;
    int rc = bridge_walk_start(&w, start, end, e->dml_type, t->plan->ncols);
    if (rc <= 0) goto finish;
    s->spans.n = 0;
    if (!bridge_buf_grow(&s->spans, (Py_ssize_t)sizeof(Py_ssize_t) * 2 * w.cap)) {
        rc = -1;
        goto finish;
    }
    spans = (Py_ssize_t *)s->spans.p;
    Py_ssize_t count;
    int32_t bridge_message = 0;
    while ((rc = bridge_walk_next(&w, &count)) == 1) {
        Py_ssize_t k = e->dml_type == DML_UPDATE ? walk_image(&w) : 0;
        int has_key = 0;
        Buf *shard = &s->data[S_SHARD];
        rc = bridge_write_line(t->plan, &L, &w, count, k, &s->data[S_BLOB], spans, shard, &has_key, NULL);
        if (rc <= 0) goto finish;
        if (s->data[S_BLOB].n > SINK_LIMIT) { /* an Entry of over a GiB of lines: Python's */
            rc = 0;
            goto finish;
        }
        if (!sink_end_string(s, S_BLOB)
            || (!has_key && !buf_put(shard, PyBytes_AS_STRING(t->table_shard), PyBytes_GET_SIZE(t->table_shard)))
            || !sink_end_string(s, S_SHARD)
            || !bridge_put_seq(&s->data[S_SEQ], &L, w.index) || !sink_end_string(s, S_SEQ)
            || !sink_string(s, S_DB, PyBytes_AS_STRING(t->db), PyBytes_GET_SIZE(t->db))
            || !sink_string(s, S_TABLE, PyBytes_AS_STRING(t->table), PyBytes_GET_SIZE(t->table))
            || !buf_put(&s->fixed[S_OP], &OPS[e->dml_type][k], 1) || !put_i32(&s->fixed[S_ENTRY], entry_index)
            || !put_i32(&s->fixed[S_ROW], bridge_message++) || !put_i32(&s->fixed[S_PART], partition)
            || !put_i64(&s->fixed[S_OFFSET], offset) || !put_i64(&s->fixed[S_TIME], (int64_t)event_time * 1000)) {
            rc = -1;
            goto finish;
        }
        s->rows++;
    }
    rc = rc < 0 ? 0 : 1; /* walk_next's -1: an Entry for Python */
finish:
    if (rc <= 0) sink_rollback(s, &mark);
    PyMem_Free(w.datas);
    return rc;
}

/* Sink.entries(raws, start, tables, partition, offset, lossless, version) -> (next, entries, messages)
 * (LAYOUT_SINK_ENTRIES):
 * the plain DML Entries raws[start:] into the sink, in order, up to the first one it leaves to
 * Python (`next`; len(raws) when none), with the number of Entries and messages written. */
static PyObject *Sink_entries(SinkObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[0]) || !PyDict_Check(args[2]) || !PyBytes_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "entries(raws: list, start, tables: dict, partition, offset, lossless, version: bytes)");
        return NULL;
    }
    PyObject *raws = args[0], *tables = args[2], *version = args[6];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long partition = PyLong_AsLong(args[3]);
    long long offset = PyLong_AsLongLong(args[4]);
    int lossless = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || lossless < 0) return NULL;
    if (partition < INT32_MIN || partition > INT32_MAX) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(raws), i = start < 0 ? 0 : start, entries = 0, before = self->rows;
    for (; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        /* a GiB held: the caller takes the sink before the next Entry (which it converts itself) */
        if (!PyBytes_Check(raw) || i > INT32_MAX || self->data[S_BLOB].n > SINK_LIMIT) break;
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(raw), *end = p + PyBytes_GET_SIZE(raw);
        PlainEntry e;
        if (!bridge_plain_entry(p, end, &e)) break;
        PyObject *rec;
        int found = bridge_sink_table(&self->scratch, &self->key, self->last, tables, &e, &rec);
        if (found < 0) return NULL;
        if (found == 0) break;
        if (found == 2) {
            Table t;
            Py_ssize_t nkeys, *keys;
            if (!unpack_table(rec, &t) || (keys = bridge_key_indexes(t.plan, t.keys, &nkeys)) == NULL) return NULL;
            if (!bridge_sink_hold(&self->key, &self->last, &self->scratch, rec)) {
                PyMem_Free(keys);
                return NULL;
            }
            self->table = t;
            PyMem_Free(self->keys);
            self->keys = keys;
            self->nkeys = nkeys;
        }
        int rc = sink_entry(self, p, end, &e, &self->table, lossless, version, (int32_t)i, (int32_t)partition, offset);
        if (rc < 0) return NULL;
        if (rc == 0) break;
        entries++;
    }
    return Py_BuildValue("(nnn)", i, entries, self->rows - before);
}

/* Sink.take() -> a LAYOUT_SINK_TAKEN tuple (contract.SinkTaken): rows, string columns as (offsets,
 * data) for blob, shard_key, sequence_id, db, table, then op codes (uint8 OP_*), entry, row, partition (int32),
 * offset, event_time in us (int64)), all bytes in native byte order; the sink starts empty again. */
static PyObject *Sink_take(SinkObject *self, PyObject *unused) {
    PyObject *out = PyTuple_New(1 + 2 * S_STRINGS + S_FIXED);
    if (out == NULL) return NULL;
    PyTuple_SET_ITEM(out, 0, PyLong_FromSsize_t(self->rows));
    for (int i = 0; i < S_STRINGS; i++) {
        PyTuple_SET_ITEM(out, 1 + 2 * i, PyBytes_FromStringAndSize((const char *)self->offs[i].p, self->offs[i].n));
        PyTuple_SET_ITEM(out, 2 + 2 * i, PyBytes_FromStringAndSize((const char *)self->data[i].p, self->data[i].n));
    }
    for (int i = 0; i < S_FIXED; i++)
        PyTuple_SET_ITEM(out, 1 + 2 * S_STRINGS + i,
                         PyBytes_FromStringAndSize((const char *)self->fixed[i].p, self->fixed[i].n));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(out); i++)
        if (PyTuple_GET_ITEM(out, i) == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    if (!sink_reset(self)) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *Sink_len(SinkObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(self->rows);
}

static PyMethodDef Sink_methods[] = {
    {"entries", (PyCFunction)(void (*)(void))Sink_entries, METH_FASTCALL,
     "entries(raws, start, tables, partition, offset, lossless, version) -> (next, entries, messages)"},
    {"take", (PyCFunction)Sink_take, METH_NOARGS, "take() -> (rows, column buffers...), and start empty"},
    {"rows", (PyCFunction)Sink_len, METH_NOARGS, "rows held"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject bridge_SinkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bridge.native._speedups.Sink",
    .tp_basicsize = sizeof(SinkObject),
    .tp_dealloc = (destructor)Sink_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Spark's dts_to_blob output columns of plain DML Entries, written as Arrow buffers.",
    .tp_methods = Sink_methods,
    .tp_init = (initproc)Sink_init,
    .tp_new = PyType_GenericNew,
};
