"""How many MAGRPO / MLPO groups carry signal: the share of questions whose G rollouts
all get the same reward (a flat group: advantage 0, nothing to learn), for group sizes G = 2, 4, 8,
on the untrained model.

    python -m experiments.flat_groups --level 1 --agents 3 --n 32 \
        --out results/llm/flat_groups-L1-a3.json
    python -m experiments.flat_groups --target leader --n 64 \
        --out results/llm/flat_groups-leader.json

--target agents: a joint rollout of `--protocol parallel` is every agent's answer to the question,
sampled at the rollout temperature; its reward is the team vote's correctness (train_magrpo.py).
--target leader: the peers answer once (the game's round-0 calls at T = 0.7); questions where >=
75% of them are right are filtered out, as train_mlpo.py does; a rollout is one leader
answer over those peers, its reward its correctness. The 8 rollouts of a question are sampled once
through the engine and its cache; G = 2 and 4 use the first G of them.
"""

import dataclasses
from dataclasses import dataclass

import data
from common import call_seed, parse_config, write_result
from llm.engine import Engine
from solutions import (
    GameConfig,
    leader_prompt,
    majority_vote,
    per_question,
    run_llm,
    solve_calls,
    solve_prompt,
)

GROUPS = (2, 4, 8)


@dataclass
class Config:
    target: str = "agents"  # agents (MAGRPO) | leader (MLPO)
    level: int = 1  # arith difficulty
    agents: int = 3
    n: int = 32  # training-split questions
    temperature: float = 1.0  # the rollout temperature (train_magrpo.py --rollout-temperature)
    max_new_tokens: int = 96
    seed: int = 0
    cache_dir: str = "cache/generations"
    out: str = ""


def main(cfg):
    examples = data.load_task("arith", split="train", n=cfg.n, seed=cfg.seed, level=cfg.level)
    engine = Engine(cache_dir=cfg.cache_dir or None, progress=True)
    game = GameConfig(
        agents=cfg.agents, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens
    )
    G = max(GROUPS)
    if cfg.target == "leader":
        peers_game = GameConfig(agents=cfg.agents, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
        peers = per_question(
            [s for s, _ in run_llm(engine, solve_calls(examples, peers_game), peers_game)],
            cfg.agents,
        )
        peer_right = [
            sum(data.is_correct(s.answer, ex.answer, ex.task) for s in team) / cfg.agents
            for ex, team in zip(examples, peers)
        ]
        kept = [(ex, team) for ex, team, right in zip(examples, peers, peer_right) if right < 0.75]
        calls = [
            (ex, leader_prompt(ex, team), call_seed(cfg.seed, "flat-leader", ex.id, g), 0)
            for ex, team in kept
            for g in range(G)
        ]
        per_rollout = 1
        examples = [ex for ex, _ in kept]
    else:
        calls = [
            (ex, solve_prompt(ex), call_seed(cfg.seed, "flat-groups", ex.id, g, i), i)
            for ex in examples
            for g in range(G)
            for i in range(cfg.agents)
        ]
        per_rollout = cfg.agents
    outputs = run_llm(engine, calls, game)
    # per question, the reward of each rollout: the vote's
    # or the leader's correctness (the mean: vote_accuracy)
    rewards = []
    for ex, question_outputs in zip(examples, per_question(outputs, G * per_rollout)):
        teams = per_question([s for s, _ in question_outputs], per_rollout)
        rewards.append(
            [data.is_correct(majority_vote(team)[0], ex.answer, ex.task) for team in teams]
        )
    solutions = [s for s, _ in outputs]
    result = {
        "config": dataclasses.asdict(cfg),
        "questions": len(examples),
        "agent_accuracy": sum(
            data.is_correct(s.answer, ex.answer, ex.task) for (ex, *_), s in zip(calls, solutions)
        )
        / len(solutions),
        "vote_accuracy": sum(map(sum, rewards)) / sum(map(len, rewards)),
        "completion_tokens_per_answer": sum(s.completion_tokens for s in solutions)
        / len(solutions),
        "frac_flat": {G: sum(len(set(r[:G])) == 1 for r in rewards) / len(rewards) for G in GROUPS},
        "frac_all_wrong": {G: sum(not any(r[:G]) for r in rewards) / len(rewards) for G in GROUPS},
    }
    if cfg.target == "leader":
        result.update(candidates=len(peer_right), peer_accuracy=sum(peer_right) / len(peer_right))
    return write_result(result, cfg.out)


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
