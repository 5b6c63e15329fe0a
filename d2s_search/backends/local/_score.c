/* Exact sparse scoring of one shard of the local index, and its top k, in one call.
 *
 * Stored weights are 16-bit: Lucene's FeatureField encoding (float32 bits >> 15, what
 * OpenSearch's rank_features keeps; decoded by shifting back), see kernels.encode_weights.
 * The same arithmetic as kernels.accumulate (scipy's csc_matvec per term, numpy's
 * multiply-then-add for dense columns): every product is rounded to float32 and added in
 * the query's term order, so scores are bit-identical to the numpy path. Build with
 * -ffp-contract=off so no compiler fuses a multiply-add (that would round once, not twice).
 *
 * Loaded with ctypes (no Python headers needed); every id and pointer read from the arrays
 * is checked against the shard's bounds, so a damaged file cannot make it write out of
 * bounds: a bad posting is skipped and counted, and the caller treats a count as damage.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A stored 16-bit weight back to the float32 it stands for (exact: bits << 15). */
static inline float decode_weight(uint16_t stored) {
    uint32_t bits = (uint32_t)stored << 15;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#ifndef D2S_EXPORT /* _query.c includes this file with its own (static) */
#if defined(_WIN32)
#define D2S_EXPORT __declspec(dllexport)
#else
#define D2S_EXPORT __attribute__((visibility("default")))
#endif
#endif

typedef struct {
    float score;
    int32_t row;
} entry;

/* a ranks below b: lower score, or the same score and a later row (ties go to the earlier row). */
static inline int below(entry a, entry b) {
    return a.score < b.score || (a.score == b.score && a.row > b.row);
}

static void sift_down(entry *heap, int64_t n, int64_t i) {
    for (;;) {
        int64_t low = i, l = 2 * i + 1, r = l + 1;
        if (l < n && below(heap[l], heap[low])) low = l;
        if (r < n && below(heap[r], heap[low])) low = r;
        if (low == i) return;
        entry t = heap[i];
        heap[i] = heap[low];
        heap[low] = t;
        i = low;
    }
}

static void sift_up(entry *heap, int64_t i) {
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!below(heap[i], heap[parent])) return;
        entry t = heap[i];
        heap[i] = heap[parent];
        heap[parent] = t;
        i = parent;
    }
}

/* AVX2 where the CPU has it (glibc's ifunc picks the clone when the library loads), SSE2
 * otherwise: the same IEEE products and sums either way (no FMA: -ffp-contract=off, and "avx2"
 * does not enable "fma"). The dense columns' loop is the one that gains (docs/design-decisions.md). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
#define D2S_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define D2S_CLONES
#endif

#define DENSE_RUN 4 /* dense columns added in one pass over the scores */

/* One pass over the scores for m (1..DENSE_RUN) dense columns whose terms follow one another in
 * the query's order: each row's score (0 when fresh, the scores not yet written) plus their
 * products, added one after another in that order, as a pass per column adds them (no other
 * term's product falls between), so the sums are the same bit for bit; the scores are read and
 * written once, not m times. Inlined into each clone of the accumulate loop. */
#define D2S_ROW_SUMS(INIT, ADDS)                                                                  \
    for (int64_t r = 0; r < n_rows; r++) {                                                        \
        float s = INIT;                                                                           \
        ADDS;                                                                                     \
        scores[r] = s;                                                                            \
    }
#define D2S_ADD(J) s += decode_weight(c##J[r]) * w##J
#define D2S_RUNS(INIT)                                                                            \
    switch (m) {                                                                                  \
    case 1: D2S_ROW_SUMS(INIT, D2S_ADD(0)) break;                                                 \
    case 2: D2S_ROW_SUMS(INIT, D2S_ADD(0); D2S_ADD(1)) break;                                     \
    case 3: D2S_ROW_SUMS(INIT, D2S_ADD(0); D2S_ADD(1); D2S_ADD(2)) break;                         \
    default: D2S_ROW_SUMS(INIT, D2S_ADD(0); D2S_ADD(1); D2S_ADD(2); D2S_ADD(3)) break;            \
    }

