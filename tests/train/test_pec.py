import numpy as np
import pytest
import torch

from d2s_search.train import trainer as trainer_mod
from d2s_search.train.modeling import build_head
from d2s_search.train.pec import (
    PEC,
    caption_expansion_prob,
    own_token_mask,
    progress,
    word_expansion_prob,
)
from d2s_search.train.trainer import TrainConfig, train
from d2s_search.train.vocab import CaptionTokens, document_frequency
from tests.train.train_synthetic import SPECIAL, VOCAB


def test_caption_level_schedule_values():
    E = 5
    paper = [caption_expansion_prob("c", e, E) for e in range(E)]
    assert paper == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])  # starts at 0, +1/E per epoch
    assert caption_expansion_prob("c+w", E, E) == 1.0  # capped at 1
    authors = [caption_expansion_prob("c", e, 20, "authors") for e in (0, 10, 19)]
    assert authors == pytest.approx([0.0, 10 / 19, 1.0])  # 1 from 95% of training on
    assert caption_expansion_prob("c", 0, 4, "reverse") == 1.0
    assert caption_expansion_prob("c", 3, 4, "reverse") == pytest.approx(0.25)
    assert [caption_expansion_prob("0", e, E) for e in range(E)] == [0.0] * E
    assert [caption_expansion_prob("1", e, E) for e in range(E)] == [1.0] * E
    with pytest.raises(ValueError):
        progress(0, 3, "sideways")


def test_word_level_probabilities_from_df():
    tokens = CaptionTokens.from_lists([[5, 6], [5, 7], [5], [8]], vocab_size=10)
    df = document_frequency(tokens)
    assert df[5] == 0.75 and df[6] == 0.25 and df[9] == 0.0
    E = 4
    first = word_expansion_prob(df, "c+w", 0, E)
    last = word_expansion_prob(df, "c+w", E - 1, E)
    np.testing.assert_allclose(first, 1 - df)  # p_v starts at 1 - df_v
    np.testing.assert_allclose(last, 1 - df + (E - 1) * df / E)  # rises by df_v / E per epoch
    step = word_expansion_prob(df, "c+w", 2, E) - word_expansion_prob(df, "c+w", 1, E)
    np.testing.assert_allclose(step, df / E)
    np.testing.assert_allclose(word_expansion_prob(df, "c", 0, E), np.ones(10))


def _tokens(n=64, vocab=50, seed=0):
    rng = np.random.default_rng(seed)
    return CaptionTokens.from_lists([rng.choice(np.arange(5, vocab), 4, replace=False) for _ in range(n)], vocab)


def test_caption_level_masking_frequency_per_epoch():
    tokens = _tokens()
    E, draws = 5, 400
    pec = PEC("c", tokens, document_frequency(tokens), E, seed=1)
    rows = np.arange(8)
    for epoch in range(E):
        expanded = sum(pec.draw(rows, epoch)[1] for _ in range(draws))
        p = epoch / E
        sd = max(np.sqrt(draws * p * (1 - p)), 1e-9)
        assert abs(expanded - draws * p) <= 4 * sd + 1e-9, (epoch, expanded)
    # exp=0 never expands, exp=1 always
    assert all(PEC("0", tokens, np.zeros(50), E).draw(rows, 4)[1] == 0 for _ in range(20))
    assert all(PEC("1", tokens, np.zeros(50), E).draw(rows, 0) == (None, 1) for _ in range(20))


def test_word_level_allowed_frequency_matches_one_minus_df():
    # term 5 is in every caption of the collection, term 6 in half, term 7 in a quarter
    rows = [[5, 6, 7]] * 4 + [[5, 6]] * 4 + [[5, 8]] * 8
    tokens = CaptionTokens.from_lists(rows, 12)
    df = document_frequency(tokens)
    E, draws = 2, 600
    pec = PEC("c+w", tokens, df, E, seed=3)
    batch = np.array([15])  # a caption containing only 5 and 8
    allowed = np.zeros(12)
    n = 0
    for _ in range(draws):
        mask, e_c = pec.draw(batch, epoch=1)  # p_c = 0.5 at epoch 1 of 2
        if e_c:
            allowed += mask[0].numpy()
            n += 1
    freq = allowed / n
    p_v = 1 - df * 0.5  # epoch 1 of 2: 1 - df (1 - 1/2)
    assert freq[5] == 1.0 and freq[8] == 1.0  # own tokens always kept
    for v in (6, 7, 9):
        sd = np.sqrt(p_v[v] * (1 - p_v[v]) / n)
        assert abs(freq[v] - p_v[v]) <= 4 * sd + 1e-9, (v, freq[v], p_v[v])


