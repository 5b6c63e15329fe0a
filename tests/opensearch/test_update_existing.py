"""`ingest --update-existing` and Index.update_existing against osmem: picture search added to
an index the user made, as partial updates that leave the user's fields alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from d2s_os_faultproxy import FaultProxy

import d2s_search
from d2s_search.errors import BackendUnavailableError, IndexStoreError
from tests.helpers import run_cli, run_cli_json, write_image
from tests.test_json_shapes import UPDATE_EXISTING, check

GOOD, MISSING, CORRUPT = 45, 3, 2
USER_META = {"owner": "catalogue", "schema": 3}


def user_documents(root: Path) -> dict[str, dict]:
    """50 products: 45 with a picture under ``root``, 3 naming a missing file, 2 a file that is
    no picture; each with fields of its own."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    docs = {}
    for i in range(GOOD + MISSING + CORRUPT):
        sku = f"sku-{i:03d}"
        image = f"img/{sku}.jpg"
        if i < GOOD:
            write_image(root / image, seed=100 + i)
        elif i >= GOOD + MISSING:
            (root / image).write_bytes(b"not a picture at all")
        docs[sku] = {"title": f"product {i}", "price": 10.5 + i, "tags": ["shoe", f"t{i % 4}"], "image": image,
                     "url": f"https://shop.example.com/{sku}"}  # the product's page, not its picture
    return docs


def make_user_index(url: str, name: str, docs: dict[str, dict], *, knn: bool = False) -> None:
    body: dict = {"mappings": {"_meta": USER_META, "properties": {
        "title": {"type": "text"}, "price": {"type": "float"}, "tags": {"type": "keyword"},
        "image": {"type": "keyword"}, "url": {"type": "keyword"}}}}
    if knn:
        body["settings"] = {"index": {"knn": True}}
    assert httpx.put(f"{url}/{name}", json=body).status_code == 200
    lines = "".join(json.dumps({"index": {"_index": name, "_id": i}}) + "\n" + json.dumps(d) + "\n"
                    for i, d in docs.items())
    reply = httpx.post(f"{url}/_bulk", content=lines, headers={"content-type": "application/x-ndjson"},
                       params={"refresh": "true"})
    assert reply.status_code == 200 and not reply.json()["errors"]


def stored(url: str, name: str) -> dict[str, dict]:
    hits = httpx.post(f"{url}/{name}/_search", json={"size": 100, "seq_no_primary_term": True}).json()["hits"]["hits"]
    return {h["_id"]: {**h["_source"], "_seq_no": h["_seq_no"]} for h in hits}


def update_args(url: str, bundle: Path, root: Path, name: str = "shop") -> list:
    return ["ingest", "--update-existing", name, "--image-field", "image", "--image-root", root, "--url", url,
            "--bundle", bundle, "--batch-size", "16"]


@pytest.fixture
def shop(osmem_url, tmp_path):
    docs = user_documents(tmp_path / "pictures")
    make_user_index(osmem_url, "shop", docs)
    return docs, tmp_path / "pictures"


def test_pictures_become_searchable_and_the_users_fields_stay(osmem_url, shop, tiny_blip_bundle, capsys, spec):
    docs, root = shop
    recorder = FaultProxy(osmem_url)  # a real HTTP server in between, recording every request
    try:
        code, report = run_cli_json(update_args(recorder.url, tiny_blip_bundle, root), capsys)
    finally:
        recorder.close()
    assert code == 3, report
    check(report, UPDATE_EXISTING)
    assert (report["found"], report["updated"], report["already_done"]) == (50, GOOD, 0)
    assert report["dense"] == "flat"  # the index was not created with index.knn: true
    failed = {f["id"]: f["reason"] for f in report["failed"]}
    assert sorted(failed) == [f"sku-{i:03d}" for i in range(GOOD, 50)]
    assert all("not found" in failed[f"sku-{i:03d}"] for i in range(GOOD, GOOD + MISSING))
    assert all(reason and "\n" not in reason for reason in failed.values())
    check_requests(spec, recorder.log)

    after = stored(osmem_url, "shop")
    for sku, original in docs.items():
        own = {k: v for k, v in after[sku].items() if k not in ("sparse", "dense", "terms", "_seq_no")}
        assert own == original  # the user's fields, exactly as they were
        if sku in failed:
            assert not {"sparse", "dense", "terms"} & set(after[sku])
        else:
            assert after[sku]["terms"] and len(after[sku]["dense"]) == dense_dim(tiny_blip_bundle)
            assert all("." not in key for key in after[sku]["sparse"])  # keys escaped as our index writes them
    mapping = httpx.get(f"{osmem_url}/shop/_mapping").json()["shop"]["mappings"]
    assert mapping["_meta"]["owner"] == "catalogue" and mapping["_meta"]["schema"] == 3  # merged, not replaced
    assert mapping["_meta"]["image_field"] == "image" and mapping["_meta"]["fingerprint"]
    assert mapping["properties"]["sparse"] == {"type": "rank_features"}
    assert "method" not in mapping["properties"]["dense"]  # k-NN refuses a method where index.knn is false
    assert mapping["properties"]["title"] == {"type": "text"}

    # The same pictures ingested into an index of our own score the same for the same words.
    with d2s_search.Index.open(url=osmem_url, index_name="ours", bundle=tiny_blip_bundle, create=True) as ours:
        ours.ingest(sorted((root / "img").glob("*.jpg"))[:GOOD])
        expected = {Path(h.path).stem: h.score for h in ours.search("a red shoe on the beach", k=50).hits}
    code, printed = run_cli_json(["query", "a red shoe on the beach", "--url", osmem_url, "--index-name", "shop",
                                  "-k", "50"], capsys)
    assert code == 0, printed
    with d2s_search.Index.open(url=osmem_url, index_name="shop") as index:
        result = index.search("a red shoe on the beach", k=50)
    assert [(r["id"], r["path"], r["score"]) for r in printed["results"]] == [
        (h.id, h.path, pytest.approx(h.score, rel=1e-6)) for h in result.hits]
    assert {h.id: h.score for h in result.hits} == pytest.approx(expected)
    assert all(h.path == docs[h.id]["image"] and h.url is None for h in result.hits)  # the field's value is the path
    assert result.hits[0].matched


