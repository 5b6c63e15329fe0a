/* A dense query's candidates from an HNSW graph as faiss serialises an IndexHNSWSQ (8-bit
 * codes, inner product), walked in place in the cache's bytes (optional: graph.py hands the
 * graph to faiss without it).
 *
 * Importing faiss costs a process about 35 ms, most of a first dense search; the walk itself
 * is a few hundred lines. The search is HNSW's (Malkov & Yashunin, algorithms 2 and 5, as
 * hnswlib's searchBaseLayerST does it, with a filter): a greedy descent through the upper
 * layers from the entry point, then a best-first search of the bottom layer keeping the
 * ``ef`` best codes; with a bitmap of allowed rows, every row is walked but only allowed rows
 * are kept, and the search goes on until ``ef`` of them are held.
 *
 * A code's score is its inner product with the query as faiss decodes it (dimension j:
 * vmin[j] + (code + 0.5) / 255 * vdiff[j]); the constant part is left out, which changes no
 * order. The caller rescores the candidates with the float vectors.
 *
 * scan() scores every row's code instead, in order (a hybrid's pool of thousands: reading all
 * the codes, a quarter of the float vectors' bytes, costs less than walking to that many), with
 * the per-code weights as 16-bit integers: memory-bound at the 8-bit codes' bandwidth.
 *
 * The layout's offsets come from graph.layout and the graph from graph.check (neighbour ids
 * inside the rows, lists matching the levels); every read is still bounds-checked here, so a
 * graph changed under the process can cost recall but never a read outside its bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)(address))
#endif

typedef struct {
    const uint8_t *bytes;
    int64_t size;
    int64_t cum_at, n_cum, levels_at, offsets_at, neighbors_at, n_neighbors;
    int64_t entry, max_level, ranges_at, codes_at, rows, dim;
} graph_t;

typedef struct {
    float score;
    int32_t row;
} item;

/* Binary heaps of items: `best_first` pops the highest score, `worst_first` the lowest. */
typedef struct {
    item *items;
    int64_t size, capacity;
} heap;

static int heap_push(heap *h, item it, int best_first) {
    if (h->size == h->capacity) {
        int64_t capacity = h->capacity ? 2 * h->capacity : 256;
        item *grown = realloc(h->items, (size_t)capacity * sizeof(item));
        if (grown == NULL) {
            return -1;
        }
        h->items = grown;
        h->capacity = capacity;
    }
    int64_t i = h->size++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        int above = best_first ? h->items[parent].score >= it.score : h->items[parent].score <= it.score;
        if (above) {
            break;
        }
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = it;
    return 0;
}

static item heap_pop(heap *h, int best_first) {
    item top = h->items[0];
    item last = h->items[--h->size];
    int64_t i = 0, n = h->size;
    for (;;) {
        int64_t child = 2 * i + 1;
        if (child >= n) {
            break;
        }
        if (child + 1 < n && (best_first ? h->items[child + 1].score > h->items[child].score
                                         : h->items[child + 1].score < h->items[child].score)) {
            child++;
        }
        int stays = best_first ? last.score >= h->items[child].score : last.score <= h->items[child].score;
        if (stays) {
            break;
        }
        h->items[i] = h->items[child];
        i = child;
    }
    if (n > 0) {
        h->items[i] = last;
    }
    return top;
}

static inline int64_t read_i64(const uint8_t *at) {
    int64_t v;
    memcpy(&v, at, sizeof v);
    return v;
}

static inline int32_t read_i32(const uint8_t *at) {
    int32_t v;
    memcpy(&v, at, sizeof v);
    return v;
}

#if defined(__SSE2__)
#include <emmintrin.h>

/* 16 codes a step: widened to 32-bit integers, converted, multiplied by their weights into
 * four sums of 4 lanes (SSE2: every x86-64 CPU). */
