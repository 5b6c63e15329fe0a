/* One hit's words with inflections collapsed: inflections.MatchWords.__call__ in C, shared by
 * _words.c (pairs read from Python lists) and _query.c (pairs read straight from a row's
 * postings, no Python object made for a term that is not shown).
 *
 * A hit's (term, contribution) pairs come largest first. A grouped term's contribution is noted
 * by its form (a later duplicate replacing an earlier one, as dict(matched) keeps the last); an
 * ungrouped one is taken in the pairs' order until n are taken and the next is smaller (ties
 * with the n-th kept), and the entries are sorted as Python sorts (-weight, word, terms)
 * tuples. A group's weight is the sum of its present forms: one form's contribution as it is,
 * two added in double (one rounding: what math.fsum gives for two finite floats whose sum is
 * not zero), otherwise through math.fsum itself.
 */
#ifndef D2S_COLLAPSE_H
#define D2S_COLLAPSE_H

#include <Python.h>
#include <math.h>
#include <string.h>

#include "_untrack.h"

typedef struct {
    PyObject *word;   /* borrowed */
    PyObject *value;  /* a borrowed float, or NULL: made from weight if shown */
    PyObject *alone;  /* a borrowed (word,) tuple to show, or NULL: made if shown */
    double weight;
    Py_ssize_t form;  /* the term's form number (group by group), -1 for a term of no group */
} match_pair;

typedef struct {
    double weight;   /* the entry's contribution (a group's: the sum of its forms') */
    PyObject *value; /* owned (a form's: borrowed), or NULL: made from weight if shown */
    PyObject *word;  /* borrowed */
    PyObject *terms; /* owned tuple, or NULL for (word,) */
    PyObject *alone; /* a borrowed (word,) tuple, or NULL */
} word_entry;

/* Python's tuple order on (-weight, word, terms): a larger weight first, then the smaller word.
 * Two entries with the same weight and word are equal here (their terms tuples can only differ
 * when a duplicated ungrouped term appears twice with one weight: the same Word either way). */
static int entry_before(const word_entry *a, const word_entry *b) {
    if (a->weight != b->weight) return a->weight > b->weight;
    return PyUnicode_Compare(a->word, b->word) < 0;
}

/* An insertion sort: a hit has a few entries, a group a few forms (sorted as entries, by form). */
static void sort_entries(word_entry *e, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {
        word_entry x = e[i];
        Py_ssize_t j = i;
        while (j > 0 && entry_before(&x, &e[j - 1])) {
            e[j] = e[j - 1];
            j--;
        }
        e[j] = x;
    }
}

static PyObject *value_of(const word_entry *e) {
    return e->value ? Py_NewRef(e->value) : PyFloat_FromDouble(e->weight);
}

/* What collapses one query's hits: its groups (``ends[g]``: where group g's forms end in the
 * numbering of its grouped terms), the Word type, math.fsum, and the scratch of one hit. */
typedef struct {
    Py_ssize_t *ends, n_groups, n_forms;
    PyTypeObject *word_type;
    PyObject *fsum;
    Py_ssize_t *noted_at;  /* n_forms + 1 */
    word_entry *entries;   /* n_groups + the most pairs a hit has + 1 */
    word_entry *present;   /* n_forms + 1 */
    match_pair *pairs;     /* the most pairs a hit has + 1: filled by the caller */
} collapser;

static void collapser_free(collapser *c) {
    PyMem_Free(c->ends);
    PyMem_Free(c->noted_at);
    PyMem_Free(c->entries);
    PyMem_Free(c->present);
    PyMem_Free(c->pairs);
    memset(c, 0, sizeof(*c));
}

/* A collapser for n words a hit (at least 1) and up to ``longest`` pairs a hit; ends_obj a tuple
 * of ascending ints, the last at most the number of grouped forms (group_of's size), word_type a
 * tuple subclass. 0 with an exception set (and nothing to free) when they are not. */
static int collapser_init(collapser *c, PyObject *ends_obj, PyObject *group_of, PyTypeObject *word_type,
                          PyObject *fsum, Py_ssize_t n, Py_ssize_t longest) {
    memset(c, 0, sizeof(*c));
    if (!PyType_IsSubtype(word_type, &PyTuple_Type) || word_type->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "word_type must be a tuple subclass");
        return 0;
    }
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "n must be at least 1");
        return 0;
    }
    c->word_type = word_type;
    c->fsum = fsum;
    c->n_groups = PyTuple_GET_SIZE(ends_obj);
    c->ends = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(c->n_groups ? c->n_groups : 1));
    if (c->ends == NULL) goto no_memory;
    for (Py_ssize_t g = 0; g < c->n_groups; g++) {
        c->ends[g] = PyLong_AsSsize_t(PyTuple_GET_ITEM(ends_obj, g));
        if (c->ends[g] == -1 && PyErr_Occurred()) goto fail;
        if (c->ends[g] < c->n_forms || c->ends[g] > PyDict_GET_SIZE(group_of)) {
            PyErr_SetString(PyExc_ValueError, "the groups' ends must ascend within the forms");
            goto fail;
        }
        c->n_forms = c->ends[g];
    }
    c->noted_at = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(c->n_forms + 1));
    c->entries = PyMem_Malloc(sizeof(word_entry) * (size_t)(c->n_groups + longest + 1));
    c->present = PyMem_Malloc(sizeof(word_entry) * (size_t)(c->n_forms + 1));
    c->pairs = PyMem_Malloc(sizeof(match_pair) * (size_t)(longest + 1));
    if (c->noted_at == NULL || c->entries == NULL || c->present == NULL || c->pairs == NULL) goto no_memory;
    return 1;
