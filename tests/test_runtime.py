"""Runtime properties: no torch on the runtime path, provider fallback, settings, README/CI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from d2s_search.encoder import make_session
from tests.helpers import clean_env, run_cli, run_cli_json

ROOT = Path(__file__).resolve().parents[1]


def test_ingest_and_query_never_import_torch(tmp_path, tiny_blip_bundle, image_folder):
    code = f"""
import sys
from d2s_search.cli import main
for argv in (["ingest", r"{image_folder}", "--bundle", r"{tiny_blip_bundle}", "--index", r"{tmp_path / 'i'}", "--json"],
             ["query", "a dog", "--mode", "hybrid", "--bundle", r"{tiny_blip_bundle}", "--index", r"{tmp_path / 'i'}", "--json"]):
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code == 0, exc.code
heavy = sorted(m for m in ("torch", "transformers", "d2s_onnx_export") if m in sys.modules)
print("HEAVY", heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_cuda_that_does_not_load_falls_back_to_cpu_in_one_line(tiny_clip_bundle, monkeypatch):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has a working CUDA provider")
    # Pretend the GPU build is installed: ORT is asked for CUDA, cannot load it, runs on CPU.
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    said: list[str] = []
    session = make_session(str(tiny_clip_bundle / "text.onnx"), device="auto", warn=said.append)
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert len(said) == 1 and "CUDA provider did not load" in said[0] and "running on CPU" in said[0]
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    said.clear()
    make_session(str(tiny_clip_bundle / "text.onnx"), device="cuda", warn=said.append)
    assert len(said) == 1 and "install the `gpu` extra" in said[0]
    said.clear()
    make_session(str(tiny_clip_bundle / "text.onnx"), device="cpu", warn=said.append)
    assert said == []


def test_settings_precedence_flag_env_config(tmp_path, tiny_blip_bundle, tiny_clip_bundle, image_folder, capsys, monkeypatch):
    config_dir = tmp_path / "cfg"
    config_dir.mkdir()
    monkeypatch.setenv("D2S_CONFIG_DIR", str(config_dir))
    monkeypatch.chdir(tmp_path)
    (config_dir / "config.toml").write_text(f'bundle = "{tiny_blip_bundle}"\nindex = "{tmp_path / "from-config"}"\n')
    code, report = run_cli_json(["ingest", image_folder], capsys)
    assert code == 0 and (tmp_path / "from-config" / "index.sqlite").exists()
    monkeypatch.setenv("D2S_INDEX", str(tmp_path / "from-env"))
    code, report = run_cli_json(["ingest", image_folder], capsys)
    assert code == 0 and (tmp_path / "from-env" / "index.sqlite").exists()
    code, report = run_cli_json(["ingest", image_folder, "--index", tmp_path / "from-flag"], capsys)
    assert code == 0 and (tmp_path / "from-flag" / "index.sqlite").exists()
    (config_dir / "config.toml").write_text('colour = "blue"\n')
    code, _, err = run_cli(["index", "stats"], capsys)
    assert code == 1 and "unknown setting(s) colour" in err


def test_usage_errors_exit_2(capsys, tmp_path):
    code, _, err = run_cli(["query", "--server-side"], capsys)
    assert code == 2 and "--server-side searches by TEXT" in err
    code, _, err = run_cli(["query", "dog", "--mode", "fuzzy"], capsys)
    assert code == 2 and "fuzzy" in err
    code, _, err = run_cli(["ingest"], capsys)
    assert code == 2


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    test_command = next(b for b in blocks if "pytest" in b).strip()
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()
