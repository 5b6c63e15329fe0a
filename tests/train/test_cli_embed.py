import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from d2s_search.cli.train import evaluate_cmd, train
from d2s_search.embed import embed_dataset, read_caption_csv, read_karpathy
from d2s_search.errors import ImageRejected
from d2s_search.train.data import load_dataset, write_embeddings

WORDS = ["dog", "cat", "car", "tree", "beach", "ball", "horse", "bike", "boat", "snow", "city", "child"]


def _word_dataset(root: Path, n_images=60, seed=0):
    """Real words, dense vectors built from per-word vectors (so text carries the signal)."""
    rng = np.random.default_rng(seed)
    wv = {w: rng.standard_normal(16) for w in WORDS}
    images, img_vecs, txt_vecs, txt_ids = [], [], [], []
    for i in range(n_images):
        words = list(rng.choice(WORDS, 3, replace=False))
        v = sum(wv[w] for w in words)
        img_vecs.append(v / np.linalg.norm(v))
        sents = []
        for j in range(2):
            named = list(rng.choice(words, 2, replace=False))
            t = sum(wv[w] for w in named) + 0.2 * rng.standard_normal(16)
            txt_vecs.append(t / np.linalg.norm(t))
            sid = f"{i}-{j}"
            txt_ids.append(sid)
            sents.append({"sentid": sid, "raw": f"a {named[0]} and a {named[1]}"})
        split = "train" if i < 40 else "val" if i < 50 else "test"
        images.append({"imgid": str(i), "split": split, "sentences": sents})
    write_embeddings(root, "img", [str(i) for i in range(n_images)], np.array(img_vecs))
    write_embeddings(root, "text", txt_ids, np.array(txt_vecs))
    (root / "dataset_meta.json").write_text(json.dumps({"images": images}))
    return root


