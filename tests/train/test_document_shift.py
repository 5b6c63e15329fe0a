"""The document shift: images keep more terms than queries (d2s_search.train.calibrate)."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from d2s_onnx_export.head import HeadConfig, SparseHead, load_head, save_head

from d2s_search.errors import ModelError
from d2s_search.evaluate import OnnxHead
from d2s_search.train.calibrate import choose_document_shift
from d2s_search.train.convert import export_head_onnx
from d2s_search.train.modeling import build_head, encode_sparse
from d2s_search.train.trainer import validate
from tests.train.train_synthetic import SPECIAL, VOCAB


def _tiny_head(shift: float) -> SparseHead:
    head = SparseHead(HeadConfig(dense_dim=2, vocab_size=4, hidden_dim=2, output_bias=True, excluded_ids=[3],
                                 document_shift=shift))
    with torch.no_grad():
        head.proj.weight.copy_(torch.eye(2))
        head.proj.bias.zero_()
        head.norm.weight.fill_(1.0)
        head.norm.bias.zero_()
        head.vocab.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [1.0, 1.0]]))
        head.vocab.bias.copy_(torch.tensor([0.0, -1.5, -0.2, 5.0]))
    return head.eval()


def test_shift_is_added_to_document_scores_only():
    # z = (3, 1): LayerNorm (eps 1e-5) gives about (1, -1); scores (1, -2.5, -0.2, 5 -> excluded)
    head = _tiny_head(0.5)
    z = torch.tensor([[3.0, 1.0]])
    h = (1 / np.sqrt(1 + 1e-5))
    want_query = [np.log1p(h), 0.0, 0.0, 0.0]
    want_doc = [np.log1p(h + 0.5), 0.0, np.log1p(0.3), 0.0]  # -0.2 + 0.5 > 0: one more term
    with torch.no_grad():
        assert np.allclose(head(z).numpy()[0], want_query, atol=1e-6)
        assert np.allclose(head(z, document=True).numpy()[0], want_doc, atol=1e-6)
        assert np.array_equal(_tiny_head(0.0)(z, document=True).numpy(), head(z).numpy())


def test_head_file_and_onnx_head_keep_the_shift(tmp_path):
    head = _tiny_head(0.5)
    loaded = load_head(save_head(head, tmp_path / "head.pt"))
    assert loaded.config.document_shift == 0.5
    for bad in (float("nan"), float("inf"), "2"):  # read back from a file: untrusted
        broken = _tiny_head(0.0)
        broken.config.document_shift = bad
        with pytest.raises(ModelError, match="document shift must be a finite number"):
            load_head(save_head(broken, tmp_path / "bad.pt"))
    z = np.random.default_rng(0).standard_normal((7, 2)).astype(np.float32)
    onnx = OnnxHead(export_head_onnx(loaded, tmp_path / "head.onnx"))
    with torch.no_grad():
        want_q, want_d = head(torch.from_numpy(z)).numpy(), head(torch.from_numpy(z), document=True).numpy()
    assert np.abs(onnx.encode(z).toarray() - want_q).max() < 1e-6
    assert np.abs(onnx.encode(z, document=True).toarray() - want_d).max() < 1e-6
    assert not np.array_equal(want_q, want_d)
    # A head without a shift exports one output; both sides read it.
    plain = OnnxHead(export_head_onnx(_tiny_head(0.0), tmp_path / "plain.onnx"))
    assert [o.name for o in plain.session.get_outputs()] == ["sparse"]
    assert np.array_equal(plain.encode(z, document=True).toarray(), plain.encode(z).toarray())


@pytest.fixture(scope="module")
def sparse_start_head(synthetic):
    """An untrained head that starts sparse (per-term bias -0.5, about 12 terms a vector)."""
    (train, _, _), _, _ = synthetic
    return build_head(train.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32, seed=0, bias_init=-0.5)


def test_choice_is_the_best_validation_r1_within_the_budget(synthetic, sparse_start_head):
    (_, _, _), (va, vat, _), _ = synthetic
    head = sparse_start_head
    shifts = (0.0, 0.1, 0.2, 0.3)
    measured = {}
    for s in shifts:  # the reference: every shift validated by hand
        head.config.document_shift = s
        measured[s] = validate(head, va, vat, "c+w", torch.device("cpu"))
    flops = [measured[s]["FLOPs"] for s in shifts]
    assert flops == sorted(flops) and flops[-1] > 2 * flops[0]  # more shift, more terms, more FLOPs
    budget = (flops[1] + flops[2]) / 2  # shifts 0 and 1 fit, 2 and 3 do not
    choice = choose_document_shift(head, va, vat, "c+w", budget, shifts=shifts)
    best = max(shifts[:2], key=lambda s: (measured[s]["R@1"], -s))
    assert choice.shift == best == head.config.document_shift > 0  # the shift paid here
    assert [r["within_budget"] for r in choice.table] == [True, True, False, False]
    assert [r["R@1"] for r in choice.table] == [measured[s]["R@1"] for s in shifts]
    # Nothing fits (the unshifted head alone is over budget), or no budget: no shift.
    assert choose_document_shift(head, va, vat, "c+w", flops[0] / 2, shifts=shifts).shift == 0.0
    assert choose_document_shift(head, va, vat, "c+w", 0.0, shifts=shifts).shift == 0.0
    # With boosts: the best (shift, boost) pair within the budget, every pair measured.
    both = choose_document_shift(head, va, vat, "c+w", budget, shifts=shifts[:2], boosts=(0.0, 1.0))
    assert [(r["shift"], r["boost"]) for r in both.table] == [(0.0, 0.0), (0.0, 1.0), (0.1, 0.0), (0.1, 1.0)]
    fits = [r for r in both.table if r["within_budget"]]
    pick = max(fits, key=lambda r: r["R@1"])  # the first of equals: smaller shift, then boost
    assert (both.shift, both.boost) == (pick["shift"], pick["boost"]) == (head.config.document_shift,
                                                                          head.config.query_word_boost)
    # One boost is a setting, not a choice: kept whether or not any shift fits.
    fixed = choose_document_shift(head, va, vat, "c+w", budget, shifts=shifts[:2], boosts=(1.0,))
    assert [(r["shift"], r["boost"]) for r in fixed.table] == [(0.0, 1.0), (0.1, 1.0)] and fixed.boost == 1.0
    assert choose_document_shift(head, va, vat, "c+w", flops[0] / 2, shifts=shifts, boosts=(1.0,)).boost == 1.0
    head.config.query_word_boost = 0.0
    # Documents are encoded with the chosen shift, queries never.
    head.config.document_shift = 0.3
    q = encode_sparse(head, va.text_emb[:20])
    head.config.document_shift = 0.0
    assert (q != encode_sparse(head, va.text_emb[:20])).nnz == 0


def test_training_encodes_images_with_the_heads_document_shift(synthetic, tmp_path):
    """Images are documents in training too: a head that carries a shift trains on denser
    images (its images' L1 is larger from the first epoch), queries as before."""
    from d2s_search.train.trainer import TrainConfig, train

    (tr, trt, _), (va, vat, _), _ = synthetic
    l1 = {}
    for shift in (0.0, 0.3):
        head = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32, seed=0, bias_init=-0.5)
        head.config.document_shift = shift
        cfg = TrainConfig(epochs=1, batch_size=128, eta=1e-2, val_images=0, warmup=0.0)
        summary = train(head, tr, trt, cfg, tmp_path / str(shift), va, vat, progress=False)
        l1[shift] = (summary["history"][0]["l1_img"], summary["history"][0]["l1_cap"])
        assert load_head(tmp_path / str(shift) / "head.pt").config.document_shift == shift
    assert l1[0.3][0] > 1.5 * l1[0.0][0]


