/* The hits of a local-index search, built in one call, and their explained words (optional:
 * backend._hits and backend._explain do the same in Python without it).
 *
 * For k=1000 the Python path spends about 0.7 ms warm (1 ms cold) on 1,000 hits: the
 * strings of each shard's rows, putting them back in rank order, and 1,000 calls of
 * Hit.__init__. Here each hit's id, path and URL are decoded straight from the shard's
 * blobs (str(bytes, "utf-8", "surrogatepass"), as Shard.string does) and the Hit is made
 * without running __init__: its slots are written through the offsets of the class's own
 * slot descriptors, looked up by name and checked to be plain object slots.
 *
 * Every byte comes from the memory-mapped cache, so nothing read is trusted: rows, shard
 * numbers, offsets and blob lengths are checked before any read; a bad one raises
 * ValueError and the caller treats the cache as damaged.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)(address))
#endif

static const char *SLOT_NAMES[] = {"id", "score", "path", "url", "_matched", "_parts"};
enum { SLOT_ID, SLOT_SCORE, SLOT_PATH, SLOT_URL, SLOT_MATCHED, SLOT_PARTS, N_SLOTS };

/* The slot offsets of one Hit class (looked up again if another class is passed). */
static PyTypeObject *known_type = NULL;
static Py_ssize_t slot_offsets[N_SLOTS];

static int find_slots(PyTypeObject *type) {
    if (type == known_type) {
        return 0;
    }
    for (int i = 0; i < N_SLOTS; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, SLOT_NAMES[i]);
        if (descr == NULL) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s has no slot %s", type->tp_name, SLOT_NAMES[i]);
            return -1;
        }
        int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX &&
                 !(((PyMemberDescrObject *)descr)->d_member->flags & READONLY);
        if (ok) {
            slot_offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        }
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, SLOT_NAMES[i]);
            return -1;
        }
    }
    Py_XSETREF(known_type, (PyTypeObject *)Py_NewRef(type));
    return 0;
}

/* One shard's strings: blobs, offsets (rows + 1 each) and URL flags, as buffers. */
typedef struct {
    int ready;
    int64_t start, rows;
    Py_buffer blob[3], offsets[3], has_url;
    int held; /* buffers acquired, to release */
} source;

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t min_items, source *src) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    src->held++;
    if (view->itemsize != itemsize || view->len / itemsize < min_items) {
        PyErr_SetString(PyExc_ValueError, "a string array of the search cache does not match its shard");
        return -1;
    }
    return 0;
}

static void release(source *src) {
    Py_buffer *views[7] = {&src->blob[0], &src->offsets[0], &src->blob[1], &src->offsets[1],
                           &src->blob[2], &src->offsets[2], &src->has_url};
    for (int i = 0; i < src->held; i++) {
        PyBuffer_Release(views[i]);
    }
    src->held = 0;
}

/* (start, rows, ids_blob, ids_offsets, paths_blob, paths_offsets, urls_blob, urls_offsets, has_url) */
static int open_source(PyObject *item, source *src) {
    PyObject *start, *rows, *arrays[7];
    if (!PyTuple_Check(item)) {
        PyErr_SetString(PyExc_TypeError, "a shard's strings must be a tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(item, "OOOOOOOOO;a shard's strings", &start, &rows, &arrays[0], &arrays[1], &arrays[2],
                          &arrays[3], &arrays[4], &arrays[5], &arrays[6])) {
        return -1;
    }
    src->start = PyLong_AsLongLong(start);
    src->rows = PyLong_AsLongLong(rows);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (src->start < 0 || src->rows < 0) {
        PyErr_SetString(PyExc_ValueError, "a shard of the search cache has a negative start or size");
        return -1;
    }
    for (int f = 0; f < 3; f++) {
        if (get_buffer(arrays[2 * f], &src->blob[f], 1, 0, src) < 0 ||
            get_buffer(arrays[2 * f + 1], &src->offsets[f], 8, src->rows + 1, src) < 0) {
            return -1;
        }
    }
    if (get_buffer(arrays[6], &src->has_url, 1, src->rows, src) < 0) {
        return -1;
    }
    src->ready = 1;
    return 0;
}

