/* A sparse query's exact top k over every shard of the local index, and its hits' words, in one
 * call from Python (optional: backend._sparse_top and _explain do the same through ctypes and
 * numpy without it).
 *
 * At 123k documents the scoring itself takes about 0.40 ms of a cold k=10 search, but the
 * Python around it (the query's dict lookups and sort, per-shard numpy buffers and slot
 * arrays, two ctypes calls per shard, the merge) took another 0.3 ms cold, most of it the
 * interpreter's own code and data missing the CPU caches.
 * Here the same steps run in one call: the query dict becomes sorted column ids and float32
 * weights exactly as backend._query_columns makes them, then each shard is scored by _score.c's
 * own functions (compiled into this module), its top k kept and the lists merged, ties by row:
 * the rows and scores of kernels.merge_top over kernels.shard_top, bit for bit. With words,
 * each hit's strongest words are read from its own row-wise postings with _score.c's
 * explain_row_slots, as _explain gives them; words() does the same for rows found otherwise
 * (hybrid's fused hits). Told how many words are shown, both collapse each hit's inflections
 * there (_collapse.h) from every term it matched, making Python objects only for what is shown:
 * a caption query's hit matched ~47 terms at 1M, and their pairs cost more than reading the rows.
 *
 * Buffers are passed as addresses with their sizes (as the ctypes calls do); the shards are
 * described by a table of int64 fields made by kernels.ShardTable from arrays the kernel
 * accepted (kernels.check_postings), and every id and pointer read is still checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>

#if defined(__GNUC__)
#define D2S_EXPORT static __attribute__((unused))
#else
#define D2S_EXPORT static
#endif
#include "_score.c"
#include "../../_collapse.h"

#define HEAP_K 20       /* kernels.HEAP_K: above it, d2s_top_large */
#define MAX_SHARDS 4096 /* more: the ctypes path */

/* One shard's fields in the table (int64 each), kernels.ShardTable.FIELDS in this order. */
enum { F_INDPTR, F_N_COLS, F_INDICES, F_DATA, F_NNZ, F_N_ROWS, F_ID_BITS, F_SLOT_OF, F_SLOT_OF_LEN, F_DENSE,
       F_N_DENSE, F_START, F_CSR_INDPTR, F_CSR_INDICES, F_CSR_DATA, F_CSR_NNZ, F_CSR_ID_BITS, N_FIELDS };

typedef struct {
    int64_t col;
    double weight;
    float weight32;
} term;

static int by_column(const void *a, const void *b) {
    const term *x = a, *y = b;
    if (x->col != y->col) return x->col < y->col ? -1 : 1;
    return x->weight < y->weight ? -1 : x->weight > y->weight; /* sorted() on (column, weight) pairs */
}

/* The query's positive known terms into cols / weights, sorted by column: n, or -1 when the
 * query is not a dict of str to float, a column not an int, a weight infinite in float32 or
 * there are more than capacity terms (the Python path then), or -3 with an exception set. */
static Py_ssize_t query_columns(PyObject *query, PyObject *term_ids, int64_t *cols, float *weights,
                                Py_ssize_t capacity) {
    if (!PyDict_CheckExact(query) || !PyDict_CheckExact(term_ids) || PyDict_GET_SIZE(query) > capacity) return -1;
    term small[64];
    term *terms = small;
    if (PyDict_GET_SIZE(query) > 64 && !(terms = PyMem_Malloc(sizeof(term) * (size_t)PyDict_GET_SIZE(query)))) {
        PyErr_NoMemory();
        return -3;
    }
    Py_ssize_t pos = 0, n = 0, result = -1;
    PyObject *key, *value;
    while (PyDict_Next(query, &pos, &key, &value)) {
        /* Anything but str keys and float values could run Python code (__eq__, __gt__) while
         * the query is read: the Python path takes those. */
        if (!PyUnicode_CheckExact(key) || !PyFloat_CheckExact(value)) goto done;
        double w = PyFloat_AS_DOUBLE(value);
        if (!(w > 0)) continue;
        PyObject *col = PyDict_GetItemWithError(term_ids, key);
        if (col == NULL) {
            if (PyErr_Occurred()) {
                result = -3;
                goto done;
            }
            continue;
        }
        if (!PyLong_CheckExact(col)) goto done;
        long long c = PyLong_AsLongLong(col);
        if (c == -1 && PyErr_Occurred()) {
            result = -3;
            goto done;
        }
        terms[n].col = c;
        terms[n].weight = w;
        terms[n].weight32 = (float)w;
        /* infinite in float32: the Python path, whose words (kernels.explain_slots) refuse it */
        if (!(terms[n].weight32 <= FLT_MAX)) goto done;
        n++;
    }
    qsort(terms, (size_t)n, sizeof(term), by_column);
    for (Py_ssize_t i = 0; i < n; i++) {
        cols[i] = terms[i].col;
        weights[i] = terms[i].weight32;
    }
    result = n;
done:
    if (terms != small) PyMem_Free(terms);
    return result;
}