def test_query_word_boost_lands_once_on_own_allowed_tokens_only():
    head = _tiny_head(0.0)
    head.config.query_word_boost = 0.7
    z = torch.tensor([[3.0, 1.0]])
    ids = torch.tensor([[1, 1, 3, 2, 0, 0]])  # term 1 twice, 3 excluded, then padding (id 0, mask 0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        plain = head(z)
        got = head.with_own_words(plain, ids, mask).numpy()[0]
    want = plain.numpy()[0] + np.array([0.0, 0.7, 0.7, 0.0])  # id 0 is padding here: nothing
    assert np.allclose(got, want, atol=1e-6)
    # The same rule on stored vectors (evaluation, validation), from token id lists.
    from d2s_search.evaluate import boost_own_words

    allowed = head.allowed.numpy() > 0
    x = boost_own_words(sp.csr_matrix(plain.numpy()), [np.array([1, 1, 3, 2])], allowed, 0.7)
    assert np.allclose(x.toarray()[0], want, atol=1e-6)
    head.config.query_word_boost = 0.0
    assert torch.equal(head.with_own_words(plain, ids, mask), plain)


def test_onnx_head_applies_the_recorded_boost_like_the_torch_head(tmp_path):
    from d2s_search.evaluate import EvalData, sparse_from_head

    head = _tiny_head(0.5)
    head.config.query_word_boost = 1.25
    pt = save_head(head, tmp_path / "head.pt")
    onnx = export_head_onnx(head, tmp_path / "head.onnx")
    rng = np.random.default_rng(1)
    data = EvalData(["q0", "q1", "q2"], ["a", "b", "c"], rng.standard_normal((3, 2)).astype(np.float32),
                    ["d0", "d1"], rng.standard_normal((2, 2)).astype(np.float32), [np.array([0])] * 3, "t")
    tokens = [np.array([0, 2]), np.array([3]), np.array([1, 2])]
    a, b = sparse_from_head(pt, data, tokens), sparse_from_head(onnx, data, tokens)
    assert np.abs(a.queries.toarray() - b.queries.toarray()).max() < 1e-6
    assert np.abs(a.docs.toarray() - b.docs.toarray()).max() < 1e-6
    with torch.no_grad():
        plain = head(torch.from_numpy(data.query_emb)).numpy()
    assert np.allclose(a.queries.toarray() - plain, [[1.25, 0, 1.25, 0], [0, 0, 0, 0], [0, 1.25, 1.25, 0]], atol=1e-6)
    with pytest.raises(ModelError, match="query token ids"):
        sparse_from_head(onnx, data, None)


