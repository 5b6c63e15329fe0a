"""The JSON API of `d2s-search serve`: every endpoint, good and bad input."""

from __future__ import annotations

import io
import math
import shutil

import pytest
from PIL import Image

from d2s_search.backends.local import LocalBackend
from d2s_search.backends.opensearch.features import lucene_feature_value
from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder
from d2s_search.images import content_id
from d2s_search.inflections import inflections
from d2s_search.search import SearchOptions, encode_text_query, run_query
from tests.helpers import jpeg_bytes, write_image
from tests.serve.conftest import make_app, make_index

infl = inflections()

MODES = ("sparse", "two-phase", "dense", "hybrid")
MISSING_ID = "0" * 64


@pytest.fixture(scope="module")
def direct(tiny_blip_bundle, serve_index):
    """The same index searched without the web app: the reference for the API's answers."""
    bundle = Bundle.load(tiny_blip_bundle)
    backend = LocalBackend(serve_index)
    backend.open(bundle.identity(), create=False)
    yield Encoder(bundle, device="cpu"), backend
    backend.close()


@pytest.fixture(scope="module")
def a_doc(direct) -> str:
    _, backend = direct
    (doc_id,) = [r[0] for r in backend._connect(False).execute("SELECT id FROM docs ORDER BY seq LIMIT 1")]
    return doc_id


def problem(response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"detail", "field"} and isinstance(body["detail"], str)
    for word in words:
        assert word in body["detail"], body
    return body


# --- search by text -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_text_search_matches_the_query_plan(client, direct, mode):
    encoder, backend = direct
    response = client.get("/api/search", params={"q": "a dog in a car", "mode": mode, "k": 7})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["mode"] == mode and body["k"] == 7
    assert body["query"] == {"kind": "text", "text": "a dog in a car", "filename": None, "id": None}
    want = run_query(backend, encode_text_query(encoder, "a dog in a car"), SearchOptions(mode=mode, k=7, explain=8))
    assert [r["id"] for r in body["results"]] == [h.id for h in want.hits]
    assert [r["score"] for r in body["results"]] == pytest.approx([h.score for h in want.hits], rel=1e-5)
    # Two-phase reaches only pictures with one of the query's own words among their 64.
    assert len(body["results"]) == 7 or (mode == "two-phase" and body["results"])
    assert [r["rank"] for r in body["results"]] == list(range(1, len(body["results"]) + 1))
    for r in body["results"]:
        assert r["matched"] and all(m["contribution"] > 0 for m in r["matched"])
        assert r["thumbnail"] == f"/api/documents/{r['id']}/thumbnail"
        assert r["name"].endswith((".jpg", ".png")) and r["path"].endswith(r["name"])
    assert (mode == "hybrid") == all(r["parts"] for r in body["results"])
    assert body["encode_ms"] > 0 and body["search_ms"] >= 0
    terms = body["query_terms"]
    assert 0 < len(terms) <= 50 and terms == sorted(terms, key=lambda t: -t["weight"])


def test_query_terms_mark_the_typed_words(client):
    # The tiny random head happens to weigh "herbs" and "meadow" among its strongest words.
    body = client.get("/api/search", params={"q": "herbs in a meadow"}).json()
    assert {t["term"] for t in body["query_terms"] if t["own"]} == {"herbs", "meadow"}
    assert sum(not t["own"] for t in body["query_terms"]) > 40  # the rest are expansion words
    # "snow" is not among its 50 strongest: nothing is marked typed (no strongest-term stand-ins).
    assert not any(t["own"] for t in client.get("/api/search", params={"q": "snow"}).json()["query_terms"])


def test_edited_text_search_says_what_it_changed(client, direct):
    encoder, backend = direct
    body = client.get("/api/search", params={"q": "herbs^2 in a meadow -dog +herbs", "k": 7}).json()
    assert body["query_edits"] == {"required": ["herbs"], "excluded": ["dog"],
                                   "weighted": [{"term": "herbs", "factor": 2.0}]}
    want = run_query(backend, encode_text_query(encoder, "herbs^2 in a meadow -dog +herbs"), SearchOptions(k=7))
    assert [r["id"] for r in body["results"]] == [h.id for h in want.hits]
    assert "dog" not in {t["term"] for t in body["query_terms"]}
    assert client.get("/api/search", params={"q": "herbs"}).json()["query_edits"] is None
    assert client.get("/api/search", params={"q": "herbs^x"}).status_code == 400