/* str of one row's bytes in field f, or NULL with ValueError when its offsets are out of bounds. */
static PyObject *row_string(const source *src, int f, int64_t local) {
    const int64_t *offsets = (const int64_t *)src->offsets[f].buf;
    int64_t lo = offsets[local], hi = offsets[local + 1];
    if (lo < 0 || hi < lo || hi > (int64_t)src->blob[f].len) {
        PyErr_SetString(PyExc_ValueError, "string offsets of the search cache point outside their blob");
        return NULL;
    }
    return PyUnicode_DecodeUTF8((const char *)src->blob[f].buf + lo, (Py_ssize_t)(hi - lo), "surrogatepass");
}

static PyObject *make_hit(PyTypeObject *type, const source *src, int64_t local, double score, PyObject *matched) {
    PyObject *values[N_SLOTS] = {NULL};
    values[SLOT_ID] = row_string(src, 0, local);
    values[SLOT_PATH] = values[SLOT_ID] ? row_string(src, 1, local) : NULL;
    if (values[SLOT_PATH] != NULL) {
        values[SLOT_URL] = ((const uint8_t *)src->has_url.buf)[local] ? row_string(src, 2, local) : Py_NewRef(Py_None);
    }
    values[SLOT_SCORE] = values[SLOT_URL] ? PyFloat_FromDouble(score) : NULL;
    PyObject *hit = values[SLOT_SCORE] ? type->tp_alloc(type, 0) : NULL;
    if (hit == NULL) {
        for (int i = 0; i < N_SLOTS; i++) {
            Py_XDECREF(values[i]);
        }
        return NULL;
    }
    values[SLOT_MATCHED] = Py_NewRef(matched);
    values[SLOT_PARTS] = Py_NewRef(Py_None);
    for (int i = 0; i < N_SLOTS; i++) { /* tp_alloc zeroed the slots; they take these references */
        *(PyObject **)((char *)hit + slot_offsets[i]) = values[i];
    }
    return hit;
}

