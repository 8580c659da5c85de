/* Value checks: one Data -> the canonical value of its column (Canon) or a miss, as the Python
 * codecs decide it; the charset table and its decodings; temporals in UTC. */
#include "speedups.h"

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

int bridge_check_decimal(const Col *c, const DataView *d, Canon *v) {
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

/* ---- charsets: MySQL charset name -> how its text decodes (bridge.values.CHARSETS, given once) - */


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
/* The UTF-8 of text in a Decoding into b (appended, not escaped): 1, 0 a unit C does not know, -1 */

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

/* Blob -> DTS: the bytes of `text` in charset `cs` (a dts.charsets entry, looked up as charset_of
 * does, so as bridge.values.charset_codec does): what the text codec's from_blob writes to bv.
 * A new bytes object, or NULL with no error set: no text codec (binary, an unknown name) or text
 * the codec refuses; the Python codec then decides and names what is wrong. */
PyObject *bridge_encode_text(Col *c, Span cs, PyObject *text) {
    Charset *t = charset_of(c, cs);
    if (t == NULL) return NULL;
    PyObject *out;
    if (t->mode == CS_UTF8) {
        out = PyUnicode_AsUTF8String(text);
    } else if (t->mode == CS_CODEC) {
        out = PyUnicode_AsEncodedString(text, t->codec, "strict");
    } else {
        if (t->encoding == NULL && (t->encoding = PyUnicode_BuildEncodingMap(t->mapping)) == NULL) {
            PyErr_Clear();
            return NULL;
        }
        out = PyUnicode_AsCharmapString(text, t->encoding);
    }
    if (out != NULL && !PyBytes_CheckExact(out)) Py_CLEAR(out);
    if (out == NULL) PyErr_Clear();
    return out;
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

/* json's bytes (BYTES: a charset on them is not canonical, X_RAW) and time text (STRING: a charset
 * on it is a label, X_CHARSET), as `_utf8_codec` decides */
static int check_utf8(const Col *c, const DataView *d, Canon *v) {
    if (d->sv.n || (c->need_bv && !d->bv.n)) return 0;
    if (d->cs.n) v->extra = bridge_labelled(c) ? X_CHARSET : X_RAW;
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

/* Canonical text of the column's layout in UTC -> epoch ms. A charset on it (DTS may name one)
 * makes it an X_CHARSET value (its label travels in dts.charsets), sub-millisecond digits an
 * X_CHANGED one, as the temporal codec decides. */
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
    else if (d->cs.n) v->extra = X_CHARSET; /* a label on the text: dts.charsets names it */
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
    case K_DECIMAL: return bridge_check_decimal(c, d, v);
    case K_TEXT: return check_text(c, d, v);
    case K_BASE64: return check_base64(c, d, v);
    case K_UTF8: return check_utf8(c, d, v);
    case K_BOOL: return check_bool(c, d, v);
    default: return check_temporal(c, d, v);
    }
}


/* `*d` gets the Data's fields (an X_RAW / X_CHANGED value's extension entry is written from them). */
int bridge_classify(Col *c, Span data, Canon *v, DataView *d) {
    v->extra = X_NONE;
    if (!read_data(data, d)) return V_MISS;
    int bare = !d->cs.n && !d->sv.n && !d->bv.n; /* nothing the codec would carry raw */
    if (d->dt == DT_NIL) return bare ? V_NULL : V_MISS;
    if (d->dt == DT_NA) return bare ? V_SKIP : V_MISS;
    if (d->dt != c->dt || !check_value(c, d, v)) return V_MISS;
    return V_VALUE;
}

/* set_charsets(table): the charsets K_TEXT decodes, as a sequence of LAYOUT_CHARSET_ENTRY tuples
 * (contract.CharsetEntry: MySQL name in lower case, mode, codec name, mapping or None, check): mode
 * CS_UTF8 (checked in C), CS_CODEC (Python's codec of that name) or CS_CHARMAP (`mapping`, 256
 * characters); check: the bytes must come back when the text is encoded again. Replaces the table;
 * bridge/blob/rows.py gives bridge.values.CHARSETS once. */
PyObject *bridge_set_charsets(PyObject *module, PyObject *arg) {
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
    for (int k = 0; k < NCHARSETS; k++) {
        Py_CLEAR(CHARSETS[k].mapping);
        Py_CLEAR(CHARSETS[k].encoding);
    }
    for (Py_ssize_t i = 0; i < n; i++) Py_XINCREF(table[i].mapping);
    memcpy(CHARSETS, table, sizeof(table));
    NCHARSETS = (int)n;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}
