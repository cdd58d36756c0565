"""The LLM-weight trainers' optimizer step (docs/design.md §8): MAGRPO, MLPO and the solver each
turn their completions into Sequences with advantages, then call policy_step, read here top to
bottom in one function:

    group the sequences by learner, count them over every rank (the step's normalizer)
    per micro-batch: pad, hold DDP's gradient sync until the last, autocast, log-probs, loss,
                     backward
    average the adapters' gradients over the ranks, clip, step

MAGRPO and MLPO reach it through rollout_update (their rewards -> the truncation rule -> group
advantages -> policy_step).
The loss is the token-level policy gradient, -A_b log pi(o_bt), aggregated by `agg`
(softrank.aggregate: the bias of each choice is documented there), + beta x the k3 estimate of
KL(pi || the initial weights) (softrank.kl_k3). The solver's cross-entropy is the same step with
advantage 1 on every sequence and the token mean.
"""

from dataclasses import dataclass

import torch

import softrank
from common import accumulating, all_reduce_max, all_reduce_sum, average_gradients, clip_gradients
from llm import lora
from llm.logprobs import completion_batch, completion_logprobs, without_dropout
from llm.training import rollout_stats


@dataclass
class Sequence:
    """One completion the step trains on (sampled by the rollouts, or a worked solution)."""

    # its row of the step's (rows, G) advantages: the question's index on this rank, or a row the
    # script defines (one per question and agent, for rewards of each agent's own)
    question: int
    sample: int  # which of the question's G rollouts: the advantages' column
    agent: int  # which agent wrote it (0 for the leader): with one learner per agent, whose it is
    prompt_ids: list
    completion_ids: list  # the sampled ids, the EOS included
    # cut off at the token budget before it ended (the engine's finish "length"): the rollout it
    # belongs to earns what --truncated says (rollout_update)
    truncated: bool = False
    # its answer is right as the lenient reader of the evaluation reads it, and not as the strict
    # reader of the training reward does (data.strict_answer): logged, a sign of format drift
    lenient_only: bool = False


# a rank without sequences runs this one at advantage 0 (a token of each: any ids the model knows),
# so that its backward joins the other ranks' gradient all-reduce
FILLER = Sequence(0, 0, 0, [0], [0])


