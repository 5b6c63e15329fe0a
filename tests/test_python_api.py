"""The public Python API (docs/python-api.md): a light import, encoders that give what the index
stores and searches with, searches identical to `d2s-search query --json`, ingest reports
identical to `ingest --json`, clear errors, and the search page mounted in another app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import d2s_search
from d2s_search.errors import (
    BundleError,
    D2SError,
    ImageInputError,
    IndexStoreError,
    QueryError,
    QueryImageError,
    SettingsError,
)
from tests.helpers import clean_env, run_cli_json, write_image

ROOT = Path(__file__).resolve().parents[1]
MODES = ("sparse", "two-phase", "dense", "hybrid")


@pytest.fixture(scope="module")
def api_index(tmp_path_factory, tiny_blip_bundle, image_folder) -> Path:
    """The 40 generated photos, ingested through the API."""
    path = tmp_path_factory.mktemp("api") / "index"
    with d2s_search.Index.open(path, bundle=tiny_blip_bundle, create=True, device="cpu") as index:
        report = index.ingest([image_folder])
    assert report.stored == 40 and report.exit_code == 0
    return path


def _modules_after(script: str, tmp_path: Path) -> set[str]:
    out = subprocess.run([sys.executable, "-c", script + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, env=clean_env(tmp_path), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


# --- a light import ------------------------------------------------------------------------


def test_import_loads_no_model_runtime_nor_numpy(tmp_path):
    loaded = _modules_after("import d2s_search", tmp_path)
    assert not _top(loaded) & {"torch", "onnxruntime", "numpy", "scipy", "PIL", "tokenizers", "fastapi", "click"}
    # Nothing at all but the package itself: not even typing (the exports load on first use).
    assert loaded - _modules_after("pass", tmp_path) == {"d2s_search"}


def test_every_public_name_resolves_without_onnxruntime_or_torch(tmp_path):
    script = "import d2s_search\nfor name in d2s_search.__all__:\n    getattr(d2s_search, name)"
    loaded = _top(_modules_after(script, tmp_path))
    assert "numpy" in loaded  # the encoders' module needs it: proof that the names really loaded
    assert not loaded & {"torch", "transformers", "onnxruntime", "click"}
    assert sorted(d2s_search.__all__) == sorted(["D2SError", "Encoder", "Encoding", "Hit", "Index", "IngestReport",
                                                 "Metadata", "SearchFilter", "SearchResult", "UpdateReport",
                                                 "WatchBatch", "Watching", "search_app", "__version__"])
    assert d2s_search.Hit is __import__("d2s_search.backends.base", fromlist=["Hit"]).Hit
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        d2s_search.nothing  # noqa: B018


def test_onnxruntime_loads_with_the_first_encoder_only(tmp_path, api_index, tiny_blip_bundle):
    opened = f"import d2s_search\nindex = d2s_search.Index.open({str(api_index)!r}, device='cpu')\nindex.stats()"
    assert not _top(_modules_after(opened, tmp_path)) & {"onnxruntime", "torch"}
    searched = _top(_modules_after(opened + "\nindex.search('a dog')", tmp_path))
    assert "onnxruntime" in searched and not searched & {"torch", "PIL"}  # a text query decodes no picture
    loaded = _top(_modules_after(f"import d2s_search\nd2s_search.Encoder.load({str(tiny_blip_bundle)!r})", tmp_path))
    assert "onnxruntime" in loaded and "torch" not in loaded


# --- one path: the API and the command line give the same answers ---------------------------


def _same(printed, expected, exact: bool, where: str = "") -> None:
    """The same JSON value; with ``exact`` False, floats agree to 1e-5 (relative)."""
    if isinstance(expected, float) and not exact:
        assert printed == pytest.approx(expected, rel=1e-5, abs=1e-7), where
    elif isinstance(expected, dict):
        assert isinstance(printed, dict) and printed.keys() == expected.keys(), where
        for key in expected:
            _same(printed[key], expected[key], exact, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(printed, list) and len(printed) == len(expected), where
        for n, (a, b) in enumerate(zip(printed, expected)):
            _same(a, b, exact, f"{where}[{n}]")
    else:
        assert printed == expected, where


@pytest.mark.parametrize("mode", MODES)
def test_cli_query_json_and_api_give_identical_hits(mode, api_index, image_folder, capsys):
    """Same hits, in the same order, with the same paths and matched words. A text query run
    by the command loads its text graph without pre-packed weights (a one-query process starts
    0.3-0.5 s sooner; encoder.make_session), which rounds the last bit of some weights
    differently (1.8e-7 here): text scores agree to 1e-5, picture queries to the bit."""
    picture = next(image_folder.rglob("*.jpg"))
    for query, flags, kwargs in (("dogs in a car", [], {}), (None, ["--image", picture], {"image": picture})):
        args = ["query", *([query] if query else []), *flags, "--index", api_index, "--mode", mode, "-k", "7",
                "--no-serve"]
        code, printed = run_cli_json(args, capsys)
        assert code == 0
        with d2s_search.Index.open(api_index) as index:
            result = index.search(query, mode=mode, k=7, **kwargs)
        assert len(result.hits) == 7
        expected = json.loads(json.dumps(result.to_json()))
        for key in ("took_ms",):  # a clock, not an answer
            expected.pop(key), printed.pop(key)
        if mode == "two-phase":  # the command's advice beside the answer
            assert printed.pop("note").startswith("on the local index two-phase misses")
        assert [(r["id"], r["path"]) for r in printed["results"]] == [(h.id, h.path) for h in result.hits]
        _same(printed, expected, exact=query is None)


def test_search_by_picture_finds_that_picture_first(api_index, image_folder):
    picture = sorted(image_folder.rglob("*.png"))[3]
    with d2s_search.Index.open(api_index) as index:
        for mode in ("dense", "hybrid"):
            assert index.search(image=picture, mode=mode, k=3).hits[0].path == str(picture.resolve())
        from PIL import Image

        with Image.open(picture) as opened:  # a PIL image does as well as its path
            assert [h.id for h in index.search(image=opened.convert("RGB"), mode="dense", k=5).hits] == \
                   [h.id for h in index.search(image=picture, mode="dense", k=5).hits]


def test_ingest_report_is_the_cli_report(tmp_path, tiny_blip_bundle, image_folder, capsys):
    bad = tmp_path / "bad"
    write_image(bad / "good.jpg", seed=900)
    (bad / "broken.jpg").write_bytes(b"not a picture")
    code, printed = run_cli_json(["ingest", image_folder, bad, "--index", tmp_path / "cli", "--bundle",
                                  tiny_blip_bundle], capsys)
    calls = []
    with d2s_search.Index.open(tmp_path / "api", bundle=tiny_blip_bundle, create=True) as index:
        report = index.ingest([image_folder, bad], progress=lambda *a: calls.append(a))
        assert index.stats()["documents"] == 41
    clocks = ("seconds", "images_per_second", "search_structures_seconds")
    produced = {k: v for k, v in report.to_json().items() if k not in clocks}
    assert code == report.exit_code == 3
    assert {k: v for k, v in printed.items() if k not in clocks} == produced | {"exit_code": 3}
    assert produced["stored"] == 41 and [r["path"] for r in produced["rejected"]] == [str(bad / "broken.jpg")]
    # progress(done, found, stored): found from the start, done and stored only grow, and end whole
    assert calls[0] == (0, 42, 0) and calls[-1] == (42, 42, 41)
    assert all(a[0] <= b[0] and a[2] <= b[2] and b[1] == 42 for a, b in zip(calls, calls[1:]))


def test_a_new_index_left_empty_is_removed_as_the_command_does(tmp_path, tiny_blip_bundle):
    index = d2s_search.Index.open(tmp_path / "new", bundle=tiny_blip_bundle, create=True)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"nope")
    report = index.ingest(tmp_path / "photos")
    assert report.stored == 0 and report.exit_code == 1 and report.nothing_stored
    assert not (tmp_path / "new").exists()
    with pytest.raises(IndexStoreError, match="closed"):
        index.search("a dog")


def test_an_ingest_stopped_midway_keeps_what_it_stored_and_the_index_open(tmp_path, tiny_blip_bundle,
                                                                          image_folder):
    class Stop(Exception):
        pass

    def stop_after_two_batches(done: int, found: int, stored: int) -> None:
        if stored >= 16:
            raise Stop  # as Ctrl+C would, from inside the run

    with d2s_search.Index.open(tmp_path / "new", bundle=tiny_blip_bundle, create=True) as index:
        with pytest.raises(Stop):
            index.ingest(image_folder, batch_size=8, progress=stop_after_two_batches)
        assert index.stats()["documents"] == 16  # every finished batch is kept, the index stays usable
        assert len(index.search("a dog", k=40).hits) == 16
        assert index.ingest(image_folder, batch_size=8).stored == 24  # the same call again does the rest


# --- encoders ------------------------------------------------------------------------------


def test_encoder_gives_what_the_index_stores_and_searches_with(api_index, image_folder, tiny_blip_bundle):
    from d2s_search.search import encode_text_query

    encoder = d2s_search.Encoder.load(tiny_blip_bundle, device="cpu")
    assert encoder.dense_dim == 16 and encoder.model == "tiny-blip"
    pictures = sorted(image_folder.rglob("*.jpg"))[:3]
    encoded = encoder.encode_images(pictures)
    with d2s_search.Index.open(api_index) as index:
        stored = {d.path: d for d in index._backend.get([h.id for h in index.search(image=pictures[0], k=40).hits])}
        for picture, enc in zip(pictures, encoded):
            doc = stored[str(picture.resolve())]
            # Every positive word, the same weights (ingest ran batches of 32: the last bits may differ).
            assert enc.sparse.keys() == doc.sparse.keys()
            np.testing.assert_allclose([enc.sparse[t] for t in doc.sparse], list(doc.sparse.values()), rtol=1e-5)
            np.testing.assert_allclose(enc.dense, doc.dense, rtol=1e-5, atol=1e-7)
        texts = ["dogs in a car", "a red bicycle"]
        for text in texts:  # one text: to the bit what a search by it searches with
            enc = encoder.encode_text([text])[0]
            query = encode_text_query(index._encoder(), text)
            assert enc.sparse == query.full and enc.top(3) == sorted(query.full.items(), key=lambda kv: -kv[1])[:3]
            np.testing.assert_array_equal(enc.dense, query.dense)
            assert enc.sparse.keys() == encoder.encode_text(texts)[texts.index(text)].sparse.keys()
    # Batches of 32 (padded together) give the same words and weights to float32 rounding.
    many = encoder.encode_text([f"photo number {i}" for i in range(40)])
    alone = encoder.encode_text(["photo number 37"])[0].sparse
    assert len(many) == 40 and many[37].sparse.keys() == alone.keys()
    np.testing.assert_allclose([many[37].sparse[t] for t in alone], list(alone.values()), rtol=1e-5, atol=1e-7)
    assert [len(e.sparse) for e in encoder.encode_images(pictures, top_k=5)] == [5, 5, 5]


# --- errors: one line, a D2SError --------------------------------------------------------------


def test_bad_input_is_a_one_line_d2s_error(tmp_path, api_index, tiny_blip_bundle):
    cases = [
        (lambda: d2s_search.Index.open(tmp_path / "none"), IndexStoreError, "no index at"),
        (lambda: d2s_search.Index.open(backend="opensearch"), SettingsError, "needs url="),
        (lambda: d2s_search.Index.open(api_index, backend="solr"), SettingsError, "unknown backend 'solr'"),
        (lambda: d2s_search.Index.open(backend="elasticsearch"), SettingsError, "needs url="),
        (lambda: d2s_search.search_app(backend="opensearch"), SettingsError, "needs url="),
        (lambda: d2s_search.Index.open(api_index, device="tpu"), SettingsError, "unknown device 'tpu'"),
        (lambda: d2s_search.Encoder.load(tiny_blip_bundle, device="tpu"), SettingsError, "unknown device 'tpu'"),
        (lambda: d2s_search.Encoder.load(tmp_path / "no-bundle"), BundleError, "no model bundle at"),
    ]
    with d2s_search.Index.open(api_index) as index:
        cases += [
            (lambda: index.search("dogs", image=tmp_path / "x.jpg"), QueryImageError, "x.jpg as a query"),
            (lambda: index.search(), QueryError, "give text, image=, or both"),
            (lambda: index.search("dogs", mode="fuzzy"), QueryError, "unknown mode 'fuzzy'"),
            (lambda: index.search("dogs", k=0), QueryError, "k must be"),
            (lambda: index.search("   "), QueryError, "the query is empty"),
            (lambda: index.search(image=tmp_path / "missing.jpg"), QueryImageError, "missing.jpg as a query"),
            (lambda: index.ingest([]), QueryError, "at least one path"),
            (lambda: index.encoder.encode_text("dogs"), QueryError, "takes a list of texts"),
            (lambda: index.encoder.encode_images([42]), ImageInputError, "not a picture: int"),
            (lambda: index.encoder.encode_images([tmp_path]), ImageInputError, "cannot use"),
        ]
        for call, error, words in cases:
            with pytest.raises(error, match=words) as caught:
                call()
            assert isinstance(caught.value, D2SError) and "\n" not in str(caught.value)


def test_a_local_index_is_used_from_the_thread_that_opened_it(api_index):
    import threading

    caught = []
    with d2s_search.Index.open(api_index) as index:
        def other() -> None:
            try:
                index.stats()
            except D2SError as exc:
                caught.append(exc)

        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert index.stats()["documents"] == 40  # its own thread still may
    assert len(caught) == 1 and isinstance(caught[0], IndexStoreError)
    assert "opened in another thread: open one Index per thread" in str(caught[0])


def test_the_api_does_not_become_the_index_used_last(tmp_path, api_index):
    from d2s_search import settings

    before = settings.last_index()
    with d2s_search.Index.open(api_index) as index:
        index.search("a dog")
    assert settings.last_index() == before


# --- the search page mounted in another app ---------------------------------------------------


def test_search_app_mounted_under_a_prefix(tmp_path, api_index):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    host = FastAPI()
    host.mount("/photos", d2s_search.search_app(api_index, device="cpu", thumbnail_dir=tmp_path / "thumbs"))
    with d2s_search.Index.open(api_index) as index:
        expected = index.search("dogs in a car", k=5)
    with TestClient(host) as client:  # a mounted app gets no startup: it opens at the first request
        answer = client.get("/photos/api/search", params={"q": "dogs in a car", "k": 5})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [(r["id"], r["score"]) for r in results] == [(h.id, h.score) for h in expected.hits]
        thumbnail = results[0]["thumbnail"]
        assert thumbnail == f"/photos/api/documents/{results[0]['id']}/thumbnail"
        picture = client.get(thumbnail)
        assert picture.status_code == 200 and picture.headers["content-type"].startswith("image/")
        page = client.get("/photos/")
        assert page.status_code == 200 and 'src="static/app.js"' in page.text and '"/static' not in page.text
        assert client.get("/photos/static/app.js").status_code == 200
        assert client.get("/photos/api/status").json()["documents"] == 40
