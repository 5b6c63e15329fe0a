/* A search's words with inflections collapsed, every hit in one call (optional:
 * inflections.MatchWords.__call__ does the same in Python without it, and stays the reference).
 *
 * Every caption query holds two forms of some word, so every hit is explained with all the
 * query's terms (~36) and then collapsed; in Python that took 23-32 us a hit, about 70% of
 * an explained sparse search at k=100 and up. Here each hit's (term, contribution) pairs are
 * read once: a grouped term's contribution is noted by its group (a later duplicate replacing an
 * earlier one, as dict(matched) keeps the last), an ungrouped one is taken in the match's order
 * until n are taken and the next is smaller (ties with the n-th kept), and the entries are sorted
 * as Python sorts (-weight, word, terms) tuples. A group's weight is the sum of its present
 * forms: one form's contribution as it is, two added in double (one rounding: what math.fsum
 * gives for two finite floats whose sum is not zero), otherwise through math.fsum itself. A hit whose
 * pairs are not (str, float) tuples or hold a NaN is left to the Python path (``fallback``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

#include "_untrack.h"

typedef struct {
    double weight;   /* the entry's contribution (a group's: the sum of its forms') */
    PyObject *value; /* the float shown: a pair's own or a group's sum (owned; borrowed while a form) */
    PyObject *word;  /* borrowed */
    PyObject *terms; /* owned tuple, or NULL for (word,) */
} entry;

/* Python's tuple order on (-weight, word, terms): a larger weight first, then the smaller word.
 * Two entries with the same weight and word are equal here (their terms tuples can only differ
 * when a duplicated ungrouped term appears twice with one weight: the same Word either way). */
static int entry_before(const entry *a, const entry *b) {
    if (a->weight != b->weight) return a->weight > b->weight;
    return PyUnicode_Compare(a->word, b->word) < 0;
}

/* An insertion sort: a hit has a few entries, a group a few forms (sorted as entries, by form). */
static void sort_entries(entry *e, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {
        entry x = e[i];
        Py_ssize_t j = i;
        while (j > 0 && entry_before(&x, &e[j - 1])) {
            e[j] = e[j - 1];
            j--;
        }
        e[j] = x;
    }
}

/* One hit's words, Py_None when its pairs are not of the shape handled here (the caller asks
 * the Python path), NULL with an exception set. ``ends[g]``: where group g's forms end in the
 * numbering of group_of (group by group). */
static PyObject *collapse_one(PyObject *matched, Py_ssize_t n, PyObject *group_of, const Py_ssize_t *ends,
                              Py_ssize_t n_groups, PyTypeObject *word_type, PyObject *fsum, Py_ssize_t *noted_at,
                              entry *entries, entry *present, char *grouped) {
    Py_ssize_t size = PyList_GET_SIZE(matched);
    Py_ssize_t n_forms = n_groups ? ends[n_groups - 1] : 0;
    /* pass 1: check every pair; note where each grouped term last appears (dict(matched) keeps the last) */
    for (Py_ssize_t f = 0; f < n_forms; f++) noted_at[f] = -1;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *pair = PyList_GET_ITEM(matched, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) Py_RETURN_NONE;
        PyObject *term = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        if (!PyUnicode_CheckExact(term) || !PyFloat_CheckExact(value) || isnan(PyFloat_AS_DOUBLE(value))) Py_RETURN_NONE;
        grouped[i] = 0;
        if (n_groups) {
            PyObject *slot = PyDict_GetItemWithError(group_of, term);
            if (slot == NULL) {
                if (PyErr_Occurred()) return NULL;
                continue;
            }
            grouped[i] = 1;
            Py_ssize_t f = PyLong_AsSsize_t(slot);
            if (f < 0 || f >= n_forms) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a form's number is out of range");
                return NULL;
            }
            noted_at[f] = i;
        }
    }
    Py_ssize_t count = 0;
    PyObject *out = NULL;
    /* each group present: named by its strongest form here, weighed by the sum of its forms */
    for (Py_ssize_t g = 0, f = 0; g < n_groups; g++) {
        Py_ssize_t m = 0;
        for (; f < ends[g]; f++) {
            if (noted_at[f] < 0) continue;
            PyObject *pair = PyList_GET_ITEM(matched, noted_at[f]);
            present[m].word = PyTuple_GET_ITEM(pair, 0);
            present[m].value = PyTuple_GET_ITEM(pair, 1);
            present[m].weight = PyFloat_AS_DOUBLE(present[m].value);
            m++;
        }
        if (m == 0) continue;
        sort_entries(present, m);
        entry *e = &entries[count];
        e->word = present[0].word;
        e->terms = NULL;
        if (m == 1) {
            e->weight = present[0].weight;
            e->value = present[0].value;
            Py_INCREF(e->value);
        } else {
            double sum = present[0].weight + present[1].weight;
            if (m == 2 && isfinite(sum) && sum != 0.0) { /* a zero's sign is fsum's to give */
                e->value = PyFloat_FromDouble(sum);
            } else {
                PyObject *values = PyList_New(m);
                if (values == NULL) goto fail;
                for (Py_ssize_t j = 0; j < m; j++) {
                    Py_INCREF(present[j].value);
                    PyList_SET_ITEM(values, j, present[j].value);
                }
                e->value = PyObject_CallOneArg(fsum, values);
                Py_DECREF(values);
            }
            if (e->value == NULL) goto fail;
            e->weight = PyFloat_AsDouble(e->value);
            if (e->weight == -1.0 && PyErr_Occurred()) {
                Py_DECREF(e->value);
                goto fail;
            }
            e->terms = PyTuple_New(m);
            if (e->terms == NULL) {
                Py_DECREF(e->value);
                goto fail;
            }
            for (Py_ssize_t j = 0; j < m; j++) {
                Py_INCREF(present[j].word);
                PyTuple_SET_ITEM(e->terms, j, present[j].word);
            }
        }
        count++;
    }
    /* the ungrouped terms in the match's order (largest first) until n are taken and the next is
     * smaller: ties with the n-th are kept, the sort breaks them by word */
    Py_ssize_t taken = 0;
    double last = INFINITY;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *pair = PyList_GET_ITEM(matched, i);
        PyObject *term = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        if (grouped[i]) continue;
        double c = PyFloat_AS_DOUBLE(value);
        if (taken >= n && c < last) break;
        entries[count].weight = c;
        entries[count].value = value;
        Py_INCREF(value);
        entries[count].word = term;
        entries[count].terms = NULL;
        count++;
        taken++;
        last = c;
    }
    sort_entries(entries, count);
    Py_ssize_t shown = count < n ? count : n;
    out = PyList_New(shown);
    if (out == NULL) goto fail;
    for (Py_ssize_t j = 0; j < shown; j++) {
        entry *e = &entries[j];
        PyObject *terms = e->terms ? e->terms : PyTuple_Pack(1, e->word);
        if (terms == NULL) goto fail;
        /* tuple.__new__(Word, ...), as inflections._word makes it: the tuple subtype's own allocation */
        PyObject *word = word_type->tp_alloc(word_type, 3);
        if (word == NULL) {
            if (e->terms == NULL) Py_DECREF(terms);
            goto fail;
        }
        Py_INCREF(e->word);
        PyTuple_SET_ITEM(word, 0, e->word);
        PyTuple_SET_ITEM(word, 1, e->value); /* the entry's reference, handed over */
        PyTuple_SET_ITEM(word, 2, terms);
        untrack_if_atomic(terms);
        untrack_if_atomic(word);
        e->value = NULL;
        e->terms = NULL;
        PyList_SET_ITEM(out, j, word);
    }
    for (Py_ssize_t j = shown; j < count; j++) {
        Py_XDECREF(entries[j].value);
        Py_XDECREF(entries[j].terms);
    }
    return out;
