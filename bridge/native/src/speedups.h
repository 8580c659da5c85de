/* bridge.native._speedups: the DTS -> Blob (and DTS -> Tuple, Blob -> DTS) value loop over an
 * Entry's wire bytes, in C. This header is what the units share: the numbers of the Python <-> C
 * contract, the types, the small inline readers, and what each unit gives the others.
 *
 * A `Plan` is built once per column set (bridge/values/plans.py: `plan_column`, `native_tuple_plan`;
 * bridge/blob/rows.py: `native_plan`) from the same column kinds the Python compiled image uses.
 * `Plan.rows(entry_bytes)` walks Entry -> Event -> DMLEvent -> RowChange -> Data on the wire and
 * returns, per row, the dataColumn dict of its before and after image, or None for an image it is
 * not sure of. It is a fast path only: every decision it cannot make exactly as the Python codecs
 * do (a non-canonical spelling, a charset other than the column's, a value the codec would call
 * inexact, an encoding protobuf would merge) gives None for that image, or for the whole Entry,
 * and the caller converts it with the Python path, which stays the reference
 * (tests/test_speedups.py compares the two). A Tuple plan (`Plan(columns, lossless, Decimal)`)
 * takes the same checks to Tuple values: `Plan.tuples` leaves a value it is not sure of as a hole
 * bridge/tuple/encode.py's TupleEncoder fills in Python.
 *
 * The units, by job (docs/decisions.md, "The Python <-> C contract"):
 *   wire.c     the byte buffer, protobuf wire reading, the schema C walks, Entries that protobuf
 *              parses (known without parsing them), scan / split_items / header_properties
 *   values.c   value checks (one Data -> its canonical value or a miss), charsets, temporals
 *   writers.c  what a checked value becomes: Python objects (the dict writer), orjson's JSON bytes
 *   rows.c     images of a DML event (dict and JSON), the walk over its rows, Plan.rows
 *   tuples.c   Tuple rows (Plan.tuples)
 *   lines.c    Blob JSON lines (Plan.lines) and whole message dicts (Plan.messages)
 *   decode.c   Blob -> DTS: an image's values as RowChange Data on the wire (Plan.encode)
 *   sink.c     Spark's Sink: the output columns of whole Entries as Arrow buffers
 *   tuple_sink.c  Spark's TupleSink: the same for dts_to_tuple, one table's Tuple columns
 *   pages.c    a DataHub Blob GetRecords answer's records (blob_page), for `sync --to dts`'s source
 *   merge.c    the shard merge's bookkeeping of `sync --to dts` (Merge; stream/merge.py's PyMerge is its reference)
 *   plan.c     the Plan type
 *   module.c   module init, CONTRACT, LAYOUTS and SCHEMA
 */
#ifndef BRIDGE_SPEEDUPS_H
#define BRIDGE_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

/* ---- the contract: every number Python and C share (bridge/native/contract.py holds the same, and
 * tests/test_native_contract.py checks `_speedups.CONTRACT`, made from these, against it) ---------- */

/* A Plan column's value kind (contract.Kind) */
enum {
    K_LONG = 0,      /* canonical integer text -> int, within [lo, hi] */
    K_DIGITS = 1,    /* canonical unsigned integer text -> the same text, within [0, uhi] */
    K_DOUBLE = 2,    /* text that is repr() of its double -> float */
    K_DECIMAL = 3,   /* -?[0-9]+(\.[0-9]+)? -> the same text */
    K_TEXT = 4,      /* text in any charset of the table `set_charsets` gave -> str */
    K_BASE64 = 5,    /* bytes -> standard base64 str */
    K_UTF8 = 6,      /* UTF-8 bytes (json, BYTES; time when need_bv, STRING: a charset is a label) -> str */
    K_BOOL = 7,      /* INT8 "0" / "1" -> False / True */
    K_DATE = 8,      /* YYYY-MM-DD (UTC) -> epoch ms */
    K_DATETIME = 9,  /* YYYY-MM-DD HH:MM:SS[.f{fsp}] (UTC) -> epoch ms */
    K_TIMESTAMP = 10 /* the same with " +00:00" -> epoch ms */
};

/* What a Tuple plan makes of a column's value besides the Blob value (contract.Out,
 * bridge.values' TO_TUPLE): O_SAME the same object, O_DECIMAL a Decimal of the text,
 * O_FLOAT32 the float32 a FLOAT field stores, O_MICROS a temporal's epoch microseconds within
 * DataHub's TIMESTAMP range, O_HEX the bytes of a base64 column in lower-case hex (Options.tuple_binary). */