static PyObject *build(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *type_obj, *rows_obj, *scores_obj, *sources, *matched;
    long long shard_rows;
    Py_ssize_t count = -1; /* the first count rows only (a buffer reused query after query) */
    if (!PyArg_ParseTuple(args, "OOOLO!O|n", &type_obj, &rows_obj, &scores_obj, &shard_rows, &PyTuple_Type, &sources,
                          &matched, &count)) {
        return NULL;
    }
    if (!PyType_Check(type_obj) || find_slots((PyTypeObject *)type_obj) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "the first argument must be the Hit class");
        }
        return NULL;
    }
    if (matched != Py_None && !PyList_Check(matched)) {
        PyErr_SetString(PyExc_TypeError, "matched must be None or a list");
        return NULL;
    }
    if (shard_rows <= 0) {
        PyErr_SetString(PyExc_ValueError, "shard_rows must be positive");
        return NULL;
    }
    Py_buffer rows, scores;
    if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(scores_obj, &scores, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&rows);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n_sources = PyTuple_GET_SIZE(sources);
    source *srcs = PyMem_Calloc(n_sources ? n_sources : 1, sizeof(source));
    Py_ssize_t n = rows.len / 8;
    if (srcs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (rows.itemsize != 8 || scores.itemsize != 8 || scores.len != rows.len || count > n) {
        PyErr_SetString(PyExc_ValueError, "rows (int64), scores (float64) and matched must have one item per hit");
        goto done;
    }
    if (count >= 0) n = count;
    if (matched != Py_None && PyList_GET_SIZE(matched) != n) {
        PyErr_SetString(PyExc_ValueError, "rows (int64), scores (float64) and matched must have one item per hit");
        goto done;
    }
    out = PyList_New(n);
    if (out == NULL) {
        goto done;
    }
    const int64_t *row = (const int64_t *)rows.buf;
    const double *score = (const double *)scores.buf;
    /* Every hit's shard opened and its rows checked first, so that the hits' string offsets, and
     * then the strings they point to, are asked for all at once: read hit by hit, a search's
     * first call after others (its cache lines evicted) waits on each in turn. */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t r = row[i], j = r >= 0 ? r / shard_rows : -1;
        if (j < 0 || j >= n_sources) {
            PyErr_SetString(PyExc_ValueError, "a hit's row is outside the search cache");
            Py_CLEAR(out);
            goto done;
        }
        source *src = &srcs[j];
        if (!src->ready && open_source(PyTuple_GET_ITEM(sources, j), src) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        int64_t local = r - src->start;
        if (local < 0 || local >= src->rows) {
            PyErr_SetString(PyExc_ValueError, "a hit's row is outside its shard");
            Py_CLEAR(out);
            goto done;
        }
        for (int f = 0; f < 3; f++) PREFETCH((const int64_t *)src->offsets[f].buf + local);
        PREFETCH((const uint8_t *)src->has_url.buf + local);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const source *src = &srcs[row[i] / shard_rows];
        int64_t local = row[i] - src->start;
        for (int f = 0; f < 3; f++) {
            int64_t lo = ((const int64_t *)src->offsets[f].buf)[local];
            if (lo >= 0 && lo < (int64_t)src->blob[f].len) PREFETCH((const char *)src->blob[f].buf + lo);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        source *src = &srcs[row[i] / shard_rows];
        int64_t local = row[i] - src->start;
        if (matched != Py_None && i >= PyList_GET_SIZE(matched)) { /* shrunk meanwhile (a finalizer run by GC) */
            PyErr_SetString(PyExc_ValueError, "matched changed while hits were built");
            Py_CLEAR(out);
            goto done;
        }
        PyObject *hit = make_hit((PyTypeObject *)type_obj, src, local, score[i],
                                 matched == Py_None ? Py_None : PyList_GET_ITEM(matched, i));
        if (hit == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, hit);
    }
done:
    if (srcs != NULL) {
        for (Py_ssize_t j = 0; j < n_sources; j++) {
            release(&srcs[j]);
        }
        PyMem_Free(srcs);
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&scores);
    return out;
}

/* explained(out, picked, names, slots, values): out[picked[i]] = [(names[slots[i, j]], values[i, j]) for the
 * leading positive values of row i] (a row's values are largest first, zeros after its last match). */
static PyObject *explained(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *out, *names, *picked_obj, *slots_obj, *values_obj;
    if (!PyArg_ParseTuple(args, "O!OO!OO", &PyList_Type, &out, &picked_obj, &PyTuple_Type, &names, &slots_obj,
                          &values_obj)) {
        return NULL;
    }
    Py_buffer picked, slots, values;
    if (PyObject_GetBuffer(picked_obj, &picked, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(slots_obj, &slots, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) {
        PyBuffer_Release(&picked);
        return NULL;
    }
    if (PyObject_GetBuffer(values_obj, &values, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) {
        PyBuffer_Release(&picked);
        PyBuffer_Release(&slots);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t rows = picked.len / 8, n = slots.ndim == 2 ? slots.shape[1] : -1;
    Py_ssize_t n_names = PyTuple_GET_SIZE(names), n_out = PyList_GET_SIZE(out);
    if (picked.itemsize != 8 || slots.itemsize != 8 || values.itemsize != 4 || slots.ndim != 2 || values.ndim != 2 ||
        slots.shape[0] != rows || values.shape[0] != rows || values.shape[1] != n) {
        PyErr_SetString(PyExc_ValueError, "picked (int64), slots (int64) and values (float32) must have a row per hit");
        goto done;
    }
    const int64_t *at = (const int64_t *)picked.buf, *slot = (const int64_t *)slots.buf;
    const float *value = (const float *)values.buf;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (at[i] < 0 || at[i] >= n_out) {
            PyErr_SetString(PyExc_ValueError, "a hit's position is outside the output list");
            goto done;
        }
        Py_ssize_t count = 0;
        while (count < n && value[i * n + count] > 0) {
            count++;
        }
        PyObject *pairs = PyList_New(count);
        if (pairs == NULL) {
            goto done;
        }
        for (Py_ssize_t j = 0; j < count; j++) {
            int64_t s = slot[i * n + j];
            PyObject *weight = s >= 0 && s < n_names ? PyFloat_FromDouble((double)value[i * n + j]) : NULL;
            PyObject *pair = weight ? PyTuple_Pack(2, PyTuple_GET_ITEM(names, s), weight) : NULL;
            Py_XDECREF(weight);
            if (pair == NULL) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_ValueError, "an explained term is not one of the query's");
                }
                Py_DECREF(pairs);
                goto done;
            }
            PyList_SET_ITEM(pairs, j, pair);
        }
        if (PyList_SetItem(out, at[i], pairs) < 0) {
            goto done;
        }
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&picked);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&values);
    return result;
}

/* merge(candidates, k, out_rows, out_scores): the k best of the shards' lists ((int64 rows, float32
 * scores), each best first with ties by row, the shards in row order) into the int64 / float32
 * outputs, best first with ties by row (kernels.merge_top's result). Returns how many, or -1
 * (nothing meaningful written) when a list is not in that order, holds a NaN, has other types
 * or there are more than MAX_LISTS: the caller then sorts in numpy. */
