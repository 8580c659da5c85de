/* pages.c: a DataHub Blob GetRecords answer (GetRecordsResponse bytes, pydatahub's
 * datahub_record_proto_pb fields) made into the records `sync --to dts`'s source hands on, in one
 * pass over the wire bytes (bridge/datahub/source.py, `_records_of`).
 *
 * blob_page(pb, key, topic, shard, next, now, record) -> (out, next_cursor, records) or None.
 * `out` holds, for each record at or after sequence `next`, in the answer's order, the tuple
 * (key, sequence, record(topic, shard, sequence, system_time, attributes, data, None, None, now),
 * attributes); `records` counts the answer's records (those before `next` too). The reference is
 * prefetch.py's `_rows_of` (protobuf's own parse, upb) followed by `_records_of`'s loop, and this
 * gives what they give: a field seen twice keeps the last value, the singular messages `attributes`
 * and `data` seen twice are merged (their lists joined), a later key of the attributes wins, the
 * data is the first FieldData's value (b"" when it has none), absent fields are their defaults,
 * unknown fields and known ones of another wire type are skipped. Wherever it is not sure of
 * that (malformed bytes, a group, text that is no strict UTF-8, a record without FieldData, where
 * protobuf or `_rows_of` would raise or give bytes for a str) it returns None and the caller takes
 * the reference path, which decides (tests/test_blob_page.py compares the two). */
#include "speedups.h"

/* The texts of one answer already made (attribute keys and values repeat: "dts.topic", its value),
 * by their bytes, so that each is one str object, as `_rows_of`'s `same` shares them. */
#define SEEN_SLOTS 8
typedef struct {
    const uint8_t *p[SEEN_SLOTS];
    Py_ssize_t n[SEEN_SLOTS];
    PyObject *obj[SEEN_SLOTS];
    int hits[SEEN_SLOTS];
    int used, next;
} Seen;

static void seen_clear(Seen *s) {
    for (int i = 0; i < s->used; i++) Py_DECREF(s->obj[i]);
    s->used = s->next = 0;
}

/* 1 and a new reference in *out for strict UTF-8 text; 0 (no exception) for bytes that are not;
 * -1 with an exception. A text made here is kept in a free slot, else in place of one never
 * asked for again (a record's own dts.pos), else not kept. */
static int text_of(Seen *s, Span t, PyObject **out) {
    for (int i = 0; i < s->used; i++) {
        if (s->n[i] == t.n && memcmp(s->p[i], t.p, (size_t)t.n) == 0) {
            s->hits[i]++;
            Py_INCREF(s->obj[i]);
            *out = s->obj[i];
            return 1;
        }
    }
    const uint8_t *p = t.p, *end = t.p + t.n;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        int len = utf8_seq(p, end);
        if (len == 0) return 0;
        p += len;
    }
    PyObject *o = PyUnicode_DecodeUTF8((const char *)t.p, t.n, NULL);
    if (o == NULL) return -1;
    int slot = -1;
    if (s->used < SEEN_SLOTS) {
        slot = s->used++;
    } else {
        for (int k = 0; k < SEEN_SLOTS; k++) {
            int i = (s->next + k) % SEEN_SLOTS;
            if (s->hits[i] == 0) {
                slot = i;
                s->next = (i + 1) % SEEN_SLOTS;
                Py_DECREF(s->obj[i]);
                break;
            }
        }
    }
    if (slot >= 0) {
        s->p[slot] = t.p;
        s->n[slot] = t.n;
        s->hits[slot] = 0;
        Py_INCREF(o);
        s->obj[slot] = o;
    }
    *out = o;
    return 1;
}

/* Skip a field of wire type wt; 0 for malformed bytes and groups (not sure: the reference decides). */
static int skip(const uint8_t **pp, const uint8_t *end, int wt) {
    return wt != WT_SGROUP && wt != WT_EGROUP && skip_field(pp, end, wt);
}

/* A StringPair into attrs (key and value last-wins, "" when absent): 1, 0 not sure, -1 error */
static int read_pair(Span m, Seen *seen, PyObject *attrs) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    Span key = {(const uint8_t *)"", 0}, value = {(const uint8_t *)"", 0};
    while (p < end) {
        uint64_t tag;
        if (!read_tag(&p, end, &tag)) return 0;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if ((field == 1 || field == 2) && wt == WT_LEN) {
            if (!read_span(&p, end, field == 1 ? &key : &value)) return 0;
        } else if (!skip(&p, end, wt)) {
            return 0;
        }
    }
    PyObject *k, *v;
    int got = text_of(seen, key, &k);
    if (got <= 0) return got;
    got = text_of(seen, value, &v);
    if (got <= 0) {
        Py_DECREF(k);
        return got;
    }
    int rc = PyDict_SetItem(attrs, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    return rc < 0 ? -1 : 1;
}