def test_cli_train_evaluate_export(tmp_path):
    data = _word_dataset(tmp_path / "data")
    out = tmp_path / "run"
    # a narrow W2 from a matrix file keeps this fast (and tests --vocab-init FILE)
    np.save(tmp_path / "w2.npy", np.random.default_rng(0).standard_normal((30522, 16)).astype(np.float32) * 0.1)
    runner = CliRunner()
    res = runner.invoke(train, ["--data", str(data), "--out", str(out), "--epochs", "2", "--batch-size", "32",
                                "--vocab-init", str(tmp_path / "w2.npy"), "--export-onnx-head", "--json",
                                # the recipe options: the ONNX head must compute what was trained
                                "--regularizer", "flops", "--bias-init", "-0.05", "--output-terms", "words",
                                "--mix", "0.5", "--mix-most", "0.25"],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    run_config = json.loads((out / "config.json").read_text())
    assert (run_config["mix"], run_config["mix_most"]) == (0.5, 0.25)
    # epochs compete at their best shift within --flops-budget, over the validation plus training images
    assert (run_config["select_flops_budget"], run_config["select_boost"], run_config["val_distractors"]) == (12, 2, 4000)
    assert all("R@1_within_budget" in h["val"] and "R@1_pool" in h["val"] for h in summary["history"])
    assert Path(summary["head"]).is_file() and Path(summary["head_onnx"]).is_file()
    assert len(summary["history"]) == 2 and "R@1" in summary["best_val"]
    from d2s_onnx_export.head import load_head

    trained = load_head(out / "head.pt")
    assert trained.config.output_bias and trained.config.notes["output_terms"] == "words"
    # After training, the document shift is chosen on val within --flops-budget (12) and saved.
    tried = summary["document_shift"]["tried"]
    # ... by R@1 against the validation images plus the 40 training images (train's default)
    assert summary["document_shift"]["distractors"] == 40 and all("R@1_own" in r for r in tried)
    fits = [r for r in tried if r["within_budget"]]
    assert [r["shift"] for r in tried] == sorted(r["shift"] for r in tried) and all(r["FLOPs"] <= 12 for r in fits)
    assert trained.config.document_shift == summary["document_shift"]["document_shift"] == (
        max(fits, key=lambda r: r["R@1"])["shift"] if fits else 0.0)
    assert len(trained.config.excluded_ids) > 8000  # punctuation, pieces, stop words
    scores = {}
    for head in ("head.pt", "head.onnx"):
        res = runner.invoke(evaluate_cmd, ["--data", str(data), "--head", str(out / head), "--check", "--json"],
                            catch_exceptions=False)
        assert res.exit_code == 0, res.output
        r = json.loads(res.output)
        assert set(r["runs"]) == {"dense", "sparse", "hybrid"} and r["queries"] == 20 and r["documents"] == 10
        for kind, ours in r["runs"].items():
            for m in ("R@1", "R@5", "R@10", "MRR@10"):
                assert ours[m] == pytest.approx(r["ir_measures"][kind][m]), (kind, m)
        assert r["runs"]["sparse"]["FLOPs"] > 0 and 0 <= r["runs"]["sparse"]["Exact@20"] <= 1
        co = r["coactivation"]  # named terms, costs adding up to at most the run's FLOPs
        assert co["top_coactivated"] and not co["top_coactivated"][0]["term"].isdigit()
        assert sum(t["flops"] for t in co["top_coactivated"]) <= r["runs"]["sparse"]["FLOPs"] + 1e-9
        scores[head] = r["runs"]["sparse"]["R@1"]
    assert scores["head.pt"] == pytest.approx(scores["head.onnx"])
    res = runner.invoke(evaluate_cmd, ["--data", str(data), "--head", str(out / "head.pt")], catch_exceptions=False)
    assert res.exit_code == 0 and "most co-activated terms:" in res.output and "of FLOPs from" in res.output
    res = runner.invoke(evaluate_cmd, ["--data", str(data)], catch_exceptions=False)  # dense only, table
    assert res.exit_code == 0 and "dense" in res.output
    res = runner.invoke(train, ["--data", str(tmp_path / "nope")])
    assert res.exit_code != 0 and "not found" in str(res.exception)


def test_embed_csv_resumes_and_reports_rejected_images(tmp_path):
    rows = ["image,caption"] + [f"im{i // 2}.jpg,caption number {i}" for i in range(20)]
    (tmp_path / "caps.csv").write_text("\n".join(rows))
    items = read_caption_csv(tmp_path / "caps.csv", val_fraction=0.2, test_fraction=0.2)
    assert len(items) == 10 and sum(it.split == "val" for it in items) == 2
    calls = {"text": 0}

    def text_fn(texts):
        calls["text"] += len(texts)
        if calls["text"] > 12 and not calls.get("resumed"):
            raise KeyboardInterrupt  # simulated crash after the first chunk
        return np.array([[len(t), t.count("1"), 1.0] for t in texts], dtype=np.float32)

    def image_fn(paths):
        if any(p.name == "im3.jpg" for p in paths):
            raise ImageRejected("im3.jpg: not an image")
        return np.array([[float(p.name[2]), 0.0, 1.0] for p in paths], dtype=np.float32)

    out = tmp_path / "embs"
    import d2s_search.embed as E

    orig = E.embed_side
    E_chunk = lambda *a, **k: orig(*a, **{**k, "chunk_size": 8})  # noqa: E731
    E.embed_side = E_chunk
    try:
        with pytest.raises(KeyboardInterrupt):
            embed_dataset(items, out, text_fn, image_fn, "fake", batch_size=4, keep_parts=True)
        first = calls["text"]
        calls["resumed"] = True
        summary = embed_dataset(items, out, text_fn, image_fn, "fake", batch_size=4)
        resumed_calls = calls["text"] - first
        with pytest.raises(Exception, match="other settings"):
            embed_dataset(items, tmp_path / "embs2", text_fn, image_fn, "fake", keep_parts=True)
            embed_dataset(items, tmp_path / "embs2", text_fn, image_fn, "other")
    finally:
        E.embed_side = orig
    assert summary["text"]["reused_chunks"] == 1 and resumed_calls == 20 - 8
    assert summary["img"]["count"] == 9 and summary["img"]["rejected"][0]["id"] == "3"
    splits = load_dataset(out)
    total_caps = sum(len(s.caption_ids) for s in splits.values())
    assert total_caps == 18  # the rejected image's two captions have no image vector
    assert not (out / ".parts").exists()


def test_read_karpathy(tmp_path):
    meta = {"images": [{"filename": "a.jpg", "filepath": "val2014", "split": "test", "imgid": 7,
                        "sentences": [{"raw": "x", "sentid": 70}, {"raw": "y", "sentid": 71}]}]}
    (tmp_path / "k.json").write_text(json.dumps(meta))
    items = read_karpathy(tmp_path / "k.json", image_root=tmp_path / "imgs")
    assert items[0].image_path == tmp_path / "imgs" / "val2014" / "a.jpg"
    assert items[0].sentences == [("70", "x"), ("71", "y")] and items[0].split == "test"


def test_no_image_found_names_the_first_reason_and_the_root_option(tmp_path):
    from d2s_search.embed import EmbedError

    rows = ["image,caption"] + [f"im{i}.jpg,caption {i}" for i in range(4)]
    (tmp_path / "caps.csv").write_text("\n".join(rows))
    items = read_caption_csv(tmp_path / "caps.csv", val_fraction=0.0, test_fraction=0.0)

    def image_fn(paths):
        raise ImageRejected(f"{paths[0].name}: file not found")

    def text_fn(texts):
        return np.ones((len(texts), 3), dtype=np.float32)

    with pytest.raises(EmbedError) as err:
        embed_dataset(items, tmp_path / "out", text_fn, image_fn, "fake", batch_size=1)
    message = str(err.value)
    assert "no img input could be encoded" in message and "file not found" in message
    assert "--image-root" in message and "\n" not in message


def test_cli_train_says_when_nothing_fits_the_flops_budget(tmp_path):
    """A head far over --flops-budget keeps no shift (the output says why) and the query word
    boost it was given; with no budget it keeps the boost alone."""
    data = _word_dataset(tmp_path / "data")
    np.save(tmp_path / "w2.npy", np.random.default_rng(0).standard_normal((30522, 16)).astype(np.float32) * 0.1)
    common = ["--data", str(data), "--epochs", "1", "--batch-size", "32", "--vocab-init", str(tmp_path / "w2.npy"),
              "--bias-init", "-0.05"]
    res = CliRunner().invoke(train, [*common, "--out", str(tmp_path / "run"), "--flops-budget", "0.5"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "no document shift: validation FLOPs" in res.output and "over --flops-budget 0.5" in res.output
    from d2s_onnx_export.head import load_head

    head = load_head(tmp_path / "run" / "head.pt")
    assert (head.config.document_shift, head.config.query_word_boost) == (0.0, 2.0)  # train's default boost
    res = CliRunner().invoke(train, [*common, "--out", str(tmp_path / "none"), "--flops-budget", "0",
                                     "--query-word-boost", "0.75"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    head = load_head(tmp_path / "none" / "head.pt")
    assert (head.config.document_shift, head.config.query_word_boost) == (0.0, 0.75)
    res = CliRunner().invoke(train, [*common, "--out", str(tmp_path / "off"), "--query-word-boost", "0",
                                     "--flops-budget", "0.5"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    head = load_head(tmp_path / "off" / "head.pt")
    assert head.config.document_shift == head.config.query_word_boost == 0.0
    # without distractors the choice reads the validation images alone
    res = CliRunner().invoke(train, [*common, "--out", str(tmp_path / "alone"), "--calibration-distractors", "0",
                                     "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    chosen = json.loads(res.stdout)["document_shift"]
    assert chosen["distractors"] == 0 and not any("R@1_own" in r for r in chosen["tried"])


def test_cli_train_schedule_follows_the_dataset_size_unless_given(tmp_path):
    """Without --epochs / --batch-size a small training split gets the measured recipe's 30
    epochs of batch 128, not the paper's 200 x 512 (hours on a CPU); given values win."""
    from d2s_search.train.trainer import SMALL_DATASET_CAPTIONS, default_schedule

    assert default_schedule(7_000) == default_schedule(SMALL_DATASET_CAPTIONS - 1) == (30, 128)
    assert default_schedule(SMALL_DATASET_CAPTIONS) == default_schedule(566_000) == (200, 512)
    data = _word_dataset(tmp_path / "data")
    np.save(tmp_path / "w2.npy", np.random.default_rng(0).standard_normal((30522, 16)).astype(np.float32) * 0.1)
    common = ["--data", str(data), "--vocab-init", str(tmp_path / "w2.npy"), "--flops-budget", "0"]
    res = CliRunner().invoke(train, [*common, "--out", str(tmp_path / "auto")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "80 training captions: 30 epochs of batch 128" in res.stderr
    config = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert (config["epochs"], config["batch_size"]) == (30, 128)
    assert len(json.loads((tmp_path / "auto" / "history.json").read_text())) == 30
    res = CliRunner().invoke(train, [*common, "--out", str(tmp_path / "given"), "--epochs", "2", "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "given" / "config.json").read_text())
    assert (config["epochs"], config["batch_size"]) == (2, 128)  # the unset one still follows the size
    assert "training captions" not in res.output  # --json: stdout is the JSON alone
    json.loads(res.stdout)
