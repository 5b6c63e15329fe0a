import json

import numpy as np
import pytest
import torch
from d2s_onnx_export.head import load_head

from d2s_search import metrics as M
from d2s_search.train.modeling import build_head
from d2s_search.train.trainer import TrainConfig, TrainingError, train
from tests.train.train_synthetic import SPECIAL, VOCAB

FAST = dict(eta=1e-2, epochs=16, batch_size=128, lr_vocab=1e-3, val_images=0)


def _dense_r1(split):
    _, _, pq = M.evaluate_scores(split.text_emb @ split.image_emb.T, split.qrels(), doc_ids=split.image_ids)
    return M.aggregate(pq)["R@1"]


def _kept_epoch(scores, eligible, queries: int, tolerance: float = -1.0) -> int:
    """By hand: the latest eligible epoch whose score is within the tolerance of the best (-1:
    one standard error of the best score over ``queries``)."""
    best = max(sc for sc, ok in zip(scores, eligible, strict=True) if ok)
    if tolerance < 0:
        p = min(max(best, 0.0), 1.0)
        tolerance = (p * (1 - p) / queries) ** 0.5
    return max(i for i, (sc, ok) in enumerate(zip(scores, eligible, strict=True), 1) if ok and sc >= best - tolerance)


def _run(synthetic, tmp_path, mode, **kw):
    (tr, trt, _), (va, vat, _), _ = synthetic
    head = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=64, seed=0)
    cfg = TrainConfig(expansion=mode, **{**FAST, **kw})
    return train(head, tr, trt, cfg, tmp_path / mode, va, vat, progress=False), head


def test_pec_gets_close_to_dense_with_fewer_flops_than_exp1(synthetic, tmp_path):
    (_, _, _), (va, _, va_words), _ = synthetic
    dense = _dense_r1(va)
    full, _ = _run(synthetic, tmp_path, "1")
    pec, head = _run(synthetic, tmp_path, "c+w")
    assert dense > 0.9
    assert pec["best_val"]["R@1"] >= dense - 0.1, (pec["best_val"], dense)
    assert pec["best_val"]["FLOPs"] < 0.85 * full["best_val"]["FLOPs"], (pec["best_val"], full["best_val"])
    # the planted words surface: an image's strongest terms include its own words
    from d2s_search.train.modeling import encode_sparse

    docs = encode_sparse(head, va.image_emb[:50]).toarray()
    hits = [len(set(np.argsort(-row)[:3]) & set(words.tolist())) for row, words in zip(docs, va_words[:50])]
    assert np.mean(hits) >= 0.6  # chance level is 3 * 3 / 290 = 0.03
    # no special token is ever an output term
    assert (docs[:, SPECIAL] == 0).all()


def test_best_checkpoint_is_the_best_validation_epoch(synthetic, tmp_path):
    (_, _, _), (va, _, _), _ = synthetic
    summary, head = _run(synthetic, tmp_path, "c", epochs=5)
    hist = json.loads((tmp_path / "c" / "history.json").read_text())
    r1, ok = [h["val"]["R@1"] for h in hist], [h["eligible"] for h in hist]
    assert summary["best_epoch"] == _kept_epoch(r1, ok, len(va.caption_ids))
    saved = load_head(tmp_path / "c" / "head.pt")
    assert saved.config.trained and saved.config.notes["best_epoch"] == summary["best_epoch"]
    assert saved.config.notes["expansion"] == "c" and saved.config.notes["query_mask"] == "none"
    for k, v in saved.state_dict().items():
        assert torch.equal(v, head.state_dict()[k])


def test_the_kept_epoch_is_the_latest_within_the_tolerance_of_the_best(synthetic, tmp_path):
    """Later epochs are more settled: one within the noise of the best replaces it."""
    from d2s_search.train.trainer import _tolerance

    (_, _, _), (va, _, _), _ = synthetic
    for tol in (0.0, 1.0):
        summary, _ = _run(synthetic, tmp_path / str(tol), "c", epochs=4, select_tolerance=tol)
        hist = summary["history"]
        assert summary["best_epoch"] == _kept_epoch([h["val"]["R@1"] for h in hist], [h["eligible"] for h in hist],
                                                    len(va.caption_ids), tol)
    assert summary["best_epoch"] == 4  # R@1 lies in [0, 1]: a tolerance of 1 keeps the last epoch
    # one standard error of the best score, by hand: R@1 0.38 over 800 queries
    config = TrainConfig()
    assert _tolerance(config, 0.38, va.head(200)) == pytest.approx((0.38 * 0.62 / len(va.head(200).caption_ids)) ** 0.5)
    assert _tolerance(config, -1.5, va) == 0.0 and _tolerance(config, 0.5, None) == 0.0
    assert _tolerance(TrainConfig(select_tolerance=0.02), 0.38, va) == 0.02
    with pytest.raises(TrainingError, match="tolerance must be -1"):
        _run(synthetic, tmp_path / "bad", "c", epochs=1, select_tolerance=-0.5)


