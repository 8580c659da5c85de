/* Merge: the shard merge's bookkeeping of `sync --to dts` (bridge/stream/merge.py says the rules;
 * its PyMerge is the reference, and tests/test_shard_merge.py runs both on the same operations).
 *
 * Shards and streams are the small ints the assembler gives them. A shard keeps its buffered
 * records in a list (shard order); each (shard, stream) pair keeps a slot in an open-addressing
 * table: the records of that stream still waiting on that shard (a list threaded through the same
 * items) and the order of the last one read. Orders are the Python tuples the assembler made and
 * are compared with Python's own comparison, so what "later" means is exactly Python's. */
#include "speedups.h"
#include "structmember.h"

typedef struct MItem {
    struct MItem *next;      /* the next buffered record of its shard */
    struct MItem *next_same; /* the next waiting record of the same (shard, stream) */
    PyObject *order;
    PyObject *item;
    double read_at, system_ms;
    Py_ssize_t stream;
} MItem;

typedef struct {
    uint64_t key; /* (shard << 32 | stream) + 1; 0: an empty slot */
    MItem *first, *last;
    PyObject *seen; /* the order of the last record of the stream read on the shard, or NULL */
} MSlot;

typedef struct {
    Py_ssize_t topic;
    int finished;
    double end_at, end_ms;
    MItem *head, *tail;
    char in_order, dirty;
    char walk; /* its hold-back may have changed since stuck(True) walked from it */
    Py_ssize_t blocker; /* the other shard that held the head back when last looked at, or -1 */
    Py_ssize_t *others, n_others;
    Py_ssize_t *ancestors, n_ancestors;
} MShard;

typedef struct {
    PyObject_HEAD
    double settle;
    Py_ssize_t buffered;
    MShard *shards;
    Py_ssize_t n_shards, cap_shards;
    Py_ssize_t *order; /* shards in the order they first buffered a record */
    Py_ssize_t n_order, cap_order;
    MSlot *slots;
    size_t cap_slots, used_slots;
    PyObject **released; /* stream -> the order of the last record handed on, or NULL */
    Py_ssize_t cap_released;
    Py_ssize_t n_dirty;
    Py_ssize_t pos; /* the pass `next` is in (an index into order), or -1 between passes */
    int draining, progress;
} Merge;

static uint64_t slot_key(Py_ssize_t shard, Py_ssize_t stream) {
    return (((uint64_t)shard << 32) | (uint64_t)stream) + 1;
}

static size_t slot_hash(uint64_t key, size_t cap) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}

static MSlot *slot_find(Merge *m, Py_ssize_t shard, Py_ssize_t stream) {
    if (m->cap_slots == 0) return NULL;
    uint64_t key = slot_key(shard, stream);
    for (size_t i = slot_hash(key, m->cap_slots);; i = (i + 1) & (m->cap_slots - 1)) {
        if (m->slots[i].key == key) return &m->slots[i];
        if (m->slots[i].key == 0) return NULL;
    }
}

