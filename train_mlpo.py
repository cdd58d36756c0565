"""MLPO (arXiv 2507.08960, docs/design.md §8): a leader's LLM weights, trained to answer after
reading its frozen peers' solutions.

    python train_mlpo.py --agents 3 --out-dir runs/mlpo
    python eval.py --protocols leader=default+runs/mlpo/adapter      # peers answer, the trained
                                                                     # leader decides

Read top to bottom: the frozen peers' solutions to the training questions are generated once
(peer_pool); questions the peers already get right (>= --filter-easy of them) are dropped, and
with --balance-vote as many questions the peers' vote gets right are kept as it gets wrong; the
leader reads a question and its peers' solutions and answers, G samples per prompt, reward =
correctness. On-policy: one optimizer step per batch of samples, no ratio, no clip. A step reads:
leader_rollouts -> softrank.group_advantages -> softrank.policy_step.

The leader trains a LoRA adapter by default (llm/lora.py; the base frozen), saved as the PEFT
folder adapter/; --lora-rank 0 fine-tunes every weight instead (an HF directory, model/).
"""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import data
import softrank
from common import (
    RunConfig,
    UsageError,
    all_gather_list,
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
    leader_prompt,
    majority_vote,
    parse_solution,
    per_question,
    run_llm,
    solve_calls,
)
from llm.cache import call_seed
from llm.logprobs import without_dropout
from llm.team import EngineConfig, check_engine, check_model, check_models, make_engine
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

GAME_FLAGS = (
    "seed",
    "agents",
    "temperature",
    "top_p",
    "max_new_tokens",
    "trailer",
    "vote",
    "whole_solutions",
)


@dataclass
class Config(
    RolloutConfig,
    TrainerConfig,
    RunConfig,
    only(EngineConfig, "model", "engine_batch_size", "cache_dir"),
    only(GameConfig, *GAME_FLAGS),
    TaskConfig,
):
    peers_model: str = ""
    """the frozen peers' HF directory; empty: the same as --model"""
    peers: str = ""
    """the frozen peers as a team, one entry each as eval.py's --models"""
    filter_easy: float = 0.75
    """drop questions where at least this fraction of the peers is right (0: keep all)"""
    balance_vote: bool = False
    """after --filter-easy, keep as many questions the peers' vote gets right as it gets wrong,
    alternating: the leader learns where the vote fails without unlearning where it holds"""
    # MLPO's aggregation: Dr.GRPO's constant normalizer
    loss_agg: str = "const"
    lr: float = 0.0
    """AdamW learning rate (0: 5e-4 for adapters, 1e-5 for full weights: results/README.md)"""
    out_dir: str = "runs/mlpo"
    """where the trained weights, the peer pool's statistics, metrics.jsonl and the checkpoint
    go"""


# --------------------------------------------------------------------------------------------------
# The peers' solutions (generated once) and the leader's rollouts over them
# --------------------------------------------------------------------------------------------------
def peer_solutions(examples, cfg, ranks):
    """[(example, the frozen peers' round-0 solutions)] for every example, in order: each rank
    generates its shard through the engine and its cache (the game's own calls), then every rank
    gets all of them."""
    # --peers: the frozen peers as a team of adapters, built as eval.py builds --models
    peers = EngineConfig(
        model=cfg.peers_model or cfg.model,
        models=cfg.peers,
        dtype=cfg.train_dtype,
        engine_batch_size=cfg.engine_batch_size,
        cache_dir=cfg.cache_dir,
    )
    engine = make_engine(peers, cfg.agents, ranks.rank, ranks.device)
    mine = list(range(ranks.rank, len(examples), ranks.world))
    outputs = run_llm(engine, solve_calls([examples[k] for k in mine], cfg), cfg)
    teams = per_question([s for s, _ in outputs], cfg.agents)
    gathered = sorted(all_gather_list(list(zip(mine, teams))), key=lambda item: item[0])
    return [(examples[k], solutions) for k, solutions in gathered]


def peer_pool(cfg, ranks):
    """The offline pool: the frozen peers' solutions to the candidate training questions, generated
    once. Questions where at least cfg.filter_easy of the peers are right are dropped: the leader
    has nothing to learn there."""
    candidates = training_pool(cfg)[cfg.val_n : cfg.val_n + cfg.questions]
    pool, peer_right, vote_right = [], [], []
    for example, solutions in peer_solutions(candidates, cfg, ranks):
        right = (
            sum(data.is_correct(s.answer, example.answer, example.task) for s in solutions)
            / cfg.agents
        )
        peer_right.append(right)
        if not cfg.filter_easy or right < cfg.filter_easy:
            pool.append((example, solutions))
            vote = majority_vote(solutions)[0]
            vote_right.append(data.is_correct(vote, example.answer, example.task))
    if cfg.balance_vote:
        pool, vote_right = balanced(pool, vote_right)
    stats = {
        "candidates": len(candidates),
        "kept": len(pool),
        "kept_vote_right": sum(vote_right),
        "peer_accuracy": sum(peer_right) / len(peer_right),
    }
    if ranks.rank == 0:
        print(f"peer pool: {json.dumps(stats)}", file=sys.stderr)
    if not pool and cfg.balance_vote:
        sys.exit(
            f"--balance-vote: of the {len(candidates)} questions the peers' vote gets none wrong "
            "or none right: add --questions"
        )
    if not pool:
        sys.exit(
            f"every one of the {len(candidates)} questions has >= {cfg.filter_easy} of its peers "
            "right: lower --filter-easy or add --questions"
        )
    return pool, stats