#define MAX_LISTS 64
static PyObject *merge(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *lists, *out_rows_obj, *out_scores_obj;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "O!nOO", &PyList_Type, &lists, &k, &out_rows_obj, &out_scores_obj)) {
        return NULL;
    }
    Py_ssize_t n_lists = PyList_GET_SIZE(lists);
    if (n_lists > MAX_LISTS) {
        return PyLong_FromLong(-1);
    }
    Py_buffer views[2 * MAX_LISTS], out_rows, out_scores;
    Py_ssize_t held = 0, length[MAX_LISTS], at[MAX_LISTS];
    int outs = 0;
    long result = -1;
    PyObject *error = NULL;
    if (PyObject_GetBuffer(out_rows_obj, &out_rows, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    outs = 1;
    if (PyObject_GetBuffer(out_scores_obj, &out_scores, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        goto done;
    }
    outs = 2;
    if (k < 0 || out_rows.itemsize != 8 || out_scores.itemsize != 4 || out_rows.len / 8 < k || out_scores.len / 4 < k) {
        error = PyExc_ValueError;
        goto done;
    }
    for (Py_ssize_t j = 0; j < n_lists; j++) {
        PyObject *pair = PyList_GET_ITEM(lists, j);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) goto done; /* not (rows, scores): numpy */
        for (int part = 0; part < 2; part++) {
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, part), &views[held], PyBUF_C_CONTIGUOUS) < 0) {
                PyErr_Clear(); /* not contiguous, or no buffer: numpy */
                goto done;
            }
            held++;
        }
        Py_buffer *r = &views[held - 2], *v = &views[held - 1];
        if (r->itemsize != 8 || v->itemsize != 4 || r->len / 8 != v->len / 4) goto done; /* other types: numpy */
        length[j] = r->len / 8;
        at[j] = 0;
        const int64_t *rows = (const int64_t *)r->buf;
        const float *scores = (const float *)v->buf;
        for (Py_ssize_t i = 0; i < length[j]; i++) { /* in order, no NaN: else numpy sorts */
            if (scores[i] != scores[i]) goto done;
            if (i && (scores[i] > scores[i - 1] || (scores[i] == scores[i - 1] && rows[i] <= rows[i - 1]))) goto done;
        }
    }
    int64_t *dst_rows = (int64_t *)out_rows.buf;
    float *dst_scores = (float *)out_scores.buf;
    Py_ssize_t n = 0;
    for (; n < k; n++) {
        Py_ssize_t best = -1;
        float best_score = 0.0f;
        int64_t best_row = 0;
        for (Py_ssize_t j = 0; j < n_lists; j++) {
            if (at[j] == length[j]) continue;
            float s = ((const float *)views[2 * j + 1].buf)[at[j]];
            int64_t r = ((const int64_t *)views[2 * j].buf)[at[j]];
            if (best < 0 || s > best_score || (s == best_score && r < best_row)) {
                best = j;
                best_score = s;
                best_row = r;
            }
        }
        if (best < 0) break;
        dst_rows[n] = best_row;
        dst_scores[n] = best_score;
        at[best]++;
    }
    result = (long)n;
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    if (outs >= 1) PyBuffer_Release(&out_rows);
    if (outs >= 2) PyBuffer_Release(&out_scores);
    if (error != NULL) {
        PyErr_SetString(error, "merge takes a list of (int64 rows, float32 scores) pairs and outputs of k int64 / float32");
    }
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(result);
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS,
     "build(Hit, rows, scores, shard_rows, sources, matched[, count]) -> list of Hit\n\n"
     "rows: int64 global rows; scores: float64, one per row (the first count only, if given); sources: per shard (start, rows, ids_blob,\n"
     "ids_offsets, paths_blob, paths_offsets, urls_blob, urls_offsets, has_url); matched: None or a\n"
     "list with one item per row. ValueError when the arrays do not hold together."},
    {"explained", explained, METH_VARARGS,
     "explained(out, picked, names, slots, values) -> None\n\n"
     "out[picked[i]] = [(names[slots[i, j]], float(values[i, j])) for the leading positive values of row i].\n"
     "ValueError when a position or slot is out of range or the arrays' shapes differ."},
    {"merge", merge, METH_VARARGS,
     "merge(candidates, k, out_rows, out_scores) -> n\n\n"
     "The k best of per-shard (int64 rows, float32 scores) lists (each best first, ties by row) into\n"
     "the outputs, best first with ties by row; -1 when a list is out of that order or holds a NaN."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hits", "Local-index hits built in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hits(void) { return PyModule_Create(&module_def); }