#if defined(__GNUC__)
#define D2S_INLINE static inline __attribute__((always_inline))
#else
#define D2S_INLINE static inline
#endif

D2S_INLINE void add_dense_run(float *scores, int64_t n_rows, const uint16_t *const *columns, const float *weights,
                              int m, int fresh) {
    const uint16_t *c0 = columns[0], *c1 = columns[m > 1 ? 1 : 0], *c2 = columns[m > 2 ? 2 : 0],
                   *c3 = columns[m > 3 ? 3 : 0];
    float w0 = weights[0], w1 = weights[m > 1 ? 1 : 0], w2 = weights[m > 2 ? 2 : 0], w3 = weights[m > 3 ? 3 : 0];
    if (fresh) {
        D2S_RUNS(0.0f)
    } else {
        D2S_RUNS(scores[r])
    }
}

/* Accumulate the query's postings into scores[0:n_rows]. Returns the number of postings or
 * pointers found out of bounds (0 for a sound shard). dense_slots[t] >= 0 names a dense
 * column (n_rows weights at dense_columns + slot * n_rows) used instead of the postings;
 * consecutive ones are added in one pass (add_dense_run), the first of them writing the
 * scores instead of zeroing them first.
 * Two instantiations: int32 ids, and the cache's 16-bit in-shard ids (with 16-bit weights,
 * 4 bytes read per posting instead of 8: the loop is bound by reading postings). */
#define D2S_DENSE(T) (dense_slots && cols[T] >= 0 && cols[T] < n_cols && dense_slots[T] >= 0 && dense_slots[T] < n_dense)
#define D2S_ACCUMULATE(NAME, ID_T)                                                                \
    D2S_EXPORT D2S_CLONES int64_t NAME(const int32_t *indptr, int64_t n_cols, const ID_T *indices, \
                            const uint16_t *data, int64_t nnz, int64_t n_rows, const int64_t *cols, \
                            const float *weights, int64_t n_terms, const int64_t *dense_slots,    \
                            const uint16_t *dense_columns, int64_t n_dense, float *scores) {      \
        int64_t bad = 0;                                                                          \
        int zeroed = 0; /* the scores written (by zeroing or by a dense run) */                   \
        for (int64_t t = 0; t < n_terms; t++) {                                                   \
            int64_t col = cols[t];                                                                \
            float w = weights[t];                                                                 \
            if (col < 0 || col >= n_cols) continue; /* a term newer than this shard */            \
            if (D2S_DENSE(t)) {                                                                   \
                const uint16_t *run[DENSE_RUN];                                                   \
                float run_weights[DENSE_RUN];                                                     \
                int m = 0;                                                                        \
                run[m] = dense_columns + dense_slots[t] * n_rows;                                 \
                run_weights[m++] = w;                                                             \
                while (m < DENSE_RUN && t + 1 < n_terms && D2S_DENSE(t + 1)) {                    \
                    t++;                                                                          \
                    run[m] = dense_columns + dense_slots[t] * n_rows;                             \
                    run_weights[m++] = weights[t];                                                \
                }                                                                                 \
                add_dense_run(scores, n_rows, run, run_weights, m, !zeroed);                      \
                zeroed = 1;                                                                       \
                continue;                                                                         \
            }                                                                                     \
            if (!zeroed) {                                                                        \
                memset(scores, 0, (size_t)n_rows * sizeof(float));                                \
                zeroed = 1;                                                                       \
            }                                                                                     \
            int64_t start = indptr[col], end = indptr[col + 1];                                   \
            if (start < 0 || end > nnz || start > end) {                                          \
                bad++;                                                                            \
                continue;                                                                         \
            }                                                                                     \
            for (int64_t p = start; p < end; p++) {                                               \
                uint64_t id = (uint64_t)(uint32_t)indices[p]; /* negative ids wrap: too large */  \
                if (id >= (uint64_t)n_rows) {                                                     \
                    bad++;                                                                        \
                    continue;                                                                     \
                }                                                                                 \
                float product = decode_weight(data[p]) * w;                                       \
                scores[id] += product;                                                            \
            }                                                                                     \
        }                                                                                         \
        if (!zeroed) memset(scores, 0, (size_t)n_rows * sizeof(float));                           \
        return bad;                                                                               \
    }

