"""`train` into a run folder that already holds a run: the same command continues an
interrupted run, a finished run is replaced only with --force, other settings are refused in one
line; and what `train` prints: its plan before the first step, labelled validation numbers, no
source locations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers import run_cli
from tests.train.test_cli_embed import _word_dataset


@pytest.fixture
def data(tmp_path):
    _word_dataset(tmp_path / "data")
    np.save(
        tmp_path / "w2.npy",
        np.random.default_rng(0).standard_normal((30522, 16)).astype(np.float32) * 0.1,
    )
    return tmp_path


def _train(root, out: str, *extra) -> list[str]:
    return [
        "train",
        "--data",
        root / "data",
        "--out",
        root / out,
        "--batch-size",
        "32",
        "--vocab-init",
        root / "w2.npy",
        "--flops-budget",
        "0",
        "--threads",
        "1",
        *extra,
    ]


def _interrupt_after_epoch(monkeypatch, epoch: int) -> None:
    """Ctrl+C right after the given epoch's state is saved (once)."""
    from d2s_search.train import trainer

    save = trainer._save_state

    def save_then_stop(path, head, opt, sched, scaler, pec, order_rng, config, state, *rest):
        save(path, head, opt, sched, scaler, pec, order_rng, config, state, *rest)
        if state["epoch"] == epoch:
            monkeypatch.setattr(trainer, "_save_state", save)
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_save_state", save_then_stop)


def test_the_same_command_continues_an_interrupted_run(data, monkeypatch, capsys):
    code, _, err = run_cli(_train(data, "straight", "--epochs", "4"), capsys)
    assert code == 0, err
    _interrupt_after_epoch(monkeypatch, 2)
    code, _, err = run_cli(_train(data, "run", "--epochs", "4"), capsys)
    assert code == 130 and "run the same command again to continue" in err
    assert torch.load(data / "run" / "last.pt", weights_only=False)["state"]["epoch"] == 2

    code, _, err = run_cli(_train(data, "run", "--epochs", "4"), capsys)
    assert code == 0, err
    assert f"continuing the unfinished run in {data / 'run'} after epoch 2 of 4" in err
    assert "continuing after epoch 2" in err  # the plan says so too
    history = json.loads((data / "run" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    straight = torch.load(data / "straight" / "last.pt", weights_only=False)["head"]
    resumed = torch.load(data / "run" / "last.pt", weights_only=False)["head"]
    for name, tensor in straight.items():  # exactly the run that was never interrupted
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-6)


def test_a_finished_run_is_replaced_only_with_force(data, capsys):
    code, _, err = run_cli(_train(data, "run", "--epochs", "2"), capsys)
    assert code == 0, err
    before = (data / "run" / "last.pt").stat().st_mtime_ns
    code, out, err = run_cli(_train(data, "run", "--epochs", "2"), capsys)
    assert code == 1 and not out
    assert err == (
        f"error: {data / 'run'} holds a finished run (2 epochs): pass --force to train again from "
        "scratch, or use another --out\n"
    )
    assert (data / "run" / "last.pt").stat().st_mtime_ns == before  # nothing was touched
    (data / "run" / "notes.txt").write_text("mine")
    code, _, err = run_cli(_train(data, "run", "--epochs", "2", "--force"), capsys)
    assert code == 0, err
    assert "continuing" not in err and (data / "run" / "last.pt").stat().st_mtime_ns != before
    assert len(json.loads((data / "run" / "history.json").read_text())) == 2
    assert (
        data / "run" / "notes.txt"
    ).read_text() == "mine"  # only the run's own files are replaced


def test_an_unfinished_run_with_other_settings_is_refused_naming_the_difference(
    data, monkeypatch, capsys
):
    _interrupt_after_epoch(monkeypatch, 1)
    code, _, _ = run_cli(_train(data, "run", "--epochs", "3"), capsys)
    assert code == 130
    code, out, err = run_cli(_train(data, "run", "--epochs", "3", "--eta", "0.01"), capsys)
    assert code == 1 and not out
    assert err == (
        f"error: {data / 'run'} holds an unfinished run (epoch 1 of 3) with other settings (eta 0.0003 "
        "there, 0.01 now): give its settings again to continue it, or pass --force to start over (or use "
        "another --out)\n"
    )
    # --resume asks for the same continuation explicitly, and refuses the same way
    code, _, err = run_cli(
        _train(data, "run", "--epochs", "3", "--eta", "0.01", "--resume"), capsys
    )
    assert (
        code == 1 and "with other settings (eta 0.0003 there, 0.01 now)" in err and "--force" in err
    )
    code, _, err = run_cli(_train(data, "run", "--epochs", "3", "--resume", "--force"), capsys)
    assert code == 2 and err.count("\n") == 1
    code, _, err = run_cli(_train(data, "run", "--epochs", "3", "--resume"), capsys)
    assert code == 0, err
    assert len(json.loads((data / "run" / "history.json").read_text())) == 3


def test_train_prints_its_plan_first_and_labels_each_validation_number(data, capsys):
    code, out, err = run_cli(
        [
            "train",
            "--data",
            data / "data",
            "--out",
            data / "run",
            "--epochs",
            "12",
            "--batch-size",
            "16",
            "--vocab-init",
            data / "w2.npy",
            "--threads",
            "1",
        ],
        capsys,
    )
    assert code == 0, err
    lines = err.splitlines()
    plan = next(n for n, line in enumerate(lines) if line.startswith("plan: "))
    first_epoch = next(n for n, line in enumerate(lines) if "epoch 1:" in line)
    assert plan < first_epoch
    assert (
        lines[plan]
        == "plan: 12 epochs x 5 steps of batch 16 = 60 steps, validated on 10 images after each epoch"
    )
    assert any(line.startswith("estimate: 10 steps took ") for line in lines)
    assert "trainer.py" not in err and ".py:" not in err  # no source location on log lines
    kept = next(line for line in out.splitlines() if line.startswith("kept head:"))
    assert "val R@1" in kept and "among the 10 validation images" in kept
    shift = next(
        line
        for line in out.splitlines()
        if line.startswith(("document shift", "no document shift"))
    )
    if shift.startswith("document shift"):
        assert "among the 10 validation and 40 training images" in shift
