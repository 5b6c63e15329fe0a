"""Batches of similar pairs: topic-aware sampling for distillation.

With random batches most of a caption's in-batch negatives are about something else, and the
dense teacher at tau 1e-3 gives them almost no mass: the head learns the topic's words and
little that tells two photos of dogs apart, which is what R@1 asks. Topic-aware sampling
(Hofstaetter et al., SIGIR 2021, "TAS-Balanced") draws each batch from a few clusters of
similar inputs, so the teacher's scores among the negatives carry information. Here the
clusters are over the training images (every caption of an image stays in its image's
cluster), made once by spherical k-means on the frozen dense vectors, and an epoch still
visits every pair once: the clusters in a random order, the rows of each in a random order,
cut into batches.
"""

from __future__ import annotations

import math

import numpy as np


def spherical_kmeans(x: np.ndarray, k: int, seed: int, iterations: int = 20, chunk: int = 8192) -> np.ndarray:
    """The cluster (0..k-1) of each row of ``x`` by cosine similarity; deterministic for a seed.
    An emptied cluster restarts at the row farthest from its centroid."""
    n = x.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"cannot make {k} clusters of {n} vectors")
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    unit = unit.astype(np.float32)
    rng = np.random.default_rng(seed)
    centroids = unit[rng.choice(n, size=k, replace=False)].copy()
    labels = np.full(n, -1, dtype=np.int64)
    for _ in range(iterations):
        best = np.empty(n, dtype=np.float32)
        new = np.empty(n, dtype=np.int64)
        for start in range(0, n, chunk):  # bounded memory: n x k scores would not fit at COCO's size
            sims = unit[start : start + chunk] @ centroids.T
            new[start : start + chunk] = sims.argmax(axis=1)
            best[start : start + chunk] = sims.max(axis=1)
        sizes = np.bincount(new, minlength=k)
        for c in np.flatnonzero(sizes == 0):  # restart an empty cluster at the worst-served row
            far = int(best.argmin())
            new[far], best[far] = c, 1.0
        if np.array_equal(new, labels):
            break
        labels = new
        sums = np.zeros_like(centroids)
        np.add.at(sums, labels, unit)
        centroids = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    return labels


def image_clusters(image_emb: np.ndarray, caption_image: np.ndarray, images_per_cluster: int,
                   seed: int) -> np.ndarray:
    """The cluster of each training row (caption): k-means over the images the rows use, about
    ``images_per_cluster`` images per cluster."""
    if images_per_cluster < 1:
        raise ValueError(f"images per cluster must be >= 1, got {images_per_cluster}")
    used, row_image = np.unique(caption_image, return_inverse=True)
    k = max(1, math.ceil(len(used) / images_per_cluster))
    return spherical_kmeans(np.asarray(image_emb)[used], k, seed)[row_image]


def clustered_order(rng: np.random.Generator, row_cluster: np.ndarray) -> np.ndarray:
    """A permutation of the rows: the clusters in a random order, each cluster's rows shuffled,
    so consecutive batches are cut from one or a few clusters."""
    cluster_rank = rng.permutation(int(row_cluster.max()) + 1)[row_cluster]
    return np.lexsort((rng.random(len(row_cluster)), cluster_rank))
