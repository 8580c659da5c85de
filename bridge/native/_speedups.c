/* bridge.native._speedups: the DTS -> Blob (and DTS -> Tuple) value loop over an Entry's wire bytes, in C.
 *
 * A `Plan` is built once per column set (bridge/blob/rows.py: `native_plan`) from the same column
 * kinds the Python compiled image uses. `Plan.rows(entry_bytes)` walks Entry -> Event -> DMLEvent
 * -> RowChange -> Data on the wire and returns, per row, the dataColumn dict of its before and
 * after image, or None for an image it is not sure of.  It is a fast path only: every decision it
 * cannot make exactly as the Python codecs do (a non-canonical spelling, a charset other than the
 * column's, a value the codec would call inexact, an encoding protobuf would merge) gives None for
 * that image, or for the whole Entry, and the caller converts it with the Python path, which
 * stays the reference (tests/test_speedups.py compares the two). A Tuple plan (`Plan(columns,
 * lossless, Decimal)`, blob_rows.native_tuple_plan) takes the same checks to Tuple values:
 * `Plan.tuples` leaves a value it is not sure of as a hole TupleEncoder fills in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

enum {
    K_LONG = 0,      /* canonical integer text -> int, within [lo, hi] */
    K_DIGITS = 1,    /* canonical unsigned integer text -> the same text, within [0, uhi] */
    K_DOUBLE = 2,    /* text that is repr() of its double -> float */
    K_DECIMAL = 3,   /* -?[0-9]+(\.[0-9]+)? -> the same text */
    K_TEXT = 4,      /* text in any charset of the table `set_charsets` gave -> str */
    K_BASE64 = 5,    /* bytes -> standard base64 str */
    K_UTF8 = 6,      /* UTF-8 bytes without charset (json; time when need_bv) -> str */
    K_BOOL = 7,      /* INT8 "0" / "1" -> False / True */
    K_DATE = 8,      /* YYYY-MM-DD (UTC) -> epoch ms */
    K_DATETIME = 9,  /* YYYY-MM-DD HH:MM:SS[.f{fsp}] (UTC) -> epoch ms */
    K_TIMESTAMP = 10 /* the same with " +00:00" -> epoch ms */
};

#define DT_NIL 0
#define DT_NA 14

typedef struct {
    PyObject *name;
    int kind;
    int dt;
    long long lo, hi;
    unsigned long long uhi;
    char charset[32];
    Py_ssize_t charset_len;
    int fsp;
    int need_bv;
    char *key;  /* the JSON of the name and a colon, as orjson writes the key */
    Py_ssize_t key_len;
    int dup;    /* an earlier column has the same name (Blob -> DTS: one dataColumn key for both) */
    int cs_last;          /* K_TEXT: index + 1 in CHARSETS of the charset the last value named */
    char cs_text[32];     /* ... and that charset's text as the value spelt it */
    Py_ssize_t cs_text_len;
    PyObject *index_text; /* str(column index): its key in dts.values and dts.charsets, made once */
    PyObject *cs_obj;     /* the str of cs_text, made when a value's charset must travel */
    int out;              /* a Tuple plan's value of the column (O_*) */
} Col;

/* What a Tuple plan makes of a column's value besides the Blob value (tuple_encode.TO_TUPLE):
 * O_SAME the same object, O_DECIMAL a Decimal of the text, O_FLOAT32 the float32 a FLOAT field
 * stores, O_MICROS a temporal's epoch microseconds within DataHub's TIMESTAMP range, O_HEX the bytes
 * of a base64 column in lower-case hex (Options.tuple_binary). */
enum { O_SAME, O_DECIMAL, O_FLOAT32, O_MICROS, O_HEX };
#define TUPLE_TS_HI 253402271999000000LL /* tuple_encode.TIMESTAMP_RANGE's end */

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Col *cols;
    int lossless; /* what a value the Blob value cannot give back exactly costs: extension entries
                     (lossless) or, when it would change, a miss (strict: the codec reports it) */
    PyObject *decimal; /* a Tuple plan's Decimal type; NULL for a Blob plan */
} PlanObject;

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} Span;

typedef struct {
    int dt;
    unsigned seen; /* bit per field 1..4 */
    Span cs, sv, bv;
} DataView;

/* ---- a growing byte buffer ------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    Py_ssize_t n, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 1;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + more) cap *= 2;
    uint8_t *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static inline int buf_put(Buf *b, const void *p, Py_ssize_t n) {
    if (n <= 0) return 1; /* b->p may still be NULL, and memcpy's pointers must not be (C11 7.24.1) */
    if (!buf_grow(b, n)) return 0;
    memcpy(b->p + b->n, p, (size_t)n);
    b->n += n;
    return 1;
}

/* ---- wire reading ----------------------------------------------------------------------------- */

static inline int read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int shift = 0;
    while (p < end && shift < 64) {
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 1;
        }
        shift += 7;
    }
    return 0;
}

/* Skip one field's value of wire type wt; 0 on malformed or group wire types. */
static inline int skip_field(const uint8_t **pp, const uint8_t *end, int wt) {
    uint64_t v;
    switch (wt) {
    case 0:
        return read_varint(pp, end, &v);
    case 1:
        if (end - *pp < 8) return 0;
        *pp += 8;
        return 1;
    case 2:
        if (!read_varint(pp, end, &v) || v > (uint64_t)(end - *pp)) return 0;
        *pp += v;
        return 1;
    case 5:
        if (end - *pp < 4) return 0;
        *pp += 4;
        return 1;
    default:
        return 0;
    }
}

/* Read a length-delimited value into span; 0 on malformed. */
static inline int read_span(const uint8_t **pp, const uint8_t *end, Span *s) {
    uint64_t len;
    if (!read_varint(pp, end, &len) || len > (uint64_t)(end - *pp)) return 0;
    s->p = *pp;
    s->n = (Py_ssize_t)len;
    *pp += len;
    return 1;
}

/* The only occurrence of length-delimited field `want` in a message; 0 if absent, -1 if repeated
 * (protobuf would merge the occurrences) or malformed. */
static int only_submessage(const uint8_t *p, const uint8_t *end, uint32_t want, Span *out) {
    int found = 0;
    while (p < end) {
        uint64_t tag;
        if (!read_varint(&p, end, &tag)) return -1;
        uint32_t field = (uint32_t)(tag >> 3);
        int wt = (int)(tag & 7);
        if (field == want && wt == 2) {
            if (found) return -1;
            if (!read_span(&p, end, out)) return -1;
            found = 1;
        } else if (field == want || !skip_field(&p, end, wt)) {
            return -1;
        }
    }
    return found;
}

/* Data fields; 0 for anything but the four known fields, each at most once. A field written out
 * with its default (`08 00`: NIL spelt out, an empty string) reads as absent, as protobuf reads it. */
static int read_data(Span s, DataView *d) {
    const uint8_t *p = s.p, *end = s.p + s.n;
    d->dt = 0;
    d->seen = 0;
    d->cs.n = d->sv.n = d->bv.n = 0;
    d->cs.p = d->sv.p = d->bv.p = (const uint8_t *)"";
    while (p < end) {
        uint64_t tag;
        if (!read_varint(&p, end, &tag)) return 0;
        uint32_t field = (uint32_t)(tag >> 3);
        int wt = (int)(tag & 7);
        if (field < 1 || field > 4) return 0;
        if (d->seen & (1u << field)) return 0;
        d->seen |= 1u << field;
        if (field == 1) {
            uint64_t v;
            if (wt != 0 || !read_varint(&p, end, &v) || v > DT_NA) return 0;
            d->dt = (int)v;
        } else {
            Span *t = field == 2 ? &d->cs : field == 3 ? &d->sv : &d->bv;
            if (wt != 2 || !read_span(&p, end, t)) return 0;
        }
    }
    return 1;
}

/* ---- value checks: the canonical value of one Data for its column, or a miss ----------------- */

enum { C_INT, C_ASCII, C_FLOAT, C_UTF8, C_B64, C_BOOL, C_NULL, C_TABLE };

/* What a value needs besides its Blob value, as the codecs decide it (bridge/values/__init__.py):
 * X_CHARSET: text in a charset other than utf8mb4 (lossless: dts.charsets names it);
 * X_RAW: the Blob value is the same value spelt canonically (`Inexact(changed=False)`: lossless
 * carries the Data in dts.values, strict emits the value); X_CHANGED: the Blob value differs
 * (`Inexact`, changed: lossless carries the Data, strict leaves the image to the codec, which
 * reports it or applies its policy). */
enum { X_NONE, X_CHARSET, X_RAW, X_CHANGED };

typedef struct {
    int tag;
    int extra;      /* X_* */
    long long i;    /* C_INT, C_BOOL */
    long long us;   /* C_INT of a temporal: epoch microseconds (a Tuple TIMESTAMP) */
    double d;       /* C_FLOAT */
    Span s;         /* C_ASCII: the text itself; C_FLOAT: its text; C_UTF8 / C_B64: the bytes */
    const struct Decoding *table; /* C_TABLE: the charset's units (s: the bytes) */
    char text[40];  /* C_FLOAT of a non-canonical spelling: repr() of the double (s points here) */
} Canon;

static int canonical_int(Span sv, int allow_minus, int *negative) {
    const uint8_t *p = sv.p;
    Py_ssize_t n = sv.n;
    *negative = 0;
    if (n > 0 && p[0] == '-') {
        if (!allow_minus) return 0;
        *negative = 1;
        p++;
        n--;
    }
    if (n < 1 || n > 20) return 0;
    if (p[0] == '0' && (n > 1 || *negative)) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9') return 0;
    return 1;
}

/* magnitude of canonical digits, 0 on overflow of 64 bits */
static int magnitude(const uint8_t *p, Py_ssize_t n, unsigned long long *out) {
    unsigned long long mag = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned digit = p[i] - '0';
        if (mag > (ULLONG_MAX - digit) / 10) return 0;
        mag = mag * 10 + digit;
    }
    *out = mag;
    return 1;
}

static int check_long(const Col *c, const DataView *d, Canon *v) {
    int neg;
    unsigned long long mag;
    if (d->cs.n || d->bv.n || !canonical_int(d->sv, 1, &neg)) return 0;
    if (!magnitude(d->sv.p + neg, d->sv.n - neg, &mag)) return 0;
    long long x;
    if (neg) {
        if (mag > (unsigned long long)LLONG_MAX + 1ULL) return 0;
        x = mag == (unsigned long long)LLONG_MAX + 1ULL ? LLONG_MIN : -(long long)mag;
    } else {
        if (mag > (unsigned long long)LLONG_MAX) return 0;
        x = (long long)mag;
    }
    if (x < c->lo || x > c->hi) return 0;
    v->tag = C_INT;
    v->i = x;
    v->s = d->sv;
    return 1;
}

static int check_digits(const Col *c, const DataView *d, Canon *v) {
    int neg;
    unsigned long long mag;
    if (d->cs.n || d->bv.n || !canonical_int(d->sv, 0, &neg)) return 0;
    if (!magnitude(d->sv.p, d->sv.n, &mag) || mag > c->uhi) return 0;
    v->tag = C_ASCII;
    v->s = d->sv;
    return 1;
}

/* Text that is repr() of its double without computing repr: -?(0|[1-9][0-9]*)\.[0-9]+ with no
 * trailing zero in the fraction (but "N.0"), 1 to 15 significant digits and a magnitude from
 * 1e-4 up (below 1e16 follows from the digits). Fifteen digits (DBL_DIG) make the text the only
 * one of its length or shorter that reads as its double, so it is the shortest repr, and repr
 * writes doubles of that magnitude in fixed notation. 0: not known (repr decides). */
