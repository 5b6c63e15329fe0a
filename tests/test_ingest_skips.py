"""Ingest leaves out what people do not mean to search: hidden folders and files (.git,
.thumbnails, macOS ._ files), system folders (@eaDir, #recycle, node_modules) and what
--exclude (or the config file's `exclude`) names; it says how many, keeps its exit code, and
always takes a path given on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from d2s_search.images import discover
from tests.helpers import run_cli, run_cli_json, write_image

KEPT = ["a.jpg", "sub/b.png", "raw/c.jpg", "raw/deep/d.webp"]
HIDDEN = [
    ".git/objects/x.jpg",
    "node_modules/pkg/logo.png",
    "@eaDir/a.jpg/SYNOPHOTO_THUMB_M.jpg",
    "#recycle/old.jpg",
    "sub/.thumbnails/t.jpg",
    ".hidden.jpg",
    "sub/._b.png",
]
# What is counted: the top of each hidden branch (a folder is not entered).
HIDDEN_COUNTED = 7


@pytest.fixture
def photos(tmp_path) -> Path:
    root = tmp_path / "photos"
    for seed, name in enumerate(KEPT + HIDDEN):
        write_image(root / name, seed=seed)
    (root / "sub" / "._b.png").write_bytes(
        b"\x00\x05\x16\x07 AppleDouble resource fork, not a picture"
    )
    return root


def _names(files, root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in files)


def test_hidden_and_system_folders_and_files_are_skipped_and_counted(photos):
    files, problems, skipped = discover([photos])
    assert _names(files, photos) == sorted(KEPT) and problems == []
    assert (skipped.hidden, skipped.excluded) == (HIDDEN_COUNTED, 0)


def test_include_hidden_takes_everything(photos):
    from d2s_search.images import Skip  # what a walk leaves out

    files, _, skipped = discover([photos], Skip(hidden=False))
    assert _names(files, photos) == sorted(KEPT + HIDDEN) and skipped.total == 0


def test_exclude_globs_match_the_path_below_the_folder_given_or_the_name(photos):
    from d2s_search.images import Skip  # what a walk leaves out

    def kept(*globs: str) -> list[str]:
        files, _, skipped = discover([photos], Skip(exclude=globs))
        assert skipped.hidden == HIDDEN_COUNTED
        return _names(files, photos)

    assert kept("raw/*") == ["a.jpg", "sub/b.png"]  # * crosses folders: raw/deep/d.webp too
    assert kept("raw") == ["a.jpg", "sub/b.png"]  # the folder's name: not entered
    assert kept("deep/") == ["a.jpg", "raw/c.jpg", "sub/b.png"]  # folders only
    assert kept("*.png") == ["a.jpg", "raw/c.jpg", "raw/deep/d.webp"]
    assert kept("c.jpg/") == sorted(KEPT)  # a file is not a folder
    assert kept("photos/*") == sorted(KEPT)  # relative to the folder given, which is not part of it
    files, _, skipped = discover([photos], Skip(exclude=("raw", "*.png")))
    assert skipped.excluded == 2 and _names(files, photos) == ["a.jpg"]


def test_a_path_given_is_never_skipped(photos):
    from d2s_search.images import Skip  # what a walk leaves out

    hidden_folder, hidden_file = photos / "sub" / ".thumbnails", photos / ".hidden.jpg"
    given = [hidden_folder, hidden_file, photos / "raw"]
    files, problems, skipped = discover(given, Skip(exclude=("raw", "deep", ".*")))
    assert sorted(p.name for p in files) == [".hidden.jpg", "c.jpg", "t.jpg"] and problems == []
    assert (skipped.hidden, skipped.excluded) == (0, 1)  # raw/deep, below a folder given


def test_skipping_keeps_the_walk_safe_from_symlink_loops(photos):
    (photos / "sub" / "loop").symlink_to(photos)
    (photos / ".git" / "back").symlink_to(photos)
    files, problems, skipped = discover([photos])
    assert _names(files, photos) == sorted(KEPT) and problems == []


def test_ingest_says_what_it_skipped_and_keeps_its_exit_code(
    photos, tmp_path, tiny_blip_bundle, capsys
):
    code, out, err = run_cli(
        [
            "ingest",
            photos,
            "--bundle",
            tiny_blip_bundle,
            "--index",
            tmp_path / "idx",
            "--exclude",
            "raw/deep",
        ],
        capsys,
    )
    assert code == 0, err
    assert out.startswith(
        "stored 3 new image(s) of 3 found; 0 already stored, 0 duplicate(s), 0 rejected"
    )
    assert out.splitlines()[1] == (
        f"skipped {HIDDEN_COUNTED} hidden or system folder(s) and file(s) "
        "(--include-hidden takes them); 1 matching --exclude"
    )
    assert "rejected" not in err  # the ._ file is not read at all
    code, report = run_cli_json(
        [
            "ingest",
            photos,
            "--bundle",
            tiny_blip_bundle,
            "--index",
            tmp_path / "idx",
            "--include-hidden",
        ],
        capsys,
    )
    assert code == 3  # --include-hidden: the ._ file is read, and rejected as it is not a picture
    assert report["skipped"] == {"hidden": 0, "excluded": 0}
    assert report["stored"] == len(KEPT + HIDDEN) - 1 - 3 and len(report["rejected"]) == 1


def test_a_folder_of_hidden_pictures_only_says_why_nothing_was_found(
    tmp_path, tiny_blip_bundle, capsys
):
    write_image(tmp_path / "photos" / ".cache" / "a.jpg", seed=1)
    code, out, err = run_cli(
        ["ingest", tmp_path / "photos", "--bundle", tiny_blip_bundle, "--index", tmp_path / "idx"],
        capsys,
    )
    assert code == 1 and out == ""
    assert [line for line in err.splitlines() if line] == [
        f"error: no images found under {tmp_path / 'photos'} (looked for .jpg .png .webp "
        ".gif .bmp .tif); 1 hidden or excluded folder(s) and file(s) skipped "
        "(--include-hidden, --exclude)"
    ]
    assert not (tmp_path / "idx").exists()


def test_the_config_file_excludes_unless_the_command_line_does(
    photos, tmp_path, tiny_blip_bundle, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d2s-search.toml").write_text('exclude = ["raw", "*.png"]\n')
    code, report = run_cli_json(
        ["ingest", photos, "--bundle", tiny_blip_bundle, "--index", tmp_path / "one"], capsys
    )
    assert code == 0 and report["stored"] == 1 and report["skipped"]["excluded"] == 2
    code, report = run_cli_json(
        [
            "ingest",
            photos,
            "--bundle",
            tiny_blip_bundle,
            "--index",
            tmp_path / "two",
            "--exclude",
            "sub",
        ],
        capsys,
    )
    assert code == 0 and report["stored"] == 3 and report["skipped"]["excluded"] == 1
    (tmp_path / "d2s-search.toml").write_text('exclude = "raw"\n')
    code, out, err = run_cli(["ingest", photos, "--index", tmp_path / "three"], capsys)
    assert (
        code == 1
        and out == ""
        and err
        == (
            "error: d2s-search.toml: exclude must be a list of globs, "
            'e.g. exclude = ["*/thumbs/", "*.png"]\n'
        )
    )
