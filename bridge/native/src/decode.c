/* Blob -> DTS: one image's dataColumn values -> the Data of a RowChange field, on the wire (Plan.encode). */
#include "speedups.h"

int bridge_put_varint(Buf *b, uint64_t v) {
    if (!bridge_buf_grow(b, 10)) return 0;
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        b->p[b->n++] = byte | (v ? 0x80 : 0);
    } while (v);
    return 1;
}

/* a Data's dataType field (two bytes: every DataType is below 128) */
static int put_datatype(Buf *b, int dt) {
    return bridge_put_varint(b, TAG(F_DATA_DATATYPE, WT_VARINT)) && bridge_put_varint(b, (uint64_t)dt);
}

/* an embedded message (or any length-delimited field), written even when empty: a message that is
 * there, a row or a Data with nothing set, stays there */
static int put_message_field(Buf *b, uint32_t field, const void *p, Py_ssize_t n) {
    return bridge_put_varint(b, TAG(field, WT_LEN)) && bridge_put_varint(b, (uint64_t)n) && buf_put(b, p, n);
}

/* a string or bytes field; proto3 leaves an empty one out */
static int put_len_field(Buf *b, uint32_t field, const void *p, Py_ssize_t n) {
    return n == 0 || put_message_field(b, field, p, n);
}

/* the Entry field event { dmlEvent { <dml: the DMLEvent's fields> } } appended to out */
static int put_event_dml(Buf *out, const Buf *dml) {
    Buf event = {NULL, 0, 0};
    int ok = put_message_field(&event, F_EVENT_DMLEVENT, dml->p, dml->n)
             && put_message_field(out, F_ENTRY_EVENT, event.p, event.n);
    PyMem_Free(event.p);
    return ok;
}

static void civil_from_days(long long z, long long *y, unsigned *m, unsigned *d) {
    z += 719468;
    const long long era = (z >= 0 ? z : z - 146096) / 146097;
    const unsigned doe = (unsigned)(z - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (long long)yoe + era * 400 + (*m <= 2);
}

static inline char *put2(char *o, unsigned v) {
    o[0] = (char)('0' + v / 10);
    o[1] = (char)('0' + v % 10);
    return o + 2;
}
/* MySQL text of epoch milliseconds in UTC (format_temporal); 0 outside years 1..9999 */
static int format_temporal(const Col *c, long long ms, char *out, Py_ssize_t *len) {
    if (ms < -62135596800000LL || ms > 253402300799999LL) return 0;
    long long secs = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
    int millis = (int)(ms - secs * 1000);
    long long days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
    unsigned sod = (unsigned)(secs - days * 86400);
    long long y;
    unsigned m, d;
    civil_from_days(days, &y, &m, &d);
    if (y < 1 || y > 9999) return 0;
    char *o = put2(put2(out, (unsigned)(y / 100)), (unsigned)(y % 100));
    *o++ = '-';
    o = put2(o, m);
    *o++ = '-';
    o = put2(o, d);
    if (c->kind != K_DATE) {
        *o++ = ' ';
        o = put2(o, sod / 3600);
        *o++ = ':';
        o = put2(o, sod / 60 % 60);
        *o++ = ':';
        o = put2(o, sod % 60);
        if (c->fsp) {
            /* the first fsp digits of the microseconds, as "%06d" % (millis * 1000) */
            char frac[6] = {(char)('0' + millis / 100), (char)('0' + millis / 10 % 10), (char)('0' + millis % 10),
                            '0', '0', '0'};
            *o++ = '.';
            memcpy(o, frac, (size_t)c->fsp);
            o += c->fsp;
        }
        if (c->kind == K_TIMESTAMP) {
            memcpy(o, " +00:00", 7);
            o += 7;
        }
    }
    *len = o - out;
    return 1;
}

/* strict, canonical standard base64 (what b64decode(validate=True) and the re-encoding check
 * accept); 0 for anything else, which the Python codec then judges */
static int base64_decode(const uint8_t *p, Py_ssize_t n, Buf *out) {
    static int8_t rev[256];
    static int ready = 0;
    if (!ready) {
        memset(rev, -1, sizeof(rev));
        for (int i = 0; i < 64; i++) rev[(uint8_t)bridge_B64[i]] = (int8_t)i;
        ready = 1;
    }
    if (n % 4) return 0;
    if (!bridge_buf_grow(out, n / 4 * 3)) return -1;
    for (Py_ssize_t i = 0; i < n; i += 4) {
        int pad = 0;
        int8_t v[4];
        for (int k = 0; k < 4; k++) {
            uint8_t ch = p[i + k];
            if (ch == '=' && i + 4 == n && k >= 2) {
                if (k == 2 && p[i + 3] != '=') return 0;
                pad++;
                v[k] = 0;
            } else {
                v[k] = rev[ch];
                if (v[k] < 0) return 0;
            }
        }
        uint32_t x = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) | (uint32_t)v[3];
        if (pad == 2 && (v[1] & 15)) return 0; /* padding bits must be zero */
        if (pad == 1 && (v[2] & 3)) return 0;
        out->p[out->n++] = (uint8_t)(x >> 16);
        if (pad < 2) out->p[out->n++] = (uint8_t)(x >> 8);
        if (pad < 1) out->p[out->n++] = (uint8_t)x;
    }
    return 1;
}