static inline float code_score(const graph_t *g, const float *weights, int64_t row) {
    const uint8_t *code = g->bytes + g->codes_at + row * g->dim;
    const __m128i zero = _mm_setzero_si128();
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps(), s2 = _mm_setzero_ps(), s3 = _mm_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= g->dim; j += 16) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(code + j));
        __m128i low = _mm_unpacklo_epi8(bytes, zero), high = _mm_unpackhi_epi8(bytes, zero);
        s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_loadu_ps(weights + j), _mm_cvtepi32_ps(_mm_unpacklo_epi16(low, zero))));
        s1 = _mm_add_ps(s1, _mm_mul_ps(_mm_loadu_ps(weights + j + 4), _mm_cvtepi32_ps(_mm_unpackhi_epi16(low, zero))));
        s2 = _mm_add_ps(s2, _mm_mul_ps(_mm_loadu_ps(weights + j + 8), _mm_cvtepi32_ps(_mm_unpacklo_epi16(high, zero))));
        s3 = _mm_add_ps(s3, _mm_mul_ps(_mm_loadu_ps(weights + j + 12), _mm_cvtepi32_ps(_mm_unpackhi_epi16(high, zero))));
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
    float sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; j < g->dim; j++) {
        sum += weights[j] * (float)code[j];
    }
    return sum;
}
#else
static inline float code_score(const graph_t *g, const float *weights, int64_t row) {
    const uint8_t *code = g->bytes + g->codes_at + row * g->dim;
    float sum = 0.0f;
    for (int64_t j = 0; j < g->dim; j++) {
        sum += weights[j] * (float)code[j];
    }
    return sum;
}
#endif

/* [begin, end) of a node's neighbour slots on a level, or -1 when they fall outside the graph. */
static int neighbour_slots(const graph_t *g, int64_t row, int64_t level, int64_t *begin, int64_t *end) {
    if (row < 0 || row >= g->rows || level < 0 || level + 1 >= g->n_cum) {
        return -1;
    }
    int64_t offset = read_i64(g->bytes + g->offsets_at + 8 * row);
    int64_t low = read_i32(g->bytes + g->cum_at + 4 * level);
    int64_t high = read_i32(g->bytes + g->cum_at + 4 * (level + 1));
    if (offset < 0 || low < 0 || high < low || offset > g->n_neighbors - high) {
        return -1;
    }
    *begin = offset + low;
    *end = offset + high;
    return 0;
}

static inline int32_t neighbour(const graph_t *g, int64_t slot) {
    return read_i32(g->bytes + g->neighbors_at + 4 * slot);
}

#define ALLOWED(bits, row) ((bits) == NULL || (((bits)[(row) >> 3] >> ((row) & 7)) & 1))
#define SEEN(seen, row) (((seen)[(row) >> 3] >> ((row) & 7)) & 1)
#define MARK(seen, row) ((seen)[(row) >> 3] |= (uint8_t)(1u << ((row) & 7)))

/* The walk; fills `out` with up to `ef` rows and returns how many, -1 out of memory, -2 a
 * graph that does not hold together. */
