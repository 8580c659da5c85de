/* Images of a DML event: one image as a dataColumn dict (Plan.rows) or as JSON (for lines.c and
 * sink.c), and the walk over the rows of a DML event. */
#include "speedups.h"

static const char *const NAME_TEXT[N_NAMES] = {"schema", "payload", "version", "dts", "dataColumn", "op",
                                                "sequenceId", "timestamp", "header", "columns", "row",
                                                "charsets", "values", "dataType",
                                                "charset", "sv", "bv", "eventTime", "checkpointTime",
                                                "systemTime"};
PyObject *bridge_names[N_NAMES]; /* interned once: the keys of every message dict */

int bridge_names_init(void) {
    for (int i = 0; i < N_NAMES; i++)
        if ((bridge_names[i] = PyUnicode_InternFromString(NAME_TEXT[i])) == NULL) return 0;
    return 1;
}

/* data_to_raw(d) of bridge/values/codecs.py: the exact fields of a Data, bv as base64; NULL on error. */
static PyObject *charset_text(Col *c, Span cs);

static PyObject *raw_dict(Col *c, const DataView *d) {
    PyObject *out = PyDict_New(), *item = NULL;
    if (out == NULL) return NULL;
    if ((item = PyLong_FromLong(d->dt)) == NULL || PyDict_SetItem(out, bridge_names[N_DATATYPE], item) < 0) goto error;
    Py_CLEAR(item);
    if (d->cs.n && ((item = charset_text(c, d->cs)) == NULL || PyDict_SetItem(out, bridge_names[N_CHARSET], item) < 0))
        goto error;
    Py_CLEAR(item);
    if (d->sv.n && ((item = PyUnicode_DecodeUTF8((const char *)d->sv.p, d->sv.n, NULL)) == NULL
                    || PyDict_SetItem(out, bridge_names[N_SV], item) < 0))
        goto error;
    Py_CLEAR(item);
    if (d->bv.n) {
        Canon b64 = {.tag = C_B64, .s = d->bv};
        if ((item = bridge_canon_object(&b64)) == NULL || PyDict_SetItem(out, bridge_names[N_BV], item) < 0) goto error;
        Py_CLEAR(item);
    }
    return out;
error:
    Py_XDECREF(item);
    Py_DECREF(out);
    return NULL;
}

/* The str of a K_TEXT value's charset (new reference): a few ASCII names are kept, process-wide
 * (the text is the value's own spelling: "gbk", "GBK" and "utf8" are three). */
static PyObject *text_charset(Span cs) {
    static PyObject *kept[8];
    static int next;
    for (int i = 0; i < 8 && kept[i] != NULL; i++)
        if (PyUnicode_GET_LENGTH(kept[i]) == cs.n && !memcmp(PyUnicode_1BYTE_DATA(kept[i]), cs.p, (size_t)cs.n)) {
            Py_INCREF(kept[i]);
            return kept[i];
        }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)cs.p, cs.n, NULL);
    if (s != NULL && PyUnicode_IS_ASCII(s) && cs.n < 32) {
        Py_XSETREF(kept[next], s);
        Py_INCREF(s);
        next = (next + 1) % 8;
    }
    return s;
}

/* The str of a text value's charset (new reference): the column's last, kept. */
static PyObject *charset_text(Col *c, Span cs) {
    if (cs.n != c->cs_text_len || memcmp(cs.p, c->cs_text, (size_t)cs.n)) {
        if (c->kind == K_TEXT) return text_charset(cs); /* K_TEXT's cs_text is charset_of's */
        if (cs.n >= (Py_ssize_t)sizeof(c->cs_text)) return PyUnicode_DecodeUTF8((const char *)cs.p, cs.n, NULL);
        memcpy(c->cs_text, cs.p, (size_t)cs.n); /* a temporal's charset: kept for the next value */
        c->cs_text_len = cs.n;
        Py_CLEAR(c->cs_obj);
    }
    if (c->cs_obj == NULL && (c->cs_obj = PyUnicode_DecodeUTF8((const char *)cs.p, cs.n, NULL)) == NULL) return NULL;
    Py_INCREF(c->cs_obj);
    return c->cs_obj;
}

