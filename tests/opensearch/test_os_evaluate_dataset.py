"""`evaluate --dataset` through an OpenSearch index (osmem-server: rank_features, no kNN, so the
sparse plan): the captions' ranking against the whole index and within the split."""

from __future__ import annotations

import json

from tests.helpers import run_cli


def test_evaluate_dataset_runs_on_opensearch(
    osmem_url, tiny_blip_bundle, image_folder, tmp_path, capsys
):
    images = sorted(image_folder.rglob("*.jpg"))[:6]
    others = sorted(image_folder.rglob("*.png"))[:4]
    (tmp_path / "caps.csv").write_text(
        "image,caption\n" + "".join(f"{p},a photo number {n}\n" for n, p in enumerate(images))
    )
    where = ["--backend", "opensearch", "--url", osmem_url, "--index-name", "evaluated"]
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
    ]
    code, out, err = run_cli([*base, "--json"], capsys)
    assert code == 0, err
    whole = json.loads(out)
    assert (whole["queries"], whole["documents"], whole["ranked_among"], whole["ranking"]) == (
        6,
        6,
        10,
        "index",
    )
    assert (
        whole["runs"]["sparse"]["R@10"] == 1.0
    )  # 10 documents: each caption's photo is in its top 10
    code, out, err = run_cli([*base, "--within-split", "--json"], capsys)
    assert code == 0, err
    within = json.loads(out)
    assert (within["ranked_among"], within["ranking"]) == (6, "split")
    assert within["runs"]["sparse"]["MRR@10"] >= whole["runs"]["sparse"]["MRR@10"]
    code, out, err = run_cli(base, capsys)
    assert (
        code == 0
        and "ranked among all 10 documents of the index" in out
        and f"{osmem_url}/evaluated" in out
    )
