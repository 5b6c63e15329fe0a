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
 * the Python path), NULL with an exception set. */
static PyObject *collapse_one(collapser *c, PyObject *matched, Py_ssize_t n, PyObject *group_of) {
    Py_ssize_t size = PyList_GET_SIZE(matched);
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *pair = PyList_GET_ITEM(matched, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) Py_RETURN_NONE;
        PyObject *term = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        if (!PyUnicode_CheckExact(term) || !PyFloat_CheckExact(value) || isnan(PyFloat_AS_DOUBLE(value))) Py_RETURN_NONE;
        match_pair *p = &c->pairs[i];
        p->word = term;
        p->value = value;
        p->alone = NULL;
        p->weight = PyFloat_AS_DOUBLE(value);
        p->form = c->n_groups ? form_of(group_of, term, c->n_forms) : -1;
        if (p->form == -2) return NULL;
    }
    return collapse_pairs(c, size, n);
}

/* collapse(raws, n, group_of, ends, word_type, fsum, fallback) -> a list of words per raw */
static PyObject *collapse(PyObject *self, PyObject *args) {
    PyObject *raws, *group_of, *ends_obj, *fsum, *fallback;
    PyTypeObject *word_type;
    Py_ssize_t n, longest = 0;
    if (!PyArg_ParseTuple(args, "O!nO!O!O!OO", &PyList_Type, &raws, &n, &PyDict_Type, &group_of, &PyTuple_Type,
                          &ends_obj, &PyType_Type, &word_type, &fsum, &fallback))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(raws);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        if (PyList_CheckExact(raw) && PyList_GET_SIZE(raw) > longest) longest = PyList_GET_SIZE(raw);
    }
    collapser c;
    if (!collapser_init(&c, ends_obj, group_of, word_type, fsum, n, longest)) return NULL;
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i), *words;
        if (PyList_CheckExact(raw)) {
            words = collapse_one(&c, raw, n, group_of);
            if (words == Py_None) {
                Py_DECREF(words);
                words = PyObject_CallFunction(fallback, "On", raw, n);
            }
        } else {
            words = PyObject_CallFunction(fallback, "On", raw, n);
        }
        if (words == NULL) Py_CLEAR(out); else PyList_SET_ITEM(out, i, words);
    }
    collapser_free(&c);
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
