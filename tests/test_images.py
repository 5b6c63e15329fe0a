"""Discovery and safe decoding of images."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from d2s_search.errors import ImageRejected
from d2s_search.images import content_id, decode, discover, load_image, read_bytes
from tests.helpers import jpeg_bytes, pattern_image


def save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fmt", "mode", "kw"),
    [
        ("JPEG", "RGB", {}),
        ("JPEG", "CMYK", {}),
        ("JPEG", "L", {}),
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {}),
        ("PNG", "P", {"transparency": 0}),
        ("PNG", "I;16", {}),
        ("WEBP", "RGB", {}),
        ("WEBP", "RGBA", {}),
        ("BMP", "RGB", {}),
        ("TIFF", "RGB", {}),
        ("TIFF", "CMYK", {}),
        ("GIF", "P", {}),
    ],
)
def test_every_accepted_format_decodes_to_rgb(fmt, mode, kw):
    base = pattern_image(3, size=(64, 48))
    img = base.convert(mode) if mode != "I;16" else Image.fromarray(np.asarray(base.convert("L"), dtype=np.uint16) * 256)
    decoded, w, h = decode(save(img, fmt, **kw))
    assert decoded.mode == "RGB" and (w, h) == (64, 48) and decoded.size == (64, 48)
    if fmt in ("PNG", "BMP", "TIFF") and mode == "RGB":
        assert np.array_equal(np.asarray(decoded), np.asarray(base))  # lossless stays exact


def test_alpha_is_flattened_on_white():
    img = Image.new("RGBA", (8, 8), (255, 0, 0, 0))  # fully transparent red
    decoded, _, _ = decode(save(img, "PNG"))
    assert np.asarray(decoded)[0, 0].tolist() == [255, 255, 255]


def test_animated_gif_uses_first_frame():
    frames = [Image.new("RGB", (16, 16), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100)
    decoded, _, _ = decode(buf.getvalue())
    r, g, b = np.asarray(decoded)[8, 8].tolist()
    assert r > 200 and b < 50


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 20), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 20, 20))  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    decoded, w, h = decode(save(img, "JPEG", exif=exif.tobytes(), quality=95))
    assert decoded.size == (20, 40) and (w, h) == (20, 40)
    arr = np.asarray(decoded).mean(axis=2)
    assert arr[:15].mean() > 200 and arr[25:].mean() < 50  # the white half is now on top


def test_large_jpeg_decodes_at_reduced_scale_but_reports_full_size():
    decoded, w, h = decode(jpeg_bytes(1, size=(2000, 1500)), draft_size=128)
    assert (w, h) == (2000, 1500)
    assert decoded.size[0] < 2000 and decoded.size[0] >= 128


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty file"),
        (b"this is not an image\n" * 10, "not an image"),
        (jpeg_bytes(5)[:400], "truncated"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "not an image|corrupt"),
    ],
)
def test_bad_bytes_are_rejected_with_a_reason(tmp_path, data, reason):
    path = tmp_path / "bad.jpg"
    path.write_bytes(data)
    with pytest.raises(ImageRejected, match=reason):
        load_image(path)


def test_decompression_bomb_is_refused_before_decoding(tmp_path):
    path = tmp_path / "huge.png"
    Image.new("1", (20000, 20000)).save(path)  # 400 MP, tiny file
    assert path.stat().st_size < 2_000_000
    with pytest.raises(ImageRejected, match="20000x20000 is over the 120 MP limit"):
        load_image(path)
    with pytest.raises(ImageRejected, match="over the 1 MP limit"):
        decode(jpeg_bytes(1, size=(1200, 1000)), max_pixels=1_000_000)


def test_unreadable_files_are_rejected(tmp_path):
    link = tmp_path / "gone.jpg"
    link.symlink_to(tmp_path / "does-not-exist.jpg")
    with pytest.raises(ImageRejected, match="not found"):
        read_bytes(link)
    locked = tmp_path / "locked.jpg"
    locked.write_bytes(jpeg_bytes(1))
    locked.chmod(0)
    if os.geteuid() == 0:
        pytest.skip("running as root: permission bits do not stop reads (the broken link above covers unreadable)")
    with pytest.raises(ImageRejected, match="permission denied"):
        read_bytes(locked)


def test_discover_walks_recursively_and_survives_symlink_loops(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "x.JPG").write_bytes(b"1")
    (tmp_path / "a" / "b" / "y.webp").write_bytes(b"2")
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    (tmp_path / "a" / "b" / "loop").symlink_to(tmp_path / "a")  # a -> b -> loop -> a ...
    (tmp_path / "a" / "self").symlink_to(tmp_path / "a")
    files, problems, _ = discover([tmp_path, tmp_path / "a" / "x.JPG", tmp_path / "missing"])
    names = sorted(p.name for p in files)
    assert names == ["x.JPG", "y.webp"]
    assert problems == [(tmp_path / "missing", "no such file or folder")]


def test_content_id_is_sha256_of_bytes():
    data = jpeg_bytes(1)
    import hashlib

    assert content_id(data) == hashlib.sha256(data).hexdigest()
    assert content_id(data) != content_id(jpeg_bytes(2))
