"""``serve-images``: a real server on 127.0.0.1 serves the right bytes and types, and
refuses traversal in every spelling; ``--url-base`` URLs resolve against it."""

from __future__ import annotations

import http.client
import os
from pathlib import Path

import pytest

from d2s_search.serve.image_server import ImageServer, ImageServerError
from d2s_search.serve.image_urls import UrlBaseError, image_url, normalize_url_base, url_builder

FILES = {
    "a.jpg": b"\xff\xd8\xff jpeg bytes",
    "sub/b c.png": b"\x89PNG bytes",
    "ü/ß.webp": b"RIFF webp bytes",
    "deep/er/x#1?.gif": b"GIF89a bytes",
    "Upper.JPEG": b"\xff\xd8\xff upper",
    "scan.tiff": b"II*\x00 tiff",
    "notes.txt": b"not a picture",
}


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "photos"
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(b"secret picture")
    (tmp_path / "secret.jpg").write_bytes(b"secret next to root")
    os.symlink(outside / "secret.jpg", root / "link_out.jpg")  # file link leading out
    os.symlink(outside, root / "linkdir")  # folder link leading out
    os.symlink(root / "a.jpg", root / "alias.jpg")  # link inside: fine
    os.symlink(root / "notes.txt", root / "fake.jpg")  # an image name for a non-image
    server = ImageServer(root, port=0)
    server.start_background()
    yield server, root
    server.shutdown()
    server.server_close()


def get(server: ImageServer, target: str, method: str = "GET", headers: dict | None = None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.putrequest(method, target, skip_host=False, skip_accept_encoding=True)  # target sent as is
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_binds_to_loopback_by_default(served):
    server, _ = served
    assert server.server_address[0] == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("target,name,ctype", [
    ("/a.jpg", "a.jpg", "image/jpeg"),
    ("/sub/b%20c.png", "sub/b c.png", "image/png"),
    ("/%C3%BC/%C3%9F.webp", "ü/ß.webp", "image/webp"),
    ("/deep/er/x%231%3F.gif", "deep/er/x#1?.gif", "image/gif"),
    ("/Upper.JPEG", "Upper.JPEG", "image/jpeg"),
    ("/scan.tiff", "scan.tiff", "image/tiff"),
    ("/alias.jpg", "a.jpg", "image/jpeg"),
    ("/a.jpg?size=small", "a.jpg", "image/jpeg"),
    ("//sub//b%20c.png", "sub/b c.png", "image/png"),
])
def test_serves_the_right_bytes_and_type(served, target, name, ctype):
    server, _ = served
    status, headers, body = get(server, target)
    assert status == 200
    assert body == FILES[name]
    assert headers["Content-Type"] == ctype
    assert headers["Content-Length"] == str(len(FILES[name]))
    assert headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("target", [
    "/../secret.jpg", "/%2e%2e/secret.jpg", "/%2E%2E/secret.jpg", "/%2e%2e%2fsecret.jpg",
    "/sub/..%2f..%2fsecret.jpg", "/sub/%2e%2e/%2e%2e/secret.jpg", "/./../secret.jpg", "/..%5csecret.jpg",
    "/link_out.jpg", "/linkdir/secret.jpg", "/fake.jpg", "/notes.txt", "/", "/sub/", "/sub",
    "/a.jpg%00.png", "/missing.jpg", "/%ff.jpg", "http://evil/../secret.jpg",
])
def test_refuses_traversal_non_images_and_listings(served, target):
    server, _ = served
    status, _, body = get(server, target)
    # An absolute target names its own Host (evil): refused by the DNS-rebinding check first.
    assert status == (400 if target.startswith("http://evil") else 404)
    assert b"secret" not in body and b"not a picture" not in body


def test_head_and_conditional_get(served):
    server, _ = served
    status, headers, body = get(server, "/a.jpg", "HEAD")
    assert status == 200 and body == b"" and headers["Content-Length"] == str(len(FILES["a.jpg"]))
    status, _, body = get(server, "/a.jpg", headers={"If-Modified-Since": headers["Last-Modified"]})
    assert status == 304 and body == b""


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_read_only(served, method):
    server, root = served
    status, headers, _ = get(server, "/a.jpg", method)
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert (root / "a.jpg").read_bytes() == FILES["a.jpg"]


def test_not_a_folder(tmp_path):
    with pytest.raises(ImageServerError, match="not a folder"):
        ImageServer(tmp_path / "nope", port=0)


def test_port_in_use(served):
    server, root = served
    with pytest.raises(ImageServerError, match="cannot listen"):
        ImageServer(root, port=server.server_address[1])


# -- URLs stored at ingest -------------------------------------------------------------------

def test_urls_of_ingested_files_resolve_to_their_bytes(served):
    from d2s_search.images import discover

    server, root = served
    url_for = url_builder(server.url, [root])
    files, _, _ = discover([root])
    checked = 0
    for file in files:
        url = url_for(file)
        assert url.startswith(server.url)
        status, _, body = get(server, "/" + url.removeprefix(server.url))
        real = file.resolve()
        if real.is_relative_to(root.resolve()) and real.suffix.lower() != ".txt":
            assert status == 200 and body == real.read_bytes(), url
            checked += 1
        else:
            assert status == 404  # links leading out are found by ingest but not served
    assert checked >= 7


def test_url_base_is_checked_and_normalised():
    assert normalize_url_base("http://h:1") == "http://h:1/"
    assert normalize_url_base(" https://h/pics// ") == "https://h/pics/"
    for bad in ("ftp://h/", "h:8765", "/pics", "http://u:p@h/", "http://h/?x=1", "http://h/#top"):
        with pytest.raises(UrlBaseError):
            normalize_url_base(bad)


def test_url_paths_are_relative_to_the_outermost_ingested_folder(tmp_path):
    root = tmp_path / "photos"
    (root / "2024" / "May day").mkdir(parents=True)
    pic = root / "2024" / "May day" / "a&b 100%.jpg"
    pic.write_bytes(b"x")
    single = tmp_path / "single.png"
    single.write_bytes(b"y")
    url_for = url_builder("http://127.0.0.1:8765", [root / "2024", root, single])
    assert url_for(pic) == "http://127.0.0.1:8765/2024/May%20day/a%26b%20100%25.jpg"
    assert url_for(single) == "http://127.0.0.1:8765/single.png"
    assert image_url("http://h/base", root / "2024", pic) == "http://h/base/May%20day/a%26b%20100%25.jpg"
    # relative arguments work like absolute ones
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert url_builder("http://h/", [Path("photos")])(Path("photos/2024/May day/a&b 100%.jpg")) == \
            "http://h/2024/May%20day/a%26b%20100%25.jpg"
    finally:
        os.chdir(cwd)