/* The k-th best score of the first n_lists shards' lists (each best first, lengths[j] long), or 0
 * when they hold fewer than k: the largest score s that at least k entries reach. A later shard's
 * row scoring s or less is then not among the k best (a tie goes to the earlier row), so the
 * later shards keep only rows above it. Bisects on the float bits, counting by binary search. */
static float kth_of_lists(const float *tops_scores, const int32_t *lengths, Py_ssize_t n_lists, Py_ssize_t k) {
    int64_t total = 0;
    for (Py_ssize_t j = 0; j < n_lists; j++) total += lengths[j];
    if (total < k) return 0.0f;
    uint32_t lo = 0, hi = 0x7f800000u; /* count(>= bits lo) >= k holds; find the largest such bits */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        float x = bits_float(mid);
        int64_t count = 0;
        for (Py_ssize_t j = 0; j < n_lists && count < k; j++) {
            const float *list = tops_scores + j * k;
            int32_t a = 0, b = lengths[j]; /* entries [0, a) reach x */
            while (a < b) {
                int32_t m = a + (b - a) / 2;
                if (list[m] >= x) a = m + 1; else b = m;
            }
            count += a;
        }
        if (count >= k) lo = mid; else hi = mid - 1;
    }
    return bits_float(lo);
}

/* Every shard's top k, merged: n (<= k) rows (global) and scores best first, ties by row, or -2
 * when a shard's postings point outside it. work: a small k's heap, or a large k's candidates
 * (with maxima; d2s_top_large). Each shard keeps only rows above the k-th best score of the
 * shards before it (kth_of_lists): the same merged list, fewer rows gathered and sorted. Runs
 * without the GIL. */
