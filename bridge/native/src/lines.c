/* Blob JSON lines of a plain DML Entry (Plan.lines) and its whole message dicts (Plan.messages). */
#include "speedups.h"

/* The sequenceId text of row `index` of an Entry: seqId x 10**6 + index, as the layout writes it. */
int bridge_put_seq(Buf *b, const Layout *L, long long index) {
    char digits[32];
    Py_ssize_t nd;
    if (L->seq_pad && index >= 0 && index < 1000000) { /* "%06lld" */
        for (int i = 5; i >= 0; i--, index /= 10) digits[i] = (char)('0' + index % 10);
        nd = 6;
    } else {
        nd = bridge_int_text(index, digits);
    }
    return buf_put(b, L->seq_prefix, L->seq_prefix_n) && buf_put(b, digits, nd);
}

/* Append the line of the image the walk just read (image k of the DML type) to b. With `shard`,
 * the shard key JSON of the key columns' values (null where left out, as shard_key's orjson.dumps
 * writes it) is appended there and *has_key says whether there was one (no keys, or an image of no
 * values, give none). `x`: room for the image's extension entries (NULL: none may be needed).
 * 1 written, 0 a miss (b and shard hold partial output), -1 error. */
int bridge_write_line(PlanObject *plan, const Layout *L, const Walk *w, Py_ssize_t count, Py_ssize_t k,
                      Buf *b, Py_ssize_t *spans, Buf *shard, int *has_key, Extras *x) {
    PyObject *a = PyTuple_GET_ITEM(L->pre, k), *z = PyTuple_GET_ITEM(L->post, k);
    if (!buf_put(b, PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a))) return -1;
    Py_ssize_t written = 0;
    int rc = count ? bridge_image_json(plan, b, w->datas, count, spans, &written, x) : 0;
    if (rc <= 0) return rc;
    int extras = x != NULL && (x->charsets.n || x->values.n);
    const char *post_seq = L->post_seq, *nrows_text = L->nrows_text;
    Py_ssize_t post_seq_n = L->post_seq_n, nrows_n = L->nrows_n;
    if (extras && nrows_text == NULL) { /* a quiet layout: this message has an extension after all */
        if (L->loud_post_seq == NULL) return 0;
        post_seq = L->loud_post_seq;
        post_seq_n = L->loud_post_seq_n;
        nrows_text = L->loud_nrows_text;
        nrows_n = L->loud_nrows_n;
    }
    if (shard != NULL) {
        *has_key = L->nkeys > 0 && written > 0;
        if (*has_key) {
            if (!buf_put(shard, "[", 1)) return -1;
            for (Py_ssize_t q = 0; q < L->nkeys; q++) {
                Py_ssize_t at = L->keys[q];
                if (q && !buf_put(shard, ",", 1)) return -1;
                if (spans[2 * at] < 0 ? !buf_put(shard, "null", 4)
                                      : !buf_put(shard, b->p + spans[2 * at], spans[2 * at + 1] - spans[2 * at]))
                    return -1;
            }
            if (!buf_put(shard, "]", 1)) return -1;
        }
    }
    if (!buf_put(b, PyBytes_AS_STRING(z), PyBytes_GET_SIZE(z)) || !bridge_put_seq(b, L, w->index)
        || !buf_put(b, post_seq, post_seq_n))
        return -1;
    if (nrows_text != NULL) {
        char digits[32];
        Py_ssize_t nd = bridge_int_text(w->index, digits);
        digits[nd++] = ',';
        if (!buf_put(b, digits, nd) || !buf_put(b, nrows_text, nrows_n) || !buf_put(b, "]", 1)) return -1;
        /* the extension's order: header, columns, row, charsets, values (bridge/blob/encode.py: BlobEncoder._dml) */
        if (extras && x->charsets.n
            && (!buf_put(b, ",\"charsets\":{", 13) || !buf_put(b, x->charsets.p, x->charsets.n) || !buf_put(b, "}", 1)))
            return -1;
        if (extras && x->values.n
            && (!buf_put(b, ",\"values\":{", 11) || !buf_put(b, x->values.p, x->values.n) || !buf_put(b, "}", 1)))
            return -1;
        if (!buf_put(b, "}}", 2)) return -1;
    }
    return 1;
}