D2S_ACCUMULATE(d2s_accumulate, int32_t)
D2S_ACCUMULATE(d2s_accumulate16, uint16_t)

/* The k highest scores of scores[0:n_rows] above `above` (0 or more), best first, ties by row;
 * returns how many (<= k). heap must hold k entries. A caller passes the k-th best score found
 * in earlier rows (another shard's) as `above`: a row that only ties it loses the tie. */
#define TOP_BLOCK 32 /* rows compared at once: a fixed count the compiler turns into a few vector compares */

D2S_EXPORT D2S_CLONES int64_t d2s_top_positive_above(const float *scores, int64_t n_rows, int64_t k, entry *heap,
                                                     int32_t *out_rows, float *out_scores, float above) {
    int64_t n = 0;
    float floor = above > 0.0f ? above : 0.0f; /* a score must exceed this to enter: then the heap's worst */
    if (k <= 0) return 0;
    for (int64_t base = 0; base < n_rows; base += TOP_BLOCK) {
        int64_t end = base + TOP_BLOCK < n_rows ? base + TOP_BLOCK : n_rows;
        int any = 0;
        if (end - base == TOP_BLOCK) {
            for (int64_t i = 0; i < TOP_BLOCK; i++) any |= scores[base + i] > floor; /* most blocks end here */
        } else {
            for (int64_t r = base; r < end; r++) any |= scores[r] > floor;
        }
        if (!any) continue;
        for (int64_t r = base; r < end; r++) {
            float s = scores[r];
            if (!(s > floor)) continue; /* an equal score comes later: the earlier row keeps its place */
            if (n < k) {
                heap[n].score = s;
                heap[n].row = (int32_t)r;
                sift_up(heap, n);
                n++;
            } else {
                heap[0].score = s;
                heap[0].row = (int32_t)r;
                sift_down(heap, n, 0);
            }
            if (n == k) floor = heap[0].score;
        }
    }
    /* Pop the worst first into the back of the output: best first, ties by row. */
    for (int64_t i = n - 1; i >= 0; i--) {
        out_rows[i] = heap[0].row;
        out_scores[i] = heap[0].score;
        heap[0] = heap[i];
        sift_down(heap, i, 0);
    }
    return n;
}

/* The k highest positive scores of scores[0:n_rows], best first, ties by row; returns how
 * many (<= k). heap must hold k entries. */
D2S_EXPORT int64_t d2s_top_positive(const float *scores, int64_t n_rows, int64_t k, entry *heap, int32_t *out_rows,
                                    float *out_scores) {
    return d2s_top_positive_above(scores, n_rows, k, heap, out_rows, out_scores, 0.0f);
}

