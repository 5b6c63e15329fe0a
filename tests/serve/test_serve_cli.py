"""`d2s-search serve` as a user runs it, and the no-torch rule of the runtime."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tests.helpers import clean_env, interruptible, run_cli

# `d2s-search serve` exactly as the console script runs it.
RUN_CLI = "import sys; from d2s_search.cli import main; main(sys.argv[1:])"


@pytest.fixture
def with_serve(monkeypatch):
    from d2s_search.cli import cli
    from d2s_search.cli.serve import serve

    monkeypatch.setitem(cli.commands, "serve", cli.commands.get("serve", serve))


def test_serve_refuses_a_missing_index_in_one_line(with_serve, tmp_path, tiny_blip_bundle, capsys):
    code, out, err = run_cli(["serve", "--bundle", tiny_blip_bundle, "--index", tmp_path / "nothing", "--port", "0"], capsys)
    assert code == 1 and err.strip().startswith("error: no index at") and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["serve", "--port", "99999"], capsys)
    assert code == 2 and "--port" in err


def test_serve_runs_until_interrupted(tmp_path, tiny_blip_bundle, serve_index):
    args = ["serve", "--bundle", str(tiny_blip_bundle), "--index", str(serve_index), "--port", "0",
            "--thumbnail-dir", str(tmp_path / "thumbs"), "--log-level", "warning"]
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, *args], stderr=subprocess.PIPE, text=True,
                            env=clean_env(tmp_path), **interruptible())
    try:
        url = _wait_for_address(proc, timeout=60)
        assert url.startswith("http://127.0.0.1:")
        status = httpx.get(f"{url}/api/status", timeout=10).json()
        assert status["documents"] == 40
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "d2s-search" in page.text
        # Only its own host names: another site cannot reach it through DNS rebinding.
        assert httpx.get(f"{url}/api/status", headers={"host": "attacker.example"}, timeout=10).status_code == 400
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0


def test_serve_freezes_what_start_up_made_before_serving(with_serve, tmp_path, tiny_blip_bundle, serve_index,
                                                        monkeypatch, capsys):
    """The models, the index and the web framework live as long as the server: frozen out of
    the garbage collector's way before the first request, so no request pays for a full
    collection that walks them all (tens of milliseconds with the offline model)."""
    import gc

    import uvicorn

    seen = {}

    def run(self, sockets=None):  # instead of serving: what the server would start with
        seen["frozen"] = gc.get_freeze_count()
        self.config.app.state.service.stop()
        self.should_exit = True

    monkeypatch.setattr(uvicorn.Server, "run", run)
    before = gc.get_freeze_count()
    try:
        code, _, err = run_cli(["serve", "--bundle", tiny_blip_bundle, "--index", serve_index, "--port", "0",
                                "--thumbnail-dir", tmp_path / "thumbs"], capsys)
    finally:
        gc.unfreeze()  # this test process goes on collecting as before
    assert code == 0, err
    assert seen["frozen"] > before + 10_000


def _wait_for_address(proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if "search page at " in line:
            return line.split("search page at ", 1)[1].split()[0].rstrip("/")
    raise AssertionError(f"serve did not start: {''.join(seen)}")


def test_the_web_runtime_never_imports_torch(tmp_path, tiny_blip_bundle, serve_index, image_folder):
    picture = sorted(image_folder.rglob("*.jpg"))[0]
    script = textwrap.dedent(
        f"""
        import json, sys
        from fastapi.testclient import TestClient
        from d2s_search.backends.local import LocalBackend
        from d2s_search.bundle import Bundle
        import d2s_search.cli, d2s_search.cli.serve  # what `d2s-search serve` loads
        from d2s_search.serve import create_app

        app = create_app(Bundle.load({str(tiny_blip_bundle)!r}), LocalBackend({str(serve_index)!r}),
                         thumbnail_dir={str(tmp_path / "thumbs")!r})
        with TestClient(app) as client:
            hits = client.get("/api/search", params={{"q": "a dog", "mode": "hybrid"}}).json()["results"]
            client.get(hits[0]["thumbnail"]).raise_for_status()
            with open({str(picture)!r}, "rb") as f:
                client.post("/api/search/image", files={{"image": ("a.jpg", f.read())}}).raise_for_status()
            client.get(hits[0]["id"].join(["/api/documents/", "/similar"])).raise_for_status()
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