fail:
    for (Py_ssize_t j = 0; j < count; j++) {
        Py_XDECREF(entries[j].value);
        Py_XDECREF(entries[j].terms);
    }
    Py_XDECREF(out);
    return NULL;
}

/* collapse(raws, n, group_of, ends, word_type, fsum, fallback) -> a list of words per raw */
static PyObject *collapse(PyObject *self, PyObject *args) {
    PyObject *raws, *group_of, *ends_obj, *fsum, *fallback;
    PyTypeObject *word_type;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!nO!O!O!OO", &PyList_Type, &raws, &n, &PyDict_Type, &group_of, &PyTuple_Type,
                          &ends_obj, &PyType_Type, &word_type, &fsum, &fallback))
        return NULL;
    if (!PyType_IsSubtype(word_type, &PyTuple_Type) || word_type->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "word_type must be a tuple subclass");
        return NULL;
    }
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "n must be at least 1");
        return NULL;
    }
    Py_ssize_t n_groups = PyTuple_GET_SIZE(ends_obj), n_forms = 0, longest = 0;
    Py_ssize_t *ends = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_groups ? n_groups : 1));
    if (ends == NULL) return PyErr_NoMemory();
    for (Py_ssize_t g = 0; g < n_groups; g++) {
        ends[g] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ends_obj, g));
        if (ends[g] == -1 && PyErr_Occurred()) goto fail_ends;
        if (ends[g] < n_forms || ends[g] > PyDict_GET_SIZE(group_of)) {
            PyErr_SetString(PyExc_ValueError, "the groups' ends must ascend within the forms");
            goto fail_ends;
        }
        n_forms = ends[g];
    }
    Py_ssize_t count = PyList_GET_SIZE(raws);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        if (PyList_CheckExact(raw) && PyList_GET_SIZE(raw) > longest) longest = PyList_GET_SIZE(raw);
    }
    Py_ssize_t *noted_at = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_forms + 1));
    entry *entries = PyMem_Malloc(sizeof(entry) * (size_t)(n_groups + longest + 1));
    entry *present = PyMem_Malloc(sizeof(entry) * (size_t)(n_forms + 1));
    char *grouped = PyMem_Malloc((size_t)longest + 1); /* pass 1's finding, pair by pair */
    PyObject *out = PyList_New(count);
    if (noted_at == NULL || entries == NULL || present == NULL || grouped == NULL || out == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i), *words;
        if (PyList_CheckExact(raw)) {
            words = collapse_one(raw, n, group_of, ends, n_groups, word_type, fsum, noted_at, entries, present, grouped);
            if (words == Py_None) {
                Py_DECREF(words);
                words = PyObject_CallFunction(fallback, "On", raw, n);
            }
        } else {
            words = PyObject_CallFunction(fallback, "On", raw, n);
        }
        if (words == NULL) goto fail;
        PyList_SET_ITEM(out, i, words);
    }
    PyMem_Free(noted_at);
    PyMem_Free(entries);
    PyMem_Free(present);
    PyMem_Free(grouped);
    PyMem_Free(ends);
    return out;
fail:
    PyMem_Free(noted_at);
    PyMem_Free(entries);
    PyMem_Free(present);
    PyMem_Free(grouped);
    Py_XDECREF(out);
fail_ends:
    PyMem_Free(ends);
    return NULL;
}

static PyMethodDef methods[] = {
    {"collapse", collapse, METH_VARARGS,
     "collapse(raws, n, group_of, ends, word_type, fsum, fallback): each raw match's n words, inflections "
     "collapsed (inflections.MatchWords.__call__, hit by hit)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_words", NULL, -1, methods};

PyMODINIT_FUNC PyInit__words(void) { return PyModule_Create(&module); }