static int64_t shards_top(const int64_t *table, Py_ssize_t n_shards, const int64_t *cols, const float *weights,
                          Py_ssize_t n_terms, Py_ssize_t k, int64_t *slots, float *scores, Py_ssize_t scores_len,
                          void *work, float *maxima, int32_t *tops_rows, float *tops_scores, int64_t *out_rows,
                          float *out_scores, double *out_scores64, const uint8_t *allow, int64_t allow_len) {
    int32_t lengths[MAX_SHARDS];
    float above = 0.0f;
    for (Py_ssize_t j = 0; j < n_shards; j++) {
        const int64_t *f = table + j * N_FIELDS;
        int64_t n_rows = f[F_N_ROWS], n_cols = f[F_N_COLS];
        if (n_rows > scores_len || n_rows < 0) return -2;
        const int64_t *slot_of = (const int64_t *)(intptr_t)f[F_SLOT_OF];
        if (slot_of) {
            for (Py_ssize_t t = 0; t < n_terms; t++) {
                int64_t c = cols[t];
                slots[t] = c >= 0 && c < n_cols && c < f[F_SLOT_OF_LEN] ? slot_of[c] : -1;
            }
        }
        const int32_t *indptr = (const int32_t *)(intptr_t)f[F_INDPTR];
        const uint16_t *data = (const uint16_t *)(intptr_t)f[F_DATA], *dense = (const uint16_t *)(intptr_t)f[F_DENSE];
        int64_t bad;
        if (f[F_ID_BITS] == 16) {
            bad = d2s_accumulate16(indptr, n_cols, (const uint16_t *)(intptr_t)f[F_INDICES], data, f[F_NNZ], n_rows,
                                   cols, weights, n_terms, slot_of ? slots : NULL, dense, f[F_N_DENSE], scores);
        } else {
            bad = d2s_accumulate(indptr, n_cols, (const int32_t *)(intptr_t)f[F_INDICES], data, f[F_NNZ], n_rows,
                                 cols, weights, n_terms, slot_of ? slots : NULL, dense, f[F_N_DENSE], scores);
        }
        if (bad) return -2;
        if (allow) { /* a filter: rows it leaves out score 0, and the top takes positive scores only */
            int64_t start = f[F_START];
            if (start < 0 || start + n_rows > allow_len) return -2;
            const uint8_t *a = allow + start;
            for (int64_t r = 0; r < n_rows; r++) scores[r] = a[r] ? scores[r] : 0.0f;
        }
        int64_t kk = k < n_rows ? k : n_rows, got;
        if (kk > HEAP_K) {
            got = d2s_top_large_above(scores, n_rows, kk, work, maxima, tops_rows + j * k, tops_scores + j * k, above);
        } else {
            got = d2s_top_positive_above(scores, n_rows, kk, work, tops_rows + j * k, tops_scores + j * k, above);
        }
        for (int64_t i = got; i < k; i++) tops_rows[j * k + i] = -1; /* the end of this shard's list */
        lengths[j] = (int32_t)got;
        if (j + 1 < n_shards && got > 0) above = kth_of_lists(tops_scores, lengths, j + 1, k);
    }
    /* k-way merge of the shards' lists (each best first, ties by row; shards in row order) */
    int32_t at[MAX_SHARDS];
    for (Py_ssize_t j = 0; j < n_shards; j++) at[j] = 0;
    int64_t n = 0;
    for (; n < k; n++) {
        Py_ssize_t best = -1;
        float best_score = 0.0f;
        int64_t best_row = 0;
        for (Py_ssize_t j = 0; j < n_shards; j++) {
            if (at[j] == k || tops_rows[j * k + at[j]] < 0) continue;
            float s = tops_scores[j * k + at[j]];
            int64_t r = table[j * N_FIELDS + F_START] + tops_rows[j * k + at[j]];
            if (best < 0 || s > best_score || (s == best_score && r < best_row)) {
                best = j;
                best_score = s;
                best_row = r;
            }
        }
        if (best < 0) break;
        out_rows[n] = best_row;
        out_scores[n] = best_score;
        out_scores64[n] = best_score;
        at[best]++;
    }
    return n;
}

/* The shard holding a global row: the last whose start is at or below it (starts ascending). */
static Py_ssize_t shard_of(const int64_t *table, Py_ssize_t n_shards, int64_t row) {
    Py_ssize_t lo = 0, hi = n_shards;
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (table[mid * N_FIELDS + F_START] <= row) lo = mid; else hi = mid;
    }
    return lo;
}

/* The words of the n hits: d2s_explain_slots's slots and values for each (m per hit), read from
 * the hits' own postings (CSR) with slot_of (column -> query slot, n_map entries, -1 elsewhere)
 * and member (one bit per column, n_map / 64 + 1 words, 0 elsewhere), both filled here for the
 * query's columns and cleared again before returning. Returns the number of hits whose row or
 * pointers were out of bounds. Runs without the GIL. */
