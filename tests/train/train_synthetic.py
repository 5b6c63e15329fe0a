"""A small synthetic image-caption set with planted word structure (tests only).

Vocabulary: ids 0..4 are "special" (never output), 5..9 are stop words that occur in
nearly every caption (high df), the rest are content words. Every image is a bag of 3
content words drawn with a Zipf-like frequency; its dense vector is the normalised sum of
the words' hidden vectors plus noise. Each caption names 2 of its image's 3 words plus
stop words; its dense vector is built the same way from the words it names.
"""

from __future__ import annotations

import numpy as np

from d2s_search.train.data import PairSplit
from d2s_search.train.vocab import CaptionTokens

VOCAB = 300
SPECIAL = list(range(5))
STOP = list(range(5, 10))
DIM = 48


def make_split(name: str, n_images: int, captions_per_image: int, seed: int, word_vecs, word_p):
    rng = np.random.default_rng(seed)
    content = np.arange(10, VOCAB)
    img_words, cap_words, cap_img = [], [], []
    for i in range(n_images):
        words = rng.choice(content, size=3, replace=False, p=word_p)
        img_words.append(words)
        for _ in range(captions_per_image):
            named = rng.choice(words, size=2, replace=False)
            stops = rng.choice(STOP, size=2, replace=False)
            cap_words.append(np.concatenate([named, stops]))
            cap_img.append(i)

    def embed(words_list, noise):
        z = np.stack([word_vecs[w].sum(0) for w in words_list])
        z = z + noise * rng.standard_normal(z.shape)
        return (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)

    img_emb = embed([w for w in img_words], 0.3)
    # stop words carry no signal in the dense space: use content words only for the vector
    txt_emb = embed([c[:2] for c in cap_words], 0.3)
    split = PairSplit(
        name,
        [f"{name}-c{j}" for j in range(len(cap_words))],
        [" ".join(f"w{w}" for w in c) for c in cap_words],
        txt_emb,
        [f"{name}-i{i:04d}" for i in range(n_images)],
        img_emb,
        np.asarray(cap_img),
    )
    return split, CaptionTokens.from_lists(cap_words, VOCAB), img_words


def make_dataset(n_train: int = 400, n_val: int = 100, seed: int = 0):
    rng = np.random.default_rng(seed)
    word_vecs = rng.standard_normal((VOCAB, DIM))
    ranks = np.arange(1, VOCAB - 10 + 1)
    word_p = 1.0 / ranks**0.7
    word_p /= word_p.sum()
    train = make_split("train", n_train, 3, seed + 1, word_vecs, word_p)
    val = make_split("val", n_val, 3, seed + 2, word_vecs, word_p)
    return train, val, word_vecs