/* the slot of (shard, stream), made when missing; NULL (MemoryError set) on failure */
static MSlot *slot_get(Merge *m, Py_ssize_t shard, Py_ssize_t stream) {
    MSlot *found = slot_find(m, shard, stream);
    if (found != NULL) return found;
    if ((m->used_slots + 1) * 2 > m->cap_slots) {
        size_t cap = m->cap_slots ? m->cap_slots * 2 : 64;
        MSlot *slots = PyMem_Calloc(cap, sizeof(MSlot));
        if (slots == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        for (size_t k = 0; k < m->cap_slots; k++) {
            if (m->slots[k].key == 0) continue;
            size_t i = slot_hash(m->slots[k].key, cap);
            while (slots[i].key != 0) i = (i + 1) & (cap - 1);
            slots[i] = m->slots[k];
        }
        PyMem_Free(m->slots);
        m->slots = slots;
        m->cap_slots = cap;
    }
    uint64_t key = slot_key(shard, stream);
    size_t i = slot_hash(key, m->cap_slots);
    while (m->slots[i].key != 0) i = (i + 1) & (m->cap_slots - 1);
    m->slots[i].key = key;
    m->used_slots++;
    return &m->slots[i];
}

static void set_dirty(Merge *m, Py_ssize_t shard) {
    if (!m->shards[shard].dirty) {
        m->shards[shard].dirty = 1;
        m->n_dirty++;
    }
}

static PyObject *released_of(Merge *m, Py_ssize_t stream);

static void set_walk(Merge *m, Py_ssize_t shard) {
    m->shards[shard].walk = 1;
}

/* 1: a record of its stream at or after `it`'s order was handed on (a copy or a late record: it
 * goes out at once and holds nothing back), 0: not, -1: an error */
static int stale(Merge *m, MItem *it) {
    PyObject *released = released_of(m, it->stream);
    if (released == NULL) return 0;
    return PyObject_RichCompareBool(it->order, released, Py_LE);
}

/* the first record waiting in `slot` that is not stale (NULL: none); *err = 1 on an error */
static MItem *live_of(Merge *m, MSlot *slot, int *err) {
    if (slot == NULL) return NULL;
    for (MItem *it = slot->first; it != NULL; it = it->next_same) {
        int s = stale(m, it);
        if (s < 0) {
            *err = 1;
            return NULL;
        }
        if (!s) return it;
    }
    return NULL;
}

/* 1: shard `other` covers `head` (of shard `shard`), 0: it does not, -1: an error */
static int covers(Merge *m, Py_ssize_t other, Py_ssize_t shard, MItem *head) {
    MShard *o = &m->shards[other];
    MSlot *slot = slot_find(m, other, head->stream);
    int err = 0;
    MItem *live = live_of(m, slot, &err);
    if (err) return -1;
    /* the same order on another shard is the same record written twice: the head goes first */
    if (live != NULL) return PyObject_RichCompareBool(live->order, head->order, Py_GE);
    if (o->finished) return 1;
    if (slot != NULL && slot->seen != NULL) {
        int later = PyObject_RichCompareBool(slot->seen, head->order, Py_GE);
        if (later != 0) return later;
    }
    if (o->end_at >= head->read_at + m->settle) return 1;
    if (o->end_ms >= head->system_ms + m->settle * 1000) return 1;
    for (Py_ssize_t k = 0; k < o->n_ancestors; k++)
        if (o->ancestors[k] == shard) return 1;
    return 0;
}

/* the other shard that does not cover the head of `shard`, -1 when all do, -2 on error */
static Py_ssize_t blocker(Merge *m, Py_ssize_t shard, MItem *head) {
    MShard *sh = &m->shards[shard];
    Py_ssize_t first = sh->blocker;
    if (first >= 0) {
        int c = covers(m, first, shard, head);
        if (c < 0) return -2;
        if (!c) return first;
    }
    for (Py_ssize_t k = 0; k < sh->n_others; k++) {
        Py_ssize_t other = sh->others[k];
        if (other == first) continue;
        int c = covers(m, other, shard, head);
        if (c < 0) return -2;
        if (!c) {
            sh->blocker = other;
            return other;
        }
    }
    return -1;
}

/* what `shard` holds of `stream` changed (and, `released`, what was handed on of it): the other
 * shards whose head is of that stream and was held back by `shard` last time (or by none; after a
 * release, by any: their head may be stale now) are looked at again */
static void touch(Merge *m, Py_ssize_t shard, Py_ssize_t stream, int released) {
    MShard *sh = &m->shards[shard];
    for (Py_ssize_t k = 0; k < sh->n_others; k++) {
        Py_ssize_t other = sh->others[k];
        MShard *o = &m->shards[other];
        if (o->head != NULL && o->head->stream == stream) {
            if (released) set_walk(m, other); /* its head's hold-back may be another shard now */
            if (!o->dirty && (released || o->blocker < 0 || o->blocker == shard)) set_dirty(m, other);
        }
    }
}

static int check_shard(Merge *m, Py_ssize_t shard) {
    if (shard < 0 || shard >= m->n_shards) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_IndexError, "no shard %zd in the merge", shard);
        return 0;
    }
    return 1;
}

/* An order is a tuple of ints (exactly those types): comparing two never runs Python code, so
 * nothing can call back into the merge while it holds pointers into itself. 1 when it is. */
static int check_order(PyObject *order) {
    if (PyTuple_CheckExact(order)) {
        Py_ssize_t n = PyTuple_GET_SIZE(order), k = 0;
        while (k < n && PyLong_CheckExact(PyTuple_GET_ITEM(order, k))) k++;
        if (k == n) return 1;
    }
    PyErr_SetString(PyExc_TypeError, "an order is a tuple of ints");
    return 0;
}