def test_damaged_boost_metadata_of_an_onnx_head_is_refused_in_one_line(tmp_path):
    import onnx

    head = _tiny_head(0.0)
    head.config.query_word_boost = 1.0
    path = export_head_onnx(head, tmp_path / "head.onnx")
    for bad in ('{"vocab_size": 4, "query_word_boost": "nan"}', '{"query_word_boost": 1.0}',
                '{"vocab_size": 4, "query_word_boost": 1.0, "excluded_ids": [9]}', "[1, 2"):
        model = onnx.load(str(path))
        for entry in model.metadata_props:
            if entry.key == "d2s_head":
                entry.value = bad
        onnx.save(model, str(tmp_path / "bad.onnx"))
        with pytest.raises(ModelError, match="damaged d2s_head metadata") as err:
            OnnxHead(tmp_path / "bad.onnx")
        assert "\n" not in str(err.value)


def test_distractors_make_a_larger_collection_of_the_same_judgements(synthetic):
    from d2s_search.train.validation import pick_distractors, with_distractors

    (tr, _, _), (va, _, _), _ = synthetic
    extra = pick_distractors(tr.image_emb, tr.caption_image, limit=10**6)
    used = np.unique(tr.caption_image)
    assert np.array_equal(extra, tr.image_emb[used])  # below the limit: every training image a caption uses
    few = pick_distractors(tr.image_emb, tr.caption_image, limit=5, seed=1)
    assert few.shape == (5, tr.dim) and np.array_equal(few, pick_distractors(tr.image_emb, tr.caption_image, 5, 1))
    assert all(any(np.array_equal(row, img) for img in tr.image_emb[used]) for row in few)
    assert pick_distractors(tr.image_emb, tr.caption_image, limit=0).shape == (0, tr.dim)
    pool = with_distractors(va, extra)
    assert len(pool.image_ids) == len(va.image_ids) + len(extra) == len(set(pool.image_ids))
    assert np.array_equal(pool.image_emb[: len(va.image_ids)], va.image_emb)
    assert [q.tolist() for q in pool.qrels()] == [q.tolist() for q in va.qrels()]  # no caption points to them
    with pytest.raises(ValueError, match="distractors must be"):
        with_distractors(va, extra[:, :-1])


def test_with_distractors_the_choice_follows_r1_over_the_larger_collection(synthetic, sparse_start_head):
    from d2s_search.train.trainer import (
        validation_documents,
        validation_metrics,
        validation_queries,
    )
    from d2s_search.train.validation import pick_distractors, with_distractors

    (tr, _, _), (va, vat, _), _ = synthetic
    head = sparse_start_head
    shifts = (0.0, 0.1, 0.2, 0.3)
    extra = pick_distractors(tr.image_emb, tr.caption_image)
    pool = with_distractors(va, extra)
    alone = choose_document_shift(head, va, vat, "c+w", 1e9, shifts=shifts)
    choice = choose_document_shift(head, va, vat, "c+w", 1e9, shifts=shifts, distractors=extra)
    assert choice.distractors == len(extra) > 0 and alone.distractors == 0
    q = validation_queries(head, va, vat, "c+w", torch.device("cpu"))
    for row, own in zip(choice.table, alone.table, strict=True):
        head.config.document_shift = row["shift"]  # the reference, by hand over the larger collection
        docs = validation_documents(head, pool, torch.device("cpu"))
        assert row["R@1"] == validation_metrics(q, docs, pool)["R@1"]
        assert row["R@1_own"] == own["R@1"] and row["FLOPs"] == own["FLOPs"]  # the budget: validation images
    assert min(r["R@1"] for r in choice.table) < min(r["R@1"] for r in alone.table)  # a harder collection
    best = max(choice.table, key=lambda r: (r["R@1"], -r["shift"]))
    assert choice.shift == best["shift"] == head.config.document_shift
    head.config.document_shift = 0.0


