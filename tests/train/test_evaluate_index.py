"""End to end: what the index returns scores the same as the precomputed-vector path."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner


@pytest.fixture(scope="module")
def indexed(tiny_blip_bundle, image_folder, tmp_path_factory):
    from d2s_search.backends import open_backend
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    from d2s_search.ingest import ingest

    root = tmp_path_factory.mktemp("e2e")
    images = sorted(image_folder.rglob("*.jpg"))[:8]
    rng = np.random.default_rng(0)
    words = ["dog", "red", "car", "tree", "beach", "two", "man", "snow", "boat", "city"]
    rows = ["image,caption"]
    for p in images:
        for _ in range(2):
            rows.append(f"{p},a {' '.join(rng.choice(words, 3))}")
    (root / "caps.csv").write_text("\n".join(rows))
    bundle = Bundle.load(tiny_blip_bundle)
    encoder = Encoder(bundle, device="cpu")
    store = open_backend("local", index=str(root / "index"))
    store.open(bundle.identity(), create=True)
    report = ingest([str(p) for p in images], encoder, store, batch_size=4, workers=1)
    assert report.to_json()
    store.close()
    return root, bundle, encoder


def test_index_metrics_equal_precomputed_metrics(indexed):
    from d2s_search.backends import open_backend
    from d2s_search.embed import bundle_encoders, embed_dataset, read_caption_csv
    from d2s_search.evaluate import EvalData, SparseVectors, evaluate, evaluate_index
    from d2s_search.train.data import load_dataset

    root, bundle, encoder = indexed
    items = read_caption_csv(root / "caps.csv", val_fraction=0, test_fraction=0)
    store = open_backend("local", index=str(root / "index"))
    store.open(bundle.identity(), create=False)
    try:
        e2e = evaluate_index(store, encoder, items, modes=("sparse", "dense", "two-phase"))
    finally:
        store.close()
    assert e2e["queries"] == 16 and e2e["documents"] == 8 and e2e["skipped_queries"] == 0

    text_fn, image_fn, name = bundle_encoders(bundle.path, device="cpu")
    embed_dataset(items, root / "embs", text_fn, image_fn, name, batch_size=4)
    split = load_dataset(root / "embs")["train"]
    data = EvalData.from_split(split)
    enc_t = encoder.encode_texts(split.captions)
    from d2s_search.images import load_image

    _, img_sparse = encoder.encode_images([load_image(it.image_path).image for it in items])
    sv = SparseVectors(sp.csr_matrix(enc_t.sparse), sp.csr_matrix(img_sparse))
    pre = evaluate(data, sv)
    for run in ("dense", "sparse"):
        for m in ("R@1", "R@5", "R@10", "MRR@10"):
            assert e2e["runs"][run][m] == pytest.approx(pre["runs"][run][m], abs=1e-9), (run, m)
    assert e2e["FLOPs"] == pytest.approx(pre["runs"]["sparse"]["FLOPs"])
    assert e2e["runs"]["dense"]["R@1"] > 0  # not all misses (so the comparison means something)


def test_cli_evaluate_end_to_end(indexed):
    from d2s_search.cli.train import evaluate_cmd

    root, bundle, _ = indexed
    res = CliRunner().invoke(
        evaluate_cmd,
        ["--dataset", str(root / "caps.csv"), "--bundle", str(bundle.path), "--index", str(root / "index"),
         "--backend", "local", "--modes", "sparse,hybrid", "--json"],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["runs"]) == {"sparse", "hybrid"} and out["queries"] > 0
    assert out["runs"]["sparse"]["latency_ms_mean"] > 0