def test_hybrid_options_change_the_fusion(client):
    params = {"q": "two children on the beach", "mode": "hybrid", "k": 10}
    minmax = client.get("/api/search", params=params | {"alpha": 0.0}).json()["results"]
    dense = client.get("/api/search", params=params | {"alpha": 1.0}).json()["results"]
    rrf = client.get("/api/search", params=params | {"fusion": "rrf"}).json()["results"]
    assert [r["id"] for r in minmax] != [r["id"] for r in dense]
    assert max(r["score"] for r in rrf) < 2 / 61 + 1e-9  # RRF scores, not min-max ones


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({}, "q", ["q: missing"]),
        ({"q": ""}, None, ["the query is empty"]),
        ({"q": "   "}, None, ["the query is empty"]),
        ({"q": "dog", "mode": "fuzzy"}, "mode", ["mode:", "'sparse'", "'hybrid'"]),
        ({"q": "dog", "k": 0}, "k", ["k:", "greater than or equal to 1"]),
        ({"q": "dog", "k": 201}, "k", ["k:", "less than or equal to 200"]),
        ({"q": "dog", "k": "ten"}, "k", ["k:", "integer"]),
        ({"q": "dog", "alpha": 1.5}, "alpha", ["alpha:"]),
        ({"q": "dog", "fusion": "sum"}, "fusion", ["fusion:", "'rrf'"]),
        ({"q": "dog", "window": 0}, "window", ["window:"]),
        ({"q": "dog " * 300}, "q", ["q:", "at most 1000 characters"]),
    ],
)
def test_text_search_rejects_bad_input(client, params, field, words):
    body = problem(client.get("/api/search", params=params), 400, *words)
    assert body["field"] == field


# --- search by picture --------------------------------------------------------------------


def test_image_search_finds_the_same_picture_first(client, image_folder, direct):
    _, backend = direct
    path = sorted(image_folder.rglob("*.jpg"))[3]
    data = path.read_bytes()
    response = client.post("/api/search/image", params={"mode": "dense", "k": 5}, files={"image": (path.name, data, "image/jpeg")})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["query"]["kind"] == "image" and body["query"]["filename"] == path.name
    assert body["results"][0]["id"] == content_id(data)  # its own dense vector is the nearest
    assert len(body["results"]) == 5 and body["query_terms"] and not any(t["own"] for t in body["query_terms"])
    sparse = client.post("/api/search/image", params={"mode": "two-phase"}, files={"image": ("q.png", _png(7), "image/png")})
    assert sparse.status_code == 200 and sparse.json()["mode"] == "two-phase"


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(jpeg_bytes(seed))).save(buf, "PNG")
    return buf.getvalue()


def test_image_search_rejects_what_is_not_a_picture(client, monkeypatch):
    post = client.post
    problem(post("/api/search/image", files={"image": ("notes.txt", b"hello, not a picture", "text/plain")}), 415,
            "cannot search by this file", "not an image")
    problem(post("/api/search/image", files={"image": ("cut.jpg", jpeg_bytes(1)[:300], "image/jpeg")}), 415,
            "corrupt or truncated")
    problem(post("/api/search/image", files={"image": ("empty.jpg", b"", "image/jpeg")}), 400, "empty")
    body = problem(post("/api/search/image", data={"something": "else"}), 400, "image: missing")
    assert body["field"] == "image"
    problem(post("/api/search/image", params={"k": 0}, files={"image": ("a.jpg", jpeg_bytes(1), "image/jpeg")}), 400, "k:")
    from d2s_search.serve import api

    monkeypatch.setattr(api, "UPLOAD_MAX_BYTES", 1000)
    problem(post("/api/search/image", files={"image": ("big.jpg", jpeg_bytes(2, (400, 300)), "image/jpeg")}), 413, "MiB")


# --- more like this, documents, pictures ----------------------------------------------------


def test_more_like_this_uses_the_documents_own_vectors(client, direct, a_doc):
    _, backend = direct
    (doc,) = backend.get([a_doc])
    for mode in MODES:
        body = client.get(f"/api/documents/{a_doc}/similar", params={"mode": mode, "k": 6}).json()
        assert body["mode"] == mode and body["query"]["kind"] == "document" and body["query"]["id"] == a_doc
        ids = [r["id"] for r in body["results"]]
        assert len(ids) == 6 and a_doc not in ids  # the picture itself is left out
    sparse = client.get(f"/api/documents/{a_doc}/similar", params={"k": 5}).json()
    from d2s_search.search import QueryVectors

    want = run_query(backend, QueryVectors(doc.sparse, doc.sparse, doc.dense), SearchOptions(k=6)).hits
    assert [r["id"] for r in sparse["results"]] == [h.id for h in want if h.id != a_doc][:5]