def balanced(pool, vote_right):
    """Every question of the pool the vote gets wrong, each followed by the next one it gets right,
    as far as both last (the pool's order kept within each kind); and the kept ones' vote_right."""
    wrong = [item for item, right in zip(pool, vote_right) if not right]
    right = [item for item, right in zip(pool, vote_right) if right]
    pairs = list(zip(wrong, right))
    return [item for pair in pairs for item in pair], [False, True] * len(pairs)


def leader_rollouts(team, items, cfg, step):
    """G samples of the leader (the team's agent 0) per (example, peer solutions) item. Returns
    (sequences, rewards): the leader's Sequences and a (len(items), G) tensor of rewards, its
    correctness (+ format_reward if it parses)."""
    calls = [(q, g) for q in range(len(items)) for g in range(cfg.group)]
    prompts = [leader_prompt(*items[q][:2], cfg.trailer, cfg.whole_solutions) for q, _ in calls]
    seeds = [call_seed(cfg.seed, "leader", step, items[q][0].id, g) for q, g in calls]
    completions = sample(team, prompts, seeds, [0] * len(calls), cfg)
    sequences, rewards = [], torch.zeros(len(items), cfg.group)
    for (q, g), prompt, c in zip(calls, prompts, completions):
        example = items[q][0]
        sequences.append(Sequence(q, g, 0, prompt_ids(team, prompt, 0), c.token_ids))
        answer = parse_solution(c.text, example.task).answer
        rewards[q, g] = float(
            data.is_correct(answer, example.answer, example.task)
        ) + cfg.format_reward * (answer is not None)
    return sequences, rewards


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def train(cfg, ranks):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    pool, pool_stats = peer_pool(cfg, ranks)
    if ranks.rank == 0:
        (out / "pool.json").write_text(json.dumps(pool_stats))
    models, team = trained_team(cfg, 1, ranks.device)
    objective = Objective(cfg.loss_agg, cfg.beta, cfg.rollout_temperature)
    lr = learning_rate(cfg, adapter_lr=5e-4)
    optimizer, holder, counters, log, learners = resumed(
        models, cfg, out, ranks, lr=lr, kl=bool(cfg.beta)
    )
    updater = Updater.of(optimizer, cfg, team.first.tokenizer.pad_token_id, ranks)
    # the leader is validated over its peers' solutions
    validation = training_pool(cfg)[: cfg.val_n]
    if cfg.eval_every:
        validation = peer_solutions(validation, cfg, ranks)[ranks.rank :: ranks.world]

    def validated(step):
        validate(models, team, leader_rollouts, validation, cfg, step=step, ranks=ranks, log=log)

    if cfg.eval_every and counters["step"] == 0:
        validated(0)
    bar = tqdm(range(counters["step"], cfg.steps), desc=f"{cfg.algo} leader", disable=ranks.rank)
    for step in bar:
        began = time.time()
        start = step * cfg.questions_per_step
        items = [pool[(start + k) % len(pool)] for k in range(cfg.questions_per_step)]
        refresh_rollout_weights(models, team)
        sequences, rewards = leader_rollouts(team, items[ranks.rank :: ranks.world], cfg, step)
        rollout_s = time.time() - began
        advantages = softrank.group_advantages(rewards, cfg.algo, cfg.tau)
        # the loss scores the tokens as the sampler drew them
        without_dropout(models[0].train())
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
    """The whole configuration, before any model is loaded (a mistake: common.UsageError). A leader
    needs at least one peer."""
    check_task(cfg)
    check_game(cfg, min_agents=1, min_rounds=0)
    check_engine(cfg, cfg.agents, cfg.max_new_tokens)
    check_run(cfg)
    check_trainer(cfg)
    check_rollouts(cfg, world, softrank.GROUP_ADVANTAGES, softrank.PG_KINDS)
    if not 0 <= cfg.filter_easy <= 1:
        raise UsageError(f"--filter-easy {cfg.filter_easy}: a share of the peers, in [0, 1]")
    if cfg.peers:
        if cfg.peers_model:
            raise UsageError("--peers: the frozen peers as a team, not with --peers-model")
        check_models("--peers", cfg.peers, cfg.agents, cfg.max_new_tokens)
    if cfg.peers_model:
        check_model("--peers-model", cfg.peers_model, cfg.max_new_tokens)


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train(config, ranks)