enum { O_SAME = 0, O_DECIMAL = 1, O_FLOAT32 = 2, O_MICROS = 3, O_HEX = 4 };
#define TUPLE_TS_HI 253402271999000000LL /* bridge/tuple/encode.py's TIMESTAMP_RANGE end (contract.TUPLE_TS_HI) */

/* How a charset of the `set_charsets` table decodes (contract.CharsetMode): checked here as UTF-8,
 * Python's codec of that name, or a 256-character charmap */
enum { CS_UTF8 = 0, CS_CODEC = 1, CS_CHARMAP = 2 };

/* The op codes of Sink.take()'s op column (contract.SinkOp) */
enum { OP_INSERT = 0, OP_UPDATE_BEFOR = 1, OP_UPDATE_AFTER = 2, OP_DELETE = 3 };

/* The Tuple sink (tuple_sink.c): how each output column is stored (contract.TupleStorage: the Arrow
 * layout of its Spark type) and what writes a field's values there (contract.TupleWriter). */
enum { TS_BOOL = 0, TS_INT8 = 1, TS_INT16 = 2, TS_INT32 = 3, TS_INT64 = 4, TS_FLOAT32 = 5, TS_FLOAT64 = 6,
       TS_DECIMAL128 = 7, TS_STRING = 8 };
enum { W_NULL = 0,    /* no value in this column set: null */
       W_INT = 1,     /* a K_LONG column's int within [lo, hi], in an integer storage */
       W_MICROS = 2,  /* a temporal column's epoch microseconds (O_MICROS) within [lo, hi] */
       W_DOUBLE = 3,  /* a K_DOUBLE column's finite double */
       W_FLOAT32 = 4, /* a K_DOUBLE column's float32 (O_FLOAT32) */
       W_BOOL = 5,    /* a K_BOOL column's bool */
       W_DECIMAL = 6, /* an O_DECIMAL column's digits at scale hi, at most lo digits */
       W_STRING = 7,  /* a text, json or base64 column's str (O_SAME or O_HEX) as UTF-8 */
       W_SEQ = 8,     /* _sequence_id_: seqId * 10**6 + the row change's index */
       W_TIME = 9,    /* _execute_time_: the header's timestamp in ms */
       W_IMAGE_TEXT = 10 }; /* text per DML type and image: the other meta columns */

/* subscribe.proto's DMLType (contract.DmlType), its MessageType DML (contract.MT_DML) and the
 * DataTypes C names (contract.NIL, STRING, NA) */
enum { DML_INSERT = 0, DML_UPDATE = 1, DML_DELETE = 2 };
enum { MT_DML = 2 };
enum { DT_NIL = 0, DT_STRING = 13, DT_NA = 14 };

/* Protobuf wire types (contract.WireType) and a tag's parts */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };
#define TAG_FIELD(tag) ((uint32_t)((tag) >> 3))
#define TAG_WT(tag) ((int)((tag) & 7))
#define TAG(field, wt) ((uint64_t)(field) << 3 | (uint64_t)(wt))

/* The field numbers of proto/subscribe.proto C reads by number (contract.PROTO_FIELDS); the whole
 * schema C walks is wire.c's table, exported as `_speedups.SCHEMA` and checked against protobuf's. */
enum {
    F_ENTRIES_ITEMS = 1,
    F_ENTRY_HEADER = 1, F_ENTRY_EVENT = 2,
    F_HEADER_VERSION = 1, F_HEADER_SOURCETYPE = 2, F_HEADER_MESSAGETYPE = 3, F_HEADER_TIMESTAMP = 4,
    F_HEADER_SERVERID = 5, F_HEADER_FILENAME = 6, F_HEADER_POSITION = 7, F_HEADER_GTID = 8,
    F_HEADER_SCHEMANAME = 9, F_HEADER_TABLENAME = 10, F_HEADER_SEQID = 11, F_HEADER_EVENTINDEX = 12,
    F_HEADER_ISLAST = 13, F_HEADER_PROPERTIES = 15,
    F_EVENT_DMLEVENT = 2, F_EVENT_PROPERTIES = 15,
    F_DMLEVENT_DMLEVENTTYPE = 1, F_DMLEVENT_COLUMNS = 2, F_DMLEVENT_ROWS = 3,
    F_ROWCHANGE_OLDCOLUMNS = 1, F_ROWCHANGE_NEWCOLUMNS = 2, F_ROWCHANGE_PROPERTIES = 15,
    F_DATA_DATATYPE = 1, F_DATA_CHARSET = 2, F_DATA_SV = 3, F_DATA_BV = 4,
    F_KVPAIR_KEY = 1, F_KVPAIR_VALUE = 2,
};