def test_document_detail_has_the_whole_word_list(client, direct, a_doc):
    _, backend = direct
    (doc,) = backend.get([a_doc])
    body = client.get(f"/api/documents/{a_doc}").json()
    assert body["id"] == a_doc and body["path"] == doc.path and body["width"] == doc.width
    assert body["term_count"] == len(body["terms"]) == len(doc.sparse) == 64
    weights = [t["weight"] for t in body["terms"]]
    assert weights == sorted(weights, reverse=True)
    assert {t["term"]: t["weight"] for t in body["terms"]} == pytest.approx(doc.sparse)
    assert body["ingested_at"].endswith("Z") and body["preview"].endswith("/preview")


@pytest.mark.parametrize("suffix", ["", "/similar", "/thumbnail", "/preview"])
def test_unknown_and_malformed_ids(client, suffix):
    body = problem(client.get(f"/api/documents/{MISSING_ID}{suffix}"), 404, "no document with id")
    assert body["field"] == "doc_id"
    problem(client.get(f"/api/documents/not-an-id{suffix}"), 400, "64 hex digits")
    problem(client.get(f"/api/documents/{'g' * 64}{suffix}"), 400, "64 hex digits")


def test_paths_are_never_taken_from_the_request(client):
    for url in ("/api/documents/..%2F..%2Fetc%2Fpasswd/thumbnail", "/api/documents/%2Fetc%2Fpasswd/preview",
                "/api/documents/../../etc/passwd"):
        response = client.get(url)
        assert response.status_code in (400, 404) and response.headers["content-type"] == "application/json"


def test_thumbnails_are_made_once_and_cached(client, a_doc, thumbnail_dir):
    cached = thumbnail_dir / "thumbnail" / a_doc[:2] / f"{a_doc}.jpg"
    cached.unlink(missing_ok=True)
    first = client.get(f"/api/documents/{a_doc}/thumbnail")
    assert first.status_code == 200 and first.headers["content-type"] == "image/jpeg"
    assert "immutable" in first.headers["cache-control"]
    image = Image.open(io.BytesIO(first.content))
    assert image.format == "JPEG" and max(image.size) <= 320
    assert cached.is_file()
    stamp = cached.stat().st_mtime_ns
    assert client.get(f"/api/documents/{a_doc}/thumbnail").content == first.content
    assert cached.stat().st_mtime_ns == stamp  # served from the cache, not made again
    preview = client.get(f"/api/documents/{a_doc}/preview")
    assert preview.status_code == 200 and Image.open(io.BytesIO(preview.content)).size == (96, 72)  # never upscaled


