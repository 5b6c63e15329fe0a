import numpy as np
import torch

from d2s_search.train.joint import (
    JointConfig,
    JointModel,
    dense_metrics,
    image_batches,
    joint_loss,
    make_optimizer,
    optimizer_step,
    project,
    train_joint,
)
from d2s_search.train.modeling import build_head
from d2s_search.train.trainer import validate
from tests.train.train_synthetic import SPECIAL, VOCAB


def _projections(d_in, d_out, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a poor starting projection: random, so the dense run has room to improve
    return {"text_proj.weight": torch.randn(d_out, d_in, generator=g) * 0.2, "text_proj.bias": torch.zeros(d_out),
            "vision_proj.weight": torch.randn(d_out, d_in, generator=g) * 0.2, "vision_proj.bias": torch.zeros(d_out)}


def test_joint_loss_parts_and_gradients(synthetic):
    (tr, _, _), _, _ = synthetic
    head = build_head(24, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32)
    model = JointModel(head, _projections(tr.dim, 24), tau=0.07)
    f_t = torch.as_tensor(tr.text_emb[:16])
    f_i = torch.as_tensor(tr.image_emb[tr.caption_image[:16]])
    cfg = JointConfig()
    parts = joint_loss(model, f_t, f_i, cfg, step=5, warmup=10)
    expect = ((cfg.lambda1 * parts["nce_dense"] + cfg.lambda2 * parts["nce_sparse"] + parts["nce_inter"]) / 4
              + (cfg.lambda1 * parts["kd_dense"] + cfg.lambda2 * parts["kd_sparse"]) / 4
              + 0.25 * (cfg.eta_text * parts["l1_text"] + cfg.eta_image * parts["l1_image"]) / 2)
    assert abs(float(parts["total"].detach()) - expect) < 1e-4
    parts["total"].backward()
    for p in (model.text_proj.weight, model.vision_proj.weight, model.head.proj.weight, model.temperature):
        assert p.grad is not None and p.grad.abs().sum() > 0
    # Images are documents: a head with a document shift gives them (only them) more mass.
    head.config.document_shift = 0.5
    shifted = joint_loss(model, f_t, f_i, cfg, step=5, warmup=10)
    assert shifted["l1_text"] == parts["l1_text"] and shifted["l1_image"] > parts["l1_image"]


def test_joint_training_improves_dense_and_sparse(synthetic, tmp_path):
    (tr, _, _), (va, vat, _), _ = synthetic
    proj = _projections(tr.dim, 24)
    head = build_head(24, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32)
    start = JointModel(build_head(24, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32), proj, 0.07)
    dense_before = dense_metrics(project(start, va))["R@1"]
    sparse_before = validate(start.head, project(start, va), vat, "1", torch.device("cpu"))["R@1"]
    cfg = JointConfig(lr=3e-3, epochs=8, batch_size=128)
    summary = train_joint(head, proj, tr, cfg, tmp_path, va, vat)
    best = max(summary["history"], key=lambda h: h["val_sparse"]["R@1"])
    assert best["val_dense"]["R@1"] > dense_before + 0.1, (dense_before, best["val_dense"])
    assert best["val_sparse"]["R@1"] > sparse_before + 0.1, (sparse_before, best["val_sparse"])
    assert (tmp_path / "head.pt").is_file() and (tmp_path / "projections.safetensors").is_file()


def test_cli_joint_objective(tmp_path):
    import json

    from click.testing import CliRunner
    from safetensors.torch import save_file

    from d2s_search.cli.train import train
    from d2s_search.train.data import write_embeddings

    rng = np.random.default_rng(0)
    write_embeddings(tmp_path, "img", ["0", "1", "2"], rng.standard_normal((3, 10)), kind="feats")
    write_embeddings(tmp_path, "text", ["a", "b", "c"], rng.standard_normal((3, 10)), kind="feats")
    meta = {"images": [{"imgid": str(i), "split": "train" if i < 2 else "val",
                        "sentences": [{"sentid": s, "raw": f"a photo of {w}"}]}
                       for i, (s, w) in enumerate(zip("abc", ["dogs", "cats", "cars"]))]}
    (tmp_path / "dataset_meta.json").write_text(json.dumps(meta))
    save_file(_projections(10, 8), str(tmp_path / "projections.safetensors"))
    res = CliRunner().invoke(train, ["--data", str(tmp_path), "--objective", "joint", "--mix", "0.5"])
    assert res.exit_code == 2 and "--mix applies to the sparse objective" in res.output
    res = CliRunner().invoke(train, ["--data", str(tmp_path), "--objective", "joint", "--epochs", "1",
                                     "--vocab-init", "random", "--out", str(tmp_path / "run"), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["history"][0]["val_dense"]["R@1"] in (0.0, 1.0)
    assert (tmp_path / "run" / "projections.safetensors").is_file()
    # The document shift is chosen on the fine-tuned validation vectors and saved in the head.
    from d2s_onnx_export.head import load_head

    assert [r["shift"] for r in out["document_shift"]["tried"]][0] == 0.0
    assert load_head(tmp_path / "run" / "head.pt").config.document_shift == out["document_shift"]["document_shift"]


class _Relu(torch.nn.Module):
    """A stand-in head with hand-computable outputs: z = relu(h)."""

    def forward(self, h, document=False):  # no document shift
        return torch.relu(h)


def _nce_np(s):
    def one(m):
        return float(np.mean([np.log(np.exp(r).sum()) - r[i] for i, r in enumerate(m)]))
    return (one(s) + one(s.T)) / 2


def _kd_np(s, t):
    def one(m, tm):
        p = np.exp(tm) / np.exp(tm).sum(1, keepdims=True)
        logq = m - np.log(np.exp(m).sum(1, keepdims=True))
        return float(-(p * logq).sum(1).mean())
    return (one(s, t) + one(s.T, t.T)) / 2


def test_joint_loss_against_a_hand_computed_batch():
    eye = {"text_proj.weight": torch.eye(2), "text_proj.bias": torch.zeros(2),
           "vision_proj.weight": torch.eye(2), "vision_proj.bias": torch.zeros(2)}
    model = JointModel(build_head(2, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=4), eye, tau=0.5)
    model.head = _Relu()
    f_t = torch.tensor([[2.0, 0.0], [0.0, 3.0]])  # normalised: [1, 0], [0, 1]
    f_i = torch.tensor([[3.0, 4.0], [0.0, 0.5]])  # normalised: [.6, .8], [0, 1]
    cfg = JointConfig(w1=0.5, w2=0.5, lambda1=0.9, lambda2=0.3, lambda3=0.5, eta_text=0.1, eta_image=0.01)
    parts = joint_loss(model, f_t, f_i, cfg, step=10, warmup=10)  # ramp complete
    s_dense = np.array([[0.6, 0.0], [0.8, 1.0]]) / 0.5
    s_sparse = np.array([[0.6, 0.0], [0.8, 1.0]])
    s_inter = 0.5 * s_dense + 0.5 * s_sparse
    kd_d, kd_s = _kd_np(s_dense, s_inter), _kd_np(s_sparse, s_inter)
    assert abs(parts["kd_dense"] - kd_d) < 1e-5 and abs(parts["kd_sparse"] - kd_s) < 1e-5
    assert abs(parts["l1_text"] - 1.0) < 1e-6 and abs(parts["l1_image"] - 1.2) < 1e-6
    # the public code's scale: contrastive and distillation halved twice, L1 once
    expect = ((0.9 * _nce_np(s_dense) + 0.3 * _nce_np(s_sparse) + 0.5 * _nce_np(s_inter)) / 4
              + (0.9 * kd_d + 0.3 * kd_s) / 4  # distillation weighted by lambda1 / lambda2
              + (0.1 * 1.0 + 0.01 * 1.2) / 2)
    assert abs(float(parts["total"].detach()) - expect) < 1e-5
    # half-way through the warm-up the L1 weight is (1/2)^2
    half = joint_loss(model, f_t, f_i, cfg, step=5, warmup=10)
    assert abs(float(half["total"].detach()) - (expect - 0.75 * (0.1 + 0.012) / 2)) < 1e-5
    # a PEC mask restricts the caption vectors (a zero mask leaves no caption terms)
    masked = joint_loss(model, f_t, f_i, cfg, step=10, warmup=10, text_mask=torch.zeros(2, 2))
    assert masked["l1_text"] == 0.0


def test_image_batches_never_hold_two_captions_of_one_image():
    rng = np.random.default_rng(3)
    cap_img = np.repeat(np.arange(60), rng.integers(1, 7, size=60))
    rng.shuffle(cap_img)
    batches = image_batches(cap_img, 16, np.random.default_rng(0))
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(len(cap_img)))  # every caption once per epoch
    for b in batches:
        assert 2 <= len(b) <= 17  # a lone round tail joins another batch
        assert len(set(cap_img[b].tolist())) == len(b), "two captions of one image in a batch"
    again = image_batches(cap_img, 16, np.random.default_rng(1))
    assert len(again) == len(batches)  # the step count does not depend on the draw
    assert any(not np.array_equal(a, b) for a, b in zip(again, batches, strict=True))


def test_joint_training_with_expansion_control(synthetic, tmp_path):
    (tr, trt, _), (va, vat, _), _ = synthetic
    head = build_head(24, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=32)
    cfg = JointConfig(lr=3e-3, epochs=2, batch_size=128, expansion="0")
    summary = train_joint(head, _projections(tr.dim, 24), tr, cfg, tmp_path, va, vat, train_tokens=trt)
    from d2s_onnx_export.head import load_head

    notes = load_head(tmp_path / "head.pt").config.notes
    assert notes["query_mask"] == "own_tokens" and notes["objective"] == "joint"
    assert 0.0 <= summary["best_val"]["R@1"] <= 1.0 and summary["best_epoch"] >= 1
    try:
        train_joint(head, _projections(tr.dim, 24), tr, cfg, tmp_path / "x", va, vat)
    except Exception as exc:
        assert "token ids" in str(exc)
    else:
        raise AssertionError("expansion 0 without caption tokens must be refused")


def _reference_total(s_dense, s_sparse, l1_t, l1_i, cfg, ramp):
    """``BICELoss.forward`` of holi-lab/mm-sparse-retrieval (commit 4c4f18e9, loss.py) with
    pooling [dense, single], in numpy: rows are images, and its second distillation direction
    pairs ``s.T`` with the row softmax of the untransposed fused scores."""
    def ce_rows(m, target_scores):
        p = np.exp(target_scores) / np.exp(target_scores).sum(1, keepdims=True)
        return float(-(p * (m - np.log(np.exp(m).sum(1, keepdims=True)))).sum(1).mean())

    s_inter = cfg.w1 * s_dense + cfg.w2 * s_sparse
    L = (cfg.lambda1 * _nce_np(s_dense) + cfg.lambda2 * _nce_np(s_sparse) + _nce_np(s_inter)) / 2
    ld = 0.5 * (ce_rows(s_dense, s_inter) + ce_rows(s_dense.T, s_inter))
    ll = 0.5 * (ce_rows(s_sparse, s_inter) + ce_rows(s_sparse.T, s_inter))
    Lp = (cfg.lambda1 * ld + cfg.lambda2 * ll) / 2
    return 0.5 * (L + Lp) + 0.5 * (ramp * cfg.eta_text * l1_t + ramp * cfg.eta_image * l1_i)


def test_joint_loss_is_the_public_code_s_loss_on_a_symmetric_batch():
    # Captions and images with the same vectors: every score matrix is symmetric, so the public
    # code's untransposed second distillation target coincides with the transposed one.
    eye = {"text_proj.weight": torch.eye(3), "vision_proj.weight": torch.eye(3)}
    model = JointModel(build_head(3, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=4), eye, tau=0.2)
    model.head = _Relu()
    f = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 0.6, 0.8]])
    cfg = JointConfig()  # the paper's COCO/BLIP weights
    parts = joint_loss(model, f, f, cfg, step=3, warmup=6)
    h = f.numpy().astype(np.float64)
    s = h @ h.T
    l1_rows = float(np.abs(h).sum(1).mean())  # relu(h) = h here
    ref = _reference_total(s / 0.2, s, l1_rows, l1_rows, cfg, ramp=0.25)
    assert abs(float(parts["total"].detach()) - ref) < 1e-5
    # the L1 term's weight against the rest: twice what eta alone says
    more = joint_loss(model, f, f, JointConfig(eta_text=cfg.eta_text + 1.0), step=6, warmup=6)
    assert abs(float(more["total"].detach()) - float(joint_loss(model, f, f, cfg, 6, 6)["total"].detach())
               - 0.5 * l1_rows) < 1e-5


