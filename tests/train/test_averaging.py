import pytest
import torch

from d2s_search.train.averaging import WeightAverage


def one_weight(value: float) -> torch.nn.Linear:
    m = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(value)
    return m


def test_the_average_by_hand_with_its_warm_up():
    m = one_weight(1.0)
    avg = WeightAverage(m, decay=0.2)
    with torch.no_grad():
        m.weight.fill_(2.0)
    avg.update(m)  # decay min(0.2, 2/11) = 2/11: 2/11 * 1 + 9/11 * 2
    assert avg.shadow["weight"].item() == pytest.approx(2 / 11 + 18 / 11)
    with torch.no_grad():
        m.weight.fill_(4.0)
    avg.update(m)  # decay min(0.2, 3/12) = 0.2
    assert avg.shadow["weight"].item() == pytest.approx(0.2 * 20 / 11 + 0.8 * 4)
    assert m.weight.item() == 4.0  # the live weights are untouched


def test_applied_swaps_the_average_in_and_always_back():
    m = one_weight(3.0)
    avg = WeightAverage(m, decay=0.5)
    avg.shadow["weight"].fill_(7.0)
    with avg.applied(m):
        assert m.weight.item() == 7.0
    assert m.weight.item() == 3.0
    with pytest.raises(RuntimeError, match="inside"), avg.applied(m):
        raise RuntimeError("inside")
    assert m.weight.item() == 3.0


def test_state_round_trips_and_a_foreign_state_is_refused():
    m = one_weight(1.0)
    a = WeightAverage(m, decay=0.9)
    a.update(one_weight(5.0))
    b = WeightAverage(m, decay=0.9)
    b.load_state_dict(a.state_dict())
    assert b.updates == 1 and torch.equal(b.shadow["weight"], a.shadow["weight"])
    with pytest.raises(ValueError, match="another head or decay"):
        WeightAverage(m, decay=0.99).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="another head or decay"):
        WeightAverage(torch.nn.Linear(1, 1), decay=0.9).load_state_dict(a.state_dict())


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_a_decay_outside_zero_one_is_refused(decay):
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        WeightAverage(one_weight(1.0), decay)