/* Positive floats order as their bit patterns: a score's bits over its row, as one 64-bit key. */
static inline uint32_t float_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static inline float bits_float(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#define BOUND_SHIFT 19 /* bound buckets: a float's exponent and 4 mantissa bits (1/16 of an octave) */
#define BOUND_BUCKETS (1 << (31 - BOUND_SHIFT))

/* Stable LSD radix sort of keys[0:n] by their high 32 bits (a score's bits), descending: keys
 * gathered in row order stay in row order among equal scores. tmp holds n keys; returns which
 * of the two buffers holds the result. */
static uint64_t *sort_by_score(uint64_t *keys, uint64_t *tmp, int64_t n) {
    int64_t count[256];
    for (int shift = 32; shift < 64; shift += 8) {
        memset(count, 0, sizeof count);
        for (int64_t i = 0; i < n; i++) count[255 - ((keys[i] >> shift) & 255)]++;
        int64_t at = 0, single = 0;
        for (int d = 0; d < 256; d++) {
            int64_t c = count[d];
            single |= c == n;
            count[d] = at;
            at += c;
        }
        if (single) continue; /* every key has this digit: the pass would change nothing */
        for (int64_t i = 0; i < n; i++) tmp[count[255 - ((keys[i] >> shift) & 255)]++] = keys[i];
        uint64_t *swap = keys;
        keys = tmp;
        tmp = swap;
    }
    return keys;
}

/* d2s_top_positive for a large k (kernels.top_rows, same result). A lower bound of the k-th
 * score: the maxima of k*4 strided groups (kernels.kth_score_lower_bound: the k-th largest of
 * disjoint groups' maxima is reached by at least k scores), its bucket's lower edge in a
 * histogram of their float bits (lower still, so as many rows reach it). Every row at or above
 * the bound (every positive row without one) is gathered in row order, sorted stably by score
 * and the first k kept. cand must hold 2 * n_rows keys (the second half for the sort) and
 * maxima n_rows / 4 + 1 floats. Returns how many (<= k). `above` (0 or more) as for
 * d2s_top_positive_above: the bound is then the higher of the two. */
D2S_EXPORT int64_t d2s_top_large_above(const float *scores, int64_t n_rows, int64_t k, uint64_t *cand, float *maxima,
                                       int32_t *out_rows, float *out_scores, float above) {
    if (k <= 0 || n_rows <= 0) return 0;
    float floor = 0.0f; /* a row is gathered when its score is above this */
    int64_t block = k < n_rows ? n_rows / (4 * k) : 0;
    if (block > 64) block = 64;
    if (block >= 4) {
        int64_t cols = n_rows / block, m = cols;
        for (int64_t c = 0; c < cols; c++) maxima[c] = scores[c];
        for (int64_t j = 1; j < block; j++) {
            const float *part = scores + j * cols;
            for (int64_t c = 0; c < cols; c++) maxima[c] = part[c] > maxima[c] ? part[c] : maxima[c];
        }
        if (cols * block < n_rows) {
            float tail = scores[cols * block];
            for (int64_t r = cols * block + 1; r < n_rows; r++) tail = scores[r] > tail ? scores[r] : tail;
            maxima[m++] = tail;
        }
        int32_t counts[BOUND_BUCKETS]; /* 16 kB */
        memset(counts, 0, sizeof counts);
        for (int64_t c = 0; c < m; c++) {
            if (maxima[c] > 0.0f) counts[float_bits(maxima[c]) >> BOUND_SHIFT]++; /* NaN and <= 0: no bucket */
        }
        int64_t above = 0;
        for (int64_t b = BOUND_BUCKETS - 1; b > 0; b--) {
            above += counts[b];
            if (above >= k) { /* at least k maxima, so at least k rows, reach this bucket's lower edge */
                floor = bits_float(((uint32_t)b << BOUND_SHIFT) - 1); /* s > floor: s >= the edge */
                break;
            }
        }
    }
    if (above > floor) floor = above;
    int64_t n = 0;
    for (int64_t base = 0; base < n_rows; base += 16) {
        int64_t end = base + 16 < n_rows ? base + 16 : n_rows;
        int any = 0;
        for (int64_t r = base; r < end; r++) any |= scores[r] > floor; /* vectorised: most blocks end here */
        if (!any) continue;
        for (int64_t r = base; r < end; r++) { /* branch-free: written always, kept when above */
            cand[n] = ((uint64_t)float_bits(scores[r]) << 32) | (uint32_t)r;
            n += scores[r] > floor;
        }
    }
    uint64_t *sorted = sort_by_score(cand, cand + n_rows, n);
    if (n > k) n = k;
    for (int64_t i = 0; i < n; i++) {
        out_rows[i] = (int32_t)(uint32_t)sorted[i];
        out_scores[i] = bits_float((uint32_t)(sorted[i] >> 32));
    }
    return n;
}

D2S_EXPORT int64_t d2s_top_large(const float *scores, int64_t n_rows, int64_t k, uint64_t *cand, float *maxima,
                                 int32_t *out_rows, float *out_scores) {
    return d2s_top_large_above(scores, n_rows, k, cand, maxima, out_rows, out_scores, 0.0f);
}

/* Put (key, value) into a row's best n, kept ordered: larger value first, then smaller key;
 * *have counts the places filled (at most n). */
static inline void keep_best(int64_t *keys, float *vals, int64_t *have, int64_t n, int64_t key, float value) {
    int64_t at = *have;
    while (at > 0 && (vals[at - 1] < value || (vals[at - 1] == value && keys[at - 1] > key))) at--;
    if (at >= n) return;
    int64_t last = *have < n ? *have : n - 1;
    for (int64_t j = last; j > at; j--) {
        keys[j] = keys[j - 1];
        vals[j] = vals[j - 1];
    }
    keys[at] = key;
    vals[at] = value;
    if (*have < n) (*have)++;
}

/* The term id at p of a row-wise shard's postings: 32-bit (wide) or 16-bit ids, as the cache
 * stores them (cache.csr_index_dtype). Callers pass wide as a constant or branch on it once, so
 * the compiler makes a copy of their loop for each width. */
static inline int64_t term_at(const void *indices, int wide, int64_t p) {
    return wide ? (int64_t)((const int32_t *)indices)[p] : (int64_t)((const uint16_t *)indices)[p];
}

/* Why rows matched: for each of the n_sel given rows of a row-wise (CSR) shard, its n largest
 * products query weight * stored weight over the terms it shares with the query, largest
 * first, ties by column: kernels.explain_rows's numpy path, product for product (one float32
 * rounding each). indices: 32-bit term ids (wide) or 16-bit. qcols must be ascending and distinct. out_cols / out_vals hold n_sel x n
 * entries, counts[i] how many row i has (<= n). Returns the number of rows skipped because a
 * row id or its pointers were out of bounds (their count is 0), or -1, having written nothing,
 * when qcols is not strictly ascending. */
static inline int64_t explain_rows(const int64_t *indptr, int64_t n_rows, const void *indices, int wide,
                                   const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                   const int64_t *qcols, const float *qweights, int64_t n_q, int64_t n,
                                   int64_t *out_cols, float *out_vals, int64_t *counts) {
    int64_t bad = 0;
    for (int64_t t = 1; t < n_q; t++)
        if (qcols[t] <= qcols[t - 1]) return -1;
    for (int64_t i = 0; i < n_sel; i++) {
        int64_t *cols = out_cols + i * n;
        float *vals = out_vals + i * n;
        int64_t have = 0, row = rows[i];
        counts[i] = 0;
        if (row < 0 || row >= n_rows || indptr[row] < 0 || indptr[row] > indptr[row + 1] || indptr[row + 1] > nnz) {
            bad++;
            continue;
        }
        for (int64_t p = indptr[row]; p < indptr[row + 1]; p++) {
            int64_t col = term_at(indices, wide, p), lo = 0, hi = n_q; /* the query term with this column, if any */
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (qcols[mid] < col) lo = mid + 1; else hi = mid;
            }
            if (lo == n_q || qcols[lo] != col) continue;
            float value = qweights[lo] * decode_weight(data[p]);
            if (value > 0.0f) keep_best(cols, vals, &have, n, col, value);
        }
        counts[i] = have;
    }
    return bad;
}

