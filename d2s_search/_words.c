/* A search's words with inflections collapsed, every hit in one call (optional:
 * inflections.MatchWords.__call__ does the same in Python without it, and stays the reference).
 *
 * Every caption query holds two forms of some word, so every hit is explained with all the
 * query's terms (~36) and then collapsed; in Python that took 23-32 us a hit, about 70% of
 * an explained sparse search at k=100 and up. Here each hit's (term, contribution) pairs are
 * read once and collapsed by _collapse.h. A hit whose pairs are not (str, float) tuples or hold
 * a NaN is left to the Python path (``fallback``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

#include "_collapse.h"

/* One hit's words, Py_None when its pairs are not of the shape handled here (the caller asks
 * the Python path), NULL with an exception set. ``pairs``: room for the hit's pairs. */
static PyObject *collapse_one(PyObject *matched, Py_ssize_t n, PyObject *group_of, const Py_ssize_t *ends,
                              Py_ssize_t n_groups, PyTypeObject *word_type, PyObject *fsum, Py_ssize_t *noted_at,
                              word_entry *entries, word_entry *present, match_pair *pairs) {
    Py_ssize_t size = PyList_GET_SIZE(matched);
    Py_ssize_t n_forms = n_groups ? ends[n_groups - 1] : 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *pair = PyList_GET_ITEM(matched, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) Py_RETURN_NONE;
        PyObject *term = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        if (!PyUnicode_CheckExact(term) || !PyFloat_CheckExact(value) || isnan(PyFloat_AS_DOUBLE(value))) Py_RETURN_NONE;
        pairs[i].word = term;
        pairs[i].value = value;
        pairs[i].alone = NULL;
        pairs[i].weight = PyFloat_AS_DOUBLE(value);
        pairs[i].form = n_groups ? form_of(group_of, term, n_forms) : -1;
        if (pairs[i].form == -2) return NULL;
    }
    return collapse_pairs(pairs, size, n, ends, n_groups, word_type, fsum, noted_at, entries, present);
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
    Py_ssize_t n_groups = 0, longest = 0;
    Py_ssize_t *ends = group_ends(ends_obj, PyDict_GET_SIZE(group_of), &n_groups);
    if (ends == NULL) return NULL;
    Py_ssize_t n_forms = n_groups ? ends[n_groups - 1] : 0;
    Py_ssize_t count = PyList_GET_SIZE(raws);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        if (PyList_CheckExact(raw) && PyList_GET_SIZE(raw) > longest) longest = PyList_GET_SIZE(raw);
    }
    Py_ssize_t *noted_at = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_forms + 1));
    word_entry *entries = PyMem_Malloc(sizeof(word_entry) * (size_t)(n_groups + longest + 1));
    word_entry *present = PyMem_Malloc(sizeof(word_entry) * (size_t)(n_forms + 1));
    match_pair *pairs = PyMem_Malloc(sizeof(match_pair) * (size_t)(longest + 1));
    PyObject *out = PyList_New(count);
    if (noted_at == NULL || entries == NULL || present == NULL || pairs == NULL || out == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        Py_CLEAR(out);
    }
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i), *words;
        if (PyList_CheckExact(raw)) {
            words = collapse_one(raw, n, group_of, ends, n_groups, word_type, fsum, noted_at, entries, present, pairs);
            if (words == Py_None) {
                Py_DECREF(words);
                words = PyObject_CallFunction(fallback, "On", raw, n);
            }
        } else {
            words = PyObject_CallFunction(fallback, "On", raw, n);
        }
        if (words == NULL) Py_CLEAR(out); else PyList_SET_ITEM(out, i, words);
    }
    PyMem_Free(noted_at);
    PyMem_Free(entries);
    PyMem_Free(present);
    PyMem_Free(pairs);
    PyMem_Free(ends);
    return out;
}

static PyMethodDef methods[] = {
    {"collapse", collapse, METH_VARARGS,
     "collapse(raws, n, group_of, ends, word_type, fsum, fallback): each raw match's n words, inflections "
     "collapsed (inflections.MatchWords.__call__, hit by hit)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_words", NULL, -1, methods};

PyMODINIT_FUNC PyInit__words(void) { return PyModule_Create(&module); }