static int64_t explain_hits(const int64_t *table, Py_ssize_t n_shards, const int64_t *rows, int64_t n,
                            const int64_t *cols, const float *weights, Py_ssize_t n_terms, int64_t m,
                            int16_t *slot_of, uint64_t *member, int64_t n_map, int64_t *slots, float *vals) {
    int64_t bad = 0;
    for (Py_ssize_t t = 0; t < n_terms; t++) {
        if (cols[t] >= 0 && cols[t] < n_map) {
            slot_of[cols[t]] = (int16_t)t;
            member[cols[t] >> 6] |= (uint64_t)1 << (cols[t] & 63);
        }
    }
    for (int64_t i = 0; i < n && i < PREFETCH_ROWS; i++) { /* the first hits' pointers */
        const int64_t *g = table + shard_of(table, n_shards, rows[i]) * N_FIELDS;
        int64_t local = rows[i] - g[F_START];
        if (local >= 0 && local < g[F_N_ROWS]) __builtin_prefetch((const int64_t *)(intptr_t)g[F_CSR_INDPTR] + local);
    }
    for (int64_t i = 0; i < n; i++) {
        /* as d2s_explain_slots: a later hit's postings, and a still later one's pointers, asked for ahead */
        if (i + PREFETCH_ROWS < n) {
            const int64_t *g = table + shard_of(table, n_shards, rows[i + PREFETCH_ROWS]) * N_FIELDS;
            prefetch_row((const int64_t *)(intptr_t)g[F_CSR_INDPTR], g[F_N_ROWS], (const void *)(intptr_t)g[F_CSR_INDICES],
                         g[F_CSR_ID_BITS] != 16, (const uint16_t *)(intptr_t)g[F_CSR_DATA], g[F_CSR_NNZ],
                         rows[i + PREFETCH_ROWS] - g[F_START]);
        }
        if (i + 2 * PREFETCH_ROWS < n) {
            const int64_t *g = table + shard_of(table, n_shards, rows[i + 2 * PREFETCH_ROWS]) * N_FIELDS;
            int64_t later = rows[i + 2 * PREFETCH_ROWS] - g[F_START];
            if (later >= 0 && later < g[F_N_ROWS]) __builtin_prefetch((const int64_t *)(intptr_t)g[F_CSR_INDPTR] + later);
        }
        const int64_t *f = table + shard_of(table, n_shards, rows[i]) * N_FIELDS;
        const int64_t *indptr = (const int64_t *)(intptr_t)f[F_CSR_INDPTR];
        const void *ids = (const void *)(intptr_t)f[F_CSR_INDICES];
        const uint16_t *data = (const uint16_t *)(intptr_t)f[F_CSR_DATA];
        if (f[F_CSR_ID_BITS] == 16) { /* each width its own inlined copy of the row's loop */
            bad += explain_row_slots(indptr, f[F_N_ROWS], ids, 0, data, f[F_CSR_NNZ], rows[i] - f[F_START], slot_of,
                                     n_map, weights, n_terms, m, slots + i * m, vals + i * m, member, 0);
        } else {
            bad += explain_row_slots(indptr, f[F_N_ROWS], ids, 1, data, f[F_CSR_NNZ], rows[i] - f[F_START], slot_of,
                                     n_map, weights, n_terms, m, slots + i * m, vals + i * m, member, 0);
        }
    }
    for (Py_ssize_t t = 0; t < n_terms; t++) {
        if (cols[t] >= 0 && cols[t] < n_map) {
            slot_of[cols[t]] = -1;
            member[cols[t] >> 6] = 0; /* every bit set was one of these columns' */
        }
    }
    return bad;
}

/* A (name, value) pair of a hit's words, untracked (a new reference; NULL with an exception set). */
static PyObject *word_pair(PyObject *name, double value) {
    PyObject *number = PyFloat_FromDouble(value), *pair = number ? PyTuple_New(2) : NULL;
    if (pair == NULL) {
        Py_XDECREF(number);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, Py_NewRef(name));
    PyTuple_SET_ITEM(pair, 1, number);
    untrack_if_atomic(pair);
    return pair;
}

/* Each hit's words as _hits.explained makes them: [(terms[column], value)] for its leading
 * positive values ("" for a column past the term list). NULL with an exception set. */
