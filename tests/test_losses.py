"""Loss maths on plain tensors (stages/losses.py): handed case GRPO-03, KL k3, policy gradient, SFT CE."""

import math

import pytest
import torch

from stages.losses import (
    aggregate,
    get_distillation_loss,
    get_policy_loss,
    kl_k3,
    kl_penalty,
    policy_gradient_loss,
    sft_loss,
    sft_target_mask,
)
from tests.handed import handed_case


@pytest.fixture(scope="module")
def grpo03():
    case = handed_case("GRPO-03")
    inp = case["input"]
    return (torch.tensor(inp["per_token_loss"], dtype=torch.float32), torch.tensor(inp["mask"], dtype=torch.bool),
            torch.tensor(inp["truncated"]), inp["max_len_for_dr_grpo"], case["expected"])


def test_grpo03_every_aggregation_matches_the_hand_values(grpo03):
    loss, mask, _, max_len, exp = grpo03
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(exp["token_mean"], abs=1e-4)
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx(exp["seq_mean_token_mean"], abs=1e-4)
    assert aggregate(loss, mask, "seq_mean_token_sum_norm", max_len=max_len).item() == pytest.approx(
        exp["seq_mean_token_sum_norm"], abs=1e-4)


def test_grpo03_masked_values_never_matter_even_inf_or_nan(grpo03):
    loss, mask, _, max_len, _ = grpo03
    poisoned = torch.where(mask, loss, torch.tensor(float("nan")))
    poisoned[0, 5] = float("inf")
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        assert aggregate(poisoned, mask, mode, max_len=max_len).item() == pytest.approx(
            aggregate(loss, mask, mode, max_len=max_len).item())


def test_grpo03_truncated_rows_leave_numerator_and_denominator(grpo03):
    loss, mask, truncated, _, exp = grpo03
    kept = mask & ~truncated[:, None]
    assert aggregate(loss, kept, "token_mean").item() == pytest.approx(exp["token_mean_with_truncated_masked"])
    # the buggy variant (truncated tokens kept in the denominator) gives 4/5
    assert aggregate(loss, kept, "token_mean", num_tokens=mask.sum()).item() == pytest.approx(0.8)


def test_grpo03_all_masked_batch_is_zero_with_finite_gradient(grpo03):
    loss, mask, _, max_len, exp = grpo03
    x = loss.clone().requires_grad_(True)
    none = torch.zeros_like(mask)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        out = aggregate(x, none, mode, max_len=max_len)
        assert out.item() == exp["all_masked_batch_loss"]
        (g,) = torch.autograd.grad(out, x)
        assert torch.equal(g, torch.zeros_like(g))


def test_aggregate_rejects_shape_mismatch_and_unknown_mode():
    with pytest.raises(ValueError, match="differ in shape"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="unknown aggregation 'sum'"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "sum")


def test_policy_gradient_value_and_gradient_are_reinforce_with_window_normalizer():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]])).requires_grad_(True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    loss, stats = policy_gradient_loss(lp, adv, mask, num_tokens=6)  # 6 = tokens of the whole window
    # ratio == 1: loss = -(2 + 2 - 1) / 6
    assert loss.item() == pytest.approx(-3 / 6)
    assert stats == {"pg_loss": pytest.approx(-0.5)}
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.allclose(g, torch.tensor([[-2 / 6, -2 / 6, 0.0], [1 / 6, 0.0, 0.0]]))


def test_kl_k3_hand_value_zero_at_equality_and_exact_kl_in_expectation():
    # d = log(0.25) - log(0.5) = -log 2 -> e^d - d - 1 = 0.5 + log 2 - 1
    assert kl_k3(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25))).item() == pytest.approx(
        0.5 + math.log(2) - 1)
    assert kl_k3(torch.tensor(-1.3), torch.tensor(-1.3)).item() == 0.0
    p, q = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.5, 0.3])
    expected = (p * (p / q).log()).sum()
    assert (p * kl_k3(p.log(), q.log())).sum().item() == pytest.approx(expected.item(), rel=1e-6)


def test_kl_term_is_added_with_beta_and_needs_a_reference():
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = policy_gradient_loss(lp, torch.zeros(1), mask, ref_logprobs=ref, kl_beta=0.03)
    assert stats["kl"] == pytest.approx((0.5 + math.log(2) - 1) / 2)  # k3's value, logged
    assert stats["kl_penalty"] == pytest.approx(0.5 * math.log(2) ** 2 / 2)  # k2 (the default), in the loss
    assert loss.item() == pytest.approx(0.03 * stats["kl_penalty"])
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_gradient_loss(lp, torch.zeros(1), mask, kl_beta=0.03)