def test_the_fused_target_passes_gradient_unless_detached():
    eye = {"text_proj.weight": torch.eye(2), "vision_proj.weight": torch.eye(2)}
    f_t = torch.tensor([[2.0, 0.5], [0.3, 3.0]])
    f_i = torch.tensor([[3.0, 4.0], [0.2, 0.5]])
    grads, totals = [], []
    for detach in (False, True):
        model = JointModel(build_head(2, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=4), eye, tau=0.5)
        model.head = _Relu()
        parts = joint_loss(model, f_t, f_i, JointConfig(detach_fused=detach), step=1, warmup=0)
        parts["total"].backward()
        totals.append(float(parts["total"].detach()))
        grads.append(float(model.temperature.grad))
    assert totals[0] == totals[1]  # the same loss value
    assert abs(grads[0] - grads[1]) > 1e-4  # the fused distribution's own gradient is the difference


def _tiny_model(tau=0.07):
    proj = {"text_proj.weight": torch.eye(2), "vision_proj.weight": torch.eye(2)}
    return JointModel(build_head(2, "random", SPECIAL, vocab_size=VOCAB, hidden_dim=4), proj, tau=tau)


def test_optimizer_decays_every_parameter_and_the_temperature():
    model = _tiny_model()
    cfg = JointConfig(lr=0.1)
    assert cfg.weight_decay == 0.05 and JointConfig().lr == 5e-5  # the public code's optimiser
    opt = make_optimizer(model, cfg)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["eps"] == 1e-8
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # a zero gradient everywhere: AdamW's step is then the decoupled decay alone, p * (1 - lr * wd)
    optimizer_step(model, opt, sum((p * 0).sum() for p in model.parameters()), cfg)
    for n, p in model.named_parameters():
        assert torch.allclose(p.detach(), before[n] * (1 - 0.1 * 0.05), atol=1e-7), n
    assert abs(float(model.tau().detach()) - 0.07 * 0.995) < 1e-8