static PyObject *matched_lists(PyObject *terms, const int64_t *cols, const int64_t *slots, const float *vals,
                               int64_t n, int64_t m) {
    PyObject *out = PyList_New((Py_ssize_t)n), *empty = NULL;
    if (out == NULL) return NULL;
    for (int64_t i = 0; i < n; i++) {
        int64_t count = 0;
        while (count < m && vals[i * m + count] > 0) count++;
        PyObject *pairs = PyList_New((Py_ssize_t)count);
        if (pairs == NULL) goto fail;
        PyList_SET_ITEM(out, (Py_ssize_t)i, pairs);
        for (int64_t j = 0; j < count; j++) {
            int64_t col = cols[slots[i * m + j]];
            PyObject *name;
            if (col >= 0 && col < PyList_GET_SIZE(terms)) {
                name = PyList_GET_ITEM(terms, col);
            } else {
                if (empty == NULL && (empty = PyUnicode_FromString("")) == NULL) goto fail;
                name = empty;
            }
            PyObject *pair = word_pair(name, (double)vals[i * m + j]);
            if (pair == NULL) goto fail;
            PyList_SET_ITEM(pairs, (Py_ssize_t)j, pair);
        }
    }
    Py_XDECREF(empty);
    return out;
fail:
    Py_XDECREF(empty);
    Py_DECREF(out);
    return NULL;
}

/* The hits' words as _hits.explained makes them, the first ``shown`` of each, and the same
 * hits' words with inflections collapsed as inflections.MatchWords(query)(matched, shown) gives
 * them from all m: a (matched, words) tuple, made from the slots and values without a Python
 * object for a term not shown. ``spec``: (shown, group_of, ends, word_type, fsum), group_of
 * the query's grouped terms -> form number (group by group), ends where each group's forms end.
 * NULL with an exception set. */
static PyObject *collapsed_lists(PyObject *terms, const int64_t *cols, Py_ssize_t n_terms, const int64_t *slots,
                                 const float *vals, int64_t n, int64_t m, PyObject *spec) {
    Py_ssize_t shown;
    PyObject *group_of, *ends_obj, *fsum;
    PyTypeObject *word_type;
    if (!PyArg_ParseTuple(spec, "nO!O!O!O", &shown, &PyDict_Type, &group_of, &PyTuple_Type, &ends_obj, &PyType_Type,
                          &word_type, &fsum))
        return NULL;
    collapser c;
    if (!collapser_init(&c, ends_obj, group_of, word_type, fsum, shown, (Py_ssize_t)m)) return NULL;
    PyObject *empty = PyUnicode_FromString(""), *matched = PyList_New((Py_ssize_t)n), *words = PyList_New((Py_ssize_t)n);
    PyObject **names = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n_terms + 1)); /* borrowed, by query slot */
    PyObject **alones = PyMem_Calloc((size_t)(n_terms + 1), sizeof(PyObject *)); /* (name,), one a slot */
    Py_ssize_t *forms = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_terms + 1));
    PyObject *out = NULL;
    int gc_was_on = 0;
    if (empty == NULL || matched == NULL || words == NULL || names == NULL || alones == NULL || forms == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    /* each query slot's word ("" for a column past the term list), its form and the (word,) every
     * hit shows it with, once (a tuple is immutable: one serves every Word of that word) */
    for (Py_ssize_t t = 0; t < n_terms; t++) {
        names[t] = cols[t] >= 0 && cols[t] < PyList_GET_SIZE(terms) ? PyList_GET_ITEM(terms, cols[t]) : empty;
        forms[t] = c.n_groups ? form_of(group_of, names[t], c.n_forms) : -1;
        if (forms[t] == -2 || (alones[t] = PyTuple_Pack(1, names[t])) == NULL) goto done;
        untrack_if_atomic(alones[t]);
    }
    /* Nothing made below can hold a cycle (strings, floats, tuples of them, lists of those): the
     * collector is paused while ~17 objects a hit are made, then runs at most once, not every 700. */
    gc_was_on = PyGC_Disable();
    for (int64_t i = 0; i < n; i++) {
        int64_t count = 0;
        while (count < m && vals[i * m + count] > 0) count++;
        match_pair *pairs = c.pairs;
        for (int64_t j = 0; j < count; j++) {
            int64_t slot = slots[i * m + j];
            if (slot < 0 || slot >= n_terms) {
                PyErr_SetString(PyExc_ValueError, "a word's query slot is out of range");
                goto done;
            }
            pairs[j].word = names[slot];
            pairs[j].alone = alones[slot];
            pairs[j].value = NULL;
            pairs[j].weight = (double)vals[i * m + j];
            pairs[j].form = forms[slot];
        }
        int64_t raw = count < shown ? count : shown;
        PyObject *list = PyList_New((Py_ssize_t)raw);
        if (list == NULL) goto done;
        PyList_SET_ITEM(matched, (Py_ssize_t)i, list);
        for (int64_t j = 0; j < raw; j++) {
            PyObject *pair = word_pair(pairs[j].word, pairs[j].weight);
            if (pair == NULL) goto done;
            PyList_SET_ITEM(list, (Py_ssize_t)j, pair);
            pairs[j].value = PyTuple_GET_ITEM(pair, 1); /* borrowed from the pair: a shown word reuses it */
        }
        PyObject *hit_words = collapse_pairs(&c, (Py_ssize_t)count, shown);
        if (hit_words == NULL) goto done;
        PyList_SET_ITEM(words, (Py_ssize_t)i, hit_words);
    }
    out = PyTuple_Pack(2, matched, words);
done:
    if (gc_was_on) PyGC_Enable();
    for (Py_ssize_t t = 0; alones != NULL && t < n_terms; t++) Py_XDECREF(alones[t]);
    PyMem_Free(alones);
    Py_XDECREF(empty);
    Py_XDECREF(matched);
    Py_XDECREF(words);
    PyMem_Free(names);
    PyMem_Free(forms);
    collapser_free(&c);
    return out;
}