D2S_EXPORT int64_t d2s_explain_rows(const int64_t *indptr, int64_t n_rows, const int32_t *indices,
                                    const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                    const int64_t *qcols, const float *qweights, int64_t n_q, int64_t n,
                                    int64_t *out_cols, float *out_vals, int64_t *counts) {
    return explain_rows(indptr, n_rows, indices, 1, data, nnz, rows, n_sel, qcols, qweights, n_q, n, out_cols, out_vals,
                        counts);
}

/* d2s_explain_rows over 16-bit term ids (a shard whose columns all fit in 16 bits). */
D2S_EXPORT int64_t d2s_explain_rows16(const int64_t *indptr, int64_t n_rows, const uint16_t *indices,
                                      const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                      const int64_t *qcols, const float *qweights, int64_t n_q, int64_t n,
                                      int64_t *out_cols, float *out_vals, int64_t *counts) {
    return explain_rows(indptr, n_rows, indices, 0, data, nnz, rows, n_sel, qcols, qweights, n_q, n, out_cols, out_vals,
                        counts);
}

#define PREFETCH_ROWS 8                /* rows whose postings are asked for ahead */
#define MAX_TABLE_COLUMNS (1 << 24)     /* larger than any vocabulary */

/* One row of d2s_explain_slots: its m largest products over the query's terms (slot_of: column
 * -> query slot or -1, n_map entries), largest first, ties by slot, then the zero-valued slots
 * in slot order. member (optional): one bit per column, set for the query's, tested first: a
 * row's ~100 columns then touch a few of its lines, not ~100 of the table's, when both are cold.
 * Term ids: 32-bit when wide, else 16-bit. Returns 1, with zeros written, when the row or its
 * pointers are out of bounds. zeros 0: after the positive values only one zero is written, to
 * end them, for a caller that reads the positive ones only (placing the zero-valued slots takes
 * m x positives steps a row, with m every term of a long query when it asks for all). */