/* dict[str(index)] = value (a new reference, stolen); the dict made on first use. 0 on error. */
static int index_item(PyObject **dict, Col *c, Py_ssize_t index, PyObject *value) {
    if (value == NULL) return 0;
    if ((*dict == NULL && (*dict = PyDict_New()) == NULL)
        || (c->index_text == NULL && (c->index_text = PyUnicode_FromFormat("%zd", index)) == NULL)) {
        Py_DECREF(value);
        return 0;
    }
    int rc = PyDict_SetItem(*dict, c->index_text, value);
    Py_DECREF(value);
    return rc == 0;
}

/* dataColumn dict of one image, or Py_None (new reference) for a miss; NULL on a Python error. An
 * image with extension entries (lossless) is (dataColumn, raws or None, charsets or None), the
 * parts BlobEncoder._image of bridge/blob/encode.py gives. */
PyObject *bridge_image(PlanObject *plan, const Span *datas, Py_ssize_t count) {
    if (count != plan->ncols) Py_RETURN_NONE;
    PyObject *out = _PyDict_NewPresized(count), *raws = NULL, *charsets = NULL; /* no resize while filled */
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        Col *c = &plan->cols[i];
        Canon v;
        DataView d;
        PyObject *obj;
        switch (bridge_classify(c, datas[i], &v, &d)) {
        case V_MISS: goto miss;
        case V_SKIP: continue;
        case V_NULL:
            obj = Py_None;
            Py_INCREF(obj);
            break;
        default:
            if (v.extra == X_CHANGED && !plan->lossless) goto miss;
            obj = bridge_canon_object(&v);
            if (obj == NULL) {
                if (PyErr_Occurred()) goto error;
                goto miss;
            }
            if (plan->lossless && v.extra == X_CHARSET && !index_item(&charsets, c, i, charset_text(c, d.cs))) {
                Py_DECREF(obj);
                goto error;
            }
            if (plan->lossless && v.extra >= X_RAW && !index_item(&raws, c, i, raw_dict(c, &d))) {
                Py_DECREF(obj);
                goto error;
            }
        }
        int rc = PyDict_SetItem(out, c->name, obj);
        Py_DECREF(obj);
        if (rc < 0) goto error;
    }
    if (raws == NULL && charsets == NULL) return out;
    PyObject *parts = Py_BuildValue("(NOO)", out, raws ? raws : Py_None, charsets ? charsets : Py_None);
    Py_XDECREF(raws);
    Py_XDECREF(charsets);
    return parts;
miss:
    Py_DECREF(out);
    Py_XDECREF(raws);
    Py_XDECREF(charsets);
    Py_RETURN_NONE;
error:
    Py_DECREF(out);
    Py_XDECREF(raws);
    Py_XDECREF(charsets);
    return NULL;
}


/* orjson's `{"dataType":13,"charset":"utf8mb4","bv":"..."}` of data_to_raw(d): 1, 0 a miss, -1 */
static int raw_json(Buf *b, const DataView *d) {
    char digits[24];
    if (!buf_put(b, "{\"dataType\":", 12) || !buf_put(b, digits, bridge_int_text(d->dt, digits))) return -1;
    int rc = 1;
    if (d->cs.n && (!buf_put(b, ",\"charset\":", 11) || (rc = bridge_json_string(b, d->cs.p, d->cs.n)) <= 0))
        return rc <= 0 ? rc : -1;
    if (d->sv.n && (!buf_put(b, ",\"sv\":", 6) || (rc = bridge_json_string(b, d->sv.p, d->sv.n)) <= 0))
        return rc <= 0 ? rc : -1;
    if (d->bv.n) {
        Canon b64 = {.tag = C_B64, .s = d->bv};
        if (!buf_put(b, ",\"bv\":", 6) || bridge_canon_json(b, &b64) <= 0) return -1;
    }
    return buf_put(b, "}", 1) ? 1 : -1;
}

