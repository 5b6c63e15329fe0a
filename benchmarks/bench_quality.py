"""Retrieval quality and the words, at 1,000 and 5,000 documents, on a split no choice has seen.

    OMP_NUM_THREADS=1 python benchmarks/bench_quality.py --seeds 0,1 --json OUT.json

The caption benchmark (the real all-MiniLM-L6-v2 is the frozen dense model; a caption plays each
image, the image's other captions are its queries), split so that a larger collection can be
searched on data nothing was chosen on:

* **train**: the Flickr30k dev captions (200 of their images held out as **validation**) and the
  flickr8k-800 captions: 1,614 documents, 6,456 queries;
* **test**: 1,000 target documents, 500 COCO dev and 500 Flickr30k test images (their first
  caption), queried by their other 4,000 captions; the **5k** collection adds 4,000 distractor
  documents: every caption of the other COCO dev and Flickr30k test images (5 per image, so
  near-paraphrases stand beside each other as near-duplicate photos do). No test text is seen by
  training, by the epoch choice or by the document shift's choice.
* **validation** at 1k and 5k: the 200 validation documents plus 800 / 4,800 training captions
  as distractors (text training saw, which a calibration may use).

``d2s-search train --data D --seed S`` (its defaults, or ``--train-args``) chooses epoch, shift
and boost on validation; every head is then scored on validation and test at both sizes: sparse
and dense R@1 and their ratio, FLOPs, terms per image and the widest image term (the share of
images it is active on, beside the share of the images whose captions contain it), Exact@20,
the widest query expansion, and image term precision@10 (of an image's 10 strongest terms, the
share that are words of its own captions, inflections of one word counted as that word).
Expansions: for 50 test queries, their 5 strongest terms that are not their own words, and the
share of them a person judged unrelated to the query (``judgements/expansions.tsv``).

``--photos RUN/embeddings --head HEAD.pt --variant ...``: the same columns for a head on an
``d2s-search align`` run's held-out photos (the offline model), without distractors.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common
import numpy as np

_common.use_repository()

CAPS = _common.DATA / "karpathy-captions"
N_VAL = 200
TARGETS_PER_SOURCE = 500
SIZES = (1000, 5000)
WORD = re.compile(r"[a-z]+")


def _groups() -> dict[str, list[list[str]]]:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_d2s_minilm import flickr8k_groups, read_groups

    return {"f30k_dev": read_groups(CAPS / "f30k_precomp_dev_caps.txt"),
            "f30k_test": read_groups(CAPS / "f30k_precomp_test_caps.txt"),
            "coco_dev": read_groups(CAPS / "coco_precomp_dev_caps.txt"),
            "f8k": flickr8k_groups()}


def build(out: Path, seed: int = 0) -> dict:
    """The splits above in the authors' layout (``out``), the distractors beside them; built once."""
    if (out / "layout.json").is_file():
        return json.loads((out / "layout.json").read_text())
    from d2s_search.train.data import write_embeddings
    from d2s_search.train.minilm import MiniLMEncoder

    rng = np.random.default_rng(seed)
    g = _groups()
    val = set(rng.permutation(len(g["f30k_dev"]))[:N_VAL].tolist())
    images, docs, doc_ids, queries, query_ids = [], [], [], [], []

    def target(iid: str, split: str, captions: list[str]) -> None:
        sents = [{"sentid": f"{iid}-q{j}", "raw": c} for j, c in enumerate(captions[1:])]
        images.append({"imgid": iid, "split": split, "doc": captions[0], "sentences": sents})
        docs.append(captions[0])
        doc_ids.append(iid)
        queries.extend(s["raw"] for s in sents)
        query_ids.extend(s["sentid"] for s in sents)

    for k, caps in enumerate(g["f30k_dev"]):
        target(f"f30k-dev-{k:05d}", "val" if k in val else "train", caps)
    for k, caps in enumerate(g["f8k"]):
        target(f"f8k-{k:05d}", "train", caps)
    distractors: list[str] = []
    for source in ("coco_dev", "f30k_test"):
        order = rng.permutation(len(g[source]))
        for rank, k in enumerate(order.tolist()):
            if rank < TARGETS_PER_SOURCE:
                target(f"{source}-{k:05d}", "test", g[source][k])
            else:
                distractors.extend(g[source][k])
    train_texts = [img["doc"] for img in images if img["split"] == "train"]
    train_texts += [s["raw"] for img in images if img["split"] == "train" for s in img["sentences"]]
    val_pool = [train_texts[i] for i in rng.permutation(len(train_texts))[: SIZES[-1] - N_VAL]]
    test_pool = [distractors[i] for i in rng.permutation(len(distractors))[: SIZES[-1] - 2 * TARGETS_PER_SOURCE]]

    enc = MiniLMEncoder()
    t0 = time.perf_counter()
    embed = lambda texts: np.vstack([enc(texts[i : i + 128]) for i in range(0, len(texts), 128)])  # noqa: E731
    out.mkdir(parents=True, exist_ok=True)
    write_embeddings(out, "img", doc_ids, embed(docs))
    write_embeddings(out, "text", query_ids, embed(queries))
    (out / "dataset_meta.json").write_text(json.dumps({"images": images}))
    np.save(out / "val_distractors.npy", embed(val_pool).astype(np.float32))
    np.save(out / "test_distractors.npy", embed(test_pool).astype(np.float32))
    layout = {"encode_seconds": round(time.perf_counter() - t0, 1),
              "train_documents": sum(img["split"] == "train" for img in images),
              "val_documents": N_VAL, "test_documents": 2 * TARGETS_PER_SOURCE,
              "val_distractors": len(val_pool), "test_distractors": len(test_pool)}
    (out / "layout.json").write_text(json.dumps(layout))
    return layout


