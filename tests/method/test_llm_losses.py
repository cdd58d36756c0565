"""The LLM-weight losses against their definitions, written out by hand here (float64): each
aggregation's value and gradient, split into micro-batches over two simulated ranks; MAGRPO's
default against CoMLRL's formula; the KL penalty's expected gradient on a small categorical
distribution; and --separate-agents, each agent's gradient that of its own objective
(llm_step.policy_step, in its micro-batches).
Run: python -m pytest -q tests/method/test_llm_losses.py"""

import copy

import pytest
import torch
from handmade import magrpo_step

import train_magrpo
import train_mlpo
import train_solver
from llm.logprobs import completion_batch, completion_logprobs
from llm_step import Sequence
from softrank import PG_KINDS, aggregate, kl_k3, pg_normalizer, policy_gradient_loss

MAX_LEN = 20  # the generation budget, above every completion's length


def padded_batch(seed, B=8, T=16):
    """Random log-probs of B completions of lengths 1..16, padded to T with junk that must not
    count; advantages and reference log-probs."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g).tolist()
    lengths[:2] = [1, T]  # the extremes, always
    mask = torch.tensor([[t < n for t in range(T)] for n in lengths])
    logp = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    junk = 5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    logp, ref = torch.where(mask, logp, junk), torch.where(mask, ref, -junk)
    A = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, ref, A, mask, lengths


def weight(kind, lengths, b):
    """What one token of sequence b weighs in each aggregation, by definition."""
    B = len(lengths)
    return {
        "token": 1 / sum(lengths),
        "seq": 1 / (B * lengths[b]),  # the sequence's own mean, then the mean over sequences
        "const": 1 / (B * MAX_LEN),
        "sum": 1 / B,
    }[kind]


def by_hand(logp, ref, A, lengths, kind, beta):
    """(loss, d loss / d logp) of  sum_{b,t} w_bt (-A_b logp_bt + beta k3_bt), the KL term with the
    gradient of the bias-corrected k3: d/dlogp [k3 * pi / sg(pi)] = (1 - r) + k3."""
    loss, grad = 0.0, torch.zeros_like(logp)
    for b, n in enumerate(lengths):
        w = weight(kind, lengths, b)
        for t in range(n):
            r = torch.exp(ref[b, t] - logp[b, t])
            k3 = r - 1 - (ref[b, t] - logp[b, t])
            loss += w * (-A[b] * logp[b, t] + beta * k3)
            grad[b, t] = w * (-A[b] + beta * (1 - r + k3))
    return loss, grad


def step_loss(logp, ref, A, mask, kind, beta, normalizer):
    """The loss llm_step.policy_step builds from one micro-batch's log-probs."""
    loss, _ = policy_gradient_loss(logp, A, mask, kind, normalizer)
    return loss + beta * aggregate(kl_k3(logp, ref), mask, kind, normalizer)


@pytest.mark.parametrize("kind", PG_KINDS)
@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_aggregation_value_and_gradient_by_hand_over_micro_batches_and_ranks(kind, beta):
    """Policy gradient + beta KL, each aggregation: the value and gradient of its formula, on the
    whole batch and summed over micro-batches and 2 ranks (exact gradient accumulation)."""
    logp, ref, A, mask, lengths = padded_batch(seed=41)
    expected_loss, expected_grad = by_hand(logp, ref, A, lengths, kind, beta)

    full = logp.clone().requires_grad_()
    loss = step_loss(full, ref, A, mask, kind, beta, pg_normalizer(mask, kind, MAX_LEN))
    loss.backward()
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(full.grad, expected_grad, rtol=1e-12, atol=1e-15)

    # 2 ranks (rows 0..2 and 3..7), micro-batches of up to 2 rows, each padded to its own length;
    # the normalizer once over the whole step, divided by the world; DDP averages the ranks' sums
    world, normalizer = 2, pg_normalizer(mask, kind, MAX_LEN) / 2
    total, grads = 0.0, []
    for rows in (range(0, 3), range(3, 8)):
        part = logp.clone().requires_grad_()
        for k in range(rows.start, rows.stop, 2):
            micro = slice(k, min(k + 2, rows.stop))
            width = max(lengths[micro])
            loss = step_loss(
                part[micro, :width],
                ref[micro, :width],
                A[micro],
                mask[micro, :width],
                kind,
                beta,
                normalizer,
            )
            loss.backward()
            total += loss.item() / world
        grads.append(part.grad)
    torch.testing.assert_close(
        torch.tensor(total, dtype=torch.float64), expected_loss, rtol=1e-12, atol=0
    )
    torch.testing.assert_close(sum(grads) / world, expected_grad, rtol=1e-12, atol=1e-15)