/* the Data body of one non-null value (the codec's from_blob); 1 done, 0 not plain, -1 error.
 * `label`: the charset dts.charsets names for a temporal or time value (n 0: none) */
static int encode_value(const Col *c, PyObject *v, Buf *d, Buf *tmp, Span label) {
    int dt = c->dt;
    char text[64];
    Py_ssize_t len;
    switch (c->kind) {
    case K_LONG: {
        if (!PyLong_CheckExact(v)) return 0;
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        len = bridge_int_text(x, text);
        return put_datatype(d, dt) && put_len_field(d, F_DATA_SV, text, len) ? 1 : -1;
    }
    case K_DIGITS:
    case K_DECIMAL: {
        if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_ASCII(v)) return 0;
        const uint8_t *s = PyUnicode_1BYTE_DATA(v);
        Py_ssize_t n = PyUnicode_GET_LENGTH(v);
        Span sv = {s, n};
        Canon canon;
        DataView view = {0};
        view.sv = sv;
        view.cs.p = view.bv.p = (const uint8_t *)"";
        if (c->kind == K_DECIMAL) {
            if (!bridge_check_decimal(c, &view, &canon)) return 0;
        } else {
            /* -?[0-9]+ written as str(int(value)): no sign on zero, no leading zeros */
            const uint8_t *q = s, *end = s + n;
            int neg = 0;
            if (q < end && *q == '-') {
                neg = 1;
                q++;
            }
            if (q == end || end - q > 40) return 0;
            for (const uint8_t *r = q; r < end; r++)
                if (*r < '0' || *r > '9') return 0;
            while (end - q > 1 && *q == '0') q++;
            if (*q == '0') neg = 0;
            len = 0;
            if (neg) text[len++] = '-';
            memcpy(text + len, q, (size_t)(end - q));
            len += end - q;
            sv.p = (const uint8_t *)text;
            sv.n = len;
        }
        return put_datatype(d, dt) && put_len_field(d, F_DATA_SV, sv.p, sv.n) ? 1 : -1;
    }
    case K_DOUBLE: {
        if (!PyFloat_CheckExact(v)) return 0;
        char *r = PyOS_double_to_string(PyFloat_AS_DOUBLE(v), 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (r == NULL) return -1;
        int ok = put_datatype(d, dt) && put_len_field(d, F_DATA_SV, r, (Py_ssize_t)strlen(r));
        PyMem_Free(r);
        return ok ? 1 : -1;
    }
    case K_BOOL:
        if (v != Py_True && v != Py_False) return 0;
        return put_datatype(d, dt) && put_len_field(d, F_DATA_SV, v == Py_True ? "1" : "0", 1)
               ? 1 : -1;
    case K_TEXT:
    case K_UTF8:
    case K_BASE64: {
        if (!PyUnicode_CheckExact(v)) return 0;
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(v, &n);
        if (u == NULL) {
            PyErr_Clear(); /* surrogates: the codec reports them */
            return 0;
        }
        const char *bv = u;
        if (c->kind == K_BASE64) {
            tmp->n = 0;
            int rc = base64_decode((const uint8_t *)u, n, tmp);
            if (rc <= 0) return rc;
            bv = (const char *)tmp->p;
            n = tmp->n;
        }
        Span cs = label.n ? label : (Span){(const uint8_t *)c->charset, c->charset_len};
        return put_datatype(d, dt) && put_len_field(d, F_DATA_CHARSET, cs.p, cs.n)
               && put_len_field(d, F_DATA_BV, bv, n) ? 1 : -1;
    }
    default: { /* temporal */
        if (!PyLong_CheckExact(v)) return 0;
        int overflow;
        long long ms = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (ms == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (!format_temporal(c, ms, text, &len)) return 0;
        return put_datatype(d, dt) && put_len_field(d, F_DATA_CHARSET, label.p, label.n)
               && put_len_field(d, F_DATA_BV, text, len) ? 1 : -1;
    }
    }
}

/* The column index a dts.values / dts.charsets key names: str(index) for an index below n, as
 * bridge.blob.decode's _index_keys spells them; -1 for any other key. */
static Py_ssize_t index_key(PyObject *key, Py_ssize_t n) {
    if (!PyUnicode_CheckExact(key) || !PyUnicode_IS_ASCII(key)) return -1;
    Py_ssize_t len = PyUnicode_GET_LENGTH(key);
    const uint8_t *s = PyUnicode_1BYTE_DATA(key);
    if (len == 0 || len > 9 || (len > 1 && s[0] == '0')) return -1;
    Py_ssize_t i = 0;
    for (Py_ssize_t k = 0; k < len; k++) {
        if (s[k] < '0' || s[k] > '9') return -1;
        i = i * 10 + (s[k] - '0');
    }
    return i < n ? i : -1;
}

/* Each column's entry of a dts.values or dts.charsets object (NULL: none) into by[]; 0 when a key
 * names no column (the Python path reports it) */
static int by_index(PyObject *obj, PyObject **by, Py_ssize_t n) {
    if (obj == NULL || obj == Py_None) return 1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        Py_ssize_t i = index_key(key, n);
        if (i < 0) return 0;
        by[i] = value;
    }
    return 1;
}