/* The positional tuples C takes or returns, field by field (contract.py's NamedTuples of the same
 * names; `_speedups.LAYOUTS` gives these lists, and the test compares them). Each parse or build
 * of such a tuple names its layout beside its format. */
#define LAYOUT_PLAN_COLUMN "name", "kind", "datatype", "lo", "hi", "charset", "fsp", "need_bv", "out"
#define LAYOUT_CHARSET_ENTRY "name", "mode", "codec", "mapping", "check"
#define LAYOUT_SINK_TABLE "plan", "templates", "ext_columns", "key_indexes", "foreign_default", "db", "table", \
    "table_shard"
#define LAYOUT_SCANNED "columns_key", "dml_type", "rows"
#define LAYOUT_SINK_ENTRIES "next", "entries", "messages"
#define LAYOUT_TUPLE_SINK_FIELD "writer", "column", "lo", "hi", "text"
#define LAYOUT_TUPLE_SINK_TABLE "plan", "fields"
#define LAYOUT_TUPLE_SINK_TAKEN "rows", "entry", "row", "partition", "offset", "columns"
#define LAYOUT_SINK_TAKEN "rows", "blob_offsets", "blob", "shard_key_offsets", "shard_key", "sequence_id_offsets", \
    "sequence_id", "db_offsets", "db", "table_offsets", "table", "op", "entry", "row", "partition", "offset", \
    "event_time"

/* ---- the types ---------------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} Span;

typedef struct {
    int dt;
    unsigned seen; /* bit per field 1..4 */
    Span cs, sv, bv;
} DataView;

typedef struct {
    uint8_t *p;
    Py_ssize_t n, cap;
} Buf;

int bridge_buf_grow(Buf *b, Py_ssize_t more); /* room for `more` bytes (wire.c); 0 on a memory error (set) */

/* One column of a Plan (LAYOUT_PLAN_COLUMN, parsed by plan.c) and what C keeps of it between values */
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

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols;
    Col *cols;
    int lossless; /* what a value the Blob value cannot give back exactly costs: extension entries
                     (lossless) or, when it would change, a miss (strict: the codec reports it) */
    PyObject *decimal; /* a Tuple plan's Decimal type; NULL for a Blob plan */
} PlanObject;

/* ---- value checks (values.c): the canonical value of one Data for its column, or a miss ---------- */

/* Temporal and time text: a charset on a value is a label (Codec.charset ""), which dts.charsets
 * carries; other kinds but K_TEXT keep none */
static inline int bridge_labelled(const Col *c) {
    return c->kind >= K_DATE || (c->kind == K_UTF8 && c->dt == DT_STRING);
}

enum { C_INT, C_ASCII, C_FLOAT, C_UTF8, C_B64, C_BOOL, C_NULL, C_TABLE };

/* What a value needs besides its Blob value, as the codecs decide it (bridge/values/codecs.py):
 * X_CHARSET: a charset other than the column's own (text: utf8mb4; temporal and time text: none),
 * which lossless mode names in dts.charsets;
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

/* ---- charsets (values.c): MySQL charset name -> how its text decodes (bridge.values.CHARSETS) */

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
    char name[32];     /* lower case, as bridge.values.charset_codec looks names up */
    Py_ssize_t name_len;
    int mode;          /* CS_UTF8: checked here; CS_CODEC: Python's codec by name; CS_CHARMAP: a table */
    char codec[32];
    PyObject *mapping; /* CS_CHARMAP: the 256-character decoding table */
    int check;         /* decode then encode is not the identity: the bytes must come back */
    struct Decoding *decoding; /* built on the first value in this charset; NULL: not yet (or failed) */
    int failed;
    PyObject *encoding; /* CS_CHARMAP: the encoding map of `mapping` (Blob -> DTS), built on first use */
} Charset;

/* Outcome of one Data: a value, a bare NA (the column is left out), or a miss. */
enum { V_VALUE, V_NULL, V_SKIP, V_MISS };