static int check_stream(Py_ssize_t stream) {
    if (stream < 0 || stream > 0x7fffffff) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_IndexError, "stream %zd out of range", stream);
        return 0;
    }
    return 1;
}

static PyObject *released_of(Merge *m, Py_ssize_t stream) {
    return stream < m->cap_released ? m->released[stream] : NULL;
}

/* room for released[stream]; 0 on error (MemoryError set) */
static int reserve_released(Merge *m, Py_ssize_t stream) {
    if (stream >= m->cap_released) {
        Py_ssize_t cap = m->cap_released ? m->cap_released : 16;
        while (cap <= stream) cap *= 2;
        PyObject **grown = PyMem_Realloc(m->released, (size_t)cap * sizeof(PyObject *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        memset(grown + m->cap_released, 0, (size_t)(cap - m->cap_released) * sizeof(PyObject *));
        m->released = grown;
        m->cap_released = cap;
    }
    return 1;
}

/* released[stream] = order (a new reference, stolen); 0 on error (the reference released) */
static int set_released(Merge *m, Py_ssize_t stream, PyObject *order) {
    if (!reserve_released(m, stream)) {
        Py_DECREF(order);
        return 0;
    }
    Py_XSETREF(m->released[stream], order);
    return 1;
}

/* released[stream] = order when it is later than what was released (a forced head may have gone
 * past it); 0 on error */
static int release_order(Merge *m, Py_ssize_t stream, PyObject *order) {
    PyObject *was = released_of(m, stream);
    if (was != NULL) {
        int later = PyObject_RichCompareBool(order, was, Py_GT);
        if (later < 0) return 0;
        if (!later) return 1;
    }
    return set_released(m, stream, Py_NewRef(order));
}

/* take the head of `shard` out of the merge (buffered, its slot, `touch`): the item (a new reference), NULL
 * on error (the item dropped) */
static PyObject *pop_head(Merge *m, Py_ssize_t shard) {
    MShard *sh = &m->shards[shard];
    MItem *head = sh->head;
    sh->head = head->next;
    if (sh->head == NULL) sh->tail = NULL;
    MSlot *slot = slot_find(m, shard, head->stream);
    slot->first = head->next_same;
    if (slot->first == NULL) slot->last = NULL;
    m->buffered--;
    m->progress = 1;
    PyObject *item = head->item;
    Py_ssize_t stream = head->stream;
    int ok = release_order(m, stream, head->order);
    Py_DECREF(head->order);
    PyMem_Free(head);
    touch(m, shard, stream, 1);
    if (sh->head != NULL) set_walk(m, shard); /* a new head */
    if (!ok) {
        Py_DECREF(item);
        return NULL;
    }
    return item;
}

/* ---- methods ------------------------------------------------------------------------------- */
static PyObject *Merge_add_shard(Merge *m, PyObject *arg) {
    Py_ssize_t topic = PyLong_AsSsize_t(arg);
    if (topic == -1 && PyErr_Occurred()) return NULL;
    if (m->n_shards == m->cap_shards) {
        Py_ssize_t cap = m->cap_shards ? m->cap_shards * 2 : 8;
        MShard *grown = PyMem_Realloc(m->shards, (size_t)cap * sizeof(MShard));
        if (grown == NULL) return PyErr_NoMemory();
        m->shards = grown;
        m->cap_shards = cap;
    }
    Py_ssize_t shard = m->n_shards;
    MShard *sh = &m->shards[shard];
    memset(sh, 0, sizeof(MShard));
    sh->topic = topic;
    sh->end_at = sh->end_ms = -INFINITY;
    sh->blocker = -1;
    m->n_shards++;
    /* the others of every shard of the topic, in shard order */
    Py_ssize_t same = 0;
    for (Py_ssize_t s = 0; s < m->n_shards; s++) same += m->shards[s].topic == topic;
    for (Py_ssize_t s = 0; s < m->n_shards; s++) {
        MShard *x = &m->shards[s];
        if (x->topic != topic) continue;
        Py_ssize_t *others = PyMem_Malloc((size_t)(same > 1 ? same - 1 : 1) * sizeof(Py_ssize_t));
        if (others == NULL) return PyErr_NoMemory();
        Py_ssize_t n = 0;
        for (Py_ssize_t o = 0; o < m->n_shards; o++)
            if (o != s && m->shards[o].topic == topic) others[n++] = o;
        PyMem_Free(x->others);
        x->others = others;
        x->n_others = n;
    }
    return PyLong_FromSsize_t(shard);
}

static PyObject *Merge_set_ancestors(Merge *m, PyObject *args) {
    Py_ssize_t shard;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "nO:set_ancestors", &shard, &seq) || !check_shard(m, shard)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "ancestors must be a sequence of shards");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t *ancestors = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (ancestors == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        ancestors[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, k));
        if (ancestors[k] == -1 && PyErr_Occurred()) {
            PyMem_Free(ancestors);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    PyMem_Free(m->shards[shard].ancestors);
    m->shards[shard].ancestors = ancestors;
    m->shards[shard].n_ancestors = n;
    Py_RETURN_NONE;
}

static PyObject *Merge_mark(Merge *m, PyObject *args) {
    Py_ssize_t shard;
    int finished;
    double end_at, end_ms;
    if (!PyArg_ParseTuple(args, "npdd:mark", &shard, &finished, &end_at, &end_ms) || !check_shard(m, shard))
        return NULL;
    MShard *sh = &m->shards[shard];
    sh->finished = finished;
    sh->end_at = end_at;
    sh->end_ms = end_ms;
    if (sh->head != NULL) set_dirty(m, shard);
    for (Py_ssize_t k = 0; k < sh->n_others; k++)
        if (m->shards[sh->others[k]].head != NULL) set_dirty(m, sh->others[k]);
    Py_RETURN_NONE;
}

static PyObject *Merge_finish_all(Merge *m, PyObject *unused) {
    for (Py_ssize_t s = 0; s < m->n_shards; s++) m->shards[s].end_at = m->shards[s].end_ms = INFINITY;
    for (Py_ssize_t k = 0; k < m->n_order; k++) set_dirty(m, m->order[k]);
    Py_RETURN_NONE;
}

/* the shard next in the passes' order, when it is not in it yet; 0 on error */
static int enlist(Merge *m, Py_ssize_t shard) {
    MShard *sh = &m->shards[shard];
    if (sh->in_order) return 1;
    if (m->n_order == m->cap_order) {
        Py_ssize_t cap = m->cap_order ? m->cap_order * 2 : 8;
        Py_ssize_t *grown = PyMem_Realloc(m->order, (size_t)cap * sizeof(Py_ssize_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        m->order = grown;
        m->cap_order = cap;
    }
    m->order[m->n_order++] = shard;
    sh->in_order = 1;
    return 1;
}

static PyObject *Merge_enlist(Merge *m, PyObject *arg) {
    Py_ssize_t shard = PyLong_AsSsize_t(arg);
    if (!check_shard(m, shard) || !enlist(m, shard)) return NULL;
    Py_RETURN_NONE;
}

/* push(shard, stream, order, read_at, system_ms, item, check_late=True) -> bool */
static PyObject *Merge_push(Merge *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "push(shard, stream, order, read_at, system_ms, item[, check_late])");
        return NULL;
    }
    Py_ssize_t shard = PyLong_AsSsize_t(args[0]);
    if (!check_shard(m, shard)) return NULL;
    Py_ssize_t stream = PyLong_AsSsize_t(args[1]);
    if (!check_stream(stream)) return NULL;
    PyObject *order = args[2];
    if (!check_order(order)) return NULL;
    double read_at = PyFloat_AsDouble(args[3]);
    if (read_at == -1.0 && PyErr_Occurred()) return NULL;
    double system_ms = PyFloat_AsDouble(args[4]);
    if (system_ms == -1.0 && PyErr_Occurred()) return NULL;
    int check_late = 1;
    if (nargs == 7 && (check_late = PyObject_IsTrue(args[6])) < 0) return NULL;
    if (check_late) {
        PyObject *released = released_of(m, stream);
        if (released != NULL) {
            int early = PyObject_RichCompareBool(order, released, Py_LE);
            if (early < 0) return NULL;
            if (early) Py_RETURN_FALSE;
        }
    }
    /* room for what `next` records when it hands this on, so that it cannot fail there */
    if (!reserve_released(m, stream)) return NULL;
    MSlot *slot = slot_get(m, shard, stream);
    if (slot == NULL) return NULL;
    int later = 1;
    if (slot->seen != NULL && (later = PyObject_RichCompareBool(order, slot->seen, Py_GT)) < 0) return NULL;
    /* its hold-back or the others' may change: a new head, or no live record of the stream waiting
     * here before (none, or the first stale: then maybe none) */
    int walk = m->shards[shard].head == NULL || slot->first == NULL;
    if (!walk && (walk = stale(m, slot->first)) < 0) return NULL;
    MItem *it = PyMem_Malloc(sizeof(MItem));
    if (it == NULL) return PyErr_NoMemory();
    it->next = it->next_same = NULL;
    it->order = Py_NewRef(order);
    it->item = Py_NewRef(args[5]);
    it->read_at = read_at;
    it->system_ms = system_ms;
    it->stream = stream;
    MShard *sh = &m->shards[shard];
    if (sh->head == NULL) {
        if (!enlist(m, shard)) {
            Py_DECREF(it->order);
            Py_DECREF(it->item);
            PyMem_Free(it);
            return NULL;
        }
        set_dirty(m, shard); /* a new head */
        sh->head = it;
    } else {
        sh->tail->next = it;
    }
    sh->tail = it;
    if (walk) set_walk(m, shard);
    int first = slot->first == NULL;
    if (first) slot->first = it;
    else slot->last->next_same = it;
    slot->last = it;
    if (later) Py_XSETREF(slot->seen, Py_NewRef(order));
    m->buffered++;
    if (first) touch(m, shard, stream, 0);
    Py_RETURN_TRUE;
}

static PyObject *Merge_next(Merge *m, PyObject *unused) {
    for (;;) {
        if (m->pos < 0) {
            if (!(m->progress && m->buffered && m->n_dirty)) {
                if (!m->buffered) {
                    for (Py_ssize_t s = 0; s < m->n_shards; s++) m->shards[s].dirty = 0;
                    m->n_dirty = 0;
                }
                m->progress = 1;
                Py_RETURN_NONE;
            }
            m->progress = 0;
            m->pos = 0;
            m->draining = 0;
        }
        while (m->pos < m->n_order) {
            Py_ssize_t shard = m->order[m->pos];
            MShard *sh = &m->shards[shard];
            if (!m->draining) {
                if (!sh->dirty) {
                    m->pos++;
                    continue;
                }
                sh->dirty = 0;
                m->n_dirty--;
                m->draining = 1;
            }
            MItem *head = sh->head;
            if (head != NULL) {
                Py_ssize_t held = -1;
                if (sh->n_others) {
                    int s = stale(m, head);
                    if (s < 0) return NULL;
                    if (!s) held = blocker(m, shard, head);
                }
                if (held == -2) return NULL;
                if (held == -1) return pop_head(m, shard);
            }
            m->draining = 0;
            m->pos++;
        }
        m->pos = -1;
    }
}

/* ---- stalls (bridge/stream/merge.py's PyMerge.stuck, oldest, force) ---------------------------- */
/* the first other shard holding an earlier record of the head's stream waiting: its number, -1 when
 * none does (or `shard` holds nothing), -2 on error */
static Py_ssize_t held_by(Merge *m, Py_ssize_t shard) {
    MShard *sh = &m->shards[shard];
    MItem *head = sh->head;
    if (head == NULL) return -1;
    int s = stale(m, head), err = 0;
    if (s) return s < 0 ? -2 : -1;
    for (Py_ssize_t k = 0; k < sh->n_others; k++) {
        MItem *live = live_of(m, slot_find(m, sh->others[k], head->stream), &err);
        if (err) return -2;
        if (live == NULL) continue;
        int earlier = PyObject_RichCompareBool(live->order, head->order, Py_LT);
        if (earlier < 0) return -2;
        if (earlier) return sh->others[k];
    }
    return -1;
}

/* of `shards` (n of them, each holding a record), the one whose head was read first; ties: the
 * passes' order */
static Py_ssize_t first_read(Merge *m, const Py_ssize_t *shards, Py_ssize_t n) {
    Py_ssize_t best = -1, best_pos = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t pos = 0;
        while (pos < m->n_order && m->order[pos] != shards[k]) pos++;
        double at = m->shards[shards[k]].head->read_at;
        if (best < 0 || at < m->shards[best].head->read_at || (at == m->shards[best].head->read_at && pos < best_pos)) {
            best = shards[k];
            best_pos = pos;
        }
    }
    return best;
}

