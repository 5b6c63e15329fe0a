"""Filters on the local index: every plan against brute force (SearchFilter.allows over every
document), for filters that keep about 0.1%, 10% and 90% of the documents and each kind of
condition; the library order, facet counts and metadata updates likewise."""

from __future__ import annotations

import numpy as np
import pytest

from d2s_search.backends.base import Document, IndexIdentity, WordFilter
from d2s_search.backends.local import LocalBackend, kernels
from d2s_search.backends.local import cache as cache_mod
from d2s_search.errors import MetadataError, QueryError
from d2s_search.filters import Condition, SearchFilter, build_filter
from d2s_search.metadata import Metadata, parse_time
from d2s_search.search import SearchOptions, fuse_minmax
from tests.helpers import brute_force_dense, brute_force_sparse
from tests.reliability.local_index_fixtures import graphs_at_any_size

N = 3000
DIM = 8
VOCAB = [f"w{i}" for i in range(40)]
CITIES = {"paris": (48.8566, 2.3522), "nyc": (40.7128, -74.0060), "tokyo": (35.6762, 139.6503)}
CAMERAS = ["Canon EOS 5D", "Pixel 7", "iPhone 13", "Nikon D750"]
TRIPS = ["alps", "beach", "city", "family", "work"]
FIELD_TYPES = {"trip": "keyword", "rating": "number", "fav": "boolean", "shot": "date"}
YEAR = 365.25 * 86400
T2015 = parse_time("2015-01-01")