static int64_t walk(const graph_t *g, const float *weights, int64_t ef, const uint8_t *allowed, int64_t *out) {
    int64_t node = g->entry;
    if (node < 0 || node >= g->rows) {
        return -2;
    }
    float best = code_score(g, weights, node);
    for (int64_t level = g->max_level; level >= 1; level--) {
        for (int changed = 1; changed;) {
            changed = 0;
            int64_t begin, end;
            if (neighbour_slots(g, node, level, &begin, &end) < 0) {
                return -2;
            }
            for (int64_t slot = begin; slot < end; slot++) {
                int32_t next = neighbour(g, slot);
                if (next < 0) {
                    break;
                }
                if (next >= g->rows) {
                    return -2;
                }
                float score = code_score(g, weights, next);
                if (score > best) {
                    best = score;
                    node = next;
                    changed = 1;
                }
            }
        }
    }

    uint8_t *seen = calloc((size_t)(g->rows + 7) / 8, 1);
    heap candidates = {0}, kept = {0};
    int64_t n = -1;
    if (seen == NULL) {
        goto done;
    }
    MARK(seen, node);
    if (heap_push(&candidates, (item){best, (int32_t)node}, 1) < 0) {
        goto done;
    }
    if (ALLOWED(allowed, node) && heap_push(&kept, (item){best, (int32_t)node}, 0) < 0) {
        goto done;
    }
    while (candidates.size > 0) {
        item current = candidates.items[0];
        if (kept.size == ef && current.score < kept.items[0].score) {
            break;
        }
        heap_pop(&candidates, 1);
        int64_t begin, end;
        if (neighbour_slots(g, current.row, 0, &begin, &end) < 0) {
            n = -2;
            goto done;
        }
        for (int64_t slot = begin; slot < end; slot++) {  // the codes of the next ones on their way
            int32_t next = neighbour(g, slot);
            if (next < 0) {
                break;
            }
            if (next < g->rows && !SEEN(seen, next)) {
                PREFETCH(g->bytes + g->codes_at + (int64_t)next * g->dim);
            }
        }
        for (int64_t slot = begin; slot < end; slot++) {
            int32_t next = neighbour(g, slot);
            if (next < 0) {
                break;
            }
            if (next >= g->rows) {
                n = -2;
                goto done;
            }
            if (SEEN(seen, next)) {
                continue;
            }
            MARK(seen, next);
            float score = code_score(g, weights, next);
            if (kept.size < ef || score > kept.items[0].score) {
                if (heap_push(&candidates, (item){score, next}, 1) < 0) {
                    goto done;
                }
                if (ALLOWED(allowed, next)) {
                    if (heap_push(&kept, (item){score, next}, 0) < 0) {
                        goto done;
                    }
                    if (kept.size > ef) {
                        heap_pop(&kept, 0);
                    }
                }
            }
        }
    }
    n = kept.size;
    for (int64_t i = 0; i < n; i++) {
        out[i] = kept.items[i].row;
    }
done:
    free(seen);
    free(candidates.items);
    free(kept.items);
    return n;
}

/* The query's weight per unit of each dimension's code, q[j] * vdiff[j] / 255 (a code's score
 * less its constant part), in a new array; NULL when out of memory. */
static float *code_weights(const graph_t *g, const float *q) {
    float *weights = malloc((size_t)g->dim * sizeof(float));
    if (weights == NULL) {
        return NULL;
    }
    for (int64_t j = 0; j < g->dim; j++) {
        float vdiff;
        memcpy(&vdiff, g->bytes + g->ranges_at + 4 * (g->dim + j), sizeof vdiff);
        weights[j] = q[j] * vdiff / 255.0f;
    }
    return weights;
}

/* The layout tuple's 12 integers (graph_t's fields from cum_at on); -1 with an exception set
 * when it is not one. */
