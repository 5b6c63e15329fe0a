"""`train extract-head`: the head inside a bundle, written as a head file that `evaluate --head`
takes, so a new head can be compared with the one in use on the same stored vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from d2s_onnx_export.head import load_head, save_head

from d2s_search.bundle import Bundle
from d2s_search.encoder import Encoder
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    """A tiny-blip head unlike the model's own: scaled weights, a document shift and a boost."""
    from d2s_onnx_export.export import build_head
    from d2s_onnx_export.models import build_dense_encoder

    head = build_head(build_dense_encoder("tiny-blip"), None)
    with torch.no_grad():
        head.proj.weight.mul_(3.0)
    head.config.trained, head.config.notes = True, {"run": "mine"}
    head.config.document_shift, head.config.query_word_boost = 0.25, 1.5
    return save_head(head, tmp_path_factory.mktemp("heads") / "mine.pt")


@pytest.fixture(scope="module")
def bundle_with_head(head_file, tmp_path_factory) -> Bundle:
    from d2s_onnx_export.export import export_bundle

    # the export overrides the boost: the bundle's settings, not the file's, are the head in use
    return export_bundle(
        "tiny-blip",
        tmp_path_factory.mktemp("bundles") / "mine",
        head_path=head_file,
        query_word_boost=2.0,
    ).bundle


def _same_outputs(head, bundle: Bundle) -> None:
    """``head`` on the bundle's dense vectors gives the bundle's sparse vectors (pictures with
    the document shift; captions apart from their own tokens, which the text graph boosts)."""
    from PIL import Image

    encoder = Encoder(bundle, device="cpu")
    rng = np.random.default_rng(7)
    dense, sparse = encoder.encode_images(
        [Image.fromarray(rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)) for _ in range(2)]
    )
    with torch.no_grad():
        np.testing.assert_allclose(
            head(torch.from_numpy(dense), document=True).numpy(), sparse, atol=1e-5
        )
        text = encoder.encode_texts(["a red boat on a lake"])
        ours = head(torch.from_numpy(text.dense)).numpy()
    own = sorted(set(text.token_ids[0]))
    np.testing.assert_allclose(
        np.delete(ours, own, axis=1), np.delete(text.sparse, own, axis=1), atol=1e-5
    )