/* stuck(changed=False): walking from every shard in the passes' order, or (changed) from those whose
 * hold-back may have changed since stuck(True) walked from them (each walked from is cleared) */
static PyObject *Merge_stuck(Merge *m, PyObject *args) {
    Py_ssize_t n = m->n_shards, found = -1;
    int changed = 0;
    if (!PyArg_ParseTuple(args, "|p:stuck", &changed)) return NULL;
    Py_ssize_t *walked = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    Py_ssize_t *path = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (walked == NULL || path == NULL) {
        PyMem_Free(walked);
        PyMem_Free(path);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t s = 0; s < n; s++) walked[s] = -1;
    for (Py_ssize_t k = 0; k < m->n_order && found < 0; k++) {
        Py_ssize_t start = m->order[k];
        if (changed) {
            if (!m->shards[start].walk) continue;
            m->shards[start].walk = 0;
        }
        if (m->shards[start].head == NULL || walked[start] >= 0) continue;
        Py_ssize_t len = 0, shard = start;
        while (shard >= 0 && walked[shard] < 0) {
            walked[shard] = start;
            path[len++] = shard;
            shard = held_by(m, shard);
        }
        if (shard == -2) {
            PyMem_Free(walked);
            PyMem_Free(path);
            return NULL;
        }
        if (shard >= 0 && walked[shard] == start) {
            /* a deadlock only when every head of the topic is held back by an earlier record
             * (PyMerge._all_held): a head waiting for time can go, and end the cycle */
            MShard *sh = &m->shards[shard];
            int all = 1;
            for (Py_ssize_t j = -1; j < sh->n_others && all; j++) {
                Py_ssize_t other = j < 0 ? shard : sh->others[j];
                if (m->shards[other].head == NULL) continue;
                Py_ssize_t hb = held_by(m, other);
                if (hb == -2) {
                    PyMem_Free(walked);
                    PyMem_Free(path);
                    return NULL;
                }
                if (hb == -1) all = 0;
            }
            if (all) {
                Py_ssize_t from = 0;
                while (path[from] != shard) from++;
                found = first_read(m, path + from, len - from);
            }
        }
    }
    PyMem_Free(walked);
    PyMem_Free(path);
    return PyLong_FromSsize_t(found);
}