/* n empty lists: the words of hits when the query has no known term. */
static PyObject *empty_lists(int64_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; out != NULL && i < n; i++) {
        PyObject *none = PyList_New(0);
        if (none == NULL) Py_CLEAR(out); else PyList_SET_ITEM(out, (Py_ssize_t)i, none);
    }
    return out;
}

/* The words of n hits, m read a hit: their matched lists (collapse Py_None), or with collapse
 * (collapsed_lists's spec) a (matched, words) tuple. m 0 (no query term): every list empty. */
static PyObject *hits_words(PyObject *terms, const int64_t *cols, Py_ssize_t n_terms, const int64_t *slots,
                            const float *vals, int64_t n, int64_t m, PyObject *collapse) {
    if (collapse != Py_None && m > 0) return collapsed_lists(terms, cols, n_terms, slots, vals, n, m, collapse);
    if (m > 0) return matched_lists(terms, cols, slots, vals, n, m);
    PyObject *matched = empty_lists(n); /* no query term: nothing matched */
    if (collapse == Py_None || matched == NULL) return matched;
    PyObject *words = empty_lists(n);
    PyObject *both = words ? PyTuple_Pack(2, matched, words) : NULL;
    Py_DECREF(matched);
    Py_XDECREF(words);
    return both;
}

/* search(query, term_ids, table_addr, n_shards, k, capacity, k_capacity, cols_addr, weights_addr,
 *        slots_addr, scores_addr, scores_len, work_addr, maxima_addr, tops_rows_addr,
 *        tops_scores_addr, out_rows_addr, out_scores_addr, out_scores64_addr,
 *        m, m_capacity, terms, slot_of_addr, member_addr, n_map, words_slots_addr, words_values_addr,
 *        allow_addr, allow_len, collapse)
 * -> (n_terms, n, matched)
 * allow_addr (0: none): one byte per global row, allow_len of them; a 0 leaves the row out (a
 * search filter: its score is taken as 0, so the top k are the best k rows that pass).
 * The query's columns and weights (n_terms, capacity at most) and its top k: n rows (global,
 * int64) and scores (float32, and float64 for the hit builder), best first, ties by row; with
 * m > 0 each hit's m strongest words, matched = [[(word, value), ...] per hit] as
 * backend._explain gives them (terms: the index's words by column), else None; with collapse
 * (not None: collapsed_lists's spec) matched is (the first ``shown`` of those, collapsed words).
 * n_terms -1: not for this call (the query is not a dict of str to float, too many terms,
 * k above k_capacity or m above m_capacity, too many shards): the Python path then. n -2: a
 * shard's postings or a hit's row point outside it (damage). Buffers: slots capacity int64;
 * scores scores_len floats (at least every shard's rows); work 2 * HEAP_K int32 (a heap) when
 * k_capacity <= HEAP_K, else 4 * scores_len int32 (d2s_top_large's candidates) and maxima
 * scores_len / 4 + 1 floats; tops_rows / tops_scores n_shards * k; out_* k_capacity;
 * slot_of n_map int16, all -1, and member n_map / 64 + 1 uint64, all 0 (both left so), n_map
 * above every shard's columns; words_* k_capacity * m_capacity. */