/* The key column indexes of a tuple, each checked against the plan's columns; NULL on error. */
Py_ssize_t *bridge_key_indexes(PlanObject *plan, PyObject *keys, Py_ssize_t *nkeys) {
    if (!PyTuple_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys is a tuple of column indexes");
        return NULL;
    }
    *nkeys = PyTuple_GET_SIZE(keys);
    Py_ssize_t *out = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(*nkeys ? *nkeys : 1));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < *nkeys; k++) {
        out[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, k));
        if (out[k] == -1 && PyErr_Occurred()) goto fail;
        if (out[k] < 0 || out[k] >= plan->ncols) {
            PyErr_SetString(PyExc_ValueError, "a key index outside the columns");
            goto fail;
        }
    }
    return out;
fail:
    PyMem_Free(out);
    return NULL;
}

/* pre and post: tuples of bytes, one per image of the DML type */
int bridge_check_templates(PyObject *pre, PyObject *post, Py_ssize_t nimg) {
    if (!PyTuple_Check(pre) || !PyTuple_Check(post) || PyTuple_GET_SIZE(pre) != nimg
        || PyTuple_GET_SIZE(post) != nimg)
        goto bad;
    for (Py_ssize_t k = 0; k < nimg; k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(pre, k)) || !PyBytes_Check(PyTuple_GET_ITEM(post, k))) goto bad;
    return 1;
bad:
    PyErr_SetString(PyExc_TypeError, "pre and post are tuples of bytes, one per image");
    return 0;
}

/* Plan.lines(entry_bytes, dml_type, pre, post, seq_prefix, seq_pad, post_seq, nrows_text): one
 * Blob JSON line per message, for a message layout the caller fixed per Entry:
 *   pre[k] + dataColumn JSON + post[k] + seq_prefix + row index (6 digits when seq_pad) + post_seq
 *   [+ row index + "," + nrows_text + "]}}" when nrows_text is not None]
 * where k is the op's image (INSERT, DELETE: one; UPDATE: before, after). None for any image the
 * JSON path is not sure of, or for whatever `rows` gives None. With `keys` the shard keys too.
 * With `resume, stop` (11 arguments; keys may be None) only the rows from `resume` (None: the
 * first; else a point a previous call returned) up to row `stop` (-1: the end), as (lines, the
 * next resume point, or None once the event is read to its end): an Entry's lines in pieces, so
 * a caller can stream an Entry of any size (BlobEncoder.stream_lines). */