static PyObject *Merge_oldest(Merge *m, PyObject *unused) {
    Py_ssize_t *held = PyMem_Malloc((size_t)(m->n_order ? m->n_order : 1) * sizeof(Py_ssize_t));
    if (held == NULL) return PyErr_NoMemory();
    Py_ssize_t n = 0;
    for (Py_ssize_t k = 0; k < m->n_order; k++)
        if (m->shards[m->order[k]].head != NULL) held[n++] = m->order[k];
    Py_ssize_t best = n ? first_read(m, held, n) : -1;
    PyMem_Free(held);
    return PyLong_FromSsize_t(best);
}

static PyObject *Merge_force(Merge *m, PyObject *arg) {
    Py_ssize_t shard = PyLong_AsSsize_t(arg);
    if (!check_shard(m, shard)) return NULL;
    if (m->shards[shard].head == NULL) Py_RETURN_NONE;
    PyObject *item = pop_head(m, shard);
    if (item != NULL && m->shards[shard].head != NULL) set_dirty(m, shard); /* a new head */
    return item;
}

static PyObject *Merge_head(Merge *m, PyObject *arg) {
    Py_ssize_t shard = PyLong_AsSsize_t(arg);
    if (shard == -1 && PyErr_Occurred()) return NULL;
    if (shard < 0 || shard >= m->n_shards || m->shards[shard].head == NULL) Py_RETURN_NONE;
    return Py_NewRef(m->shards[shard].head->item);
}