def test_the_head_of_a_bundle_exported_with_a_head_file(
    bundle_with_head, head_file, tmp_path, capsys
):
    code, out, err = run_cli(
        [
            "train",
            "extract-head",
            "--bundle",
            bundle_with_head.path,
            "--out",
            tmp_path / "in-use.pt",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    report = json.loads(out)
    assert (
        report["source"] == f"the head file {head_file.resolve()}"
        and report["max_difference"] < 1e-4
    )
    extracted, original = load_head(tmp_path / "in-use.pt"), load_head(head_file)
    for name, tensor in original.state_dict().items():
        assert torch.equal(extracted.state_dict()[name], tensor), name
    c = extracted.config
    assert (c.document_shift, c.query_word_boost, c.notes) == (
        0.25,
        2.0,
        {"run": "mine"},
    )  # the bundle's boost
    assert sorted(set(c.excluded_ids)) == bundle_with_head.manifest["text"]["excluded_ids"]
    _same_outputs(extracted, bundle_with_head)


def test_the_head_of_a_bundle_with_the_models_own_head(tiny_blip_bundle, tmp_path, capsys):
    code, out, err = run_cli(
        ["train", "extract-head", "--bundle", tiny_blip_bundle, "--out", tmp_path / "own.pt"],
        capsys,
    )
    assert code == 0, err
    assert out.startswith(
        f"wrote {tmp_path / 'own.pt'}: the head of {tiny_blip_bundle} (tiny-blip's own head "
        "(untrained, vocabulary init); document shift 0, query word boost 0)"
    )
    _same_outputs(load_head(tmp_path / "own.pt"), Bundle.load(tiny_blip_bundle))


def test_compare_the_head_in_use_with_a_new_one_on_the_same_split(
    bundle_with_head, head_file, tmp_path, capsys
):
    """The extracted head and the file it came from, evaluated on the same stored vectors, score
    alike; a new head beside it is measured on exactly the same captions and photos."""
    from d2s_search.embed import bundle_encoders, embed_dataset
    from tests.helpers import write_image

    rows = ["image,caption"]
    for n in range(10):
        photo = write_image(tmp_path / "photos" / f"p{n}.jpg", seed=100 + n)
        rows += [f"{photo},a photo of thing {n}", f"{photo},picture number {n} outdoors"]
    (tmp_path / "caps.csv").write_text("\n".join(rows))
    from d2s_search.embed import read_caption_csv

    text_fn, image_fn, name = bundle_encoders(bundle_with_head.path, device="cpu")
    embed_dataset(
        read_caption_csv(tmp_path / "caps.csv", test_fraction=0.5),
        tmp_path / "embs",
        text_fn,
        image_fn,
        name,
        batch_size=4,
    )
    code, _, err = run_cli(
        [
            "train",
            "extract-head",
            "--bundle",
            bundle_with_head.path,
            "--out",
            tmp_path / "in-use.pt",
        ],
        capsys,
    )
    assert code == 0, err
    scores = {}
    for label, head in (("in use", tmp_path / "in-use.pt"), ("new", head_file)):
        code, out, err = run_cli(
            [
                "evaluate",
                "--data",
                tmp_path / "embs",
                "--head",
                head,
                "--runs",
                "dense,sparse",
                "--json",
            ],
            capsys,
        )
        assert code == 0, err
        scores[label] = json.loads(out)
    assert scores["in use"]["queries"] == scores["new"]["queries"] == 10
    assert (
        scores["in use"]["runs"]["dense"] == scores["new"]["runs"]["dense"]
    )  # the same split and vectors


def test_a_head_file_gone_or_changed_since_the_export_is_one_line(head_file, tmp_path, capsys):
    import shutil

    from d2s_onnx_export.export import export_bundle

    moved = shutil.copy(head_file, tmp_path / "moved.pt")
    bundle = export_bundle("tiny-blip", tmp_path / "bundle", head_path=moved).bundle
    (tmp_path / "moved.pt").write_bytes((tmp_path / "moved.pt").read_bytes() + b"\0")
    code, out, err = run_cli(
        ["train", "extract-head", "--bundle", bundle.path, "--out", tmp_path / "x.pt"], capsys
    )
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert "which has changed since (its SHA-256 differs)" in err
    (tmp_path / "moved.pt").unlink()
    code, _, err = run_cli(
        ["train", "extract-head", "--bundle", bundle.path, "--out", tmp_path / "x.pt"], capsys
    )
    assert (
        code == 1
        and f"was exported with the head file {tmp_path / 'moved.pt'}, which is gone" in err
    )
    assert not (tmp_path / "x.pt").exists()
    # a bundle that does not record its head (exported before head sources were recorded):
    # the model's own head is tried, and refused because it does not reproduce the bundle
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    del manifest["head_source"]
    (bundle.path / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli(
        ["train", "extract-head", "--bundle", bundle.path, "--out", tmp_path / "x.pt"], capsys
    )
    assert code == 1 and "exported with a head its manifest does not name" in err


def test_the_extracted_head_on_stored_vectors_scores_as_the_index_within_the_split(
    bundle_with_head, tmp_path, capsys
):
    """`evaluate --data embs --head in-use.pt` and `evaluate --dataset --within-split` through an
    index filled with the bundle measure the same thing: the same split, the same head, the
    query word boost at the same typed words."""
    from d2s_search.embed import bundle_encoders, embed_dataset, read_caption_csv
    from tests.helpers import write_image

    rows = ["image,caption"]
    words = ["dog", "giraffe", "car", "beach", "skateboarding", "red", "tree", "snow"]
    for n in range(12):
        photo = write_image(tmp_path / "photos" / f"p{n}.jpg", seed=200 + n)
        rows += [
            f"{photo},a {words[n % 8]} and a {words[(n * 3) % 8]}",
            f"{photo},{words[(n + 5) % 8]} number {n}",
        ]
    (tmp_path / "caps.csv").write_text("\n".join(rows))
    items = read_caption_csv(tmp_path / "caps.csv", val_fraction=0, test_fraction=0.5)
    text_fn, image_fn, name = bundle_encoders(bundle_with_head.path, device="cpu")
    embed_dataset(items, tmp_path / "embs", text_fn, image_fn, name, batch_size=4)
    code, _, err = run_cli(
        [
            "ingest",
            tmp_path / "photos",
            "--bundle",
            bundle_with_head.path,
            "--index",
            tmp_path / "index",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    code, _, err = run_cli(
        [
            "train",
            "extract-head",
            "--bundle",
            bundle_with_head.path,
            "--out",
            tmp_path / "in-use.pt",
        ],
        capsys,
    )
    assert code == 0, err
    code, out, err = run_cli(
        [
            "evaluate",
            "--data",
            tmp_path / "embs",
            "--head",
            tmp_path / "in-use.pt",
            "--runs",
            "dense,sparse",
            "--tokenizer",
            bundle_with_head.path,
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    stored = json.loads(out)
    code, out, err = run_cli(
        [
            "evaluate",
            "--dataset",
            tmp_path / "caps.csv",
            "--index",
            tmp_path / "index",
            "--within-split",
            "--modes",
            "dense,sparse",
            "--val-fraction",
            "0",
            "--test-fraction",
            "0.5",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    indexed = json.loads(out)
    assert stored["queries"] == indexed["queries"] == 12 and indexed["ranked_among"] == 6
    for run in ("dense", "sparse"):
        for m in ("R@1", "R@5", "MRR@10"):
            assert indexed["runs"][run][m] == pytest.approx(stored["runs"][run][m], abs=1e-9), (
                run,
                m,
            )