/* The next field 1 (length-delimited) of a message into *s, any other field skipped: 1, 0 at the
 * message's end, -1 malformed or a group (not sure) */
static int next_one(const uint8_t **pp, const uint8_t *end, Span *s) {
    while (*pp < end) {
        uint64_t tag;
        if (!read_tag(pp, end, &tag)) return -1;
        int wt = TAG_WT(tag);
        if (TAG_FIELD(tag) == 1 && wt == WT_LEN) return read_span(pp, end, s) ? 1 : -1;
        if (!skip(pp, end, wt)) return -1;
    }
    return 0;
}

/* A RecordAttributes message's pairs into attrs, in order: 1, 0 not sure, -1 error */
static int read_attributes(Span m, Seen *seen, PyObject *attrs) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    Span pair;
    int more;
    while ((more = next_one(&p, end, &pair)) == 1) {
        int got = read_pair(pair, seen, attrs);
        if (got <= 0) return got;
    }
    return more == 0;
}

/* A FieldData's value (last-wins, empty when absent): 1, 0 not sure */
static int read_field_data(Span m, Span *value) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    Span s;
    int more;
    value->p = (const uint8_t *)"";
    value->n = 0;
    while ((more = next_one(&p, end, &s)) == 1) *value = s;
    return more == 0;
}

/* A RecordData message: the first FieldData's value into *data unless *have (then set *have);
 * every FieldData is still checked. 1, 0 not sure */
static int read_record_data(Span m, Span *data, int *have) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    Span fd, value;
    int more;
    while ((more = next_one(&p, end, &fd)) == 1) {
        if (!read_field_data(fd, &value)) return 0;
        if (!*have) {
            *data = value;
            *have = 1;
        }
    }
    return more == 0;
}

/* One RecordEntry: *seq, *time, the attributes dict (a new reference in *attrs) and the data
 * span. 1, 0 not sure, -1 error */
static int read_entry(Span m, Seen *seen, int64_t *seq, int64_t *time, PyObject **attrs, Span *data) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    int have = 0;
    *seq = *time = 0;
    PyObject *d = PyDict_New();
    if (d == NULL) return -1;
    while (p < end) {
        uint64_t tag, v;
        if (!read_tag(&p, end, &tag)) goto unsure;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if ((field == 6 || field == 7) && wt == WT_VARINT) {
            if (!read_varint(&p, end, &v)) goto unsure;
            *(field == 6 ? seq : time) = (int64_t)v;
        } else if (field == 8 && wt == WT_LEN) {
            Span a;
            if (!read_span(&p, end, &a)) goto unsure;
            int got = read_attributes(a, seen, d);
            if (got < 0) goto error;
            if (got == 0) goto unsure;
        } else if (field == 9 && wt == WT_LEN) {
            Span r;
            if (!read_span(&p, end, &r) || !read_record_data(r, data, &have)) goto unsure;
        } else if (!skip(&p, end, wt)) {
            goto unsure;
        }
    }
    if (!have) goto unsure; /* `data.data[0]`: the reference raises IndexError */
    *attrs = d;
    return 1;
unsure:
    Py_DECREF(d);
    return 0;
error:
    Py_DECREF(d);
    return -1;
}

/* The answer's records (tag 4) and next_cursor (tag 1, last-wins); the records are read twice:
 * once to know the whole answer is sure (nothing made), then made. */
