"""llm_step.policy_step's loss in process (llm/logprobs.py under it), on a tiny random model: the
completion log-probs of padded batches, and the token-level loss's gradient (prompt, peers' text
and padding masked out, micro-batches, the KL per sequence, flat groups)."""

import copy

import pytest
import torch

import softrank
from common import Ranks
from llm.logprobs import completion_batch, completion_logprobs, token_logprobs
from llm_step import Sequence, policy_step
from solutions import GameConfig

ALONE = Ranks(0, 1, torch.device("cpu"))


def test_completion_batch_masks_prompt_and_padding(tiny_model):
    model, _ = tiny_model
    sequences = [([5, 6, 7], [8, 9]), ([5], [10, 11, 12, 13])]
    ids, attention, loss_mask = completion_batch(sequences, pad_id=0, device="cpu")
    # prompts left-padded, completions right-padded: every completion starts at column 3
    assert ids.tolist() == [[5, 6, 7, 8, 9, 0, 0], [0, 0, 5, 10, 11, 12, 13]]
    assert attention.tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1]]
    logp, mask = completion_logprobs(model, (ids, attention, loss_mask))
    assert logp.shape == (2, 4) and mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]

    # padding is never a target and never context: other pad ids, same loss
    def loss(pad):
        logp, mask = completion_logprobs(model, completion_batch(sequences, pad, "cpu"))
        return -torch.where(mask.bool(), logp, 0).sum()

    with torch.no_grad():
        assert loss(0).item() == loss(1234).item()


def test_completion_logprobs_match_each_sequence_alone(tiny_model):
    """Batched and padded on both sides, each completion scores as it does alone: the position ids
    skip the left padding, as in generation."""
    model, _ = tiny_model
    sequences = [([5, 6, 7, 30], [8, 9]), ([5], [10, 11, 12, 13]), ([40, 41], [42])]
    with torch.no_grad():
        batch = completion_batch(sequences, 0, "cpu")
        logp, mask = completion_logprobs(model, batch, temperature=0.7)
        for b, (p, c) in enumerate(sequences):
            ones = torch.ones(1, len(p) + len(c), dtype=torch.long)
            alone = token_logprobs(model, torch.tensor([p + c]), ones, temperature=0.7)[
                0, -len(c) :
            ]
            torch.testing.assert_close(logp[b, : len(c)], alone, rtol=1e-5, atol=1e-5)
            assert mask[b].sum() == len(c)


def rollout_sequences(tokenizer):
    """Two (prompt, completion) pairs of different prompt and completion lengths."""
    return [
        (
            tokenizer("Question: 2 + 3? Agent 2 says 5.")["input_ids"],
            tokenizer(" It is 5.")["input_ids"],
        ),
        (tokenizer("Q: 7 - 1?")["input_ids"], tokenizer(" The answer is 6, yes.")["input_ids"]),
    ]


def rollout_batch(tokenizer):
    return completion_batch(rollout_sequences(tokenizer), tokenizer.pad_token_id, "cpu")