def policy_step(
    models,
    optimizer,
    sequences,
    advantages,
    *,
    agg,
    beta,
    temperature,
    max_len,
    micro_batch,
    pad,
    bf16,
    ranks,
    references=None,
):
    """One optimizer step over this rank's `sequences`, each at advantage
    advantages[s.question, s.sample]. Returns the step's statistics.

    models: the trained weights. One model carrying LoRA adapters, one learner per adapter (one
        adapter for every agent, or one per agent); or whole models, one learner each (DDP-wrapped,
        or sharded with FSDP2, when several processes run). With several learners, learner e
        trains on agent e's sequences alone, with a normalizer of its own: each agent's gradient
        is that of its own loss (CoMLRL's per-agent MAGRPO).
    agg, beta, temperature: the aggregation (softrank.PG_KINDS), the KL weight, and the temperature
        the completions were sampled at (their log-probs must be the sampler's).
    max_len: the completions' token budget (the `const` normalizer). micro_batch: sequences per
        forward and backward. pad: the pad token id. bf16: the forward in bf16 autocast on fp32
        weights. ranks: common.Ranks.
    references: with beta and whole weights, a frozen copy of each model's initial weights (with
        adapters the KL's reference is the base itself, adapter off).
    """
    adapters = lora.n_adapters(models[0])
    n_learners = adapters or len(models)
    groups = [sequences]
    if n_learners > 1:
        groups = [[s for s in sequences if s.agent == e] for e in range(n_learners)]
    # the normalizer counts the whole step's sequences and tokens, over every rank, once: then the
    # micro-batches' gradients add up to the full batch's exactly
    counts = all_reduce_sum(
        [c for g in groups for c in (len(g), sum(len(s.completion_ids) for s in g))], ranks.device
    )
    if not beta:
        # advantage 0 (a flat group) adds exactly 0 to the loss and its gradient: skipped
        groups = [[s for s in g if advantages[s.question, s.sample] != 0] or g[:1] for g in groups]
    # every rank runs as many micro-batches as the busiest one, fillers where it has no sequence
    # left: the ranks' collectives pair up (DDP's last all-reduce; FSDP2's gathers in every pass)
    chunks = all_reduce_max([-(-max(len(g), 1) // micro_batch) for g in groups], ranks.device)
    loss_total, kl_total, learners = 0.0, 0.0, []
    for e, group in enumerate(groups):
        module, adapter = (models[0], e) if adapters else (models[e], None)
        params = lora.adapter_parameters(module, e) if adapters else list(module.parameters())
        learners.append(params)
        # DDP averages the gradients over the ranks: each rank's share is 1 / world of the loss. A
        # step with no sequence at all (every rollout dropped) divides its filler's 0 by 1, not 0
        normalizer = softrank.step_normalizer(agg, *counts[2 * e : 2 * e + 2], max_len)
        normalizer = max(normalizer, 1.0) / ranks.world
        for k in range(int(chunks[e])):
            chunk = group[k * micro_batch : (k + 1) * micro_batch]
            # prompts padded on the left, completions on the right; the mask: completion tokens
            pairs = [(s.prompt_ids, s.completion_ids) for s in chunk or [FILLER]]
            batch = completion_batch(pairs, pad, ranks.device)
            rows = [s.question for s in chunk], [s.sample for s in chunk]
            chunk_advantages = (advantages[rows] if chunk else torch.zeros(1)).to(ranks.device)
            # the gradients are exchanged in the last micro-batch's backward only
            with accumulating(module, last=k == chunks[e] - 1):
                with torch.autocast(ranks.device.type, dtype=torch.bfloat16, enabled=bf16):
                    with lora.selecting(module, adapter):
                        logp, mask = completion_logprobs(module, batch, temperature)
                    loss, _ = softrank.policy_gradient_loss(
                        logp, chunk_advantages, mask, agg, normalizer
                    )
                    kl = torch.zeros(())
                    if beta:
                        # the reference: a frozen copy of the initial weights, or the base itself
                        reference = module if references is None else references[e]
                        with torch.no_grad(), lora.selecting(module, None):
                            ref_logp, _ = completion_logprobs(reference, batch, temperature)
                        k3 = softrank.kl_k3(logp, ref_logp)
                        kl = softrank.aggregate(k3, mask, agg, normalizer)
                        loss = loss + beta * kl
                # a filler counts for nothing: it runs for the collectives alone
                if not chunk:
                    loss, kl = loss * 0.0, torch.zeros(())
                loss.backward()
            loss_total, kl_total = loss_total + loss.item(), kl_total + kl.item()
    if adapters:
        # DDP cannot wrap the adapters of one model: their gradients are averaged by hand
        for parameters in learners:
            average_gradients(parameters, ranks.world)
    # each learner's gradient clipped on its own
    norms = torch.stack([clip_gradients(p, 1.0) for p in learners])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        # the learners' mean (each learner's loss over its own sequences)
        "loss": loss_total / n_learners,
        "kl": kl_total / n_learners,
        "trained": sum(len(g) for g in groups),
        "tokens": sum(counts[1::2]),
        "grad_norm": float(norms.norm()),
    }


# what a rollout with a truncated completion earns (--truncated): nothing, or no place in the step
TRUNCATED_RULES = ("zero", "drop")


def rollout_update(modules, optimizer, sequences, rewards, cfg, *, pad, ranks, references):
    """MAGRPO's and MLPO's update from one step of rollouts: `rewards` (rows, G), a row per group of
    G rollouts, become each rollout's group advantage (softrank.group_advantages by --algo), which
    every sequence of the rollout shares; then policy_step under the rollouts' flags (`cfg`).
    Returns what the step logs.

    A completion cut off at --max-new-tokens earns nothing by accident, before the advantages: its
    rollout's reward is 0 (--truncated zero: 0 is the least any rollout earns), or the rollout
    leaves the step (drop: out of its group's mean and spread, its sequences out of the loss and
    its normalizer), as OpenRLHF's stop-properly penalty and DAPO's overlong filtering do."""
    cut = torch.zeros_like(rewards, dtype=torch.bool)
    for s in sequences:
        if s.truncated:
            cut[s.question, s.sample] = True
    kept = None
    if cfg.truncated == "zero":
        rewards = rewards.masked_fill(cut, 0.0)
    else:
        kept = ~cut
        seen = [s for s in sequences if not cut[s.question, s.sample]]
    advantages = softrank.group_advantages(rewards, cfg.algo, cfg.tau, mask=kept)
    # the loss scores the tokens as the sampler drew them: train mode for gradient checkpointing,
    # dropout off
    for m in modules:
        without_dropout(m.train())
    update = policy_step(
        modules,
        optimizer,
        sequences if kept is None else seen,
        advantages,
        agg=cfg.loss_agg,
        beta=cfg.beta,
        temperature=cfg.rollout_temperature,
        max_len=cfg.max_new_tokens,
        micro_batch=cfg.micro_batch,
        pad=pad,
        bf16=cfg.train_dtype == "bfloat16",
        ranks=ranks,
        references=references,
    )
    counted, flat = rewards, softrank.flat_groups(rewards)
    if kept is not None:
        # a group whose every rollout left has nothing to teach either
        counted, flat = rewards[kept], softrank.flat_groups(rewards, kept) | ~kept.any(-1, True)
    completions = all_reduce_sum(
        [
            len(sequences),
            sum(s.truncated for s in sequences),
            sum(s.lenient_only for s in sequences),
        ],
        ranks.device,
    )
    return rollout_stats(update, counted, flat, ranks) | {
        "truncated": completions[1] / max(completions[0], 1),
        "lenient_only": completions[2] / max(completions[0], 1),
    }
