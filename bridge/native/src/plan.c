/* The Plan type: one per column set, built from contract.PlanColumn tuples (LAYOUT_PLAN_COLUMN);
 * its methods live with their jobs (rows.c, tuples.c, lines.c, decode.c). */
#include "speedups.h"

static void free_cols(Col *cols, Py_ssize_t n) {
    if (cols == NULL) return;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(cols[i].name);
        Py_XDECREF(cols[i].index_text);
        Py_XDECREF(cols[i].cs_obj);
        PyMem_Free(cols[i].key);
    }
    PyMem_Free(cols);
}

static void Plan_dealloc(PlanObject *self) {
    free_cols(self->cols, self->ncols);
    Py_XDECREF(self->decimal);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Plan(columns, lossless=True, decimal=None): columns is a sequence of LAYOUT_PLAN_COLUMN tuples
 * (contract.PlanColumn: name, kind, dataType, lo, hi, charset, fsp, need_bv[, out]); `lossless`: the
 * options' mode (what values the Blob value cannot hold cost); `decimal` (the Decimal type) makes a
 * Tuple plan, whose columns say their O_* `out`. */
static int Plan_init(PlanObject *self, PyObject *args, PyObject *kwds) {
    PyObject *columns, *decimal = Py_None;
    int lossless = 1;
    static char *kwlist[] = {"columns", "lossless", "decimal", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|pO:Plan", kwlist, &columns, &lossless, &decimal)) return -1;
    self->lossless = lossless;
    Py_CLEAR(self->decimal);
    if (decimal != Py_None) {
        if (!PyCallable_Check(decimal)) {
            PyErr_SetString(PyExc_TypeError, "Plan(): decimal is the Decimal type");
            return -1;
        }
        Py_INCREF(decimal);
        self->decimal = decimal;
    }
    PyObject *seq = PySequence_Fast(columns, "Plan() needs a sequence of column tuples");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Col *cols = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Col));
    if (cols == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *name, *lo, *hi;
        const char *charset;
        Py_ssize_t charset_len;
        Col *c = &cols[i];
        if (!PyArg_ParseTuple(item, "UiiOOs#ip|i:Plan column", &name, &c->kind, &c->dt, &lo, &hi, &charset,
                              &charset_len, &c->fsp, &c->need_bv, &c->out))
            goto fail;
        int temporal = c->kind >= K_DATE;
        if (c->kind < K_LONG || c->kind > K_TIMESTAMP || c->dt <= DT_NIL || c->dt >= DT_NA
            || charset_len >= (Py_ssize_t)sizeof(c->charset) || c->fsp < 0 || c->fsp > 6
            || (self->decimal == NULL ? c->out != O_SAME
                                      : (temporal != (c->out == O_MICROS)
                                         || (c->out == O_DECIMAL && c->kind != K_DIGITS && c->kind != K_DECIMAL)
                                         || (c->out == O_FLOAT32 && c->kind != K_DOUBLE)
                                         || (c->out == O_HEX && c->kind != K_BASE64) || c->out > O_HEX))) {
            PyErr_Format(PyExc_ValueError, "bad Plan column %zd", i);
            goto fail;
        }
        memcpy(c->charset, charset, (size_t)charset_len);
        c->charset_len = charset_len;
        if (c->kind == K_LONG) {
            c->lo = PyLong_AsLongLong(lo);
            if (c->lo == -1 && PyErr_Occurred()) goto fail;
            c->hi = PyLong_AsLongLong(hi);
            if (c->hi == -1 && PyErr_Occurred()) goto fail;
        } else if (c->kind == K_DIGITS) {
            c->uhi = PyLong_AsUnsignedLongLong(hi);
            if (c->uhi == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
        }
        Py_INCREF(name);
        c->name = name;
        Py_ssize_t utf8_len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(name, &utf8_len);
        if (utf8 == NULL) goto fail;
        Buf kb = {NULL, 0, 0};
        int rc = bridge_json_string(&kb, (const uint8_t *)utf8, utf8_len);
        if (rc == 1 && !buf_put(&kb, ":", 1)) rc = -1;
        if (rc != 1) {
            PyMem_Free(kb.p);
            if (rc == 0) PyErr_Format(PyExc_ValueError, "column name %zd is not UTF-8", i);
            goto fail;
        }
        c->key = (char *)kb.p;
        c->key_len = kb.n;
    }
    /* names repeated in schema.dataColumn: Plan.encode counts each dataColumn key once */
    PyObject *seen = PySet_New(NULL);
    if (seen == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = PySet_Contains(seen, cols[i].name);
        if (rc < 0 || (rc == 0 && PySet_Add(seen, cols[i].name) < 0)) {
            Py_DECREF(seen);
            goto fail;
        }
        cols[i].dup = rc;
    }
    Py_DECREF(seen);
    Py_DECREF(seq);
    free_cols(self->cols, self->ncols);
    self->cols = cols;
    self->ncols = n;
    return 0;
fail:
    free_cols(cols, n);
    Py_DECREF(seq);
    return -1;
}

static PyObject *Plan_len(PlanObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(self->ncols);
}

static PyMethodDef Plan_methods[] = {
    {"rows", (PyCFunction)(void (*)(void))bridge_Plan_rows, METH_FASTCALL,
     "rows(entry_bytes, dml_type) -> the dataColumn dict of each image the ops use, row by row "
     "(None: not sure), or None for an Entry to convert in Python"},
    {"lines", (PyCFunction)(void (*)(void))bridge_Plan_lines, METH_FASTCALL,
     "lines(entry_bytes, dml_type, pre, post, seq_prefix, seq_pad, post_seq, nrows_text[, keys[, resume, stop]]) -> "
     "[Blob JSON line, ...] (with keys, a column-index tuple: ([line, ...], [shard key JSON or None, ...])), "
     "or None for an Entry to convert in Python; with resume (None or a point a previous call gave) and stop "
     "(a row index, -1: none), the rows from there to stop, as (lines, the next resume point or None)"},
    {"messages", (PyCFunction)(void (*)(void))bridge_Plan_messages, METH_FASTCALL,
     "messages(entry_bytes, dml_type, schema, image_keys, ops, seq_prefix, seq_pad, stamp, version, ext_header, "
     "ext_columns, quiet, nrows) -> the Blob message dicts of a plain DML Entry, or None for Python to decide"},
    {"encode", (PyCFunction)(void (*)(void))bridge_Plan_encode, METH_FASTCALL,
     "encode(values, field, raws, charsets) -> the Data of one image as RowChange field 1 or 2 on the "
     "wire (raws, charsets: the lossless extension's dts.values and dts.charsets, or None), or None for "
     "values the Python codecs must judge"},
    {"lane", (PyCFunction)(void (*)(void))bridge_Plan_lane, METH_FASTCALL,
     "lane(payload, ext, image, field, source, dml_type, columns) -> (entry, row, row_index, nrows): the "
     "usual Blob DML message as its Entry's bytes without rows and its RowChange's bytes, or None for "
     "the Python path to decide"},
    {"tuples", (PyCFunction)(void (*)(void))bridge_Plan_tuples, METH_FASTCALL,
     "tuples(entry_bytes, dml_type, seq_key, seq_base, metas) -> a Tuple plan's rows of a DML Entry "
     "image by image (None: Python converts that image), or None for an Entry to convert in Python"},
    {"columns", (PyCFunction)Plan_len, METH_NOARGS, "number of columns"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject bridge_PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bridge.native._speedups.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-column-set converter of canonical DML row images on an Entry's wire bytes.",
    .tp_methods = Plan_methods,
    .tp_init = (initproc)Plan_init,
    .tp_new = PyType_GenericNew,
};