class CaptureGradients:
    """An optimizer that keeps the gradients policy_step steps with (clipped) instead of
    stepping."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def step(self):
        self.grads = [p.grad.clone() for p in self.model.parameters()]

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)


def step(model, pairs, advantages, *, agg="sum", beta=0.0, micro_batch=8, pad=0, **kw):
    """policy_step on the model's whole weights over (prompt, completion) pairs, pair b the only
    rollout of question b at advantages[b]; returns (its statistics, the gradient it stepped
    with)."""
    sequences = [Sequence(b, 0, 0, p, c) for b, (p, c) in enumerate(pairs)]
    optimizer = CaptureGradients(model)
    kw = {"temperature": 1.0, "max_len": GameConfig.max_new_tokens, "ranks": ALONE} | kw
    stats = policy_step(
        [model],
        optimizer,
        sequences,
        torch.as_tensor(advantages)[:, None],
        agg=agg,
        beta=beta,
        micro_batch=micro_batch,
        pad=pad,
        bf16=False,
        **kw,
    )
    return stats, optimizer.grads


def test_policy_loss_prompt_peers_and_padding_get_no_gradient(tiny_model):
    model, tokenizer = tiny_model
    ids, attention, mask = rollout_batch(tokenizer)
    logp, completion = completion_logprobs(model, (ids, attention, mask))
    logp = logp.detach().requires_grad_(True)
    loss, _ = softrank.policy_gradient_loss(logp, torch.tensor([1.0, -0.5]), completion, "token")
    loss.backward()
    completion = completion.bool()
    assert (logp.grad[~completion] == 0).all() and (logp.grad[completion] != 0).all()
    # whatever sits in the padding, the step's gradient is the same, bit for bit (MAGRPO's sum, no
    # KL)
    pairs = rollout_sequences(tokenizer)
    _, a = step(model, pairs, [1.0, -0.5], pad=tokenizer.pad_token_id)
    _, b = step(model, pairs, [1.0, -0.5], pad=17)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("agg", softrank.PG_KINDS)
def test_policy_loss_gradient_does_not_depend_on_the_micro_batch_split(tiny_model, agg):
    """The whole batch in one micro-batch, or each sequence in its own (each padded to its own
    widths): the same gradient, the normalizer counted once over the step."""
    model, tokenizer = tiny_model
    model = model.double()
    try:
        pairs = rollout_sequences(tokenizer)
        reference = copy_model(model)
        pad = tokenizer.pad_token_id
        kw = {"agg": agg, "beta": 0.1, "pad": pad, "references": [reference]}
        _, whole = step(model, pairs, [1.0, -0.5], micro_batch=2, **kw)
        _, split = step(model, pairs, [1.0, -0.5], micro_batch=1, **kw)
        assert any(x.abs().max() > 0 for x in whole)
        for x, y in zip(whole, split):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    finally:
        model.float()


def test_policy_loss_averages_the_kl_per_sequence_under_seq(tiny_model):
    """--loss-agg seq with --beta (TRL's grpo): the policy-gradient term and the KL term are both
    each sequence's token mean, then the mean over sequences; the logged kl is that mean of k3;
    the log-probs of both at the rollouts' temperature."""
    model, tokenizer = tiny_model
    pairs = rollout_sequences(tokenizer)  # completions of different lengths
    batch = rollout_batch(tokenizer)
    reference = copy_model(model)
    beta = 0.2
    A = torch.tensor([1.0, -0.5])
    stats, _ = step(
        model,
        pairs,
        A,
        agg="seq",
        beta=beta,
        pad=tokenizer.pad_token_id,
        temperature=0.7,
        references=[reference],
    )
    with torch.no_grad():
        logp, mask = completion_logprobs(model, batch, 0.7)
        ref_logp, _ = completion_logprobs(reference, batch, 0.7)
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1

    def per_sequence_mean(x):
        return torch.stack([x[b][mask[b].bool()].mean() for b in range(len(x))]).mean()

    assert stats["kl"] == pytest.approx(per_sequence_mean(k3).item(), rel=1e-5)
    expected = per_sequence_mean(-A.unsqueeze(-1) * logp + beta * k3)
    assert stats["loss"] == pytest.approx(expected.item(), rel=1e-5)


def copy_model(model):
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            # a different reference, so the KL term has a gradient
            p.add_(0.01 * torch.randn_like(p))
    return reference


def test_policy_one_step_changes_parameters_and_flat_groups_do_not(tiny_model):
    model, tokenizer = tiny_model
    model = copy.deepcopy(model)
    pairs = rollout_sequences(tokenizer)
    # an all-equal group: advantages 0
    _, grads = step(model, pairs, [0.0, 0.0], pad=tokenizer.pad_token_id)
    assert all(g.abs().max() == 0 for g in grads)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sequences = [Sequence(b, 0, 0, p, c) for b, (p, c) in enumerate(pairs)]
    policy_step(
        [model],
        optimizer,
        sequences,
        torch.tensor([[1.0], [-1.0]]),
        agg="sum",
        beta=0.0,
        temperature=1.0,
        max_len=16,
        micro_batch=8,
        pad=tokenizer.pad_token_id,
        bf16=False,
        ranks=ALONE,
    )
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