/* The answers below are read out of the merge before any Python object is made (making one can run
 * the garbage collector, and a finalizer could call back into the merge). */
static PyObject *Merge_items(Merge *m, PyObject *arg) {
    Py_ssize_t shard = PyLong_AsSsize_t(arg);
    if (!check_shard(m, shard)) return NULL;
    Py_ssize_t n = 0;
    for (MItem *it = m->shards[shard].head; it != NULL; it = it->next) n++;
    PyObject **items = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(PyObject *));
    if (items == NULL) return PyErr_NoMemory();
    n = 0;
    for (MItem *it = m->shards[shard].head; it != NULL; it = it->next) items[n++] = Py_NewRef(it->item);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (out != NULL) PyList_SET_ITEM(out, k, items[k]);
        else Py_DECREF(items[k]);
    }
    PyMem_Free(items);
    return out;
}

static PyObject *Merge_order(Merge *m, PyObject *unused) {
    Py_ssize_t n = m->n_order;
    Py_ssize_t *order = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (order == NULL) return PyErr_NoMemory();
    if (n) memcpy(order, m->order, (size_t)n * sizeof(Py_ssize_t));
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject *v = PyLong_FromSsize_t(order[k]);
        if (v == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, v);
    }
    PyMem_Free(order);
    return out;
}

