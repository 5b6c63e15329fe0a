"""Reference engines the local index is measured against, on the same documents and queries.

* **PISA** (``pyterrier-pisa``): the C++ engine the D2S paper timed (156.6 ms for expanded
  queries at 123k). Learned-sparse mode: document weights quantised to integers (x100, as
  PISA's SPLADE indexes are built), queries weighted, block-max WAND, exact top k over the
  quantised weights. Called through its C++ entry point (``_pisathon.retrieve``), one query
  at a time, one thread.
* **Seismic** (``pyseismic-lsr``): approximate learned-sparse retrieval (SIGIR 2024; the
  algorithm OpenSearch 3.3's SEISMIC index uses), with its documented defaults for the index
  and ``query_cut`` / ``heap_factor`` for the search; recall is reported beside its speed.
* **faiss flat** (``IndexFlatIP``): an exact scan of the dense vectors, BLAS in one thread.

Each is optional (``pip install -e '.[peers]'``); a missing one is skipped and named. Every
engine's top 10 is compared with the local index's exact top 10 (recall@10).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PISA_SCALE = 100  # integer document weights, as PISA's learned-sparse indexes quantise them


@dataclass
class Peer:
    name: str
    search: Callable[[dict[str, float], np.ndarray, int], list[str]]  # (sparse query, dense query, k) -> doc ids
    kind: str  # "sparse" or "dense"
    build_seconds: float
    index_bytes: int
    settings: str
    close: Callable[[], None] = field(default=lambda: None)


def available() -> dict[str, bool]:
    return {"pisa": importlib.util.find_spec("pyterrier_pisa") is not None,
            "seismic": importlib.util.find_spec("seismic") is not None,
            "faiss-flat": importlib.util.find_spec("faiss") is not None}


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def pisa(docs: Iterable[tuple[str, dict[str, float]]], workdir: Path) -> Peer:
    """PISA over ``docs`` (id, {term: weight}); ``workdir`` holds the index while it lives."""
    from pyterrier_pisa import PisaIndex, _pisathon

    path = Path(tempfile.mkdtemp(prefix="pisa-", dir=workdir))
    t0 = time.perf_counter()
    index = PisaIndex(str(path / "index"), stemmer="none", overwrite=True, threads=1)
    index.toks_indexer().index(
        {"docno": doc_id, "toks": {t: max(1, round(w * PISA_SCALE)) for t, w in terms.items()}} for doc_id, terms in docs)
    retriever = index.quantized(num_results=1000, threads=1)  # loads the index into a retrieval context
    build = time.perf_counter() - t0
    qidx = np.empty(1000, dtype=np.int32)
    docnos = np.empty(1000, dtype=object)
    ranks = np.empty(1000, dtype=np.int32)
    scores = np.empty(1000, dtype=np.float32)

    def search(sparse: dict[str, float], _dense: np.ndarray, k: int) -> list[str]:
        toks = {t: float(w * PISA_SCALE) for t, w in sparse.items()}
        n = _pisathon.retrieve(retriever._ctxt, retriever.query_algorithm.value, [(0, toks)], k=k, threads=1,
                               query_weighted=1, pretokenised=True, result_qidxs=qidx, result_docnos=docnos,
                               result_ranks=ranks, result_scores=scores)
        return list(docnos[:n])

    return Peer("PISA (block-max WAND)", search, "sparse", build, _folder_bytes(path),
                f"weights x{PISA_SCALE} rounded, block_simdbp, block_max_wand",
                close=lambda: shutil.rmtree(path, ignore_errors=True))


def seismic(docs: Iterable[tuple[str, dict[str, float]]], query_cut: int = 20, heap_factor: float = 0.7) -> Peer:
    """Seismic over ``docs``; its documented defaults, ``query_cut`` strongest query terms."""
    from seismic import SeismicDataset, SeismicIndex, get_seismic_string

    text = get_seismic_string()
    t0 = time.perf_counter()
    dataset = SeismicDataset()
    for doc_id, terms in docs:
        dataset.add_document(doc_id, np.array(list(terms), dtype=text), np.array(list(terms.values()), dtype=np.float32))
    index = SeismicIndex.build_from_dataset(dataset)  # build on every core; searches use one
    build = time.perf_counter() - t0
    workdir = Path(tempfile.mkdtemp(prefix="seismic-"))
    try:
        index.save(str(workdir / "index"))
        size = _folder_bytes(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def search(sparse: dict[str, float], _dense: np.ndarray, k: int) -> list[str]:
        found = index.search("q", np.array(list(sparse), dtype=text), np.array(list(sparse.values()), dtype=np.float32),
                             k=k, query_cut=query_cut, heap_factor=heap_factor)
        return [doc for _q, _score, doc in found]

    return Peer("Seismic (approximate)", search, "sparse", build, size,
                f"index defaults, query_cut {query_cut}, heap_factor {heap_factor}")


def faiss_flat(ids: list[str], vectors: np.ndarray) -> Peer:
    import faiss

    faiss.omp_set_num_threads(1)
    t0 = time.perf_counter()
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    build = time.perf_counter() - t0

    def search(_sparse: dict[str, float], dense: np.ndarray, k: int) -> list[str]:
        _scores, rows = index.search(dense.reshape(1, -1).astype(np.float32), k)
        return [ids[r] for r in rows[0] if r >= 0]

    return Peer("faiss flat (exact scan)", search, "dense", build, vectors.nbytes, "IndexFlatIP, 1 thread")
