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


@pytest.fixture(scope="module")
def crowded(indexed, image_folder, tmp_path_factory):
    """The captioned photos of ``indexed`` in an index that also holds 12 other pictures."""
    from d2s_search.backends import open_backend
    from d2s_search.ingest import ingest

    root, bundle, encoder = indexed
    others = sorted(image_folder.rglob("*.png"))[:12]
    images = sorted(image_folder.rglob("*.jpg"))[:8]
    store = open_backend("local", index=str(tmp_path_factory.mktemp("crowded") / "index"))
    store.open(bundle.identity(), create=True)
    ingest([str(p) for p in images + others], encoder, store, batch_size=4, workers=1)
    store.close()
    return store.path


def _evaluate(args, capsys):
    from tests.helpers import run_cli

    return run_cli(["evaluate", *map(str, args)], capsys)


def test_evaluate_dataset_says_what_it_ranks_among_and_ranks_within_the_split_on_request(indexed, crowded, capsys):
    """Against the whole index (20 documents) by default, against the split's 8 photos with
    --within-split: then the numbers are those of the precomputed-vector path on those photos."""
    root, bundle, _ = indexed
    base = ["--dataset", root / "caps.csv", "--index", crowded, "--modes", "sparse,dense", "--val-fraction", "0",
            "--test-fraction", "1"]
    code, out, err = _evaluate(base, capsys)
    assert code == 0, err
    assert f"16 queries about 8 test images in {crowded}, ranked among all 20 documents of the index" in out
    assert "20 images ranked (the whole index)" in out
    code, out, err = _evaluate([*base, "--json"], capsys)
    whole = json.loads(out)
    assert (whole["ranking"], whole["ranked_among"], whole["documents"], whole["index_documents"]) == ("index", 20, 8, 20)
    code, out, err = _evaluate([*base, "--within-split", "--json"], capsys)
    assert code == 0, err
    within = json.loads(out)
    assert (within["ranking"], within["ranked_among"], within["documents"]) == ("split", 8, 8)
    # the same ranking as an index holding only these 8 photos (the precomputed path agrees with that one)
    code, out, err = _evaluate(["--dataset", root / "caps.csv", "--index", root / "index", "--modes", "sparse,dense",
                                "--val-fraction", "0", "--test-fraction", "1", "--json"], capsys)
    alone = json.loads(out)
    for run in ("sparse", "dense"):
        for m in ("R@1", "R@5", "R@10", "MRR@10"):
            assert within["runs"][run][m] == pytest.approx(alone["runs"][run][m], abs=1e-9), (run, m)
            assert whole["runs"][run][m] <= within["runs"][run][m] + 1e-9, (run, m)
    assert any(whole["runs"][r]["MRR@10"] < within["runs"][r]["MRR@10"] for r in ("sparse", "dense"))
    code, out, err = _evaluate([*base, "--within-split"], capsys)
    assert "ranked among these 8 images alone (--within-split)" in out and "8 images ranked (this split)" in out


def test_evaluate_dataset_splits_a_csv_as_embed_does(indexed, tmp_path, capsys):
    """--val-fraction, --test-fraction and --seed give the split embed writes (the same seeded
    draw); only half the photos are in this index, so another split asks other captions."""
    from d2s_search.backends import open_backend
    from d2s_search.embed import read_caption_csv
    from d2s_search.ingest import ingest

    root, bundle, encoder = indexed
    items = read_caption_csv(root / "caps.csv")
    half = [it.image_path for it in items[::2]]
    store = open_backend("local", index=str(tmp_path / "half"))
    store.open(bundle.identity(), create=True)
    ingest([str(p) for p in half], encoder, store, batch_size=4, workers=1)
    store.close()

    def expected(**split) -> int:
        chosen = read_caption_csv(root / "caps.csv", **split)
        return sum(len(it.sentences) for it in chosen if it.split == "test" and it.image_path in half)

    options = {"val_fraction": 0.25, "test_fraction": 0.5, "seed": 3}
    assert expected(**options) != expected()  # the two splits ask different captions here
    for split, flags in ((options, ["--val-fraction", "0.25", "--test-fraction", "0.5", "--seed", "3"]), ({}, [])):
        code, out, err = _evaluate(["--dataset", root / "caps.csv", "--index", tmp_path / "half", "--modes", "sparse",
                                    *flags, "--json"], capsys)
        assert code == 0, err
        assert json.loads(out)["queries"] == expected(**split), flags


def test_evaluate_dataset_with_no_image_in_the_index_is_one_line(indexed, image_folder, tmp_path, capsys):
    root, _, _ = indexed
    others = sorted(image_folder.rglob("*.png"))[:4]
    (tmp_path / "others.csv").write_text("image,caption\n" + "".join(f"{p},a photo\n" for p in others))
    code, out, err = _evaluate(["--dataset", tmp_path / "others.csv", "--index", root / "index", "--test-fraction",
                                "1", "--val-fraction", "0"], capsys)
    assert (code, out) == (1, "")
    assert err == ("error: no caption to evaluate: 4 images, 4 of them readable at their paths, none in the index; "
                   "ingest them with the bundle the index records (or give the --image-root their paths are "
                   "relative to)\n")
    code, out, err = _evaluate(["--dataset", root / "caps.csv", "--index", root / "index", "--test-fraction", "0"],
                               capsys)
    assert code == 1 and err.startswith("error: ") and "has no 'test' images with this --val-fraction" in err