static PyObject *Merge_seen(Merge *m, PyObject *unused) {
    typedef struct {
        uint64_t key;
        PyObject *seen;
        int waiting;
    } Row;
    size_t n = 0;
    for (size_t i = 0; i < m->cap_slots; i++) n += m->slots[i].key != 0 && m->slots[i].seen != NULL;
    Row *rows = PyMem_Malloc((n ? n : 1) * sizeof(Row));
    if (rows == NULL) return PyErr_NoMemory();
    n = 0;
    for (size_t i = 0; i < m->cap_slots; i++) {
        MSlot *slot = &m->slots[i];
        if (slot->key == 0 || slot->seen == NULL) continue;
        rows[n].key = slot->key - 1;
        rows[n].seen = Py_NewRef(slot->seen);
        rows[n].waiting = slot->first != NULL;
        n++;
    }
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t k = 0; k < n; k++) {
        if (out != NULL) {
            PyObject *row = Py_BuildValue("nnOO", (Py_ssize_t)(rows[k].key >> 32),
                                          (Py_ssize_t)(rows[k].key & 0xffffffffu), rows[k].seen,
                                          rows[k].waiting ? Py_True : Py_False);
            if (row == NULL) Py_CLEAR(out);
            else PyList_SET_ITEM(out, (Py_ssize_t)k, row);
        }
        Py_DECREF(rows[k].seen);
    }
    PyMem_Free(rows);
    return out;
}

static PyObject *Merge_set_seen(Merge *m, PyObject *args) {
    Py_ssize_t shard, stream;
    PyObject *order;
    if (!PyArg_ParseTuple(args, "nnO:set_seen", &shard, &stream, &order) || !check_shard(m, shard)
        || !check_stream(stream) || !check_order(order))
        return NULL;
    MSlot *slot = slot_get(m, shard, stream);
    if (slot == NULL) return NULL;
    Py_XSETREF(slot->seen, Py_NewRef(order));
    Py_RETURN_NONE;
}

static PyObject *Merge_released(Merge *m, PyObject *arg) {
    Py_ssize_t stream = PyLong_AsSsize_t(arg);
    if (stream == -1 && PyErr_Occurred()) return NULL;
    PyObject *order = stream >= 0 ? released_of(m, stream) : NULL;
    return Py_NewRef(order != NULL ? order : Py_None);
}

static PyObject *Merge_set_released(Merge *m, PyObject *args) {
    Py_ssize_t stream;
    PyObject *order;
    if (!PyArg_ParseTuple(args, "nO:set_released", &stream, &order) || !check_stream(stream) || !check_order(order))
        return NULL;
    if (!set_released(m, stream, Py_NewRef(order))) return NULL;
    for (Py_ssize_t k = 0; k < m->n_order; k++) /* what is stale changed */
        if (m->shards[m->order[k]].head != NULL) set_walk(m, m->order[k]);
    Py_RETURN_NONE;
}

/* ---- the type -------------------------------------------------------------------------------- */
static int Merge_init(Merge *m, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"settle", NULL};
    double settle;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "d:Merge", kwlist, &settle)) return -1;
    if (m->n_shards || m->buffered) {
        PyErr_SetString(PyExc_RuntimeError, "a Merge is initialised once");
        return -1;
    }
    m->settle = settle;
    m->pos = -1;
    m->progress = 1;
    return 0;
}

static int Merge_traverse(Merge *m, visitproc visit, void *arg) {
    for (Py_ssize_t s = 0; s < m->n_shards; s++)
        for (MItem *it = m->shards[s].head; it != NULL; it = it->next) {
            Py_VISIT(it->order);
            Py_VISIT(it->item);
        }
    for (size_t i = 0; i < m->cap_slots; i++) Py_VISIT(m->slots[i].seen);
    for (Py_ssize_t k = 0; k < m->cap_released; k++) Py_VISIT(m->released[k]);
    return 0;
}

/* lets go of every record and order (a cycle through an item is broken here); the merge is then
 * empty, its shards known with nothing buffered */
