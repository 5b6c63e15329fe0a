"""A running `serve` sees documents another process ingests (the reported bug: 500
IndexError on /api/documents/{id} until a search ran, from a stale term list)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import clean_env, write_image
from tests.reliability.local_index_fixtures import REPO


def test_live_ingest_during_serve(tmp_path, tiny_blip_bundle, image_folder):
    from fastapi.testclient import TestClient

    from d2s_search.backends.local import LocalBackend
    from tests.serve.conftest import make_app, make_index

    index = make_index(tmp_path / "index", tiny_blip_bundle, image_folder)
    app = make_app(tiny_blip_bundle, index, tmp_path / "thumbs")
    with TestClient(app) as client:
        assert client.get("/api/status").json()["documents"] == 40
        client.get("/api/search", params={"q": "a photo", "k": 3})  # search structures loaded
        extra = tmp_path / "extra"
        for i in range(6):
            write_image(extra / f"new{i}.jpg", seed=900 + i)
        env = clean_env(tmp_path)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run(
            [sys.executable, "-m", "d2s_search.cli", "ingest", str(extra), "--bundle", str(tiny_blip_bundle),
             "--index", str(index), "--top-k", "500", "--json"],
            capture_output=True, text=True, env=env, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        reader = LocalBackend(index)
        reader.open(None, create=False)
        new_ids = [r[0] for r in reader._connect(False).execute("SELECT id FROM docs ORDER BY seq DESC LIMIT 6")]
        reader.close()
        for doc_id in new_ids:  # before any search ran
            reply = client.get(f"/api/documents/{doc_id}")
            assert reply.status_code == 200, reply.text
            assert reply.json()["id"] == doc_id
        assert client.get("/api/status").json()["documents"] == 46
        seen = set()
        for mode in ("sparse", "dense"):
            reply = client.get("/api/search", params={"q": "a photo", "k": 46, "mode": mode})
            assert reply.status_code == 200, reply.text
            seen |= {r["id"] for r in reply.json()["results"]}
        assert set(new_ids) <= seen