def test_sft_loss_equals_hand_computation_over_the_window():
    # vocab 3; one packed row of two documents: positions [0,1,2,0,1]
    logits = torch.zeros(1, 5, 3)
    logits[0, 0] = torch.tensor([0.0, math.log(3.0), 0.0])   # p(1) = 3/5
    logits[0, 1] = torch.tensor([math.log(4.0), 0.0, 0.0])   # p(0) = 4/6
    logits[0, 3] = torch.tensor([0.0, 0.0, math.log(8.0)])   # p(2) = 8/10
    labels = torch.tensor([[-100, 1, 0, 2, 2]])
    position_ids = torch.tensor([[0, 1, 2, 0, 1]])
    # target 2 at t=3 starts a document: never trained on t=2 of the previous one
    mask = sft_target_mask(labels, position_ids)
    assert mask.tolist() == [[True, True, False, True]]
    hand = -(math.log(3 / 5) + math.log(4 / 6) + math.log(8 / 10))
    loss, stats = sft_loss(logits, labels, position_ids=position_ids)
    assert loss.item() == pytest.approx(hand / 3, rel=1e-6)
    assert stats["tokens"] == 3 and stats["nll_sum"] == pytest.approx(hand, rel=1e-6)
    # in a window of 10 supervised tokens the same micro-batch contributes hand / 10
    assert sft_loss(logits, labels, position_ids=position_ids, num_tokens=10)[0].item() == pytest.approx(hand / 10)


def test_loss_registry_names_each_family_apart():
    from stages.mopd import mopd_loss

    assert get_policy_loss("policy_gradient") is policy_gradient_loss
    assert get_distillation_loss("mopd") is mopd_loss
    with pytest.raises(ValueError, match="no policy loss 'ppo'"):
        get_policy_loss("ppo")
    with pytest.raises(ValueError, match="no policy loss 'mopd'.*installed: policy_gradient"):
        get_policy_loss("mopd")  # a distillation loss is not a GRPO loss
    with pytest.raises(ValueError, match="no distillation loss 'sft'"):
        get_distillation_loss("sft")


@pytest.mark.parametrize(("estimator", "divergence"), [("k1", None), ("k2", "reverse"), ("k3", "forward")])
def test_kl_penalty_gradient_descends_the_divergence_its_docstring_names(estimator, divergence):
    """The exact expectation over a 6-token vocabulary of the penalty's gradient under y ~ pi_theta
    equals autograd of the exact divergence: k2 -> KL(pi || ref), k3 -> KL(ref || pi), k1 -> 0."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=g, requires_grad=True)
    ref = torch.randn(6, generator=g).log_softmax(-1)
    logp = theta.log_softmax(-1)
    sampled = logp.exp().detach()  # the sampling distribution carries no gradient (on-policy samples)
    (got,) = torch.autograd.grad((sampled * kl_penalty(logp, ref, estimator)).sum(), theta)
    logp = theta.log_softmax(-1)
    exact = {"reverse": (logp.exp() * (logp - ref)).sum(), "forward": (ref.exp() * (ref - logp)).sum(),
             None: 0.0 * logp.sum()}[divergence]
    (want,) = torch.autograd.grad(exact, theta)
    assert torch.allclose(got, want, atol=1e-6), (got, want)
    assert float(got.abs().max()) > 1e-3 or divergence is None


def test_kl_penalty_clamps_the_log_ratio_like_verl_and_names_a_wrong_estimator():
    lp = torch.tensor([0.0, -60.0], requires_grad=True)
    ref = torch.tensor([-60.0, 0.0])
    assert kl_penalty(lp, ref, "k2").tolist() == pytest.approx([200.0, 200.0])  # d clamped to -20 / +20
    out = kl_penalty(lp, ref, "k3")
    assert out.tolist() == pytest.approx([10.0, 10.0])  # exp(-20) + 20 - 1 and exp(20) - 21, capped at 10
    out.sum().backward()
    assert lp.grad.tolist() == [0.0, 0.0]  # beyond the clamp: no gradient
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(lp, ref, "k4")