static int Merge_clear(Merge *m) {
    for (Py_ssize_t s = 0; s < m->n_shards; s++) {
        MItem *it = m->shards[s].head;
        m->shards[s].head = m->shards[s].tail = NULL;
        m->shards[s].dirty = m->shards[s].walk = 0;
        while (it != NULL) {
            MItem *next = it->next;
            Py_CLEAR(it->order);
            Py_CLEAR(it->item);
            PyMem_Free(it);
            it = next;
        }
    }
    m->buffered = 0;
    m->n_dirty = 0;
    for (size_t i = 0; i < m->cap_slots; i++) {
        m->slots[i].first = m->slots[i].last = NULL;
        Py_CLEAR(m->slots[i].seen);
    }
    for (Py_ssize_t k = 0; k < m->cap_released; k++) Py_CLEAR(m->released[k]);
    return 0;
}

static void Merge_dealloc(Merge *m) {
    PyObject_GC_UnTrack(m);
    Merge_clear(m);
    for (Py_ssize_t s = 0; s < m->n_shards; s++) {
        PyMem_Free(m->shards[s].others);
        PyMem_Free(m->shards[s].ancestors);
    }
    PyMem_Free(m->shards);
    PyMem_Free(m->order);
    PyMem_Free(m->slots);
    PyMem_Free(m->released);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyMethodDef Merge_methods[] = {
    {"add_shard", (PyCFunction)Merge_add_shard, METH_O, "add_shard(topic) -> the new shard's number"},
    {"set_ancestors", (PyCFunction)Merge_set_ancestors, METH_VARARGS,
     "set_ancestors(shard, shards): the known shards `shard` descends from"},
    {"mark", (PyCFunction)Merge_mark, METH_VARARGS,
     "mark(shard, finished, end_at, end_ms): what is known of the shard now"},
    {"finish_all", (PyCFunction)Merge_finish_all, METH_NOARGS, "finish_all(): every shard seen at its end for good"},
    {"push", (PyCFunction)(void (*)(void))Merge_push, METH_FASTCALL,
     "push(shard, stream, order, read_at, system_ms, item[, check_late]) -> False when late (nothing buffered; "
     "check_late defaults to True)"},
    {"next", (PyCFunction)Merge_next, METH_NOARGS, "next() -> the next item to hand on, or None"},
    {"stuck", (PyCFunction)Merge_stuck, METH_VARARGS,
     "stuck(changed=False) -> a shard whose head is in a cycle of shards holding each other back, or -1 "
     "(changed: walking only from the shards whose hold-back may have changed since stuck(True) walked from them)"},
    {"oldest", (PyCFunction)Merge_oldest, METH_NOARGS, "oldest() -> the shard whose head was read first, or -1"},
    {"force", (PyCFunction)Merge_force, METH_O, "force(shard) -> its head, handed on though not covered, or None"},
    {"head", (PyCFunction)Merge_head, METH_O, "head(shard) -> the shard's first buffered item, or None"},
    {"items", (PyCFunction)Merge_items, METH_O, "items(shard) -> its buffered items, in order"},
    {"order", (PyCFunction)Merge_order, METH_NOARGS, "order() -> shards in the order they first buffered a record"},
    {"enlist", (PyCFunction)Merge_enlist, METH_O, "enlist(shard): the shard next in the passes' order, if not in it"},
    {"seen", (PyCFunction)Merge_seen, METH_NOARGS,
     "seen() -> [(shard, stream, order of the last record read, whether records of it wait), ...]"},
    {"set_seen", (PyCFunction)Merge_set_seen, METH_VARARGS, "set_seen(shard, stream, order)"},
    {"released", (PyCFunction)Merge_released, METH_O, "released(stream) -> the order handed on up to, or None"},
    {"set_released", (PyCFunction)Merge_set_released, METH_VARARGS, "set_released(stream, order)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Merge_members[] = {
    {"buffered", T_PYSSIZET, offsetof(Merge, buffered), READONLY, "records read and not handed on"},
    {"settle", T_DOUBLE, offsetof(Merge, settle), READONLY, "seconds a shard must be seen at its end"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject bridge_MergeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bridge.native._speedups.Merge",
    .tp_basicsize = sizeof(Merge),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Merge_traverse,
    .tp_clear = (inquiry)Merge_clear,
    .tp_doc = "Merge(settle): the shard merge's bookkeeping (bridge/stream/merge.py's PyMerge is its reference)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Merge_init,
    .tp_dealloc = (destructor)Merge_dealloc,
    .tp_methods = Merge_methods,
    .tp_members = Merge_members,
};
