"""Tests for softrank.py: properties of the advantages, exactness of the losses' gradients, masking,
and gradient accumulation. Seeded random inputs; scipy is the independent reference for ranks and
quantiles. Run: python -m pytest -q tests/method/test_softrank.py"""

import math
import sys
from pathlib import Path
from statistics import NormalDist

import pytest
import torch
from scipy.stats import norm, rankdata

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from softrank import (
    PG_KINDS,
    flat_groups,
    group_advantages,
    grpo_advantages,
    kl_k3,
    mean_baseline_advantages,
    optimal_policy,
    pg_normalizer,  # noqa: E402
    policy_gradient_loss,
    ppo_clip_loss,
    rank_advantages,
    rank_matching_loss,
    rloo_advantages,
    softrank_advantages,
    softrank_loss,
    unweighted_softrank_loss,
)

DTYPES = [torch.float32, torch.float64]
NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_GPU)]
BASELINES = [grpo_advantages, mean_baseline_advantages, rloo_advantages, rank_advantages]
phi_inv = NormalDist().inv_cdf


def distinct_rewards(shape, seed, dtype=torch.float64):
    """Continuous random rewards: ties have probability 0."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype)


def tied_rewards(shape, seed, dtype=torch.float64):
    """Small integers: many ties, and some all-equal groups."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, shape, generator=g).to(dtype)


def reference_softrank(r, tau, eps=1e-6):
    """Eq. 2 for one group with scipy: average ranks, normal quantiles, population std."""
    if len(set(r)) == 1:
        return [0.0] * len(r)
    p = ((rankdata(r, method="average") - 1 + 0.5) / len(r)) ** tau
    a = norm.ppf(p)
    return list((a - a.mean()) / (a.std() + eps))


# --------------------------------------------------------------------------------------------------
# softrank_advantages: properties
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("K", [2, 3, 5, 8])
@pytest.mark.parametrize("make", [distinct_rewards, tied_rewards])
def test_matches_scipy_reference(make, K, tau):
    r = make((20, K), seed=K)
    A = softrank_advantages(r, tau=tau)
    ref = torch.tensor([reference_softrank(row.tolist(), tau) for row in r], dtype=torch.float64)
    torch.testing.assert_close(A, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("tau", [0.5, 0.8, 1.0])
@pytest.mark.parametrize("K", [2, 3, 6])
@pytest.mark.parametrize("dtype", DTYPES)
def test_order_preserving(K, tau, dtype):
    r = distinct_rewards((50, K), seed=1, dtype=dtype)
    A = softrank_advantages(r, tau=tau)
    r_less = r.unsqueeze(-1) < r.unsqueeze(-2)  # [i, j]: r_i < r_j
    A_less = A.unsqueeze(-1) < A.unsqueeze(-2)
    assert torch.equal(r_less, A_less)


TRANSFORMS = {
    "affine": lambda r: 3.0 * r + 7.0,
    "shrink": lambda r: 0.01 * r - 5.0,
    "exp": torch.exp,
    "cube": lambda r: r**3,
    "sigmoid": torch.sigmoid,
}


@pytest.mark.parametrize("transform", TRANSFORMS.values(), ids=TRANSFORMS.keys())
@pytest.mark.parametrize("make", [distinct_rewards, tied_rewards])
def test_invariant_under_increasing_transform(make, transform):
    r = make((30, 6), seed=2)
    # A depends on the ranks only, and the ranks are unchanged: bit-for-bit the same output.
    assert torch.equal(softrank_advantages(transform(r)), softrank_advantages(r))


def test_grpo_changes_under_exp_but_softrank_does_not():
    r = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.5, 2.0], dtype=torch.float64)
    assert not torch.allclose(grpo_advantages(r.exp()), grpo_advantages(r), atol=1e-2)
    # affine: ok
    torch.testing.assert_close(grpo_advantages(10 * r), grpo_advantages(r), atol=1e-5, rtol=0)
    assert torch.equal(softrank_advantages(r.exp()), softrank_advantages(r))


@pytest.mark.parametrize("advantages", [softrank_advantages] + BASELINES)
@pytest.mark.parametrize("make", [distinct_rewards, tied_rewards])
def test_permutation_equivariant(advantages, make):
    r = make((10, 7), seed=3)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(advantages(r[:, perm]), advantages(r)[:, perm], atol=1e-12, rtol=0)


