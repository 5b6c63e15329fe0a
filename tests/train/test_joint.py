import numpy as np
import torch

from d2s_search.train.joint import (
    JointConfig,
    JointModel,
    dense_metrics,
    joint_loss,
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
    expect = (cfg.lambda1 * parts["nce_dense"] + cfg.lambda2 * parts["nce_sparse"] + parts["nce_inter"]
              + parts["kd_dense"] + parts["kd_sparse"]
              + 0.25 * (cfg.eta_text * parts["l1_text"] + cfg.eta_image * parts["l1_image"]))
    assert abs(float(parts["total"].detach()) - expect) < 1e-4
    parts["total"].backward()
    for p in (model.text_proj.weight, model.vision_proj.weight, model.head.proj.weight, model.log_tau):
        assert p.grad is not None and p.grad.abs().sum() > 0
    model.log_tau.data.fill_(np.log(1e-6))
    assert float(model.tau().detach()) == np.float32(1e-3)  # clamped


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
    res = CliRunner().invoke(train, ["--data", str(tmp_path), "--objective", "joint", "--epochs", "1",
                                     "--vocab-init", "random", "--out", str(tmp_path / "run"), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["history"][0]["val_dense"]["R@1"] in (0.0, 1.0)
    assert (tmp_path / "run" / "projections.safetensors").is_file()