/* One raw Data of dts.values ({"dataType": int, "charset"?: str, "sv"?: str, "bv"?: base64 str}) as
 * codecs.raw_to_data builds it: 1 written to d, 0 anything else (Python decides), -1 error */
static int encode_raw(PyObject *raw, Buf *d, Buf *tmp) {
    if (!PyDict_CheckExact(raw)) return 0;
    PyObject *parts[4] = {NULL, NULL, NULL, NULL}; /* dataType, charset, sv, bv */
    static const char *names[4] = {"dataType", "charset", "sv", "bv"};
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(raw, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) return 0;
        int found = 0;
        for (int j = 0; j < 4 && !found; j++)
            if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0) {
                parts[j] = value;
                found = 1;
            }
        if (!found) return 0; /* a key raw_to_data ignores: Python's path keeps that rule */
    }
    if (parts[0] == NULL || !PyLong_CheckExact(parts[0])) return 0;
    long dt = PyLong_AsLong(parts[0]);
    if (dt == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (dt < 0 || dt > 127) return 0;
    Py_ssize_t n[3] = {0, 0, 0};
    const char *text[3] = {"", "", ""};
    for (int j = 1; j < 4; j++) {
        if (parts[j] == NULL) continue;
        if (!PyUnicode_CheckExact(parts[j])) return 0;
        text[j - 1] = PyUnicode_AsUTF8AndSize(parts[j], &n[j - 1]);
        if (text[j - 1] == NULL) {
            PyErr_Clear();
            return 0;
        }
    }
    if (n[2]) { /* bv: strict canonical base64 only */
        if (!PyUnicode_IS_ASCII(parts[3])) return 0;
        tmp->n = 0;
        int rc = base64_decode((const uint8_t *)text[2], n[2], tmp);
        if (rc <= 0) return rc;
        text[2] = (const char *)tmp->p;
        n[2] = tmp->n;
    }
    if (dt && !put_datatype(d, (int)dt)) return -1;
    return put_len_field(d, F_DATA_CHARSET, text[0], n[0]) && put_len_field(d, F_DATA_SV, text[1], n[1])
           && put_len_field(d, F_DATA_BV, text[2], n[2]) ? 1 : -1;
}

