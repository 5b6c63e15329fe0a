"""HEIC/HEIF (the `heif` extra, pillow-heif) and AVIF (Pillow's own decoder): real files written
by the libraries, ingested and searched by; without the decoder, the refusal names the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from d2s_search import images
from d2s_search.errors import ImageRejected
from tests.helpers import pattern_image, run_cli, run_cli_json, write_image
from tests.test_extras import _run_without


def _heic(path, seed: int):
    pillow_heif = pytest.importorskip("pillow_heif", reason="the heif extra (pillow-heif) is not installed here")
    pillow_heif.register_heif_opener()
    pattern_image(seed, size=(128, 96)).save(path, format="HEIF", quality=90)
    return path


def _avif(path, seed: int):
    if not images.avif_available():
        pytest.skip("this Pillow has no AVIF codec: AVIF files cannot be written here")
    pattern_image(seed, size=(128, 96)).save(path, format="AVIF", quality=90)
    return path


@pytest.fixture
def phone_folder(tmp_path):
    folder = tmp_path / "phone"
    folder.mkdir()
    _heic(folder / "IMG_0001.HEIC", 11)
    _avif(folder / "pic.avif", 12)
    write_image(folder / "plain.jpg", seed=13)
    return folder


def test_the_decoded_pixels_are_the_pictures(phone_folder):
    for name, seed in (("IMG_0001.HEIC", 11), ("pic.avif", 12)):
        loaded = images.load_image(phone_folder / name)
        assert (loaded.width, loaded.height) == (128, 96) and loaded.image.mode == "RGB"
        source = np.asarray(pattern_image(seed, size=(128, 96)), dtype=np.float64)
        error = np.abs(np.asarray(loaded.image, dtype=np.float64) - source).mean()
        assert error < 12, (name, error)  # lossy codecs, the same picture


def test_heif_is_recognised_by_its_content_not_its_name(tmp_path):
    data = _heic(tmp_path / "x.heic", 3).read_bytes()
    picture, width, height = images.decode(data)
    assert (width, height) == (128, 96)
    assert images._container(data) == "heif"
    assert images._container(_avif(tmp_path / "y.avif", 4).read_bytes()) == "avif"
    assert images._container(b"\xff\xd8\xff\xe0") is None


def test_ingest_and_query_read_them(tmp_path, capsys, phone_folder, tiny_blip_bundle):
    index = str(tmp_path / "idx")
    code, report = run_cli_json(["ingest", str(phone_folder), "--bundle", str(tiny_blip_bundle), "--index", index,
                                 "--json"], capsys)
    assert code == 0 and report["stored"] == 3 and report["rejected"] == []
    for name in ("IMG_0001.HEIC", "pic.avif"):
        code, out = run_cli_json(["query", "--image", str(phone_folder / name), "--index", index, "--mode", "dense",
                                  "--json"], capsys)
        assert code == 0 and out["results"][0]["path"].endswith(name)  # the picture finds itself first


def test_without_the_extra_the_refusal_names_it(tmp_path, phone_folder, tiny_blip_bundle):
    heic = phone_folder / "IMG_0001.HEIC"
    disguised = phone_folder / "renamed.jpg"  # a HEIC called .jpg: refused by its content
    disguised.write_bytes(heic.read_bytes())
    done = _run_without(["pillow_heif"], ["ingest", phone_folder, "--bundle", tiny_blip_bundle, "--index",
                                          tmp_path / "idx", "--json"], tmp_path)
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    reasons = {r["path"].rsplit("/", 1)[-1]: r["reason"] for r in report["rejected"]}
    fix = "HEIC/HEIF needs the heif extra: pip install 'd2s-search[heif]'"
    assert reasons == {"IMG_0001.HEIC": f"format not supported (heic): {fix}",
                       "renamed.jpg": f"format not supported (heic): {fix}"}
    assert report["stored"] == 2  # the AVIF and the JPEG
    query = _run_without(["pillow_heif"], ["query", "--image", heic], tmp_path)
    assert query.returncode == 1 and query.stdout == ""
    assert query.stderr == f"error: cannot use {heic} as a query: format not supported (heic): {fix}\n"


def test_a_pillow_without_avif_says_how_to_get_it(tmp_path, monkeypatch):
    path = _avif(tmp_path / "pic.avif", 5)
    monkeypatch.setattr(images, "avif_available", lambda: False)  # the fault: an older Pillow
    found = images.discover([tmp_path])
    assert found.files == [] and found.problems == [
        (path, "format not supported (avif): this Pillow decodes no AVIF: pip install --upgrade pillow (its wheels do)")]
    monkeypatch.setattr(Image, "open", lambda *a, **k: (_ for _ in ()).throw(images.UnidentifiedImageError("x")))
    with pytest.raises(ImageRejected, match="this Pillow decodes no AVIF"):
        images.decode(path.read_bytes())


def test_the_serve_and_query_caps_are_one(capsys):
    from d2s_search.serve import api

    assert api.UPLOAD_MAX_BYTES == images.QUERY_MAX_BYTES and api.UPLOAD_MAX_PIXELS == images.QUERY_MAX_PIXELS
    assert run_cli(["query", "--help"], capsys)[1].count("20 MiB") == 1


def test_the_search_page_shows_them_and_takes_them_as_uploads(tmp_path, phone_folder, tiny_blip_bundle):
    """Thumbnails of stored HEIC and AVIF photos are JPEGs a browser shows; an uploaded HEIC
    searches like its file."""
    import io

    from fastapi.testclient import TestClient

    from tests.serve.conftest import make_app, make_index

    index = make_index(tmp_path / "index", tiny_blip_bundle, phone_folder)
    with TestClient(make_app(tiny_blip_bundle, index, tmp_path / "thumbs")) as client:
        for name in ("IMG_0001.HEIC", "pic.avif"):
            data = (phone_folder / name).read_bytes()
            reply = client.post("/api/search/image", params={"mode": "dense", "k": 3},
                                files={"image": (name, data, "image/heic" if name.endswith("HEIC") else "image/avif")})
            assert reply.status_code == 200, reply.text
            first = reply.json()["results"][0]
            assert first["path"].endswith(name)
            thumb = client.get(first["thumbnail"])
            assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
            assert Image.open(io.BytesIO(thumb.content)).format == "JPEG"
