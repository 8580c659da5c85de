/* Tuple rows (bridge/tuple/encode.py: TupleEncoder): the same walk as rows.c, Tuple values, the
 * meta columns (Plan.tuples). */
#include "speedups.h"

/* The Tuple value of one checked value (new reference); NULL with no Python error set for a miss:
 * a zero or invalid date and a date beyond TIMESTAMP's range (the temporal policies count them in
 * Python), a FLOAT that float32 cannot hold, bytes that do not decode. */
static PyObject *tuple_object(PlanObject *plan, const Col *c, const Canon *v) {
    switch (c->out) {
    case O_DECIMAL: {
        PyObject *text = bridge_ascii_str(v->s.p, v->s.n);
        if (text == NULL) return NULL;
        PyObject *dec = PyObject_CallOneArg(plan->decimal, text);
        Py_DECREF(text);
        return dec;
    }
    case O_FLOAT32: {
        PyObject *f = bridge_canon_object(v);
        if (f == NULL) return NULL;
        float single = (float)PyFloat_AS_DOUBLE(f); /* struct.pack("<f") rounds the same way */
        Py_DECREF(f);
        if (isinf(single)) return NULL; /* float32's OverflowError: Python names it */
        return PyFloat_FromDouble((double)single);
    }
    case O_MICROS:
        if (v->tag != C_INT || v->us > TUPLE_TS_HI) return NULL;
        return PyLong_FromLongLong(v->us);
    case O_HEX: {
        static const char HEX[] = "0123456789abcdef";
        PyObject *s = PyUnicode_New(v->s.n * 2, 127);
        if (s == NULL) return NULL;
        Py_UCS1 *o = PyUnicode_1BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < v->s.n; i++) {
            *o++ = (Py_UCS1)HEX[v->s.p[i] >> 4];
            *o++ = (Py_UCS1)HEX[v->s.p[i] & 15];
        }
        return s;
    }
    default:
        if (v->tag == C_NULL) return NULL; /* a zero date under a text kind cannot happen; be sure */
        return bridge_canon_object(v);
    }
}

/* The Tuple row of one image: its columns' values, then seq_key: seq, then `meta`'s items; with
 * values C is not sure of, (row with None in their place, [their column indexes]) for Python to
 * fill (a value a temporal policy substitutes is one: Python counts it); Py_None (new reference)
 * for an image of another number of values; NULL on a Python error. */
static PyObject *tuple_image(PlanObject *plan, const Span *datas, Py_ssize_t count, PyObject *seq_key,
                             PyObject *seq, PyObject *meta) {
    if (count != plan->ncols) Py_RETURN_NONE;
    PyObject *out = _PyDict_NewPresized(count + PyDict_GET_SIZE(meta) + 1), *holes = NULL;
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        Col *c = &plan->cols[i];
        Canon v;
        DataView d;
        PyObject *obj = NULL;
        int rc = bridge_classify(c, datas[i], &v, &d);
        if (rc == V_VALUE) {
            obj = tuple_object(plan, c, &v);
            if (obj == NULL && PyErr_Occurred()) goto error;
        } else if (rc != V_MISS) { /* NIL and a bare NA: a Tuple row has every field */
            obj = Py_None;
            Py_INCREF(obj);
        }
        if (obj == NULL) { /* a hole: None in its place, its index for Python */
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || (holes == NULL && (holes = PyList_New(0)) == NULL)) {
                Py_XDECREF(index);
                goto error;
            }
            rc = PyList_Append(holes, index);
            Py_DECREF(index);
            if (rc < 0) goto error;
            obj = Py_None;
            Py_INCREF(obj);
        }
        rc = PyDict_SetItem(out, c->name, obj);
        Py_DECREF(obj);
        if (rc < 0) goto error;
    }
    if (PyDict_SetItem(out, seq_key, seq) < 0 || PyDict_Merge(out, meta, 1) < 0) goto error;
    if (holes == NULL) return out;
    return Py_BuildValue("(NN)", out, holes);
error:
    Py_DECREF(out);
    Py_XDECREF(holes);
    return NULL;
}

/* Plan.tuples(entry_bytes, dml_type, seq_key, seq_base, metas): the Tuple rows of a DML
 * Entry, image by image in the order `images` of the DML type gives them (bridge.tuple.ROW_IMAGES),
 * each a dict, (dict, [indexes of the values Python fills]) or Py_None for an image Python must
 * convert; None for the whole Entry. The sequence id is str(seq_base + row index); metas: a tuple of
 * dicts, the other meta columns of each image of a row. */
PyObject *bridge_Plan_tuples(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "tuples(entry_bytes, dml_type, seq_key, seq_base, metas)");
        return NULL;
    }
    if (self->decimal == NULL) {
        PyErr_SetString(PyExc_TypeError, "tuples() needs a Tuple plan");
        return NULL;
    }
    int dml_type = PyLong_AsLong(args[1]);
    if (dml_type == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq_key = args[2], *metas = args[4];
    Py_ssize_t nmeta = PyTuple_GET_SIZE(metas);
    if (nmeta != (dml_type == DML_UPDATE ? 2 : 1)) {
        PyErr_SetString(PyExc_ValueError, "tuples(): one meta dict per image of the DML type");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < nmeta; k++)
        if (!PyDict_Check(PyTuple_GET_ITEM(metas, k))) {
            PyErr_SetString(PyExc_TypeError, "tuples(): metas are dicts");
            return NULL;
        }
    int overflow;
    long long base = PyLong_AsLongLongAndOverflow(args[3], &overflow);
    if (base == -1 && PyErr_Occurred()) return NULL;
    if (overflow || base < 0) Py_RETURN_NONE; /* a seqId beyond 63 bits: Python */
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *seq = NULL;
    Walk w;
    int rc = bridge_walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (rc <= 0) goto finish;
    if ((result = PyList_New(0)) == NULL) goto done;
    Py_ssize_t count, k = 0;
    long long seq_row = -1;
    while ((rc = bridge_walk_next(&w, &count)) == 1) {
        if (w.index != seq_row) {
            seq_row = w.index;
            Py_CLEAR(seq);
            char digits[24];
            if (base > LLONG_MAX - seq_row) {
                rc = -1; /* Python writes the big number */
                break;
            }
            seq = bridge_ascii_str((const uint8_t *)digits, bridge_int_text(base + seq_row, digits));
            if (seq == NULL) {
                Py_CLEAR(result);
                goto done;
            }
        }
        PyObject *meta = PyTuple_GET_ITEM(metas, k++ % nmeta);
        if (!bridge_append_stolen(&result, count ? tuple_image(self, w.datas, count, seq_key, seq, meta)
                                          : (Py_INCREF(Py_None), Py_None)))
            goto done;
    }
finish:
    result = bridge_walk_result(rc, result);
done:
    Py_XDECREF(seq);
    PyMem_Free(w.datas);
    PyBuffer_Release(&buf);
    return result;
}