/* `"index":` into an extras buffer, after a comma when it holds a member already */
static int index_key(Buf *b, Py_ssize_t index) {
    char digits[24];
    Py_ssize_t nd = bridge_int_text(index, digits);
    return (!b->n || buf_put(b, ",", 1)) && buf_put(b, "\"", 1) && buf_put(b, digits, nd) && buf_put(b, "\":", 2);
}

/* A value's extension entry: 1, 0 a miss (strict and changed; lossless without `x`), -1 error. */
static int value_extras(const PlanObject *plan, const Canon *v, const DataView *d, Py_ssize_t index, Extras *x) {
    if (v->extra == X_NONE) return 1;
    if (!plan->lossless) return v->extra != X_CHANGED;
    if (x == NULL) return 0;
    if (v->extra == X_CHARSET) {
        if (!index_key(&x->charsets, index)) return -1;
        return bridge_json_string(&x->charsets, d->cs.p, d->cs.n);
    }
    if (!index_key(&x->values, index)) return -1;
    return raw_json(&x->values, d);
}

/* dataColumn JSON object of one image into b: 1 written, 0 a miss, -1 error. `spans`, when
 * given (2 per column), gets each value's [start, end) in b, or -1 for a column left out (NA);
 * `written` the number of values written; `x` (emptied first) the image's extension entries in
 * lossless mode (NULL: an image that needs any is a miss). */
int bridge_image_json(PlanObject *plan, Buf *b, const Span *datas, Py_ssize_t count, Py_ssize_t *spans,
                      Py_ssize_t *written, Extras *x) {
    if (count != plan->ncols) return 0;
    int first = 1;
    *written = 0;
    if (x) x->charsets.n = x->values.n = 0;
    if (!buf_put(b, "{", 1)) return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        Col *c = &plan->cols[i];
        Canon v;
        DataView d;
        int kind = bridge_classify(c, datas[i], &v, &d);
        if (kind == V_MISS) return 0;
        if (spans) spans[2 * i] = -1;
        if (kind == V_SKIP) continue;
        int rc = (first || buf_put(b, ",", 1)) && buf_put(b, c->key, c->key_len) ? 1 : -1;
        first = 0;
        (*written)++;
        if (spans) spans[2 * i] = b->n;
        if (rc > 0 && kind == V_NULL) {
            rc = buf_put(b, "null", 4) ? 1 : -1;
        } else if (rc > 0) {
            rc = value_extras(plan, &v, &d, i, x);
            if (rc > 0) rc = bridge_canon_json(b, &v);
        }
        if (rc <= 0) return rc;
        if (spans) spans[2 * i + 1] = b->n;
    }
    return buf_put(b, "}", 1) ? 1 : -1;
}

/* Drop a partial result: None (a new reference), for Python to convert the Entry. */
PyObject *bridge_give_way(PyObject *partial) {
    Py_XDECREF(partial);
    Py_RETURN_NONE;
}


