"""Saved-object files for Dashboards and Kibana are read the same way: regular files only,
one clear error for anything else, the objects of every file of a folder in order."""

from __future__ import annotations

import json
import os

import pytest

from d2s_search.backends.elasticsearch.kibana import KibanaError
from d2s_search.backends.elasticsearch.kibana import load_objects as kibana_load
from d2s_search.backends.opensearch.dashboards import DashboardsError
from d2s_search.backends.opensearch.dashboards import load_objects as dashboards_load

ENGINES = [(dashboards_load, DashboardsError), (kibana_load, KibanaError)]
OBJ = {"type": "visualization", "id": "v1", "attributes": {"title": "mine"}}


@pytest.mark.parametrize(("load", "error"), ENGINES)
def test_a_folder_of_ndjson_files_loads_in_name_order(tmp_path, load, error):
    (tmp_path / "b.ndjson").write_text(json.dumps({**OBJ, "id": "b"}) + "\n" + json.dumps({"exportedCount": 1}) + "\n")
    (tmp_path / "a.ndjson").write_text(json.dumps({**OBJ, "id": "a"}) + "\n")
    (tmp_path / "notes.txt").write_text("ignored")
    assert [o["id"] for o in load([tmp_path])] == ["a", "b"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.parametrize(("load", "error"), ENGINES)
def test_a_named_pipe_is_refused_without_blocking(tmp_path, load, error):
    fifo = tmp_path / "objects.ndjson"
    os.mkfifo(fifo)  # opening it for reading would block forever without a writer
    with pytest.raises(error, match="not a regular file"):
        load([fifo])
    with pytest.raises(error, match="not a regular file"):
        load([tmp_path])  # found through the folder too


@pytest.mark.parametrize(("load", "error"), ENGINES)
@pytest.mark.parametrize(("content", "says"), [(b"\xff\xfe not utf-8", "utf-8"), (b"{not json}\n", "line 1: not JSON"),
                                               (b'{"type": "x"}\n', "needs 'id'")])
def test_bad_files_get_one_line_errors(tmp_path, load, error, content, says):
    path = tmp_path / "x.ndjson"
    path.write_bytes(content)
    with pytest.raises(error, match=says) as info:
        load([path])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("load", "error"), ENGINES)
def test_missing_and_empty_inputs(tmp_path, load, error):
    with pytest.raises(error, match="cannot read"):
        load([tmp_path / "absent.ndjson"])
    with pytest.raises(error, match="no .ndjson files"):
        load([tmp_path])
