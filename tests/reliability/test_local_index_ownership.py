"""`index delete` removes exactly the files the index created, and refuses (deleting
nothing, saying why) when its folder holds anything else: the reported disaster was
`index delete --index .` inside a photo folder deleting every photo."""

from __future__ import annotations

import shutil

from tests.helpers import run_cli, run_cli_json
from tests.reliability.local_index_fixtures import filled_index, synthetic_docs


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_delete_inside_a_photo_folder_deletes_nothing(tmp_path, tiny_blip_bundle, image_folder, capsys):
    photos = tmp_path / "photos"
    shutil.copytree(image_folder, photos)
    (photos / "notes.txt").write_text("my notes")
    before = {p: p.read_bytes() for p in photos.rglob("*") if p.is_file()}
    code, report = run_cli_json(["ingest", photos, "--bundle", tiny_blip_bundle, "--index", photos], capsys)
    assert code == 0 and report["stored"] == 40
    code, out, err = run_cli(["index", "delete", "--index", photos, "--yes"], capsys)
    assert code == 1
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "not deleting anything" in err
    assert "'a'" in err or "'b'" in err or "notes.txt" in err  # says what is in the way
    for path, data in before.items():  # every photo and the notes, byte for byte
        assert path.read_bytes() == data
    code, stats = run_cli_json(["index", "stats", "--index", photos], capsys)
    assert code == 0 and stats["documents"] == 40  # and the index still works


def test_delete_of_an_index_in_its_own_subfolder_keeps_the_photos(tmp_path, tiny_blip_bundle, image_folder, capsys):
    photos = tmp_path / "photos"
    shutil.copytree(image_folder, photos)
    listing = files_under(photos)
    index = photos / "d2s-index"
    code, _ = run_cli_json(["ingest", photos, "--bundle", tiny_blip_bundle, "--index", index], capsys)
    code, out, err = run_cli(["query", "a dog", "--bundle", tiny_blip_bundle, "--index", index, "-k", "2"], capsys)
    assert code == 0, err
    code, out = run_cli_json(["index", "delete", "--index", index, "--yes"], capsys)
    assert code == 0 and not index.exists()
    assert files_under(photos) == listing


def test_delete_leaves_a_folder_it_did_not_create(tmp_path):
    folder = tmp_path / "made-by-user"
    folder.mkdir()
    backend = filled_index(folder, synthetic_docs(5, seed=1))
    backend.sparse_search({"w1": 1.0}, 3)
    backend.drop()
    assert folder.is_dir() and list(folder.iterdir()) == []
    made = tmp_path / "made-by-index"
    backend = filled_index(made, synthetic_docs(5, seed=1))
    backend.drop()
    assert not made.exists()


def test_delete_refuses_a_stranger_inside_the_cache_folder(tmp_path, capsys):
    index = tmp_path / "idx"
    backend = filled_index(index, synthetic_docs(5, seed=1))
    backend.sparse_search({"w1": 1.0}, 3)
    backend.close()
    (index / "cache" / "holiday.jpg").write_bytes(b"\xff\xd8 not ours")
    code, _, err = run_cli(["index", "delete", "--index", index, "--yes"], capsys)
    assert code == 1 and "cache/holiday.jpg" in err
    assert (index / "cache" / "holiday.jpg").exists() and (index / "index.sqlite").exists()


def test_delete_never_follows_a_symlinked_cache(tmp_path, capsys):
    index = tmp_path / "idx"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("keep")
    backend = filled_index(index, synthetic_docs(5, seed=1))
    backend.close()
    (index / "cache").symlink_to(precious, target_is_directory=True)
    code, _, err = run_cli(["index", "delete", "--index", index, "--yes"], capsys)
    assert code == 1 and "symbolic link" in err
    assert (precious / "keep.txt").read_text() == "keep"


def test_a_folder_that_is_not_an_index_is_never_deleted(tmp_path, capsys):
    folder = tmp_path / "stuff"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"x")
    code, _, err = run_cli(["index", "delete", "--index", folder, "--yes"], capsys)
    assert code == 1 and (folder / "a.jpg").exists()


def test_refusal_comes_before_the_confirmation_prompt(tmp_path, capsys):
    index = tmp_path / "idx"
    filled_index(index, synthetic_docs(3, seed=1)).close()
    (index / "photo.jpg").write_bytes(b"x")
    code, out, err = run_cli(["index", "delete", "--index", index], capsys)  # no --yes, no input
    assert code == 1 and "not deleting anything" in err and "delete the index at" not in err
    assert (index / "photo.jpg").exists() and (index / "index.sqlite").exists()


def test_an_index_of_the_first_format_is_adopted_and_deletable(tmp_path):
    """Made before index ids and manifests: no index_id in meta, no d2s-index.json, the
    single-file cache `cache/search-state.npz` (with a temp of a dead writer)."""
    import sqlite3

    from d2s_search.backends.local import LocalBackend

    index = tmp_path / "idx"
    filled_index(index, synthetic_docs(6, seed=1)).close()
    db = sqlite3.connect(index / "index.sqlite")
    db.execute("DELETE FROM meta WHERE key IN ('index_id', 'generation')")
    db.commit()
    db.close()
    (index / "d2s-index.json").unlink()
    (index / "cache").mkdir()
    (index / "cache" / "search-state.npz").write_bytes(b"PK old cache")
    (index / "cache" / ".4194999.tmp.npz").write_bytes(b"half")
    backend = LocalBackend(index)
    backend.open(None, create=False)
    index_id, _ = backend.generation()
    assert len(index_id) == 32  # adopted: an identity of its own now
    assert backend.sparse_search({"w1": 1.0, "w2": 1.0, "w3": 1.0}, 3)
    assert not (index / "cache" / "search-state.npz").exists()  # replaced by the shards
    assert backend.why_not_droppable() is None
    backend.drop()
    assert list(index.iterdir()) == []  # its files gone; the folder, not known to be its own, stays