static PyObject *search(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 30) {
        PyErr_SetString(PyExc_TypeError, "search() takes 30 arguments");
        return NULL;
    }
    PyObject *query = args[0], *term_ids = args[1], *terms = args[21];
    void *p[12];
    const int64_t *table = PyLong_AsVoidPtr(args[2]);
    Py_ssize_t n_shards = PyLong_AsSsize_t(args[3]), k = PyLong_AsSsize_t(args[4]);
    Py_ssize_t capacity = PyLong_AsSsize_t(args[5]), k_capacity = PyLong_AsSsize_t(args[6]);
    Py_ssize_t scores_len = PyLong_AsSsize_t(args[11]);
    for (int i = 0; i < 12; i++) p[i] = i == 4 ? NULL : PyLong_AsVoidPtr(args[7 + i]);
    Py_ssize_t m = PyLong_AsSsize_t(args[19]), m_capacity = PyLong_AsSsize_t(args[20]);
    int16_t *slot_of = PyLong_AsVoidPtr(args[22]);
    uint64_t *member = PyLong_AsVoidPtr(args[23]);
    Py_ssize_t n_map = PyLong_AsSsize_t(args[24]);
    int64_t *word_slots = PyLong_AsVoidPtr(args[25]);
    float *word_values = PyLong_AsVoidPtr(args[26]);
    const uint8_t *allow = PyLong_AsVoidPtr(args[27]);
    int64_t allow_len = PyLong_AsLongLong(args[28]);
    PyObject *collapse = args[29];
    if (PyErr_Occurred()) return NULL;
    if (k > k_capacity || (k > HEAP_K && (k_capacity <= HEAP_K || p[6] == NULL)) || n_shards > MAX_SHARDS ||
        n_shards < 0 || capacity < 0 || m < 0 || m > m_capacity || capacity > INT16_MAX ||
        (m > 0 && (!PyList_CheckExact(terms) || slot_of == NULL || member == NULL || word_slots == NULL ||
                   word_values == NULL))) {
        return Py_BuildValue("(iiO)", -1, 0, Py_None);
    }
    Py_ssize_t n_terms = query_columns(query, term_ids, p[0], p[1], capacity);
    if (n_terms == -3) return NULL;
    if (n_terms < 0) return Py_BuildValue("(iiO)", -1, 0, Py_None);
    int64_t n = 0, bad = 0;
    if (k > 0 && n_terms > 0) {
        Py_BEGIN_ALLOW_THREADS
        n = shards_top(table, n_shards, p[0], p[1], n_terms, k, p[2], p[3], scores_len, p[5], p[6], p[7], p[8], p[9],
                       p[10], p[11], allow, allow_len);
        if (n > 0 && m > 0) {
            bad = explain_hits(table, n_shards, p[9], n, p[0], p[1], n_terms, m < n_terms ? m : n_terms, slot_of,
                               member, n_map, word_slots, word_values);
        }
        Py_END_ALLOW_THREADS
    }
    if (n == -2 || bad) return Py_BuildValue("(niO)", n_terms, -2, Py_None);
    if (m == 0) return Py_BuildValue("(nLO)", n_terms, (long long)n, Py_None);
    PyObject *matched = hits_words(terms, p[0], n_terms, word_slots, word_values, n, m < n_terms ? m : n_terms, collapse);
    if (matched == NULL) return NULL;
    return Py_BuildValue("(nLN)", n_terms, (long long)n, matched);
}

