"""MAGRPO (arXiv 2508.04652, docs/design.md §8): the agents' LLM weights, trained on their own
deliberation under one joint reward.

    python train_magrpo.py --protocol debate --agents 3 --rounds 1 --out-dir runs/magrpo
    python eval.py --models default+runs/magrpo/adapter.pt,... --protocols debate

Read top to bottom: G joint rollouts of the protocol per question (every agent answers; with
--protocol debate, --rounds REFINE rounds), one joint reward per rollout (the team vote's
correctness), its group advantage shared by every agent of the rollout; each agent learns from its
own sampled tokens only. On-policy: one optimizer step per batch of rollouts, no ratio, no clip.
A step reads: joint_rollouts -> softrank.group_advantages -> llm.training.policy_step.

LoRA adapters by default (llm/lora.py; the base frozen): one for every agent, or one per agent
(--separate-agents), saved as small files (adapter.pt or agent<i>.pt) that eval.py --models
default+<file>,... plays; --lora-rank 0 fine-tunes every weight instead (an HF directory per model).
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import data
import softrank
from common import (
    check_choice,
    crash_if_asked,
    distributed,
    launch_world_size,
    parse_config,
    peak_memory_mb,
    save_checkpoint,
    user_errors,
)
from data import training_pool
from deliberate import majority_vote, parse_solution, refine_prompt, solve_prompt
from llm.cache import call_seed
from llm.logprobs import without_dropout
from llm.training import (
    Objective,
    RolloutConfig,
    Sequence,
    check_rollouts,
    check_weights,
    learning_rate,
    policy_step,
    prompt_ids,
    refresh_rollout_weights,
    resumed,
    rollout_stats,
    sample,
    save_trained,
    trained_team,
    validate,
)


@dataclass
class Config(RolloutConfig):
    protocol: str = "debate"
    """parallel (independent answers, then the vote) | debate (--rounds REFINE rounds)"""
    loss_agg: str = "sum"
    """token (DAPO) | seq (GRPO) | const (Dr.GRPO) | sum (CoMLRL's MAGRPO: each completion's token
    log-probs summed, times its advantage, averaged over completions), see softrank.aggregate"""
    separate_agents: bool = False
    """one set of trained weights per agent, an adapter or a whole copy (default: one shared)"""
    init_adapter: str = ""
    """start every trained adapter from this adapter file (of the same rank and alpha) instead of
    from the base model, e.g. agents trained on parallel answers, then on debate"""
    lr: float = 0.0
    """AdamW learning rate (0: 5e-4 for adapters, 1e-5 for full weights: results/README.md)"""
    out_dir: str = "runs/magrpo"
    """where the trained weights, metrics.jsonl and the checkpoint go"""


# --------------------------------------------------------------------------------------------------
# The rollouts: the game played by the agents being trained
# --------------------------------------------------------------------------------------------------
def joint_rollouts(team, examples, cfg, step):
    """G rollouts of the protocol for each example. Returns (sequences, rewards): every agent's
    Sequences and a (len(examples), G) tensor of rewards, the team vote's correctness (+
    format_reward x the fraction of final answers that parse)."""
    teams = {(q, g): [None] * cfg.agents for q in range(len(examples)) for g in range(cfg.group)}
    sequences = []

    def run_round(t, prompt_of):
        """Every agent of every rollout answers prompt_of(q, g, i), built from the teams before the
        round (simultaneous moves), with its own weights (team: one call per engine)."""
        solutions = {}
        calls = [(q, g, i) for (q, g) in teams for i in range(cfg.agents)]
        prompts = [prompt_of(q, g, i) for q, g, i in calls]
        seeds = [call_seed(cfg.seed, "agents", step, examples[q].id, g, i, t) for q, g, i in calls]
        completions = sample(team, prompts, seeds, [i for _, _, i in calls], cfg)
        for (q, g, i), prompt, c in zip(calls, prompts, completions):
            sequences.append(Sequence(q, g, i, prompt_ids(team, prompt, i), c.token_ids))
            solutions[(q, g, i)] = parse_solution(
                c.text, examples[q].task, c.completion_tokens, c.token_logprobs, cfg.vote
            )
        for (q, g, i), solution in solutions.items():
            teams[(q, g)][i] = solution

    run_round(0, lambda q, g, i: solve_prompt(examples[q], cfg.trailer))
    for t in range(1, cfg.rounds + 1 if cfg.protocol == "debate" else 1):
        run_round(t, lambda q, g, i: refine_prompt(examples[q], teams[(q, g)], i, cfg.trailer))
    rewards = torch.zeros(len(examples), cfg.group)
    for (q, g), team in teams.items():
        vote, _ = majority_vote(team)
        rewards[q, g] = float(
            data.is_correct(vote, examples[q].answer, examples[q].task)
        ) + cfg.format_reward * sum(s.answer is not None for s in team) / len(team)
    return sequences, rewards


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def train(cfg, rank, world, device):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    pool = training_pool(cfg)[cfg.val_n :]
    models, team = trained_team(cfg, cfg.agents if cfg.separate_agents else 1, device)
    objective = Objective(cfg.loss_agg, cfg.beta, cfg.rollout_temperature)
    lr = learning_rate(cfg, adapter_lr=5e-4)
    optimizer, holder, counters, log, learners = resumed(
        models, cfg, lr, objective, out, rank, device, "steps"
    )
    pad = team.first.tokenizer.pad_token_id
    validation = training_pool(cfg)[: cfg.val_n][rank::world]

    if cfg.eval_every and counters["step"] == 0:
        validate(models, team, joint_rollouts, validation, cfg, 0, rank, device, log)
    bar = tqdm(range(counters["step"], cfg.steps), desc=f"{cfg.algo} agents", disable=rank != 0)
    for step in bar:
        began = time.time()
        start = step * cfg.questions_per_step
        questions = [pool[(start + k) % len(pool)] for k in range(cfg.questions_per_step)]
        refresh_rollout_weights(models, team)
        sequences, rewards = joint_rollouts(team, questions[rank::world], cfg, step)
        rollout_s = time.time() - began
        advantages = softrank.group_advantages(rewards, cfg.algo, cfg.tau)
        # the loss scores the tokens as the sampler drew them
        for m in models:
            without_dropout(m.train())
        update = policy_step(
            learners, optimizer, sequences, advantages, objective, cfg, pad, device, world
        )

        stats = rollout_stats(update, rewards, world, device) | {"rollout_s": rollout_s}
        stats |= {"step_s": time.time() - began, "peak_memory_mb": peak_memory_mb(device)}
        bar.set_postfix(reward=f"{stats['mean_reward']:.3f}")
        log.write(step=step + 1, **stats)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            validate(models, team, joint_rollouts, validation, cfg, step + 1, rank, device, log)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, holder, optimizer, {"step": step + 1}, cfg, rank)
        crash_if_asked(cfg, step + 1)
    if rank == 0:
        saved = save_trained(models, team.first.tokenizer, out, cfg)
        print(json.dumps({"steps": cfg.steps, "saved": saved}))


def check(cfg, world):
    """The whole configuration, before any model is loaded (a mistake: common.UsageError). One
    agent is allowed: MAGRPO with one agent is GRPO."""
    check_weights(cfg)
    check_rollouts(cfg, world)
    check_choice("--protocol", cfg.protocol, ("parallel", "debate"))


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as (rank, world, device):
            train(config, rank, world, device)
