/* Shared by the CPython extensions that make a search's many small tuples (_query.c, _words.c). */
#ifndef D2S_UNTRACK_H
#define D2S_UNTRACK_H

#include <Python.h>

/* Untracks a tuple none of whose items could lead the garbage collector into a cycle (strings,
 * floats, untracked tuples): CPython's own _PyTuple_MaybeUntrack, done when the tuple is made
 * rather than when a collection first meets it: the ~20,000 (word, value) pairs and the Words
 * of a k=1000 search are then no work for its passes (which took 25% of such a search). */
static void untrack_if_atomic(PyObject *tuple) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) return;
    }
    PyObject_GC_UnTrack(tuple);
}

#endif
