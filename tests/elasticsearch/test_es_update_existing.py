"""`ingest --update-existing` on Elasticsearch (osmem behind the compatibility proxy): the same
partial updates as on OpenSearch, with a ``dense_vector`` field."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

import d2s_search
from tests.helpers import run_cli, run_cli_json, write_image


def make_shop(osmem_url: str, root: Path) -> dict[str, dict]:
    docs = {}
    for i in range(6):
        image = f"img/{i}.jpg"
        if i < 4:
            write_image(root / image, seed=200 + i)
        elif i == 5:
            (root / image).parent.mkdir(parents=True, exist_ok=True)
            (root / image).write_bytes(b"\x89PNG broken")
        docs[f"item-{i}"] = {"name": f"item {i}", "image": image}
    body = {"mappings": {"_meta": {"team": "search"}, "properties": {"name": {"type": "text"},
                                                                     "image": {"type": "keyword"}}}}
    assert httpx.put(f"{osmem_url}/shop", json=body).status_code == 200
    lines = "".join(json.dumps({"index": {"_index": "shop", "_id": i}}) + "\n" + json.dumps(d) + "\n"
                    for i, d in docs.items())
    httpx.post(f"{osmem_url}/_bulk", content=lines, headers={"content-type": "application/x-ndjson"},
               params={"refresh": "true"})
    return docs


def test_update_existing_on_elasticsearch(osmem_url, es_proxy, spec, tmp_path, tiny_blip_bundle, capsys):
    root = tmp_path / "pictures"
    docs = make_shop(osmem_url, root)
    where = ["--backend", "elasticsearch", "--url", es_proxy.url]
    code, report = run_cli_json(["ingest", "--update-existing", "shop", "--image-field", "image", "--image-root",
                                 root, *where, "--bundle", tiny_blip_bundle], capsys)
    assert code == 3, report
    assert (report["updated"], report["dense"]) == (4, "knn")
    assert sorted(f["id"] for f in report["failed"]) == ["item-4", "item-5"]

    for sent in es_proxy.sent:
        path = sent.path.split("?")[0]
        if not sent.body or path == "/":
            continue
        if path == "/_bulk":
            lines = sent.ndjson()
            spec.validate("POST", "/_bulk", lines, ndjson=True)
            assert all(list(action) == ["update"] for action in lines[0::2])
        elif path.startswith("/_search/scroll"):
            spec.validate(sent.method, "/_search/scroll", sent.json())
        else:
            spec.validate(sent.method, "/{index}" + path[path.index("/", 1):], sent.json())
    added = next(s.json() for s in es_proxy.sent if s.method == "PUT" and s.path.startswith("/shop/_mapping"))
    assert added["properties"]["dense"]["type"] == "dense_vector" and added["_meta"]["team"] == "search"

    stored = {h["_id"]: h["_source"] for h in
              httpx.post(f"{osmem_url}/shop/_search", json={"size": 10}).json()["hits"]["hits"]}
    assert all({k: v for k, v in stored[i].items() if k not in ("sparse", "dense", "terms")} == d
               for i, d in docs.items())
    code, printed = run_cli_json(["query", "a small object", *where, "--index-name", "shop", "-k", "10"], capsys)
    assert code == 0, printed
    with d2s_search.Index.open(url=es_proxy.url, backend="elasticsearch", index_name="shop") as index:
        hits = index.search("a small object", k=10).hits
    assert [(r["id"], r["path"]) for r in printed["results"]] == [(h.id, h.path) for h in hits]
    assert {h.id for h in hits} <= {f"item-{i}" for i in range(4)} and hits
    assert all(h.path == docs[h.id]["image"] for h in hits)

    again = run_cli(["ingest", "--update-existing", "shop", "--image-field", "image", "--image-root", root, *where],
                    capsys)
    assert again[0] == 3 and "updated 0 document(s) of 6 with a picture in 'image'; 4 done before" in again[1]


def test_documents_under_the_users_ids_on_elasticsearch(es_proxy, tmp_path, tiny_blip_bundle):
    for i in range(3):
        write_image(tmp_path / f"{i}.jpg", seed=300 + i)
    lines = [{"id": f"doc-{i}", "image": f"{i}.jpg"} for i in range(3)] + [{"id": "doc-3", "image": "0.jpg"}]
    with d2s_search.Index.open(url=es_proxy.url, backend="elasticsearch", index_name="docs", bundle=tiny_blip_bundle,
                               create=True) as index:
        report = index.ingest_documents(lines, image_root=tmp_path)
        assert (report.stored, report.exit_code) == (4, 0)
        hits = index.search("a small object", k=10).hits
        assert {h.id for h in hits} == {"doc-0", "doc-1", "doc-2", "doc-3"}
        assert {h.id: h.path for h in hits}["doc-3"] == str(tmp_path / "0.jpg")
        assert index.ingest_documents(lines, image_root=tmp_path).already_stored == 4