PyObject *bridge_Plan_lines(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 && nargs != 9 && nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "lines(entry_bytes, dml_type, pre, post, seq_prefix, seq_pad, post_seq, "
                                         "nrows_text[, keys[, resume, stop]])");
        return NULL;
    }
    Layout L = {0};
    Py_ssize_t *keys = NULL;
    int ranged = nargs == 11;
    int want_keys = nargs >= 9 && args[8] != Py_None;
    long long stop = -1;
    if (ranged) {
        stop = PyLong_AsLongLong(args[10]);
        if (stop == -1 && PyErr_Occurred()) return NULL;
        if (args[9] != Py_None && !PyTuple_Check(args[9])) {
            PyErr_SetString(PyExc_TypeError, "lines(): resume is None or (row, offset)");
            return NULL;
        }
    }
    if (want_keys && (keys = bridge_key_indexes(self, args[8], &L.nkeys)) == NULL) return NULL;
    L.keys = keys;
    int dml_type = PyLong_AsLong(args[1]);
    if (dml_type == -1 && PyErr_Occurred()) goto fail_args;
    if (dml_type < DML_INSERT || dml_type > DML_DELETE) {
        PyMem_Free(keys);
        Py_RETURN_NONE;
    }
    Py_ssize_t nimg = dml_type == DML_UPDATE ? 2 : 1;
    L.pre = args[2];
    L.post = args[3];
    PyObject *seq_prefix = args[4], *post_seq = args[6], *nrows_text = args[7];
    L.seq_pad = PyObject_IsTrue(args[5]);
    if (L.seq_pad < 0) goto fail_args;
    if (!bridge_check_templates(L.pre, L.post, nimg)) goto fail_args;
    PyObject *loud = NULL;
    if (PyTuple_Check(post_seq) && PyTuple_GET_SIZE(post_seq) == 2) { /* (quiet, loud) */
        loud = PyTuple_GET_ITEM(post_seq, 1);
        post_seq = PyTuple_GET_ITEM(post_seq, 0);
    }
    if (!PyBytes_Check(seq_prefix) || !PyBytes_Check(post_seq) || (loud != NULL && !PyBytes_Check(loud))
        || (nrows_text != Py_None && !PyBytes_Check(nrows_text)) || (loud != NULL && nrows_text == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "lines(): seq_prefix, post_seq (or (quiet, loud)) and nrows_text are bytes");
        goto fail_args;
    }
    L.seq_prefix = PyBytes_AS_STRING(seq_prefix);
    L.seq_prefix_n = PyBytes_GET_SIZE(seq_prefix);
    L.post_seq = PyBytes_AS_STRING(post_seq);
    L.post_seq_n = PyBytes_GET_SIZE(post_seq);
    if (loud != NULL) {
        L.loud_post_seq = PyBytes_AS_STRING(loud);
        L.loud_post_seq_n = PyBytes_GET_SIZE(loud);
        L.loud_nrows_text = PyBytes_AS_STRING(nrows_text);
        L.loud_nrows_n = PyBytes_GET_SIZE(nrows_text);
    } else if (nrows_text != Py_None) {
        L.nrows_text = PyBytes_AS_STRING(nrows_text);
        L.nrows_n = PyBytes_GET_SIZE(nrows_text);
    }
    Walk w = {0};
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) goto fail_args;
    PyObject *result = NULL, *shards = NULL;
    Py_ssize_t *spans = NULL;
    Buf out = {NULL, 0, 0}, shard = {NULL, 0, 0};
    Extras x = {{NULL, 0, 0}, {NULL, 0, 0}};
    PyObject *next = NULL; /* ranged: where the rows not written begin, or None at the end */
    int started = bridge_walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (started < 0) goto done;
    if (started == 0) goto none;
    if (ranged && args[9] != Py_None && !bridge_walk_resume(&w, args[9])) goto done;
    if (want_keys && (spans = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)w.cap)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(0);
    if (result == NULL) goto done;
    if (want_keys && (shards = PyList_New(0)) == NULL) goto error;
    Py_ssize_t count;
    int more;
    while ((more = bridge_walk_next(&w, &count)) == 1) {
        Py_ssize_t k = dml_type == DML_UPDATE ? walk_image(&w) : 0;
        if (ranged && stop >= 0 && w.index >= stop) { /* the first row past the range: resume here */
            next = Py_BuildValue("(Ln)", w.index, (Py_ssize_t)(w.row_at - w.base));
            if (next == NULL) goto error;
            break;
        }
        int has_key = 0;
        out.n = 0;
        shard.n = 0;
        int rc = bridge_write_line(self, &L, &w, count, k, &out, spans, want_keys ? &shard : NULL, &has_key, &x);
        if (rc < 0) goto error;
        if (rc == 0) goto none;
        if (want_keys) {
            PyObject *key_text = has_key ? PyUnicode_DecodeUTF8((const char *)shard.p, shard.n, NULL)
                                         : (Py_INCREF(Py_None), Py_None);
            if (key_text == NULL) goto error;
            rc = PyList_Append(shards, key_text);
            Py_DECREF(key_text);
            if (rc < 0) goto error;
        }
        PyObject *line = PyBytes_FromStringAndSize((const char *)out.p, out.n);
        if (line == NULL) goto error;
        rc = PyList_Append(result, line);
        Py_DECREF(line);
        if (rc < 0) goto error;
    }
    if (more < 0) goto none;
    if (want_keys) {
        PyObject *pair = PyTuple_Pack(2, result, shards);
        Py_DECREF(result);
        result = pair;
        if (result == NULL) goto done;
    }
    if (ranged) {
        PyObject *pair = PyTuple_Pack(2, result, next ? next : Py_None);
        Py_DECREF(result);
        result = pair;
    }
    goto done;
error:
    Py_CLEAR(result);
    goto done;
none:
    result = bridge_give_way(result);
done:
    Py_XDECREF(next);
    Py_XDECREF(shards);
    PyMem_Free(out.p);
    PyMem_Free(shard.p);
    PyMem_Free(x.charsets.p);
    PyMem_Free(x.values.p);
    PyMem_Free(spans);
    PyMem_Free(w.datas);
    PyMem_Free(keys);
    PyBuffer_Release(&buf);
    return result;
fail_args:
    PyMem_Free(keys);
    return NULL;
}


/* ---- whole message dicts (the dict API: entry_to_blob) --------------------------------------- */

