/* The module: its functions, its types, and the contract it shows Python (CONTRACT, LAYOUTS,
 * SCHEMA), which tests/test_native_contract.py checks against bridge/native/contract.py and the
 * protobuf descriptors. */
#include "speedups.h"

/* Every number of speedups.h's contract section under its C name (contract.c_constants()) */
#define NUMBER(name) {#name, name}
static const struct {
    const char *name;
    long long value;
} CONTRACT[] = {
    NUMBER(K_LONG), NUMBER(K_DIGITS), NUMBER(K_DOUBLE), NUMBER(K_DECIMAL), NUMBER(K_TEXT), NUMBER(K_BASE64),
    NUMBER(K_UTF8), NUMBER(K_BOOL), NUMBER(K_DATE), NUMBER(K_DATETIME), NUMBER(K_TIMESTAMP),
    NUMBER(O_SAME), NUMBER(O_DECIMAL), NUMBER(O_FLOAT32), NUMBER(O_MICROS), NUMBER(O_HEX),
    NUMBER(CS_UTF8), NUMBER(CS_CODEC), NUMBER(CS_CHARMAP),
    NUMBER(OP_INSERT), NUMBER(OP_UPDATE_BEFOR), NUMBER(OP_UPDATE_AFTER), NUMBER(OP_DELETE),
    NUMBER(TS_BOOL), NUMBER(TS_INT8), NUMBER(TS_INT16), NUMBER(TS_INT32), NUMBER(TS_INT64), NUMBER(TS_FLOAT32),
    NUMBER(TS_FLOAT64), NUMBER(TS_DECIMAL128), NUMBER(TS_STRING),
    NUMBER(W_NULL), NUMBER(W_INT), NUMBER(W_MICROS), NUMBER(W_DOUBLE), NUMBER(W_FLOAT32), NUMBER(W_BOOL),
    NUMBER(W_DECIMAL), NUMBER(W_STRING), NUMBER(W_SEQ), NUMBER(W_TIME), NUMBER(W_IMAGE_TEXT),
    NUMBER(DML_INSERT), NUMBER(DML_UPDATE), NUMBER(DML_DELETE), NUMBER(MT_DML),
    NUMBER(WT_VARINT), NUMBER(WT_I64), NUMBER(WT_LEN), NUMBER(WT_SGROUP), NUMBER(WT_EGROUP), NUMBER(WT_I32),
    NUMBER(DT_NIL), NUMBER(DT_STRING), NUMBER(DT_NA), NUMBER(TUPLE_TS_HI),
    NUMBER(F_ENTRIES_ITEMS), NUMBER(F_ENTRY_HEADER), NUMBER(F_ENTRY_EVENT),
    NUMBER(F_HEADER_VERSION), NUMBER(F_HEADER_SOURCETYPE), NUMBER(F_HEADER_MESSAGETYPE), NUMBER(F_HEADER_TIMESTAMP),
    NUMBER(F_HEADER_SERVERID), NUMBER(F_HEADER_FILENAME), NUMBER(F_HEADER_POSITION), NUMBER(F_HEADER_GTID),
    NUMBER(F_HEADER_SCHEMANAME), NUMBER(F_HEADER_TABLENAME), NUMBER(F_HEADER_SEQID), NUMBER(F_HEADER_EVENTINDEX),
    NUMBER(F_HEADER_ISLAST), NUMBER(F_HEADER_PROPERTIES),
    NUMBER(F_EVENT_DMLEVENT), NUMBER(F_EVENT_PROPERTIES),
    NUMBER(F_DMLEVENT_DMLEVENTTYPE), NUMBER(F_DMLEVENT_COLUMNS), NUMBER(F_DMLEVENT_ROWS),
    NUMBER(F_ROWCHANGE_OLDCOLUMNS), NUMBER(F_ROWCHANGE_NEWCOLUMNS), NUMBER(F_ROWCHANGE_PROPERTIES),
    NUMBER(F_DATA_DATATYPE), NUMBER(F_DATA_CHARSET), NUMBER(F_DATA_SV), NUMBER(F_DATA_BV),
    NUMBER(F_KVPAIR_KEY), NUMBER(F_KVPAIR_VALUE),
};

/* The positional tuples' layouts (speedups.h's LAYOUT_*), as contract.py's NamedTuples name them */
static const char *const PLAN_COLUMN[] = {LAYOUT_PLAN_COLUMN, NULL};
static const char *const CHARSET_ENTRY[] = {LAYOUT_CHARSET_ENTRY, NULL};
static const char *const SINK_TABLE[] = {LAYOUT_SINK_TABLE, NULL};
static const char *const SCANNED[] = {LAYOUT_SCANNED, NULL};
static const char *const SINK_ENTRIES[] = {LAYOUT_SINK_ENTRIES, NULL};
static const char *const SINK_TAKEN[] = {LAYOUT_SINK_TAKEN, NULL};
static const char *const TUPLE_SINK_FIELD[] = {LAYOUT_TUPLE_SINK_FIELD, NULL};
static const char *const TUPLE_SINK_TABLE[] = {LAYOUT_TUPLE_SINK_TABLE, NULL};
static const char *const TUPLE_SINK_TAKEN[] = {LAYOUT_TUPLE_SINK_TAKEN, NULL};
static const struct {
    const char *name;
    const char *const *fields;
} LAYOUTS[] = {{"PlanColumn", PLAN_COLUMN}, {"CharsetEntry", CHARSET_ENTRY}, {"SinkTable", SINK_TABLE},
               {"Scanned", SCANNED},        {"SinkEntries", SINK_ENTRIES},   {"SinkTaken", SINK_TAKEN},
               {"TupleSinkField", TUPLE_SINK_FIELD}, {"TupleSinkTable", TUPLE_SINK_TABLE},
               {"TupleSinkTaken", TUPLE_SINK_TAKEN}};

