"""The Python API on OpenSearch (osmem): Index.open(url=...) ingests, counts and searches as the
commands do against the same cluster index."""

from __future__ import annotations

import pytest

import d2s_search
from d2s_search.errors import BundleMismatchError
from tests.helpers import run_cli_json


def test_the_api_on_a_cluster_answers_as_the_command(image_folder, tiny_blip_bundle, osmem_url, capsys):
    with d2s_search.Index.open(url=osmem_url, index_name="api", bundle=tiny_blip_bundle, create=True) as index:
        assert index.backend_name == "opensearch" and index.location.endswith("/api")
        report = index.ingest([image_folder], batch_size=16)
        assert (report.stored, report.exit_code) == (40, 0)
        assert index.stats()["documents"] == 40
    picture = sorted(image_folder.rglob("*.jpg"))[4]
    for mode in ("sparse", "two-phase"):  # osmem has no kNN
        for text, flags, kwargs in (("dogs in a car", [], {}), (None, ["--image", picture], {"image": picture})):
            code, printed = run_cli_json(["query", *([text] if text else []), *flags, "--url", osmem_url,
                                          "--index-name", "api", "--mode", mode, "-k", "6"], capsys)
            assert code == 0, printed
            with d2s_search.Index.open(url=osmem_url, index_name="api") as index:
                result = index.search(text, mode=mode, k=6, **kwargs)
            assert len(result.hits) == 6
            assert [(r["id"], r["path"]) for r in printed["results"]] == [(h.id, h.path) for h in result.hits]
            assert [r["score"] for r in printed["results"]] == pytest.approx([h.score for h in result.hits], rel=1e-5)


def test_another_bundle_is_refused_on_a_cluster_too(tiny_blip_bundle, tiny_clip_bundle, osmem_url, image_folder):
    with d2s_search.Index.open(url=osmem_url, index_name="api-refuse", bundle=tiny_blip_bundle, create=True) as index:
        index.ingest(sorted(image_folder.rglob("*.png"))[:2])
    with pytest.raises(BundleMismatchError, match="was filled with bundle"):
        d2s_search.Index.open(url=osmem_url, index_name="api-refuse", bundle=tiny_clip_bundle)