def test_seq_averages_the_kl_per_sequence_like_the_policy_gradient():
    """Under seq (TRL's grpo) both terms are each sequence's token mean, then the mean over
    sequences: the KL is not weighted by length (each sequence's token sum / B would be)."""
    logp, ref, A, mask, lengths = padded_batch(seed=42)
    x = logp.clone().requires_grad_()
    kl = aggregate(kl_k3(x, ref), mask, "seq")
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    per_sequence_mean = torch.stack([k3[b, :n].mean() for b, n in enumerate(lengths)]).mean()
    torch.testing.assert_close(kl, per_sequence_mean, rtol=1e-12, atol=0)
    length_weighted = torch.stack([k3[b, :n].sum() for b, n in enumerate(lengths)]).mean()
    assert length_weighted > 2 * per_sequence_mean  # what the KL term was before

    # the whole loss is the per-sequence mean of the per-token loss
    beta = 0.3
    loss = step_loss(x, ref, A, mask, "seq", beta, None)
    per_token = -A.unsqueeze(-1) * logp + beta * k3
    expected = torch.stack([per_token[b, :n].mean() for b, n in enumerate(lengths)]).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)


def test_magrpo_default_is_comlrl_loss():
    """CoMLRL's MAGRPO: each completion's token log-probs summed, times its advantage, averaged over
    completions: L = -mean_b (A_b sum_t logp_bt). MLPO keeps Dr.GRPO's const; sft a token mean."""
    kinds = {
        "agents": train_magrpo.Config().loss_agg,
        "leader": train_mlpo.Config().loss_agg,
        "sft": train_solver.CROSS_ENTROPY["agg"],
    }
    assert kinds == {"agents": "sum", "leader": "const", "sft": "token"}
    logp, _, A, mask, lengths = padded_batch(seed=43)
    ours = logp.clone().requires_grad_()
    loss, _ = policy_gradient_loss(ours, A, mask, kinds["agents"])
    loss.backward()
    theirs = logp.clone().requires_grad_()
    comlrl = -torch.stack([A[b] * theirs[b, :n].sum() for b, n in enumerate(lengths)]).mean()
    comlrl.backward()
    torch.testing.assert_close(loss, comlrl, rtol=1e-12, atol=0)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-12, atol=0)


def expected_gradient(term, logits, ref_logp):
    """E_{a ~ pi}[grad term(log pi(a), log ref(a))], exactly: the sum over the outcomes weighted by
    pi, the sampling distribution held fixed and the sample's log-prob the differentiable input."""
    logp = torch.log_softmax(logits, -1)
    (grad,) = torch.autograd.grad((logp.exp().detach() * term(logp, ref_logp)).sum(), logits)
    return grad