/* A K_TEXT value in the charset dts.charsets names for it (the text codec's from_blob) */
static int encode_text_in(Col *c, PyObject *v, PyObject *charset, Buf *d) {
    if (!PyUnicode_CheckExact(v) || !PyUnicode_CheckExact(charset)) return 0;
    Py_ssize_t cs_n;
    const char *cs = PyUnicode_AsUTF8AndSize(charset, &cs_n);
    if (cs == NULL) {
        PyErr_Clear();
        return 0;
    }
    Span span = {(const uint8_t *)cs, cs_n};
    PyObject *bytes = bridge_encode_text(c, span, v);
    if (bytes == NULL) return 0;
    int ok = put_datatype(d, c->dt) && put_len_field(d, F_DATA_CHARSET, cs, cs_n)
             && put_len_field(d, F_DATA_BV, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
    Py_DECREF(bytes);
    return ok ? 1 : -1;
}

/* One image's Data as RowChange field `field` appended to out (Plan.encode's rules): 1 done, 0 not
 * plain (the Python codecs decide), -1 error (set) */
static int encode_image(PlanObject *self, PyObject *values, long field, PyObject *raws, PyObject *charsets,
                        Buf *out) {
    Buf d = {NULL, 0, 0}, tmp = {NULL, 0, 0};
    int rc = -1;
    PyObject **by = NULL; /* per column: its raw (by[i]) and its charset (by[ncols + i]) */
    if (raws || charsets) {
        by = PyMem_Calloc((size_t)(2 * self->ncols + 1), sizeof(PyObject *));
        if (by == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (!by_index(raws, by, self->ncols) || !by_index(charsets, by + self->ncols, self->ncols)) {
            rc = 0;
            goto done;
        }
    }
    Py_ssize_t found = 0;
    static const uint8_t NA_DATA[2] = {TAG(F_DATA_DATATYPE, WT_VARINT), DT_NA}; /* a Data of dataType NA alone */
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        Col *c = &self->cols[i];
        PyObject *v = PyDict_GetItemWithError(values, c->name);
        if (v == NULL && PyErr_Occurred()) goto done;
        if (v != NULL && !c->dup) found++; /* a key counts once, however many columns share its name */
        PyObject *raw = by ? by[i] : NULL;
        if (raw == NULL && v == NULL) {
            if (!put_message_field(out, (uint32_t)field, NA_DATA, 2)) goto done;
            continue;
        }
        if (raw == NULL && v == Py_None) {
            if (!put_message_field(out, (uint32_t)field, "", 0)) goto done; /* NIL: an empty Data */
            continue;
        }
        d.n = 0;
        PyObject *charset = by ? by[self->ncols + i] : NULL;
        Span label = {(const uint8_t *)"", 0};
        if (charset != NULL && c->kind != K_TEXT) {
            /* temporal and time text take it as a label (Codec.charset); other codecs take none */
            if (bridge_labelled(c)) {
                label.p = PyUnicode_CheckExact(charset)
                          ? (const uint8_t *)PyUnicode_AsUTF8AndSize(charset, &label.n) : NULL;
                if (label.p == NULL) { /* not a str, or surrogates: the codec names what is wrong */
                    PyErr_Clear();
                    rc = 0;
                    goto done;
                }
            }
            charset = NULL;
        }
        int one = raw ? encode_raw(raw, &d, &tmp)
                      : charset ? encode_text_in(c, v, charset, &d) : encode_value(c, v, &d, &tmp, label);
        if (one <= 0) {
            rc = one;
            goto done;
        }
        if (!put_message_field(out, (uint32_t)field, d.p, d.n)) goto done;
    }
    rc = found == PyDict_GET_SIZE(values);
done:
    PyMem_Free(d.p);
    PyMem_Free(tmp.p);
    PyMem_Free(by);
    return rc;
}

/* Plan.encode(values, field, raws=None, charsets=None) -> the Data of one image as RowChange field
 * `field` (1 oldColumns, 2 newColumns) on the wire, for `row.MergeFromString`: each column's value
 * as its codec's from_blob gives it (None: NIL; absent: NA), with the default charset or the one
 * `charsets` (dts.charsets: str(index) -> charset) names for a text column (for a temporal or time
 * column: the label it names, else none), or the raw Data of
 * `raws` (dts.values: str(index) -> raw Data) in its place; None when any value is not plain (a type
 * the codec rejects, surrogates, out of range, a charset without a codec...) or a key names no
 * column: the Python path then decides and names what is wrong. */
PyObject *bridge_Plan_encode(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 4 || !PyDict_Check(args[0])
        || (nargs > 2 && args[2] != Py_None && !PyDict_Check(args[2]))
        || (nargs > 3 && args[3] != Py_None && !PyDict_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "encode(values: dict, field: int, raws: dict | None = None, "
                                         "charsets: dict | None = None)");
        return NULL;
    }
    long field = PyLong_AsLong(args[1]);
    if (field == -1 && PyErr_Occurred()) return NULL;
    if (field != F_ROWCHANGE_OLDCOLUMNS && field != F_ROWCHANGE_NEWCOLUMNS) {
        PyErr_SetString(PyExc_ValueError, "field is 1 (oldColumns) or 2 (newColumns)");
        return NULL;
    }
    PyObject *raws = nargs > 2 && args[2] != Py_None && PyDict_GET_SIZE(args[2]) ? args[2] : NULL;
    PyObject *charsets = nargs > 3 && args[3] != Py_None && PyDict_GET_SIZE(args[3]) ? args[3] : NULL;
    Buf out = {NULL, 0, 0};
    int rc = encode_image(self, args[0], field, raws, charsets, &out);
    PyObject *result = rc < 0 ? NULL : rc == 0 ? Py_NewRef(Py_None)
                                               : PyBytes_FromStringAndSize((const char *)out.p, out.n);
    PyMem_Free(out.p);
    return result;
}