def test_pictures_follow_the_index_not_the_disk(tmp_path, tiny_blip_bundle):
    """A file changed since ingest gets no picture; a deleted document loses its cached one."""
    from fastapi.testclient import TestClient

    folder = tmp_path / "photos"
    changed, kept = write_image(folder / "changed.jpg", seed=1), write_image(folder / "kept.jpg", seed=2)
    changed_id, kept_id = content_id(changed.read_bytes()), content_id(kept.read_bytes())
    index = make_index(tmp_path / "index", tiny_blip_bundle, folder)
    shutil.copyfile(folder / "kept.jpg", folder / "changed.jpg")  # new bytes under the old path
    app = make_app(tiny_blip_bundle, index, tmp_path / "thumbs", allowed_hosts=["127.0.0.1", "localhost"], warm_up=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        problem(client.get(f"/api/documents/{changed_id}/thumbnail"), 404, "changed since it was indexed")
        assert client.get(f"/api/documents/{kept_id}/thumbnail").status_code == 200
        other = LocalBackend(index)
        other.open(None, create=False)
        assert other.delete([kept_id]) == 1
        other.close()
        problem(client.get(f"/api/documents/{kept_id}/thumbnail"), 404, "no document")
        assert client.get("/api/status").json()["documents"] == 1
        # Other host names are refused (DNS rebinding): the page only answers its own address.
        assert client.get("/api/status", headers={"host": "evil.example"}).status_code == 400


# --- status, docs, page ---------------------------------------------------------------------


def test_status(client, tiny_blip_bundle, serve_index):
    body = client.get("/api/status").json()
    assert body["documents"] == 40 and body["backend"] == "local" and body["location"] == str(serve_index)
    assert body["bundle"]["model"] == "tiny-blip" and body["bundle"]["fingerprint"] == Bundle.load(tiny_blip_bundle).fingerprint
    assert body["bundle"]["head_trained"] is False
    assert body["last_ingest_at"].endswith("Z") and body["distinct_terms"] > 64 and body["disk_bytes"] > 0
    assert body["modes"] == list(MODES) and body["k_max"] == 200


def test_openapi_docs_and_the_page(client):
    spec = client.get("/openapi.json").json()
    for path in ("/api/search", "/api/search/image", "/api/documents/{doc_id}", "/api/documents/{doc_id}/similar",
                 "/api/documents/{doc_id}/thumbnail", "/api/documents/{doc_id}/preview", "/api/status"):
        assert path in spec["paths"], path
    mode = next(p for p in spec["paths"]["/api/search"]["get"]["parameters"] if p["name"] == "mode")
    assert mode["schema"]["enum"] == list(MODES)
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    page = client.get("/")
    assert page.status_code == 200 and 'src="static/app.js"' in page.text and page.headers["content-type"].startswith("text/html")
    assert client.get("/static/app.js").status_code == 200 and client.get("/static/app.css").status_code == 200
    problem(client.get("/api/nothing-here"), 404, "no such page")


def test_weak_queries_are_flagged(client):
    body = client.get("/api/search", params={"q": "qwertyuiop"}).json()
    assert body["weak_query"] is True and body["unrecognised_words"] == ["qwertyuiop"]
    assert "no word the model knows" in body["notice"] and body["results"]
    body = client.get("/api/search", params={"q": "herbs in a meadow"}).json()
    assert body["weak_query"] is False and body["notice"] is None


def test_loopback_names_are_answered_and_others_refused(tmp_path, tiny_blip_bundle, image_folder):
    """The DNS-rebinding guard understands IPv6 literals: http://[::1]:8000/ is the page's own address."""
    from fastapi.testclient import TestClient

    index = make_index(tmp_path / "index", tiny_blip_bundle, image_folder)
    app = make_app(tiny_blip_bundle, index, tmp_path / "thumbs", allowed_hosts=["127.0.0.1", "localhost", "[::1]"],
                   warm_up=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for host in ("[::1]:8000", "[::1]", "localhost:8000", "LOCALHOST", "127.0.0.1:8000"):
            assert client.get("/api/status", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8000", "[::2]:8000", "127.0.0.2", "localhost.evil.example", ""):
            answer = client.get("/api/status", headers={"host": host})
            assert answer.status_code == 400 and answer.text == "Invalid host header", host


def test_a_documents_words_go_by_weight_with_idf_from_a_brute_force_count(client, direct, a_doc):
    _, backend = direct
    docs = backend.get([r[0] for r in backend._connect(False).execute("SELECT id FROM docs")])
    df = {}
    for doc in docs:
        for term in doc.sparse:
            df[term] = df.get(term, 0) + 1
    body = client.get(f"/api/documents/{a_doc}").json()
    stored = {t["term"]: t["weight"] for t in body["terms"]}
    words = body["words"]
    assert sorted(t for w in words for t in w["terms"]) == sorted(stored)  # every term, once
    for w in words:  # its strongest form names it and gives its weight and IDF
        assert w["terms"][0] == w["word"] and w["weight"] == stored[w["word"]] == max(stored[t] for t in w["terms"])
        assert w["idf"] == pytest.approx(math.log(len(docs) / df[w["word"]]))
        assert len({infl.key(t) for t in w["terms"]}) == 1  # forms of one word
    assert len({infl.key(w["word"]) for w in words}) == len(words)  # each word once
    keys = [(-w["weight"], w["word"]) for w in words]  # strongest first, each with its IDF
    assert keys == sorted(keys)


def test_matched_words_sum_their_forms_contributions(client, direct):
    encoder, backend = direct
    body = client.get("/api/search", params={"q": "two dogs and a dog in cars", "k": 6, "explain": 8}).json()
    query = encode_text_query(encoder, "two dogs and a dog in cars").full
    assert infl.groups_several(query)  # the case that matters: two forms of a word in the query
    for r in body["results"]:
        (doc,) = backend.get([r["id"]])
        sums: dict[str, list] = {}
        for term in set(query) & set(doc.sparse):
            sums.setdefault(infl.key(term), []).append((term, query[term] * lucene_feature_value(doc.sparse[term])))
        # named by the form that contributed most, the sum of its forms' contributions
        want = sorted(((min(f, key=lambda tc: (-tc[1], tc[0]))[0], math.fsum(c for _, c in f)) for f in sums.values()),
                      key=lambda wc: (-wc[1], wc[0]))[:8]
        got = [(w["word"], w["contribution"]) for w in r["words"]]
        assert [g[0] for g in got] == [w[0] for w in want]
        assert [g[1] for g in got] == pytest.approx([w[1] for w in want], rel=1e-5)
    # the query's 50 strongest terms, one entry per word, each its strongest form's weight
    shown = [infl.key(w["word"]) for w in body["query_words"]]
    weights = {t["term"]: t["weight"] for t in body["query_terms"]}
    assert len(shown) == len(set(shown)) and sorted(t for w in body["query_words"] for t in w["terms"]) == sorted(weights)
    assert all(w["weight"] == max(weights[t] for t in w["terms"]) for w in body["query_words"])
