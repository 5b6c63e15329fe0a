import numpy as np
import pytest

from d2s_search.train.batching import clustered_order, image_clusters, spherical_kmeans


def planted(rng: np.random.Generator, groups: int, per_group: int, dim: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Vectors around ``groups`` orthogonal directions, at very different lengths (cosine, not
    length, must decide)."""
    truth = np.repeat(np.arange(groups), per_group)
    x = np.eye(dim, dtype=np.float32)[truth] + rng.normal(0, 0.1, (truth.size, dim)).astype(np.float32)
    return x * rng.uniform(0.1, 10.0, (truth.size, 1)).astype(np.float32), truth


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :]))


def test_kmeans_recovers_planted_directions_and_is_deterministic():
    rng = np.random.default_rng(0)
    x, truth = planted(rng, groups=6, per_group=40)
    order = rng.permutation(truth.size)
    labels = spherical_kmeans(x[order], 6, seed=3)
    assert same_partition(labels, truth[order])
    assert np.array_equal(labels, spherical_kmeans(x[order], 6, seed=3))
    assert np.array_equal(spherical_kmeans(x[order], 6, seed=3, chunk=7), labels)  # chunking changes nothing


def test_kmeans_never_leaves_a_cluster_empty():
    rng = np.random.default_rng(1)
    x, _ = planted(rng, groups=2, per_group=30)  # more clusters asked than there are groups
    labels = spherical_kmeans(x, 10, seed=0)
    assert sorted(set(labels.tolist())) == list(range(10))


@pytest.mark.parametrize("k", [0, 61])
def test_kmeans_refuses_impossible_cluster_counts(k):
    with pytest.raises(ValueError, match="clusters of 60 vectors"):
        spherical_kmeans(np.ones((60, 4), dtype=np.float32), k, seed=0)


def test_every_caption_stays_in_its_images_cluster():
    rng = np.random.default_rng(2)
    image_emb, truth = planted(rng, groups=4, per_group=10)  # 40 images
    image_emb = np.concatenate([image_emb, np.ones((5, 16), dtype=np.float32)])  # 5 images no caption uses
    caption_image = rng.permutation(np.repeat(np.arange(40), 3))  # 3 captions per image
    rows = image_clusters(image_emb, caption_image, images_per_cluster=10, seed=0)
    assert rows.shape == caption_image.shape and rows.max() == 3  # ceil(40 / 10) clusters
    for image in range(40):
        assert len(set(rows[caption_image == image].tolist())) == 1
    assert same_partition(rows, truth[caption_image])
    with pytest.raises(ValueError, match="images per cluster"):
        image_clusters(image_emb, caption_image, 0, seed=0)


def test_clustered_order_visits_every_row_once_with_each_cluster_contiguous():
    rng = np.random.default_rng(4)
    row_cluster = rng.integers(0, 7, size=200)
    orders = [clustered_order(rng, row_cluster) for _ in range(3)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(200))
        runs = row_cluster[order]
        assert np.count_nonzero(np.diff(runs)) == len(set(runs.tolist())) - 1  # one run per cluster
    assert not np.array_equal(orders[0], orders[1])  # a new order every epoch
    # the same generator state gives the same order (resumed runs repeat their epochs)
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    assert np.array_equal(clustered_order(a, row_cluster), clustered_order(b, row_cluster))
