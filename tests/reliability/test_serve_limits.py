"""``serve`` under hostile uploads: memory stays bounded, oversized bodies are refused
before they are read, and ``serve-images`` checks the Host header like ``serve``.

Before: ten concurrent uploads of a 7070x7070 16-bit PNG (about 110 KB compressed) took the
server from 1.2 GB to 8.5 GB; a 3 GiB upload was spooled to /tmp before the 413.
The server runs as a real ``d2s-search serve`` subprocess; its peak RSS is the kernel's
``VmHWM`` from ``/proc/<pid>/status``.
"""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import clean_env, jpeg_bytes, write_image

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc (Linux)")

# Peak RSS the ten uploads may add to the warmed-up server. Each decode holds at most one
# full-size 16-bit copy (7070*7070*2 bytes = 100 MB) and two decode at a time; the rest
# (request bodies, shrunk pictures, encoder) is small. Measured: about +230 MB (before: +7 GB).
UPLOAD_PEAK_LIMIT_MB = 400


def vm_hwm_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def reset_hwm(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs); False if not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def big_16bit_png() -> bytes:
    picture = Image.fromarray(np.full((7070, 7070), 1000, dtype=np.uint16))
    buf = io.BytesIO()
    picture.save(buf, "PNG", optimize=True)
    return buf.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_blip_bundle) -> Iterator[tuple[str, int]]:
    root = tmp_path_factory.mktemp("limits")
    for i in range(4):
        write_image(root / "photos" / f"p{i}.jpg", 700 + i)
    env = clean_env(root)
    cli = [sys.executable, "-m", "d2s_search.cli"]
    index = root / "idx"
    subprocess.run([*cli, "ingest", root / "photos", "--bundle", tiny_blip_bundle, "--index", index],
                   env=env, check=True, capture_output=True, timeout=300)
    proc = subprocess.Popen([*cli, "serve", "--port", "0", "--log-level", "warning", "--bundle", str(tiny_blip_bundle),
                             "--index", str(index), "--thumbnail-dir", str(root / "thumbs")],
                            env=env, stderr=subprocess.PIPE, text=True)
    url = None
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        found = re.search(r"search page at (http://\S+?)/ ", line)
        url = found.group(1) if found else None
    if url is None:
        proc.kill()
        pytest.fail("serve did not start")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    try:
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_ten_concurrent_huge_16bit_uploads_stay_under_the_memory_limit(served):
    url, pid = served
    data = big_16bit_png()
    assert len(data) < 200_000  # small on the wire, 100 MB decoded
    with httpx.Client(base_url=url, timeout=120) as client:  # warm: first image search allocates its buffers
        warm = client.post("/api/search/image", files={"image": ("w.jpg", jpeg_bytes(1), "image/jpeg")})
        assert warm.status_code == 200
    time.sleep(0.5)
    reset_hwm(pid)
    before = vm_hwm_mb(pid)
    statuses: list[int] = []

    def upload() -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            answer = client.post("/api/search/image", files={"image": ("big.png", data, "image/png")})
            statuses.append(answer.status_code)

    threads = [threading.Thread(target=upload) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    peak = vm_hwm_mb(pid)
    print(f"serve peak RSS: {before:.0f} MB before, {peak:.0f} MB during ten uploads (+{peak - before:.0f} MB)")
    assert statuses == [200] * 10
    assert peak - before < UPLOAD_PEAK_LIMIT_MB


def test_oversized_content_length_is_refused_before_the_body_is_read(served):
    url, _ = served
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # Claims 3 GiB and sends none of it: a 413 must come back without waiting for the body.
        sock.sendall(b"POST /api/search/image HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 3221225472\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):  # headers and body may come in separate packets; the server closes
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "send a smaller picture" in answer


def test_chunked_body_is_cut_at_the_cap(served, tmp_path):
    url, pid = served
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        yield b"--x\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\r\n"
        chunk = b"\0" * (1 << 20)
        for _ in range(200):  # up to 200 MiB, far over the 20 MiB cap
            sent += len(chunk)
            yield chunk

    tmp_before = _tmp_usage()
    with httpx.Client(base_url=url, timeout=60) as client:
        try:
            answer = client.post("/api/search/image", content=body(),
                                 headers={"Content-Type": "multipart/form-data; boundary=x"})
            status = answer.status_code
            assert status == 413 and "over 20 MiB" in answer.json()["detail"]
        except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
            pass  # the server closed the connection after its 413, while we were still sending
    assert sent < 100 * (1 << 20)  # stopped long before the whole body
    assert _tmp_usage() - tmp_before < 40 * (1 << 20)  # nothing big spooled to /tmp
    with httpx.Client(base_url=url, timeout=60) as client:  # and the server is fine
        assert client.get("/api/status").status_code == 200


def _tmp_usage() -> int:
    st = os.statvfs("/tmp")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_serve_images_checks_the_host_header(tmp_path):
    from d2s_search.serve.image_server import ImageServer

    write_image(tmp_path / "a.jpg", 710)
    server = ImageServer(tmp_path, port=0)
    server.start_background()
    port = server.server_address[1]
    try:
        for host, status in (("127.0.0.1", 200), (f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200),
                             ("[::1]:1", 200), ("evil.example", 400), (f"attacker.test:{port}", 400), ("", 400)):
            answer = httpx.get(f"{server.url}a.jpg", headers={"Host": host})
            assert answer.status_code == status, (host, answer.status_code)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_shrunk_query_pictures_are_the_full_decode_made_small(orientation, fmt):
    """Shrinking right after decoding keeps the EXIF orientation and the picture itself."""
    from d2s_search.images import decode
    from tests.helpers import pattern_image

    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    pattern_image(orientation, (640, 360)).save(buf, fmt, exif=exif.tobytes())
    full, width, height = decode(buf.getvalue())
    small, small_width, small_height = decode(buf.getvalue(), shrink_to=160)
    assert (small_width, small_height) == (width, height) == full.size  # sizes reported as before
    assert max(small.size) == 160
    assert (small.size[0] > small.size[1]) == (width > height)  # upright like the full decode
    reference = np.asarray(full.resize(small.size, Image.Resampling.BOX), dtype=float)
    assert np.abs(reference - np.asarray(small, dtype=float)).mean() < 1.0