/* d[bridge_names[key]] = value (new reference, stolen); 0 on error */
static int put_item(PyObject *d, int key, PyObject *value) {
    if (value == NULL) return 0;
    int rc = PyDict_SetItem(d, bridge_names[key], value);
    Py_DECREF(value);
    return rc == 0;
}

/* [index, nrows], the extension's "row" (new reference; NULL on error) */
static PyObject *row_pair(long long index, long long nrows) {
    PyObject *out = PyList_New(2), *a = PyLong_FromLongLong(index), *b = PyLong_FromLongLong(nrows);
    if (out == NULL || a == NULL || b == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, a);
    PyList_SET_ITEM(out, 1, b);
    return out;
}

/* One message dict, as bridge/blob/encode.py's BlobEncoder._plain builds it: schema, payload (image,
 * op, sequenceId, timestamp), version and, in lossless mode, the extension (header, columns, row, charsets,
 * values), left out when `quiet` and the image needs no entry of it. NULL on error. */
PyObject *bridge_message(PyObject *const *args, PyObject *values, PyObject *raws, PyObject *charsets,
                         Py_ssize_t k, PyObject *seq, long long index, long long nrows) {
    PyObject *schema = args[2], *image_key = PyTuple_GET_ITEM(args[3], k), *op = PyTuple_GET_ITEM(args[4], k);
    PyObject *stamp = args[7], *version = args[8], *ext_header = args[9], *ext_columns = args[10];
    int quiet = PyObject_IsTrue(args[11]);
    PyObject *msg = PyDict_New(), *payload = PyDict_New(), *bridge_image = PyDict_New();
    if (msg == NULL || payload == NULL || bridge_image == NULL || quiet < 0) goto error;
    Py_INCREF(values);
    if (!put_item(bridge_image, N_DATACOLUMN, values)) goto error;
    if (PyDict_SetItem(payload, image_key, bridge_image) < 0) goto error;
    Py_CLEAR(bridge_image);
    Py_INCREF(op);
    Py_INCREF(seq);
    Py_INCREF(stamp);
    if (!put_item(payload, N_OP, op) || !put_item(payload, N_SEQ, seq) || !put_item(payload, N_TIMESTAMP, stamp))
        goto error;
    Py_INCREF(schema);
    if (!put_item(msg, N_SCHEMA, schema)) goto error;
    PyObject *p = payload;
    payload = NULL;
    Py_INCREF(version);
    if (!put_item(msg, N_PAYLOAD, p) || !put_item(msg, N_VERSION, version)) goto error;
    if (ext_header != Py_None && (!quiet || raws != NULL || charsets != NULL)) {
        PyObject *ext = PyDict_New();
        if (ext == NULL) goto error;
        Py_INCREF(ext_header);
        Py_INCREF(ext_columns);
        if (!put_item(ext, N_HEADER, ext_header) || !put_item(ext, N_COLUMNS, ext_columns)
            || !put_item(ext, N_ROW, row_pair(index, nrows))
            || (charsets != NULL && (Py_INCREF(charsets), !put_item(ext, N_CHARSETS, charsets)))
            || (raws != NULL && (Py_INCREF(raws), !put_item(ext, N_VALUES, raws)))) {
            Py_DECREF(ext);
            goto error;
        }
        if (!put_item(msg, N_DTS, ext)) goto error; /* ext is the message's, or dropped */
    }
    return msg;
error:
    Py_XDECREF(msg);
    Py_XDECREF(payload);
    Py_XDECREF(bridge_image);
    return NULL;
}

/* ---- dts.header read off the Entry's Header (Plan.messages with ext_header given as (props,)) ---- */

/* The Header fields dts.header holds, in field-number order: bridge/blob/encode.py's wire_ext_header
 * (every scalar field but those the envelope and schema.source say: messageType, timestamp, seqId,
 * sourceType, schemaName, tableName), each kept when not its default, as protobuf reads it. */
const ExtHeaderField bridge_ext_header[N_EXT_HEADER] = {
    {F_HEADER_VERSION, "version", H_INT32},   {F_HEADER_SERVERID, "serverId", H_INT64},
    {F_HEADER_FILENAME, "fileName", H_STRING}, {F_HEADER_POSITION, "position", H_UINT64},
    {F_HEADER_GTID, "gtid", H_STRING},         {F_HEADER_EVENTINDEX, "eventIndex", H_UINT64},
    {F_HEADER_ISLAST, "isLast", H_BOOL}};