def test_a_second_run_updates_nothing(osmem_url, shop, tiny_blip_bundle, capsys):
    _, root = shop
    assert run_cli(update_args(osmem_url, tiny_blip_bundle, root), capsys)[0] == 3
    before = stored(osmem_url, "shop")
    code, out, err = run_cli(update_args(osmem_url, tiny_blip_bundle, root), capsys)
    assert code == 3
    assert f"updated 0 document(s) of 50 with a picture in 'image'; {GOOD} done before, 5 failed" in out
    assert len(re.findall(r"^failed sku-0\d\d: ", err, re.M)) == 5
    assert stored(osmem_url, "shop") == before  # not one document written again

    mapping = httpx.get(f"{osmem_url}/shop/_mapping").json()
    code, out, err = run_cli(["ingest", root / "img", "--url", osmem_url, "--index-name", "shop"], capsys)
    assert code == 1 and "is your own, with picture search from the field 'image'" in err  # no folders in it
    assert httpx.get(f"{osmem_url}/shop/_mapping").json() == mapping and stored(osmem_url, "shop") == before


def test_an_interrupted_run_continues(osmem_url, shop, tiny_blip_bundle, capsys):
    from d2s_search.backends.opensearch.backend import OpenSearchBackend
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    from d2s_search.enrich import Pictures, update_existing

    _, root = shop
    proxy = FaultProxy(osmem_url)
    backend = OpenSearchBackend(proxy.url, index_name="shop", retries=0, sleep=lambda s: None)
    pages = []

    def cut_after_the_first_page(done: int, to_do: int, updated: int) -> None:
        pages.append(updated)
        if done:  # the connection goes: every later write is lost on the way
            proxy.add("POST", "/_bulk", "drop_before", times=100)

    try:
        with pytest.raises(BackendUnavailableError):
            update_existing(backend, Encoder(Bundle.load(tiny_blip_bundle)), "image", Pictures(image_root=root),
                            progress=cut_after_the_first_page, batch_size=16)
    finally:
        backend.close()
        proxy.close()
    assert pages == [0, 16]
    httpx.post(f"{osmem_url}/shop/_refresh")
    first = {i for i, d in stored(osmem_url, "shop").items() if "terms" in d}
    assert len(first) == 16

    code, report = run_cli_json(update_args(osmem_url, tiny_blip_bundle, root), capsys)
    assert code == 3
    assert (report["updated"], report["already_done"], len(report["failed"])) == (GOOD - 16, 16, 5)
    after = stored(osmem_url, "shop")
    assert sum("terms" in d for d in after.values()) == GOOD
    assert all(after[i]["_seq_no"] == stored_seq for i, stored_seq in
               ((i, d["_seq_no"]) for i, d in after.items() if i in first))  # the first 16 were not written again


def test_a_taken_field_name_is_refused_before_anything_is_written(osmem_url, tmp_path, tiny_blip_bundle, capsys):
    docs = user_documents(tmp_path / "pictures")
    make_user_index(osmem_url, "taken", {k: {**v, "terms": "summer sale"} for k, v in list(docs.items())[:5]})
    httpx.put(f"{osmem_url}/taken/_mapping", json={"properties": {"terms": {"type": "text"}}})
    before_mapping = httpx.get(f"{osmem_url}/taken/_mapping").json()
    before = stored(osmem_url, "taken")
    code, out, err = run_cli(update_args(osmem_url, tiny_blip_bundle, tmp_path / "pictures", "taken"), capsys)
    assert code == 1 and not out
    assert err.strip().count("\n") == 0 and "'terms'" in err and "text field" in err and "nothing was changed" in err
    assert httpx.get(f"{osmem_url}/taken/_mapping").json() == before_mapping
    assert stored(osmem_url, "taken") == before


