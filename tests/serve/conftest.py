"""Fixtures for the search page: a small index, the app, a live server and a browser.

Browser tests use the `playwright` package driving the system's Chromium (Debian's
``chromium`` package; never a downloaded browser) and skip, saying why, when either is
missing. Screenshots go to ``test-artifacts/serve/``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "serve"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_path() -> str | None:
    given = os.environ.get("D2S_CHROMIUM")
    if given:
        return given if Path(given).is_file() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file() else None)
        if found:
            return found
    return None


def make_index(root: Path, bundle_path: Path, images: list[Path] | Path, top_k: int | None = 64) -> Path:
    from d2s_search.backends.local import LocalBackend
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    from d2s_search.ingest import ingest

    bundle = Bundle.load(bundle_path)
    backend = LocalBackend(root)
    backend.open(bundle.identity())
    try:
        ingest([images] if isinstance(images, Path) else images, Encoder(bundle, device="cpu"), backend, top_k=top_k)
    finally:
        backend.close()
    return root


PARIS, NYC = (48.8566, 2.3522), (40.7128, -74.006)
# (path under the photos folder, seed, EXIF date, place, make, model) of make_library's photos
LIBRARY = [
    ("trips/paris/p1.jpg", 11, "2019:06:02 09:00:00", PARIS, "Canon", "Canon EOS 5D"),
    ("trips/paris/p2.jpg", 12, "2019:06:20 18:00:00", (48.8606, 2.3376), "Canon", "Canon EOS 5D"),
    ("trips/paris/p3.jpg", 13, "2019:07:01 08:00:00", (48.85, 2.29), "Google", "Pixel 7"),
    ("trips/nyc/n1.jpg", 14, "2021:03:03 12:00:00", NYC, "Google", "Pixel 7"),
    ("trips/nyc/n2.jpg", 15, "2021:03:04 12:00:00", (40.73, -73.99), "Google", "Pixel 7"),
    ("home/h1.jpg", 16, "2022:12:24 19:30:00", None, "FUJIFILM", "X-T3"),
    ("home/h2.jpg", 17, "2023:01:01 00:10:00", None, None, None),
]
LIBRARY_SIDECAR = ("path,rating,who,favourite\nphotos/trips/paris/p1.jpg,5,ann,true\n"
                   "photos/trips/paris/p2.jpg,3,<b>bob</b>,false\nn1.jpg,4,ann,true\nh1.jpg,2,cat,false\n")


def make_library(root: Path, bundle_path: Path) -> Path:
    """An index of eight photos with metadata: three taken in Paris in June and July 2019 (two
    with a Canon), two in New York in 2021 (a Pixel), two at home (one with a Fujifilm, one
    without a camera, neither placed) and a PNG without EXIF dated by its file (2010); a sidecar
    gives four of them a rating (number), a person (keyword; one is markup, which the page must
    show as text) and a favourite flag (boolean). Returns the index folder."""
    import d2s_search
    from d2s_search.metadata import parse_time
    from tests.helpers import exif_jpeg, pattern_image

    photos = root / "photos"
    for name, seed, taken, place, make, model in LIBRARY:
        exif_jpeg(photos / name, seed, taken, place, make, model)
    plain = photos / "home" / "scan.png"
    pattern_image(18).save(plain, "PNG")
    os.utime(plain, (parse_time("2010-01-01"), parse_time("2010-01-01")))
    (root / "fields.csv").write_text(LIBRARY_SIDECAR)
    with d2s_search.Index.open(root / "index", bundle=bundle_path, create=True) as index:
        report = index.ingest(photos, metadata=root / "fields.csv")
    assert report.exit_code == 0 and report.stored == 8, report.to_json()
    return root / "index"


def make_app(bundle_path: Path, index: Path, thumbnails: Path, **options):
    from d2s_search.backends.local import LocalBackend
    from d2s_search.bundle import Bundle
    from d2s_search.serve import create_app

    return create_app(Bundle.load(bundle_path), LocalBackend(index), device="cpu", thumbnail_dir=thumbnails, **options)


@pytest.fixture(scope="session")
def serve_index(tmp_path_factory, tiny_blip_bundle, image_folder) -> Path:
    """An index of the 40 generated photos (top-64 words each: quick searches)."""
    return make_index(tmp_path_factory.mktemp("serve") / "index", tiny_blip_bundle, image_folder)


@pytest.fixture(scope="session")
def thumbnail_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("thumbnails")


@pytest.fixture(scope="module")
def client(tiny_blip_bundle, serve_index, thumbnail_dir):
    from fastapi.testclient import TestClient

    app = make_app(tiny_blip_bundle, serve_index, thumbnail_dir)
    with TestClient(app) as test_client:  # runs the lifespan: index opened, models warm
        yield test_client


@pytest.fixture(scope="module")
def live_server(tiny_blip_bundle, serve_index, thumbnail_dir):
    from tests.serve.live import start_server

    server = start_server(make_app(tiny_blip_bundle, serve_index, thumbnail_dir))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests need the `playwright` package: pip install playwright (no browser download)")
    executable = chromium_path()
    if executable is None:
        pytest.skip("browser tests need Chromium: apt-get install chromium (or set D2S_CHROMIUM to its path)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server, request):
    """A fresh page on the live server; fails the test on any JavaScript error, saves a
    screenshot named after the test when it ends."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=live_server.url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-end.png"))
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