def test_document_terms_keep_an_images_strongest_terms_only(tmp_path):
    # Shifted by 0.5 the document scores are log1p of (1.0, 0, 0.3, excluded): two terms;
    # kept to one, only the strongest stays, with its weight; queries are never cut.
    head = _tiny_head(0.5)
    z = torch.tensor([[3.0, 1.0], [1.0, 3.0]])
    with torch.no_grad():
        full = head(z, document=True).numpy()
        head.config.document_terms = 1
        kept = head(z, document=True).numpy()
        query = head(z).numpy()
    assert ((full > 0).sum(axis=1) > 1).any()
    for row in range(2):
        top = int(np.argmax(full[row]))
        want = np.zeros(4, dtype=np.float32)
        want[top] = full[row, top]
        assert np.array_equal(kept[row], want)
    head.config.document_terms = 0
    with torch.no_grad():
        assert np.array_equal(head(z).numpy(), query)
    # Saved and exported with the head; a bad count read back from a file is refused in one line.
    head.config.document_terms = 1
    loaded = load_head(save_head(head, tmp_path / "head.pt"))
    assert loaded.config.document_terms == 1
    onnx = OnnxHead(export_head_onnx(loaded, tmp_path / "head.onnx"))
    zz = np.random.default_rng(1).standard_normal((9, 2)).astype(np.float32)
    with torch.no_grad():
        want = loaded(torch.from_numpy(zz), document=True).numpy()
    assert np.abs(onnx.encode(zz, document=True).toarray() - want).max() < 1e-6
    assert ((want > 0).sum(axis=1) <= 1).all()
    for bad in (-1, 2.5, "3", True):
        head.config.document_terms = bad
        with pytest.raises(ModelError, match="document terms must be a whole number"):
            load_head(save_head(head, tmp_path / "bad.pt"))


def test_choice_scores_documents_with_their_terms_cap(synthetic, sparse_start_head):
    """The shift is chosen on documents as the head will encode them: with its cap."""
    (_, _, _), (va, vat, _), _ = synthetic
    head = sparse_start_head
    head.config.document_terms = 3
    try:
        choice = choose_document_shift(head, va, vat, "c+w", 1e9, shifts=(0.0, 0.3))
        assert all(r["terms_per_image"] <= 3 for r in choice.table)
        head.config.document_terms = 0
        uncapped = choose_document_shift(head, va, vat, "c+w", 1e9, shifts=(0.0, 0.3))
        assert max(r["terms_per_image"] for r in uncapped.table) > 3
    finally:
        head.config.document_terms = 0
        head.config.document_shift = 0.0


def test_floors_keep_every_term_within_its_share_of_images(synthetic, sparse_start_head, tmp_path):
    """After the floors, no term is on more of the images than max(share, its captions' share);
    a term under that keeps every weight, a floored one keeps its strongest images' weights."""
    from d2s_search.metrics import active_share
    from d2s_search.train.calibrate import caption_share, choose_document_floors

    (tr, trt, _), _, _ = synthetic
    head = sparse_start_head
    head.config.document_shift = 0.3
    try:
        before = encode_sparse(head, tr.image_emb, document=True).toarray()
        share = active_share(sp.csr_matrix(before))
        max_share = float(np.quantile(share[share > 0], 0.9))  # some terms are over it
        captions = caption_share(tr.caption_image, trt, len(tr.image_ids), head.config.vocab_size)
        floors = choose_document_floors(head, tr, trt, max_share)
        over = np.flatnonzero(share > np.maximum(max_share, captions))
        assert sorted(floors) == over.tolist() and len(over) > 0
        after = encode_sparse(head, tr.image_emb, document=True).toarray()
        n = len(tr.image_ids)
        for term in range(head.config.vocab_size):
            kept = after[:, term] > 0
            if term in floors:
                assert kept.sum() <= int(max(max_share, captions[term]) * n)
                assert (before[kept, term] > floors[term]).all()
                assert np.array_equal(after[kept, term], before[kept, term])
            else:
                assert np.array_equal(after[:, term], before[:, term])
        # By hand for one term: the caption share is the share of images whose captions hold it.
        term = int(over[0])
        by_hand = np.mean([any(term in trt.row(c) for c in np.flatnonzero(tr.caption_image == i))
                           for i in range(n)])
        assert captions[term] == pytest.approx(by_hand)
        # Saved, loaded and exported with the head.
        again = load_head(save_head(head, tmp_path / "floored.pt"))
        assert again.config.document_floors == floors
        assert np.array_equal(encode_sparse(again, tr.image_emb, document=True).toarray(), after)
    finally:
        head.config.document_shift = 0.0
        head.config.document_floors = {}
        head.floor.zero_()