def test_with_distractors_the_best_epoch_is_the_best_r1_over_the_larger_collection(synthetic, tmp_path):
    from d2s_search.train.trainer import validate
    from d2s_search.train.validation import pick_distractors, with_distractors

    (tr, _, _), (va, vat, _), _ = synthetic
    summary, head = _run(synthetic, tmp_path, "c", epochs=5, val_distractors=4000)
    hist = summary["history"]
    pooled = [h["val"]["R@1_pool"] for h in hist]
    assert summary["best_epoch"] == _kept_epoch(pooled, [h["eligible"] for h in hist], len(va.caption_ids))
    assert all(h["val"]["R@1_pool"] <= h["val"]["R@1"] for h in hist)  # more images, never easier
    # the saved head's numbers, by hand: R@1 over the validation images and every training image
    extra = pick_distractors(tr.image_emb, tr.caption_image)
    alone = validate(head, va, vat, "c", torch.device("cpu"))
    pool = validate(head, with_distractors(va, extra), vat, "c", torch.device("cpu"))
    assert validate(head, va, vat, "c", torch.device("cpu"), distractors=extra) == {**alone, "R@1_pool": pool["R@1"]}
    assert hist[summary["best_epoch"] - 1]["val"]["R@1_pool"] == pool["R@1"]
    with pytest.raises(TrainingError, match="distractors must be >= 0"):
        _run(synthetic, tmp_path / "bad", "c", epochs=1, val_distractors=-1)


def test_given_distractors_replace_the_training_images_in_the_larger_collection(synthetic, tmp_path):
    """Rows that are not all images (caption pairs beside photos) pass the images to search among."""
    from d2s_search.train.trainer import validate
    from d2s_search.train.validation import with_distractors

    (tr, trt, _), (va, vat, _), _ = synthetic
    extra = np.random.default_rng(5).standard_normal((40, tr.dim)).astype(np.float32)
    head = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=64, seed=0)
    cfg = TrainConfig(expansion="c", **{**FAST, "epochs": 2, "val_distractors": 30})
    summary = train(head, tr, trt, cfg, tmp_path / "given", va, vat, progress=False, distractors=extra)
    best = load_head(tmp_path / "given" / "head.pt")
    pool = validate(best, with_distractors(va, extra[:30]), vat, "c", torch.device("cpu"))  # the limit holds
    assert summary["history"][summary["best_epoch"] - 1]["val"]["R@1_pool"] == pool["R@1"]
    with pytest.raises(TrainingError, match=r"distractors must be \(n, "):
        train(head, tr, trt, cfg, tmp_path / "bad", va, vat, progress=False, distractors=extra[:, :3])


def test_with_a_selection_budget_epochs_compete_at_their_best_shift_within_it(synthetic, tmp_path):
    from d2s_search.train.calibrate import choose_document_shift
    from d2s_search.train.validation import pick_distractors

    (tr, _, _), (va, vat, _), _ = synthetic
    summary, head = _run(synthetic, tmp_path, "c+w", epochs=4, val_distractors=4000, select_flops_budget=1e6,
                         select_boost=1.0)
    hist = summary["history"]
    scores = [h["val"]["R@1_within_budget"] for h in hist]
    assert summary["best_epoch"] == _kept_epoch(scores, [h["eligible"] for h in hist], len(va.caption_ids))
    saved = load_head(tmp_path / "c+w" / "head.pt")
    assert saved.config.document_shift == saved.config.query_word_boost == 0.0  # put back after each epoch
    # by hand: the saved head's best R@1 over the larger collection among shifts within the budget
    choice = choose_document_shift(saved, va, vat, "c+w", 1e6, boosts=(1.0,),
                                   distractors=pick_distractors(tr.image_emb, tr.caption_image))
    fits = [r["R@1"] for r in choice.table if r["within_budget"]]
    assert fits and max(fits) == hist[summary["best_epoch"] - 1]["val"]["R@1_within_budget"]
    # a budget nothing fits: no epoch has a shift within it
    summary, _ = _run(synthetic, tmp_path / "none", "c+w", epochs=3, select_flops_budget=1e-9, warmup=0.0)
    hist = summary["history"]
    assert [h["val"]["R@1_within_budget"] for h in hist] == [-1.0, -1.0, -1.0]
    # then R@1 alone decides (as R@1 - 2: the tolerance is 0 there)
    assert summary["best_epoch"] == _kept_epoch([h["val"]["R@1"] - 2 for h in hist], [h["eligible"] for h in hist], 1)
    with pytest.raises(TrainingError, match="selection's FLOPs budget"):
        _run(synthetic, tmp_path / "bad", "c", epochs=1, select_flops_budget=-1.0)