/* 1 (the Entry's DML event is found), 0 (leave the Entry to Python) or -1 (memory error) */
int bridge_walk_start(Walk *w, const uint8_t *start, const uint8_t *end, int dml_type, Py_ssize_t ncols) {
    Span event, dml;
    w->datas = NULL;
    if (dml_type < DML_INSERT || dml_type > DML_DELETE || !bridge_dml_span(start, end, &event, &dml)) return 0;
    w->p = w->base = w->row_at = dml.p;
    w->end = dml.p + dml.n;
    w->use = dml_type == DML_INSERT ? 1u << F_ROWCHANGE_NEWCOLUMNS
             : dml_type == DML_UPDATE ? 1u << F_ROWCHANGE_OLDCOLUMNS | 1u << F_ROWCHANGE_NEWCOLUMNS
                                      : 1u << F_ROWCHANGE_OLDCOLUMNS;
    w->which = WALK_NEXT_ROW;
    w->index = -1;
    w->cap = ncols + 1;
    w->datas = PyMem_Malloc(sizeof(Span) * (size_t)w->cap);
    if (w->datas == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 1;
}

/* The next image the ops use into w->datas and *count (0 for a row without it; more than the
 * columns possible): 1; 0 at the end of the event; -1 for an Entry the C path leaves to Python
 * (malformed bytes, row properties, an image the op must not carry). */
int bridge_walk_next(Walk *w, Py_ssize_t *count) {
    for (;;) {
        while (w->which < WALK_NEXT_ROW) {
            uint32_t which = w->which++;
            if (!bridge_row_datas(w->row, which, w->datas, w->cap, count)) return -1;
            if (w->use & (1u << which)) return 1;
            if (*count) return -1; /* INSERT with a before image, DELETE with an after one */
        }
        if (w->p >= w->end) return 0;
        const uint8_t *at = w->p;
        uint64_t tag;
        if (!read_tag(&w->p, w->end, &tag)) return -1;
        int wt = TAG_WT(tag);
        if (TAG_FIELD(tag) != F_DMLEVENT_ROWS) {
            if (!skip_field(&w->p, w->end, wt)) return -1;
            continue;
        }
        if (wt != WT_LEN || !read_span(&w->p, w->end, &w->row)) return -1;
        /* row properties send the Entry to the Python path */
        const uint8_t *q = w->row.p, *rend = w->row.p + w->row.n;
        while (q < rend) {
            uint64_t rtag;
            if (!read_tag(&q, rend, &rtag) || TAG_FIELD(rtag) == F_ROWCHANGE_PROPERTIES
                || !skip_field(&q, rend, TAG_WT(rtag)))
                return -1;
        }
        w->which = F_ROWCHANGE_OLDCOLUMNS;
        w->index++;
        w->row_at = at;
    }
}

/* Continue a walk at a resume point a previous walk of the same bytes gave: (row index, offset
 * of its field in the DMLEvent). 1, or 0 with a Python error for a point outside the event. */
int bridge_walk_resume(Walk *w, PyObject *resume) {
    long long index;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(resume, "Ln:resume", &index, &offset)) return 0;
    if (index < 0 || offset < 0 || offset > w->end - w->base) {
        PyErr_SetString(PyExc_ValueError, "a resume point outside the DML event");
        return 0;
    }
    w->p = w->row_at = w->base + offset;
    w->index = index - 1;
    w->which = WALK_NEXT_ROW;
    return 1;
}

/* Append a new reference (NULL: a Python error is set) to *list: 1, or 0 with *list cleared. */
int bridge_append_stolen(PyObject **list, PyObject *item) {
    int failed = item == NULL || PyList_Append(*list, item) < 0;
    Py_XDECREF(item);
    if (failed) Py_CLEAR(*list);
    return !failed;
}

/* What a walk that ended with rc (walk_start's or walk_next's) gives: its list; NULL on a Python
 * error; None, for the Python path, where C gave way (rc < 0) or found no DML event. */
PyObject *bridge_walk_result(int rc, PyObject *result) {
    if (rc < 0 && PyErr_Occurred()) {
        Py_XDECREF(result);
        return NULL;
    }
    if (rc < 0 || (rc == 0 && result == NULL)) {
        Py_XDECREF(result);
        Py_RETURN_NONE;
    }
    return result;
}

/* Plan.rows(entry_bytes, dml_type): the images the ops of dml_type need, row by row (INSERT: after;
 * UPDATE: before, after; DELETE: before); None for an Entry with row properties, an image the
 * op must not have, or malformed bytes. */
PyObject *bridge_Plan_rows(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "rows(entry_bytes, dml_type)");
        return NULL;
    }
    int dml_type = PyLong_AsLong(args[1]);
    if (dml_type == -1 && PyErr_Occurred()) return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    Walk w;
    int rc = bridge_walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (rc <= 0) goto finish;
    if ((result = PyList_New(0)) == NULL) goto done;
    Py_ssize_t count;
    while ((rc = bridge_walk_next(&w, &count)) == 1)
        if (!bridge_append_stolen(&result, count ? bridge_image(self, w.datas, count) : (Py_INCREF(Py_None), Py_None)))
            goto done;
finish:
    result = bridge_walk_result(rc, result);
done:
    PyMem_Free(w.datas);
    PyBuffer_Release(&buf);
    return result;
}
