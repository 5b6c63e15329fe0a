"""Bundles: query and serve check file hashes too, paying for the hash only once.

Before: ``query`` and ``serve`` compared sizes only, so a same-size edit of ``text.onnx``
was accepted and silently changed the results (``ingest`` did catch it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from d2s_search import bundle as bundle_module
from d2s_search.bundle import Bundle
from d2s_search.bundle_stamp import STAMP_NAME, cache_dir
from d2s_search.errors import BundleError
from tests.helpers import run_cli, run_cli_json, write_image


@pytest.fixture
def bundle_copy(tmp_path, tiny_blip_bundle) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(tiny_blip_bundle, target, ignore=shutil.ignore_patterns(STAMP_NAME))
    return target


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """Names of the files hashed (a spy around the real sha256_file)."""
    calls: list[str] = []
    real = bundle_module.sha256_file

    def spy(path, *args, **kwargs):
        calls.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(bundle_module, "sha256_file", spy)
    return calls


def same_size_edit(file: Path, keep_mtime: bool) -> None:
    before = file.stat()
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x55
    file.write_bytes(bytes(data))
    if keep_mtime:  # a careful edit: size and mtime as before (only ctime moves)
        os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = file.stat()
    assert after.st_size == before.st_size
    assert (after.st_mtime_ns == before.st_mtime_ns) == keep_mtime


def test_hashes_are_checked_once_then_remembered(bundle_copy, hashed, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    listed = sorted(bundle_module.BUNDLE_FILES) + [bundle_module.PROJECTIONS_FILE]  # format 2 lists projections
    Bundle.load(bundle_copy)
    assert sorted(hashed) == sorted(listed)  # first load: a full check
    assert (bundle_copy / STAMP_NAME).is_file()
    hashed.clear()
    Bundle.load(bundle_copy)
    assert hashed == []  # nothing changed: the stamp answers
    Bundle.load(bundle_copy, verify_hashes=True)
    assert len(hashed) == len(listed)  # ingest's explicit full check still hashes


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_same_size_edit_of_text_onnx_is_caught_after_a_stamp(bundle_copy, keep_mtime):
    Bundle.load(bundle_copy)  # verified and stamped
    same_size_edit(bundle_copy / "text.onnx", keep_mtime)
    with pytest.raises(BundleError, match="text.onnx has changed since export \\(hash differs\\)"):
        Bundle.load(bundle_copy)
    with pytest.raises(BundleError):  # and it stays refused: a failed check is never stamped
        Bundle.load(bundle_copy)


def test_query_and_serve_refuse_a_tampered_bundle_in_one_line(bundle_copy, tmp_path, capsys):
    folder = tmp_path / "photos"
    for i in range(3):
        write_image(folder / f"p{i}.jpg", 600 + i)
    index = tmp_path / "idx"
    code, report = run_cli_json(["ingest", folder, "--bundle", bundle_copy, "--index", index], capsys)
    assert code == 0 and report["stored"] == 3
    code, before = run_cli_json(["query", "a photo", "--bundle", bundle_copy, "--index", index], capsys)
    assert code == 0 and len(before["results"]) == 3
    same_size_edit(bundle_copy / "text.onnx", keep_mtime=True)
    for args in (["query", "a photo"], ["serve", "--port", "0"]):
        code, out, err = run_cli([*args, "--bundle", bundle_copy, "--index", index], capsys)
        assert code == 1 and out == ""
        assert err.strip().splitlines() == [
            f"error: {bundle_copy}: text.onnx has changed since export (hash differs); re-export the bundle"]
    # The index is untouched by the refusal: all three documents are still there.
    code, stats = run_cli_json(["index", "stats", "--index", index], capsys)
    assert stats["documents"] == 3


def test_read_only_bundle_folder_keeps_its_stamp_in_the_cache(bundle_copy, hashed, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if os.geteuid() == 0:  # root writes anywhere: make the stamp's place beside the bundle unusable
        (bundle_copy / STAMP_NAME).mkdir()
    else:
        bundle_copy.chmod(0o555)
    try:
        Bundle.load(bundle_copy)
        stamps = list(cache_dir().glob("*.json"))
        assert len(stamps) == 1 and json.loads(stamps[0].read_text())["fingerprint"]
        hashed.clear()
        Bundle.load(bundle_copy)
        assert hashed == []
        same_size_edit(bundle_copy / "tokenizer.json", keep_mtime=True)  # the folder is read-only, the file is not
        with pytest.raises(BundleError, match="tokenizer.json has changed"):
            Bundle.load(bundle_copy)
    finally:
        bundle_copy.chmod(0o755)


@pytest.mark.parametrize("garbage", [b"", b"not json", b'{"format": "d2s-bundle-stamp/1", "files": []}', b"[1, 2]"])
def test_a_damaged_stamp_only_means_checking_again(bundle_copy, hashed, garbage):
    (bundle_copy / STAMP_NAME).write_bytes(garbage)
    Bundle.load(bundle_copy)
    assert len(hashed) == len(bundle_module.BUNDLE_FILES) + 1  # + projections.safetensors (format 2)
    assert json.loads((bundle_copy / STAMP_NAME).read_text())["format"] == "d2s-bundle-stamp/1"


def test_a_stamp_that_lies_about_the_hash_is_not_trusted(bundle_copy, hashed):
    Bundle.load(bundle_copy)
    stamp = json.loads((bundle_copy / STAMP_NAME).read_text())
    stamp["files"]["text.onnx"]["sha256"] = "0" * 64  # does not match the manifest
    (bundle_copy / STAMP_NAME).write_text(json.dumps(stamp))
    hashed.clear()
    Bundle.load(bundle_copy)
    assert "text.onnx" in hashed


def test_a_tampered_recorded_bundle_names_the_changed_file_as_with_bundle(bundle_copy, tiny_clip_bundle, tmp_path,
                                                                          capsys):
    from d2s_search import settings

    folder = tmp_path / "photos"
    for i in range(2):
        write_image(folder / f"p{i}.jpg", 610 + i)
    index = tmp_path / "idx"
    code, report = run_cli_json(["ingest", folder, "--bundle", bundle_copy, "--index", index], capsys)
    assert code == 0 and report["stored"] == 2
    settings.remember_bundle(tiny_clip_bundle)  # another bundle exported since: the fallback is no match
    same_size_edit(bundle_copy / "text.onnx", keep_mtime=True)
    said = f"error: {bundle_copy.resolve()}: text.onnx has changed since export (hash differs); re-export the bundle"
    for args in (["query", "a photo"], ["serve", "--port", "0"], ["ingest", folder]):
        for bundle in ([], ["--bundle", bundle_copy.resolve()]):  # recorded, or named: the same line
            code, out, err = run_cli([*args, *bundle, "--index", index], capsys)
            assert code == 1 and err.strip().splitlines() == [said], (args, bundle, err)