@pytest.mark.parametrize("advantages", [softrank_advantages, grpo_advantages])
@pytest.mark.parametrize("K", [2, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_zero_std_one(advantages, K, dtype):
    r = distinct_rewards((40, K), seed=4, dtype=dtype)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    A = advantages(r, eps=0.0)
    assert A.mean(-1).abs().max() < tol
    assert (A.std(-1, unbiased=False) - 1).abs().max() < tol
    # With eps the std is s / (s + eps), s the std before scaling: below 1 by about eps / s.
    std = advantages(r).std(-1, unbiased=False)
    assert (std <= 1 + tol).all() and (std > 1 - 1e-3).all()


@pytest.mark.parametrize("advantages", [softrank_advantages] + BASELINES)
def test_ties_get_equal_advantages(advantages):
    r = torch.tensor([[1.0, 3.0, 1.0, 2.0, 3.0, 3.0]], dtype=torch.float64)
    A = advantages(r)[0]
    assert A[0] == A[2]
    assert A[1] == A[4] == A[5]
    assert A[0] < A[3] < A[1]


# --------------------------------------------------------------------------------------------------
# softrank_advantages: hand-computed values
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.5, 0.8, 1.0])
def test_hand_K2(tau):
    # Two values a < b centered: -(b - a)/2, +(b - a)/2, population std (b - a)/2. So A = -1, +1 for
    # any tau. tau = 1: p = 0.25, 0.75, A* = -0.6745, +0.6745.
    A = softrank_advantages(torch.tensor([5.0, -2.0], dtype=torch.float64), tau=tau, eps=0.0)
    torch.testing.assert_close(A, torch.tensor([1.0, -1.0], dtype=torch.float64))
    if tau == 1.0:
        assert phi_inv(0.25) == pytest.approx(-0.6745, abs=1e-4)


def test_hand_K3_tau1():
    # p = 1/6, 1/2, 5/6 -> A* = -z, 0, z; population
    # std z sqrt(2/3) -> A = -sqrt(3/2), 0, sqrt(3/2).
    A = softrank_advantages(torch.tensor([0.1, 0.7, 0.4], dtype=torch.float64), tau=1.0, eps=0.0)
    s = math.sqrt(1.5)
    torch.testing.assert_close(A, torch.tensor([-s, s, 0.0], dtype=torch.float64))


def test_hand_K3_tau1_with_tie():
    # ranks 0.5, 0.5, 2 -> p = 1/3, 1/3, 5/6 -> A* = a, a, b. Centered: (a-b)/3, (a-b)/3, 2(b-a)/3;
    # std (b-a) sqrt(2)/3 -> A = -1/sqrt(2), -1/sqrt(2), sqrt(2), whatever a and b are.
    A = softrank_advantages(torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64), tau=1.0, eps=0.0)
    h = 1 / math.sqrt(2)
    torch.testing.assert_close(A, torch.tensor([-h, -h, 2 * h], dtype=torch.float64))


def test_hand_K3_tau_half():
    p = [math.sqrt((k + 0.5) / 3) for k in range(3)]  # ranks 0, 1, 2
    a = [phi_inv(x) for x in p]
    mean = sum(a) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in a) / 3)
    expected = [(x - mean) / (std + 1e-6) for x in a]
    A = softrank_advantages(torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64), tau=0.5)
    torch.testing.assert_close(A, torch.tensor(expected, dtype=torch.float64))


# --------------------------------------------------------------------------------------------------
# Baselines: hand values
# --------------------------------------------------------------------------------------------------