/* the Header fields the envelope and schema.source say (left out of dts.header): varints and strings */
#define SAID_ELSEWHERE (1u << F_HEADER_SOURCETYPE | 1u << F_HEADER_MESSAGETYPE | 1u << F_HEADER_TIMESTAMP \
                        | 1u << F_HEADER_SCHEMANAME | 1u << F_HEADER_TABLENAME | 1u << F_HEADER_SEQID)

static PyObject *ext_header_names[N_EXT_HEADER], *properties_name;

/* What C reads of an Entry's Header: the dts.header fields (ints and texts by EXT_HEADER index,
 * `seen` those not at their default), timestamp and seqId (0 when absent) */
typedef struct {
    uint64_t ints[N_EXT_HEADER];
    Span texts[N_EXT_HEADER];
    unsigned seen;
    uint64_t timestamp, seq_id;
} HeaderView;

/* Read the Header of an Entry's bytes into h: 1, or 0 where C is not sure (a field twice, of
 * another wire type, an unknown field, malformed bytes): Python reads the parsed Header. */
static int read_header(const uint8_t *start, const uint8_t *end, HeaderView *h) {
    memset(h, 0, sizeof(*h));
    Span header = {NULL, 0};
    int found = bridge_only_submessage(start, end, F_ENTRY_HEADER, &header);
    if (found < 0) return 0;
    const uint8_t *p = found ? header.p : NULL, *hend = found ? header.p + header.n : NULL; /* none: all defaults */
    unsigned once = 0; /* timestamp and seqId: each at most once */
    while (p < hend) {
        uint64_t tag;
        if (!read_tag(&p, hend, &tag)) return 0;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag), i = 0;
        if (field == F_HEADER_TIMESTAMP || field == F_HEADER_SEQID) {
            unsigned bit = field == F_HEADER_TIMESTAMP ? 1u : 2u;
            uint64_t v;
            if ((once & bit) || wt != WT_VARINT || !read_varint(&p, hend, &v)) return 0;
            once |= bit;
            if (field == F_HEADER_TIMESTAMP) h->timestamp = (uint32_t)v; /* a uint32, as protobuf truncates */
            else h->seq_id = v;
            continue;
        }
        while (i < N_EXT_HEADER && bridge_ext_header[i].field != field) i++;
        if (i == N_EXT_HEADER) { /* said elsewhere, or the properties (given): skipped; anything else is Python's */
            if ((field != F_HEADER_PROPERTIES && !(field < 32 && (SAID_ELSEWHERE >> field & 1)))
                || !skip_field(&p, hend, wt))
                return 0;
            continue;
        }
        if (h->seen & (1u << i)) return 0;
        h->seen |= 1u << i;
        if (bridge_ext_header[i].kind == H_STRING) {
            if (wt != WT_LEN || !read_span(&p, hend, &h->texts[i])) return 0;
            if (h->texts[i].n == 0) h->seen &= ~(1u << i); /* "" spelt out: the default */
        } else {
            uint64_t v;
            if (wt != WT_VARINT || !read_varint(&p, hend, &v)) return 0;
            if (bridge_ext_header[i].kind == H_INT32) v = (uint64_t)(int64_t)(int32_t)(uint32_t)v; /* as protobuf truncates */
            h->ints[i] = v;
            if (v == 0) h->seen &= ~(1u << i); /* 0 spelt out: the default */
        }
    }
    return 1;
}

/* dts.header of a read Header (new reference), its properties `props` (a list, or None: none)
 * last, as BlobEncoder._plain's _wire_header gives it; *default_only says whether it is the
 * default header {"version": 1}. Py_None (a new reference) for text that is not UTF-8 (Python
 * decides); NULL on error. */
