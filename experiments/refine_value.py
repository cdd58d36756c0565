"""What a learned policy's REFINEs (and CONCEDEs) are worth in the test games: the policy
plays its team's games greedily, as eval.py's mpdf=POLICY protocol does, and at every decision every
agent's reward for each of its K actions is computed too (deliberate.counterfactual_rewards, the
peers held at what they did). For each kind of action the policy took, the mean of the reward it got
minus the reward PERSIST would have got, with a bootstrap 95% interval over decisions.

    python -m experiments.refine_value --models default+A.pt,default+B.pt,default \
        --policy results/policies/arith-team-mixed-seed0-softrank.pt --n 300 --seed 0 \
        --out results/refine/mixed-seed0-softrank.json

The game is eval.py's (same prompts and seeds, so its calls come from the generation cache when
the table's piece ran first, and `accuracy` repeats that piece's); the counterfactual REFINE samples
of the agents that did not REFINE are extra calls (the same prompt and seed as the REFINE they
would have made) and change nothing in the game. Rewards: the shaped reward of docs/design.md §4,
no token cost.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

import data
import deliberate
from common import machine, parse_config, write_result
from deliberate import (
    ACTION_KINDS,
    PERSIST,
    REFINE,
    action_kind,
    counterfactual_rewards,
    make_policy,
)
from llm.team import check_models, make_engine, resolve_engine_dtype
from solutions import GameConfig


@dataclass
class Config:
    # the task
    task: str = "arith"
    """arith or split (built-in; split: its values dealt among the agents) or a file task: gsm8k,
    mawps, svamp, mc, math (with --path)"""
    path: str = ""
    """the data file of a file task"""
    level: int = 0
    """arith difficulty 1..4 (0: the task's default, easy)"""
    split_questions: float = 0.5
    """task split: the share of questions whose three values are dealt among the agents (the rest:
    every agent holds every value)"""
    values_held: int = 2
    """task split: how many of a split question's three values each agent holds (1 or 2)"""
    # the game
    seed: int = 0
    """seeds every LLM call (with the question id, agent and round), every sampled action, the
    questions, the data order and the initialization"""
    agents: int = 3
    """agents in the team"""
    rounds: int = 3
    """deliberation rounds after round 0"""
    temperature: float = 0.5
    """the agents' sampling temperature (the temperature study on validation questions)"""
    top_p: float = 1.0
    """nucleus sampling's probability mass"""
    max_new_tokens: int = 192
    """token budget of each LLM call"""
    trailer: bool = False
    """ask for the Steps / Confidence / Answer trailer (it costs the default backbone accuracy)"""
    critic: bool = False
    """run the critic pass: its p(Correct) in the state (always for a policy trained with it)"""
    vote: str = "mean_prob"
    """the vote's tie-break signal, the same for every protocol (solutions.VOTE_RULES)"""
    whole_solutions: bool = False
    """REFINE and the leader read every solution whole (default: REFINE sees peers' final answers
    and its own last 300 characters, the leader each solution's last 300)"""
    # the engine
    model: str = ""
    """HF checkpoint directory of the agents; empty: the embedded default backbone"""
    models: str = ""
    """one model per agent, comma-separated: an HF directory or `default`, + an adapter file
    (train_solver.py, train_magrpo.py) or not, e.g. default+a0.pt,default+a1.pt,default; agents on
    one base share its engine (empty: --model for every agent)"""
    engine_batch_size: int = 128
    """engine slots (sequences decoded together; docs/design.md §11)"""
    cache_dir: str = "cache/generations"
    """the generation cache (empty: off); an identical run a second time makes no LLM call"""
    # the study's own
    policy: str = ""
    """a policy file (train_rl.py / sft.py) or a fixed one: persist | random | ..."""
    split: str = "test"
    """which split's questions"""
    n: int = 300
    """how many questions"""
    dtype: str = "float32"
    """the engine's dtype (the tables' pieces: float32)"""
    out: str = ""
    """the JSON written"""


def gain_over_persist(rows, resamples=10_000, seed=0):
    """rows: (reward of the action taken, reward of PERSIST) per decision -> gain_summary of their
    differences."""
    return gain_summary([taken - persist for taken, persist in rows], resamples, seed)


def gain_summary(gains, resamples=10_000, seed=0):
    """Per-decision gains over PERSIST (one seed's, or several seeds' pooled) -> the mean gain, its
    95% bootstrap interval over decisions, the share of decisions where the action did better, and
    worse, than PERSIST would have, and the gains themselves (to pool over seeds)."""
    if not gains:
        return {"decisions": 0}
    d = np.array(gains, dtype=float)
    means = d[np.random.default_rng(seed).integers(0, len(d), (resamples, len(d)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "decisions": len(d),
        "mean_gain": float(d.mean()),
        "ci95": [float(low), float(high)],
        "better": float((d > 0).mean()),
        "worse": float((d < 0).mean()),
        "gains": d.tolist(),
    }


def decision_values(transcripts):
    """Per kind of action taken: gain_over_persist of those decisions; also what REFINE would have
    gained over PERSIST at every decision, whatever was taken, over all rounds and round by round
    (a first REFINE may pool what a later one only polishes); and the kinds' shares by round."""
    taken = {kind: [] for kind in ACTION_KINDS}
    refine_everywhere, by_round, refine_by_round = [], {}, {}
    for tr in transcripts:
        for t, record in enumerate(tr["rounds"][1:], start=1):
            for action, rewards in zip(record["actions"], record["reward_vectors"]):
                taken[action_kind(action)].append((rewards[action], rewards[PERSIST]))
                refine_everywhere.append((rewards[REFINE], rewards[PERSIST]))
                refine_by_round.setdefault(t, []).append((rewards[REFINE], rewards[PERSIST]))
                counts = by_round.setdefault(t, dict.fromkeys(ACTION_KINDS, 0))
                counts[action_kind(action)] += 1
    total = sum(len(rows) for rows in taken.values()) or 1
    return {
        "decisions": total,
        "shares": {kind: len(rows) / total for kind, rows in taken.items()},
        "shares_by_round": [
            {kind: c / sum(counts.values()) for kind, c in counts.items()}
            for _, counts in sorted(by_round.items())
        ],
        "taken_vs_persist": {kind: gain_over_persist(rows) for kind, rows in taken.items()},
        "refine_at_every_decision_vs_persist": gain_over_persist(refine_everywhere),
        "refine_at_every_decision_by_round": [
            gain_over_persist(rows) for _, rows in sorted(refine_by_round.items())
        ],
    }


def split_and_shared(transcripts):
    """Task split: decision_values over the questions whose values were dealt among the agents
    (their views differ) and over the shared ones, apart (`parts`); other tasks: nothing."""
    if not transcripts or "views" not in transcripts[0]:
        return {}
    parts = {"split": [], "shared": []}
    for tr in transcripts:
        parts["split" if len(set(tr["views"])) > 1 else "shared"].append(tr)
    return {"parts": {part: decision_values(trs) for part, trs in parts.items() if trs}}


def study_setup(cfg):
    """(cfg with its engine dtype resolved, why that dtype, the questions, the engine) of a study
    that plays the test games of --models (or --model) on cfg.split's first cfg.n questions."""
    if cfg.models:
        check_models("--models", cfg.models, cfg.agents, cfg.max_new_tokens)
    cfg, dtype_reason = resolve_engine_dtype(cfg)
    options = data.task_options(cfg)
    examples = data.load_task(cfg.task, split=cfg.split, n=cfg.n, seed=cfg.seed, **options)
    return cfg, dtype_reason, examples, make_engine(cfg, cfg.agents, 0)


def main(cfg):
    cfg, dtype_reason, examples, engine = study_setup(cfg)
    policy = make_policy(cfg.policy)
    games = deliberate.play(engine, examples, policy, GameConfig.of(cfg), refine_all=True)
    transcripts = [game.transcript() for game in games]
    for game in games:
        ex = game.example
        for move, record in zip(game.moves, game.rounds[1:]):
            record["reward_vectors"] = counterfactual_rewards(move, ex.answer, ex.task)
    correct = [tr["rounds"][-1]["correct"] for tr in transcripts]
    return write_result(
        {
            "config": dataclasses.asdict(cfg),
            "machine": machine(),
            "dtype_reason": dtype_reason,
            "questions": len(transcripts),
            "accuracy": sum(correct) / len(correct),
            "question_ids": [tr["id"] for tr in transcripts],
            "correct": correct,
            **decision_values(transcripts),
            **split_and_shared(transcripts),
        },
        cfg.out,
    )


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
