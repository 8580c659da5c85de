/* Protobuf on the wire: the growing byte buffer, the DML event of an Entry (scan), the header
 * properties, the schema C walks (proto/subscribe.proto, field by field), Entries that protobuf
 * parses known without parsing them, and split_items. */
#include "speedups.h"

int bridge_buf_grow(Buf *b, Py_ssize_t more) {
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

/* The only occurrence of length-delimited field `want` in a message; 0 if absent, -1 if repeated
 * (protobuf would merge the occurrences) or malformed. */
int bridge_only_submessage(const uint8_t *p, const uint8_t *end, uint32_t want, Span *out) {
    int found = 0;
    while (p < end) {
        uint64_t tag;
        if (!read_tag(&p, end, &tag)) return -1;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if (field == want && wt == WT_LEN) {
            if (found) return -1;
            if (!read_span(&p, end, out)) return -1;
            found = 1;
        } else if (field == want || !skip_field(&p, end, wt)) {
            return -1;
        }
    }
    return found;
}

/* Collect the Data of field `want` of a RowChange, up to `cap`; count may exceed cap (a miss). */
int bridge_row_datas(Span row, uint32_t want, Span *datas, Py_ssize_t cap, Py_ssize_t *count) {
    const uint8_t *p = row.p, *end = row.p + row.n;
    *count = 0;
    while (p < end) {
        uint64_t tag;
        if (!read_tag(&p, end, &tag)) return 0;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if (field == want) {
            Span s;
            if (wt != WT_LEN || !read_span(&p, end, &s)) return 0;
            if (*count < cap) datas[*count] = s;
            (*count)++;
        } else if (!skip_field(&p, end, wt)) {
            return 0;
        }
    }
    return 1;
}

/* The Event span of an Entry and the DMLEvent span inside it, each the only occurrence; 0 if not. */
int bridge_dml_span(const uint8_t *start, const uint8_t *end, Span *event, Span *dml) {
    return bridge_only_submessage(start, end, F_ENTRY_EVENT, event) == 1
           && bridge_only_submessage(event->p, event->p + event->n, F_EVENT_DMLEVENT, dml) == 1;
}

static int entry_fields_known(const uint8_t *start, const uint8_t *end);

/* The DML event of an Entry whose Event holds only a dmlEvent (no event properties, no other
 * event): the span of its column fields (one contiguous run), its dmlEventType (0..2) and its row
 * count. 1 found, 0 not. */
int bridge_scan_dml(const uint8_t *start, const uint8_t *end, Span *columns, int *dml_type_out, Py_ssize_t *rows_out) {
    Span event, dml;
    /* unknown fields (anywhere in the Entry) travel in the extension, which only Python writes */
    if (!bridge_dml_span(start, end, &event, &dml) || !entry_fields_known(start, end)) return 0;
    /* the Event holds the dmlEvent field and nothing else */
    {
        const uint8_t *p = event.p, *eend = event.p + event.n;
        while (p < eend) {
            uint64_t tag;
            if (!read_tag(&p, eend, &tag) || TAG_FIELD(tag) != F_EVENT_DMLEVENT
                || !skip_field(&p, eend, TAG_WT(tag)))
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
        if (!read_tag(&p, dend, &tag)) return 0;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        if (field == F_DMLEVENT_DMLEVENTTYPE) {
            if (wt != WT_VARINT || type_seen || !read_varint(&p, dend, &dml_type)) return 0;
            type_seen = 1;
            continue;
        }
        if (!skip_field(&p, dend, wt)) return 0;
        if (field == F_DMLEVENT_COLUMNS) {
            /* one contiguous run of column fields, so the key is a slice */
            if (cols_done) return 0;
            if (cols_start == NULL) cols_start = field_start;
            cols_end = p;
        } else {
            if (cols_start != NULL) cols_done = 1;
            if (field == F_DMLEVENT_ROWS) rows++;
        }
    }
    if (dml_type > DML_DELETE) return 0;
    columns->p = cols_start ? cols_start : (const uint8_t *)"";
    columns->n = cols_start ? cols_end - cols_start : 0;
    *dml_type_out = (int)dml_type;
    *rows_out = rows;
    return 1;
}

/* scan(entry_bytes) -> (columns key, dmlEventType, rows) for an Entry whose Event holds only a
 * dmlEvent (no event properties, no other event), or None. The key is the exact bytes of the
 * DMLEvent's columns fields, so equal keys mean equal column sets. */
PyObject *bridge_scan(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *start = (const uint8_t *)buf.buf, *end = start + buf.len;
    Span columns;
    int dml_type;
    Py_ssize_t rows;
    PyObject *result;
    if (bridge_scan_dml(start, end, &columns, &dml_type, &rows)) {
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
PyObject *bridge_header_properties(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *start = (const uint8_t *)buf.buf, *end = start + buf.len;
    PyObject *out = NULL, *pair = NULL;
    Span header;
    int found = bridge_only_submessage(start, end, F_ENTRY_HEADER, &header);
    if (found <= 0) goto unsure;
    const uint8_t *p = header.p, *hend = header.p + header.n;
    while (p < hend) {
        uint64_t tag;
        if (!read_tag(&p, hend, &tag)) goto unsure;
        Span kv;
        if (TAG_FIELD(tag) != F_HEADER_PROPERTIES) {
            if (!skip_field(&p, hend, TAG_WT(tag))) goto unsure;
            continue;
        }
        if (TAG_WT(tag) != WT_LEN || !read_span(&p, hend, &kv)) goto unsure;
        Span parts[3] = {{(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}};
        const uint8_t *q = kv.p, *kend = kv.p + kv.n;
        unsigned seen = 0;
        while (q < kend) { /* KVPair: key (1) and value (2), each at most once; anything else: Python */
            uint64_t ktag;
            if (!read_tag(&q, kend, &ktag)) goto unsure;
            uint64_t f = TAG_FIELD(ktag);
            if ((f != F_KVPAIR_KEY && f != F_KVPAIR_VALUE) || TAG_WT(ktag) != WT_LEN || (seen & (1u << f))
                || !read_span(&q, kend, &parts[f]))
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

/* proto/subscribe.proto, field by field (the F_ numbers of the fields C also reads by number; the
 * rest as the .proto writes them); exported as SCHEMA and compared with protobuf's descriptors */
static const FieldSpec FIELDS_KV[] = {{F_KVPAIR_KEY, T_STRING, 0}, {F_KVPAIR_VALUE, T_STRING, 0}};
static const FieldSpec FIELDS_ENTRIES[] = {{F_ENTRIES_ITEMS, T_MSG, M_ENTRY}};
static const FieldSpec FIELDS_ENTRY[] = {{F_ENTRY_HEADER, T_MSG, M_HEADER}, {F_ENTRY_EVENT, T_MSG, M_EVENT}};
static const FieldSpec FIELDS_HEADER[] = {
    {F_HEADER_VERSION, T_VARINT, 0},    {F_HEADER_SOURCETYPE, T_VARINT, 0}, {F_HEADER_MESSAGETYPE, T_VARINT, 0},
    {F_HEADER_TIMESTAMP, T_VARINT, 0},  {F_HEADER_SERVERID, T_VARINT, 0},   {F_HEADER_FILENAME, T_STRING, 0},
    {F_HEADER_POSITION, T_VARINT, 0},   {F_HEADER_GTID, T_STRING, 0},       {F_HEADER_SCHEMANAME, T_STRING, 0},
    {F_HEADER_TABLENAME, T_STRING, 0},  {F_HEADER_SEQID, T_VARINT, 0},      {F_HEADER_EVENTINDEX, T_VARINT, 0},
    {F_HEADER_ISLAST, T_VARINT, 0},     {F_HEADER_PROPERTIES, T_MSG, M_KV}};
static const FieldSpec FIELDS_EVENT[] = {{1, T_MSG, M_BEGIN},       {F_EVENT_DMLEVENT, T_MSG, M_DML},
                                         {3, T_MSG, M_COMMIT},      {4, T_MSG, M_DDL},
                                         {5, T_MSG, M_ROLLBACK},    {6, T_MSG, M_HEARTBEAT},
                                         {7, T_MSG, M_CHECKPOINT},  {F_EVENT_PROPERTIES, T_MSG, M_KV}};
static const FieldSpec FIELDS_BEGIN[] = {{1, T_STRING, 0}, {2, T_VARINT, 0}};
static const FieldSpec FIELDS_COMMIT[] = {{1, T_STRING, 0}};
static const FieldSpec FIELDS_DDL[] = {{1, T_STRING, 0}, {2, T_STRING, 0}, {3, T_VARINT, 0}};
static const FieldSpec FIELDS_HEARTBEAT[] = {{1, T_VARINT, 0}};
static const FieldSpec FIELDS_CHECKPOINT[] = {{1, T_STRING, 0}, {2, T_VARINT, 0}, {3, T_STRING, 0}, {4, T_VARINT, 0}};
static const FieldSpec FIELDS_DML[] = {{F_DMLEVENT_DMLEVENTTYPE, T_VARINT, 0}, {F_DMLEVENT_COLUMNS, T_MSG, M_COLUMN},
                                       {F_DMLEVENT_ROWS, T_MSG, M_ROW}};
static const FieldSpec FIELDS_COLUMN[] = {{1, T_STRING, 0}, {2, T_STRING, 0}, {3, T_VARINT, 0}, {15, T_MSG, M_KV}};
static const FieldSpec FIELDS_ROW[] = {{F_ROWCHANGE_OLDCOLUMNS, T_MSG, M_DATA}, {F_ROWCHANGE_NEWCOLUMNS, T_MSG, M_DATA},
                                       {F_ROWCHANGE_PROPERTIES, T_MSG, M_KV}};
static const FieldSpec FIELDS_DATA[] = {{F_DATA_DATATYPE, T_VARINT, 0}, {F_DATA_CHARSET, T_STRING, 0},
                                        {F_DATA_SV, T_STRING, 0},       {F_DATA_BV, T_BYTES, 0}};

#define SPEC(a) {a, (int)(sizeof(a) / sizeof(a[0]))}
static const MsgSpec MSGS[] = {
    SPEC(FIELDS_KV),     SPEC(FIELDS_ENTRIES),   SPEC(FIELDS_ENTRY),      SPEC(FIELDS_HEADER), SPEC(FIELDS_EVENT),
    SPEC(FIELDS_BEGIN),  SPEC(FIELDS_COMMIT),    SPEC(FIELDS_DDL),        {NULL, 0},           SPEC(FIELDS_HEARTBEAT),
    SPEC(FIELDS_CHECKPOINT), SPEC(FIELDS_DML),   SPEC(FIELDS_COLUMN),     SPEC(FIELDS_ROW),    SPEC(FIELDS_DATA)};

/* FIELD_AT[msg][field]: the index of the field's spec in MSGS[msg], or -1 (set up once) */
static int8_t FIELD_AT[sizeof(MSGS) / sizeof(MSGS[0])][16];

/* KNOWN_TAG[msg][tag byte]: 0 not a declared field with its wire type, 1 a varint field, 2 a
 * string or bytes field, 3 + m a field of message type m (set up once) */
static uint8_t KNOWN_TAG[sizeof(MSGS) / sizeof(MSGS[0])][128];

void bridge_field_index(void) {
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
        if (!read_tag(&p, end, &tag)) return 0;
        uint32_t field = TAG_FIELD(tag);
        int wt = TAG_WT(tag);
        const FieldSpec *f = NULL;
        if (field < 16) {
            int at = FIELD_AT[msg][field];
            f = at < 0 ? NULL : &spec->fields[at];
        }
        if (f != NULL && f->type == T_VARINT && wt == WT_VARINT) {
            if (!strict_varint(&p, end, &v)) return 0;
        } else if (f != NULL && f->type != T_VARINT && wt == WT_LEN) {
            Span sp;
            if (!read_size(&p, end, &v)) return 0;
            sp.p = p;
            sp.n = (Py_ssize_t)v;
            p += v;
            if (f->type == T_STRING && !valid_utf8(sp.p, sp.p + sp.n)) return 0;
            if (f->type == T_MSG && !valid_message(sp.p, sp.p + sp.n, f->msg)) return 0;
        } else { /* unknown, or a known field of another wire type: kept as an unknown field */
            if (wt == WT_VARINT ? !strict_varint(&p, end, &v) : (wt == WT_LEN ? !read_size(&p, end, &v) : 0))
                return 0;
            if (wt == WT_LEN) {
                p += v;
            } else if (wt != WT_VARINT && !skip_field(&p, end, wt)) {
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

/* SCHEMA: {message: ((field number, "varint" | "string" | "bytes" | message name), ...)}, the table
 * above as Python sees it (tests/test_native_contract.py compares it with protobuf's descriptors) */
PyObject *bridge_schema(void) {
    static const char *const TYPE_NAMES[] = {"varint", "string", "bytes"};
    PyObject *out = PyDict_New();
    for (size_t m = 0; out != NULL && m < sizeof(MSGS) / sizeof(MSGS[0]); m++) {
        PyObject *fields = PyTuple_New(MSGS[m].n);
        for (int i = 0; fields != NULL && i < MSGS[m].n; i++) {
            const FieldSpec *f = &MSGS[m].fields[i];
            const char *kind = f->type == T_MSG ? MSG_NAMES[f->msg] : TYPE_NAMES[f->type];
            PyObject *item = Py_BuildValue("(is)", f->field, kind);
            if (item == NULL) Py_CLEAR(fields);
            else PyTuple_SET_ITEM(fields, i, item);
        }
        if (fields == NULL || PyDict_SetItemString(out, MSG_NAMES[m], fields) < 0) Py_CLEAR(out);
        Py_XDECREF(fields);
    }
    return out;
}

/* known_fields(data, message="Entry") -> True when the bytes of that message hold no unknown field
 * at any depth (False: they may; protobuf's own view decides). */
PyObject *bridge_known_fields_py(PyObject *module, PyObject *args) {
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
PyObject *bridge_valid_entries(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    int ok = valid_message(buf.buf, (const uint8_t *)buf.buf + buf.len, M_ENTRIES);
    PyBuffer_Release(&buf);
    return PyBool_FromLong(ok);
}


/* split_items(entries_bytes) -> [bytes of each Entry] in order, or None if the bytes hold anything
 * but well-formed fields (protobuf's own parse then reports the error). Every Entries protobuf
 * refuses at this level gives None (read_tag, read_size: a tag or length over 5 bytes, a tag over
 * 2^32 - 1, field 0, wire types 4, 6, 7, a truncated field); so does a group (3), which protobuf
 * skips and C leaves to it. Field 1 of another wire type than 2 is, as for protobuf, unknown and
 * skipped. The Entries themselves are not looked into: each is parsed after. */
PyObject *bridge_split_items(PyObject *module, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = (const uint8_t *)buf.buf, *end = p + buf.len;
    PyObject *out = PyList_New(0);
    while (out != NULL && p < end) {
        uint64_t tag;
        Span s;
        if (!read_tag(&p, end, &tag)) goto malformed;
        if (TAG_FIELD(tag) != F_ENTRIES_ITEMS || TAG_WT(tag) != WT_LEN) { /* unknown to protobuf: skipped */
            if (!skip_field(&p, end, TAG_WT(tag))) goto malformed;
            continue;
        }
        if (!read_span(&p, end, &s)) goto malformed;
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