def test_no_checkpoint_from_before_the_l1_ramp(synthetic, tmp_path):
    # 4 epochs of 10 steps, warm-up 50% = 20 steps: epochs 1 (step 10) is not eligible
    summary, _ = _run(synthetic, tmp_path, "1", epochs=4, warmup=0.5)
    hist = summary["history"]
    assert [h["eligible"] for h in hist] == [False, True, True, True]
    assert summary["best_epoch"] >= 2


@pytest.mark.parametrize(("mix", "side", "neighbours", "clusters", "decay"),
                         [(0.0, "both", 0, 0, 0.0), (0.5, "both", 0, 0, 0.0), (0.5, "images", 3, 0, 0.0),
                          (0.0, "both", 0, 5, 0.0), (0.0, "both", 0, 0, 0.9)])
def test_resume_continues_exactly(synthetic, tmp_path, mix, side, neighbours, clusters, decay):
    (tr, trt, _), (va, vat, _), _ = synthetic
    cfg = TrainConfig(expansion="c+w", mix=mix, mix_side=side, mix_neighbours=neighbours, cluster_images=clusters,
                      average_decay=decay, **{**FAST, "epochs": 4})

    def fresh():
        return build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32, seed=0)

    straight = fresh()
    train(straight, tr, trt, cfg, tmp_path / "a", va, vat, progress=False)
    last_a = torch.load(tmp_path / "a" / "last.pt", weights_only=False)["head"]

    class Stop(Exception):
        pass

    def stop_after_two(entry):
        if entry.epoch == 2:
            raise Stop

    with pytest.raises(Stop):
        train(fresh(), tr, trt, cfg, tmp_path / "b", va, vat, progress=False, log=stop_after_two)
    resumed = fresh()
    summary = train(resumed, tr, trt, cfg, tmp_path / "b", va, vat, resume=True, progress=False)
    assert len(summary["history"]) == 4
    last_b = torch.load(tmp_path / "b" / "last.pt", weights_only=False)["head"]
    for k in last_a:
        torch.testing.assert_close(last_b[k], last_a[k], rtol=0, atol=1e-6)
    if decay:  # the weight average resumes exactly too
        avg_a, avg_b = (torch.load(tmp_path / n / "last.pt", weights_only=False)["average"] for n in "ab")
        assert avg_a["updates"] == avg_b["updates"] == 40
        for k in avg_a["shadow"]:
            torch.testing.assert_close(avg_b["shadow"][k], avg_a["shadow"][k], rtol=0, atol=1e-6)
    # resuming with other settings is refused
    other = TrainConfig(expansion="1", **{**FAST, "epochs": 4})
    with pytest.raises(TrainingError, match=r"other settings \(((average_decay|cluster_images) [0-9.]+ there, default now; )?expansion 'c\+w' there, '1' now[;)]") as err:
        train(fresh(), tr, trt, other, tmp_path / "b", va, vat, resume=True, progress=False)
    assert "\n" not in str(err.value)


def test_the_saved_head_is_the_weight_average(synthetic, tmp_path):
    (tr, trt, _), (va, vat, _), _ = synthetic
    head = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32, seed=0)
    cfg = TrainConfig(expansion="c+w", average_decay=0.9, **{**FAST, "epochs": 1})
    summary = train(head, tr, trt, cfg, tmp_path / "avg", va, vat, progress=False)
    assert summary["best_epoch"] == 1  # the last epoch is always eligible
    saved = load_head(tmp_path / "avg" / "head.pt").state_dict()
    ckpt = torch.load(tmp_path / "avg" / "last.pt", weights_only=False)
    assert ckpt["average"]["updates"] == summary["steps"] == 10
    for k in saved:
        assert torch.equal(saved[k], ckpt["average"]["shadow"][k])  # the average was saved...
        assert torch.equal(head.state_dict()[k], saved[k])  # ...and returned
    assert any(not torch.equal(saved[k], ckpt["head"][k]) for k in saved)  # not the live weights
    with pytest.raises(TrainingError, match=r"decay must be in \[0, 1\)"):
        train(head, tr, trt, TrainConfig(average_decay=1.0, **FAST), tmp_path / "bad", va, vat, progress=False)


def test_an_unknown_mixed_side_is_refused_before_training(synthetic, tmp_path):
    (tr, trt, _), _, _ = synthetic
    head = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32, seed=0)
    with pytest.raises(ValueError, match="mix_side must be one of both, images, captions"):
        train(head, tr, trt, TrainConfig(mix=0.5, mix_side="queries", **FAST), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "last.pt").exists()