static int layout_fields(PyObject *layout, int64_t fields[12]) {
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 12) {
        return -1;
    }
    for (int i = 0; i < 12; i++) {
        fields[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, i));
        if (fields[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

/* The graph over a blob's bytes as the layout's 12 fields place it (nothing checked yet). */
static graph_t graph_over(const Py_buffer *blob, const int64_t f[12]) {
    graph_t g = {blob->buf, blob->len, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]};
    return g;
}

/* Whether the 8-bit ranges and the rows' codes, all that scoring a code reads, lie inside the
 * graph's bytes (search checks the links besides; scan reads nothing else). */
static int codes_fit(const graph_t *g) {
    return g->dim > 0 && g->rows > 0 && g->ranges_at >= 0 && g->ranges_at <= g->size - 8 * g->dim &&
           g->codes_at >= 0 && g->rows <= (g->size - g->codes_at) / g->dim;
}

/* search(blob, layout, query, ef, allowed, out) -> n
 *   blob: the graph's bytes (uint8 buffer); layout: a tuple of 12 ints (cum offset, cum
 *   count, levels offset, offsets offset, neighbours offset, neighbours count, entry point,
 *   top level, ranges offset, codes offset, rows, dim); query: dim float32; ef: candidates;
 *   allowed: None or a bitmap of rows (bit i of byte i // 8); out: int64 buffer of ef rows. */
static PyObject *search(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t fields[12];
    if (nargs != 6 || layout_fields(args[1], fields) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "search(blob, layout, query, ef, allowed, out)");
        return NULL;
    }
    int64_t ef = PyLong_AsLongLong(args[3]);
    if (ef == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer blob = {0}, query = {0}, allowed = {0}, out = {0};
    PyObject *result = NULL;
    float *weights = NULL;
    int have_allowed = args[4] != Py_None;
    if (PyObject_GetBuffer(args[0], &blob, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &query, PyBUF_C_CONTIGUOUS) < 0 || (have_allowed && PyObject_GetBuffer(args[4], &allowed, PyBUF_C_CONTIGUOUS) < 0) ||
        PyObject_GetBuffer(args[5], &out, PyBUF_C_CONTIGUOUS) < 0) {
        goto release;
    }
    graph_t g = graph_over(&blob, fields);
    int64_t dim = g.dim, rows = g.rows;
    /* every array the walk reads lies inside the blob */
    int fits = codes_fit(&g) && rows < INT32_MAX && ef > 0 && g.n_cum >= 2 && g.n_neighbors >= 0 &&
               g.cum_at >= 0 && g.cum_at <= g.size - 4 * g.n_cum &&
               g.levels_at >= 0 && g.levels_at <= g.size - 4 * rows &&
               g.offsets_at >= 0 && g.offsets_at <= g.size - 8 * (rows + 1) &&
               g.neighbors_at >= 0 && g.neighbors_at <= g.size - 4 * g.n_neighbors &&
               g.max_level >= 0 && g.max_level + 1 < g.n_cum &&
               query.len == (Py_ssize_t)(4 * dim) && out.len >= (Py_ssize_t)(8 * ef) &&
               (!have_allowed || allowed.len >= (rows + 7) / 8);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "graph layout, query or output do not fit the graph's bytes");
        goto release;
    }
    weights = code_weights(&g, query.buf);
    if (weights == NULL) {
        PyErr_NoMemory();
        goto release;
    }
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = walk(&g, weights, ef, have_allowed ? allowed.buf : NULL, out.buf);
    Py_END_ALLOW_THREADS
    if (n == -1) {
        PyErr_NoMemory();
    } else if (n == -2) {
        PyErr_SetString(PyExc_ValueError, "graph neighbours point outside the graph");
    } else {
        result = PyLong_FromLongLong(n);
    }
release:
    free(weights);
    PyBuffer_Release(&blob);
    if (query.obj) PyBuffer_Release(&query);
    if (allowed.obj) PyBuffer_Release(&allowed);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

/* Every row's code scored against integer weights: a row's score is sum_j w[j] * code[j] in
 * 32-bit integers (SSE2: codes widened to 16 bits, multiplied and pairwise added by
 * _mm_madd_epi16, 16 codes a step). The caller bounds |w[j]| so that no sum can overflow. */
