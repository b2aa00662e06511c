"""MOPD loss maths on plain tensors (stages/mopd.py): handed case DISTILL-01 (direction and sign of
the KL), hand-computed ICE-POP weights and losses, gradient accumulation."""

import math

import pytest
import torch

from stages.losses import get_distillation_loss, kl_k3
from stages.mopd import distill_advantages, ice_pop_weights, mopd_loss
from tests.handed import handed_case

LN = math.log


def _t(*values, dtype=torch.float32):
    return torch.tensor([list(values)], dtype=dtype)


def test_distill_01_per_token_sign_k1_and_k3():
    case = handed_case("DISTILL-01")
    exp, tol = case["expected"], case["expected"]["tolerance"]
    student, teacher = _t(LN(0.9), LN(0.1)), _t(LN(0.5), LN(0.5))
    adv = distill_advantages(student, teacher)
    assert adv[0].tolist() == pytest.approx(exp["distill_reward_per_token"], abs=tol)
    assert kl_k3(student, teacher)[0].tolist() == pytest.approx(exp["k3_per_token"], abs=tol)
    for i in range(2):  # the loss's own k1 / k3 statistics, one sampled token at a time
        one = slice(i, i + 1)
        _, stats = mopd_loss(student[:, one], student[:, one], teacher[:, one], torch.ones(1, 1, dtype=torch.bool))
        assert stats["reverse_kl"] == pytest.approx(exp["k1_per_token"][i], abs=tol)
        assert stats["reverse_kl_k3"] == pytest.approx(exp["k3_per_token"][i], abs=tol)
    # k3 stays finite where |log r| reaches 50 in either direction
    assert torch.isfinite(kl_k3(_t(0.0, 0.0), _t(50.0, -50.0))).all()


def test_distill_01_expected_k1_under_the_student_is_the_reverse_kl_and_its_gradient():
    """Weighting every token of the vocabulary by the student's probability turns the sampled-token
    estimate into an expectation: it equals KL(student || teacher) (not the forward KL), and the
    MOPD loss's gradient equals the gradient of that reverse KL."""
    case = handed_case("DISTILL-01")
    exp, tol = case["expected"], case["expected"]["tolerance"]
    for i, dist in enumerate(case["input"]["full_distribution"]):
        p_s, p_t = torch.tensor([dist["student"]]), torch.tensor([dist["teacher"]])
        k1 = -distill_advantages(p_s.log(), p_t.log())
        assert float((p_s * k1).sum()) == pytest.approx(exp["reverse_kl_full"][i], abs=tol)
        assert float((p_s * k1).sum()) != pytest.approx(exp["forward_kl_full_for_contrast"][i], abs=1e-2)

        logits = p_s.log().clone().requires_grad_(True)
        lp = logits.log_softmax(-1)
        loss = sum(p_s[0, y] * mopd_loss(lp[:, y:y + 1], lp[:, y:y + 1].detach(), p_t.log()[:, y:y + 1],
                                         torch.ones(1, 1, dtype=torch.bool))[0] for y in range(p_s.shape[1]))
        (grad,) = torch.autograd.grad(loss, logits)
        ref = logits.detach().clone().requires_grad_(True)
        q = ref.log_softmax(-1)
        (ref_grad,) = torch.autograd.grad((q.exp() * (q - p_t.log())).sum(), ref)
        assert torch.allclose(grad, ref_grad, atol=1e-6), (grad, ref_grad)
        assert float((grad * ref_grad).sum()) > 0  # descent on the loss is descent on the reverse KL
    assert exp["expected_k1_under_student"] == pytest.approx(exp["reverse_kl_full"][0], abs=tol)


def test_ice_pop_drops_tokens_outside_the_bounds_instead_of_clipping():
    # pi_train = [.6, .3, .9, .2, .5], pi_inf = [.5, .9, .3, .2, .5] -> r = [1.2, 1/3, 3, 1, 1];
    # the last token is padding (masked), with a NaN teacher log-prob that must not leak
    train = _t(LN(.6), LN(.3), LN(.9), LN(.2), LN(.5)).requires_grad_(True)
    inf = _t(LN(.5), LN(.9), LN(.3), LN(.2), LN(.5))
    teacher = _t(LN(.3), LN(.5), LN(.5), LN(.4), float("nan"))
    mask = torch.tensor([[True, True, True, True, False]])
    w, kept = ice_pop_weights(train, inf, mask)
    assert kept.tolist() == [[True, False, False, True, False]]
    assert w[0].tolist() == pytest.approx([1.2, 0.0, 0.0, 1.0, 0.0], abs=1e-6)
    loss, stats = mopd_loss(train, inf, teacher, mask)
    # -(1/4) [1.2 ln(.3/.6) ln .6 + 1.0 ln(.4/.2) ln .2]; dropped tokens count in the 4
    hand = -(1.2 * LN(.5) * LN(.6) + 1.0 * LN(2.0) * LN(.2)) / 4
    assert float(loss.detach()) == pytest.approx(hand, abs=1e-6) and hand == pytest.approx(0.172671, abs=1e-6)
    clipped = -(1.2 * LN(.5) * LN(.6) + 0.5 * LN(.5 / .3) * LN(.3) + 2.0 * LN(.5 / .9) * LN(.9)
                + LN(2.0) * LN(.2)) / 4
    assert float(loss.detach()) != pytest.approx(clipped, abs=1e-3)
    loss.backward()
    assert train.grad[0].tolist() == pytest.approx([-1.2 * LN(.5) / 4, 0.0, 0.0, -LN(2.0) / 4, 0.0], abs=1e-6)
    assert stats["is_dropped"] == pytest.approx(0.5) and stats["is_ratio"] == pytest.approx((1.2 + 1 / 3 + 3 + 1) / 4)
    assert stats["reverse_kl"] == pytest.approx(-(LN(.5) + LN(.5 / .3) + LN(.5 / .9) + LN(2.0)) / 4, abs=1e-6)


def test_ice_pop_bounds_are_inclusive_and_configurable():
    train = torch.zeros(1, 4, dtype=torch.float64)
    # r = 2, .5, just above 2, just below .5
    inf = torch.tensor([[-LN(2.0), LN(2.0), -LN(2.0) - 1e-9, LN(2.0) + 1e-9]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert ice_pop_weights(train, inf, mask)[1].tolist() == [[True, True, False, False]]
    assert ice_pop_weights(train, inf, mask, (0.25, 4.0))[1].tolist() == [[True, True, True, True]]


def test_window_normalisation_makes_two_micro_batches_equal_one_batch():
    g = torch.Generator().manual_seed(0)
    train = torch.randn(4, 6, generator=g).log_softmax(-1)
    inf = train + 0.3 * torch.randn(4, 6, generator=g)
    teacher = torch.randn(4, 6, generator=g).log_softmax(-1)
    mask = torch.rand(4, 6, generator=g) > 0.3
    loss_fn = get_distillation_loss("mopd")
    full, grads = [], []
    for splits in ([slice(0, 4)], [slice(0, 1), slice(1, 4)]):
        x = train.clone().requires_grad_(True)
        total = sum(loss_fn(x[s], inf[s], teacher[s], mask[s], num_tokens=int(mask.sum()))[0] for s in splits)
        total.backward()
        full.append(float(total.detach()))
        grads.append(x.grad)
    assert full[0] == pytest.approx(full[1], abs=1e-6)
    assert grads[0].abs().max() > 1e-3 and torch.allclose(grads[0], grads[1], atol=1e-6)
