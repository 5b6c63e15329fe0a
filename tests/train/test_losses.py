import math

import pytest
import torch

from d2s_search.train.losses import d2s_loss, l1, quadratic_ramp, soft_cross_entropy


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def test_loss_matches_hand_computation():
    z_img = [[1.0, 0.0], [0.0, 1.0]]
    z_cap = [[0.8, 0.6], [0.6, 0.8]]
    s_img = [[1.0, 0.0, 2.0], [0.0, 1.0, 0.5]]
    s_cap = [[0.5, 0.0, 1.0], [0.0, 2.0, 0.0]]
    tau, eta, lam = 0.1, 0.01, 0.3
    # by hand: dense scores, teacher rows, student logits, cross entropies
    dense = [[sum(a * b for a, b in zip(i, c)) for c in z_cap] for i in z_img]  # [[.8,.6],[.6,.8]]
    t_i2c = [_softmax([x / tau for x in row]) for row in dense]
    t_c2i = [_softmax([dense[i][j] / tau for i in range(2)]) for j in range(2)]
    S = [[sum(a * b for a, b in zip(i, c)) for c in s_cap] for i in s_img]  # [[2.5,0],[0.5,2]]
    assert S == [[2.5, 0.0], [0.5, 2.0]]
    def ce(targets, logits_rows):
        tot = 0.0
        for t, row in zip(targets, logits_rows):
            lse = math.log(sum(math.exp(x) for x in row))
            tot += -sum(ti * (x - lse) for ti, x in zip(t, row))
        return tot / len(targets)
    ce_i2c = ce(t_i2c, S)
    ce_c2i = ce(t_c2i, [[S[i][j] for i in range(2)] for j in range(2)])
    l1_img = (3.0 + 1.5) / 2
    l1_cap = (1.5 + 2.0) / 2
    step, warm = 5, 10
    eta_t = eta * (step / warm) ** 2
    expected = (1 - lam) * (ce_i2c + ce_c2i) / 2 + lam * eta_t * (l1_img + l1_cap) / 2

    parts = d2s_loss(
        torch.tensor(s_img), torch.tensor(s_cap), torch.tensor(z_img), torch.tensor(z_cap),
        tau=tau, eta=eta, lam=lam, step=step, warmup_steps=warm,
    )
    assert parts.ce_i2c == pytest.approx(ce_i2c, rel=1e-6)
    assert parts.ce_c2i == pytest.approx(ce_c2i, rel=1e-6)
    assert parts.l1_img == pytest.approx(l1_img) and parts.l1_cap == pytest.approx(l1_cap)
    assert parts.eta_t == pytest.approx(eta_t)
    assert float(parts.total) == pytest.approx(expected, rel=1e-6)
    # the same number worked out on paper: teacher row 0 = softmax(8, 6), row 1 = softmax(6, 8)
    assert ce_i2c == pytest.approx(0.378557, abs=1e-6)
    # SPLADE's separate weights: the images' sparsity term scaled (here by 0.25), the captions' not
    scaled = d2s_loss(
        torch.tensor(s_img), torch.tensor(s_cap), torch.tensor(z_img), torch.tensor(z_cap),
        tau=tau, eta=eta, lam=lam, step=step, warmup_steps=warm, image_eta_scale=0.25,
    )
    want = (1 - lam) * (ce_i2c + ce_c2i) / 2 + lam * eta_t * (0.25 * l1_img + l1_cap) / 2
    assert float(scaled.total) == pytest.approx(want, rel=1e-6) and float(scaled.total) < float(parts.total)


def test_loss_gradient_flows_to_both_sides():
    s_img = torch.rand(3, 5, requires_grad=True)
    s_cap = torch.rand(3, 5, requires_grad=True)
    z = torch.nn.functional.normalize(torch.randn(3, 4), dim=1)
    d2s_loss(s_img, s_cap, z, z, tau=1e-3, eta=1e-3, step=10, warmup_steps=10).total.backward()
    assert s_img.grad.abs().sum() > 0 and s_cap.grad.abs().sum() > 0


