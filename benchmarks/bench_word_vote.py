"""How far can image term precision go on the offline model's photo vectors? (issue 12)

A reference that needs no head: each held-out photo's top-10 words by a vote of the captions
of its k nearest training photos (cosine between the aligned photo vectors, each neighbour's
caption words weighted by its similarity and by how many of its captions use them; optionally
times the word's idf over the training photos), scored as ``bench_offline_head.py`` scores a
head: the share of the 10 words that occur in the photo's own captions. Words are limited to
the head's allowed terms. Also the same for a photo-blind prior: the 10 words on the most
training photos.

    OMP_NUM_THREADS=1 python benchmarks/bench_word_vote.py --data test-artifacts/offline/align-ridge/embeddings \\
        test-artifacts/offline/shipped-head.pt
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def caption_words(split, allowed: set[str]) -> list[Counter]:
    """Per photo, how many of its captions use each allowed word."""
    from bench_offline_head import WORD

    words = [Counter() for _ in split.image_ids]
    for caption, image in zip(split.captions, split.caption_image, strict=True):
        words[int(image)].update(w for w in set(WORD.findall(caption.lower())) if w in allowed)
    return words


def vote(similarity: np.ndarray, train_words: list[Counter], k: int, idf: dict[str, float] | None) -> list[list[str]]:
    top = []
    for row in similarity:
        votes: Counter = Counter()
        for j in np.argsort(-row, kind="stable")[:k]:
            for w, c in train_words[j].items():
                votes[w] += c * row[j] * (idf[w] if idf else 1.0)
        top.append([w for w, _ in votes.most_common(10)])
    return top


def main() -> None:
    from d2s_search.train.data import load_dataset
    from d2s_search.train.vocab import id_to_token, load_tokenizer
    from onnx_export.head import load_head

    ap = argparse.ArgumentParser()
    ap.add_argument("head", type=Path, help="A head whose allowed terms limit the words.")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--neighbours", default="5,10,20,50")
    args = ap.parse_args()
    splits = load_dataset(args.data)
    names = id_to_token(load_tokenizer())
    allowed_ids = np.flatnonzero(load_head(args.head).allowed.numpy() > 0)
    allowed = {names[i] for i in allowed_ids}
    from bench_offline_head import caption_word_sets, word_precision

    train, test = splits["train"], splits["test"]
    train_words, test_words = caption_words(train, allowed), caption_word_sets(test)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    similarity = unit(test.image_emb) @ unit(train.image_emb).T
    df = Counter(w for words in train_words for w in words)
    idf = {w: float(np.log(len(train_words) / n)) for w, n in df.items()}
    prior = [w for w, _ in df.most_common(10)]
    out = {"test_photos": len(test_words), "train_photos": len(train_words),
           "caption_words_per_photo": round(float(np.mean([len(w & allowed) for w in test_words])), 1),
           "prior": {"words": prior, "precision@10": round(word_precision([prior] * len(test_words), test_words), 3)},
           "vote": []}
    for k in (int(v) for v in args.neighbours.split(",")):
        for weighted in (False, True):
            p = word_precision(vote(similarity, train_words, k, idf if weighted else None), test_words)
            out["vote"].append({"neighbours": k, "idf": weighted, "precision@10": round(p, 3)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