def test_bad_floors_read_back_from_a_file_are_refused_in_one_line(tmp_path):
    head = _tiny_head(0.5)
    head.config.document_floors = {0: 0.25}
    assert load_head(save_head(head, tmp_path / "ok.pt")).floor.tolist() == [0.25, 0.0, 0.0, 0.0]
    for bad in ({4: 0.1}, {-1: 0.1}, {0: float("nan")}, {0: -0.5}, {"0": 0.1}, [0.1]):
        head.config.document_floors = bad
        with pytest.raises(ModelError, match="document floors must map term ids below 4"):
            load_head(save_head(head, tmp_path / "bad.pt"))


def test_query_shift_is_added_to_query_scores_only_and_chosen_within_the_budget(synthetic, sparse_start_head,
                                                                                 tmp_path):
    # By hand on the tiny head: z = (3, 1) scores about (1, -2.5, -0.2, excluded); a query shift
    # of 0.5 gives the third term 0.3, the document side is untouched.
    head = _tiny_head(0.0)
    head.config.query_shift = 0.5
    z = torch.tensor([[3.0, 1.0]])
    h = 1 / np.sqrt(1 + 1e-5)
    with torch.no_grad():
        assert np.allclose(head(z).numpy()[0], [np.log1p(h + 0.5), 0.0, np.log1p(0.3), 0.0], atol=1e-6)
        assert np.allclose(head(z, document=True).numpy()[0], [np.log1p(h), 0.0, 0.0, 0.0], atol=1e-6)
    loaded = load_head(save_head(head, tmp_path / "q.pt"))
    assert loaded.config.query_shift == 0.5
    onnx = OnnxHead(export_head_onnx(loaded, tmp_path / "q.onnx"))  # two outputs: the sides differ
    zz = np.random.default_rng(2).standard_normal((5, 2)).astype(np.float32)
    with torch.no_grad():
        assert np.abs(onnx.encode(zz).toarray() - loaded(torch.from_numpy(zz)).numpy()).max() < 1e-6
        assert np.abs(onnx.encode(zz, document=True).toarray()
                      - loaded(torch.from_numpy(zz), document=True).numpy()).max() < 1e-6
    # Chosen with the document shift: every pair measured, the best R@1 within the budget.
    (_, _, _), (va, vat, _), _ = synthetic
    head = sparse_start_head
    try:
        measured = {}
        for q in (0.0, 0.2):
            head.config.query_shift = q
            measured[q] = validate(head, va, vat, "c+w", torch.device("cpu"))
        assert measured[0.2]["FLOPs"] > measured[0.0]["FLOPs"]
        choice = choose_document_shift(head, va, vat, "c+w", 1e9, shifts=(0.0,), query_shifts=(0.0, 0.2))
        assert [(r["shift"], r["query_shift"]) for r in choice.table] == [(0.0, 0.0), (0.0, 0.2)]
        assert [r["R@1"] for r in choice.table] == [measured[0.0]["R@1"], measured[0.2]["R@1"]]
        best = max((0.0, 0.2), key=lambda q: (measured[q]["R@1"], -q))
        assert choice.query_shift == best == head.config.query_shift
        tight = choose_document_shift(head, va, vat, "c+w", measured[0.0]["FLOPs"], shifts=(0.0,),
                                      query_shifts=(0.0, 0.2))
        assert tight.query_shift == 0.0  # the larger query shift is over the budget
    finally:
        head.config.query_shift = 0.0
        head.config.document_shift = 0.0