def test_quadratic_ramp_and_helpers():
    assert [quadratic_ramp(s, 10) for s in (0, 5, 10, 20)] == [0.0, 0.25, 1.0, 1.0]
    assert quadratic_ramp(3, 0) == 1.0
    assert float(l1(torch.tensor([[1.0, -2.0], [0.0, 3.0]]))) == pytest.approx(3.0)
    # soft CE with a one-hot target is the ordinary cross entropy
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    target = torch.tensor([[1.0, 0.0, 0.0]])
    assert float(soft_cross_entropy(logits, target)) == pytest.approx(
        float(torch.nn.functional.cross_entropy(logits, torch.tensor([0]))), rel=1e-6
    )


def test_teacher_is_fp32_safe_at_tiny_tau():
    z = torch.nn.functional.normalize(torch.randn(4, 8), dim=1).half()
    parts = d2s_loss(torch.rand(4, 6), torch.rand(4, 6), z, z, tau=1e-3)
    assert math.isfinite(float(parts.total))


def test_flops_regulariser_by_hand():
    from d2s_search.train.losses import flops_reg

    s = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    # mean |activation| per term over the batch: [2, 0, 1] -> 2^2 + 0 + 1^2 = 5
    assert float(flops_reg(s)) == pytest.approx(5.0)
    # a term active in every row costs more than the same mass spread over rare terms
    shared = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [1.0, 0, 0, 0], [1.0, 0, 0, 0]])
    spread = torch.eye(4)
    assert float(flops_reg(shared)) == pytest.approx(1.0) and float(flops_reg(spread)) == pytest.approx(0.25)
    assert float(l1(shared)) == float(l1(spread))  # L1 cannot tell them apart

    s_img = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.5]])
    s_cap = torch.tensor([[0.5, 0.0, 1.0], [0.0, 2.0, 0.0]])
    z = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=1)
    eta, lam = 0.1, 0.3
    with_l1 = d2s_loss(s_img, s_cap, z, z, eta=eta, lam=lam)
    with_flops = d2s_loss(s_img, s_cap, z, z, eta=eta, lam=lam, regularizer="flops")
    # FLOPS by hand: images mean [.5, .5, 1.25] -> .25 + .25 + 1.5625 = 2.0625;
    # captions mean [.25, 1, .5] -> .0625 + 1 + .25 = 1.3125
    assert with_flops.reg_img == pytest.approx(2.0625) and with_flops.reg_cap == pytest.approx(1.3125)
    ce = (with_l1.ce_i2c + with_l1.ce_c2i) / 2
    assert float(with_flops.total) == pytest.approx((1 - lam) * ce + lam * eta * (2.0625 + 1.3125) / 2, rel=1e-6)
    assert with_flops.l1_img == with_l1.l1_img  # L1 is still reported
    with pytest.raises(ValueError, match="regulariser"):
        d2s_loss(s_img, s_cap, z, z, regularizer="l2")


def test_lexical_term_by_hand():
    from d2s_search.train.losses import d2s_loss, off_caption_mass

    s = torch.tensor([[1.0, 3.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 2.0]])
    words = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    # row 0: 1 of 4 on its words -> 3/4 off; row 1: no mass -> 0; row 2: all on its words -> 0
    assert float(off_caption_mass(s, words)) == pytest.approx(0.75 / 3, rel=1e-5)
    z = torch.nn.functional.normalize(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    base = d2s_loss(s, s, z, z, eta=0.1, lam=0.3, regularizer="flops")
    with_lex = d2s_loss(s, s, z, z, eta=0.1, lam=0.3, regularizer="flops", mu=2.0, image_words=words)
    assert float(with_lex.total) == pytest.approx(float(base.total) + 2.0 * 0.25, rel=1e-5)
    assert with_lex.lex == pytest.approx(0.25, rel=1e-5) and base.lex == 0.0
    with pytest.raises(ValueError):
        d2s_loss(s, s, z, z, mu=1.0)
    # the gradient moves mass toward the caption's words: the off-caption term's weight gets a
    # positive gradient (descent lowers it), the caption word's a negative one
    s_req = s.clone().requires_grad_(True)
    off_caption_mass(s_req, words).backward()
    assert s_req.grad[0, 1] > 0 > s_req.grad[0, 0]
