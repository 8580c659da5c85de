/* What a checked value becomes: base64, the Python object the codecs return (the dict writer),
 * and the bytes orjson.dumps gives (the JSON writer). */
#include "speedups.h"

const char bridge_B64[65] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* standard base64 of n bytes into o (4 * ceil(n / 3) bytes) */
void bridge_base64_into(uint8_t *o, const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t x = ((uint32_t)p[i] << 16) | ((uint32_t)p[i + 1] << 8) | p[i + 2];
        *o++ = bridge_B64[x >> 18];
        *o++ = bridge_B64[(x >> 12) & 63];
        *o++ = bridge_B64[(x >> 6) & 63];
        *o++ = bridge_B64[x & 63];
    }
    if (n - i == 1) {
        uint32_t x = (uint32_t)p[i] << 16;
        *o++ = bridge_B64[x >> 18];
        *o++ = bridge_B64[(x >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (n - i == 2) {
        uint32_t x = ((uint32_t)p[i] << 16) | ((uint32_t)p[i + 1] << 8);
        *o++ = bridge_B64[x >> 18];
        *o++ = bridge_B64[(x >> 12) & 63];
        *o++ = bridge_B64[(x >> 6) & 63];
        *o++ = '=';
    }
}

/* ---- the dict writer: Python objects, as the codecs return them ------------------------------- */

PyObject *bridge_ascii_str(const uint8_t *p, Py_ssize_t n) {
    PyObject *s = PyUnicode_New(n, 127);
    if (s == NULL) return NULL;
    memcpy(PyUnicode_1BYTE_DATA(s), p, (size_t)n);
    return s;
}

/* new reference; NULL with no Python error set for a miss (bytes that are not UTF-8) */
PyObject *bridge_canon_object(const Canon *v) {
    switch (v->tag) {
    case C_INT: return PyLong_FromLongLong(v->i);
    case C_ASCII: return bridge_ascii_str(v->s.p, v->s.n);
    case C_FLOAT:
        if (v->i) { /* checked by its text only: read it now */
            char buf[64];
            memcpy(buf, v->s.p, (size_t)v->s.n);
            buf[v->s.n] = 0;
            double x = PyOS_string_to_double(buf, NULL, NULL);
            if (x == -1.0 && PyErr_Occurred()) return NULL;
            return PyFloat_FromDouble(x);
        }
        return PyFloat_FromDouble(v->d);
    case C_BOOL: {
        PyObject *b = v->i ? Py_True : Py_False;
        Py_INCREF(b);
        return b;
    }
    case C_B64: {
        PyObject *s = PyUnicode_New(((v->s.n + 2) / 3) * 4, 127);
        if (s != NULL) bridge_base64_into(PyUnicode_1BYTE_DATA(s), v->s.p, v->s.n);
        return s;
    }
    case C_NULL:
        Py_RETURN_NONE;
    case C_TABLE: { /* two passes over the units: the str's size and widest character, then its text */
        const uint8_t *p = v->s.p, *end = p + v->s.n;
        Py_ssize_t n = 0;
        uint32_t widest = 0;
        int len;
        while (p < end) {
            uint32_t cp = next_unit(v->table, p, end, &len);
            if (cp > 0x10FFFF) return NULL; /* a miss */
            widest = cp > widest ? cp : widest;
            n++;
            p += len;
        }
        PyObject *s = PyUnicode_New(n, widest);
        if (s == NULL) return NULL;
        int kind = PyUnicode_KIND(s);
        void *data = PyUnicode_DATA(s);
        p = v->s.p;
        for (Py_ssize_t i = 0; i < n; i++, p += len) PyUnicode_WRITE(kind, data, i, next_unit(v->table, p, end, &len));
        return s;
    }
    default: {
        PyObject *s = PyUnicode_DecodeUTF8((const char *)v->s.p, v->s.n, NULL);
        if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
        return s;
    }
    }
}

/* ---- the JSON writer: the bytes orjson.dumps gives for the same values ------------------------- */


/* decimal digits of x (no sign), as %llu writes them */
Py_ssize_t bridge_u64_text(unsigned long long x, char *out) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + x % 10);
        x /= 10;
    } while (x);
    Py_ssize_t len = 0;
    while (n) out[len++] = tmp[--n];
    return len;
}

