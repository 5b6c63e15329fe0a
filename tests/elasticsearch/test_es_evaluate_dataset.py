"""`evaluate --dataset` through an Elasticsearch index (osmem-server behind the compatibility
proxy: rank_features, no kNN, so the sparse plan), against the whole index and within the split."""

from __future__ import annotations

import json

from tests.helpers import run_cli


def test_evaluate_dataset_runs_on_elasticsearch(
    es_proxy, tiny_blip_bundle, image_folder, tmp_path, capsys
):
    images = sorted(image_folder.rglob("*.jpg"))[:6]
    others = sorted(image_folder.rglob("*.png"))[:4]
    (tmp_path / "caps.csv").write_text(
        "image,caption\n" + "".join(f"{p},a photo number {n}\n" for n, p in enumerate(images))
    )
    where = ["--backend", "elasticsearch", "--url", es_proxy.url, "--index-name", "evaluated"]
    code, _, err = run_cli(
        ["ingest", *images, *others, "--bundle", tiny_blip_bundle, *where, "--json"], capsys
    )
    assert code == 0, err
    base = [
        "evaluate",
        "--dataset",
        tmp_path / "caps.csv",
        *where,
        "--modes",
        "sparse",
        "--val-fraction",
        "0",
        "--test-fraction",
        "1",
        "--json",
    ]
    code, out, err = run_cli(base, capsys)
    assert code == 0, err
    whole = json.loads(out)
    assert (whole["queries"], whole["documents"], whole["ranked_among"], whole["ranking"]) == (
        6,
        6,
        10,
        "index",
    )
    code, out, err = run_cli([*base, "--within-split"], capsys)
    assert code == 0, err
    assert (json.loads(out)["ranked_among"], json.loads(out)["ranking"]) == (6, "split")