static int repr_text(Span sv) {
    const uint8_t *p = sv.p, *end = sv.p + sv.n;
    if (p < end && *p == '-') p++;
    const uint8_t *int_start = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    Py_ssize_t int_len = p - int_start;
    if (int_len == 0 || (int_len > 1 && *int_start == '0') || p == end || *p != '.') return 0;
    const uint8_t *frac = ++p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    Py_ssize_t frac_len = p - frac;
    if (p != end || frac_len == 0) return 0;
    int frac_zero = frac_len == 1 && frac[0] == '0';
    if (!frac_zero && end[-1] == '0') return 0;
    Py_ssize_t sig;
    if (*int_start == '0') {
        if (frac_zero) return 0; /* 0.0 and -0.0: left to repr */
        Py_ssize_t zeros = 0;
        while (frac[zeros] == '0') zeros++;
        if (zeros > 3) return 0; /* below 1e-4 repr writes an exponent */
        sig = frac_len - zeros;
    } else {
        sig = int_len + (frac_zero ? 0 : frac_len);
    }
    return sig <= 15;
}

/* The float codec's number syntax, [+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?: text it reads with float(). */
static int float_text(Span sv) {
    const uint8_t *p = sv.p, *end = sv.p + sv.n;
    if (p < end && (*p == '+' || *p == '-')) p++;
    const uint8_t *digits = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    Py_ssize_t before = p - digits, after = 0;
    if (p < end && *p == '.') {
        const uint8_t *frac = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        after = p - frac;
    }
    if (before == 0 && after == 0) return 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const uint8_t *exp = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == exp) return 0;
    }
    return p == end;
}

static int check_double(const Col *c, const DataView *d, Canon *v) {
    char buf[64];
    if (d->cs.n || d->bv.n || d->sv.n == 0 || d->sv.n >= (Py_ssize_t)sizeof(buf)) return 0;
    if (repr_text(d->sv)) {
        v->tag = C_FLOAT;
        v->i = 1; /* the double itself is read only when a dict needs it */
        v->s = d->sv;
        return 1;
    }
    memcpy(buf, d->sv.p, (size_t)d->sv.n);
    buf[d->sv.n] = 0;
    char *endp = NULL;
    double x = PyOS_string_to_double(buf, &endp, NULL);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (endp != buf + d->sv.n || !isfinite(x)) return 0;
    char *again = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (again == NULL) {
        PyErr_Clear();
        return 0;
    }
    v->tag = C_FLOAT;
    v->i = 0;
    v->d = x;
    v->s = d->sv;
    if (strcmp(again, buf)) {
        /* another spelling of the double ("1" for 1.0, as DTS writes whole doubles): the value is
         * its repr(), the Data travels as X_RAW; repr() in exponent notation is left to Python */
        size_t n = strlen(again);
        int ok = float_text(d->sv) && n < sizeof(v->text) && !memchr(again, 'e', n);
        if (ok) {
            memcpy(v->text, again, n);
            v->s.p = (const uint8_t *)v->text;
            v->s.n = (Py_ssize_t)n;
            v->extra = X_RAW;
        }
        PyMem_Free(again);
        return ok;
    }
    PyMem_Free(again);
    return 1;
}

static int check_decimal(const Col *c, const DataView *d, Canon *v) {
    const uint8_t *p = d->sv.p, *end = d->sv.p + d->sv.n;
    if (d->cs.n || d->bv.n) return 0;
    if (p < end && *p == '-') p++;
    const uint8_t *digits = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    if (p == digits) return 0;
    if (p < end) {
        if (*p != '.') return 0;
        p++;
        const uint8_t *frac = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == frac || p != end) return 0;
    }
    v->tag = C_ASCII;
    v->s = d->sv;
    return 1;
}

static int same_charset(const Col *c, const DataView *d) {
    return d->cs.n == c->charset_len && !memcmp(d->cs.p, c->charset, (size_t)c->charset_len);
}

/* ---- charsets: MySQL charset name -> how its text decodes (values.CHARSETS, given once) ------- */

enum { CS_UTF8, CS_CODEC, CS_CHARMAP };

/* A charset's text units, read off its codec once (`decoding_of`): the code point + 1 of each
 * byte that is a character alone, and of each two-byte sequence, 0 where the codec refuses the
 * unit or where it does not come back from encoding its character (a unit C must not take).
 * The codecs of the table are stateless, so text is its units in order and, when each unit comes
 * back, so does the text: the check `_text_codec` makes on the whole value. */
struct Decoding {
    uint32_t single[256];
    uint32_t *pair; /* 65536 entries, or NULL: a charset of single bytes */
};

typedef struct {
    char name[32];     /* lower case, as values.charset_codec looks names up */
    Py_ssize_t name_len;
    int mode;          /* CS_UTF8: checked here; CS_CODEC: Python's codec by name; CS_CHARMAP: a table */
    char codec[32];
    PyObject *mapping; /* CS_CHARMAP: the 256-character decoding table */
    int check;         /* decode then encode is not the identity: the bytes must come back */
    struct Decoding *decoding; /* built on the first value in this charset; NULL: not yet (or failed) */
    int failed;
} Charset;

/* The one code point of `unit` as the charset decodes it, if encoding it gives `unit` back (or the
 * codec is the identity); 0 otherwise. */
static uint32_t unit_of(const Charset *cs, const char *unit, Py_ssize_t n) {
    PyObject *text = cs->mode == CS_CHARMAP ? PyUnicode_DecodeCharmap(unit, n, cs->mapping, "strict")
                                            : PyUnicode_Decode(unit, n, cs->codec, "strict");
    if (text == NULL) {
        PyErr_Clear();
        return 0;
    }
    uint32_t cp = 0;
    if (PyUnicode_GET_LENGTH(text) == 1) {
        Py_UCS4 ch = PyUnicode_READ_CHAR(text, 0);
        cp = ch >= 0xD800 && ch <= 0xDFFF ? 0 : (uint32_t)ch + 1;
    }
    if (cp && cs->check) {
        PyObject *again = PyUnicode_AsEncodedString(text, cs->codec, "strict");
        if (again == NULL || PyBytes_GET_SIZE(again) != n || memcmp(PyBytes_AS_STRING(again), unit, (size_t)n)) cp = 0;
        Py_XDECREF(again);
        PyErr_Clear();
    }
    Py_DECREF(text);
    return cp;
}

/* The charset's Decoding, built on first use (a few ms for a two-byte charset); NULL: none. */
static const struct Decoding *decoding_of(Charset *cs) {
    if (cs->decoding != NULL || cs->failed) return cs->decoding;
    struct Decoding *t = PyMem_Calloc(1, sizeof(struct Decoding));
    if (t == NULL) goto fail;
    int leads = 0;
    for (int b = 0; b < 256; b++) {
        char unit = (char)b;
        t->single[b] = unit_of(cs, &unit, 1);
        leads += t->single[b] == 0;
    }
    if (cs->mode == CS_CODEC && leads) {
        t->pair = PyMem_Calloc(65536, sizeof(uint32_t));
        if (t->pair == NULL) goto fail;
        for (int a = 0; a < 256; a++) {
            if (t->single[a]) continue; /* a character alone never starts a pair */
            for (int b = 0; b < 256; b++) {
                char unit[2] = {(char)a, (char)b};
                t->pair[a << 8 | b] = unit_of(cs, unit, 2);
            }
        }
    }
    cs->decoding = t;
    return t;
fail:
    if (t != NULL) PyMem_Free(t->pair);
    PyMem_Free(t);
    PyErr_Clear();
    cs->failed = 1;
    return NULL;
}

/* The next character of text in a Decoding: its code point, and *len its bytes; 0 when C does not
 * know it (a unit of more bytes, one the codec refuses or one that does not come back). */
static inline uint32_t next_unit(const struct Decoding *t, const uint8_t *p, const uint8_t *end, int *len) {
    uint32_t cp = t->single[p[0]];
    if (cp) {
        *len = 1;
        return cp - 1;
    }
    if (t->pair == NULL || end - p < 2 || (cp = t->pair[p[0] << 8 | p[1]]) == 0) return 0x110000;
    *len = 2;
    return cp - 1;
}

