import pytest
import torch

from d2s_search.train.augment import PairMixer, join_rows, mix_pairs, mix_vectors


def test_a_mix_is_the_weighted_sum_at_the_mean_length():
    z = torch.tensor([[3.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    mixed = torch.tensor([True, False, True])
    partner = torch.tensor([1, 2, 0])
    weight = torch.tensor([0.25, 0.9, 0.5])
    out = mix_vectors(z, mixed, partner, weight)
    # row 0: 0.25*(3,0) + 0.75*(0,1) = (0.75, 0.75), rescaled to 0.25*3 + 0.75*1 = 1.5
    half = 1.5 / 2**0.5
    torch.testing.assert_close(out[0], torch.tensor([half, half]))
    torch.testing.assert_close(out[1], z[1])  # not mixed: unchanged
    # row 2: 0.5*(1,1) + 0.5*(3,0) = (2, 0.5), length (sqrt(2) + 3) / 2
    target = torch.tensor([2.0, 0.5]) / (4.25**0.5) * (2**0.5 + 3) / 2
    torch.testing.assert_close(out[2], target)


def test_a_mixed_caption_may_use_the_words_of_both():
    m = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    out = join_rows(m, torch.tensor([True, False, False]), torch.tensor([2, 0, 1]))
    assert out.tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    assert join_rows(None, torch.tensor([True]), torch.tensor([0])) is None


def test_the_mixer_draws_other_rows_its_share_and_repeats_from_its_state():
    mixer = PairMixer(0.5, seed=3)
    state = mixer.state_dict()
    mixed, partner, weight = mixer.draw(20_000)
    assert (partner != torch.arange(20_000)).all()
    assert 0.48 < mixed.float().mean() < 0.52
    assert weight.min() >= 0 and weight.max() <= 1
    again = PairMixer(0.5, seed=99)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(again.draw(20_000), (mixed, partner, weight)))
    assert not PairMixer(0.5, 0).draw(1)[0].any()  # one row has nothing to mix with
    _, _, mild = PairMixer(1.0, seed=3, most=0.25).draw(20_000)
    assert mild.min() >= 0.75 and mild.max() <= 1 and 0.87 < mild.mean() < 0.88
    with pytest.raises(ValueError):
        PairMixer(1.5, 0)
    with pytest.raises(ValueError):
        PairMixer(1.0, 0, most=0)


def test_each_side_is_mixed_only_when_asked():
    zc = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    zi = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    draw = (torch.tensor([True, False]), torch.tensor([1, 0]), torch.tensor([0.5, 0.5]))
    words = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    both = mix_pairs(zc, zi, mask, draw, words=words)
    half = 2**-0.5
    torch.testing.assert_close(both[0][0], torch.tensor([half, half]))
    torch.testing.assert_close(both[1][0], torch.tensor([2 * half, 2 * half]))
    assert both[2].tolist() == [[1.0, 1.0], [0.0, 1.0]]
    assert both[3].tolist() == [[1.0, 1.0], [1.0, 0.0]]  # a mixed image shows both images' words
    images = mix_pairs(zc, zi, mask, draw, "images", words)
    assert torch.equal(images[0], zc) and torch.equal(images[2], mask)
    torch.testing.assert_close(images[1], both[1])
    assert torch.equal(images[3], both[3])
    captions = mix_pairs(zc, zi, mask, draw, "captions", words)
    assert torch.equal(captions[1], zi) and torch.equal(captions[3], words)
    torch.testing.assert_close(captions[0], both[0])
    assert mix_pairs(zc, zi, None, draw)[2:] == (None, None)
    with pytest.raises(ValueError, match="mixed side"):
        mix_pairs(zc, zi, mask, draw, "queries")


def test_neighbour_partners_are_among_the_most_similar_rows():
    # Two tight clusters: every row's nearest other row is in its own cluster.
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    z = centres.repeat_interleave(6, dim=0) + 0.01 * torch.randn(12, 3, generator=g)
    _, partner, _ = PairMixer(1.0, seed=1, neighbours=3).draw(12, z)
    cluster = torch.arange(12) // 6
    assert (cluster[partner] == cluster).all() and (partner != torch.arange(12)).all()
    # One neighbour: the brute-force nearest other row.
    sim = torch.nn.functional.normalize(z, dim=1) @ torch.nn.functional.normalize(z, dim=1).T
    sim.fill_diagonal_(-2.0)
    _, nearest, _ = PairMixer(1.0, seed=1, neighbours=1).draw(12, z)
    assert torch.equal(nearest, sim.argmax(dim=1))
    with pytest.raises(ValueError, match="needs the batch"):
        PairMixer(1.0, seed=1, neighbours=2).draw(4)
    with pytest.raises(ValueError):
        PairMixer(1.0, 0, neighbours=-1)