static inline int64_t explain_row_slots(const int64_t *indptr, int64_t n_rows, const void *indices, int wide,
                                        const uint16_t *data, int64_t nnz, int64_t row, const int16_t *slot_of,
                                        int64_t n_map, const float *qweights, int64_t n_q, int64_t m,
                                        int64_t *slots, float *vals, const uint64_t *member, int zeros) {
    int64_t have = 0;
    if (row < 0 || row >= n_rows || indptr[row] < 0 || indptr[row] > indptr[row + 1] || indptr[row + 1] > nnz) {
        for (int64_t j = 0; j < m; j++) {
            slots[j] = j;
            vals[j] = 0.0f;
        }
        return 1;
    }
    for (int64_t p = indptr[row]; p < indptr[row + 1]; p++) {
        uint64_t col = (uint64_t)(uint32_t)term_at(indices, wide, p); /* a negative 32-bit id: past n_map */
        if (col >= (uint64_t)n_map) continue;
        if (member && !((member[col >> 6] >> (col & 63)) & 1)) continue;
        if (slot_of[col] < 0) continue;
        int64_t t = slot_of[col];
        float value = qweights[t] * decode_weight(data[p]);
        if (value > 0.0f) keep_best(slots, vals, &have, m, t, value); /* zeros are placed below, in slot order */
    }
    if (!zeros) {
        if (have < m) {
            slots[have] = 0;
            vals[have] = 0.0f;
        }
        return 0;
    }
    /* the rest: the smallest slots without a positive value, ascending (fewer than m positives
     * means every positive one is among the have placed) */
    for (int64_t t = 0, filled = have; filled < m && t < n_q; t++) {
        int taken = 0;
        for (int64_t j = 0; j < have; j++) taken |= slots[j] == t;
        if (taken) continue;
        slots[filled] = t;
        vals[filled] = 0.0f;
        filled++;
    }
    return 0;
}

/* Ask for a row's postings (term ids, 32-bit when wide or 16-bit, and weights) ahead of reading them. */
static inline void prefetch_row(const int64_t *indptr, int64_t n_rows, const void *indices, int wide,
                                const uint16_t *data, int64_t nnz, int64_t row) {
    if (row < 0 || row >= n_rows) return;
    int64_t lo = indptr[row], hi = indptr[row + 1];
    if (lo < 0 || lo > hi || hi > nnz) return;
    const char *ids = indices;
    int64_t width = wide ? 4 : 2;
    for (int64_t q = lo * width; q < hi * width; q += 64) __builtin_prefetch(ids + q);
    for (int64_t q = lo; q < hi; q += 32) __builtin_prefetch(data + q);
}