def cli(*args: str) -> dict:
    exe = Path(sys.executable).with_name("d2s-search")
    done = subprocess.run([str(exe), *args, "--json"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"d2s-search {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def train(data: Path, out: Path, seed: int, threads: int, extra: list[str]) -> dict:
    """The product's own command; its summary is kept beside the head (a rerun reuses it)."""
    if not (out / "summary.json").is_file():
        t0 = time.perf_counter()
        summary = cli("train", "--data", str(data), "--out", str(out), "--seed", str(seed),
                      "--threads", str(threads), *extra)
        summary["train_minutes"] = round((time.perf_counter() - t0) / 60, 1)
        (out / "summary.json").write_text(json.dumps(summary))
    return json.loads((out / "summary.json").read_text())


def caption_words(split) -> list[set[str]]:
    """Per image, the words of all its captions (its document caption's queries included)."""
    words: list[set[str]] = [set() for _ in split.image_ids]
    for text, image in zip(split.captions, split.caption_image, strict=True):
        words[int(image)].update(WORD.findall(text.lower()))
    return words


def term_precision(docs, n_targets: int, words: list[set[str]], names: list[str], k: int = 10,
                   shown: bool = False) -> float:
    """Mean share of an image's ``k`` strongest terms that are words of its own captions, an
    inflection (``dogs`` for ``dog``, d2s_search.inflections) counted as its word. ``shown``: its
    first ``k`` words as a person reads them instead, by weight x IDF over ``docs`` (the whole
    collection), one per inflection group."""
    from d2s_search.inflections import inflections

    key = inflections().key
    df = np.bincount(docs.indices, minlength=docs.shape[1])
    idf = np.log(docs.shape[0] / np.maximum(df, 1))
    shares = []
    for row in range(n_targets):
        s, e = docs.indptr[row], docs.indptr[row + 1]
        if e == s:
            shares.append(0.0)
            continue
        terms, weights = docs.indices[s:e], docs.data[s:e]
        order = terms[np.argsort(-(weights * idf[terms] if shown else weights), kind="stable")]
        top = list(dict.fromkeys(key(names[t]) for t in order))[:k] if shown else [key(names[t]) for t in order[:k]]
        own = {key(w) for w in words[row]}
        shares.append(sum(t in own for t in top) / len(top))
    return float(np.mean(shares))


def score(head, split, tokens, distractors: np.ndarray, size: int, names: list[str]) -> dict:
    """Sparse and dense over the split's images plus distractors up to ``size`` documents."""
    from d2s_search import metrics as M
    from d2s_search.evaluate import EvalData, EvalOptions, SparseVectors, boost_own_words, evaluate
    from d2s_search.train.modeling import encode_sparse
    from d2s_search.train.validation import with_distractors

    n = len(split.image_ids)
    pool = with_distractors(split, distractors[: max(0, size - n)])
    ev = EvalData.from_split(pool, split.name)
    qt = [tokens.row(i) for i in range(len(tokens))]
    q = boost_own_words(encode_sparse(head, ev.query_emb), qt, head.allowed.numpy() > 0, head.config.query_word_boost)
    d = encode_sparse(head, ev.doc_emb, document=True)
    res = evaluate(ev, SparseVectors(q, d), qt, None, EvalOptions(runs=("dense", "sparse")), names)
    sparse, dense, co = res["runs"]["sparse"], res["runs"]["dense"], res["coactivation"]
    words = caption_words(split)
    share = M.active_share(d[:n])
    widest = int(np.argmax(share))
    in_captions = float(np.mean([names[widest] in w for w in words]))
    return {"documents": int(d.shape[0]), "queries": int(q.shape[0]),
            "R@1": round(sparse["R@1"], 4), "dense_R@1": round(dense["R@1"], 4),
            "ratio": round(sparse["R@1"] / dense["R@1"], 3), "FLOPs": round(sparse["FLOPs"], 2),
            "Exact@20": round(sparse["Exact@20"], 3), "terms_per_query": round(sparse["terms_per_query"], 1),
            "terms_per_image": round(float(np.diff(d.indptr[: n + 1]).mean()), 1),
            "widest_image_term": [names[widest], round(float(share[widest]), 3), round(in_captions, 3)],
            "widest_expansion": [co.get("max_foreign_query_term"), round(co.get("max_foreign_query_share", 0), 3)],
            "image_term_precision@10": round(term_precision(d, n, words, names), 3),
            "image_word_precision@10_shown": round(term_precision(d, n, words, names, shown=True), 3)}


def recalibrate(head, splits, tok, terms: int, max_share: float, shift: float | None = None,
                budget: float = 12.0) -> None:
    """What ``train`` does after its last epoch (calibrate.calibrate_trained_head), on these weights:
    images cut to ``terms``, the document and query shifts chosen on validation (plus up to 4,000
    training images) within ``budget``, then the floors of terms on more than ``max_share`` of the
    training images (0: none). A ``shift`` given is kept instead of chosen (and no query shift)."""
    from d2s_search.train.calibrate import calibrate_trained_head, choose_document_floors
    from d2s_search.train.vocab import tokenize_captions

    head.config.document_floors = {}
    head.floor.zero_()
    train = splits["train"]
    train_tokens = tokenize_captions(train.captions, tok) if max_share > 0 else None
    if shift is None:
        calibrate_trained_head(head, splits["val"], tokenize_captions(splits["val"].captions, tok), "c+w", budget,
                               head.config.query_word_boost, train, train_tokens, 4000, terms, max_share)
        return
    head.config.document_terms, head.config.document_shift = terms, shift
    if max_share > 0:
        choose_document_floors(head, train, train_tokens, max_share)


JUDGED = Path(__file__).parent / "judgements" / "expansions.tsv"
EXPANSION_QUERIES = 50
EXPANSIONS_SHOWN = 5


def expansions(head, split, tokens, names: list[str]) -> list[tuple[str, list[str]]]:
    """The first test queries (one per image, seeded order) and their strongest terms that are
    not their own words: what a person sees the query become."""
    from d2s_search.evaluate import boost_own_words
    from d2s_search.train.modeling import encode_sparse

    rows = np.random.default_rng(0).permutation(len(split.captions))[:EXPANSION_QUERIES]
    qt = [tokens.row(int(i)) for i in rows]
    q = boost_own_words(encode_sparse(head, split.text_emb[rows]), qt, head.allowed.numpy() > 0,
                        head.config.query_word_boost)
    out = []
    for k, row in enumerate(rows):
        s, e = q.indptr[k], q.indptr[k + 1]
        own = set(qt[k].tolist())
        order = np.argsort(-q.data[s:e], kind="stable")
        foreign = [names[t] for t in q.indices[s:e][order] if t not in own][:EXPANSIONS_SHOWN]
        out.append((split.captions[int(row)], foreign))
    return out


def judged_share(listed: list[tuple[str, list[str]]], path: Path = JUDGED) -> dict:
    """Share of the listed expansions a person judged unrelated to their query
    (``judgements/expansions.tsv``: query, term, related|unrelated); unjudged ones are counted
    apart, not guessed."""
    verdicts: dict[tuple[str, str], str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            query, term, verdict = line.split("\t")
            verdicts[(query, term)] = verdict
    found = [verdicts.get((query, term)) for query, terms in listed for term in terms]
    judged = [v for v in found if v is not None]
    return {"expansions": len(found), "judged": len(judged),
            "unrelated_share": round(sum(v == "unrelated" for v in judged) / len(judged), 3) if judged else None}


def score_head(path: Path, data: Path, variant: tuple | None = None) -> dict:
    """Every column for the head at ``path``; ``variant`` (terms, max share[, shift]): recalibrated
    first. ``data`` without distractor files (an ``align`` run's ``embeddings/``: photos) is
    scored on its splits alone."""
    import torch
    from d2s_onnx_export.head import load_head

    from d2s_search.train.data import load_dataset
    from d2s_search.train.vocab import id_to_token, load_tokenizer, tokenize_captions

    torch.set_num_threads(1)
    splits = load_dataset(data)
    tok = load_tokenizer()
    names = id_to_token(tok)
    head = load_head(path).eval()
    if variant is not None:
        recalibrate(head, splits, tok, *variant)
    out = {"document_terms": head.config.document_terms, "document_floors": len(head.config.document_floors)}
    for name in ("val", "test"):
        split = splits[name]
        tokens = tokenize_captions(split.captions, tok)
        pool = data / f"{name}_distractors.npy"
        if pool.is_file():
            distractors = np.load(pool)
            out[name] = {str(size): score(head, split, tokens, distractors, size, names) for size in SIZES}
        else:
            none = np.zeros((0, split.image_emb.shape[1]), np.float32)
            out[name] = {"all": score(head, split, tokens, none, len(split.image_ids), names)}
    test = splits["test"]
    listed = expansions(head, test, tokenize_captions(test.captions, tok), names)
    out["expansions"] = {"judged": judged_share(listed), "listed": listed}
    out["document_shift"] = head.config.document_shift
    out["query_shift"] = head.config.query_shift
    out["query_word_boost"] = head.config.query_word_boost
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--data", default=str(_common.CACHE / "quality"), help="the split's vectors (built once)")
    parser.add_argument("--out", default=str(_common.CACHE / "quality-heads"), help="heads, one folder per recipe and seed")
    parser.add_argument("--recipe", default="default", help="a name for --train-args (the heads' folder)")
    parser.add_argument("--train-args", default="", help="extra `d2s-search train` flags (quoted)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training run")
    parser.add_argument("--head", action="append", type=Path, default=[],
                        help="score this trained head too (no training)")
    parser.add_argument("--variant", action="append", default=[], metavar="TERMS,SHARE[,SHIFT]",
                        help="with --head: also recalibrate it as train would with --document-terms TERMS "
                             "--max-image-share SHARE (SHIFT: that document shift, not a chosen one)")
    parser.add_argument("--photos", metavar="EMBEDDINGS",
                        help="score --head on an `align` run's embeddings (its held-out photos) instead")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads=f"{args.threads} torch thread(s)")
    data = Path(args.photos or args.data)
    if not args.photos:
        summary["layout"] = build(data)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",") if s):
        folder = Path(args.out) / args.recipe / f"seed-{seed}"
        trained = train(data, folder, seed, args.threads, shlex.split(args.train_args))
        rows.append({"recipe": args.recipe, "seed": seed, "epoch_kept": trained.get("best_epoch"),
                     "train_minutes": trained.get("train_minutes"), **score_head(folder / "head.pt", data)})
    for path in args.head:
        rows.append({"recipe": str(path), "seed": None, **score_head(path, data)})
        for spec in args.variant:
            terms, share, *shift = spec.split(",")
            fixed = f", shift {shift[0]}" if shift else ""
            rows.append({"recipe": f"{path}, recalibrated: {terms} terms, terms on at most {share} of images{fixed}",
                         "seed": None,
                         **score_head(path, data, (int(terms), float(share), *(float(x) for x in shift)))})
    summary["heads"] = rows
    ratios = [r["test"]["5000"]["ratio"] for r in rows if "5000" in r["test"]]
    summary["mean_test_5k_ratio"] = round(statistics.mean(ratios), 3) if ratios else None
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    rows = []
    for r in summary["heads"]:
        v1, v5, t1, t5 = r["val"]["1000"], r["val"]["5000"], r["test"]["1000"], r["test"]["5000"]
        term, share, in_caps = t5["widest_image_term"]
        expansion, exp_share = t5["widest_expansion"]
        judged = judged_share([tuple(x) for x in r["expansions"]["listed"]])  # the verdicts as they are now
        unrelated = "–" if judged["unrelated_share"] is None else f"{judged['unrelated_share']:.0%} of {judged['judged']}"
        cut = f"{r['document_terms']}" if r["document_terms"] else "all"
        rows.append([r["recipe"] if r["seed"] is None else f"{r['recipe']}, seed {r['seed']}",
                     f"{r['document_shift']:g} / {r.get('query_shift', 0):g} / {cut} / {r['document_floors']}",
                     f"{v1['ratio']:.3f}", f"{v5['ratio']:.3f}",
                     f"{t1['R@1']:.3f} / {t1['dense_R@1']:.3f} = **{t1['ratio']:.3f}**",
                     f"{t5['R@1']:.3f} / {t5['dense_R@1']:.3f} = **{t5['ratio']:.3f}**",
                     f"{v5['ratio'] - t5['ratio']:+.3f}", f"{t5['FLOPs']:.1f}", f"{t5['terms_per_image']:.0f}",
                     f"{term} {share:.0%} ({in_caps:.0%})", f"{expansion} {exp_share:.0%}",
                     f"{t5['image_term_precision@10']:.2f}", unrelated])
    head = ["head", "shift / query shift / terms kept / floors", "val 1k", "val 5k", "test 1k: sparse / dense R@1",
            "test 5k: sparse / dense R@1", "drop val → test (5k)", "test 5k FLOPs", "terms / image",
            "widest image term (its captions)", "widest expansion", "image term P@10", "expansions judged unrelated"]
    return _common.table(head, rows) + "\n\n" + _common.caption(summary)


if __name__ == "__main__":
    main()