def test_plain_ranks_hand_values_and_scipy_reference():
    """GOPO: evenly spaced from -2 (worst) to +2 (best); ties share their average rank."""
    r = torch.tensor([0.1, 5.0, -3.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(
        rank_advantages(r), torch.tensor([-2 / 3, 2.0, -2.0, 2 / 3]).double()
    )
    tied = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(rank_advantages(tied), torch.tensor([1.0, 1.0, -2.0]).double())
    masked = torch.tensor([1.0, 9.0, 3.0], dtype=torch.float64)
    mask = torch.tensor([True, False, True])
    assert rank_advantages(masked, mask=mask).tolist() == [-2.0, 0.0, 2.0]
    rows = tied_rewards((40, 6), seed=12) + distinct_rewards((40, 6), seed=13).round()
    for row, A in zip(rows, rank_advantages(rows)):
        ranks = rankdata(row.numpy(), method="average") - 1
        expected = [0.0] * 6 if len(set(row.tolist())) == 1 else -2 + 4 * ranks / 5
        torch.testing.assert_close(A, torch.tensor(expected, dtype=torch.float64))
    # the order only, as SoftRank: any increasing transform gives the same advantages
    assert torch.equal(rank_advantages(rows.exp()), rank_advantages(rows))
    assert rank_advantages(rows).sum(-1).abs().max() < 1e-12


def test_baselines_hand_values():
    r = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)  # mean 3, population variance 14/4
    centered = torch.tensor([-2.0, -1.0, 0.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(mean_baseline_advantages(r), centered)
    torch.testing.assert_close(grpo_advantages(r, eps=0.0), centered / math.sqrt(3.5))
    # leave-one-out: 1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3
    loo = torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(rloo_advantages(r), loo)


# --------------------------------------------------------------------------------------------------
# Degenerate groups, shapes, dtypes, devices, masks
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("advantages", [softrank_advantages] + BASELINES)
@pytest.mark.parametrize("value", [0.0, 1.0, -3.7, 0.1])
def test_all_equal_group_gives_exact_zeros(advantages, value):
    r = torch.full((3, 5), value, dtype=torch.float64)
    assert torch.equal(advantages(r), torch.zeros_like(r))


def test_flat_groups_are_the_all_equal_ones_and_get_zero_advantages():
    r = distinct_rewards((5, 4), seed=5)
    r[1] = 1.0
    r[3] = -2.0  # 2 of 5 groups are flat
    r[4, 0] = r[4, 1]  # a tie is not a flat group
    assert flat_groups(r)[:, 0].tolist() == [False, True, False, True, False]
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[0, 1:] = False  # one existing action: nothing to prefer
    assert flat_groups(r, mask)[:, 0].tolist() == [True, True, False, True, False]
    for advantages in [softrank_advantages] + BASELINES:
        A = advantages(r)
        assert torch.equal(A[1], torch.zeros(4, dtype=torch.float64)) and A[4].abs().max() > 0


@pytest.mark.parametrize("advantages", [softrank_advantages] + BASELINES)
@pytest.mark.parametrize("shape", [(5,), (7, 5), (4, 3, 5)])
def test_batch_shapes_equal_per_group(advantages, shape):
    r = tied_rewards(shape, seed=6) + 0.1 * distinct_rewards(shape, seed=7).round()
    A = advantages(r)
    assert A.shape == r.shape
    flat_r, flat_A = r.reshape(-1, shape[-1]), A.reshape(-1, shape[-1])
    for row_r, row_A in zip(flat_r, flat_A):
        torch.testing.assert_close(advantages(row_r), row_A, atol=1e-12, rtol=0)


@pytest.mark.parametrize("advantages", [softrank_advantages] + BASELINES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_dtype_and_device_preserved(advantages, dtype, device):
    r64 = tied_rewards((8, 5), seed=8) + distinct_rewards((8, 5), seed=9)
    A = advantages(r64.to(device=device, dtype=dtype))
    assert A.dtype == dtype and A.device.type == device
    torch.testing.assert_close(A.cpu().double(), advantages(r64), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("advantages", [softrank_advantages] + BASELINES)
def test_masked_advantages_equal_the_smaller_group(advantages):
    # Groups of sizes 5, 3, 2 padded to 5: the masked result equals each group computed alone.
    r = tied_rewards((3, 5), seed=10) + distinct_rewards((3, 5), seed=11).round()
    sizes = [5, 3, 2]
    mask = torch.arange(5) < torch.tensor(sizes).unsqueeze(-1)
    r_padded = r.masked_fill(~mask, float("nan"))  # garbage in padded slots must not leak
    A = advantages(r_padded, mask=mask)
    for i, n in enumerate(sizes):
        torch.testing.assert_close(A[i, :n], advantages(r[i, :n]), atol=1e-12, rtol=0)
        assert torch.equal(A[i, n:], torch.zeros(5 - n, dtype=torch.float64))


@pytest.mark.parametrize("algo", ["softrank", "magrpo", "grpo"])
def test_group_advantages_passes_the_mask_on(algo):
    # A rollout left out (e.g. a truncated completion dropped) is out of its group's statistics.
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    A = group_advantages(r, algo, mask=mask)
    torch.testing.assert_close(A[:, :3], group_advantages(r[:, :3], algo), atol=1e-12, rtol=0)
    assert A[0, 3].item() == 0.0


# --------------------------------------------------------------------------------------------------
# softrank_loss: exact gradient, masking
# --------------------------------------------------------------------------------------------------


def naive_softrank_loss(logits, advantages, ref_logits, beta, lam, mask, weighted=True):
    """Eq. 3 (the expected advantage; weighted=False: the literal -A log pi) written out with python
    loops, one state and one action at a time."""
    total = 0.0
    for s in range(logits.shape[0]):
        keep = [k for k in range(logits.shape[1]) if mask[s, k]]
        pi = torch.exp(logits[s, keep]) / torch.exp(logits[s, keep]).sum()
        ref = torch.exp(ref_logits[s, keep]) / torch.exp(ref_logits[s, keep]).sum()
        for i, k in enumerate(keep):
            total = total - advantages[s, k] * (pi[i] if weighted else torch.log(pi[i]))
            total = total + beta * pi[i] * torch.log(pi[i] / ref[i])  # KL term
            total = total + lam * pi[i] * torch.log(pi[i])  # -lam * H
    return total / logits.shape[0]


def random_problem(B, K, seed, masked):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K, generator=g, dtype=torch.float64)
    ref_logits = torch.randn(B, K, generator=g, dtype=torch.float64)
    sizes = torch.randint(2, K + 1, (B,), generator=g) if masked else torch.full((B,), K)
    mask = torch.arange(K) < sizes.unsqueeze(-1)
    rewards = torch.randint(0, 4, (B, K), generator=g).to(torch.float64)
    advantages = softrank_advantages(rewards, mask=mask)
    return logits, ref_logits, advantages, mask


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("beta,lam", [(0.0, 0.0), (0.1, 0.0), (0.5, 0.05), (2.0, 0.3)])
def test_softrank_loss_gradient_matches_naive_loop(masked, beta, lam, weighted):
    logits, ref_logits, advantages, mask = random_problem(6, 5, seed=12, masked=masked)
    x = logits.clone().requires_grad_()
    y = logits.clone().requires_grad_()
    loss_fn = softrank_loss if weighted else unweighted_softrank_loss
    loss, _ = loss_fn(x, advantages, ref_logits, beta, lam, mask=mask if masked else None)
    naive = naive_softrank_loss(y, advantages, ref_logits, beta, lam, mask, weighted)
    loss.backward()
    naive.backward()
    torch.testing.assert_close(loss, naive)
    torch.testing.assert_close(x.grad, y.grad)


def descend(loss_fn, logits, steps, lr=0.05, **kw):
    """Adam on the logits themselves (one free parameter per state and action); the loss after each
    step."""
    x = logits.clone().float().requires_grad_()
    optimizer = torch.optim.Adam([x], lr=lr)
    losses = []
    for _ in range(steps):
        loss, _ = loss_fn(x, **kw)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return x.detach(), losses


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("beta,lam", [(0.05, 0.01), (0.5, 0.0), (1.0, 0.2), (2.0, 0.5)])
def test_softrank_loss_descends_to_its_analytic_optimum(masked, beta, lam):
    """Gradient descent on the expected-advantage objective reaches pi* ∝ exp((A + beta log pi_ref)
    / (beta + lam)) on 64 random states, and the logits stay bounded. (0.05, 0.01): train_rl's
    defaults, a sharp optimum that takes longer to reach."""
    logits, ref_logits, advantages, mask = random_problem(64, 5, seed=21, masked=masked)
    mask = mask if masked else None
    steps = 6000 if beta + lam < 0.1 else 3000
    x, losses = descend(
        softrank_loss,
        logits,
        steps,
        advantages=advantages.float(),
        ref_logits=ref_logits.float(),
        beta=beta,
        lam=lam,
        mask=mask,
    )
    target = optimal_policy(advantages, ref_logits, beta, lam, mask=mask).float()
    pi = torch.softmax(x.masked_fill(~mask, -torch.inf) if masked else x, -1)
    assert (pi - target).abs().max() < 2e-3
    assert losses[-1] >= losses[-100] - 1e-5  # leveled off at the minimum
    centered = x - x.mean(-1, keepdim=True)
    assert centered[mask if masked else torch.ones_like(x, dtype=torch.bool)].abs().max() < 20


def test_optimal_policy_is_where_eq4_is_zero():
    """With lam = 0, softrank_loss's optimum is the tilted reference that Eq. 4 regresses onto (loss
    0)."""
    _, ref_logits, advantages, mask = random_problem(16, 5, seed=22, masked=True)
    pi_star = optimal_policy(advantages, ref_logits, 0.7, 0.0, mask=mask)
    loss, _ = rank_matching_loss(
        torch.log(pi_star.clamp_min(1e-300)), ref_logits, advantages, 0.7, mask=mask
    )
    assert loss.item() == pytest.approx(0.0, abs=1e-20)


@pytest.mark.parametrize("beta", [0.05, 1.0, 10.0])
def test_unweighted_form_has_no_minimum(beta):
    """The literal -sum_k A_k log pi_k: advantages sum to zero, so the loss falls linearly for ever
    and the logits grow without bound, at any beta (the reason softrank_loss is the expected
    advantage)."""
    logits, ref_logits, advantages, _ = random_problem(64, 4, seed=23, masked=False)
    kw = dict(advantages=advantages.float(), ref_logits=ref_logits.float(), beta=beta, lam=0.01)
    x, losses = descend(unweighted_softrank_loss, logits, 2000, lr=1e-2, **kw)
    assert losses[1999] < losses[999] - 3 < losses[0] - 6  # still falling, by several units
    assert (x - x.mean(-1, keepdim=True)).abs().max() > 14
    y, bounded = descend(softrank_loss, logits, 2000, lr=1e-2, **kw)
    # -sum pi A >= -max A, KL >= 0, H <= log K
    assert bounded[-1] > -advantages.abs().max().item() - 1


def test_softrank_loss_stats():
    logits, ref_logits, advantages, mask = random_problem(6, 5, seed=13, masked=True)
    _, stats = softrank_loss(logits, advantages, ref_logits, beta=0.1, lam=0.01, mask=mask)
    assert set(stats) >= {"pg", "kl", "entropy"}
    assert all(isinstance(v, float) for v in stats.values())
    assert stats["kl"] >= 0 and stats["entropy"] >= 0
    _, same = softrank_loss(logits, advantages, logits, beta=0.1, lam=0.01, mask=mask)
    assert same["kl"] == pytest.approx(0.0, abs=1e-12)  # pi = pi_ref -> KL = 0


@pytest.mark.parametrize("loss_fn", ["softrank", "rank_matching"])
def test_masked_actions_get_zero_probability_and_zero_gradient(loss_fn):
    logits, ref_logits, advantages, mask = random_problem(8, 5, seed=14, masked=True)
    # Garbage in the slots of actions that do not exist:
    # nothing of it may reach the loss or the gradient.
    logits = logits.masked_fill(~mask, float("nan")).requires_grad_()
    ref_logits = ref_logits.masked_fill(~mask, float("inf"))
    advantages = advantages.masked_fill(~mask, float("nan"))
    if loss_fn == "softrank":
        loss, _ = softrank_loss(logits, advantages, ref_logits, beta=0.3, lam=0.1, mask=mask)
    else:
        loss, _ = rank_matching_loss(logits, ref_logits, advantages, beta=0.3, mask=mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all()
    assert torch.equal(logits.grad[~mask], torch.zeros_like(logits.grad[~mask]))
    assert logits.grad[mask].abs().sum() > 0
    pi = torch.softmax(logits.detach().masked_fill(~mask, -torch.inf), -1)
    assert torch.equal(pi[~mask], torch.zeros_like(pi[~mask]))


def test_masked_loss_equals_loss_on_the_smaller_action_set():
    logits, ref_logits, advantages, mask = random_problem(1, 5, seed=15, masked=False)
    mask[0, 3:] = False
    rewards = torch.tensor([[2.0, 0.0, 1.0, 9.0, 9.0]], dtype=torch.float64)
    advantages = softrank_advantages(rewards, mask=mask)
    full, _ = softrank_loss(logits, advantages, ref_logits, 0.2, 0.05, mask=mask)
    small, _ = softrank_loss(logits[:, :3], advantages[:, :3], ref_logits[:, :3], 0.2, 0.05)
    torch.testing.assert_close(full, small)


# --------------------------------------------------------------------------------------------------
# rank_matching_loss
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("beta", [0.1, 1.0, 3.0])
def test_rank_matching_minimized_at_tilted_reference(masked, beta):
    _, ref_logits, advantages, mask = random_problem(6, 5, seed=17, masked=masked)
    # pi = pi_ref exp(A / beta) / Z: logits = ref_logits + A / beta + any per-state constant.
    shift = torch.randn(6, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    optimum = (ref_logits + advantages / beta + shift).requires_grad_()
    m = mask if masked else None
    loss, _ = rank_matching_loss(optimum, ref_logits, advantages, beta, mask=m)
    loss.backward()
    assert loss.item() < 1e-20
    assert optimum.grad.abs().max() < 1e-10
    noise = 0.1 * torch.randn(6, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    worse, _ = rank_matching_loss(optimum.detach() + noise, ref_logits, advantages, beta, mask=m)
    assert worse.item() > 1e-6


def test_rank_matching_hand_value():
    # pi = pi_ref: d = 0, so L = mean of the centered A squared = population variance of A.
    logits = torch.zeros(1, 3, dtype=torch.float64)
    A = torch.tensor([[1.0, 2.0, 6.0]], dtype=torch.float64)  # mean 3, deviations -2, -1, 3
    loss, _ = rank_matching_loss(logits, logits, A, beta=0.5)
    assert loss.item() == pytest.approx(14 / 3)


# --------------------------------------------------------------------------------------------------
# ppo_clip_loss, kl_k3
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ratio,A,surrogate,moves",
    [
        (1.1, 1.0, 1.1, True),  # inside the range: plain ratio * A
        (0.9, -1.0, -0.9, True),
        (1.5, 1.0, 1.2, False),  # past 1 + c with A > 0: clipped, no gradient
        (0.5, -1.0, -0.8, False),  # past 1 - c with A < 0: clipped, no gradient
        (1.5, -1.0, -1.5, True),  # moved the wrong way: the min keeps the unclipped (worse) value
        (0.5, 1.0, 0.5, True),
    ],
)
def test_ppo_clip_hand_cases(ratio, A, surrogate, moves):
    logp = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    old_logp = torch.zeros(1, dtype=torch.float64)
    loss, stats = ppo_clip_loss(logp, old_logp, torch.tensor([A], dtype=torch.float64), clip=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-surrogate)
    assert stats["clip_frac"] == (1.0 if abs(ratio - 1) > 0.2 else 0.0)
    # d(-ratio A)/d logp = -ratio A when the unclipped term is active.
    assert logp.grad.item() == pytest.approx(-ratio * A if moves else 0.0)


def test_kl_k3_nonnegative_and_unbiased():
    g = torch.Generator().manual_seed(18)
    logp_all = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    ref_all = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    exact = (logp_all.exp() * (logp_all - ref_all)).sum()
    actions = torch.multinomial(logp_all.exp(), 200_000, replacement=True, generator=g)  # a ~ pi
    k3 = kl_k3(logp_all[actions], ref_all[actions])
    assert (k3 >= 0).all()
    assert k3.mean().item() == pytest.approx(exact.item(), rel=0.03)
    assert torch.equal(kl_k3(logp_all, logp_all), torch.zeros(6, dtype=torch.float64))


# --------------------------------------------------------------------------------------------------
# policy_gradient_loss: normalizers and gradient accumulation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,expected_grad",
    [
        ("token", [[-1 / 4, 0, 0], [2 / 4, 2 / 4, 2 / 4]]),  # every token: -A_b / 4 tokens
        ("seq", [[-1 / 2, 0, 0], [2 / 6, 2 / 6, 2 / 6]]),  # -A_b / (|o_b| * B)
        ("const", [[-1 / 6, 0, 0], [2 / 6, 2 / 6, 2 / 6]]),  # -A_b / (B * T)
        ("sum", [[-1 / 2, 0, 0], [2 / 2, 2 / 2, 2 / 2]]),  # -A_b / B
    ],
)
def test_pg_hand_weights(kind, expected_grad):
    logp = torch.full((2, 3), -1.0, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])  # lengths 1 and 3
    A = torch.tensor([1.0, -2.0], dtype=torch.float64)
    policy_gradient_loss(logp, A, mask, kind)[0].backward()
    torch.testing.assert_close(logp.grad, torch.tensor(expected_grad, dtype=torch.float64))


def pg_batch(seed, B=6, T=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).long()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    A = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, A, mask


@pytest.mark.parametrize("kind", PG_KINDS)
@pytest.mark.parametrize("split", [[6], [1, 5], [2, 2, 2], [3, 1, 2], [1] * 6])
def test_pg_gradient_accumulation_is_exact(kind, split):
    logp, A, mask = pg_batch(seed=19)
    full = logp.clone().requires_grad_()
    policy_gradient_loss(full, A, mask, kind)[0].backward()

    acc = logp.clone().requires_grad_()
    normalizer = pg_normalizer(mask, kind)  # once, over the whole batch
    start = 0
    for size in split:
        rows = slice(start, start + size)
        # each micro-batch padded to its own length
        T_micro = int(mask[rows].sum(-1).max())
        loss, _ = policy_gradient_loss(
            acc[rows, :T_micro], A[rows], mask[rows, :T_micro], kind, normalizer=normalizer
        )
        loss.backward()  # gradients add up in acc.grad
        start += size
    torch.testing.assert_close(acc.grad, full.grad, atol=1e-14, rtol=0)


def test_pg_per_microbatch_token_mean_is_not_exact():
    # Why the normalizer argument exists: DAPO's token
    # mean taken per micro-batch weighs tokens unequally.
    logp, A, mask = pg_batch(seed=20)
    full = logp.clone().requires_grad_()
    policy_gradient_loss(full, A, mask, "token")[0].backward()
    acc = logp.clone().requires_grad_()
    for rows in (slice(0, 1), slice(1, 6)):
        (policy_gradient_loss(acc[rows], A[rows], mask[rows], "token")[0] / 2).backward()
    assert not torch.allclose(acc.grad, full.grad)


@pytest.mark.parametrize("kind", PG_KINDS)
def test_pad_tokens_get_zero_gradient(kind):
    logp, A, mask = pg_batch(seed=21)
    # e.g. log-prob of a masked pad
    logp = logp.masked_fill(mask == 0, -torch.inf).requires_grad_()
    loss, stats = policy_gradient_loss(logp, A, mask, kind)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[mask == 0], torch.zeros_like(logp.grad[mask == 0]))
    assert (logp.grad[mask == 1] != 0).all()
    assert stats["tokens"] == mask.sum().item()


def test_pg_normalizer_values():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    assert pg_normalizer(mask, "token") == 5
    assert pg_normalizer(mask, "seq") == 2
    assert pg_normalizer(mask, "const") == 8
    assert pg_normalizer(mask, "const", max_len=100) == 200
    assert pg_normalizer(mask, "sum") == 2
    with pytest.raises(ValueError):
        pg_normalizer(mask, "bogus")


# --------------------------------------------------------------------------------------------------
# what mutation testing found unpinned (results/mutation/softrank.json)
# --------------------------------------------------------------------------------------------------


def test_full_action_set_losses_take_any_leading_batch_shape():
    """A group is the last dim (..., K): states batched as (2, 3, K) give the losses, stats and
    pi* of the same 6 states as (6, K), masked actions included."""
    g = torch.Generator().manual_seed(43)
    logits, ref = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    A = torch.randn(2, 3, 4, generator=g)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, 1, 3] = mask[1, 2, 0] = False
    for loss_fn in (softrank_loss, unweighted_softrank_loss):
        (loss3, stats3), (loss2, stats2) = (
            loss_fn(
                x.reshape(shape),
                a.reshape(shape),
                r.reshape(shape),
                0.3,
                0.05,
                mask=m.reshape(shape),
            )
            for x, a, r, m, shape in [
                (logits, A, ref, mask, (2, 3, 4)),
                (logits, A, ref, mask, (6, 4)),
            ]
        )
        torch.testing.assert_close(loss3, loss2)
        assert stats3 == pytest.approx(stats2)
    matched3 = rank_matching_loss(logits, ref, A, 0.3, mask=mask)
    matched2 = rank_matching_loss(
        logits.reshape(6, 4), ref.reshape(6, 4), A.reshape(6, 4), 0.3, mask=mask.reshape(6, 4)
    )
    torch.testing.assert_close(matched3[0], matched2[0])
    torch.testing.assert_close(
        optimal_policy(A, ref, 0.3, 0.05, mask).reshape(6, 4),
        optimal_policy(A.reshape(6, 4), ref.reshape(6, 4), 0.3, 0.05, mask.reshape(6, 4)),
    )


def test_ppo_clip_by_hand_with_an_old_policy_and_advantages_not_one():
    """ratio = exp(logp - old_logp) with old_logp != 0, |A| != 1 (where A and 1 / A agree), the
    default clip 0.2, and both stats."""
    old = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ratio = torch.tensor([1.1, 1.5, 0.5], dtype=torch.float64)
    A = torch.tensor([2.0, 3.0, -4.0], dtype=torch.float64)
    loss, stats = ppo_clip_loss(old + ratio.log(), old, A)  # the default clip
    # min(r A, clip(r, 0.8, 1.2) A): 1.1 * 2; 1.2 * 3 (clipped); 0.8 * -4 (clipped, pessimistic)
    assert loss.item() == pytest.approx(-(2.2 + 3.6 - 3.2) / 3)
    assert stats == pytest.approx({"clip_frac": 2 / 3, "ratio": (1.1 + 1.5 + 0.5) / 3})
    # a ratio exactly at 1 + c is not clipped: |ratio - 1| > c, strictly
    _, stats = ppo_clip_loss(old, old, A, clip=0.0)
    assert stats["clip_frac"] == 0.0


def test_rank_matching_stats_by_hand():
    logits = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)
    ref = torch.zeros(1, 3, dtype=torch.float64)
    A = torch.tensor([[0.0, 0.5, 0.0]], dtype=torch.float64)
    loss, stats = rank_matching_loss(logits, ref, A, beta=0.5)
    log_ratio = torch.log_softmax(logits, -1) - torch.log_softmax(ref, -1)
    d, a = 0.5 * log_ratio, A
    err = (d - d.mean()) - (a - a.mean())
    assert stats == pytest.approx(
        {"mse": (err**2).mean().item(), "abs_log_ratio": log_ratio.abs().mean().item()}
    )
    assert stats["mse"] == pytest.approx(loss.item())


def test_softrank_default_temperature_is_one_half():
    r = torch.tensor([[0.0, 1.0, 3.0, 3.0, 7.0]])
    assert torch.equal(softrank_advantages(r), softrank_advantages(r, tau=0.5))
    assert not torch.allclose(softrank_advantages(r), softrank_advantages(r, tau=1.5))


def test_an_unknown_aggregation_is_refused_by_name():
    from softrank import aggregate, step_normalizer

    with pytest.raises(ValueError, match=r"kind must be one of .*got 'mean'"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "mean")
    with pytest.raises(ValueError, match=r"kind must be one of .*got 'mean'"):
        step_normalizer("mean", 2, 6, 3)


def test_group_advantages_picks_each_algorithms_advantages_by_name():
    """The LLM-weight trainers' --algo: magrpo (reward - group mean), grpo (z-score), softrank at
    the given tau; any other name refused."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 3.0], [2.0, 2.0, 5.0, 0.0]])
    magrpo = group_advantages(rewards, "magrpo")
    assert torch.equal(magrpo, rewards - rewards.mean(-1, keepdim=True))
    assert torch.equal(group_advantages(rewards, "grpo"), grpo_advantages(rewards))
    for tau in (0.2, 1.0):
        assert torch.equal(
            group_advantages(rewards, "softrank", tau), softrank_advantages(rewards, tau)
        )
    # the trainers' default temperature, the paper's
    assert torch.equal(group_advantages(rewards, "softrank"), softrank_advantages(rewards, 0.5))
    assert not torch.allclose(
        group_advantages(rewards, "softrank", 0.2), group_advantages(rewards, "softrank")
    )
    with pytest.raises(KeyError):
        group_advantages(rewards, "ppo")


def test_plain_ranks_of_a_padded_group_of_one_are_zero():
    """A group with one existing rollout beside padding of other rewards is flat (nothing to
    rank): zeros, not the worst rank's -2; a padded group of two gets -2 and +2, its padding 0."""
    rewards = torch.tensor([[1.0, 5.0, 5.0], [2.0, 0.0, 7.0]])
    mask = torch.tensor([[True, False, False], [True, True, False]])
    assert torch.equal(
        rank_advantages(rewards, mask), torch.tensor([[0.0, 0.0, 0.0], [2.0, -2.0, 0.0]])
    )
