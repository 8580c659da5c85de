/* What a checked value becomes: base64, the Python object the codecs return (the dict writer),
 * and the bytes orjson.dumps gives (the JSON writer). */
#include "speedups.h"
#include <float.h>

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

/* A str's UTF-8 form, kept in the str (CPython's own cache, which PyUnicode_AsUTF8AndSize fills
 * on first use and orjson.dumps reads): the writer has the bytes at hand, so the str it gives does
 * not make orjson encode its text again. `utf8` is exactly the str's UTF-8 (the text was decoded from
 * it strictly, or it was written from the text's code points).
 * Only into a str the writer has just made and nobody else holds: an exact, compact, non-ASCII str
 * with one reference (its own), not interned, no cache yet. CPython hands out shared strs too
 * (PyUnicode_FromKindAndData gives a one-character latin-1 text as its singleton, immortal or held
 * by its own table: never one reference), and those are left as they are.
 * Only on what the tests run: CPython (not PyPy, GraalPy, the limited API or a free-threaded build)
 * 3.11 and 3.12, where the cache is PyObject_Malloc'd memory freed with the str; on any other
 * build, or out of memory, the str has no cache, as any new str. */
#if !defined(Py_LIMITED_API) && !defined(Py_GIL_DISABLED) && !defined(PYPY_VERSION) && !defined(GRAALVM_PYTHON) \
    && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define BRIDGE_KEEP_UTF8 1
#else
#define BRIDGE_KEEP_UTF8 0
#endif

static void keep_utf8(PyObject *s, const uint8_t *utf8, Py_ssize_t n) {
#if BRIDGE_KEEP_UTF8
    PyCompactUnicodeObject *u = (PyCompactUnicodeObject *)s;
    if (!PyUnicode_CheckExact(s) || Py_REFCNT(s) != 1 || PyUnicode_CHECK_INTERNED(s) || !PyUnicode_IS_COMPACT(s)
        || PyUnicode_IS_ASCII(s) || u->utf8 != NULL)
        return;
    char *copy = PyObject_Malloc((size_t)n + 1);
    if (copy == NULL) return;
    memcpy(copy, utf8, (size_t)n);
    copy[n] = 0;
    u->utf8 = copy;
    u->utf8_length = n;
#else
    (void)s, (void)utf8, (void)n;
#endif
}

/* The code point of a valid UTF-8 sequence of len bytes (utf8_seq's) */
static inline uint32_t utf8_code(const uint8_t *p, int len) {
    switch (len) {
    case 1: return p[0];
    case 2: return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    case 3: return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    default: return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6
                    | (p[3] & 0x3F);
    }
}

