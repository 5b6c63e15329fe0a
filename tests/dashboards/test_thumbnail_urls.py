"""End to end: ``ingest`` with ``url_for`` from ``--url-base`` stores URLs that ``serve-images``
answers with the pictures' bytes (what Dashboards' thumbnails fetch)."""

from __future__ import annotations

import httpx

from d2s_search.backends.opensearch.backend import OpenSearchBackend
from d2s_search.images import content_id
from d2s_search.ingest import ingest
from d2s_search.serve.image_server import ImageServer
from d2s_search.serve.image_urls import url_builder
from tests.helpers import write_image


def test_ingested_urls_serve_the_pictures(tmp_path, osmem_url, encoder, tiny_bundle):
    root = tmp_path / "my photos"
    pictures = [write_image(root / sub / f"pic {i}.{ext}", seed=i)
                for i, (sub, ext) in enumerate([("", "jpg"), ("été", "png"), ("a/b", "jpg")])]
    server = ImageServer(root, port=0)
    server.start_background()
    backend = OpenSearchBackend(osmem_url, index_name="d2s-urls")
    try:
        backend.open(tiny_bundle.identity())
        report = ingest([root], encoder, backend, url_for=url_builder(server.url, [root]))
        assert report.stored == 3 and not report.rejected
        stored = backend.get([content_id(p.read_bytes()) for p in pictures])
        assert len(stored) == 3
        by_path = {d.path: d.url for d in stored}
        for picture in pictures:
            url = by_path[str(picture.absolute())]
            assert url.startswith(server.url) and " " not in url
            resp = httpx.get(url)
            assert resp.status_code == 200 and resp.content == picture.read_bytes()
            assert resp.headers["content-type"] == ("image/png" if picture.suffix == ".png" else "image/jpeg")
    finally:
        backend.close()
        server.shutdown()
        server.server_close()