def test_masked_caption_vectors_hold_only_own_tokens():
    tokens = _tokens(n=16, vocab=VOCAB)
    head = build_head(12, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=16, seed=0)
    z = torch.nn.functional.normalize(torch.randn(16, 12, generator=torch.Generator().manual_seed(0)), dim=1)
    pec = PEC("0", tokens, document_frequency(tokens), 3)
    rows = np.arange(16)
    mask, e_c = pec.draw(rows, 0)
    s = head(z)
    assert (s > 0).sum() > 16 * 20  # the unmasked head does expand...
    masked = s * mask
    assert (masked > 0).sum() >= 16  # ...the masked one keeps some terms...
    for i in rows:
        nz = set(torch.nonzero(masked[i]).flatten().tolist())
        assert nz <= set(tokens.row(i).tolist())  # ...but only the caption's own tokens
    assert torch.equal(mask, own_token_mask(tokens, rows))


def test_images_are_never_masked_in_training(synthetic, tmp_path, monkeypatch):
    (tr, trt, _), _, _ = synthetic
    head = build_head(tr.dim, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32, seed=0)
    seen = []
    real_loss = trainer_mod.d2s_loss

    def spy(s_img, s_cap, z_img, z_cap, *args, **kwargs):
        with torch.no_grad():
            seen.append((s_img.detach().clone(), s_cap.detach().clone(), head(z_img), head(z_cap)))
        return real_loss(s_img, s_cap, z_img, z_cap, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "d2s_loss", spy)
    train(head, tr, trt, TrainConfig(expansion="0", epochs=1, batch_size=64), tmp_path, progress=False)
    assert seen
    for s_img, s_cap, full_img, full_cap in seen:
        assert torch.equal(s_img, full_img)  # images: the head's full output
        assert not torch.equal(s_cap, full_cap)  # captions: masked
        assert (s_img > 0).sum(1).min() > (s_cap > 0).sum(1).max()


def test_literal_word_gating_also_gates_own_words():
    rows = [[5, 6, 7]] * 4 + [[5, 6]] * 4 + [[5, 8]] * 8
    tokens = CaptionTokens.from_lists(rows, 12)
    df = document_frequency(tokens)  # df[5] = 1, df[8] = 0.5
    pec = PEC("c+w", tokens, df, 2, seed=3, gate_own_words=True)
    kept, n = np.zeros(12), 0
    for _ in range(600):
        mask, e_c = pec.draw(np.array([15]), epoch=1)  # caption with own words 5 and 8
        if e_c:
            kept += mask[0].numpy()
            n += 1
    freq = kept / n
    p_v = 1 - df * 0.5
    assert freq[5] < 1.0  # an own word can be gated away now
    for v in (5, 8, 9):
        sd = np.sqrt(p_v[v] * (1 - p_v[v]) / n)
        assert abs(freq[v] - p_v[v]) <= 4 * sd + 1e-9, (v, freq[v], p_v[v])
    # E_C = 0 batches still keep exactly the own words
    mask, e_c = PEC("c+w", tokens, df, 2, seed=0, gate_own_words=True).draw(np.array([15]), epoch=0)
    assert e_c == 0 and torch.equal(mask, own_token_mask(tokens, np.array([15])))


def test_head_options_start_sparse_and_limit_terms():
    from d2s_search.train.vocab import load_tokenizer

    tok = load_tokenizer()
    z = torch.nn.functional.normalize(torch.randn(8, 12, generator=torch.Generator().manual_seed(0)), dim=1)
    plain = build_head(12, "random", SPECIAL, vocab_size=tok.get_vocab_size(), hidden_dim=16, seed=0)
    biased = build_head(12, "random", SPECIAL, vocab_size=tok.get_vocab_size(), hidden_dim=16, seed=0,
                        bias_init=-3.0)
    assert biased.config.output_bias and torch.equal(biased.vocab.bias, torch.full((tok.get_vocab_size(),), -3.0))
    with torch.no_grad():
        assert torch.allclose(biased.logits(z), plain.logits(z) - 3.0, atol=1e-5)
        assert (biased(z) > 0).sum() < (plain(z) > 0).sum()
    gained = build_head(12, "random", SPECIAL, vocab_size=tok.get_vocab_size(), hidden_dim=16, seed=0, norm_gain=0.5)
    with torch.no_grad():  # the gain scales every logit (no bias): a scaled W2 without changing W2
        assert torch.allclose(gained.logits(z), 0.5 * plain.logits(z), atol=1e-5)
    words = build_head(12, "random", SPECIAL, vocab_size=tok.get_vocab_size(), hidden_dim=16, seed=0,
                       output_terms="words", tokenizer=tok)
    vocab = tok.get_vocab()
    with torch.no_grad():
        s = words(z)
    active = set(torch.nonzero(s)[:, 1].tolist())
    assert active and all(i not in active for i in (vocab["."], vocab["the"], vocab["##s"], vocab["a"]))
    assert words.allowed[vocab["dog"]] == 1 and words.allowed[vocab["the"]] == 0
