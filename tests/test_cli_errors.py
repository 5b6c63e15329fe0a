"""Errors a first user meets are one line with the documented exit code: usage errors (2)
name the command's help instead of printing click's usage block; a query picture that is
missing or not a picture is a failed input (1), a URL is refused as such (2), all before any
index or model is opened."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli, write_image

USAGE_ERRORS = [
    (["ingest"], "Missing argument 'PATHS...'.", "d2s-search ingest"),
    (
        ["query", "dogs", "--mode", "fast"],
        "Invalid value for '--mode': 'fast' is not one of",
        "d2s-search query",
    ),
    (["query", "dogs", "--nope"], "No such option '--nope'.", "d2s-search query"),
    (["query", "--server-side"], "--server-side searches by TEXT", "d2s-search query"),
    (["serach", "dogs"], "No such command 'serach'.", "d2s-search"),
    (
        ["index", "stats", "--index"],
        "Option '--index' requires an argument.",
        "d2s-search index stats",
    ),
    (
        ["evaluate"],
        "give either --data (precomputed embeddings) or --dataset",
        "d2s-search evaluate",
    ),
]


@pytest.mark.parametrize(
    ("args", "message", "command"),
    USAGE_ERRORS,
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_are_one_line_naming_the_help(
    args, message, command, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert code == 2 and not out
    assert err.startswith(f"error: {message}") and err.endswith(f" (see `{command} --help`)\n"), err
    assert err.count("\n") == 1
    cut = next((n for n, a in enumerate(args) if a.startswith("-")), len(args))
    code, out, err = run_cli(
        [*args[:cut], "--json", *args[cut:]], capsys
    )  # --json: the message alone, as JSON
    assert code == 2 and not err and json.loads(out)["error"]["message"].startswith(message)


def test_a_missing_query_picture_fails_with_exit_1_before_any_index(
    tmp_path, tiny_blip_bundle, image_folder, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # no index, no bundle here: the picture is checked first
    code, out, err = run_cli(["query", "--image", "missing.jpg"], capsys)
    assert (code, out) == (1, "")
    assert (
        err == "error: cannot use missing.jpg as a query: file not found (broken link or removed)\n"
    )
    # a picture that is there is decoded before the index opens, then searched as before
    code, _, err = run_cli(
        ["ingest", image_folder / "a", "--bundle", tiny_blip_bundle, "--index", "idx", "--json"],
        capsys,
    )
    assert code == 0, err
    probe = write_image(tmp_path / "probe.png", seed=3)  # image_folder's img003 is this picture
    code, out, err = run_cli(
        ["query", "--image", probe, "-k", "1", "--index", "idx", "--mode", "dense", "--json"],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out)["results"][0]["path"].endswith("img003.png")


def test_a_query_picture_that_is_not_a_picture_names_the_formats_read(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.jpg").write_text("not a picture")
    code, _, err = run_cli(["query", "--image", "notes.jpg"], capsys)
    assert code == 1 and err.count("\n") == 1
    assert err == (
        "error: cannot use notes.jpg as a query: not an image in a format we read "
        "(JPEG, PNG, WebP, GIF, BMP or TIFF)\n"
    )


@pytest.mark.parametrize("url", ["file:///tmp/x.jpg", "ftp://example.com/a.png", "s3://bucket/dog.jpg"])
def test_a_query_picture_url_other_than_http_is_refused(url, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["query", "--image", url], capsys)
    assert (code, out) == (2, "")
    assert err == (
        "error: Invalid value for '--image': only http:// and https:// URLs are fetched: give a file or such a "
        "URL (see `d2s-search query --help`)\n"
    )