def test_optimizer_step_clips_the_gradient_norm_to_one():
    model = _tiny_model()
    cfg = JointConfig()
    assert cfg.grad_clip == 1.0
    opt = make_optimizer(model, cfg)
    w = model.text_proj.weight
    norm = optimizer_step(model, opt, 3.0 * w[0, 0] + 4.0 * model.temperature, cfg)
    assert abs(norm - 5.0) < 1e-5  # the norm before clipping
    assert abs(float(w.grad[0, 0]) - 0.6) < 1e-5 and abs(float(model.temperature.grad) - 0.8) < 1e-5
    # below the limit the gradient is left alone; without a limit a large one too
    norm = optimizer_step(model, opt, 0.3 * w[0, 0], cfg)
    assert abs(norm - 0.3) < 1e-6 and abs(float(w.grad[0, 0]) - 0.3) < 1e-6
    norm = optimizer_step(model, opt, 30.0 * w[0, 0], JointConfig(grad_clip=0.0))
    assert abs(norm - 30.0) < 1e-4 and abs(float(w.grad[0, 0]) - 30.0) < 1e-4


def test_temperature_is_the_parameter_and_moves_by_the_learning_rate():
    model = _tiny_model(tau=0.07)
    assert model.tau() is model.temperature and abs(float(model.temperature.detach()) - 0.07) < 1e-8
    cfg = JointConfig(weight_decay=0.0)
    opt = make_optimizer(model, cfg)
    # Adam's first step moves a parameter by lr * g / (|g| + eps): 5e-5 on tau itself, where a
    # log-tau would move tau by 0.07 * 5e-5 (14x less)
    optimizer_step(model, opt, 0.5 * model.temperature, cfg)
    assert abs(float(model.tau().detach()) - (0.07 - 5e-5)) < 1e-8
    # the parameter is kept in [0.001, 0.5], at construction and after every step
    assert float(_tiny_model(tau=2.0).tau().detach()) == 0.5 and float(_tiny_model(tau=1e-6).tau().detach()) == np.float32(1e-3)
    low = _tiny_model(tau=0.00102)
    opt = make_optimizer(low, cfg)
    optimizer_step(low, opt, low.temperature, cfg)  # one step of -5e-5 would reach 0.00097
    assert float(low.tau().detach()) == np.float32(1e-3)