/* The table from column to query slot (-1: not a query term) that explain_slots and
 * rescore_rows look a row's columns up in, qcols[n_q - 1] + 1 entries (*n_map); NULL with
 * *status -1 when qcols is not strictly ascending, too long for 16-bit slots or holds a column
 * past MAX_TABLE_COLUMNS, -2 when it cannot be allocated. The caller frees it. */
static int16_t *slot_table(const int64_t *qcols, int64_t n_q, int64_t *n_map, int64_t *status) {
    *status = -1;
    if (n_q <= 0 || n_q > INT16_MAX || qcols[0] < 0) return NULL;
    for (int64_t t = 1; t < n_q; t++)
        if (qcols[t] <= qcols[t - 1]) return NULL;
    *n_map = qcols[n_q - 1] + 1;
    if (*n_map > MAX_TABLE_COLUMNS) return NULL; /* no vocabulary is that large: a table not worth its memory */
    int16_t *slot_of = malloc((size_t)*n_map * sizeof(int16_t));
    if (!slot_of) {
        *status = -2;
        return NULL;
    }
    memset(slot_of, 0xff, (size_t)*n_map * sizeof(int16_t));
    for (int64_t t = 0; t < n_q; t++) slot_of[qcols[t]] = (int16_t)t;
    *status = 0;
    return slot_of;
}

/* The rows lie anywhere in the shard: the postings of the row PREFETCH_ROWS places ahead of i
 * (and the pointers of the one twice as far) are asked for, so that many cache misses are in
 * flight at once (reading them one by one waits on each). */
static inline void prefetch_ahead(const int64_t *indptr, int64_t n_rows, const void *indices, int wide,
                                  const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel, int64_t i) {
    if (i + PREFETCH_ROWS < n_sel) prefetch_row(indptr, n_rows, indices, wide, data, nnz, rows[i + PREFETCH_ROWS]);
    if (i + 2 * PREFETCH_ROWS < n_sel) {
        int64_t later = rows[i + 2 * PREFETCH_ROWS];
        if (later >= 0 && later < n_rows) __builtin_prefetch(indptr + later);
    }
}

/* kernels.explain_by_postings's result read from the rows' own postings (row-wise, CSR), in one
 * call per shard: for each of the n_sel given rows, the m largest products query weight *
 * stored weight over the query's n_q terms, largest first, ties by query slot (qcols strictly
 * ascending: by column), the remaining places filled with the zero-valued slots in slot order,
 * as numpy's stable argsort leaves them. A row's columns are looked up in a table from column to
 * query slot (built here, qcols[n_q - 1] + 1 entries), not searched for. out_slots / out_vals
 * hold n_sel x m. Returns the number of rows skipped because a row id or its pointers were out
 * of bounds (their places hold zeros); -1 when qcols is not strictly ascending, too long for the
 * table's 16-bit slots or holds a column past MAX_TABLE_COLUMNS, -2 when the table cannot be
 * allocated (nothing usable is written then). */
static inline int64_t explain_slots(const int64_t *indptr, int64_t n_rows, const void *indices, int wide,
                                    const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                    const int64_t *qcols, const float *qweights, int64_t n_q, int64_t m,
                                    int64_t *out_slots, float *out_vals) {
    int64_t bad = 0, n_map = 0, status;
    if (m <= 0 || m > n_q) return -1;
    int16_t *slot_of = slot_table(qcols, n_q, &n_map, &status);
    if (!slot_of) return status;
    for (int64_t i = 0; i < n_sel; i++) {
        prefetch_ahead(indptr, n_rows, indices, wide, data, nnz, rows, n_sel, i);
        bad += explain_row_slots(indptr, n_rows, indices, wide, data, nnz, rows[i], slot_of, n_map, qweights, n_q, m,
                                 out_slots + i * m, out_vals + i * m, NULL, 1);
    }
    free(slot_of);
    return bad;
}