/* words(table_addr, n_shards, rows_addr, n, cols_addr, weights_addr, n_terms, m, terms, slot_of_addr,
 *       member_addr, n_map, words_slots_addr, words_values_addr, words_capacity, collapse) -> matched
 * The m strongest words of n given rows (global, int64), for a query's n_terms sorted columns
 * and weights (a search's, left in its buffers): as search() gives them for its hits, for rows
 * found otherwise (hybrid's fused hits). None when the buffers (words_capacity entries) are too
 * small or m <= 0; -2 when a row or its pointers are out of bounds. */
static PyObject *words(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "words() takes 16 arguments");
        return NULL;
    }
    const int64_t *table = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t n_shards = PyLong_AsSsize_t(args[1]);
    const int64_t *rows = PyLong_AsVoidPtr(args[2]);
    Py_ssize_t n = PyLong_AsSsize_t(args[3]);
    const int64_t *cols = PyLong_AsVoidPtr(args[4]);
    const float *weights = PyLong_AsVoidPtr(args[5]);
    Py_ssize_t n_terms = PyLong_AsSsize_t(args[6]), m = PyLong_AsSsize_t(args[7]);
    PyObject *terms = args[8];
    int16_t *slot_of = PyLong_AsVoidPtr(args[9]);
    uint64_t *member = PyLong_AsVoidPtr(args[10]);
    Py_ssize_t n_map = PyLong_AsSsize_t(args[11]);
    int64_t *word_slots = PyLong_AsVoidPtr(args[12]);
    float *word_values = PyLong_AsVoidPtr(args[13]);
    Py_ssize_t capacity = PyLong_AsSsize_t(args[14]);
    PyObject *collapse = args[15];
    if (PyErr_Occurred()) return NULL;
    int64_t kept = m < n_terms ? m : n_terms;
    if (m <= 0 || n < 0 || n_terms < 0 || n_terms > INT16_MAX || n_shards <= 0 || n_shards > MAX_SHARDS ||
        !PyList_CheckExact(terms) || slot_of == NULL || member == NULL || (kept > 0 && n > capacity / kept)) {
        Py_RETURN_NONE;
    }
    int64_t bad = 0;
    if (kept > 0 && n > 0) {
        Py_BEGIN_ALLOW_THREADS
        bad = explain_hits(table, n_shards, rows, n, cols, weights, n_terms, kept, slot_of, member, n_map, word_slots,
                           word_values);
        Py_END_ALLOW_THREADS
    }
    if (bad) return PyLong_FromLong(-2);
    return hits_words(terms, cols, n_terms, word_slots, word_values, n, kept, collapse);
}

static PyMethodDef methods[] = {
    {"search", (PyCFunction)(void (*)(void))search, METH_FASTCALL,
     "search(query, term_ids, table_addr, n_shards, k, capacity, k_capacity, cols_addr, weights_addr, slots_addr,\n"
     "       scores_addr, scores_len, work_addr, maxima_addr, tops_rows_addr, tops_scores_addr, out_rows_addr,\n"
     "       out_scores_addr, out_scores64_addr, m, m_capacity, terms, slot_of_addr, member_addr, n_map,\n"
     "       words_slots_addr, words_values_addr, allow_addr, allow_len, collapse) -> (n_terms, n, matched)\n\n"
     "A sparse query's columns, exact top k over every shard (allow_addr: one byte per global row, 0 leaves the row\n"
     "out; 0 for none) and (m > 0) each hit's words; n_terms -1: not for this call,\n"
     "n -2: postings out of bounds."},
    {"words", (PyCFunction)(void (*)(void))words, METH_FASTCALL,
     "words(table_addr, n_shards, rows_addr, n, cols_addr, weights_addr, n_terms, m, terms, slot_of_addr,\n"
     "      member_addr, n_map, words_slots_addr, words_values_addr, words_capacity, collapse) -> matched\n\n"
     "The m strongest words of given rows, as search() gives them for its hits; None: buffers too small, -2: damage."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_query", "A local-index sparse query's top k in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__query(void) { return PyModule_Create(&module_def); }
