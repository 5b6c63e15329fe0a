"""Numbers of the offline model on the held-out flickr8k-800 photos.

Needs an `align` run (its ``embeddings/``) and heads trained on it with `d2s-search train`:

    nice -n 10 python benchmarks/bench_offline_model.py --run runs/align \
        --head exp=0:runs/head-0/head.pt --head exp=1:runs/head-1/head.pt \
        --head exp=c:runs/head-c/head.pt --head exp=c+w:runs/head-cw/head.pt \
        --bundle d2s-bundles/offline-mini --out test-artifacts/bench-offline

Rows: dense and sparse text->image metrics of the trained model per head (the heads' own
``d2s-search evaluate`` numbers on the test split); the same towers with random projections
and an untrained (vocabulary-init) head — the random-weight model; and, with ``--bundle``,
the exported bundle end to end (ONNX Runtime on the photo files, as users run it).
Writes ``<out>/results.json`` and ``<out>/results.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2s_search.evaluate import EvalData, EvalOptions, SparseVectors, evaluate, sparse_from_head  # noqa: E402
from d2s_search.train.data import load_dataset  # noqa: E402
from d2s_search.train.vocab import load_tokenizer, tokenize_captions  # noqa: E402

COLS = ("R@1", "R@5", "R@10", "MRR@10", "FLOPs", "Exact@20", "terms_per_query", "terms_per_image")


def _tokens(split, tok):
    ct = tokenize_captions(split.captions, tok)
    return [ct.row(i) for i in range(len(ct))]


def prune_rows(x, k: int):
    """Keep the k largest weights of each row (what `ingest --top-k` does to stored vectors)."""
    import scipy.sparse as sp

    x = x.tocsr().copy()
    for i in range(x.shape[0]):
        s, e = x.indptr[i], x.indptr[i + 1]
        if e - s > k:
            row = x.data[s:e]
            row[np.argsort(-row)[k:]] = 0.0
    x.eliminate_zeros()
    return sp.csr_matrix(x)


def trained_rows(run: Path, heads: list[tuple[str, Path]], tok, prune: int = 0) -> list[dict]:
    test = load_dataset(run / "embeddings")["test"]
    ev = EvalData.from_split(test, "flickr8k-800/test")
    q_tokens = _tokens(test, tok)
    rows = [{"model": "offline-mini (trained)", "run": "dense", **evaluate(ev, options=EvalOptions(runs=("dense",)))["runs"]["dense"]}]
    for label, path in heads:
        sv = sparse_from_head(path, ev, q_tokens)
        r = evaluate(ev, sv, q_tokens, None, EvalOptions(runs=("sparse",)))["runs"]["sparse"]
        rows.append({"model": "offline-mini (trained)", "run": f"sparse {label}", **r})
        if prune:
            pv = SparseVectors(prune_rows(sv.queries, prune), prune_rows(sv.docs, prune))
            r = evaluate(ev, pv, q_tokens, None, EvalOptions(runs=("sparse",)))["runs"]["sparse"]
            rows.append({"model": "offline-mini (trained)", "run": f"sparse {label}, top-{prune} terms", **r})
    return rows


def random_rows(run: Path, tok, seed: int = 0) -> list[dict]:
    """Same frozen towers, random projections, untrained head (W2 = MiniLM embeddings)."""
    import torch
    from d2s_onnx_export.head import SparseHead
    from d2s_onnx_export.offline_mini.align import AlignConfig, AlignModel
    from d2s_onnx_export.offline_mini.align_data import flickr_photos, split_photos
    from d2s_onnx_export.offline_mini.align_features import Backbones
    from d2s_onnx_export.offline_mini.align_run import _eval_set, class_embeddings
    from d2s_onnx_export.offline_mini.backbones import MiniLMFeatures
    from d2s_onnx_export.registry import load_config
    from d2s_onnx_export.tokenizers_offline import excluded_token_ids

    from d2s_search.train.modeling import encode_sparse

    align = json.loads((run / "align.json").read_text())
    src = align["sources"]["flickr8k"]
    cache = Path(align.get("cache", run.parent / "cache"))
    bb = Backbones(load_config("offline-mini"))
    splits = split_photos(flickr_photos(align.get("data", ROOT.parent / "shared/data/flickr8k-800")),
                          src["test_photos"], src["val_photos"], src["split_seed"])
    data = _eval_set(bb, splits["test"], cache, "test", None)
    torch.manual_seed(seed)
    model = AlignModel(AlignConfig(), class_embeddings(bb, cache)).eval()
    torch.nn.init.normal_(model.text.linear.weight, std=384**-0.5)  # not the identity init
    with torch.no_grad():
        img = model.embed_images(torch.from_numpy(data.pooled), torch.from_numpy(data.logits)).numpy()
        txt = model.embed_texts(torch.from_numpy(data.text)).numpy()
    test = load_dataset(run / "embeddings")["test"]
    ev = EvalData(test.caption_ids, test.captions, txt, test.image_ids, img, test.qrels(), "flickr8k-800/test")
    # Zero-shot: no trained weight at all, photo = ImageNet class probabilities x class-name vectors.
    with torch.no_grad():
        probs = torch.softmax(torch.from_numpy(data.logits), dim=-1)
        zs_img = torch.nn.functional.normalize(probs @ class_embeddings(bb, cache), dim=-1).numpy()
    zs = EvalData(test.caption_ids, test.captions, data.text, test.image_ids, zs_img, test.qrels(), "zero-shot")
    zero_shot = evaluate(zs, options=EvalOptions(runs=("dense",)))["runs"]["dense"]
    w2 = MiniLMFeatures().word_embeddings()
    head = SparseHead.from_vocab_projection(384, w2, excluded_ids=excluded_token_ids(tok, w2.shape[0]), seed=seed)
    q_tokens = _tokens(test, tok)
    sv = SparseVectors(encode_sparse(head, txt), encode_sparse(head, img))
    res = evaluate(ev, sv, q_tokens, None, EvalOptions(runs=("dense", "sparse")))["runs"]
    return [{"model": "zero-shot class bridge (no trained weights)", "run": "dense", **zero_shot},
            {"model": "random projections + untrained head", "run": "dense", **res["dense"]},
            {"model": "random projections + untrained head", "run": "sparse (untrained)", **res["sparse"]}]


def bundle_rows(bundle: Path, run: Path, tok) -> list[dict]:
    """The exported bundle end to end: ONNX Runtime on the test photo files."""
    import scipy.sparse as sp
    from d2s_onnx_export.offline_mini.align_data import open_rgb

    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder

    align = json.loads((run / "align.json").read_text())
    root = Path(align.get("data", ROOT.parent / "shared/data/flickr8k-800"))
    test = load_dataset(run / "embeddings")["test"]
    b = Bundle.load(bundle, verify_hashes=True)
    enc = Encoder(b, device="cpu", threads=2)
    dense, sparse = [], []
    for start in range(0, len(test.image_ids), 16):
        ims = [open_rgb(root / "images" / i) for i in test.image_ids[start : start + 16]]
        d, s = enc.encode_images(ims)
        dense.append(d)
        sparse.append(sp.csr_matrix(s))
    t = enc.encode_texts(test.captions)
    ev = EvalData(test.caption_ids, test.captions, t.dense, test.image_ids, np.vstack(dense), test.qrels(), "bundle")
    q = sp.csr_matrix(t.sparse)
    q_tokens = _tokens(test, tok)
    mode = b.manifest["head"]["notes"].get("query_mask", "none")
    if mode == "own_tokens":
        from d2s_search.evaluate import mask_rows

        q = mask_rows(q, q_tokens)
    res = evaluate(ev, SparseVectors(q, sp.vstack(sparse).tocsr()), q_tokens, None, EvalOptions(runs=("dense", "sparse")))["runs"]
    label = f"bundle {b.model_name} (ONNX, photo files)"
    exp = b.manifest["head"]["notes"].get("expansion", "?")
    return [{"model": label, "run": "dense", **res["dense"]}, {"model": label, "run": f"sparse exp={exp}", **res["sparse"]}]


def markdown(rows: list[dict]) -> str:
    head = "| model | run | " + " | ".join(COLS) + " |\n|---|---|" + "---|" * len(COLS) + "\n"
    body = ""
    for r in rows:
        cells = []
        for c in COLS:
            v = r.get(c)
            cells.append("-" if v is None or (isinstance(v, float) and np.isnan(v)) else
                         f"{v:.1f}" if c in ("FLOPs", "terms_per_query", "terms_per_image") else f"{v:.3f}")
        body += f"| {r['model']} | {r['run']} | " + " | ".join(cells) + " |\n"
    return head + body


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--head", action="append", default=[], help="LABEL:PATH of a head.pt")
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--prune", type=int, default=0, help="also report each head with vectors cut to their top-k terms")
    ap.add_argument("--out", type=Path, default=Path("test-artifacts/bench-offline"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    tok = load_tokenizer()
    heads = [(h.split(":", 1)[0], Path(h.split(":", 1)[1])) for h in args.head]
    rows = trained_rows(args.run, heads, tok, args.prune) + random_rows(args.run, tok)
    if args.bundle:
        rows += bundle_rows(args.bundle, args.run, tok)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": dt.date.today().isoformat(), "machine": f"{platform.machine()}, 2 cores shared, no GPU",
            "python": platform.python_version(), "torch": torch.__version__}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=float))
    md = markdown(rows)
    (args.out / "results.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
