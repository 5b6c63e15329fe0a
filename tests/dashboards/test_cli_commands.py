"""The commands of this feature, run in-process with click ."""

from __future__ import annotations

import json
import zipfile

import pytest
from click.testing import CliRunner
from d2s_dash_fake_cluster import LOCAL_FILE

from d2s_search.backends.opensearch.ml_commons import MLCommonsUnavailable
from d2s_search.cli.cluster import register_model
from d2s_search.cli.serve import serve_images


def run(command, args, env=None):
    return CliRunner().invoke(command, [str(a) for a in args], env=env or {}, standalone_mode=False,
                              catch_exceptions=True)


def test_package_only_writes_the_zip_without_a_cluster(tiny_blip_bundle, tmp_path):
    out = tmp_path / "out" / "model.zip"
    result = run(register_model, ["--bundle", tiny_blip_bundle, "--package-only", "--zip-out", out, "--json"])
    assert result.exception is None, result.output
    payload = json.loads(result.stdout)
    assert payload["zip"] == str(out) and zipfile.is_zipfile(out) and payload["dropped_terms"]["needs escaping"] >= 2


def test_package_only_needs_zip_out(tiny_blip_bundle):
    result = run(register_model, ["--bundle", tiny_blip_bundle, "--package-only"])
    assert "needs --zip-out" in str(result.exception)


def test_register_model_end_to_end(make_cluster, tiny_blip_bundle):
    cluster = make_cluster(settings={}, task_polls=1)
    result = run(register_model, ["--bundle", tiny_blip_bundle, "--url", cluster.url, "--configure-cluster",
                                  "--max-query-terms", "50", "--json"])
    assert result.exception is None, result.output
    payload = json.loads(result.stdout)
    assert payload["state"] == "DEPLOYED" and payload["search_template"] == "d2s-sparse"
    assert cluster.settings[LOCAL_FILE] is True
    assert cluster.models[payload["model_id"]].meta["model_content_hash_value"] == payload["zip_sha256"]
    assert "d2s-sparse" in cluster.scripts

    again = run(register_model, ["--bundle", tiny_blip_bundle, "--url", cluster.url, "--max-query-terms", "50"])
    assert again.exception is None and "already registered and deployed" in again.output
    assert "neural_sparse" in again.output and payload["model_id"] in again.output


def test_register_model_uses_the_bundle_that_filled_the_index(make_cluster, tiny_blip_bundle, tiny_clip_bundle):
    from pathlib import Path

    from d2s_search import settings
    from d2s_search.backends.opensearch.backend import OpenSearchBackend
    from d2s_search.backends.opensearch.ml_package import model_name
    from d2s_search.bundle import Bundle
    from d2s_search.errors import BundleMismatchError

    cluster = make_cluster(settings={}, task_polls=1)
    blip = Bundle.load(tiny_blip_bundle)
    store = OpenSearchBackend(cluster.url, index_name="pics")
    store.open(blip.identity())  # records the bundle's fingerprint and path
    store.close()
    settings.remember_bundle(Path(tiny_clip_bundle))  # another bundle exported since
    assert settings.last_bundle() == Path(tiny_clip_bundle)

    result = run(register_model, ["--url", cluster.url, "--index-name", "pics", "--configure-cluster",
                                  "--max-query-terms", "50", "--json"])
    assert result.exception is None, result.output
    assert json.loads(result.stdout)["name"] == model_name(blip)  # not the last exported

    # Given explicitly, another bundle is refused, naming the one that filled the index.
    result = run(register_model, ["--bundle", tiny_clip_bundle, "--url", cluster.url, "--index-name", "pics"])
    assert isinstance(result.exception, BundleMismatchError)
    assert str(Path(tiny_blip_bundle).resolve()) in str(result.exception)


def test_template_only(make_cluster, tiny_blip_bundle):
    cluster = make_cluster(ml_enabled=False)
    result = run(register_model, ["--bundle", tiny_blip_bundle, "--url", cluster.url, "--template-only"])
    assert result.exception is None, result.output
    assert "stored search template d2s-sparse" in result.output and "d2s-sparse" in cluster.scripts


def test_without_ml_commons_the_template_is_still_stored(make_cluster, tiny_blip_bundle):
    cluster = make_cluster(ml_enabled=False)
    result = run(register_model, ["--bundle", tiny_blip_bundle, "--url", cluster.url])
    assert isinstance(result.exception, MLCommonsUnavailable)
    assert "search template d2s-sparse is stored" in str(result.exception)
    assert "d2s-sparse" in cluster.scripts


def test_register_model_needs_a_url(tiny_blip_bundle):
    result = run(register_model, ["--bundle", tiny_blip_bundle], env={"D2S_OPENSEARCH_URL": ""})
    assert "D2S_OPENSEARCH_URL" in str(result.exception)


@pytest.mark.parametrize("args", [["/no/such/folder"], [__file__]])
def test_serve_images_wants_a_folder(args):
    result = CliRunner().invoke(serve_images, args)
    assert result.exit_code == 2
