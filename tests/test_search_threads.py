"""`query --search-threads` / D2S_SEARCH_THREADS / `search_threads` in the config file reach the local index, which then searches
its shards in groups at once with the same answer as one after another."""

from __future__ import annotations

from d2s_search.backends.local import LocalBackend, cache
from tests.helpers import run_cli, run_cli_json, write_image


def test_query_searches_shards_at_once_with_the_same_answer(tmp_path, tiny_blip_bundle, capsys, monkeypatch):
    monkeypatch.setattr(cache, "SHARD_ROWS", 2)  # 7 photos: 4 shards
    for seed in range(7):
        write_image(tmp_path / "photos" / f"p{seed}.jpg", seed=seed)
    index = tmp_path / "idx"
    code, report = run_cli_json(["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", index], capsys)
    assert code == 0 and report["stored"] == 7

    made: list[int] = []
    original = LocalBackend.__init__

    def recording(self, path, threads=1):
        original(self, path, threads)
        made.append(self.threads)

    monkeypatch.setattr(LocalBackend, "__init__", recording)
    answers = {}
    for given in ("1", "3"):
        for mode in ("sparse", "dense", "hybrid"):
            code, result = run_cli_json(["query", "a dog", "--index", index, "--no-serve", "--mode", mode, "-k", "7",
                                         "--search-threads", given], capsys)
            assert code == 0 and len(result["results"]) == 7
            answers[given, mode] = [(h["id"], h["score"]) for h in result["results"]]
    assert 3 in made and 1 in made  # the option reached the backend that searched
    assert all(answers["1", mode] == answers["3", mode] for mode in ("sparse", "dense", "hybrid"))

    made.clear()
    monkeypatch.setenv("D2S_SEARCH_THREADS", "2")
    code, result = run_cli_json(["query", "a dog", "--index", index, "--no-serve", "-k", "7"], capsys)
    assert code == 0 and 2 in made and [(h["id"], h["score"]) for h in result["results"]] == answers["1", "sparse"]

    monkeypatch.delenv("D2S_SEARCH_THREADS")
    made.clear()
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "config.toml").write_text("search_threads = 3\n")
    monkeypatch.setenv("D2S_CONFIG_DIR", str(config))
    code, result = run_cli_json(["query", "a dog", "--index", index, "--no-serve", "-k", "7"], capsys)
    assert code == 0 and 3 in made and [(h["id"], h["score"]) for h in result["results"]] == answers["1", "sparse"]

    code, _, err = run_cli(["query", "a dog", "--index", index, "--search-threads", "-1"], capsys)
    assert code == 2 and "--search-threads" in err