static PyObject *ext_header_dict(const HeaderView *h, PyObject *props, int *default_only) {
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    for (int i = 0; i < N_EXT_HEADER; i++) {
        if (!(h->seen & (1u << i))) continue;
        PyObject *value;
        switch (bridge_ext_header[i].kind) {
        case H_INT32:
        case H_INT64: value = PyLong_FromLongLong((long long)(int64_t)h->ints[i]); break;
        case H_UINT64: value = PyLong_FromUnsignedLongLong((unsigned long long)h->ints[i]); break;
        case H_BOOL: value = Py_True, Py_INCREF(value); break;
        default:
            value = PyUnicode_DecodeUTF8((const char *)h->texts[i].p, h->texts[i].n, NULL);
            if (value == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
        }
        if (value == NULL || PyDict_SetItem(out, ext_header_names[i], value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(value);
    }
    int has_props = props != Py_None && PyObject_IsTrue(props);
    if (has_props < 0 || (has_props && PyDict_SetItem(out, properties_name, props) < 0)) {
        Py_DECREF(out);
        return NULL;
    }
    *default_only = h->seen == 1u && h->ints[0] == 1 && !has_props; /* {"version": 1} */
    return out;
}

/* payload.timestamp of a read Header (new reference): {"eventTime": ms, "checkpointTime": ms}, as
 * BlobEncoder._wire_stamp gives it; Py_None (a new reference) when ms is not 13 digits (Python's
 * _timestamp reports it). NULL on error. */
static PyObject *stamp_dict(const HeaderView *h) {
    long long ms = (long long)h->timestamp * 1000;
    if (ms < 1000000000000LL || ms > 9999999999999LL) Py_RETURN_NONE;
    PyObject *out = PyDict_New(), *value = PyLong_FromLongLong(ms);
    if (out == NULL || value == NULL || PyDict_SetItem(out, bridge_names[N_EVENTTIME], value) < 0
        || PyDict_SetItem(out, bridge_names[N_CHECKPOINTTIME], value) < 0) {
        Py_XDECREF(out);
        Py_XDECREF(value);
        return NULL;
    }
    Py_DECREF(value);
    return out;
}

static int header_names_init(void) {
    if (properties_name != NULL) return 1;
    for (int i = 0; i < N_EXT_HEADER; i++)
        if ((ext_header_names[i] = PyUnicode_InternFromString(bridge_ext_header[i].name)) == NULL) return 0;
    return (properties_name = PyUnicode_InternFromString("properties")) != NULL;
}

/* Plan.messages(entry_bytes, dml_type, schema, image_keys, ops, seq_prefix, seq_pad, stamp, version,
 * ext_header, ext_columns, quiet, nrows): the Blob message dicts of a plain DML Entry, every image
 * converted here (image_keys and ops: one str per image of the DML type; ext_header None in
 * strict mode); None when any image is one C is not sure of (then `rows` and Python decide).
 * ext_header given as (props,) is read here off the Entry's Header (read_header above), with
 * `props` as its properties; `quiet` then holds only where that header is the default one. stamp
 * given as None: the timestamp and the sequenceId's seqId are read there too (seq_prefix and
 * seq_pad are not read). None comes back where C is not sure of the Header either, or its
 * timestamp gives no 13-digit eventTime (Python reports it). */
PyObject *bridge_Plan_messages(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 || !PyTuple_Check(args[3]) || !PyTuple_Check(args[4]) || !PyBytes_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "messages(entry_bytes, dml_type, schema, image_keys, ops, seq_prefix: bytes, "
                                         "seq_pad, stamp, version, ext_header, ext_columns, quiet, nrows)");
        return NULL;
    }
    int dml_type = PyLong_AsLong(args[1]);
    if (dml_type == -1 && PyErr_Occurred()) return NULL;
    long long nrows = PyLong_AsLongLong(args[12]);
    if (nrows == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t nimg = dml_type == DML_UPDATE ? 2 : 1;
    if (PyTuple_GET_SIZE(args[3]) != nimg || PyTuple_GET_SIZE(args[4]) != nimg) {
        PyErr_SetString(PyExc_TypeError, "messages(): one image key and one op per image of the DML type");
        return NULL;
    }
    /* what C reads off the Header: dts.header (ext_header given as (props,)) and, with stamp None,
     * the timestamp and the sequenceId's seqId (seq_prefix and seq_pad are then not read) */
    PyObject *margs[13], *read_ext = NULL, *read_stamp = NULL;
    char seq_digits[24];
    Py_ssize_t seq_digits_n = -1;
    int read_seq_pad = 0;
    memcpy(margs, args, sizeof(margs));
    int want_ext = PyTuple_Check(args[9]), want_stamp = args[7] == Py_None;
    if (want_ext && PyTuple_GET_SIZE(args[9]) != 1) {
        PyErr_SetString(PyExc_TypeError, "messages(): ext_header is a dict, None or (props,)");
        return NULL;
    }
    if (want_ext || want_stamp) {
        if (!header_names_init()) return NULL;
        Py_buffer hbuf;
        if (PyObject_GetBuffer(args[0], &hbuf, PyBUF_SIMPLE) < 0) return NULL;
        HeaderView hv;
        int ok = read_header(hbuf.buf, (const uint8_t *)hbuf.buf + hbuf.len, &hv);
        PyBuffer_Release(&hbuf);
        if (!ok) Py_RETURN_NONE;
        if (want_ext) {
            int default_only = 0, quiet = PyObject_IsTrue(args[11]);
            if (quiet < 0 || (read_ext = ext_header_dict(&hv, PyTuple_GET_ITEM(args[9], 0), &default_only)) == NULL
                || read_ext == Py_None)
                return read_ext;
            margs[9] = read_ext;
            margs[11] = default_only && quiet ? Py_True : Py_False;
        }
        if (want_stamp) {
            if ((read_stamp = stamp_dict(&hv)) == NULL || read_stamp == Py_None) {
                Py_XDECREF(read_ext);
                return read_stamp;
            }
            margs[7] = read_stamp;
            seq_digits_n = hv.seq_id ? bridge_u64_text((unsigned long long)hv.seq_id, seq_digits) : 0;
            read_seq_pad = hv.seq_id != 0;
        }
    }
    args = margs;
    Layout L = {0};
    if (seq_digits_n >= 0) {
        L.seq_prefix = seq_digits;
        L.seq_prefix_n = seq_digits_n;
        L.seq_pad = read_seq_pad;
    } else {
        L.seq_prefix = PyBytes_AS_STRING(args[5]);
        L.seq_prefix_n = PyBytes_GET_SIZE(args[5]);
        L.seq_pad = PyObject_IsTrue(args[6]);
    }
    Py_buffer buf;
    if (L.seq_pad < 0 || PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) {
        Py_XDECREF(read_ext);
        Py_XDECREF(read_stamp);
        return NULL;
    }
    PyObject *result = NULL, *seq = NULL;
    Buf text = {NULL, 0, 0};
    Walk w = {0};
    int rc = bridge_walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (rc <= 0) {
        result = rc < 0 ? NULL : bridge_give_way(NULL);
        goto done;
    }
    if ((result = PyList_New(0)) == NULL) goto done;
    Py_ssize_t count;
    long long seq_row = -1;
    while ((rc = bridge_walk_next(&w, &count)) == 1) {
        Py_ssize_t k = dml_type == DML_UPDATE ? walk_image(&w) : 0;
        if (count == 0) break; /* an empty image: Python writes its "image": "empty" */
        PyObject *img = bridge_image(self, w.datas, count);
        if (img == NULL) goto error;
        if (img == Py_None) {
            Py_DECREF(img);
            break;
        }
        PyObject *values = img, *raws = NULL, *charsets = NULL;
        if (PyTuple_Check(img)) {
            values = PyTuple_GET_ITEM(img, 0);
            raws = PyTuple_GET_ITEM(img, 1) == Py_None ? NULL : PyTuple_GET_ITEM(img, 1);
            charsets = PyTuple_GET_ITEM(img, 2) == Py_None ? NULL : PyTuple_GET_ITEM(img, 2);
        }
        if (seq_row != w.index) { /* an update's two messages share their row's sequenceId */
            Py_CLEAR(seq);
            text.n = 0;
            if (bridge_put_seq(&text, &L, w.index)) seq = bridge_ascii_str(text.p, text.n); /* digits */
            if (seq == NULL) {
                Py_DECREF(img);
                goto error;
            }
            seq_row = w.index;
        }
        PyObject *msg = bridge_message(args, values, raws, charsets, k, seq, w.index, nrows);
        Py_DECREF(img);
        if (msg == NULL) goto error;
        int failed = PyList_Append(result, msg) < 0;
        Py_DECREF(msg);
        if (failed) goto error;
    }
    if (rc != 0) result = bridge_give_way(result); /* stopped early: a miss, or bytes C does not take */
    goto done;
error:
    Py_CLEAR(result);
done:
    Py_XDECREF(seq);
    Py_XDECREF(read_ext);
    Py_XDECREF(read_stamp);
    PyMem_Free(text.p);
    PyMem_Free(w.datas);
    PyBuffer_Release(&buf);
    return result;
}