def test_exp0_heads_are_evaluated_with_masked_queries(synthetic, tmp_path):
    summary, _ = _run(synthetic, tmp_path, "0", epochs=3)
    saved = load_head(tmp_path / "0" / "head.pt")
    assert saved.config.notes["query_mask"] == "own_tokens"
    # validation used masked queries: at most a caption's 4 tokens per query
    assert summary["best_val"]["terms_per_query"] <= 4.0


def test_flops_regulariser_lowers_coactivation_at_equal_sparsity(synthetic, tmp_path):
    """At about the same number of terms per vector, the FLOPS regulariser leaves far fewer
    terms active in most documents (and less of the FLOPs on them) than L1."""
    (_, _, _), (va, vat, _), _ = synthetic
    from d2s_search.train.modeling import encode_sparse

    reports = {}
    for reg, eta in (("l1", 0.2), ("flops", 1.0)):
        # the best epoch strictly: the etas were matched on those heads' sparsity
        _, head = _run(synthetic, tmp_path, "1", epochs=8, eta=eta, regularizer=reg, select_tolerance=0.0)
        q, d = encode_sparse(head, va.text_emb), encode_sparse(head, va.image_emb)
        reports[reg] = (M.terms_per_vector(d), M.coactivation_report(q, d))
    (t_l1, r_l1), (t_fl, r_fl) = reports["l1"], reports["flops"]
    assert abs(t_fl - t_l1) <= 0.15 * t_l1, (t_l1, t_fl)  # comparable sparsity ...
    assert r_fl["common_terms"] <= 0.75 * r_l1["common_terms"], (r_l1, r_fl)  # ... less co-activation
    assert r_fl["flops_share_common_terms"] <= 0.75 * r_l1["flops_share_common_terms"], (r_l1, r_fl)


def test_projection_fit_to_words_names_the_captions_words_before_training(synthetic):
    from d2s_search.train.modeling import encode_sparse, fit_projection_to_words

    (tr, trt, _), (va, vat, va_words), _ = synthetic
    def top3_hits(head):
        docs = encode_sparse(head, va.image_emb[:60]).toarray()
        return np.mean([len(set(np.argsort(-row)[:3]) & set(w.tolist())) for row, w in zip(docs, va_words[:60])])

    plain = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=64, seed=0)
    fitted = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=64, seed=0)
    stats = fit_projection_to_words(fitted, tr, trt)
    assert stats["pairs"] == len(tr.caption_ids) and 0 < stats["r2"] <= 1
    assert fitted.config.notes["proj_init"] == "words"
    # held-out images: their planted words are among the 3 strongest terms far above chance (0.03)
    hits, base = top3_hits(fitted), top3_hits(plain)
    assert hits >= 0.5 and hits > 5 * base, (hits, base)


def test_an_mlp_head_starts_as_the_linear_head_and_trains_its_branch(synthetic, tmp_path):
    """``mlp_dim``: a residual GELU branch beside W1 whose output layer starts at zero, so the
    head computes exactly the linear head's scores before training; training moves the branch
    (its parameters are in the optimiser at W1's rate) and the saved head keeps it."""
    (tr, trt, _), (va, vat, _), _ = synthetic
    linear = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=64, seed=0)
    head = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=64, seed=0, mlp_dim=32)
    z = torch.as_tensor(tr.text_emb[:16])
    assert torch.equal(head.logits(z), linear.logits(z))
    assert head.config.notes["mlp_dim"] == 32 and float(head.mlp[2].weight.detach().abs().sum()) == 0.0
    summary = train(head, tr, trt, TrainConfig(expansion="c+w", **{**FAST, "epochs": 3}), tmp_path / "mlp", va, vat,
                    progress=False)
    assert float(head.mlp[2].weight.detach().abs().sum()) > 0
    saved = load_head(summary["head"])
    assert saved.config.mlp_dim == 32
    with torch.no_grad():
        assert torch.equal(saved(z), head(z))
        assert not torch.equal(saved.logits(z), saved.vocab(saved.norm(saved.proj(z))))  # the branch counts


def test_a_head_file_with_a_bad_mlp_width_is_refused(tmp_path):
    from d2s_onnx_export.head import save_head

    from d2s_search.errors import ModelError

    head = build_head(8, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=16, seed=0, mlp_dim=4)
    path = save_head(head, tmp_path / "head.pt")
    payload = torch.load(path, weights_only=True)
    for bad in (-1, 10**9, 2.5):
        payload["config"]["mlp_dim"] = bad
        torch.save(payload, path)
        with pytest.raises(ModelError, match="mlp width"):
            load_head(path)