/* ---- images and lines (rows.c, lines.c, sink.c) ------------------------------------------------ */

/* The keys of every message dict (bridge_names, interned once by rows.c) */
enum { N_SCHEMA, N_PAYLOAD, N_VERSION, N_DTS, N_DATACOLUMN, N_OP, N_SEQ, N_TIMESTAMP, N_HEADER, N_COLUMNS,
       N_ROW, N_CHARSETS, N_VALUES, N_DATATYPE, N_CHARSET, N_SV, N_BV, N_EVENTTIME, N_CHECKPOINTTIME,
       N_SYSTEMTIME, N_NAMES };

/* The extension entries of one image, as JSON members: `"3":"gbk"` of dts.charsets and
 * `"4":{"dataType":13,...}` of dts.values (data_to_raw), comma-separated, in column order. */
typedef struct {
    Buf charsets, values;
} Extras;

/* The images the ops of one DML type use, row by row (INSERT: after; UPDATE: before, after;
 * DELETE: before), over an Entry's bytes. */
typedef struct {
    const uint8_t *p, *end; /* the DMLEvent's bytes not yet read */
    unsigned use;           /* bit 1: before image, bit 2: after image */
    Span row;               /* the current RowChange */
    uint32_t which;         /* the next image field of the current row (WALK_NEXT_ROW: read the next row) */
    long long index;        /* the current row's index */
    Span *datas;            /* the current image's Data, up to cap */
    Py_ssize_t cap;
    const uint8_t *base;    /* the DMLEvent's first byte */
    const uint8_t *row_at;  /* where the current row's field begins (a resume point) */
} Walk;

#define WALK_NEXT_ROW (F_ROWCHANGE_NEWCOLUMNS + 1)