/* ---- the DML line lane: one whole Blob DML message -> its Entry (without rows) and its row ------- */

/* whether str `key` is the ASCII text s (n bytes) */
static inline int key_is(PyObject *key, const char *s, Py_ssize_t n) {
    return PyUnicode_IS_ASCII(key) && PyUnicode_GET_LENGTH(key) == n && !memcmp(PyUnicode_1BYTE_DATA(key), s, n);
}
#define KEY_IS(key, lit) key_is(key, lit, (Py_ssize_t)sizeof(lit) - 1)

/* d[key] (borrowed) or NULL with no error set: absent (an error of the lookup is cleared: the
 * dicts hold only str keys, orjson's) */
static inline PyObject *lane_get(PyObject *d, int key) {
    PyObject *v = PyDict_GetItemWithError(d, bridge_names[key]);
    if (v == NULL) PyErr_Clear();
    return v;
}

/* an exact int in [lo, hi] into *out; 0 for anything else (bool, another type, out of range) */
static int int_in(PyObject *v, long long lo, long long hi, long long *out) {
    if (v == NULL || !PyLong_CheckExact(v)) return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

/* an exact int in [0, 2^64) */
static int uint64_of(PyObject *v, uint64_t *out) {
    if (v == NULL || !PyLong_CheckExact(v)) return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

/* a str field (proto3: left out when empty); 0 for another type or text that is not UTF-8 */
static int put_str_field(Buf *b, uint32_t field, PyObject *v) {
    if (!PyUnicode_CheckExact(v)) return 0;
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(v, &n);
    if (u == NULL) {
        PyErr_Clear();
        return 0;
    }
    return put_len_field(b, field, u, n) ? 1 : -1;
}

static int put_varint_field(Buf *b, uint32_t field, uint64_t v) {
    if (v == 0) return 1; /* proto3: a default is left out */
    return bridge_put_varint(b, TAG(field, WT_VARINT)) && bridge_put_varint(b, v);
}

/* [[key, value], ...] of str pairs as repeated KVPair field `field` (decode.py's _add_kv); 0 for
 * any other shape (Python reports it) */
static int put_properties(Buf *h, uint32_t field, PyObject *pairs) {
    if (!PyList_CheckExact(pairs)) return 0;
    Buf kv = {NULL, 0, 0};
    int rc = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs) && rc > 0; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyList_CheckExact(pair) || PyList_GET_SIZE(pair) != 2) {
            rc = 0;
            break;
        }
        kv.n = 0;
        rc = put_str_field(&kv, F_KVPAIR_KEY, PyList_GET_ITEM(pair, 0));
        if (rc > 0) rc = put_str_field(&kv, F_KVPAIR_VALUE, PyList_GET_ITEM(pair, 1));
        if (rc > 0 && !put_message_field(h, field, kv.p, kv.n)) rc = -1;
    }
    PyMem_Free(kv.p);
    return rc;
}