def collection(seed: int = 7) -> list[Document]:
    """Documents with every kind of metadata (and its absence), in folders /p/a, /p/a/sub,
    /p/b and /p/rare (3 pictures), some with a copy under /q."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(N):
        terms = rng.choice(len(VOCAB), size=int(rng.integers(2, 9)), replace=False)
        sparse = {VOCAB[t]: float(np.round(rng.uniform(0.1, 3.0), 3)) for t in terms}
        dense = rng.normal(size=DIM).astype(np.float32)
        folder = "/p/rare" if i in (11, 1500, 2999) else ["/p/a", "/p/a/sub", "/p/b"][i % 3]
        taken = None if i % 10 == 9 else float(T2015 + rng.uniform(0, 10) * YEAR)
        city = list(CITIES.values())[i % 3] if i % 2 == 0 else None
        location = (city[0] + rng.normal(0, 0.05), city[1] + rng.normal(0, 0.05)) if city else None
        fields = {}
        if i % 4:
            fields["trip"] = TRIPS[int(rng.integers(0, len(TRIPS)))]
        if i % 5:
            fields["rating"] = float(rng.integers(1, 6))
        if i % 3 == 0:
            fields["fav"] = bool(i % 2)
        if i % 7 == 0:
            fields["shot"] = float(T2015 + rng.uniform(0, 10) * YEAR)
        metadata = Metadata(taken_at=taken, camera=None if i % 11 == 0 else CAMERAS[i % 4],
                            location=location, fields=fields)
        docs.append(Document(id=f"{i:064x}", path=f"{folder}/{i}.jpg", size_bytes=1000 + i, width=640 + i % 3,
                             height=480, sparse=sparse, dense=dense, ingested_at=1.0,
                             copies=(f"/q/{i}.jpg",) if i % 13 == 0 else (), metadata=metadata))
    return docs


DOCS = collection()


def passes(f: SearchFilter, doc: Document) -> bool:
    return f.allows(doc.paths, doc.metadata, doc.width, doc.height, doc.size_bytes)


def kept(f: SearchFilter) -> list[Document]:
    return [d for d in DOCS if passes(f, d)]


FILTERS = {
    "rare-folder (0.1%)": SearchFilter(folders=("/p/rare",)),
    "trip=alps, camera (about 4%)": SearchFilter(where=(Condition("trip", "=", "alps"), Condition("camera", "=", "Pixel 7"))),
    "one year (10%)": SearchFilter(after=parse_time("2019-01-01"), before=parse_time("2020-01-01")),
    "near paris (about 17%)": SearchFilter(near=(48.85, 2.35, 20.0)),
    "rating>=4 or fav, folder a": SearchFilter(folders=("/p/a",), where=(Condition("rating", ">=", 4.0),)),
    "camera!=Pixel (90%)": SearchFilter(where=(Condition("camera", "!=", "Pixel 7"),)),
    "before 2024 (about 80%)": SearchFilter(before=parse_time("2024-01-01")),
    "trip either, shot <": SearchFilter(where=(Condition("trip", "=", "alps"), Condition("trip", "=", "beach"),
                                               Condition("shot", "<", parse_time("2020-06-01")))),
    "copies folder /q": SearchFilter(folders=("/q",)),
    "fav=true": SearchFilter(where=(Condition("fav", "=", True),)),
    "nothing passes": SearchFilter(folders=("/nowhere",)),
}


def test_the_filters_keep_what_their_names_say():
    share = {name: len(kept(f)) / N for name, f in FILTERS.items()}
    assert 0 < share["rare-folder (0.1%)"] <= 0.002
    assert 0.08 <= share["one year (10%)"] <= 0.12
    assert share["camera!=Pixel (90%)"] >= 0.75
    assert share["nothing passes"] == 0
    assert len(kept(FILTERS["copies folder /q"])) == len([d for d in DOCS if d.copies])


@pytest.fixture(scope="module", params=["one shard", "shards of 512"])
def index(request, tmp_path_factory):
    patch = pytest.MonkeyPatch()
    if request.param != "one shard":
        patch.setattr(cache_mod, "SHARD_ROWS", 512)
    backend = LocalBackend(tmp_path_factory.mktemp("filters") / "idx")
    backend.open(IndexIdentity(fingerprint="f" * 32, dense_dim=DIM, model="synthetic"), create=True)
    backend.declare_fields(FIELD_TYPES)
    for start in range(0, N, 500):
        backend.upsert(DOCS[start:start + 500])
    yield backend
    backend.close()
    patch.undo()


QUERIES = [{"w1": 1.0, "w2": 0.5, "w3": 2.0}, {"w7": 1.0}, {f"w{i}": 1.0 / (i + 1) for i in range(30)}]


def ids_scores(hits):
    return [(h.id, h.score) for h in hits]


def close(got, want):
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", FILTERS)
@pytest.mark.parametrize("k", [10, 1000])
def test_sparse_equals_brute_force(index, name, k):
    f = FILTERS[name]
    for query in QUERIES:
        want = brute_force_sparse(kept(f), query)[:k]
        close(ids_scores(index.sparse_search(query, k, filters=f)), want)


@pytest.mark.parametrize("name", ["rare-folder (0.1%)", "one year (10%)", "camera!=Pixel (90%)"])
def test_without_the_compiled_query_path_the_same(index, name, monkeypatch):
    f = FILTERS[name]
    with_c = ids_scores(index.sparse_search(QUERIES[0], 10, filters=f))
    monkeypatch.setattr(kernels, "_c_query", None)
    close(ids_scores(index.sparse_search(QUERIES[0], 10, filters=f)), with_c)


@pytest.mark.parametrize("name", FILTERS)
def test_two_phase_dense_and_hybrid_equal_brute_force(index, name):
    f = FILTERS[name]
    passing = kept(f)
    query = QUERIES[0]
    # two-phase with the whole query as its first pass and a window over everything: the sparse top
    want = brute_force_sparse(passing, query)[:10]
    close(ids_scores(index.two_phase_search(query, query, 10, N, filters=f)), want)
    vector = np.linspace(-1, 1, DIM).astype(np.float32)
    close(ids_scores(index.dense_search(vector, 10, filters=f)), brute_force_dense(passing, vector)[:10] if passing else [])
    options = SearchOptions(mode="hybrid", k=10, window=50)
    got = index.hybrid_search(query, vector, options, filters=f)
    from d2s_search.backends.base import Hit

    runs = {"sparse": [Hit(i, s, "") for i, s in brute_force_sparse(passing, query)[:50]],
            "dense": [Hit(i, s, "") for i, s in (brute_force_dense(passing, vector)[:50] if passing else [])]}
    want = fuse_minmax(runs, {"sparse": 0.5, "dense": 0.5}, 10)
    close(ids_scores(got), ids_scores(want))


def test_k_larger_than_what_passes_returns_exactly_what_passes(index):
    f = FILTERS["rare-folder (0.1%)"]
    hits = index.dense_search(np.ones(DIM, dtype=np.float32), 50, filters=f)
    assert sorted(h.id for h in hits) == sorted(d.id for d in kept(f))
    everything = {f"w{i}": 1.0 for i in range(40)}
    assert len(index.sparse_search(everything, 50, filters=f)) == len(kept(f)) == 3


def test_filters_and_words_together(index):
    f = FILTERS["one year (10%)"]
    words = WordFilter(required=("w3",), threshold=1.0)
    from d2s_search.backends.opensearch.features import lucene_feature_value

    passing = [d for d in kept(f) if lucene_feature_value(d.sparse.get("w3", 0.0)) >= 1.0]
    close(ids_scores(index.sparse_search(QUERIES[0], 10, filters=f, words=words)),
          brute_force_sparse(passing, QUERIES[0])[:10])


def library_order(docs):
    return [d.id for d in sorted(docs, key=lambda d: (d.metadata.taken_at is None, -(d.metadata.taken_at or 0), d.id))]


@pytest.mark.parametrize("name", [None, "near paris (about 17%)", "copies folder /q", "nothing passes"])
def test_the_library_is_newest_first_undated_last(index, name):
    f = FILTERS[name] if name else None
    docs = kept(f) if f else DOCS
    want = library_order(docs)
    assert [h.id for h in index.browse(25, f)] == want[:25]
    assert [h.id for h in index.browse(25, f, offset=max(0, len(want) - 5))] == want[-5:]
    assert all(h.score == 0 for h in index.browse(5, f))


def brute_facets(docs):
    from collections import Counter

    def top(counter):
        return sorted(counter.items(), key=lambda vc: (-vc[1], vc[0]))[:20]

    folder = Counter(p for d in docs for p in {q.rsplit("/", 1)[0] for q in d.paths})
    camera = Counter(d.metadata.camera for d in docs if d.metadata.camera)
    trip = Counter(d.metadata.fields["trip"] for d in docs if "trip" in d.metadata.fields)
    fav = Counter(str(d.metadata.fields["fav"]).lower() for d in docs if "fav" in d.metadata.fields)
    return {"folder": top(folder), "camera": top(camera), "fav": top(fav), "trip": top(trip)}


@pytest.mark.parametrize("name", [None, "one year (10%)", "rare-folder (0.1%)"])
def test_facets_count_the_documents_that_pass(index, name):
    f = FILTERS[name] if name else None
    assert index.facets(f) == brute_facets(kept(f) if f else DOCS)


def test_field_types_and_conflicts(index):
    assert index.field_types() == {"camera": "keyword", "width": "number", "height": "number",
                                   "size_bytes": "number", "taken": "date", **FIELD_TYPES}
    with pytest.raises(MetadataError, match="'rating' is number"):
        index.declare_fields({"rating": "keyword"})
    index.declare_fields({"rating": "number"})  # the same again: nothing to do


def test_metadata_is_stored_and_read_back(index):
    doc = DOCS[14]
    (stored,) = index.get([doc.id])
    assert stored.metadata == doc.metadata


def test_set_metadata_changes_what_filters_find_not_the_vectors(tmp_path):
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IndexIdentity(fingerprint="f" * 32, dense_dim=DIM, model="synthetic"), create=True)
    backend.declare_fields(FIELD_TYPES)
    backend.upsert(DOCS[:200])
    f = SearchFilter(where=(Condition("trip", "=", "moon"),))
    assert backend.sparse_search(QUERIES[0], 10, filters=f) == []
    before = backend.sparse_search(QUERIES[0], 5)
    chosen = before[0].id
    generation = backend.generation()
    assert backend.set_metadata({chosen: Metadata(fields={"trip": "moon"}), "e" * 64: Metadata()}) == 1
    assert [h.id for h in backend.sparse_search(QUERIES[0], 10, filters=f)] == [chosen]
    assert backend.sparse_search(QUERIES[0], 5) == before  # same vectors, same scores
    assert backend.generation() == generation  # the search cache is not rebuilt for metadata
    assert backend.get([chosen])[0].metadata.fields == {"trip": "moon"}
    # another process (a running serve) sees it too
    other = LocalBackend(tmp_path / "idx")
    other.open(None, create=False)
    assert [h.id for h in other.sparse_search(QUERIES[0], 10, filters=f)] == [chosen]
    other.close()
    backend.close()


def test_damaged_metadata_rows_read_as_missing(tmp_path):
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IndexIdentity(fingerprint="f" * 32, dense_dim=DIM, model="synthetic"), create=True)
    backend.declare_fields(FIELD_TYPES)
    backend.upsert(DOCS[:20])
    db = backend._connect(False)
    db.execute("UPDATE metadata SET fields = '{not json', taken_at = 'x', lat = 500 WHERE id = ?", (DOCS[2].id,))
    db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'metadata_version'")
    (doc,) = backend.get([DOCS[2].id])
    assert doc.metadata == Metadata(camera=DOCS[2].metadata.camera)
    f = SearchFilter(after=0.0)
    assert DOCS[2].id not in {h.id for h in backend.browse(20, f)}
    backend.close()


def test_typed_filters_from_the_command_line_words():
    types = {**FIELD_TYPES, "camera": "keyword", "width": "number"}
    f = build_filter(after="2019-06-01", before="2019-07-01", where=["rating>=4", "camera=Pixel 7", "fav=true"],
                     near="48.85,2.35,10", folders=["/p/a/"], types=types)
    assert f.after == parse_time("2019-06-01") and f.before == parse_time("2019-07-01")
    assert f.where == (Condition("rating", ">=", 4.0), Condition("camera", "=", "Pixel 7"), Condition("fav", "=", True))
    assert f.near == (48.85, 2.35, 10.0) and f.folders == ("/p/a",)
    for bad, message in [
        ({"where": ["colour=red"]}, "no field 'colour'"),
        ({"where": ["camera>=x"]}, "compare it with = or !="),
        ({"where": ["rating=high"]}, "rating is a number"),
        ({"where": ["rating"]}, "give FIELD=VALUE"),
        ({"after": "June"}, "YYYY-MM-DD"),
        ({"near": "1,2"}, "LAT,LON,KM"),
        ({"near": "91,0,1"}, "latitude"),
        ({"after": "2020-01-01", "before": "2019-01-01"}, "nothing could pass"),
    ]:
        with pytest.raises(QueryError, match=message):
            build_filter(types=types, **bad)


@pytest.mark.parametrize("name", ["camera!=Pixel (90%)", "before 2024 (about 80%)", "one year (10%)",
                                  "rare-folder (0.1%)", "nothing passes"])
def test_filtered_dense_through_the_graphs(tmp_path, monkeypatch, name):
    """Dense search with graphs (one spanning the five full shards, one for the last): a filter
    that keeps most documents walks the graphs and keeps only passing rows (recall against
    brute force among them, exact scores); a narrow one scores every passing vector (exact)."""
    graphs_at_any_size(monkeypatch, 512)
    backend = LocalBackend(tmp_path / "idx")
    backend.open(IndexIdentity(fingerprint="f" * 32, dense_dim=DIM, model="synthetic"), create=True)
    backend.declare_fields(FIELD_TYPES)
    backend.upsert(DOCS)
    assert backend._search_state().dense_units() == [(0, 5), (5, 1)]
    f = FILTERS[name]
    passing = kept(f)
    by_id = {d.id: d for d in passing}
    rng = np.random.default_rng(3)
    found = 0
    for _ in range(20):
        vector = rng.normal(size=DIM).astype(np.float32)
        hits = backend.dense_search(vector, 10, explain=0, filters=f)
        want = brute_force_dense(passing, vector)[:10] if passing else []
        assert len(hits) == len(want) and all(h.id in by_id for h in hits)
        np.testing.assert_allclose([h.score for h in hits], [float(np.dot(by_id[h.id].dense, vector)) for h in hits],
                                   rtol=1e-5, atol=1e-6)
        if len(passing) < 0.3 * N:
            close(ids_scores(hits), want)
        found += len({h.id for h in hits} & {i for i, _ in want})
    assert found >= 0.9 * 20 * min(10, len(passing)) or not passing
    backend.close()
