"""The flag sets docs/training.md gives for the papers' settings parse to those settings: every
flag exists in `d2s-search train`, and each value is the D2S paper's (ECIR 2024) or the public
joint code's (holi-lab/mm-sparse-retrieval, training_config/blip-coco.json)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import pytest

from d2s_search.cli.train import train
from d2s_search.train.joint import JointConfig
from tests.train.test_cli_train_runs import _train, data  # noqa: F401  (the fixture)

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def _row_flags(label: str) -> list[str]:
    """The backticked flags of the "Which objective" row that starts with ``label``."""
    for line in GUIDE.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| {label} |"):
            return shlex.split(re.findall(r"`([^`]+)`", line)[-1])
    raise AssertionError(f"docs/training.md has no row {label!r}")


def _params(flags: list[str]) -> dict:
    ctx = train.make_context("train", ["--data", "embs", *flags])
    return ctx.params


D2S_PAPER = {  # DESIGN: L1, eta 1e-3, exp=c+w, tau 1e-3, 200 x 512, lr 1e-3 / 5e-5, warm-up 20%, best by val R@1
    "expansion": None, "regularizer": "l1", "eta": 1e-3, "lam": 0.5, "tau": 1e-3, "epochs": 200, "batch_size": 512,
    "lr_proj": 1e-3, "lr_vocab": 5e-5, "lr_bias": None, "warmup": 0.2, "schedule": "paper", "vocab_init": "distilbert",
    "freeze_vocab": False, "output_terms": "all", "proj_init": "default", "bias_init": None, "norm_gain": None,
    "gate_own_words": False, "image_eta_scale": 1.0, "mix": 0.0, "flops_budget": 0.0, "query_word_boost": 0.0,
    "val_images": 0, "select_during_warmup": True, "select_tolerance": 0.0, "objective": "sparse", "amp": True,
    "document_terms": 0, "max_image_share": 0.0,
}


def test_the_d2s_paper_row_is_the_paper_s_setting():
    params = _params(_row_flags("the D2S paper's setting, to reproduce or compare"))
    assert {k: params[k] for k in D2S_PAPER} == D2S_PAPER


def test_the_reproduction_script_uses_the_paper_row():
    row = _row_flags("the D2S paper's setting, to reproduce or compare")
    text = GUIDE.read_text(encoding="utf-8")
    script = text[text.index("run() {"):text.index("mkdir -p runs")].replace("\\\n", " ")
    line = next(ln for ln in script.splitlines() if "d2s-search train" in ln)
    args = shlex.split(line.replace("$1", "D").replace("$2", "M").replace("$3", "c+w").replace("$4", "1e-3"))
    pairs = _params(args[args.index("train") + 1:])
    assert {k: pairs[k] for k in D2S_PAPER if k != "expansion"} == {k: v for k, v in D2S_PAPER.items() if k != "expansion"}
    assert pairs["expansion"] == "c+w" and set(row) <= set(args)


def test_the_joint_row_is_the_public_code_s_setting():
    params = _params(_row_flags("the follow-up's joint setting as its public code runs it"))
    assert params["objective"] == "joint" and params["vocab_init"].endswith(".npy")
    blip_coco = {"joint_lr": 5e-5, "joint_eta_text": 5e-4, "joint_eta_image": 3e-5, "joint_w1": 0.1, "joint_w2": 0.1,
                 "joint_lambda1": 0.9, "joint_lambda2": 0.3, "joint_lambda3": 1.0, "joint_tau": 0.07, "epochs": 200,
                 "warmup": 0.2, "val_images": 0, "select_during_warmup": True, "joint_max_flops": 0.0,
                 "flops_budget": 0.0, "query_word_boost": 0.0, "joint_init_head": None, "document_terms": 0,
                 "max_image_share": 0.0}
    assert {k: params[k] for k in blip_coco} == blip_coco
    # batch 256 and no masking are JointConfig's own defaults (the flags stay unset)
    assert params["batch_size"] is None and params["expansion"] is None
    cfg = JointConfig()
    assert (cfg.batch_size, cfg.expansion, cfg.weight_decay, cfg.grad_clip, cfg.detach_fused) == (256, "1", 0.05, 1.0, False)


def test_every_flag_of_the_rows_exists():
    names = {o for p in train.params for o in p.opts}
    for label in ("the D2S paper's setting, to reproduce or compare",
                  "the follow-up's joint setting as its public code runs it"):
        flags = {a for a in _row_flags(label) if a.startswith("--")}
        assert flags <= names, flags - names
    with pytest.raises(click.NoSuchOption):
        _params(["--select-tolerence", "0"])  # a misspelt flag is refused, so the rows' flags are checked


def _exit_code(args: list, capsys) -> tuple[int, str]:
    from d2s_search.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def test_select_tolerance_reaches_the_run(data, capsys):  # noqa: F811
    code, err = _exit_code(_train(data, "strict", "--epochs", "2", "--select-tolerance", "0", "--json"), capsys)
    assert code == 0, err
    cfg = json.loads((data / "strict" / "config.json").read_text())
    assert cfg["select_tolerance"] == 0.0
    code, err = _exit_code(_train(data, "bad", "--epochs", "1", "--select-tolerance", "-0.5"), capsys)
    assert code == 1 and "tolerance must be -1" in err