static void scan_rows(const graph_t *g, const int16_t *w, float scale, float *out) {
    const uint8_t *codes = g->bytes + g->codes_at;
    for (int64_t row = 0; row < g->rows; row++) {
        const uint8_t *code = codes + row * g->dim;
        int64_t j = 0;
        int32_t sum = 0;
#if defined(__SSE2__)
        const __m128i zero = _mm_setzero_si128();
        __m128i acc0 = _mm_setzero_si128(), acc1 = _mm_setzero_si128();
        for (; j + 16 <= g->dim; j += 16) {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(code + j));
            acc0 = _mm_add_epi32(acc0, _mm_madd_epi16(_mm_unpacklo_epi8(bytes, zero), _mm_loadu_si128((const __m128i *)(w + j))));
            acc1 = _mm_add_epi32(acc1, _mm_madd_epi16(_mm_unpackhi_epi8(bytes, zero), _mm_loadu_si128((const __m128i *)(w + j + 8))));
        }
        int32_t lanes[4];
        _mm_storeu_si128((__m128i *)lanes, _mm_add_epi32(acc0, acc1));
        sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
        for (; j < g->dim; j++) {
            sum += (int32_t)w[j] * (int32_t)code[j];
        }
        out[row] = (float)sum * scale;
    }
}

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t fields[12];
    if (nargs != 4 || layout_fields(args[1], fields) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "scan(blob, layout, query, out)");
        return NULL;
    }
    Py_buffer blob = {0}, query = {0}, out = {0};
    PyObject *result = NULL;
    float *weights = NULL;
    int16_t *w = NULL;
    if (PyObject_GetBuffer(args[0], &blob, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &query, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(args[3], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        goto release;
    }
    graph_t g = graph_over(&blob, fields);
    int64_t dim = g.dim, rows = g.rows;
    if (!(codes_fit(&g) && query.len == (Py_ssize_t)(4 * dim) && out.len >= (Py_ssize_t)(4 * rows))) {
        PyErr_SetString(PyExc_ValueError, "graph layout, query or output do not fit the graph's bytes");
        goto release;
    }
    weights = code_weights(&g, query.buf);
    w = malloc((size_t)dim * sizeof(int16_t));
    if (weights == NULL || w == NULL) {
        PyErr_NoMemory();
        goto release;
    }
    /* The per-code weights (as code_score's) as integers: the largest is `limit`, chosen so
     * that dim * 255 * limit stays below 2^31 (no sum of a row overflows). */
    double largest = 0.0;
    for (int64_t j = 0; j < dim; j++) {
        double x = fabs((double)weights[j]);
        if (x > largest) largest = x;
    }
    double limit = fmin(32767.0, floor(2147483647.0 / (255.0 * (double)dim)) - 1.0);
    double to_int = largest > 0.0 && isfinite(largest) ? limit / largest : 0.0;
    for (int64_t j = 0; j < dim; j++) {
        w[j] = (int16_t)lrint((double)weights[j] * to_int);
    }
    float scale = to_int > 0.0 ? (float)(1.0 / to_int) : 0.0f;
    Py_BEGIN_ALLOW_THREADS
    scan_rows(&g, w, scale, out.buf);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(rows);
release:
    free(weights);
    free(w);
    PyBuffer_Release(&blob);
    if (query.obj) PyBuffer_Release(&query);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

#define GATHER_AHEAD 8 /* rows whose lines are asked for before they are copied */

/* gather(matrix, row_bytes, rows, out) -> n: out[i] = the matrix's row rows[i] (row_bytes each),
 * the rows some places ahead asked for first, so that many of their cache misses are in flight
 * at once where numpy's take copies one row after another. The rescoring of a graph's
 * candidates or a code scan's best: thousands of rows anywhere in a mapping. A row outside the
 * matrix raises ValueError with nothing promised about out. */
static PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "gather(matrix, row_bytes, rows, out)");
        return NULL;
    }
    int64_t width = PyLong_AsLongLong(args[1]);
    if (width == -1 && PyErr_Occurred()) return NULL;
    Py_buffer matrix = {0}, rows = {0}, out = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &matrix, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[2], &rows, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(args[3], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        goto release;
    }
    int64_t n = (int64_t)(rows.len / 8), have = width > 0 ? (int64_t)(matrix.len / width) : 0;
    if (width <= 0 || rows.len % 8 != 0 || out.len < (Py_ssize_t)(n * width)) {
        PyErr_SetString(PyExc_ValueError, "gather: rows (int64) or output do not fit");
        goto release;
    }
    const int64_t *at = rows.buf;
    const char *from = matrix.buf;
    char *to = out.buf;
    int64_t bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) {
        if (i + GATHER_AHEAD < n) {
            int64_t later = at[i + GATHER_AHEAD];
            if (later >= 0 && later < have) {
                const char *line = from + later * width;
                for (int64_t b = 0; b < width; b += 64) __builtin_prefetch(line + b);
            }
        }
        int64_t row = at[i];
        if (row < 0 || row >= have) {
            bad = 1;
            break;
        }
        memcpy(to + i * width, from + row * width, (size_t)width);
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "gather: a row outside the matrix");
        goto release;
    }
    result = PyLong_FromLongLong(n);
release:
    PyBuffer_Release(&matrix);
    if (rows.obj) PyBuffer_Release(&rows);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"search", (PyCFunction)(void (*)(void))search, METH_FASTCALL,
     "search(blob, layout, query, ef, allowed, out) -> n: a dense query's candidate rows from an HNSW graph."},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(blob, layout, query, out) -> rows: every row's code scored (float32, the constant part left out)."},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(matrix, row_bytes, rows, out) -> n: the given rows copied out, the next ones asked for ahead."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_graph", "An HNSW graph's candidates for a dense query, walked in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__graph(void) { return PyModule_Create(&module_def); }
