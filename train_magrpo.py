"""MAGRPO (arXiv 2508.04652, docs/design.md §8): the agents' LLM weights, trained on their own
deliberation under one joint reward.

    python train_magrpo.py --protocol debate --agents 3 --rounds 1 --out-dir runs/magrpo
    python eval.py --models default+runs/magrpo/adapter,... --protocols debate

Read top to bottom: G joint rollouts of the protocol per question (every agent answers; with
--protocol debate, --rounds REFINE rounds), one joint reward per rollout (the team vote's
correctness), its group advantage shared by every agent of the rollout; each agent learns from its
own sampled tokens only. On-policy: one optimizer step per batch of rollouts, no ratio, no clip.
A step reads: joint_rollouts -> softrank.group_advantages -> softrank.policy_step.

LoRA adapters by default (llm/lora.py; the base frozen): one for every agent, or one per agent
(--separate-agents), saved as small PEFT folders (adapter/ or agent<i>/) that eval.py --models
default+<folder>,... plays (and PEFT and vLLM load); --lora-rank 0 fine-tunes every weight
instead (an HF directory per model).
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
    RunConfig,
    check_choice,
    check_run,
    crash_if_asked,
    distributed,
    launch_world_size,
    only,
    parse_config,
    peak_memory_mb,
    save_checkpoint,
    user_errors,
)
from data import TaskConfig, check_task, training_pool
from deliberate import (
    GameConfig,
    check_game,
    majority_vote,
    parse_solution,
    refine_prompt,
    solve_prompt,
)
from llm.cache import call_seed
from llm.logprobs import without_dropout
from llm.team import EngineConfig, check_engine
from llm.training import (
    Objective,
    RolloutConfig,
    Sequence,
    TrainerConfig,
    Updater,
    check_rollouts,
    check_trainer,
    learning_rate,
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
class Config(
    RolloutConfig,
    TrainerConfig,
    only(RunConfig, "val_n", "eval_every", "weight_decay", "save_every", "crash_at_step"),
    only(EngineConfig, "model", "engine_batch_size"),
    only(GameConfig, "seed", "agents", "rounds", "max_new_tokens", "trailer", "vote"),
    TaskConfig,
):
    protocol: str = "debate"
    """parallel (independent answers, then the vote) | debate (--rounds REFINE rounds)"""
    separate_agents: bool = False
    """one set of trained weights per agent, an adapter or a whole copy (default: one shared)"""
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
def train(cfg, ranks):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    pool = training_pool(cfg)[cfg.val_n :]
    models, team = trained_team(cfg, cfg.agents if cfg.separate_agents else 1, ranks.device)
    objective = Objective(cfg.loss_agg, cfg.beta, cfg.rollout_temperature)
    lr = learning_rate(cfg, adapter_lr=5e-4)
    optimizer, holder, counters, log, learners = resumed(
        models, cfg, out, ranks, lr=lr, kl=bool(cfg.beta)
    )
    updater = Updater.of(optimizer, cfg, team.first.tokenizer.pad_token_id, ranks)
    validation = training_pool(cfg)[: cfg.val_n][ranks.rank :: ranks.world]

    def validated(step):
        validate(models, team, joint_rollouts, validation, cfg, step=step, ranks=ranks, log=log)

    if cfg.eval_every and counters["step"] == 0:
        validated(0)
    bar = tqdm(range(counters["step"], cfg.steps), desc=f"{cfg.algo} agents", disable=ranks.rank)
    for step in bar:
        began = time.time()
        start = step * cfg.questions_per_step
        questions = [pool[(start + k) % len(pool)] for k in range(cfg.questions_per_step)]
        refresh_rollout_weights(models, team)
        mine = questions[ranks.rank :: ranks.world]
        sequences, rewards = joint_rollouts(team, mine, cfg, step)
        rollout_s = time.time() - began
        advantages = softrank.group_advantages(rewards, cfg.algo, cfg.tau)
        # the loss scores the tokens as the sampler drew them
        for m in models:
            without_dropout(m.train())
        update = softrank.policy_step(learners, sequences, advantages, objective, updater)

        flat = softrank.flat_groups(rewards)
        stats = rollout_stats(update, rewards, flat, ranks) | {"rollout_s": rollout_s}
        stats |= {"step_s": time.time() - began, "peak_memory_mb": peak_memory_mb(ranks.device)}
        bar.set_postfix(reward=f"{stats['mean_reward']:.3f}")
        log.write(step=step + 1, **stats)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            validated(step + 1)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, holder, optimizer, {"step": step + 1}, cfg, ranks.rank)
        crash_if_asked(cfg, step + 1)
    if ranks.rank == 0:
        saved = save_trained(models, team.first.tokenizer, out, cfg)
        print(json.dumps({"steps": cfg.steps, "saved": saved}))


def check(cfg, world):
    """The whole configuration, before any model is loaded (a mistake: common.UsageError). One
    agent is allowed: MAGRPO with one agent is GRPO."""
    check_task(cfg)
    check_game(cfg, min_agents=1, min_rounds=0)
    check_engine(cfg, cfg.agents, cfg.max_new_tokens)
    check_run(cfg)
    check_trainer(cfg)
    check_rollouts(cfg, world, softrank.GROUP_ADVANTAGES, softrank.PG_KINDS)
    check_choice("--protocol", cfg.protocol, ("parallel", "debate"))


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train(config, ranks)