/* The length of the valid UTF-8 sequence a lead byte starts (the bytes were checked by utf8_seq) */
static inline int utf8_len(uint8_t lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/* str of UTF-8 bytes, strictly decoded as Python's utf-8 codec decodes (utf8_seq), its UTF-8 kept
 * (keep_utf8); NULL with no error set for bytes that are not UTF-8 (a miss), NULL with an error
 * on a memory error. ASCII text is copied; other text takes two passes: its length and widest
 * character, then the text, in the str's own width. */
static PyObject *utf8_str(const uint8_t *p, Py_ssize_t n) {
    const uint8_t *q = p, *end = p + n;
    uint64_t word;
    while (end - q >= 8 && (memcpy(&word, q, 8), !(word & 0x8080808080808080ULL))) q += 8;
    while (q < end && *q < 0x80) q++;
    if (q == end) return bridge_ascii_str(p, n);
    Py_ssize_t count = q - p;
    uint32_t widest = 0;
    while (q < end) {
        if (*q < 0x80) {
            q++;
            count++;
            continue;
        }
        int len = utf8_seq(q, end);
        if (!len) return NULL;
        uint32_t cp = utf8_code(q, len);
        widest = cp > widest ? cp : widest;
        q += len;
        count++;
    }
    PyObject *s = PyUnicode_New(count, widest);
    if (s == NULL) return NULL;
    q = p;
    switch (PyUnicode_KIND(s)) {
    case PyUnicode_1BYTE_KIND: {
        Py_UCS1 *o = PyUnicode_1BYTE_DATA(s);
        while (q < end) {
            int len = utf8_len(*q);
            *o++ = (Py_UCS1)utf8_code(q, len);
            q += len;
        }
        break;
    }
    case PyUnicode_2BYTE_KIND: {
        Py_UCS2 *o = PyUnicode_2BYTE_DATA(s);
        while (q < end) {
            int len = utf8_len(*q);
            *o++ = (Py_UCS2)utf8_code(q, len);
            q += len;
        }
        break;
    }
    default: {
        Py_UCS4 *o = PyUnicode_4BYTE_DATA(s);
        while (q < end) {
            int len = utf8_len(*q);
            *o++ = utf8_code(q, len);
            q += len;
        }
    }
    }
    keep_utf8(s, p, n);
    return s;
}

/* The double of decimal text "-?D+(.D+)?" of at most 15 significant digits and 22 after the point,
 * into *out: 1, or 0 for any other text (PyOS_string_to_double reads it). Such a value is
 * m / 10**k with m < 2**53 and 10**k exact, so one IEEE division rounds it exactly as a correctly
 * rounded strtod does (Clinger's fast path); on a machine whose doubles are evaluated wider
 * (FLT_EVAL_METHOD != 0) the text always goes to Python's reader. */
static int short_decimal(const uint8_t *p, Py_ssize_t n, double *out) {
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
    static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const uint8_t *q = p, *end = p + n;
    int neg = q < end && *q == '-';
    q += neg;
    uint64_t m = 0;
    int digits = 0, scale = 0, point = 0, any = 0;
    for (; q < end; q++) {
        if (*q == '.') {
            if (point || !any) return 0;
            point = 1;
            continue;
        }
        if (*q < '0' || *q > '9') return 0;
        any = 1;
        if (m || *q != '0') digits++;
        if (digits > 15) return 0;
        m = m * 10 + (uint64_t)(*q - '0');
        scale += point;
    }
    if (!any || (point && q[-1] == '.') || scale > 22) return 0;
    double x = (double)m / POW10[scale];
    *out = neg ? -x : x;
    return 1;
#else
    (void)p, (void)n, (void)out;
    return 0;
#endif
}

/* The double of a C_FLOAT value (the float the dict writer makes): 1, or 0 with a Python error set */
int bridge_canon_double(const Canon *v, double *out) {
    if (!v->i) {
        *out = v->d;
        return 1;
    }
    /* checked by its text only (check_double: under 64 bytes): read it now */
    if (short_decimal(v->s.p, v->s.n, out)) return 1;
    char buf[64];
    if (v->s.n >= (Py_ssize_t)sizeof(buf)) {
        PyErr_SetString(PyExc_ValueError, "a float's text over 63 bytes");
        return 0;
    }
    memcpy(buf, v->s.p, (size_t)v->s.n);
    buf[v->s.n] = 0;
    *out = PyOS_string_to_double(buf, NULL, NULL);
    return !(*out == -1.0 && PyErr_Occurred());
}

/* new reference; NULL with no Python error set for a miss (bytes that are not UTF-8) */
PyObject *bridge_canon_object(const Canon *v) {
    switch (v->tag) {
    case C_INT: return PyLong_FromLongLong(v->i);
    case C_ASCII: return bridge_ascii_str(v->s.p, v->s.n);
    case C_FLOAT: {
        double x;
        return bridge_canon_double(v, &x) ? PyFloat_FromDouble(x) : NULL;
    }
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
    case C_TABLE: { /* one pass over the units (each read once: a two-byte charset's table is large), then the str */
        Py_UCS4 stack[256], *cps = stack;
        uint8_t stack8[4 * 256], *utf8 = stack8; /* at most 4 bytes of UTF-8 a unit */
        if (v->s.n > 256) {
            cps = PyMem_Malloc(sizeof(Py_UCS4) * (size_t)v->s.n); /* a unit is at least one byte */
            utf8 = PyMem_Malloc(4 * (size_t)v->s.n);
            if (cps == NULL || utf8 == NULL) {
                PyMem_Free(cps == stack ? NULL : cps);
                PyMem_Free(utf8 == stack8 ? NULL : utf8);
                return PyErr_NoMemory();
            }
        }
        const uint8_t *p = v->s.p, *end = p + v->s.n;
        Py_ssize_t n = 0, nutf8 = 0;
        PyObject *s = NULL;
        int len;
        while (p < end) {
            uint32_t cp = next_unit(v->table, p, end, &len);
            if (cp > 0x10FFFF) goto table_done; /* a miss */
            cps[n++] = cp;
            nutf8 += utf8_put(utf8 + nutf8, cp);
            p += len;
        }
        s = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, cps, n);
        if (s != NULL) keep_utf8(s, utf8, nutf8);
    table_done:
        if (cps != stack) PyMem_Free(cps);
        if (utf8 != stack8) PyMem_Free(utf8);
        return s;
    }
    default: {
        PyObject *s = utf8_str(v->s.p, v->s.n);
        if (s == NULL && PyErr_Occurred()) return NULL;
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