/* UTF-8 of a code point into o; its length */
static inline int utf8_put(uint8_t *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 63));
        o[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 63));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 63));
    o[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

/* The UTF-8 of text in a Decoding into b (appended, not escaped): 1, 0 a unit C does not know, -1 */
static int table_utf8(Buf *b, const struct Decoding *t, const uint8_t *p, Py_ssize_t n);

#define MAX_CHARSETS 96
static Charset CHARSETS[MAX_CHARSETS];
static int NCHARSETS = 0;

/* The table entry of a value's charset (case-insensitive), or NULL: no text codec (binary, an
 * unknown name). The column keeps the last one found, so a column of one charset looks once. */
static Charset *charset_of(Col *c, Span cs) {
    if (c->cs_last && cs.n == c->cs_text_len && !memcmp(cs.p, c->cs_text, (size_t)cs.n))
        return &CHARSETS[c->cs_last - 1];
    if (cs.n >= 32) return NULL;
    char lower[32];
    for (Py_ssize_t i = 0; i < cs.n; i++) {
        uint8_t ch = cs.p[i];
        lower[i] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    for (int k = 0; k < NCHARSETS; k++) {
        if (CHARSETS[k].name_len == cs.n && !memcmp(CHARSETS[k].name, lower, (size_t)cs.n)) {
            c->cs_last = k + 1;
            memcpy(c->cs_text, cs.p, (size_t)cs.n);
            c->cs_text_len = cs.n;
            Py_CLEAR(c->cs_obj);
            return &CHARSETS[k];
        }
    }
    return NULL;
}

/* Text in the column's own charset (utf8mb4) is read as UTF-8 while it is written; any other
 * charset of the table is decoded by its codec here, and must come back to the same bytes where
 * the codec is not the identity (as `_text_codec` checks), else a miss. */
static int check_text(Col *c, const DataView *d, Canon *v) {
    if (d->sv.n) return 0;
    v->tag = C_UTF8;
    v->s = d->bv;
    if (same_charset(c, d)) return 1;
    Charset *cs = charset_of(c, d->cs);
    if (cs == NULL) return 0;
    v->extra = X_CHARSET;
    if (cs->mode == CS_UTF8) return 1;
    /* decoded while written, unit by unit (a unit C does not know is a miss: Python decides) */
    v->table = decoding_of(cs);
    if (v->table == NULL) return 0;
    v->tag = C_TABLE;
    return 1;
}

static int check_base64(const Col *c, const DataView *d, Canon *v) {
    if (d->sv.n || !same_charset(c, d)) return 0;
    v->tag = C_B64;
    v->s = d->bv;
    return 1;
}

static int check_utf8(const Col *c, const DataView *d, Canon *v) {
    if (d->sv.n || d->cs.n || (c->need_bv && !d->bv.n)) return 0;
    v->tag = C_UTF8;
    v->s = d->bv;
    return 1;
}

static int check_bool(const Col *c, const DataView *d, Canon *v) {
    if (d->cs.n || d->bv.n || d->sv.n != 1 || (d->sv.p[0] != '0' && d->sv.p[0] != '1')) return 0;
    v->tag = C_BOOL;
    v->i = d->sv.p[0] == '1';
    return 1;
}

static int digits_at(const uint8_t *p, int n, int *out) {
    int x = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        x = x * 10 + (p[i] - '0');
    }
    *out = x;
    return 1;
}

/* Days from 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static long long days_from_civil(long long y, unsigned m, unsigned d) {
    y -= m <= 2;
    const long long era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

/* Canonical text of the column's layout in UTC -> epoch ms. A charset on it (DTS may name one) or
 * sub-millisecond digits make it an X_RAW / X_CHANGED value, as the temporal codec decides. */
static int check_temporal(const Col *c, const DataView *d, Canon *v) {
    if (d->sv.n) return 0;
    const uint8_t *p = d->bv.p;
    Py_ssize_t want = c->kind == K_DATE ? 10 : 19 + (c->fsp ? 1 + c->fsp : 0);
    if (c->kind == K_TIMESTAMP) want += 7;
    if (d->bv.n != want) return 0;
    int y, mo, da, hh = 0, mi = 0, ss = 0, frac = 0;
    if (!digits_at(p, 4, &y) || p[4] != '-' || !digits_at(p + 5, 2, &mo) || p[7] != '-'
        || !digits_at(p + 8, 2, &da))
        return 0;
    if (c->kind != K_DATE) {
        if (p[10] != ' ' || !digits_at(p + 11, 2, &hh) || p[13] != ':' || !digits_at(p + 14, 2, &mi)
            || p[16] != ':' || !digits_at(p + 17, 2, &ss))
            return 0;
        if (c->fsp) {
            if (p[19] != '.' || !digits_at(p + 20, c->fsp, &frac)) return 0;
            for (int i = c->fsp; i < 6; i++) frac *= 10;
        }
        if (c->kind == K_TIMESTAMP && memcmp(p + want - 7, " +00:00", 7)) return 0;
    }
    static const int dim[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1 || mo < 1 || mo > 12 || da < 1 || da > dim[mo - 1] + (mo == 2 && leap) || hh > 23 || mi > 59
        || ss > 59) {
        /* a zero date (0000-00-00, legal MySQL data) or another day or time that does not exist: no
         * epoch time, so null and the Data as sent (lossless); strict applies its zero_dates policy */
        v->tag = C_NULL;
        v->extra = X_CHANGED;
        return 1;
    }
    if (frac % 1000) v->extra = X_CHANGED; /* sub-millisecond digits: epoch ms cannot hold them */
    else if (d->cs.n) v->extra = X_RAW;
    v->tag = C_INT;
    v->us = (days_from_civil(y, (unsigned)mo, (unsigned)da) * 86400LL + hh * 3600LL + mi * 60LL + ss) * 1000000LL
            + frac;
    v->i = (v->us - frac) / 1000LL + frac / 1000;
    v->s.n = 0; /* no text: written from i */
    return 1;
}

static int check_value(Col *c, const DataView *d, Canon *v) {
    switch (c->kind) {
    case K_LONG: return check_long(c, d, v);
    case K_DIGITS: return check_digits(c, d, v);
    case K_DOUBLE: return check_double(c, d, v);
    case K_DECIMAL: return check_decimal(c, d, v);
    case K_TEXT: return check_text(c, d, v);
    case K_BASE64: return check_base64(c, d, v);
    case K_UTF8: return check_utf8(c, d, v);
    case K_BOOL: return check_bool(c, d, v);
    default: return check_temporal(c, d, v);
    }
}

/* Outcome of one Data: a value, a bare NA (the column is left out), or a miss. */
enum { V_VALUE, V_NULL, V_SKIP, V_MISS };

/* `*d` gets the Data's fields (an X_RAW / X_CHANGED value's extension entry is written from them). */
static int classify(Col *c, Span data, Canon *v, DataView *d) {
    v->extra = X_NONE;
    if (!read_data(data, d)) return V_MISS;
    int bare = !d->cs.n && !d->sv.n && !d->bv.n; /* nothing the codec would carry raw */
    if (d->dt == DT_NIL) return bare ? V_NULL : V_MISS;
    if (d->dt == DT_NA) return bare ? V_SKIP : V_MISS;
    if (d->dt != c->dt || !check_value(c, d, v)) return V_MISS;
    return V_VALUE;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void base64_into(uint8_t *o, const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t x = ((uint32_t)p[i] << 16) | ((uint32_t)p[i + 1] << 8) | p[i + 2];
        *o++ = B64[x >> 18];
        *o++ = B64[(x >> 12) & 63];
        *o++ = B64[(x >> 6) & 63];
        *o++ = B64[x & 63];
    }
    if (n - i == 1) {
        uint32_t x = (uint32_t)p[i] << 16;
        *o++ = B64[x >> 18];
        *o++ = B64[(x >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (n - i == 2) {
        uint32_t x = ((uint32_t)p[i] << 16) | ((uint32_t)p[i + 1] << 8);
        *o++ = B64[x >> 18];
        *o++ = B64[(x >> 12) & 63];
        *o++ = B64[(x >> 6) & 63];
        *o++ = '=';
    }
}

/* ---- the dict writer: Python objects, as the codecs return them ------------------------------- */

static PyObject *ascii_str(const uint8_t *p, Py_ssize_t n) {
    PyObject *s = PyUnicode_New(n, 127);
    if (s == NULL) return NULL;
    memcpy(PyUnicode_1BYTE_DATA(s), p, (size_t)n);
    return s;
}

/* new reference; NULL with no Python error set for a miss (bytes that are not UTF-8) */
static PyObject *canon_object(const Canon *v) {
    switch (v->tag) {
    case C_INT: return PyLong_FromLongLong(v->i);
    case C_ASCII: return ascii_str(v->s.p, v->s.n);
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
        if (s != NULL) base64_into(PyUnicode_1BYTE_DATA(s), v->s.p, v->s.n);
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

static Py_ssize_t int_text(long long x, char *out);

/* decimal digits of x (no sign), as %llu writes them */
static Py_ssize_t u64_text(unsigned long long x, char *out) {
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
    return buf_put(b, tmp, int_text(x, tmp));
}

/* Length of the valid UTF-8 sequence starting at p (strict, as Python decodes), 0 if invalid. */
static inline int utf8_seq(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return end - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c < 0xF5) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}

/* A JSON string of UTF-8 bytes, escaped as orjson escapes; 0 for invalid UTF-8 (a miss), -1 on error. */
static int json_string(Buf *b, const uint8_t *p, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (!buf_grow(b, n * 6 + 2)) return -1;
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

static int table_utf8(Buf *b, const struct Decoding *t, const uint8_t *p, Py_ssize_t n) {
    const uint8_t *end = p + n;
    if (!buf_grow(b, 2 * n)) return -1; /* a unit of one or two bytes is at most 3 bytes of UTF-8... */
    while (p < end) {
        int len;
        uint32_t cp = next_unit(t, p, end, &len);
        if (cp > 0x10FFFF) return 0;
        if (!buf_grow(b, 4)) return -1; /* ...or 4, past the BMP */
        b->n += utf8_put(b->p + b->n, cp);
        p += len;
    }
    return 1;
}

/* 1 written, 0 a miss, -1 error */
static int canon_json(Buf *b, const Canon *v) {
    switch (v->tag) {
    case C_INT:
        if (v->s.n) return buf_put(b, v->s.p, v->s.n) ? 1 : -1;
        return buf_int(b, v->i) ? 1 : -1;
    case C_ASCII:
        if (!buf_grow(b, v->s.n + 2)) return -1;
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
        int rc = table_utf8(b, v->table, v->s.p, v->s.n);
        if (rc <= 0) return rc;
        Py_ssize_t n = b->n - start;
        Buf tmp = {NULL, 0, 0};
        rc = buf_put(&tmp, b->p + start, n) ? 1 : -1;
        b->n = start;
        if (rc > 0) rc = json_string(b, n ? tmp.p : (const uint8_t *)"", n);
        PyMem_Free(tmp.p);
        return rc;
    }
    case C_B64: {
        Py_ssize_t len = ((v->s.n + 2) / 3) * 4;
        if (!buf_grow(b, len + 2)) return -1;
        b->p[b->n++] = '"';
        base64_into(b->p + b->n, v->s.p, v->s.n);
        b->n += len;
        b->p[b->n++] = '"';
        return 1;
    }
    default:
        return json_string(b, v->s.p, v->s.n);
    }
}

/* ---- images and rows -------------------------------------------------------------------------- */

enum { N_SCHEMA, N_PAYLOAD, N_VERSION, N_DTS, N_DATACOLUMN, N_OP, N_SEQ, N_TIMESTAMP, N_HEADER, N_COLUMNS,
       N_ROW, N_CHARSETS, N_VALUES, N_DATATYPE, N_CHARSET, N_SV, N_BV, N_NAMES };
static const char *const NAME_TEXT[N_NAMES] = {"schema", "payload", "version", "dts", "dataColumn", "op",
                                                "sequenceId", "timestamp", "header", "columns", "row",
                                                "charsets", "values", "dataType",
                                                "charset", "sv", "bv"};
static PyObject *NAMES[N_NAMES]; /* interned once: the keys of every message dict */

/* data_to_raw(d) of values.py: the exact fields of a Data, bv as base64; NULL on error. */
static PyObject *charset_text(Col *c, Span cs);

static PyObject *raw_dict(Col *c, const DataView *d) {
    PyObject *out = PyDict_New(), *item = NULL;
    if (out == NULL) return NULL;
    if ((item = PyLong_FromLong(d->dt)) == NULL || PyDict_SetItem(out, NAMES[N_DATATYPE], item) < 0) goto error;
    Py_CLEAR(item);
    if (d->cs.n && ((item = charset_text(c, d->cs)) == NULL || PyDict_SetItem(out, NAMES[N_CHARSET], item) < 0))
        goto error;
    Py_CLEAR(item);
    if (d->sv.n && ((item = PyUnicode_DecodeUTF8((const char *)d->sv.p, d->sv.n, NULL)) == NULL
                    || PyDict_SetItem(out, NAMES[N_SV], item) < 0))
        goto error;
    Py_CLEAR(item);
    if (d->bv.n) {
        Canon b64 = {.tag = C_B64, .s = d->bv};
        if ((item = canon_object(&b64)) == NULL || PyDict_SetItem(out, NAMES[N_BV], item) < 0) goto error;
        Py_CLEAR(item);
    }
    return out;
error:
    Py_XDECREF(item);
    Py_DECREF(out);
    return NULL;
}

/* The str of a text value's charset (new reference): the column's last, kept. */
static PyObject *charset_text(Col *c, Span cs) {
    if (cs.n != c->cs_text_len || memcmp(cs.p, c->cs_text, (size_t)cs.n)) {
        if (c->kind == K_TEXT || cs.n >= (Py_ssize_t)sizeof(c->cs_text)) /* K_TEXT's is charset_of's */
            return PyUnicode_DecodeUTF8((const char *)cs.p, cs.n, NULL);
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
 * parts `_image` of blob_encode.py gives. */
static PyObject *image(PlanObject *plan, const Span *datas, Py_ssize_t count) {
    if (count != plan->ncols) Py_RETURN_NONE;
    PyObject *out = _PyDict_NewPresized(count), *raws = NULL, *charsets = NULL; /* no resize while filled */
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        Col *c = &plan->cols[i];
        Canon v;
        DataView d;
        PyObject *obj;
        switch (classify(c, datas[i], &v, &d)) {
        case V_MISS: goto miss;
        case V_SKIP: continue;
        case V_NULL:
            obj = Py_None;
            Py_INCREF(obj);
            break;
        default:
            if (v.extra == X_CHANGED && !plan->lossless) goto miss;
            obj = canon_object(&v);
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

/* The extension entries of one image, as JSON members: `"3":"gbk"` of dts.charsets and
 * `"4":{"dataType":13,...}` of dts.values (data_to_raw), comma-separated, in column order. */
typedef struct {
    Buf charsets, values;
} Extras;

/* orjson's `{"dataType":13,"charset":"utf8mb4","bv":"..."}` of data_to_raw(d): 1, 0 a miss, -1 */
static int raw_json(Buf *b, const DataView *d) {
    char digits[24];
    if (!buf_put(b, "{\"dataType\":", 12) || !buf_put(b, digits, int_text(d->dt, digits))) return -1;
    int rc = 1;
    if (d->cs.n && (!buf_put(b, ",\"charset\":", 11) || (rc = json_string(b, d->cs.p, d->cs.n)) <= 0))
        return rc <= 0 ? rc : -1;
    if (d->sv.n && (!buf_put(b, ",\"sv\":", 6) || (rc = json_string(b, d->sv.p, d->sv.n)) <= 0))
        return rc <= 0 ? rc : -1;
    if (d->bv.n) {
        Canon b64 = {.tag = C_B64, .s = d->bv};
        if (!buf_put(b, ",\"bv\":", 6) || canon_json(b, &b64) <= 0) return -1;
    }
    return buf_put(b, "}", 1) ? 1 : -1;
}

/* `"index":` into an extras buffer, after a comma when it holds a member already */
static int index_key(Buf *b, Py_ssize_t index) {
    char digits[24];
    Py_ssize_t nd = int_text(index, digits);
    return (!b->n || buf_put(b, ",", 1)) && buf_put(b, "\"", 1) && buf_put(b, digits, nd) && buf_put(b, "\":", 2);
}

/* A value's extension entry: 1, 0 a miss (strict and changed; lossless without `x`), -1 error. */
static int value_extras(const PlanObject *plan, const Canon *v, const DataView *d, Py_ssize_t index, Extras *x) {
    if (v->extra == X_NONE) return 1;
    if (!plan->lossless) return v->extra != X_CHANGED;
    if (x == NULL) return 0;
    if (v->extra == X_CHARSET) {
        if (!index_key(&x->charsets, index)) return -1;
        return json_string(&x->charsets, d->cs.p, d->cs.n);
    }
    if (!index_key(&x->values, index)) return -1;
    return raw_json(&x->values, d);
}

/* dataColumn JSON object of one image into b: 1 written, 0 a miss, -1 error. `spans`, when
 * given (2 per column), gets each value's [start, end) in b, or -1 for a column left out (NA);
 * `written` the number of values written; `x` (emptied first) the image's extension entries in
 * lossless mode (NULL: an image that needs any is a miss). */
static int image_json(PlanObject *plan, Buf *b, const Span *datas, Py_ssize_t count, Py_ssize_t *spans,
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
        int kind = classify(c, datas[i], &v, &d);
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
            if (rc > 0) rc = canon_json(b, &v);
        }
        if (rc <= 0) return rc;
        if (spans) spans[2 * i + 1] = b->n;
    }
    return buf_put(b, "}", 1) ? 1 : -1;
}

/* Collect the Data of field `want` of a RowChange, up to `cap`; count may exceed cap (a miss). */
static int row_datas(Span row, uint32_t want, Span *datas, Py_ssize_t cap, Py_ssize_t *count) {
    const uint8_t *p = row.p, *end = row.p + row.n;
    *count = 0;
    while (p < end) {
        uint64_t tag;
        if (!read_varint(&p, end, &tag)) return 0;
        uint32_t field = (uint32_t)(tag >> 3);
        int wt = (int)(tag & 7);
        if (field == want) {
            Span s;
            if (wt != 2 || !read_span(&p, end, &s)) return 0;
            if (*count < cap) datas[*count] = s;
            (*count)++;
        } else if (!skip_field(&p, end, wt)) {
            return 0;
        }
    }
    return 1;
}

/* The Event span of an Entry and the DMLEvent span inside it, each the only occurrence; 0 if not. */
static int dml_span(const uint8_t *start, const uint8_t *end, Span *event, Span *dml) {
    return only_submessage(start, end, 2, event) == 1
           && only_submessage(event->p, event->p + event->n, 2, dml) == 1;
}

static int entry_fields_known(const uint8_t *start, const uint8_t *end);

/* The DML event of an Entry whose Event holds only a dmlEvent (no event properties, no other
 * event): the span of its column fields (one contiguous run), its dmlEventType (0..2) and its row
 * count. 1 found, 0 not. */
static int scan_dml(const uint8_t *start, const uint8_t *end, Span *columns, int *dml_type_out, Py_ssize_t *rows_out) {
    Span event, dml;
    /* unknown fields (anywhere in the Entry) travel in the extension, which only Python writes */
    if (!dml_span(start, end, &event, &dml) || !entry_fields_known(start, end)) return 0;
    /* the Event holds the dmlEvent field and nothing else */
    {
        const uint8_t *p = event.p, *eend = event.p + event.n;
        while (p < eend) {
            uint64_t tag;
            if (!read_varint(&p, eend, &tag) || (tag >> 3) != 2 || !skip_field(&p, eend, (int)(tag & 7)))
                return 0;
        }
    }
    const uint8_t *p = dml.p, *dend = dml.p + dml.n;
    const uint8_t *cols_start = NULL, *cols_end = NULL;
    int cols_done = 0, type_seen = 0;
    uint64_t dml_type = 0;
    Py_ssize_t rows = 0;
    while (p < dend) {
        const uint8_t *field_start = p;
        uint64_t tag;
        if (!read_varint(&p, dend, &tag)) return 0;
        uint32_t field = (uint32_t)(tag >> 3);
        int wt = (int)(tag & 7);
        if (field == 1) {
            if (wt != 0 || type_seen || !read_varint(&p, dend, &dml_type)) return 0;
            type_seen = 1;
            continue;
        }
        if (!skip_field(&p, dend, wt)) return 0;
        if (field == 2) {
            /* one contiguous run of column fields, so the key is a slice */
            if (cols_done) return 0;
            if (cols_start == NULL) cols_start = field_start;
            cols_end = p;
        } else {
            if (cols_start != NULL) cols_done = 1;
            if (field == 3) rows++;
        }
    }
    if (dml_type > 2) return 0;
    columns->p = cols_start ? cols_start : (const uint8_t *)"";
    columns->n = cols_start ? cols_end - cols_start : 0;
    *dml_type_out = (int)dml_type;
    *rows_out = rows;
    return 1;
}

/* scan(entry_bytes) -> (columns key, dmlEventType, rows) for an Entry whose Event holds only a
 * dmlEvent (no event properties, no other event), or None. The key is the exact bytes of the
 * DMLEvent's columns fields, so equal keys mean equal column sets. */
static PyObject *scan(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *start = (const uint8_t *)buf.buf, *end = start + buf.len;
    Span columns;
    int dml_type;
    Py_ssize_t rows;
    PyObject *result;
    if (scan_dml(start, end, &columns, &dml_type, &rows)) {
        PyObject *key = PyBytes_FromStringAndSize((const char *)columns.p, columns.n);
        result = key == NULL ? NULL : Py_BuildValue("(Nin)", key, dml_type, rows);
    } else {
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&buf);
    return result;
}

/* header_properties(entry_bytes) -> None (the Header has no properties), False (one is a DataHub
 * fact, or C is not sure: Python looks), or [[key, value], ...] in order: what dts.header carries. */
static PyObject *header_properties(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *start = (const uint8_t *)buf.buf, *end = start + buf.len;
    PyObject *out = NULL, *pair = NULL;
    Span header;
    int found = only_submessage(start, end, 1, &header);
    if (found <= 0) goto unsure;
    const uint8_t *p = header.p, *hend = header.p + header.n;
    while (p < hend) {
        uint64_t tag;
        if (!read_varint(&p, hend, &tag)) goto unsure;
        Span kv;
        if ((tag >> 3) != 15) {
            if (!skip_field(&p, hend, (int)(tag & 7))) goto unsure;
            continue;
        }
        if ((tag & 7) != 2 || !read_span(&p, hend, &kv)) goto unsure;
        Span parts[3] = {{(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}};
        const uint8_t *q = kv.p, *kend = kv.p + kv.n;
        unsigned seen = 0;
        while (q < kend) { /* KVPair: key (1) and value (2), each at most once; anything else: Python */
            uint64_t ktag;
            if (!read_varint(&q, kend, &ktag)) goto unsure;
            uint64_t f = ktag >> 3;
            if ((f != 1 && f != 2) || (ktag & 7) != 2 || (seen & (1u << f)) || !read_span(&q, kend, &parts[f]))
                goto unsure;
            seen |= 1u << f;
        }
        if (parts[1].n >= 8 && !memcmp(parts[1].p, "datahub:", 8)) goto unsure; /* a fact: Python's */
        if (out == NULL && (out = PyList_New(0)) == NULL) goto error;
        pair = Py_BuildValue("[s#s#]", (const char *)parts[1].p, parts[1].n, (const char *)parts[2].p, parts[2].n);
        if (pair == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto error;
            PyErr_Clear();
            goto unsure;
        }
        if (PyList_Append(out, pair) < 0) goto error;
        Py_CLEAR(pair);
    }
    PyBuffer_Release(&buf);
    if (out == NULL) Py_RETURN_NONE;
    return out;
unsure:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    Py_RETURN_FALSE;
error:
    Py_XDECREF(pair);
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

/* Drop a partial result: None (a new reference), for Python to convert the Entry. */
static PyObject *give_way(PyObject *partial) {
    Py_XDECREF(partial);
    Py_RETURN_NONE;
}

/* ---- walking the images of a DML event ------------------------------------------------------- */

/* The images the ops of one DML type use, row by row (INSERT: after; UPDATE: before, after;
 * DELETE: before), over an Entry's bytes. */
typedef struct {
    const uint8_t *p, *end; /* the DMLEvent's bytes not yet read */
    unsigned use;           /* bit 1: before image, bit 2: after image */
    Span row;               /* the current RowChange */
    uint32_t which;         /* the next image field of the current row (3: read the next row) */
    long long index;        /* the current row's index */
    Span *datas;            /* the current image's Data, up to cap */
    Py_ssize_t cap;
    const uint8_t *base;    /* the DMLEvent's first byte */
    const uint8_t *row_at;  /* where the current row's field begins (a resume point) */
} Walk;

/* 1 (the Entry's DML event is found), 0 (leave the Entry to Python) or -1 (memory error) */
static int walk_start(Walk *w, const uint8_t *start, const uint8_t *end, int dml_type, Py_ssize_t ncols) {
    Span event, dml;
    w->datas = NULL;
    if (dml_type < 0 || dml_type > 2 || !dml_span(start, end, &event, &dml)) return 0;
    w->p = w->base = w->row_at = dml.p;
    w->end = dml.p + dml.n;
    w->use = dml_type == 0 ? 4u : dml_type == 1 ? 6u : 2u;
    w->which = 3;
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
static int walk_next(Walk *w, Py_ssize_t *count) {
    for (;;) {
        while (w->which <= 2) {
            uint32_t which = w->which++;
            if (!row_datas(w->row, which, w->datas, w->cap, count)) return -1;
            if (w->use & (1u << which)) return 1;
            if (*count) return -1; /* INSERT with a before image, DELETE with an after one */
        }
        if (w->p >= w->end) return 0;
        const uint8_t *at = w->p;
        uint64_t tag;
        if (!read_varint(&w->p, w->end, &tag)) return -1;
        int wt = (int)(tag & 7);
        if ((tag >> 3) != 3) {
            if (!skip_field(&w->p, w->end, wt)) return -1;
            continue;
        }
        if (wt != 2 || !read_span(&w->p, w->end, &w->row)) return -1;
        /* row properties (field 15) send the Entry to the Python path */
        const uint8_t *q = w->row.p, *rend = w->row.p + w->row.n;
        while (q < rend) {
            uint64_t rtag;
            if (!read_varint(&q, rend, &rtag) || (rtag >> 3) == 15 || !skip_field(&q, rend, (int)(rtag & 7)))
                return -1;
        }
        w->which = 1;
        w->index++;
        w->row_at = at;
    }
}

/* Continue a walk at a resume point a previous walk of the same bytes gave: (row index, offset
 * of its field in the DMLEvent). 1, or 0 with a Python error for a point outside the event. */
static int walk_resume(Walk *w, PyObject *resume) {
    long long index;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(resume, "Ln:resume", &index, &offset)) return 0;
    if (index < 0 || offset < 0 || offset > w->end - w->base) {
        PyErr_SetString(PyExc_ValueError, "a resume point outside the DML event");
        return 0;
    }
    w->p = w->row_at = w->base + offset;
    w->index = index - 1;
    w->which = 3;
    return 1;
}

/* Append a new reference (NULL: a Python error is set) to *list: 1, or 0 with *list cleared. */
static int append_stolen(PyObject **list, PyObject *item) {
    int failed = item == NULL || PyList_Append(*list, item) < 0;
    Py_XDECREF(item);
    if (failed) Py_CLEAR(*list);
    return !failed;
}

/* What a walk that ended with rc (walk_start's or walk_next's) gives: its list; NULL on a Python
 * error; None, for the Python path, where C gave way (rc < 0) or found no DML event. */
static PyObject *walk_result(int rc, PyObject *result) {
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
static PyObject *Plan_rows(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
    int rc = walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (rc <= 0) goto finish;
    if ((result = PyList_New(0)) == NULL) goto done;
    Py_ssize_t count;
    while ((rc = walk_next(&w, &count)) == 1)
        if (!append_stolen(&result, count ? image(self, w.datas, count) : (Py_INCREF(Py_None), Py_None))) goto done;
finish:
    result = walk_result(rc, result);
done:
    PyMem_Free(w.datas);
    PyBuffer_Release(&buf);
    return result;
}

/* ---- Tuple rows (tuple_encode.TupleEncoder): the same walk, Tuple values, the meta columns ---- */

/* The Tuple value of one checked value (new reference); NULL with no Python error set for a miss:
 * a zero or invalid date and a date beyond TIMESTAMP's range (the temporal policies count them in
 * Python), a FLOAT that float32 cannot hold, bytes that do not decode. */
static PyObject *tuple_object(PlanObject *plan, const Col *c, const Canon *v) {
    switch (c->out) {
    case O_DECIMAL: {
        PyObject *text = ascii_str(v->s.p, v->s.n);
        if (text == NULL) return NULL;
        PyObject *dec = PyObject_CallOneArg(plan->decimal, text);
        Py_DECREF(text);
        return dec;
    }
    case O_FLOAT32: {
        PyObject *f = canon_object(v);
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
        return canon_object(v);
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
        int rc = classify(c, datas[i], &v, &d);
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
 * Entry, image by image in the order `images` of the DML type gives them (tuple_encode.ROW_IMAGES),
 * each a dict, (dict, [indexes of the values Python fills]) or Py_None for an image Python must
 * convert; None for the whole Entry. The sequence id is str(seq_base + row index); metas: a tuple of
 * dicts, the other meta columns of each image of a row. */
static PyObject *Plan_tuples(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
    if (nmeta != (dml_type == 1 ? 2 : 1)) {
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
    int rc = walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (rc <= 0) goto finish;
    if ((result = PyList_New(0)) == NULL) goto done;
    Py_ssize_t count, k = 0;
    long long seq_row = -1;
    while ((rc = walk_next(&w, &count)) == 1) {
        if (w.index != seq_row) {
            seq_row = w.index;
            Py_CLEAR(seq);
            char digits[24];
            if (base > LLONG_MAX - seq_row) {
                rc = -1; /* Python writes the big number */
                break;
            }
            seq = ascii_str((const uint8_t *)digits, int_text(base + seq_row, digits));
            if (seq == NULL) {
                Py_CLEAR(result);
                goto done;
            }
        }
        PyObject *meta = PyTuple_GET_ITEM(metas, k++ % nmeta);
        if (!append_stolen(&result, count ? tuple_image(self, w.datas, count, seq_key, seq, meta)
                                          : (Py_INCREF(Py_None), Py_None)))
            goto done;
    }
finish:
    result = walk_result(rc, result);
done:
    Py_XDECREF(seq);
    PyMem_Free(w.datas);
    PyBuffer_Release(&buf);
    return result;
}


/* How one Entry's message lines are laid out (see Plan.lines): the bytes around each image's
 * dataColumn, the sequenceId's parts, the bytes after it and the row part of the extension. */
typedef struct {
    PyObject *pre, *post;          /* tuples of bytes, one per image of the DML type */
    const char *seq_prefix;        /* the seqId's digits, or "" */
    Py_ssize_t seq_prefix_n;
    int seq_pad;                   /* the row index in 6 digits (a seqId precedes it) */
    const char *post_seq;
    Py_ssize_t post_seq_n;
    const char *nrows_text;        /* NULL: no "row" part */
    Py_ssize_t nrows_n;
    const char *loud_post_seq;     /* NULL, or a quiet layout's post_seq with the extension's head, */
    Py_ssize_t loud_post_seq_n;    /* for the messages whose image needs extension entries */
    const char *loud_nrows_text;
    Py_ssize_t loud_nrows_n;
    const Py_ssize_t *keys;        /* the shard key's column indexes */
    Py_ssize_t nkeys;
} Layout;

/* The sequenceId text of row `index` of an Entry: seqId x 10**6 + index, as the layout writes it. */
static int put_seq(Buf *b, const Layout *L, long long index) {
    char digits[32];
    Py_ssize_t nd;
    if (L->seq_pad && index >= 0 && index < 1000000) { /* "%06lld" */
        for (int i = 5; i >= 0; i--, index /= 10) digits[i] = (char)('0' + index % 10);
        nd = 6;
    } else {
        nd = int_text(index, digits);
    }
    return buf_put(b, L->seq_prefix, L->seq_prefix_n) && buf_put(b, digits, nd);
}

/* Append the line of the image the walk just read (image k of the DML type) to b. With `shard`,
 * the shard key JSON of the key columns' values (null where left out, as shard_key's orjson.dumps
 * writes it) is appended there and *has_key says whether there was one (no keys, or an image of no
 * values, give none). `x`: room for the image's extension entries (NULL: none may be needed).
 * 1 written, 0 a miss (b and shard hold partial output), -1 error. */
static int write_line(PlanObject *plan, const Layout *L, const Walk *w, Py_ssize_t count, Py_ssize_t k,
                      Buf *b, Py_ssize_t *spans, Buf *shard, int *has_key, Extras *x) {
    PyObject *a = PyTuple_GET_ITEM(L->pre, k), *z = PyTuple_GET_ITEM(L->post, k);
    if (!buf_put(b, PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a))) return -1;
    Py_ssize_t written = 0;
    int rc = count ? image_json(plan, b, w->datas, count, spans, &written, x) : 0;
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
    if (!buf_put(b, PyBytes_AS_STRING(z), PyBytes_GET_SIZE(z)) || !put_seq(b, L, w->index)
        || !buf_put(b, post_seq, post_seq_n))
        return -1;
    if (nrows_text != NULL) {
        char digits[32];
        Py_ssize_t nd = int_text(w->index, digits);
        digits[nd++] = ',';
        if (!buf_put(b, digits, nd) || !buf_put(b, nrows_text, nrows_n) || !buf_put(b, "]", 1)) return -1;
        /* the extension's order: header, columns, row, charsets, values (blob_encode._dml) */
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
static Py_ssize_t *key_indexes(PlanObject *plan, PyObject *keys, Py_ssize_t *nkeys) {
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
static int check_templates(PyObject *pre, PyObject *post, Py_ssize_t nimg) {
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
static PyObject *Plan_lines(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
    if (want_keys && (keys = key_indexes(self, args[8], &L.nkeys)) == NULL) return NULL;
    L.keys = keys;
    int dml_type = PyLong_AsLong(args[1]);
    if (dml_type == -1 && PyErr_Occurred()) goto fail_args;
    if (dml_type < 0 || dml_type > 2) {
        PyMem_Free(keys);
        Py_RETURN_NONE;
    }
    Py_ssize_t nimg = dml_type == 1 ? 2 : 1;
    L.pre = args[2];
    L.post = args[3];
    PyObject *seq_prefix = args[4], *post_seq = args[6], *nrows_text = args[7];
    L.seq_pad = PyObject_IsTrue(args[5]);
    if (L.seq_pad < 0) goto fail_args;
    if (!check_templates(L.pre, L.post, nimg)) goto fail_args;
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
    int started = walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (started < 0) goto done;
    if (started == 0) goto none;
    if (ranged && args[9] != Py_None && !walk_resume(&w, args[9])) goto done;
    if (want_keys && (spans = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)w.cap)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(0);
    if (result == NULL) goto done;
    if (want_keys && (shards = PyList_New(0)) == NULL) goto error;
    Py_ssize_t count;
    int more;
    while ((more = walk_next(&w, &count)) == 1) {
        Py_ssize_t k = dml_type == 1 ? (Py_ssize_t)w.which - 2 : 0; /* the image just read: 0 before, 1 after */
        if (ranged && stop >= 0 && w.index >= stop) { /* the first row past the range: resume here */
            next = Py_BuildValue("(Ln)", w.index, (Py_ssize_t)(w.row_at - w.base));
            if (next == NULL) goto error;
            break;
        }
        int has_key = 0;
        out.n = 0;
        shard.n = 0;
        int rc = write_line(self, &L, &w, count, k, &out, spans, want_keys ? &shard : NULL, &has_key, &x);
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
    result = give_way(result);
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

/* d[NAMES[key]] = value (new reference, stolen); 0 on error */
static int put_item(PyObject *d, int key, PyObject *value) {
    if (value == NULL) return 0;
    int rc = PyDict_SetItem(d, NAMES[key], value);
    Py_DECREF(value);
    return rc == 0;
}

/* One message dict, as BlobEncoder._dml_wire builds it: schema, payload (image, op, sequenceId,
 * timestamp), version and, in lossless mode, the extension (header, columns, row, charsets,
 * values), left out when `quiet` and the image needs no entry of it. NULL on error. */
static PyObject *message(PyObject *const *args, PyObject *values, PyObject *raws, PyObject *charsets,
                         Py_ssize_t k, PyObject *seq, long long index, long long nrows) {
    PyObject *schema = args[2], *image_key = PyTuple_GET_ITEM(args[3], k), *op = PyTuple_GET_ITEM(args[4], k);
    PyObject *stamp = args[7], *version = args[8], *ext_header = args[9], *ext_columns = args[10];
    int quiet = PyObject_IsTrue(args[11]);
    PyObject *msg = PyDict_New(), *payload = PyDict_New(), *image = PyDict_New();
    if (msg == NULL || payload == NULL || image == NULL || quiet < 0) goto error;
    Py_INCREF(values);
    if (!put_item(image, N_DATACOLUMN, values)) goto error;
    if (PyDict_SetItem(payload, image_key, image) < 0) goto error;
    Py_CLEAR(image);
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
            || !put_item(ext, N_ROW, Py_BuildValue("[LL]", index, nrows))
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
    Py_XDECREF(image);
    return NULL;
}

/* Plan.messages(entry_bytes, dml_type, schema, image_keys, ops, seq_prefix, seq_pad, stamp, version,
 * ext_header, ext_columns, quiet, nrows): the Blob message dicts of a plain DML Entry, every image
 * converted here (image_keys and ops: one str per image of the DML type; ext_header None in
 * strict mode); None when any image is one C is not sure of (then `rows` and Python decide). */
static PyObject *Plan_messages(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 || !PyTuple_Check(args[3]) || !PyTuple_Check(args[4]) || !PyBytes_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "messages(entry_bytes, dml_type, schema, image_keys, ops, seq_prefix: bytes, "
                                         "seq_pad, stamp, version, ext_header, ext_columns, quiet, nrows)");
        return NULL;
    }
    int dml_type = PyLong_AsLong(args[1]);
    if (dml_type == -1 && PyErr_Occurred()) return NULL;
    long long nrows = PyLong_AsLongLong(args[12]);
    if (nrows == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t nimg = dml_type == 1 ? 2 : 1;
    if (PyTuple_GET_SIZE(args[3]) != nimg || PyTuple_GET_SIZE(args[4]) != nimg) {
        PyErr_SetString(PyExc_TypeError, "messages(): one image key and one op per image of the DML type");
        return NULL;
    }
    Layout L = {0};
    L.seq_prefix = PyBytes_AS_STRING(args[5]);
    L.seq_prefix_n = PyBytes_GET_SIZE(args[5]);
    L.seq_pad = PyObject_IsTrue(args[6]);
    if (L.seq_pad < 0) return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *seq = NULL;
    Buf text = {NULL, 0, 0};
    Walk w = {0};
    int rc = walk_start(&w, buf.buf, (const uint8_t *)buf.buf + buf.len, dml_type, self->ncols);
    if (rc <= 0) {
        result = rc < 0 ? NULL : give_way(NULL);
        goto done;
    }
    if ((result = PyList_New(0)) == NULL) goto done;
    Py_ssize_t count;
    long long seq_row = -1;
    while ((rc = walk_next(&w, &count)) == 1) {
        Py_ssize_t k = dml_type == 1 ? (Py_ssize_t)w.which - 2 : 0;
        if (count == 0) break; /* an empty image: Python writes its "image": "empty" */
        PyObject *img = image(self, w.datas, count);
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
            if (put_seq(&text, &L, w.index)) seq = PyUnicode_FromStringAndSize((const char *)text.p, text.n);
            if (seq == NULL) {
                Py_DECREF(img);
                goto error;
            }
            seq_row = w.index;
        }
        PyObject *msg = message(args, values, raws, charsets, k, seq, w.index, nrows);
        Py_DECREF(img);
        if (msg == NULL) goto error;
        int failed = PyList_Append(result, msg) < 0;
        Py_DECREF(msg);
        if (failed) goto error;
    }
    if (rc != 0) result = give_way(result); /* stopped early: a miss, or bytes C does not take */
    goto done;
error:
    Py_CLEAR(result);
done:
    Py_XDECREF(seq);
    PyMem_Free(text.p);
    PyMem_Free(w.datas);
    PyBuffer_Release(&buf);
    return result;
}

/* ---- Blob -> DTS: one image's dataColumn values -> the Data of a RowChange field, on the wire ---- */

static int put_varint(Buf *b, uint64_t v) {
    if (!buf_grow(b, 10)) return 0;
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        b->p[b->n++] = byte | (v ? 0x80 : 0);
    } while (v);
    return 1;
}

/* a length-delimited field; proto3 leaves an empty one out */
static int put_len_field(Buf *b, uint32_t field, const void *p, Py_ssize_t n) {
    if (n == 0) return 1;
    return put_varint(b, (uint64_t)field << 3 | 2) && put_varint(b, (uint64_t)n) && buf_put(b, p, n);
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

/* decimal text of a signed 64-bit integer into out (at least 21 bytes); its length */
static Py_ssize_t int_text(long long x, char *out) {
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
        for (int i = 0; i < 64; i++) rev[(uint8_t)B64[i]] = (int8_t)i;
        ready = 1;
    }
    if (n % 4) return 0;
    if (!buf_grow(out, n / 4 * 3)) return -1;
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

/* the Data body of one non-null value (the codec's from_blob); 1 done, 0 not plain, -1 error */
static int encode_value(const Col *c, PyObject *v, Buf *d, Buf *tmp) {
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
        len = int_text(x, text);
        return put_varint(d, 8) && put_varint(d, (uint64_t)dt) && put_len_field(d, 3, text, len) ? 1 : -1;
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
            if (!check_decimal(c, &view, &canon)) return 0;
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
        return put_varint(d, 8) && put_varint(d, (uint64_t)dt) && put_len_field(d, 3, sv.p, sv.n) ? 1 : -1;
    }
    case K_DOUBLE: {
        if (!PyFloat_CheckExact(v)) return 0;
        char *r = PyOS_double_to_string(PyFloat_AS_DOUBLE(v), 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (r == NULL) return -1;
        int ok = put_varint(d, 8) && put_varint(d, (uint64_t)dt) && put_len_field(d, 3, r, (Py_ssize_t)strlen(r));
        PyMem_Free(r);
        return ok ? 1 : -1;
    }
    case K_BOOL:
        if (v != Py_True && v != Py_False) return 0;
        return put_varint(d, 8) && put_varint(d, (uint64_t)dt) && put_len_field(d, 3, v == Py_True ? "1" : "0", 1)
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
        return put_varint(d, 8) && put_varint(d, (uint64_t)dt) && put_len_field(d, 2, c->charset, c->charset_len)
               && put_len_field(d, 4, bv, n) ? 1 : -1;
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
        return put_varint(d, 8) && put_varint(d, (uint64_t)dt) && put_len_field(d, 4, text, len) ? 1 : -1;
    }
    }
}

/* Plan.encode(values, field) -> the Data of one image as RowChange field `field` (1 oldColumns,
 * 2 newColumns) on the wire, for `row.MergeFromString`: each column's value as its codec's
 * from_blob gives it (None: NIL; absent: NA), with the default charset; None when any value is
 * not plain (a type the codec rejects, surrogates, out of range...) or a key names no column. */
static PyObject *Plan_encode(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "encode(values: dict, field: int)");
        return NULL;
    }
    PyObject *values = args[0];
    long field = PyLong_AsLong(args[1]);
    if (field == -1 && PyErr_Occurred()) return NULL;
    if (field != 1 && field != 2) {
        PyErr_SetString(PyExc_ValueError, "field is 1 (oldColumns) or 2 (newColumns)");
        return NULL;
    }
    Buf out = {NULL, 0, 0}, d = {NULL, 0, 0}, tmp = {NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t found = 0;
    uint64_t tag = (uint64_t)field << 3 | 2;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        const Col *c = &self->cols[i];
        PyObject *v = PyDict_GetItemWithError(values, c->name);
        if (v == NULL) {
            if (PyErr_Occurred()) goto done;
            if (!put_varint(&out, tag) || !buf_put(&out, "\x02\x08\x0e", 3)) goto done; /* NA */
            continue;
        }
        if (!c->dup) found++; /* a key counts once, however many columns share its name */
        if (v == Py_None) {
            if (!put_varint(&out, tag) || !buf_put(&out, "\x00", 1)) goto done; /* NIL */
            continue;
        }
        d.n = 0;
        int rc = encode_value(c, v, &d, &tmp);
        if (rc < 0) goto done;
        if (rc == 0) goto none;
        if (!put_varint(&out, tag) || !put_varint(&out, (uint64_t)d.n) || !buf_put(&out, d.p, d.n)) goto done;
    }
    if (found != PyDict_GET_SIZE(values)) goto none;
    result = PyBytes_FromStringAndSize((const char *)out.p, out.n);
    goto done;
none:
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(out.p);
    PyMem_Free(d.p);
    PyMem_Free(tmp.p);
    return result;
}

/* ---- the Plan type ---------------------------------------------------------------------------- */

/* ---- Entries that protobuf parses, known without parsing them ---------------------------------- */

enum { T_VARINT, T_STRING, T_BYTES, T_MSG };
typedef struct {
    uint8_t field, type, msg;
} FieldSpec;
typedef struct {
    const FieldSpec *fields;
    int n;
} MsgSpec;

enum { M_KV, M_ENTRIES, M_ENTRY, M_HEADER, M_EVENT, M_BEGIN, M_COMMIT, M_DDL, M_ROLLBACK, M_HEARTBEAT,
       M_CHECKPOINT, M_DML, M_COLUMN, M_ROW, M_DATA };

/* proto/subscribe.proto, field by field */
static const FieldSpec F_KV[] = {{1, T_STRING, 0}, {2, T_STRING, 0}};
static const FieldSpec F_ENTRIES[] = {{1, T_MSG, M_ENTRY}};
static const FieldSpec F_ENTRY[] = {{1, T_MSG, M_HEADER}, {2, T_MSG, M_EVENT}};
static const FieldSpec F_HEADER[] = {{1, T_VARINT, 0},  {2, T_VARINT, 0},  {3, T_VARINT, 0}, {4, T_VARINT, 0},
                                     {5, T_VARINT, 0},  {6, T_STRING, 0},  {7, T_VARINT, 0}, {8, T_STRING, 0},
                                     {9, T_STRING, 0},  {10, T_STRING, 0}, {11, T_VARINT, 0}, {12, T_VARINT, 0},
                                     {13, T_VARINT, 0}, {15, T_MSG, M_KV}};
static const FieldSpec F_EVENT[] = {{1, T_MSG, M_BEGIN},     {2, T_MSG, M_DML},       {3, T_MSG, M_COMMIT},
                                    {4, T_MSG, M_DDL},       {5, T_MSG, M_ROLLBACK},  {6, T_MSG, M_HEARTBEAT},
                                    {7, T_MSG, M_CHECKPOINT}, {15, T_MSG, M_KV}};
static const FieldSpec F_BEGIN[] = {{1, T_STRING, 0}, {2, T_VARINT, 0}};
static const FieldSpec F_COMMIT[] = {{1, T_STRING, 0}};
static const FieldSpec F_DDL[] = {{1, T_STRING, 0}, {2, T_STRING, 0}, {3, T_VARINT, 0}};
static const FieldSpec F_HEARTBEAT[] = {{1, T_VARINT, 0}};
static const FieldSpec F_CHECKPOINT[] = {{1, T_STRING, 0}, {2, T_VARINT, 0}, {3, T_STRING, 0}, {4, T_VARINT, 0}};
static const FieldSpec F_DML[] = {{1, T_VARINT, 0}, {2, T_MSG, M_COLUMN}, {3, T_MSG, M_ROW}};
static const FieldSpec F_COLUMN[] = {{1, T_STRING, 0}, {2, T_STRING, 0}, {3, T_VARINT, 0}, {15, T_MSG, M_KV}};
static const FieldSpec F_ROW[] = {{1, T_MSG, M_DATA}, {2, T_MSG, M_DATA}, {15, T_MSG, M_KV}};
static const FieldSpec F_DATA[] = {{1, T_VARINT, 0}, {2, T_STRING, 0}, {3, T_STRING, 0}, {4, T_BYTES, 0}};

#define SPEC(a) {a, (int)(sizeof(a) / sizeof(a[0]))}
static const MsgSpec MSGS[] = {SPEC(F_KV),        SPEC(F_ENTRIES),   SPEC(F_ENTRY),      SPEC(F_HEADER),
                               SPEC(F_EVENT),     SPEC(F_BEGIN),     SPEC(F_COMMIT),     SPEC(F_DDL),
                               {NULL, 0},         SPEC(F_HEARTBEAT), SPEC(F_CHECKPOINT), SPEC(F_DML),
                               SPEC(F_COLUMN),    SPEC(F_ROW),       SPEC(F_DATA)};

/* FIELD_AT[msg][field]: the index of the field's spec in MSGS[msg], or -1 (set up once) */
static int8_t FIELD_AT[sizeof(MSGS) / sizeof(MSGS[0])][16];

/* KNOWN_TAG[msg][tag byte]: 0 not a declared field with its wire type, 1 a varint field, 2 a
 * string or bytes field, 3 + m a field of message type m (set up once) */
static uint8_t KNOWN_TAG[sizeof(MSGS) / sizeof(MSGS[0])][128];

static void field_index(void) {
    for (size_t m = 0; m < sizeof(MSGS) / sizeof(MSGS[0]); m++) {
        memset(FIELD_AT[m], -1, sizeof(FIELD_AT[m]));
        memset(KNOWN_TAG[m], 0, sizeof(KNOWN_TAG[m]));
        for (int i = 0; i < MSGS[m].n; i++) {
            const FieldSpec *f = &MSGS[m].fields[i];
            FIELD_AT[m][f->field] = (int8_t)i;
            KNOWN_TAG[m][f->field << 3 | (f->type == T_VARINT ? 0 : 2)] =
                (uint8_t)(f->type == T_VARINT ? 1 : f->type == T_MSG ? 3 + f->msg : 2);
        }
    }
}

/* A varint of at most 10 bytes whose value fits 64 bits (nothing protobuf might read otherwise). */
static inline int strict_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    for (int i = 0; i < 10 && p + i < end; i++)
        if (!(p[i] & 0x80)) {
            if (i == 9 && p[i] > 1) return 0;
            return read_varint(pp, end, out);
        }
    return 0;
}

static int valid_utf8(const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        if (end - p >= 8) { /* eight ASCII bytes at a time */
            uint64_t word;
            memcpy(&word, p, 8);
            if (!(word & 0x8080808080808080ull)) {
                p += 8;
                continue;
            }
        }
        if (*p < 0x80) {
            p++;
            continue;
        }
        int len = utf8_seq(p, end);
        if (!len) return 0;
        p += len;
    }
    return 1;
}

/* 1: the bytes are message `msg` as protobuf parses it (well-formed fields, UTF-8 strings, known
 * sub-messages the same way down); 0: not sure (protobuf's own parse decides, and reports). */
static int valid_message(const uint8_t *p, const uint8_t *end, int msg) {
    const MsgSpec *spec = &MSGS[msg];
    while (p < end) {
        uint64_t tag, v;
        if (!strict_varint(&p, end, &tag) || tag > 0xffffffffull || (tag >> 3) == 0) return 0;
        uint32_t field = (uint32_t)(tag >> 3);
        int wt = (int)(tag & 7);
        const FieldSpec *f = NULL;
        if (field < 16) {
            int at = FIELD_AT[msg][field];
            f = at < 0 ? NULL : &spec->fields[at];
        }
        if (f != NULL && f->type == T_VARINT && wt == 0) {
            if (!strict_varint(&p, end, &v)) return 0;
        } else if (f != NULL && f->type != T_VARINT && wt == 2) {
            Span sp;
            if (!strict_varint(&p, end, &v) || v > (uint64_t)(end - p)) return 0;
            sp.p = p;
            sp.n = (Py_ssize_t)v;
            p += v;
            if (f->type == T_STRING && !valid_utf8(sp.p, sp.p + sp.n)) return 0;
            if (f->type == T_MSG && !valid_message(sp.p, sp.p + sp.n, f->msg)) return 0;
        } else { /* unknown, or a known field of another wire type: kept as an unknown field */
            if (wt == 0 ? !strict_varint(&p, end, &v) : (wt == 2 ? !strict_varint(&p, end, &v) || v > (uint64_t)(end - p) : 0))
                return 0;
            if (wt == 2) {
                p += v;
            } else if (wt != 0 && !skip_field(&p, end, wt)) {
                return 0;
            }
        }
    }
    return 1;
}

/* 1: every field of message `msg`, all the way down, is one proto/subscribe.proto declares, with
 * its wire type (so protobuf keeps no unknown field anywhere in it); 0: not sure (an unknown field,
 * a known one of another wire type, a group, malformed bytes). Strings are not checked here. */
static int known_fields(const uint8_t *p, const uint8_t *end, int msg) {
    const uint8_t *known = KNOWN_TAG[msg];
    while (p < end) {
        uint8_t t = *p++; /* every declared field is below 16: its tag is one byte */
        uint8_t k = t < 0x80 ? known[t] : 0;
        if (k == 0) return 0;
        if (k == 1) { /* a varint of at most 10 bytes */
            const uint8_t *q = p;
            while (q < end && (*q & 0x80) && q - p < 9) q++;
            if (q >= end || (*q & 0x80)) return 0;
            p = q + 1;
            continue;
        }
        Span sp;
        if (!read_span(&p, end, &sp)) return 0;
        if (k > 2 && !known_fields(sp.p, sp.p + sp.n, k - 3)) return 0;
    }
    return 1;
}

static int entry_fields_known(const uint8_t *start, const uint8_t *end) {
    return known_fields(start, end, M_ENTRY);
}

/* the message names of proto/subscribe.proto, in the order of the M_ codes */
static const char *const MSG_NAMES[] = {"KVPair", "Entries", "Entry", "Header", "Event", "BeginEvent",
                                        "CommitEvent", "DDLEvent", "RollbackEvent", "HeartbeatEvent",
                                        "CheckpointEvent", "DMLEvent", "Column", "RowChange", "Data"};
_Static_assert(sizeof(MSG_NAMES) / sizeof(MSG_NAMES[0]) == sizeof(MSGS) / sizeof(MSGS[0]), "a name per message");

/* known_fields(data, message="Entry") -> True when the bytes of that message hold no unknown field
 * at any depth (False: they may; protobuf's own view decides). */
static PyObject *known_fields_py(PyObject *module, PyObject *args) {
    Py_buffer buf;
    const char *name = "Entry";
    if (!PyArg_ParseTuple(args, "y*|s:known_fields", &buf, &name)) return NULL;
    int msg = -1;
    for (int m = 0; m < (int)(sizeof(MSG_NAMES) / sizeof(MSG_NAMES[0])); m++)
        if (!strcmp(MSG_NAMES[m], name)) msg = m;
    if (msg < 0) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "no message %s in subscribe.proto", name);
    }
    int ok = known_fields(buf.buf, (const uint8_t *)buf.buf + buf.len, msg);
    PyBuffer_Release(&buf);
    return PyBool_FromLong(ok);
}

/* valid_entries(data) -> True when protobuf parses the bytes as an Entries (False: not sure). */
static PyObject *valid_entries(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    int ok = valid_message(buf.buf, (const uint8_t *)buf.buf + buf.len, M_ENTRIES);
    PyBuffer_Release(&buf);
    return PyBool_FromLong(ok);
}

/* ---- DTS -> Blob for Spark: the output columns of whole Entries, written into buffers ---------- */

/* The Header fields of a plain Entry, each at most once with its own wire type; strings as spans. */
typedef struct {
    uint64_t v[14]; /* varint fields by number */
    Span s[14];     /* string fields by number (6 fileName, 8 gtid, 9 schemaName, 10 tableName) */
} HeaderView;

static int is_int32(uint64_t v) { return v <= 0x7fffffffull || v >= 0xffffffff80000000ull; }

/* 1: the Header holds only fields 1..13, none repeated, each with its wire type, the int32 and
 * enum fields in range, timestamp a uint32 and isLast 0 or 1 (what protobuf reads the same way
 * the bridge's Python path does); 0: leave the Entry to Python. */
static int read_header(Span h, HeaderView *hv) {
    const uint8_t *p = h.p, *end = h.p + h.n;
    unsigned seen = 0;
    memset(hv, 0, sizeof(*hv));
    for (int f = 0; f < 14; f++) hv->s[f].p = (const uint8_t *)"";
    while (p < end) {
        uint64_t tag;
        if (!read_varint(&p, end, &tag)) return 0;
        uint64_t field = tag >> 3;
        int wt = (int)(tag & 7);
        if (field < 1 || field > 13 || (seen & (1u << field))) return 0;
        seen |= 1u << field;
        if (field == 6 || field == 8 || field == 9 || field == 10) {
            if (wt != 2 || !read_span(&p, end, &hv->s[field])) return 0;
        } else if (wt != 0 || !read_varint(&p, end, &hv->v[field])) {
            return 0;
        }
    }
    return is_int32(hv->v[1]) && is_int32(hv->v[2]) && is_int32(hv->v[3]) && hv->v[4] <= 0xffffffffull
           && hv->v[13] <= 1;
}

/* dts.header of a plain DML Entry as orjson writes `wire_ext_header(header)`: the non-default
 * fields outside the envelope and source, in field-number order. 1, 0 (a string that is not
 * UTF-8: protobuf would not have parsed it) or -1. *plain: the header is the default {"version": 1}. */
static int ext_header_json(Buf *b, const HeaderView *hv, int *plain) {
    int first = 1, n = 0;
    static const struct { int field; const char *key; int kind; } F[] = {
        {1, "\"version\":", 0}, {5, "\"serverId\":", 1}, {6, "\"fileName\":", 2}, {7, "\"position\":", 3},
        {8, "\"gtid\":", 2}, {12, "\"eventIndex\":", 3}, {13, "\"isLast\":", 4}};
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
        case 0: nd = int_text((int32_t)(uint32_t)hv->v[f], digits); break;
        case 1: nd = int_text((long long)hv->v[f], digits); break;
        case 3: nd = u64_text(hv->v[f], digits); break;
        case 4: memcpy(digits, "true", 4); nd = 4; break;
        default: {
            int rc = json_string(b, hv->s[f].p, hv->s[f].n);
            if (rc <= 0) return rc;
            continue;
        }
        }
        if (!buf_put(b, digits, nd)) return -1;
    }
    *plain = n == 1 && hv->v[1] == 1;
    return buf_put(b, "}", 1) ? 1 : -1;
}

/* The cache key of a plain DML Entry's table: sourceType, schemaName, tableName, columns bytes. */
static int table_key_into(Buf *b, const HeaderView *hv, Span columns) {
    return put_varint(b, hv->v[2]) && put_varint(b, (uint64_t)hv->s[9].n) && buf_put(b, hv->s[9].p, hv->s[9].n)
           && put_varint(b, (uint64_t)hv->s[10].n) && buf_put(b, hv->s[10].p, hv->s[10].n)
           && buf_put(b, columns.p, columns.n);
}

/* A plain DML Entry's parts: 1, or 0 (not plain: Python converts it). */
typedef struct {
    HeaderView h;
    Span columns;
    int dml_type;
    Py_ssize_t rows;
} PlainEntry;

static int plain_entry(const uint8_t *start, const uint8_t *end, PlainEntry *e) {
    Span header = {(const uint8_t *)"", 0};
    if (only_submessage(start, end, 1, &header) < 0) return 0;
    /* Entry: the header and the event, nothing else */
    const uint8_t *p = start;
    while (p < end) {
        uint64_t tag;
        if (!read_varint(&p, end, &tag) || ((tag >> 3) != 1 && (tag >> 3) != 2) || !skip_field(&p, end, (int)(tag & 7)))
            return 0;
    }
    return read_header(header, &e->h) && e->h.v[3] == 2 /* DML */
           && scan_dml(start, end, &e->columns, &e->dml_type, &e->rows) && e->rows > 0 && e->rows <= 1000000;
}

/* table_key(entry_bytes) -> the bytes the Sink looks a plain DML Entry's table up by, or None. */
static PyObject *table_key(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    PlainEntry e;
    PyObject *result = NULL;
    if (plain_entry(buf.buf, (const uint8_t *)buf.buf + buf.len, &e)) {
        Buf key = {NULL, 0, 0};
        if (table_key_into(&key, &e.h, e.columns))
            result = PyBytes_FromStringAndSize((const char *)key.p, key.n);
        PyMem_Free(key.p);
    } else {
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&buf);
    return result;
}

/* The table record's parts: (plan, ((pre, post) per dmlEventType), ext columns JSON, key indexes,
 * foreign default, db, table, table shard). */
typedef struct {
    PlanObject *plan;
    PyObject *templates, *ext_columns, *keys, *db, *table, *table_shard;
    int foreign_default;
} Table;

static PyTypeObject PlanType;

static int unpack_table(PyObject *rec, Table *t) {
    PyObject *plan, *fd;
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 8
        || !PyArg_ParseTuple(rec, "O!O!SO!OSSS", &PlanType, &plan, &PyTuple_Type, &t->templates, &t->ext_columns,
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
    const HeaderView *h = &e->h;
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
    if (!check_templates(L.pre, L.post, e->dml_type == 1 ? 2 : 1)) return -1;
    /* the sequenceId's prefix, then the bytes after it: timestamp, version, extension head */
    Buf *tail = &s->tail;
    char seq_digits[32], nrows_digits[32];
    uint64_t seq_id = h->v[11];
    L.seq_pad = seq_id != 0;
    L.seq_prefix = seq_digits;
    L.seq_prefix_n = seq_id ? u64_text(seq_id, seq_digits) : 0;
    tail->n = 0;
    char stamp[24];
    Py_ssize_t ns = int_text(event_time, stamp);
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
        L.nrows_n = int_text(e->rows, nrows_digits);
    }
    L.post_seq = (const char *)tail->p;
    L.post_seq_n = tail->n;
    L.keys = s->keys;
    L.nkeys = s->nkeys;
    static const char *OPS[3][2] = {{"\0", NULL}, {"\1", "\2"}, {"\3", NULL}};
    SinkMark mark;
    sink_mark(s, &mark);
    Walk w = {0};
    Py_ssize_t *spans = NULL;
    int rc = walk_start(&w, start, end, e->dml_type, t->plan->ncols);
    if (rc <= 0) goto finish;
    s->spans.n = 0;
    if (!buf_grow(&s->spans, (Py_ssize_t)sizeof(Py_ssize_t) * 2 * w.cap)) {
        rc = -1;
        goto finish;
    }
    spans = (Py_ssize_t *)s->spans.p;
    Py_ssize_t count;
    int32_t message = 0;
    while ((rc = walk_next(&w, &count)) == 1) {
        Py_ssize_t k = e->dml_type == 1 ? (Py_ssize_t)w.which - 2 : 0;
        int has_key = 0;
        Buf *shard = &s->data[S_SHARD];
        rc = write_line(t->plan, &L, &w, count, k, &s->data[S_BLOB], spans, shard, &has_key, NULL);
        if (rc <= 0) goto finish;
        if (s->data[S_BLOB].n > SINK_LIMIT) { /* an Entry of over a GiB of lines: Python's */
            rc = 0;
            goto finish;
        }
        if (!sink_end_string(s, S_BLOB)
            || (!has_key && !buf_put(shard, PyBytes_AS_STRING(t->table_shard), PyBytes_GET_SIZE(t->table_shard)))
            || !sink_end_string(s, S_SHARD)
            || !put_seq(&s->data[S_SEQ], &L, w.index) || !sink_end_string(s, S_SEQ)
            || !sink_string(s, S_DB, PyBytes_AS_STRING(t->db), PyBytes_GET_SIZE(t->db))
            || !sink_string(s, S_TABLE, PyBytes_AS_STRING(t->table), PyBytes_GET_SIZE(t->table))
            || !buf_put(&s->fixed[S_OP], OPS[e->dml_type][k], 1) || !put_i32(&s->fixed[S_ENTRY], entry_index)
            || !put_i32(&s->fixed[S_ROW], message++) || !put_i32(&s->fixed[S_PART], partition)
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

/* Sink.entries(raws, start, tables, partition, offset, lossless, version) -> (next, entries, messages):
 * the plain DML Entries raws[start:] into the sink, in order, up to the first one it leaves to
 * Python (`next`; len(raws) when none), with the number of Entries and messages written. */
static PyObject *Sink_entries(SinkObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[0]) || !PyDict_Check(args[2]) || !PyBytes_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "entries(raws: list, start, tables: dict, partition, offset, lossless, version: bytes)");
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
        if (!plain_entry(p, end, &e)) break;
        Buf *key = &self->scratch;
        key->n = 0;
        if (!table_key_into(key, &e.h, e.columns)) return NULL;
        if (self->last == NULL || key->n != self->key.n || memcmp(key->p, self->key.p, (size_t)key->n) != 0) {
            PyObject *k = PyBytes_FromStringAndSize((const char *)key->p, key->n);
            if (k == NULL) return NULL;
            PyObject *rec = PyDict_GetItemWithError(tables, k);
            Py_DECREF(k);
            if (rec == NULL) {
                if (PyErr_Occurred()) return NULL;
                break;
            }
            Table t;
            Py_ssize_t nkeys, *keys;
            if (!unpack_table(rec, &t) || (keys = key_indexes(t.plan, t.keys, &nkeys)) == NULL) return NULL;
            self->key.n = 0;
            if (!buf_put(&self->key, key->p, key->n)) {
                PyMem_Free(keys);
                return NULL;
            }
            Py_INCREF(rec);
            Py_XSETREF(self->last, rec);
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

/* Sink.take() -> (rows, string columns as (offsets, data) for blob, shard_key, sequence_id, db, table,
 * then op codes (uint8: INSERT, UPDATE_BEFOR, UPDATE_AFTER, DELETE), entry, row, partition (int32),
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

static PyTypeObject SinkType = {
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

/* Plan(columns, lossless=True, decimal=None): columns is a sequence of (name, kind, dataType, lo, hi,
 * charset, fsp, need_bv[, out]); `lossless`: the options' mode (what values the Blob value cannot
 * hold cost); `decimal` (the Decimal type) makes a Tuple plan, whose columns say their O_* `out`. */
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
        int rc = json_string(&kb, (const uint8_t *)utf8, utf8_len);
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
    {"rows", (PyCFunction)(void (*)(void))Plan_rows, METH_FASTCALL,
     "rows(entry_bytes, dml_type) -> the dataColumn dict of each image the ops use, row by row "
     "(None: not sure), or None for an Entry to convert in Python"},
    {"lines", (PyCFunction)(void (*)(void))Plan_lines, METH_FASTCALL,
     "lines(entry_bytes, dml_type, pre, post, seq_prefix, seq_pad, post_seq, nrows_text[, keys[, resume, stop]]) -> "
     "[Blob JSON line, ...] (with keys, a column-index tuple: ([line, ...], [shard key JSON or None, ...])), "
     "or None for an Entry to convert in Python; with resume (None or a point a previous call gave) and stop "
     "(a row index, -1: none), the rows from there to stop, as (lines, the next resume point or None)"},
    {"messages", (PyCFunction)(void (*)(void))Plan_messages, METH_FASTCALL,
     "messages(entry_bytes, dml_type, schema, image_keys, ops, seq_prefix, seq_pad, stamp, version, ext_header, "
     "ext_columns, quiet, nrows) -> the Blob message dicts of a plain DML Entry, or None for Python to decide"},
    {"encode", (PyCFunction)(void (*)(void))Plan_encode, METH_FASTCALL,
     "encode(values, field) -> the Data of one image as RowChange field 1 or 2 on the wire, or None "
     "for values the Python codecs must judge"},
    {"tuples", (PyCFunction)(void (*)(void))Plan_tuples, METH_FASTCALL,
     "tuples(entry_bytes, dml_type, seq_key, seq_base, metas) -> a Tuple plan's rows of a DML Entry "
     "image by image (None: Python converts that image), or None for an Entry to convert in Python"},
    {"columns", (PyCFunction)Plan_len, METH_NOARGS, "number of columns"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
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

/* set_charsets(table): the charsets K_TEXT decodes, as a sequence of (MySQL name in lower case,
 * mode, codec name, mapping or None, check): mode 0 UTF-8 (checked in C), 1 Python's codec of
 * that name, 2 a charmap (`mapping`, 256 characters); check: the bytes must come back when the
 * text is encoded again. Replaces the table; blob_rows.py gives values.CHARSETS once. */
static PyObject *set_charsets(PyObject *module, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "set_charsets() needs a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_CHARSETS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many charsets");
        return NULL;
    }
    Charset table[MAX_CHARSETS];
    memset(table, 0, sizeof(table));
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name, *codec;
        Py_ssize_t name_len, codec_len;
        PyObject *mapping;
        Charset *c = &table[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "s#is#Op:charset", &name, &name_len, &c->mode,
                              &codec, &codec_len, &mapping, &c->check)
            || name_len >= 32 || codec_len >= 32 || c->mode < CS_UTF8 || c->mode > CS_CHARMAP
            || (c->mode == CS_CHARMAP && !PyUnicode_Check(mapping))) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "bad charset %zd", i);
            Py_DECREF(seq);
            return NULL;
        }
        memcpy(c->name, name, (size_t)name_len);
        c->name_len = name_len;
        memcpy(c->codec, codec, (size_t)codec_len);
        c->mapping = c->mode == CS_CHARMAP ? mapping : NULL;
    }
    for (int k = 0; k < NCHARSETS; k++) Py_CLEAR(CHARSETS[k].mapping);
    for (Py_ssize_t i = 0; i < n; i++) Py_XINCREF(table[i].mapping);
    memcpy(CHARSETS, table, sizeof(table));
    NCHARSETS = (int)n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* split_items(entries_bytes) -> [bytes of each Entry] in order, or None if the bytes hold anything
 * but well-formed fields (protobuf's own parse then reports the error). */
static PyObject *split_items(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = (const uint8_t *)buf.buf, *end = p + buf.len;
    PyObject *out = PyList_New(0);
    while (out != NULL && p < end) {
        uint64_t tag;
        Span s;
        if (!read_varint(&p, end, &tag)) goto malformed;
        if ((tag >> 3) != 1) {
            if ((tag >> 3) == 0 || !skip_field(&p, end, (int)(tag & 7))) goto malformed;
            continue;
        }
        if ((tag & 7) != 2 || !read_span(&p, end, &s)) goto malformed;
        PyObject *item = PyBytes_FromStringAndSize((const char *)s.p, s.n);
        if (item == NULL || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    PyBuffer_Release(&buf);
    return out;
malformed:
    Py_DECREF(out);
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"scan", (PyCFunction)scan, METH_O,
     "scan(entry_bytes) -> (columns key, dmlEventType, rows) of a plain DML Entry, or None"},
    {"split_items", (PyCFunction)split_items, METH_O,
     "split_items(entries_bytes) -> [Entry bytes, ...] in order, or None for malformed bytes"},
    {"known_fields", (PyCFunction)known_fields_py, METH_VARARGS,
     "known_fields(data, message='Entry') -> True when the message holds no unknown protobuf field at any depth "
     "(False: it may)"},
    {"valid_entries", (PyCFunction)valid_entries, METH_O,
     "valid_entries(data) -> True when protobuf parses the bytes as an Entries (False: not sure)"},
    {"table_key", (PyCFunction)table_key, METH_O,
     "table_key(entry_bytes) -> the Sink's table key of a plain DML Entry, or None"},
    {"header_properties", (PyCFunction)header_properties, METH_O,
     "header_properties(entry_bytes) -> None, False (a DataHub fact, or not sure) or [[key, value], ...]"},
    {"set_charsets", (PyCFunction)set_charsets, METH_O,
     "set_charsets([(name, mode, codec, mapping, check), ...]): the charsets text columns decode in C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bridge.native._speedups",
    "C fast path of the DTS -> Blob value loop (the Python codecs are the reference).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&SinkType) < 0) return NULL;
    field_index();
    for (int i = 0; i < N_NAMES; i++)
        if ((NAMES[i] = PyUnicode_InternFromString(NAME_TEXT[i])) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SinkType);
    if (PyModule_AddObject(m, "Sink", (PyObject *)&SinkType) < 0) {
        Py_DECREF(&SinkType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