D2S_EXPORT int64_t d2s_explain_slots(const int64_t *indptr, int64_t n_rows, const int32_t *indices,
                                     const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                     const int64_t *qcols, const float *qweights, int64_t n_q, int64_t m,
                                     int64_t *out_slots, float *out_vals) {
    return explain_slots(indptr, n_rows, indices, 1, data, nnz, rows, n_sel, qcols, qweights, n_q, m, out_slots,
                         out_vals);
}

/* d2s_explain_slots over 16-bit term ids (a shard whose columns all fit in 16 bits). */
D2S_EXPORT int64_t d2s_explain_slots16(const int64_t *indptr, int64_t n_rows, const uint16_t *indices,
                                       const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                       const int64_t *qcols, const float *qweights, int64_t n_q, int64_t m,
                                       int64_t *out_slots, float *out_vals) {
    return explain_slots(indptr, n_rows, indices, 0, data, nnz, rows, n_sel, qcols, qweights, n_q, m, out_slots,
                         out_vals);
}

/* Exact scores of the n_sel given rows of a row-wise (CSR) shard (a two-phase window, a narrow
 * filter's rows): each row's products query weight * stored weight over the terms it shares
 * with the query (one float32 rounding each) summed in double in the row's order, then rounded
 * to float32: kernels.rescore_rows's numpy path (a bincount of the float32 products), bit for
 * bit. Columns are looked up in a table from column to query slot (as explain_slots), the rows'
 * postings asked for ahead. Returns the number of rows skipped because a row id or its pointers
 * were out of bounds (their score is 0); -1 when qcols is not strictly ascending, too long for
 * the table's 16-bit slots or holds a column past MAX_TABLE_COLUMNS, -2 when the table cannot
 * be allocated (nothing usable is written then). */
static inline int64_t rescore_rows(const int64_t *indptr, int64_t n_rows, const void *indices, int wide,
                                   const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                   const int64_t *qcols, const float *qweights, int64_t n_q, float *out) {
    int64_t bad = 0, n_map = 0, status;
    int16_t *slot_of = slot_table(qcols, n_q, &n_map, &status);
    if (!slot_of) return status;
    for (int64_t i = 0; i < n_sel; i++) {
        prefetch_ahead(indptr, n_rows, indices, wide, data, nnz, rows, n_sel, i);
        int64_t row = rows[i];
        out[i] = 0.0f;
        if (row < 0 || row >= n_rows || indptr[row] < 0 || indptr[row] > indptr[row + 1] || indptr[row + 1] > nnz) {
            bad++;
            continue;
        }
        double sum = 0.0;
        for (int64_t p = indptr[row]; p < indptr[row + 1]; p++) {
            uint64_t col = (uint64_t)(uint32_t)term_at(indices, wide, p); /* a negative 32-bit id: past n_map */
            if (col >= (uint64_t)n_map || slot_of[col] < 0) continue;
            float value = qweights[slot_of[col]] * decode_weight(data[p]);
            sum += (double)value;
        }
        out[i] = (float)sum;
    }
    free(slot_of);
    return bad;
}

D2S_EXPORT int64_t d2s_rescore_rows(const int64_t *indptr, int64_t n_rows, const int32_t *indices,
                                    const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                    const int64_t *qcols, const float *qweights, int64_t n_q, float *out) {
    return rescore_rows(indptr, n_rows, indices, 1, data, nnz, rows, n_sel, qcols, qweights, n_q, out);
}

/* d2s_rescore_rows over 16-bit term ids. */
D2S_EXPORT int64_t d2s_rescore_rows16(const int64_t *indptr, int64_t n_rows, const uint16_t *indices,
                                      const uint16_t *data, int64_t nnz, const int64_t *rows, int64_t n_sel,
                                      const int64_t *qcols, const float *qweights, int64_t n_q, float *out) {
    return rescore_rows(indptr, n_rows, indices, 0, data, nnz, rows, n_sel, qcols, qweights, n_q, out);
}
