"""The sampled episodes train_llm.py learns from (docs/design.md §8), on the game's prompts and
vote.

Sequence          - one sampled completion, the unit the token-level loss trains on
joint_rollouts    - MAGRPO: G joint rollouts of a protocol (parallel or debate) per question, one
                    joint reward per rollout (the team vote's correctness)
leader_rollouts   - MLPO: G samples of the leader reading its peers' solutions, reward = correctness
peer_solutions    - the frozen peers' round-0 solutions to some questions (MLPO's pool, its
                    validation)
peer_pool         - MLPO's offline pool of frozen peers' solutions, easy questions filtered out
"""

import dataclasses
import json
import sys
from dataclasses import dataclass

import torch

import data
import deliberate
from common import all_gather_list
from corpus import make_engine, training_pool
from llm.engine import call_seed
from state import majority_vote, parse_solution


@dataclass
class Sequence:
    """One sampled completion of a step's rollouts: the learner trains on its completion tokens."""

    question: int  # index into the step's questions (on this rank)
    sample: int  # which of the question's G rollouts
    agent: int  # which agent wrote it (0 for the leader)
    prompt_ids: list
    completion_ids: list  # the sampled ids, the EOS included


def sample(engine, prompts, seeds, cfg):
    """The rollouts' completions with their token ids, at the temperature the loss scores them with
    (no top-p: the log-probs are of the whole tempered distribution)."""
    budget, temperature = cfg.max_new_tokens, cfg.rollout_temperature
    return engine.generate(
        prompts,
        seeds,
        max_new_tokens=budget,
        temperature=temperature,
        top_p=1.0,
        return_tokens=True,
    )


def joint_rollouts(engines, examples, cfg, step):
    """G rollouts of the protocol for each example. Returns (sequences, rewards): every agent's
    Sequences and a (len(examples), G) tensor of rewards, the team vote's correctness (+
    format_reward x the fraction of final answers that parse)."""
    teams = {(q, g): [None] * cfg.agents for q in range(len(examples)) for g in range(cfg.group)}
    sequences = []

    def run_round(t, prompt_of):
        """Every agent of every rollout answers prompt_of(q, g, i), built from the teams before the
        round (simultaneous moves), through its own model's engine."""
        solutions = {}
        # one engine per agent with separate weights, else one for all
        for e, engine in enumerate(engines):
            calls = [
                (q, g, i)
                for (q, g) in teams
                for i in range(cfg.agents)
                if len(engines) == 1 or i == e
            ]
            prompts = [engine.chat(prompt_of(q, g, i)) for q, g, i in calls]
            seeds = [
                call_seed(cfg.seed, "agents", step, examples[q].id, g, i, t) for q, g, i in calls
            ]
            completions = sample(engine, prompts, seeds, cfg)
            for (q, g, i), prompt, c in zip(calls, prompts, completions):
                sequences.append(Sequence(q, g, i, engine.encode(prompt), c.token_ids))
                solutions[(q, g, i)] = parse_solution(
                    c.text, examples[q].task, c.completion_tokens, c.token_logprobs, cfg.vote
                )
        for (q, g, i), solution in solutions.items():
            teams[(q, g)][i] = solution

    run_round(0, lambda q, g, i: deliberate.solve_prompt(examples[q], cfg.trailer))
    for t in range(1, cfg.rounds + 1 if cfg.protocol == "debate" else 1):
        run_round(
            t, lambda q, g, i: deliberate.refine_prompt(examples[q], teams[(q, g)], i, cfg.trailer)
        )
    rewards = torch.zeros(len(examples), cfg.group)
    for (q, g), team in teams.items():
        vote, _ = majority_vote(team)
        rewards[q, g] = float(
            data.is_correct(vote, examples[q].answer, examples[q].task)
        ) + cfg.format_reward * sum(s.answer is not None for s in team) / len(team)
    return sequences, rewards


def leader_rollouts(engine, items, cfg, step):
    """G samples of the leader per (example, peer solutions) item, as joint_rollouts returns them
    (agent 0): the leader's Sequences and a (len(items), G) tensor of rewards, its correctness (+
    format_reward if it parses)."""
    calls = [(q, g) for q in range(len(items)) for g in range(cfg.group)]
    prompts = [
        engine.chat(deliberate.leader_prompt(items[q][0], items[q][1], cfg.trailer))
        for q, _ in calls
    ]
    seeds = [call_seed(cfg.seed, "leader", step, items[q][0].id, g) for q, g in calls]
    completions = sample(engine, prompts, seeds, cfg)
    sequences, rewards = [], torch.zeros(len(items), cfg.group)
    for (q, g), prompt, c in zip(calls, prompts, completions):
        example = items[q][0]
        sequences.append(Sequence(q, g, 0, engine.encode(prompt), c.token_ids))
        answer = parse_solution(c.text, example.task).answer
        rewards[q, g] = float(
            data.is_correct(answer, example.answer, example.task)
        ) + cfg.format_reward * (answer is not None)
    return sequences, rewards


def peer_solutions(examples, cfg, rank, world):
    """[(example, the frozen peers' round-0 solutions)] for every example, in order: each rank
    generates its shard through the engine and its cache (the game's own calls), then every rank
    gets all of them."""
    engine = make_engine(dataclasses.replace(cfg, model=cfg.peers_model or cfg.model), rank)
    game = deliberate.game_config(cfg, greedy_policy=True)
    mine = list(range(rank, len(examples), world))
    outputs = deliberate.run_llm(
        engine, deliberate.solve_calls([examples[k] for k in mine], game), game
    )
    teams = deliberate.per_question([s for s, _ in outputs], cfg.agents)
    gathered = sorted(all_gather_list(list(zip(mine, teams))), key=lambda item: item[0])
    return [(examples[k], solutions) for k, solutions in gathered]


def peer_pool(cfg, rank, world):
    """MLPO's offline pool: the frozen peers' solutions to the candidate training questions,
    generated once. Questions where at least cfg.filter_easy of the peers are right are dropped: the
    leader has nothing to learn there."""
    candidates = training_pool(cfg)[cfg.val_n : cfg.val_n + cfg.questions]
    pool, peer_right = [], []
    for example, solutions in peer_solutions(candidates, cfg, rank, world):
        right = (
            sum(data.is_correct(s.answer, example.answer, example.task) for s in solutions)
            / cfg.agents
        )
        peer_right.append(right)
        if not cfg.filter_easy or right < cfg.filter_easy:
            pool.append((example, solutions))
    stats = {
        "candidates": len(candidates),
        "kept": len(pool),
        "peer_accuracy": sum(peer_right) / len(peer_right),
    }
    if rank == 0:
        print(f"peer pool: {json.dumps(stats)}", file=sys.stderr)
    if not pool:
        sys.exit(
            f"every one of the {len(candidates)} questions has >= {cfg.filter_easy} of its peers "
            "right: lower --filter-easy or add --questions"
        )
    return pool, stats