PyObject *bridge_blob_page(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "blob_page(pb, key, topic, shard, next, now, record) takes 7 arguments");
        return NULL;
    }
    if (!PyBytes_CheckExact(args[0])) { /* (bytes cannot change while `record` runs; other buffers: the reference) */
        if (PyObject_CheckBuffer(args[0])) Py_RETURN_NONE;
        PyErr_SetString(PyExc_TypeError, "blob_page: pb must be bytes");
        return NULL;
    }
    int overflow = 0;
    long long next = PyLong_AsLongLongAndOverflow(args[4], &overflow);
    if (next == -1 && PyErr_Occurred()) return NULL;
    if (overflow) Py_RETURN_NONE; /* a position outside int64: the reference compares Python ints */
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *key = args[1], *topic = args[2], *shard = args[3], *now = args[5], *record = args[6];
    const uint8_t *start = (const uint8_t *)view.buf, *end = start + view.len, *p = start;
    Span cursor = {(const uint8_t *)"", 0};
    Py_ssize_t count = 0;
    PyObject *out = NULL, *result = NULL, *cursor_obj = NULL;
    Seen seen;
    seen.used = seen.next = 0;
    /* first pass: the wire, the next cursor, the count */
    while (p < end) {
        uint64_t tag;
        if (!read_tag(&p, end, &tag)) goto unsure;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if ((field == 1 || field == 4) && wt == WT_LEN) {
            Span s;
            if (!read_span(&p, end, &s)) goto unsure;
            if (field == 1) cursor = s;
            else count++;
        } else if (!skip(&p, end, wt)) {
            goto unsure;
        }
    }
    int got = text_of(&seen, cursor, &cursor_obj);
    if (got < 0) goto done;
    if (got == 0) goto unsure;
    out = PyList_New(0);
    if (out == NULL) goto done;
    p = start;
    while (p < end) {
        uint64_t tag = 0;
        if (!read_tag(&p, end, &tag)) goto unsure; /* (read in the first pass: cannot fail) */
        int wt = TAG_WT(tag);
        if (TAG_FIELD(tag) != 4 || wt != WT_LEN) {
            if (!skip(&p, end, wt)) goto unsure;
            continue;
        }
        Span m = {(const uint8_t *)"", 0};
        if (!read_span(&p, end, &m)) goto unsure;
        int64_t seq, time;
        PyObject *attrs = NULL;
        Span data = {(const uint8_t *)"", 0};
        got = read_entry(m, &seen, &seq, &time, &attrs, &data);
        if (got < 0) goto done;
        if (got == 0) goto unsure;
        if (seq < next) { /* a cursor placed before the position: already handed on */
            Py_DECREF(attrs);
            continue;
        }
        PyObject *seq_obj = PyLong_FromLongLong(seq);
        PyObject *time_obj = PyLong_FromLongLong(time);
        PyObject *data_obj = PyBytes_FromStringAndSize((const char *)data.p, data.n);
        PyObject *rec = NULL, *item = NULL;
        if (seq_obj != NULL && time_obj != NULL && data_obj != NULL) {
            PyObject *call[9] = {topic, shard, seq_obj, time_obj, attrs, data_obj, Py_None, Py_None, now};
            rec = PyObject_Vectorcall(record, call, 9, NULL);
        }
        if (rec != NULL) item = PyTuple_Pack(4, key, seq_obj, rec, attrs);
        Py_XDECREF(seq_obj);
        Py_XDECREF(time_obj);
        Py_XDECREF(data_obj);
        Py_XDECREF(rec);
        Py_DECREF(attrs);
        if (item == NULL) goto done;
        int rc = PyList_Append(out, item);
        Py_DECREF(item);
        if (rc < 0) goto done;
    }
    result = Py_BuildValue("(OOn)", out, cursor_obj, count);
    goto done;
unsure:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(out);
    Py_XDECREF(cursor_obj);
    seen_clear(&seen);
    PyBuffer_Release(&view);
    return result;
}

/* pos_stream(pos, topic, source_topic) -> (stream, order, group) of a record whose dts.pos is
 * "p:o:e:r" in ASCII digits (each 1 to 18 of them), as bridge/stream/shards.py's `stream_of` makes
 * them: (("pos", topic, source_topic, p), (o, e, r), (o, e)); None for anything else (not a str,
 * another shape, a sign, other digits, longer numbers), which `stream_of` then reads itself. */
static PyObject *POS_TEXT = NULL;

PyObject *bridge_pos_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pos_stream(pos, topic, source_topic) takes 3 arguments");
        return NULL;
    }
    if (!PyUnicode_CheckExact(args[0]) || !PyUnicode_IS_ASCII(args[0])) Py_RETURN_NONE;
    const char *p = (const char *)PyUnicode_DATA(args[0]);
    Py_ssize_t n = PyUnicode_GET_LENGTH(args[0]);
    long long v[4];
    int k = 0;
    Py_ssize_t i = 0;
    for (; k < 4; k++) {
        Py_ssize_t digits = 0;
        long long x = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            if (++digits > 18) Py_RETURN_NONE;
            x = x * 10 + (p[i] - '0');
            i++;
        }
        if (digits == 0) Py_RETURN_NONE;
        v[k] = x;
        if (k < 3) {
            if (i >= n || p[i] != ':') Py_RETURN_NONE;
            i++;
        }
    }
    if (i != n) Py_RETURN_NONE;
    if (POS_TEXT == NULL && (POS_TEXT = PyUnicode_InternFromString("pos")) == NULL) return NULL;
    PyObject *ints[4] = {NULL, NULL, NULL, NULL};
    PyObject *stream = NULL, *order = NULL, *group = NULL, *out = NULL;
    for (k = 0; k < 4; k++)
        if ((ints[k] = PyLong_FromLongLong(v[k])) == NULL) goto done;
    stream = PyTuple_Pack(4, POS_TEXT, args[1], args[2], ints[0]);
    order = PyTuple_Pack(3, ints[1], ints[2], ints[3]);
    group = PyTuple_Pack(2, ints[1], ints[2]);
    if (stream != NULL && order != NULL && group != NULL) out = PyTuple_Pack(3, stream, order, group);
done:
    for (k = 0; k < 4; k++) Py_XDECREF(ints[k]);
    Py_XDECREF(stream);
    Py_XDECREF(order);
    Py_XDECREF(group);
    return out;
}
