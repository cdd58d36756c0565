"""A study beside train_rl.py (experiments/LOG.md, "Later credit"): stage 2 with each action taken
crediting what the team's vote gains after its round, to the game's end; with --rollouts, the
action an agent did not take, where it tied with REFINE or PERSIST, played on to the end as well.
The change is the corpus, handed to train_rl.train; everything else is train_rl.py's.

    python -m experiments.rl_later_credit --init runs/sft/policy.safetensors --refine-cost 0 \\
        --later-weight 0.5 --rollouts --out-dir runs/later-credit

One round's counterfactual reward is silent on a REFINE whose answer stays while it sets up a
later round; this credit speaks there. It lost (experiments/LOG.md).
"""

from dataclasses import dataclass

from tqdm import tqdm

import train_rl
from common import (
    UsageError,
    check_at_least,
    distributed,
    launch_world_size,
    parse_config,
    user_errors,
)
from deliberate import PERSIST, REFINE, counterfactual_rewards, play, state_rows
from solutions import GameConfig


@dataclass
class Config(train_rl.Config):
    # the study's own: the change from train_rl.py
    later_weight: float = 0.5
    """the action each agent took earns this times what the team's vote gains after its round, to
    the game's end (+1 wrong to right, -1 right to wrong)"""
    rollouts: bool = False
    """where REFINE and PERSIST share a state's best one-round reward before the last round, the one
    the agent did not take is played on to the game's end too (the game again with that action
    forced; the generation cache serves its shared start) and earns --later-weight times its own
    vote gain"""


def later_gain(game, t):
    """What the game's vote gains after round t, to its end: +1 wrong to right, -1 right to
    wrong."""
    return float(game.rounds[-1]["correct"]) - float(game.rounds[t]["correct"])


def tied_states(game, vectors, rounds):
    """The (round, agent, action not taken) of each state of `game` before the last round where the
    agent took REFINE or PERSIST and the other one shares the best one-round reward with it;
    vectors: round -> each agent's reward vector."""
    other = {REFINE: PERSIST, PERSIST: REFINE}
    return [
        (m.round, i, other[a])
        for m in game.moves
        if m.round < rounds
        for i, (a, vector) in enumerate(zip(m.actions, vectors[m.round]))
        if a in other and vector[a] == vector[other[a]] == max(vector)
    ]


def rollout_statistics(rows):
    """What --rollouts found: the share of the corpus's states whose tied action not taken was
    played on, and of those the shares where the REFINE side's game ended right and the PERSIST
    side's wrong, and the other way round (else the two ended alike)."""
    ends = [r["refine_ends_better"] for r in rows if "refine_ends_better" in r]
    n = max(len(ends), 1)
    return {
        "share_of_states": round(len(ends) / len(rows), 4),
        "refine_ends_better": round(sum(e > 0 for e in ends) / n, 4),
        "persist_ends_better": round(sum(e < 0 for e in ends) / n, 4),
    }


# the study's change: stage 2's corpus (train_rl.scored_states with the later credit added)
def later_credit_states(engine, questions, behaviour, cfg, *, ranks, desc):
    """train_rl.scored_states' corpus, the action taken crediting --later-weight times the vote's
    gain after its round, and with --rollouts the tied action not taken crediting its own game's
    gain."""
    games = train_rl.corpus_games(engine, questions, behaviour, cfg, ranks=ranks, desc=desc)
    # per game, round -> each agent's reward vector
    scores = {
        id(g): {
            m.round: counterfactual_rewards(m, g.example.answer, g.example.task) for m in g.moves
        }
        for g in games
    }
    ties = [(g, tie) for g in games for tie in tied_states(g, scores[id(g)], cfg.rounds)]
    for g in games:
        for m in g.moves:
            for vector, action in zip(scores[id(g)][m.round], m.actions):
                vector[action] += cfg.later_weight * later_gain(g, m.round)
    ends = {}  # (game, round, agent) of each rolled-out state -> how its two sides ended
    if cfg.rollouts and ties:
        # the game's seeds: a branch differs from its game by the forced action and what follows
        bar = tqdm(total=cfg.rounds, desc="rollouts", disable=ranks.rank != 0, leave=False)
        examples, forced = [g.example for g, _ in ties], [tie for _, tie in ties]
        branches = play(
            engine,
            examples,
            behaviour,
            GameConfig.of(cfg),
            greedy=False,
            forced=forced,
            progress=bar,
        )
        bar.close()
        for (g, (t, i, action)), branch in zip(ties, branches):
            scores[id(g)][t][i][action] += cfg.later_weight * later_gain(branch, t)
            # +1: the REFINE side of the tie ended the game right and the PERSIST side wrong
            ended = float(branch.rounds[-1]["correct"]) - float(g.rounds[-1]["correct"])
            ends[id(g), t, i] = ended if action == REFINE else -ended

    def fields(g, m):
        rows = []
        for i, vector in enumerate(scores[id(g)][m.round]):
            row = {"rewards": vector}
            if (id(g), m.round, i) in ends:
                row["refine_ends_better"] = ends[id(g), m.round, i]
            rows.append(row)
        return rows

    rows = state_rows(games, fields)
    if cfg.rollouts and ranks.rank == 0:
        print(f"rollouts: {rollout_statistics(rows)}")
    return rows


def check(cfg, world):
    train_rl.check(cfg, world)
    # a negative weight would reward the actions taken before the vote turns wrong
    check_at_least(0, later_weight=cfg.later_weight)
    if cfg.rollouts and cfg.later_weight == 0:
        raise UsageError("--rollouts credits --later-weight times a branch's gain: set it above 0")


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train_rl.train(config, ranks, corpus=later_credit_states)
