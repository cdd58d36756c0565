"""A study beside train_rl.py: credit for the team's joint REFINE to the game's end, read from
debate games, no LLM call beyond them. Every credit before this one priced a round by the vote
after it, while on a wrong 2-1 majority the vote turns a round or two later. A debate game (every
agent REFINEs every round) holds, at each decision round t, the vote the team stops with if it
stops there (the answers entering t) and the vote of every later round; so what going on is worth
under the current policy is in hand: the vote of the first later round where the policy, reading
the debate game's states, has every agent PERSIST (the game's end), else the last round's. Each
agent's state at round t gets the team's values:

    PERSIST             the vote entering t (the team stops)
    REFINE              the vote where the team, going on, stops, less the agent's own --refine-cost
    CONCEDE to peer j   the vote entering t with the agent's solution replaced by j's (then stops)

each 1 if the vote is right, else 0: credit for the team's joint action (the agents act as one,
which the per-agent counterfactual cannot price), to the game's end. The change is the corpus,
handed to train_rl.train; everything else is train_rl's.

    python -m experiments.stop_credit --init runs/sft/policy.safetensors --refine-cost 0.1 \\
        --out-dir runs/stop-credit
"""

from dataclasses import dataclass

import torch

import data
import train_rl
from common import distributed, launch_world_size, parse_config, user_errors
from deliberate import (
    PERSIST,
    REFINE,
    FixedPolicy,
    adopted_agent,
    n_actions,
    play_shard,
    state_rows,
)
from experiments.joint_credit import behaviour_probs
from solutions import GameConfig, majority_vote


@dataclass
class Config(train_rl.Config):
    """train_rl.py's flags, unchanged: the study's change is the corpus alone."""


def vote_right(solutions, gold, task):
    return float(data.is_correct(majority_vote(solutions)[0], gold, task))


def stops(behaviour, move):
    """Whether the behaviour policy's greedy actions at `move`'s states are all PERSIST (the game
    ends there)."""
    probs = torch.tensor(behaviour_probs(behaviour, move))
    return bool((probs.argmax(-1) == PERSIST).all())


def going_on(moves, stopping, gold, task):
    """For each decision round of a debate game (its moves), the vote the team ends with if it
    REFINEs there and then plays on: the answers entering the first later round where
    stopping[u] holds, else the last round's answers."""
    values = []
    for t in range(len(moves)):
        later = [u for u in range(t + 1, len(moves)) if stopping[u]]
        end = moves[later[0]].before if later else moves[-1].after
        values.append(vote_right(end, gold, task))
    return values


def stop_credit_vectors(move, going_on_value, gold, task):
    """Every agent's values at `move` (module docstring), a REFINE paying the agent's own cost
    (move.costs)."""
    agents = len(move.before)
    stop = vote_right(move.before, gold, task)
    vectors = []
    for i in range(agents):
        vector = [0.0] * n_actions(agents)
        vector[PERSIST] = stop
        vector[REFINE] = going_on_value - move.costs[i]
        for a in range(REFINE + 1, n_actions(agents)):
            team = list(move.before)
            team[i] = move.before[adopted_agent(i, a, agents)]
            vector[a] = vote_right(team, gold, task)
        vectors.append(vector)
    return vectors


def debate_games(engine, questions, cfg, *, ranks, desc):
    """Debate games of this rank's questions: every agent REFINEs every round, each REFINE drawn
    and paying --refine-cost."""
    return play_shard(
        engine,
        questions,
        FixedPolicy("refine"),
        GameConfig.of(cfg),
        ranks=ranks,
        desc=desc,
        refine_all=True,
        refine_cost=cfg.refine_cost,
    )


# the study's change: stage 2's corpus (debate games, each state's rewards the team's to the end)
def stop_credit_states(engine, questions, behaviour, cfg, *, ranks, desc):
    """Debate games of this rank's questions, each agent's state with its stop_credit_vectors from
    the behaviour policy's later stops."""
    games = debate_games(engine, questions, cfg, ranks=ranks, desc=desc)
    values = {}
    for g in games:
        gold, task = g.example.answer, g.example.task
        stopping = [stops(behaviour, m) for m in g.moves]
        for m, value in zip(g.moves, going_on(g.moves, stopping, gold, task), strict=True):
            values[id(m)] = value

    def credits(g, m):
        vectors = stop_credit_vectors(m, values[id(m)], g.example.answer, g.example.task)
        return [{"rewards": v} for v in vectors]

    return state_rows(games, credits)


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        train_rl.check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train_rl.train(config, ranks, corpus=stop_credit_states)