def test_a_knn_index_gets_a_searchable_dense_field(osmem_url, tmp_path, tiny_blip_bundle):
    docs = dict(list(user_documents(tmp_path / "pictures").items())[:4])
    make_user_index(osmem_url, "shop-knn", docs, knn=True)
    seen = []
    report = d2s_search.Index.update_existing("shop-knn", "image", url=osmem_url, bundle=tiny_blip_bundle,
                                              image_root=tmp_path / "pictures",
                                              progress=lambda *p: seen.append(p))
    assert (report.found, report.updated, report.exit_code, report.dense) == (4, 4, 0, "knn")
    assert seen[0] == (0, 4, 0) and seen[-1] == (4, 4, 4)
    dense = httpx.get(f"{osmem_url}/shop-knn/_mapping").json()["shop-knn"]["mappings"]["properties"]["dense"]
    assert dense["method"]["space_type"] == "innerproduct" and dense["dimension"] == dense_dim(tiny_blip_bundle)


@pytest.fixture
def picture_server():
    """http://127.0.0.1:PORT serving /img/a.jpg and /img/b.jpg as image/jpeg; anything else 404."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.helpers import jpeg_bytes

    pictures = {"/img/a.jpg": jpeg_bytes(1), "/img/b.jpg": jpeg_bytes(2)}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            data = pictures.get(self.path)
            self.send_response(200 if data else 404)
            self.send_header("Content-Type", "image/jpeg" if data else "text/plain")
            self.send_header("Content-Length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_url_values_and_a_url_base(osmem_url, picture_server, tiny_blip_bundle):
    make_user_index(osmem_url, "web", {"a": {"image": "/img/a.jpg"}, "b": {"image": f"{picture_server}/img/b.jpg"},
                                       "c": {"image": "img/c.jpg"}})
    report = d2s_search.Index.update_existing("web", "image", url=osmem_url, bundle=tiny_blip_bundle,
                                              url_base=picture_server + "/")
    assert (report.updated, report.exit_code) == (2, 3)
    ((failed, reason),) = report.failed
    assert failed == "c" and f"{picture_server}/img/c.jpg" in reason and "404" in reason
    with d2s_search.Index.open(url=osmem_url, index_name="web") as index:
        paths = {hit.path for hit in index.search("a picture", k=5).hits}
    assert paths <= {"/img/a.jpg", f"{picture_server}/img/b.jpg"}


def test_an_index_of_our_own_or_a_missing_field_is_refused(osmem_url, tmp_path, tiny_blip_bundle):
    make_user_index(osmem_url, "plain", {"x": {"title": "no picture"}})
    with pytest.raises(IndexStoreError, match="has no field 'photo'"):
        d2s_search.Index.update_existing("plain", "photo", url=osmem_url, bundle=tiny_blip_bundle)
    with pytest.raises(IndexStoreError, match="no index 'nothing-here'"):
        d2s_search.Index.update_existing("nothing-here", "image", url=osmem_url, bundle=tiny_blip_bundle)
    with d2s_search.Index.open(url=osmem_url, index_name="mine", bundle=tiny_blip_bundle, create=True):
        pass
    with pytest.raises(IndexStoreError, match="made by d2s-search"):
        d2s_search.Index.update_existing("mine", "path", url=osmem_url, bundle=tiny_blip_bundle)


def dense_dim(bundle: Path) -> int:
    from d2s_search.bundle import Bundle

    return Bundle.load(bundle).dense_dim


def check_requests(spec, log) -> None:
    """Every request is an operation of the OpenSearch API, its body valid (strictly), and no
    write but the mapping and partial updates."""
    paths = spec.paths_by_method()
    kinds = set()
    for seen in log:
        path = seen.path.split("?")[0]
        templates = [t for rx, t in paths.get(seen.method, []) if rx.match(path)]
        assert templates, f"{seen.method} {path} is not an operation of the OpenSearch API"
        template = max(templates, key=lambda t: len(re.sub(r"\{[^}]+\}", "", t)))
        kinds.add((seen.method, template))
        if not seen.body:
            continue
        if template == "/_bulk":
            lines = [json.loads(x) for x in seen.body.decode().splitlines()]
            spec.validate(seen.method, template, lines)
            for action in lines[0::2]:
                assert list(action) == ["update"]  # partial updates only
                spec.validate_schema("schemas/_core.bulk.yaml#/components/schemas/OperationContainer", action)
            assert all(set(line) == {"doc"} and set(line["doc"]) == {"sparse", "dense", "terms"}
                       for line in lines[1::2])
        else:
            spec.validate(seen.method, template, json.loads(seen.body))
    assert {("PUT", "/{index}/_mapping"), ("POST", "/_bulk"), ("POST", "/{index}/_search"),
            ("POST", "/_search/scroll"), ("POST", "/{index}/_count")} <= kinds
    assert not {k for k in kinds if k[0] in ("PUT", "POST") and "_doc" in k[1]}