static int buf_int(Buf *b, long long x) {
    char tmp[24];
    return buf_put(b, tmp, bridge_int_text(x, tmp));
}
/* A JSON string of UTF-8 bytes, escaped as orjson escapes; 0 for invalid UTF-8 (a miss), -1 on error. */
int bridge_json_string(Buf *b, const uint8_t *p, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (!bridge_buf_grow(b, n * 6 + 2)) return -1;
    uint8_t *o = b->p + b->n;
    const uint8_t *end = p + n;
    *o++ = '"';
    while (p < end) {
        uint8_t c = *p;
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            *o++ = c;
            p++;
            continue;
        }
        if (c >= 0x80) {
            int len = utf8_seq(p, end);
            if (!len) return 0;
            memcpy(o, p, (size_t)len);
            o += len;
            p += len;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\t': *o++ = 't'; break;
        case '\n': *o++ = 'n'; break;
        case '\f': *o++ = 'f'; break;
        case '\r': *o++ = 'r'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = (uint8_t)hex[c >> 4];
            *o++ = (uint8_t)hex[c & 15];
        }
        p++;
    }
    *o++ = '"';
    b->n = o - b->p;
    return 1;
}

int bridge_table_utf8(Buf *b, const struct Decoding *t, const uint8_t *p, Py_ssize_t n) {
    const uint8_t *end = p + n;
    if (!bridge_buf_grow(b, 2 * n)) return -1; /* a unit of one or two bytes is at most 3 bytes of UTF-8... */
    while (p < end) {
        int len;
        uint32_t cp = next_unit(t, p, end, &len);
        if (cp > 0x10FFFF) return 0;
        if (!bridge_buf_grow(b, 4)) return -1; /* ...or 4, past the BMP */
        b->n += utf8_put(b->p + b->n, cp);
        p += len;
    }
    return 1;
}

/* 1 written, 0 a miss, -1 error */
int bridge_canon_json(Buf *b, const Canon *v) {
    switch (v->tag) {
    case C_INT:
        if (v->s.n) return buf_put(b, v->s.p, v->s.n) ? 1 : -1;
        return buf_int(b, v->i) ? 1 : -1;
    case C_ASCII:
        if (!bridge_buf_grow(b, v->s.n + 2)) return -1;
        b->p[b->n++] = '"';
        memcpy(b->p + b->n, v->s.p, (size_t)v->s.n);
        b->n += v->s.n;
        b->p[b->n++] = '"';
        return 1;
    case C_FLOAT:
        /* repr() text; orjson writes the same digits except in exponent notation */
        if (memchr(v->s.p, 'e', (size_t)v->s.n)) return 0;
        return buf_put(b, v->s.p, v->s.n) ? 1 : -1;
    case C_BOOL:
        return (v->i ? buf_put(b, "true", 4) : buf_put(b, "false", 5)) ? 1 : -1;
    case C_NULL:
        return buf_put(b, "null", 4) ? 1 : -1;
    case C_TABLE: {
        /* the UTF-8 into b past its end, then escaped into place: orjson's escapes, one writer */
        Py_ssize_t start = b->n;
        int rc = bridge_table_utf8(b, v->table, v->s.p, v->s.n);
        if (rc <= 0) return rc;
        Py_ssize_t n = b->n - start;
        Buf tmp = {NULL, 0, 0};
        rc = buf_put(&tmp, b->p + start, n) ? 1 : -1;
        b->n = start;
        if (rc > 0) rc = bridge_json_string(b, n ? tmp.p : (const uint8_t *)"", n);
        PyMem_Free(tmp.p);
        return rc;
    }
    case C_B64: {
        Py_ssize_t len = ((v->s.n + 2) / 3) * 4;
        if (!bridge_buf_grow(b, len + 2)) return -1;
        b->p[b->n++] = '"';
        bridge_base64_into(b->p + b->n, v->s.p, v->s.n);
        b->n += len;
        b->p[b->n++] = '"';
        return 1;
    }
    default:
        return bridge_json_string(b, v->s.p, v->s.n);
    }
}


/* decimal text of a signed 64-bit integer into out (at least 21 bytes); its length */
Py_ssize_t bridge_int_text(long long x, char *out) {
    char tmp[24];
    int n = 0;
    unsigned long long mag = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    do {
        tmp[n++] = (char)('0' + mag % 10);
        mag /= 10;
    } while (mag);
    Py_ssize_t len = 0;
    if (x < 0) out[len++] = '-';
    while (n) out[len++] = tmp[--n];
    return len;
}