/* dts.header's values by bridge_ext_header index into vals, its properties into *props (borrowed;
 * NULL where absent); 0 for a name the lane does not know (Python decides) */
static int header_values(PyObject *fields, PyObject *vals[N_EXT_HEADER], PyObject **props) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(fields, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) return 0;
        if (KEY_IS(key, "properties")) {
            *props = value;
            continue;
        }
        int i = 0;
        while (i < N_EXT_HEADER
               && !key_is(key, bridge_ext_header[i].name, (Py_ssize_t)strlen(bridge_ext_header[i].name)))
            i++;
        if (i == N_EXT_HEADER) return 0;
        vals[i] = value;
    }
    return 1;
}

/* dts.header's field of bridge_ext_header index i, value v; 0 for a value of another type or range */
static int put_ext_header_field(Buf *h, int i, PyObject *value) {
    uint32_t field = bridge_ext_header[i].field;
    long long x;
    uint64_t u;
    switch (bridge_ext_header[i].kind) {
    case H_INT32: /* negative: ten bytes, as protobuf */
        if (!int_in(value, INT32_MIN, INT32_MAX, &x)) return 0;
        return put_varint_field(h, field, (uint64_t)x) ? 1 : -1;
    case H_INT64:
        if (!int_in(value, INT64_MIN, INT64_MAX, &x)) return 0;
        return put_varint_field(h, field, (uint64_t)x) ? 1 : -1;
    case H_UINT64:
        if (!uint64_of(value, &u)) return 0;
        return put_varint_field(h, field, u) ? 1 : -1;
    case H_BOOL:
        if (value != Py_True && value != Py_False) return 0;
        return put_varint_field(h, field, value == Py_True) ? 1 : -1;
    default:
        return put_str_field(h, field, value);
    }
}

/* The Header's seqId of a sequenceId that is exactly sequence_id(seqId, row) (values.events), or 0
 * (a fact would travel: Python decides) */