def test_kl_penalty_expected_gradient_is_that_of_kl_pi_ref():
    g = torch.Generator().manual_seed(44)
    logits = (2 * torch.randn(5, generator=g, dtype=torch.float64)).requires_grad_()
    ref_logp = torch.log_softmax(2 * torch.randn(5, generator=g, dtype=torch.float64), -1)
    logp = torch.log_softmax(logits, -1)
    pi, ref = logp.exp(), ref_logp.exp()
    kl_pi_ref = (pi * (logp - ref_logp)).sum()
    (grad_kl_pi_ref,) = torch.autograd.grad(kl_pi_ref, logits, retain_graph=True)
    (grad_kl_ref_pi,) = torch.autograd.grad((ref * (ref_logp - logp)).sum(), logits)
    assert (grad_kl_pi_ref - grad_kl_ref_pi).abs().max() > 0.05  # two different directions

    # the penalty: its expected value is KL(pi || ref), its expected gradient that KL's gradient
    value = (pi * kl_k3(logp, ref_logp)).sum()
    torch.testing.assert_close(value, kl_pi_ref, rtol=1e-12, atol=0)
    ours = expected_gradient(kl_k3, logits, ref_logp)
    torch.testing.assert_close(ours, grad_kl_pi_ref, rtol=0, atol=1e-10)

    # plain k3 as a loss (what the KL term was): the same value, the other KL's gradient
    def plain_k3(logp, ref_logp):
        return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1

    torch.testing.assert_close((pi * plain_k3(logp, ref_logp)).sum(), kl_pi_ref, rtol=1e-12, atol=0)
    plain = expected_gradient(plain_k3, logits, ref_logp)
    torch.testing.assert_close(plain, grad_kl_ref_pi, rtol=0, atol=1e-10)
    assert (plain - grad_kl_pi_ref).abs().max() > 0.05


class CaptureGradients:
    """An optimizer that keeps each model's gradients at step() instead of stepping."""

    def __init__(self, models):
        self.models, self.grads = models, None

    def step(self):
        self.grads = [[p.grad.clone() for p in m.parameters()] for m in self.models]

    def zero_grad(self, set_to_none=True):
        for m in self.models:
            m.zero_grad(set_to_none=set_to_none)


@pytest.mark.parametrize("kind", ["sum", "token"])
def test_separate_agents_each_get_their_own_objective_gradient(tiny_model, kind):
    """--separate-agents with 2 models: each model's gradient is the gradient of its own loss over
    its own sequences (normalized by them alone, as CoMLRL's per-agent MAGRPO), not a share of a
    loss normalized over every agent's sequences."""
    model, tokenizer = tiny_model
    models = [copy.deepcopy(model).train() for _ in range(2)]
    with torch.no_grad():
        for p in models[1].parameters():
            p.add_(0.01 * torch.randn_like(p))
    g = torch.Generator().manual_seed(45)

    def completion(n):
        return torch.randint(10, 200, (n,), generator=g).tolist()

    # 2 questions x 2 rollouts x 2 agents; completions of 1..7 tokens, agent 1's longer
    sequences = [
        Sequence(q, k, a, [5 + q, 6, 7 + a], completion(1 + 2 * a + q + k))
        for q in range(2)
        for k in range(2)
        for a in range(2)
    ]
    # small advantages: every gradient norm stays under the clip (1.0), so clipping changes nothing
    advantages = torch.tensor([[0.02, -0.01], [-0.03, 0.01]])
    cfg = train_magrpo.Config(
        agents=2, separate_agents=True, loss_agg=kind, micro_batch=3, beta=0.0
    )
    optimizer = CaptureGradients(models)
    update = magrpo_step(models, optimizer, sequences, advantages, cfg, tokenizer.pad_token_id)
    assert update["grad_norm"] < 1.0

    for e, m in enumerate(models):
        own = [s for s in sequences if s.agent == e]
        batch = completion_batch(
            [(s.prompt_ids, s.completion_ids) for s in own], tokenizer.pad_token_id, "cpu"
        )
        logp, mask = completion_logprobs(m, batch)
        A = advantages[[s.question for s in own], [s.sample for s in own]]
        per_sequence = (-A * torch.where(mask.bool(), logp, 0).sum(-1)).sum()
        normalizer = len(own) if kind == "sum" else int(mask.sum())  # its own sequences only
        m.zero_grad()
        (per_sequence / normalizer).backward()
        # float32, summed in micro-batches of 3 against all at once: rounding differs (1e-9 seen)
        for ours, expected in zip(optimizer.grads[e], (p.grad for p in m.parameters())):
            torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-7)