/* {name: value} of CONTRACT; NULL on error */
static PyObject *contract_dict(void) {
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && i < sizeof(CONTRACT) / sizeof(CONTRACT[0]); i++) {
        PyObject *v = PyLong_FromLongLong(CONTRACT[i].value);
        if (v == NULL || PyDict_SetItemString(d, CONTRACT[i].name, v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* {layout: (field, ...)} of LAYOUTS; NULL on error */
static PyObject *layouts_dict(void) {
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && i < sizeof(LAYOUTS) / sizeof(LAYOUTS[0]); i++) {
        Py_ssize_t n = 0;
        while (LAYOUTS[i].fields[n] != NULL) n++;
        PyObject *t = PyTuple_New(n);
        for (Py_ssize_t k = 0; t != NULL && k < n; k++) {
            PyObject *s = PyUnicode_FromString(LAYOUTS[i].fields[k]);
            if (s == NULL) Py_CLEAR(t);
            else PyTuple_SET_ITEM(t, k, s);
        }
        if (t == NULL || PyDict_SetItemString(d, LAYOUTS[i].name, t) < 0) Py_CLEAR(d);
        Py_XDECREF(t);
    }
    return d;
}

static PyMethodDef module_methods[] = {
    {"scan", (PyCFunction)bridge_scan, METH_O,
     "scan(entry_bytes) -> (columns key, dmlEventType, rows) of a plain DML Entry, or None"},
    {"split_items", (PyCFunction)bridge_split_items, METH_O,
     "split_items(entries_bytes) -> [Entry bytes, ...] in order, or None for malformed bytes"},
    {"known_fields", (PyCFunction)bridge_known_fields_py, METH_VARARGS,
     "known_fields(data, message='Entry') -> True when the message holds no unknown protobuf field at any depth "
     "(False: it may)"},
    {"valid_entries", (PyCFunction)bridge_valid_entries, METH_O,
     "valid_entries(data) -> True when protobuf parses the bytes as an Entries (False: not sure)"},
    {"table_key", (PyCFunction)bridge_table_key, METH_O,
     "table_key(entry_bytes) -> the Sink's table key of a plain DML Entry, or None"},
    {"header_properties", (PyCFunction)bridge_header_properties, METH_O,
     "header_properties(entry_bytes) -> None, False (a DataHub fact, or not sure) or [[key, value], ...]"},
    {"set_charsets", (PyCFunction)bridge_set_charsets, METH_O,
     "set_charsets(table): the charsets text columns decode in C, table a sequence of (name, mode, codec, mapping, "
     "check)"},
    {"with_rows", (PyCFunction)(void (*)(void))bridge_with_rows, METH_FASTCALL,
     "with_rows(entry_bytes, rows) -> entry_bytes and the rows (RowChange bytes) appended to its DMLEvent"},
    {"blob_page", (PyCFunction)(void (*)(void))bridge_blob_page, METH_FASTCALL,
     "blob_page(pb, key, topic, shard, next, now, record) -> (records, next_cursor, count) of a Blob GetRecords "
     "answer, or None when not sure (bridge/native/src/pages.c)"},
    {"pos_stream", (PyCFunction)(void (*)(void))bridge_pos_stream, METH_FASTCALL,
     "pos_stream(pos, topic, source_topic) -> (stream, order, group) of a plain dts.pos, or None (pages.c)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bridge.native._speedups",
    "C fast path of the DTS -> Blob value loop (the Python codecs are the reference).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

/* module.<name> = value (a new reference, stolen); 0 on error */
static int add_stolen(PyObject *m, const char *name, PyObject *value) {
    if (value == NULL) return 0;
    if (PyModule_AddObject(m, name, value) < 0) {
        Py_DECREF(value);
        return 0;
    }
    return 1;
}

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&bridge_PlanType) < 0 || PyType_Ready(&bridge_SinkType) < 0 || PyType_Ready(&bridge_MergeType) < 0
        || PyType_Ready(&bridge_TupleSinkType) < 0)
        return NULL;
    bridge_field_index();
    if (!bridge_names_init()) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&bridge_PlanType);
    Py_INCREF(&bridge_SinkType);
    Py_INCREF(&bridge_MergeType);
    Py_INCREF(&bridge_TupleSinkType);
    if (!add_stolen(m, "Plan", (PyObject *)&bridge_PlanType) || !add_stolen(m, "Sink", (PyObject *)&bridge_SinkType)
        || !add_stolen(m, "Merge", (PyObject *)&bridge_MergeType)
        || !add_stolen(m, "TupleSink", (PyObject *)&bridge_TupleSinkType)
        || !add_stolen(m, "CONTRACT", contract_dict()) || !add_stolen(m, "LAYOUTS", layouts_dict())
        || !add_stolen(m, "SCHEMA", bridge_schema())) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
