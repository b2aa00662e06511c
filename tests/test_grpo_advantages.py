"""Advantage estimators (stages/advantages.py): handed case GRPO-01, leave-one-out, dynamic filtering."""

import pytest
import torch

from stages.advantages import (
    get_advantage,
    grpo_advantages,
    informative_groups,
    leave_one_out_advantages,
)
from tests.handed import handed_case


@pytest.fixture(scope="module")
def grpo01():
    case = handed_case("GRPO-01")
    return case["input"], case["expected"]


def test_grpo01_group_normalized_with_unbiased_std(grpo01):
    inp, exp = grpo01
    assert inp["std"].startswith("unbiased")
    adv = grpo_advantages(torch.tensor(inp["rewards"], dtype=torch.float32), inp["num_generations"],
                          eps=inp["eps"], ddof=1)
    assert adv.tolist() == pytest.approx(exp["advantages"], abs=exp["tolerance"])
    assert adv.view(-1, 4).sum(dim=1).tolist() == pytest.approx(exp["per_group_sum"], abs=1e-6)


def test_grpo01_population_std_variant_and_the_invariants_of_the_kind(grpo01):
    inp, _ = grpo01
    rewards = torch.tensor(inp["rewards"], dtype=torch.float32)
    adv = grpo_advantages(rewards, 4, eps=inp["eps"], ddof=0)
    assert adv[0].item() == pytest.approx(1.7317, abs=1e-3) and adv[4].item() == pytest.approx(0.5772, abs=1e-3)
    for ddof in (0, 1):
        a = grpo_advantages(rewards, 4, eps=inp["eps"], ddof=ddof)
        # the lone correct answer of group 1 gets 3x each correct answer of group 2
        assert a[0].item() == pytest.approx(3 * a[4].item(), rel=1e-4)
        # the all-zero group gets exactly 0, finite
        assert a[8:].tolist() == [0.0, 0.0, 0.0, 0.0] and torch.isfinite(a).all()
        # not z-scored over the batch (that bug gives every correct answer the same value 1.3537)
        assert a[0].item() != pytest.approx(a[4].item(), abs=1e-2)


def test_all_equal_nonzero_group_is_finite_zero_and_filtered():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.0, 0.5])
    adv = grpo_advantages(rewards, 3)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert informative_groups(rewards, 3).tolist() == [False, True]


def test_leave_one_out_hand_values():
    # r = [1, 0, 0, 1]: baselines mean of the other three: 1/3, 2/3, 2/3, 1/3
    adv = leave_one_out_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4)
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert get_advantage("leave_one_out") is leave_one_out_advantages


def test_scale_false_is_mean_baseline_only():
    assert grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, scale=False).tolist() == pytest.approx(
        [0.75, -0.25, -0.25, -0.25])


def test_bad_group_shapes_raise_readable_errors():
    with pytest.raises(ValueError, match=r"do not split into groups of 4"):
        grpo_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="ddof=1 needs groups larger than 1"):
        grpo_advantages(torch.zeros(3), 1)
    with pytest.raises(ValueError, match="no advantage estimator 'ppo'"):
        get_advantage("ppo")