/* The image the walk just read: 0 the before image (oldColumns), 1 the after image (newColumns) */
static inline Py_ssize_t walk_image(const Walk *w) {
    return (Py_ssize_t)w->which - 1 - F_ROWCHANGE_OLDCOLUMNS;
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

/* ---- small inline readers and writers ------------------------------------------------------------ */

/* Append n bytes; 0 on a memory error (set) */
static inline int buf_put(Buf *b, const void *p, Py_ssize_t n) {
    if (n <= 0) return 1; /* b->p may still be NULL, and memcpy's pointers must not be (C11 7.24.1) */
    if (!bridge_buf_grow(b, n)) return 0;
    memcpy(b->p + b->n, p, (size_t)n);
    b->n += n;
    return 1;
}

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

/* A varint of at most 5 bytes whose value is at most max: how protobuf (upb) reads a tag (max
 * 2^32 - 1) and a length (below 2^31 - 1; no bytes C reads are that long); it refuses a longer
 * spelling, even of a small value, and a larger value, and so does this (0). Other varints (values)
 * may take 10 bytes (read_varint). */
static inline int read_varint5(const uint8_t **pp, const uint8_t *end, uint64_t max, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 5 && i < end - p; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            if (v > max) return 0;
            *pp = p + i + 1;
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* THE tag reader of every C walk over protobuf bytes: 1 with the tag for what protobuf takes as a
 * tag, 0 for what it refuses: a spelling over 5 bytes, a value over 2^32 - 1 (a field number of
 * 2^29 or more) or field number 0. So TAG_FIELD never truncates. The wire type is the caller's:
 * skip_field takes 0, 1, 2 and 5; protobuf refuses 4 (an end without a group), 6 and 7, and skips
 * an unknown group (3), which C does not (0: protobuf's own parse decides). */
static inline int read_tag(const uint8_t **pp, const uint8_t *end, uint64_t *tag) {
    return read_varint5(pp, end, 0xffffffffull, tag) && TAG_FIELD(*tag) != 0;
}

/* A length prefix as protobuf reads one (read_varint5) that fits the bytes left; 0 if not. */
static inline int read_size(const uint8_t **pp, const uint8_t *end, uint64_t *len) {
    return read_varint5(pp, end, 0x7ffffffeull, len) && *len <= (uint64_t)(end - *pp);
}

/* Skip one field's value of wire type wt; 0 on malformed or group wire types. */
static inline int skip_field(const uint8_t **pp, const uint8_t *end, int wt) {
    uint64_t v;
    switch (wt) {
    case WT_VARINT:
        return read_varint(pp, end, &v);
    case WT_I64:
        if (end - *pp < 8) return 0;
        *pp += 8;
        return 1;
    case WT_LEN:
        if (!read_size(pp, end, &v)) return 0;
        *pp += v;
        return 1;
    case WT_I32:
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
    if (!read_size(pp, end, &len)) return 0;
    s->p = *pp;
    s->n = (Py_ssize_t)len;
    *pp += len;
    return 1;
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

/* Data fields; 0 for anything but the four known fields, each at most once. A field written out
 * with its default (`08 00`: NIL spelt out, an empty string) reads as absent, as protobuf reads it. */
static inline int read_data(Span s, DataView *d) {
    const uint8_t *p = s.p, *end = s.p + s.n;
    d->dt = DT_NIL;
    d->seen = 0;
    d->cs.n = d->sv.n = d->bv.n = 0;
    d->cs.p = d->sv.p = d->bv.p = (const uint8_t *)"";
    while (p < end) {
        uint64_t tag;
        if (!read_tag(&p, end, &tag)) return 0;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if (field < F_DATA_DATATYPE || field > F_DATA_BV) return 0;
        if (d->seen & (1u << field)) return 0;
        d->seen |= 1u << field;
        if (field == F_DATA_DATATYPE) {
            uint64_t v;
            if (wt != WT_VARINT || !read_varint(&p, end, &v) || v > DT_NA) return 0;
            d->dt = (int)v;
        } else {
            Span *t = field == F_DATA_CHARSET ? &d->cs : field == F_DATA_SV ? &d->sv : &d->bv;
            if (wt != WT_LEN || !read_span(&p, end, t)) return 0;
        }
    }
    return 1;
}

/* ---- plain DML Entries (sink.c), which both Spark sinks write --------------------------------------- */

/* The Header fields of a plain Entry, each at most once with its own wire type; strings as spans. */
typedef struct {
    uint64_t v[F_HEADER_ISLAST + 1]; /* varint fields by number */
    Span s[F_HEADER_ISLAST + 1];     /* string fields by number (fileName, gtid, schemaName, tableName) */
} PlainHeader;

/* A plain DML Entry's parts (bridge_plain_entry) */
typedef struct {
    PlainHeader h;
    Span columns;
    int dml_type;
    Py_ssize_t rows;
} PlainEntry;

/* ---- what each unit gives the others ------------------------------------------------------------- */

/* wire.c: the buffer, wire reading, the schema, the module functions on Entry bytes */
int bridge_only_submessage(const uint8_t *p, const uint8_t *end, uint32_t want, Span *out);
int bridge_row_datas(Span row, uint32_t want, Span *datas, Py_ssize_t cap, Py_ssize_t *count);
int bridge_dml_span(const uint8_t *start, const uint8_t *end, Span *event, Span *dml);
int bridge_scan_dml(const uint8_t *start, const uint8_t *end, Span *columns, int *dml_type_out, Py_ssize_t *rows_out);
void bridge_field_index(void);
PyObject *bridge_schema(void);
PyObject *bridge_scan(PyObject *module, PyObject *arg);
PyObject *bridge_header_properties(PyObject *module, PyObject *arg);
PyObject *bridge_known_fields_py(PyObject *module, PyObject *args);
PyObject *bridge_valid_entries(PyObject *module, PyObject *arg);
PyObject *bridge_split_items(PyObject *module, PyObject *arg);

/* values.c: value checks and charsets */
int bridge_check_decimal(const Col *c, const DataView *d, Canon *v);
int bridge_classify(Col *c, Span data, Canon *v, DataView *d);
PyObject *bridge_set_charsets(PyObject *module, PyObject *arg);

/* writers.c: a checked value as a Python object or as JSON */
extern const char bridge_B64[65];
void bridge_base64_into(uint8_t *o, const uint8_t *p, Py_ssize_t n);
PyObject *bridge_ascii_str(const uint8_t *p, Py_ssize_t n);
PyObject *bridge_canon_object(const Canon *v);
int bridge_canon_double(const Canon *v, double *out);
Py_ssize_t bridge_int_text(long long x, char *out);
Py_ssize_t bridge_u64_text(unsigned long long x, char *out);
int bridge_json_string(Buf *b, const uint8_t *p, Py_ssize_t n);
int bridge_table_utf8(Buf *b, const struct Decoding *t, const uint8_t *p, Py_ssize_t n);
int bridge_canon_json(Buf *b, const Canon *v);

/* rows.c: images and the walk over a DML event's rows */
extern PyObject *bridge_names[N_NAMES];
int bridge_names_init(void);
PyObject *bridge_image(PlanObject *plan, const Span *datas, Py_ssize_t count);
int bridge_image_json(PlanObject *plan, Buf *b, const Span *datas, Py_ssize_t count, Py_ssize_t *spans,
                      Py_ssize_t *written, Extras *x);
PyObject *bridge_give_way(PyObject *partial);
int bridge_walk_start(Walk *w, const uint8_t *start, const uint8_t *end, int dml_type, Py_ssize_t ncols);
int bridge_walk_next(Walk *w, Py_ssize_t *count);
int bridge_walk_resume(Walk *w, PyObject *resume);
int bridge_append_stolen(PyObject **list, PyObject *item);
PyObject *bridge_walk_result(int rc, PyObject *result);
PyObject *bridge_Plan_rows(PlanObject *self, PyObject *const *args, Py_ssize_t nargs);

/* tuples.c */
PyObject *bridge_Plan_tuples(PlanObject *self, PyObject *const *args, Py_ssize_t nargs);

/* lines.c: JSON lines and message dicts */
int bridge_put_seq(Buf *b, const Layout *L, long long index);
int bridge_write_line(PlanObject *plan, const Layout *L, const Walk *w, Py_ssize_t count, Py_ssize_t k, Buf *b,
                      Py_ssize_t *spans, Buf *shard, int *has_key, Extras *x);
Py_ssize_t *bridge_key_indexes(PlanObject *plan, PyObject *keys, Py_ssize_t *nkeys);
int bridge_check_templates(PyObject *pre, PyObject *post, Py_ssize_t nimg);
PyObject *bridge_message(PyObject *const *args, PyObject *values, PyObject *raws, PyObject *charsets, Py_ssize_t k,
                         PyObject *seq, long long index, long long nrows);
PyObject *bridge_Plan_lines(PlanObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *bridge_Plan_messages(PlanObject *self, PyObject *const *args, Py_ssize_t nargs);

/* decode.c: Blob -> DTS */
int bridge_put_varint(Buf *b, uint64_t v);
PyObject *bridge_Plan_encode(PlanObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *bridge_Plan_lane(PlanObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *bridge_with_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* pages.c */
PyObject *bridge_blob_page(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *bridge_pos_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* The Header fields dts.header holds, in field-number order (lines.c): bridge/blob/encode.py's
 * wire_ext_header, every scalar field but those the envelope and schema.source say (messageType,
 * timestamp, seqId, sourceType, schemaName, tableName). Plan.messages reads them off the Header;
 * Plan.lane writes them back. */
enum { H_INT32, H_INT64, H_UINT64, H_BOOL, H_STRING };
typedef struct {
    uint32_t field;
    const char *name;
    int kind;
} ExtHeaderField;
#define N_EXT_HEADER 7
extern const ExtHeaderField bridge_ext_header[N_EXT_HEADER];
/* Blob -> DTS (values.c): text in a charset of the table, as its codec encodes it; NULL with no
 * error set when the table has no text codec for it or the text does not encode (Python decides) */
PyObject *bridge_encode_text(Col *c, Span cs, PyObject *text);

/* sink.c: a plain DML Entry (only a Header of known fields and a DML Event C walks, 1 to 10**6 rows):
 * 1, or 0 (Python converts it); the key a Sink looks its table up by */
int bridge_plain_entry(const uint8_t *start, const uint8_t *end, PlainEntry *e);
int bridge_table_key_into(Buf *b, const PlainHeader *hv, Span columns);
int bridge_sink_table(Buf *scratch, const Buf *held, PyObject *last, PyObject *tables, const PlainEntry *e,
                      PyObject **rec);
int bridge_sink_hold(Buf *held, PyObject **last, const Buf *scratch, PyObject *rec);
extern PyTypeObject bridge_SinkType;
/* tuple_sink.c */
extern PyTypeObject bridge_TupleSinkType;
/* merge.c: the shard merge of `sync --to dts` (bridge/stream/merge.py) */
extern PyTypeObject bridge_MergeType;
PyObject *bridge_table_key(PyObject *module, PyObject *arg);

/* plan.c */
extern PyTypeObject bridge_PlanType;

#endif /* BRIDGE_SPEEDUPS_H */
