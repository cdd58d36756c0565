"""softrank.policy_loss in process (llm/logprobs.py under it, the trained weights an
llm.training.Learner), on a tiny random model: the completion log-probs of padded batches, and the
token-level loss's gradient (prompt, peers' text and padding masked out, micro-batches, the KL per
sequence, flat groups)."""

import copy

import pytest
import torch

import softrank
from deliberate import GameConfig
from llm.logprobs import completion_batch, completion_logprobs, token_logprobs
from llm.training import Learner, Objective
from softrank import policy_loss


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


def learner(model, reference=None):
    """The model's whole weights as policy_loss trains them (`reference`: the KL's)."""
    return Learner(model, list(model.parameters()), None, reference)


def policy_grads(model, batches, advantages, agg, beta, normalizer, reference=None):
    model.zero_grad()
    for batch, adv in zip(batches, advantages):
        objective = Objective(agg, beta, 1.0)
        loss, _ = policy_loss(learner(model, reference), batch, adv, objective, normalizer)
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_policy_loss_prompt_peers_and_padding_get_no_gradient(tiny_model):
    model, tokenizer = tiny_model
    ids, attention, mask = rollout_batch(tokenizer)
    logp, completion = completion_logprobs(model, (ids, attention, mask))
    logp = logp.detach().requires_grad_(True)
    loss, _ = softrank.policy_gradient_loss(logp, torch.tensor([1.0, -0.5]), completion, "token")
    loss.backward()
    completion = completion.bool()
    assert (logp.grad[~completion] == 0).all() and (logp.grad[completion] != 0).all()
    # whatever sits in the padding, the parameter gradients are the same, bit for bit (MAGRPO's
    # sum, no KL)
    other = ids.clone()
    other[attention == 0] = 17
    a = policy_grads(model, [(ids, attention, mask)], [torch.tensor([1.0, -0.5])], "sum", 0.0, 10.0)
    b = policy_grads(
        model, [(other, attention, mask)], [torch.tensor([1.0, -0.5])], "sum", 0.0, 10.0
    )
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("agg", softrank.PG_KINDS)
def test_policy_loss_gradient_does_not_depend_on_the_micro_batch_split(tiny_model, agg):
    model, tokenizer = tiny_model
    model = model.double()
    try:
        sequences = rollout_sequences(tokenizer)
        beta = 0.1
        advantages = torch.tensor([1.0, -0.5], dtype=torch.float64)
        whole = completion_batch(sequences, tokenizer.pad_token_id, "cpu")
        normalizer = softrank.pg_normalizer(whole[2], agg, max_len=GameConfig.max_new_tokens)
        reference = copy_model(model)
        # each micro-batch is built from its own sequences (its own padding widths), as in training
        halves = [
            completion_batch(sequences[k : k + 1], tokenizer.pad_token_id, "cpu") for k in (0, 1)
        ]
        whole = policy_grads(model, [whole], [advantages], agg, beta, normalizer, reference)
        split = policy_grads(
            model, halves, [advantages[:1], advantages[1:]], agg, beta, normalizer, reference
        )
        for x, y in zip(whole, split):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    finally:
        model.float()


def test_policy_loss_averages_the_kl_per_sequence_under_seq(tiny_model):
    """--loss-agg seq with --beta (TRL's grpo): the policy-gradient term and the KL term are both
    each sequence's token mean, then the mean over sequences; the logged kl is that mean of k3;
    the log-probs of both at the objective's temperature."""
    model, tokenizer = tiny_model
    batch = rollout_batch(tokenizer)  # completions of different lengths
    reference = copy_model(model)
    beta = 0.2
    A = torch.tensor([1.0, -0.5])
    # both terms' log-probs at the rollouts' temperature
    objective = Objective("seq", beta, 0.7)
    with torch.no_grad():
        loss, kl = policy_loss(learner(model, reference), batch, A, objective, 2.0)
        logp, mask = completion_logprobs(model, batch, 0.7)
        ref_logp, _ = completion_logprobs(reference, batch, 0.7)
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1

    def per_sequence_mean(x):
        return torch.stack([x[b][mask[b].bool()].mean() for b in range(len(x))]).mean()

    assert kl == pytest.approx(per_sequence_mean(k3).item(), rel=1e-5)
    expected = per_sequence_mean(-A.unsqueeze(-1) * logp + beta * k3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


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
    batch = rollout_batch(tokenizer)
    # an all-equal group: advantages 0
    grads = policy_grads(model, [batch], [torch.zeros(2)], "sum", 0.0, 10.0)
    assert all(g.abs().max() == 0 for g in grads)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    policy_grads(model, [batch], [torch.tensor([1.0, -1.0])], "sum", 0.0, 10.0)
    optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