no_memory:
    PyErr_NoMemory();
fail:
    collapser_free(c);
    return 0;
}

/* The number of a grouped term's form (0 <= it < n_forms), -1 for a term of no group, -2 with an
 * exception set (group_of's value for it not a form number). */
static Py_ssize_t form_of(PyObject *group_of, PyObject *term, Py_ssize_t n_forms) {
    PyObject *slot = PyDict_GetItemWithError(group_of, term);
    if (slot == NULL) return PyErr_Occurred() ? -2 : -1;
    Py_ssize_t f = PyLong_AsSsize_t(slot);
    if (f < 0 || f >= n_forms) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a form's number is out of range");
        return -2;
    }
    return f;
}

/* One hit's n words (a list of word_type tuples) from the ``size`` pairs the caller put in
 * c->pairs, NULL with an exception set. */
static PyObject *collapse_pairs(collapser *c, Py_ssize_t size, Py_ssize_t n) {
    const match_pair *pairs = c->pairs;
    const Py_ssize_t *ends = c->ends, n_groups = c->n_groups;
    Py_ssize_t *noted_at = c->noted_at;
    word_entry *entries = c->entries, *present = c->present;
    PyTypeObject *word_type = c->word_type;
    PyObject *fsum = c->fsum;
    for (Py_ssize_t f = 0; f < c->n_forms; f++) noted_at[f] = -1;
    for (Py_ssize_t i = 0; i < size; i++) {
        if (pairs[i].form >= 0) noted_at[pairs[i].form] = i;
    }
    Py_ssize_t count = 0;
    PyObject *out = NULL;
    /* each group present: named by its strongest form here, weighed by the sum of its forms */
    for (Py_ssize_t g = 0, f = 0; g < n_groups; g++) {
        Py_ssize_t m = 0;
        for (; f < ends[g]; f++) {
            if (noted_at[f] < 0) continue;
            const match_pair *pair = &pairs[noted_at[f]];
            present[m].word = pair->word;
            present[m].value = pair->value;
            present[m].weight = pair->weight;
            present[m].alone = pair->alone;
            m++;
        }
        if (m == 0) continue;
        sort_entries(present, m);
        word_entry *e = &entries[count];
        e->word = present[0].word;
        e->terms = NULL;
        e->alone = present[0].alone;
        e->value = NULL;
        if (m == 1) {
            e->weight = present[0].weight;
            e->value = Py_XNewRef(present[0].value);
        } else {
            double sum = present[0].weight + present[1].weight;
            if (m == 2 && isfinite(sum) && sum != 0.0) { /* a zero's sign is fsum's to give */
                e->weight = sum;
            } else {
                PyObject *values = PyList_New(m);
                if (values == NULL) goto fail;
                for (Py_ssize_t j = 0; j < m; j++) {
                    PyObject *v = value_of(&present[j]);
                    if (v == NULL) {
                        Py_DECREF(values);
                        goto fail;
                    }
                    PyList_SET_ITEM(values, j, v);
                }
                e->value = PyObject_CallOneArg(fsum, values);
                Py_DECREF(values);
                if (e->value == NULL) goto fail;
                e->weight = PyFloat_AsDouble(e->value);
                if (e->weight == -1.0 && PyErr_Occurred()) {
                    Py_CLEAR(e->value);
                    goto fail;
                }
            }
            e->terms = PyTuple_New(m);
            if (e->terms == NULL) {
                Py_CLEAR(e->value);
                goto fail;
            }
            for (Py_ssize_t j = 0; j < m; j++) PyTuple_SET_ITEM(e->terms, j, Py_NewRef(present[j].word));
        }
        count++;
    }
    /* the ungrouped terms in the pairs' order (largest first) until n are taken and the next is
     * smaller: ties with the n-th are kept, the sort breaks them by word */
    Py_ssize_t taken = 0;
    double last = INFINITY;
    for (Py_ssize_t i = 0; i < size; i++) {
        if (pairs[i].form >= 0) continue;
        double c = pairs[i].weight;
        if (taken >= n && c < last) break;
        entries[count].weight = c;
        entries[count].value = Py_XNewRef(pairs[i].value);
        entries[count].word = pairs[i].word;
        entries[count].terms = NULL;
        entries[count].alone = pairs[i].alone;
        count++;
        taken++;
        last = c;
    }
    sort_entries(entries, count);
    Py_ssize_t shown = count < n ? count : n;
    out = PyList_New(shown);
    if (out == NULL) goto fail;
    for (Py_ssize_t j = 0; j < shown; j++) {
        word_entry *e = &entries[j];
        PyObject *value = e->value ? e->value : PyFloat_FromDouble(e->weight);
        if (value == NULL) goto fail;
        e->value = value;
        PyObject *terms = e->terms ? e->terms : e->alone ? Py_NewRef(e->alone) : PyTuple_Pack(1, e->word);
        if (terms == NULL) goto fail;
        /* tuple.__new__(Word, ...), as inflections._word makes it: the tuple subtype's own allocation */
        PyObject *word = word_type->tp_alloc(word_type, 3);
        if (word == NULL) {
            if (e->terms == NULL) Py_DECREF(terms); /* a made or shared one; an owned one is freed below */
            goto fail;
        }
        PyTuple_SET_ITEM(word, 0, Py_NewRef(e->word));
        PyTuple_SET_ITEM(word, 1, value); /* the entry's references, handed over */
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

#endif