static int seq_of(PyObject *seq, long long row, uint64_t *seq_id) {
    if (!PyUnicode_CheckExact(seq) || !PyUnicode_IS_ASCII(seq)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(seq);
    const uint8_t *s = PyUnicode_1BYTE_DATA(seq);
    if (n == 0 || n > 26 || (n > 1 && s[0] == '0')) return 0;
    for (Py_ssize_t k = 0; k < n; k++)
        if (s[k] < '0' || s[k] > '9') return 0;
    Py_ssize_t split = n > 6 ? n - 6 : 0;
    uint64_t high = 0;
    for (Py_ssize_t k = 0; k < split; k++) {
        unsigned digit = s[k] - '0';
        if (high > (UINT64_MAX - digit) / 10) return 0; /* seqId past 2^64 */
        high = high * 10 + digit;
    }
    long long low = 0;
    for (Py_ssize_t k = split; k < n; k++) low = low * 10 + (s[k] - '0');
    if (low != row) return 0;
    *seq_id = high;
    return 1;
}

/* Plan.lane(payload, ext, image, field, source, dml_type, columns) -> (entry, row, row_index, nrows)
 * or None. The usual DML message (bridge/blob/decode.py's BlobDecoder._lane has checked its
 * top-level and payload keys and that its column set and source need no fact) as the Python path
 * builds it: `entry` the Entry's bytes without rows (Header: messageType DML, dts.header's fields,
 * the timestamp, source's (sourceType, schemaName, tableName), the seqId; the DMLEvent's type and
 * `columns`, the column set's serialized columns), `row` the RowChange of the image `image` as
 * field `field`; None wherever the message needs a fact (eventTime not whole seconds, no
 * checkpointTime or another one, a systemTime, a sequenceId that is not seqId and row index),
 * carries a header field the lane does not set, or holds a value Plan.encode leaves to Python. */
PyObject *bridge_Plan_lane(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *payload, *ext, *image, *source, *columns;
    long field, dml_type;
    if (nargs != 7 || !PyDict_Check(args[0]) || (args[1] != Py_None && !PyDict_Check(args[1]))
        || !PyUnicode_Check(args[2]) || !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != 3
        || !PyBytes_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "lane(payload: dict, ext: dict | None, image: str, field: int, "
                                         "source: tuple, dml_type: int, columns: bytes)");
        return NULL;
    }
    payload = args[0];
    ext = args[1] == Py_None || PyDict_GET_SIZE(args[1]) == 0 ? NULL : args[1];
    image = args[2];
    source = args[4];
    columns = args[6];
    field = PyLong_AsLong(args[3]);
    if (field == -1 && PyErr_Occurred()) return NULL;
    dml_type = PyLong_AsLong(args[5]);
    if (dml_type == -1 && PyErr_Occurred()) return NULL;
    if (field != F_ROWCHANGE_OLDCOLUMNS && field != F_ROWCHANGE_NEWCOLUMNS) {
        PyErr_SetString(PyExc_ValueError, "field is 1 (oldColumns) or 2 (newColumns)");
        return NULL;
    }
    Buf h = {NULL, 0, 0}, ev = {NULL, 0, 0}, out = {NULL, 0, 0}, row = {NULL, 0, 0};
    PyObject *result = NULL;
    int rc = 0;
    /* the image's values */
    PyObject *body = PyDict_GetItemWithError(payload, image);
    PyObject *values = body != NULL && PyDict_CheckExact(body) ? lane_get(body, N_DATACOLUMN) : NULL;
    if (values == NULL || !PyDict_CheckExact(values)) goto none;
    /* the extension's parts */
    PyObject *fields = NULL, *raws = NULL, *charsets = NULL;
    long long row_index = 0, nrows = 1;
    if (ext != NULL) {
        fields = lane_get(ext, N_HEADER);
        if (fields != NULL && (!PyDict_CheckExact(fields) || PyDict_GET_SIZE(fields) == 0)) {
            if (!PyDict_CheckExact(fields)) goto none;
            fields = NULL; /* {}: nothing set, and no default version (the extension is there) */
        }
        raws = lane_get(ext, N_VALUES);
        charsets = lane_get(ext, N_CHARSETS);
        if ((raws != NULL && !PyDict_CheckExact(raws)) || (charsets != NULL && !PyDict_CheckExact(charsets)))
            goto none;
        if (raws != NULL && PyDict_GET_SIZE(raws) == 0) raws = NULL;
        if (charsets != NULL && PyDict_GET_SIZE(charsets) == 0) charsets = NULL;
        PyObject *rows = lane_get(ext, N_ROW);
        if (rows != NULL) {
            if (!PyList_CheckExact(rows) || PyList_GET_SIZE(rows) != 2
                || !int_in(PyList_GET_ITEM(rows, 0), 0, 999999, &row_index)
                || !int_in(PyList_GET_ITEM(rows, 1), 1, INT32_MAX, &nrows) || row_index >= nrows)
                goto none;
        }
    }
    /* the timestamp: whole seconds within a uint32, checkpointTime the same, no systemTime */
    PyObject *stamp = lane_get(payload, N_TIMESTAMP);
    long long event_time, checkpoint;
    if (stamp == NULL || !PyDict_CheckExact(stamp) || lane_get(stamp, N_SYSTEMTIME) != NULL
        || !int_in(lane_get(stamp, N_EVENTTIME), 0, 4294967295000LL, &event_time)
        || !int_in(lane_get(stamp, N_CHECKPOINTTIME), 0, 4294967295000LL, &checkpoint)
        || event_time % 1000 || checkpoint != event_time)
        goto none;
    uint64_t seq_id;
    PyObject *seq = lane_get(payload, N_SEQ);
    if (seq == NULL || !seq_of(seq, row_index, &seq_id)) goto none;
    long long source_type;
    if (!int_in(PyTuple_GET_ITEM(source, 0), 0, INT32_MAX, &source_type)) goto none;
    /* the Header, in field-number order with defaults left out: canonical, so equal Headers are
     * equal bytes (BlobDecoder groups an event's rows and pairs an update's halves by these bytes) */
    PyObject *vals[N_EXT_HEADER] = {NULL}, *props = NULL;
    if (fields != NULL && !header_values(fields, vals, &props)) goto none;
    if (fields == NULL && ext == NULL && !put_varint_field(&h, F_HEADER_VERSION, 1)) goto done;
    for (uint32_t f = 1; f <= F_HEADER_PROPERTIES; f++) {
        rc = 1;
        switch (f) {
        case F_HEADER_SOURCETYPE: rc = put_varint_field(&h, f, (uint64_t)source_type) ? 1 : -1; break;
        case F_HEADER_MESSAGETYPE: rc = put_varint_field(&h, f, MT_DML) ? 1 : -1; break;
        case F_HEADER_TIMESTAMP: rc = put_varint_field(&h, f, (uint64_t)(event_time / 1000)) ? 1 : -1; break;
        case F_HEADER_SCHEMANAME: rc = put_str_field(&h, f, PyTuple_GET_ITEM(source, 1)); break;
        case F_HEADER_TABLENAME: rc = put_str_field(&h, f, PyTuple_GET_ITEM(source, 2)); break;
        case F_HEADER_SEQID: rc = put_varint_field(&h, f, seq_id) ? 1 : -1; break;
        case F_HEADER_PROPERTIES: if (props != NULL) rc = put_properties(&h, f, props); break;
        default:
            for (int i = 0; i < N_EXT_HEADER; i++)
                if (bridge_ext_header[i].field == f && vals[i] != NULL) rc = put_ext_header_field(&h, i, vals[i]);
        }
        if (rc < 0) goto done;
        if (rc == 0) goto none;
    }
    /* the row */
    rc = encode_image(self, values, field, raws, charsets, &row);
    if (rc < 0) goto done;
    if (rc == 0) goto none;
    /* Entry: header, event { dmlEvent { dmlEventType, columns } } */
    Py_ssize_t ncol = PyBytes_GET_SIZE(columns);
    if (!put_varint_field(&ev, F_DMLEVENT_DMLEVENTTYPE, (uint64_t)dml_type)
        || !buf_put(&ev, PyBytes_AS_STRING(columns), ncol))
        goto done;
    if (!put_message_field(&out, F_ENTRY_HEADER, h.p, h.n) || !put_event_dml(&out, &ev)) goto done;
    result = Py_BuildValue("(y#y#LL)", out.p ? (const char *)out.p : "", out.n, row.p ? (const char *)row.p : "",
                           row.n, row_index, nrows); /* (y# of NULL would be None) */
    goto done;
none:
    if (PyErr_Occurred()) goto done;
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(h.p);
    PyMem_Free(ev.p);
    PyMem_Free(out.p);
    PyMem_Free(row.p);
    return result;
}

/* with_rows(entry, rows) -> entry + the Entry field event { dmlEvent { rows } } holding `rows` (a
 * list of RowChange bytes): protobuf merges a message field that comes twice, so the bytes parse
 * as `entry` with the rows appended to its DMLEvent (BlobDecoder's lane: an Entry completed
 * from its rows' bytes, one parse) */
PyObject *bridge_with_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyBytes_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "with_rows(entry: bytes, rows: list[bytes])");
        return NULL;
    }
    PyObject *rows = args[1];
    Buf dml = {NULL, 0, 0}, out = {NULL, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyBytes_CheckExact(row)) {
            PyErr_SetString(PyExc_TypeError, "with_rows: each row is bytes");
            goto done;
        }
        if (!put_message_field(&dml, F_DMLEVENT_ROWS, PyBytes_AS_STRING(row), PyBytes_GET_SIZE(row))) goto done;
    }
    if (!buf_put(&out, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0])) || !put_event_dml(&out, &dml)) goto done;
    result = PyBytes_FromStringAndSize((const char *)out.p, out.n);
done:
    PyMem_Free(dml.p);
    PyMem_Free(out.p);
    return result;
}
