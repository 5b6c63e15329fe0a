import pytest
import torch

from d2s_search.train.augment import PairMixer, join_rows, mix_vectors


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
