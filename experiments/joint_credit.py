"""A study beside train_rl.py: credit for the team's joint action. Each agent's counterfactual in
train_rl.py holds its peers at what they did, so a REFINE that pays only when two agents REFINE
together is priced at nothing (relative overgeneralization). Moves within a round are
simultaneous and the corpus draws every agent's REFINE sample, so the round's outcome under every
joint action (K^N: 64 at three agents) is a vote over answers already in hand, no LLM call; from
those outcomes each agent's action values are computed one of three ways (--credit):

    marginal  the expectation over the peers' actions under their behaviour policy (COMA's
              marginal, exact here)
    lenient   the best joint action that contains the agent's action (optimistic)
    shapley   REFINE's Shapley value over coalitions of REFINEs, the other agents PERSISTing;
              PERSIST 0, a CONCEDE what it gains alone from the all-PERSIST round

each in the team's outcome (1 if the vote is right, else 0), a REFINE paying the agent's own
--refine-cost. The change is the corpus, handed to train_rl.train; everything else is train_rl's.

    python -m experiments.joint_credit --init runs/sft/policy.safetensors --credit marginal \\
        --refine-cost 0 --out-dir runs/joint-marginal
"""

import itertools
import math
from dataclasses import dataclass

import torch

import data
import train_rl
from common import check_choice, distributed, launch_world_size, parse_config, user_errors
from deliberate import PERSIST, REFINE, n_actions, outcome, state_rows
from solutions import majority_vote

CREDITS = ("marginal", "lenient", "shapley")


@dataclass
class Config(train_rl.Config):
    # the study's own: the change from train_rl.py
    credit: str = "marginal"
    """marginal | lenient | shapley: how each agent's action values are read from the round's
    outcomes under every joint action"""


def joint_outcomes(move, gold, task):
    """{joint action (one action per agent): 1.0 if the team's vote after it is right, else 0.0}
    over every joint action of `move` (every agent's REFINE sample drawn)."""
    agents = len(move.before)
    outcomes = {}
    for joint in itertools.product(range(n_actions(agents)), repeat=agents):
        team = [outcome(move.before, i, a, move.refined) for i, a in enumerate(joint)]
        outcomes[joint] = float(data.is_correct(majority_vote(team)[0], gold, task))
    return outcomes


def with_action(joint, agent, action):
    return joint[:agent] + (action,) + joint[agent + 1 :]


def marginal_credit(outcomes, agent, peer_probs):
    """Agent `agent`'s value of each action: the team's outcome in expectation over its peers'
    actions, each peer j drawing from peer_probs[j] (agent `agent`'s own entry unread)."""
    k = len(peer_probs[agent])
    values = [0.0] * k
    for joint, won in outcomes.items():
        weight = math.prod(p[a] for j, (p, a) in enumerate(zip(peer_probs, joint)) if j != agent)
        values[joint[agent]] += weight * won
    return values


def lenient_credit(outcomes, agent):
    """Agent `agent`'s value of each action: the team's outcome under the best joint action that
    contains it."""
    values = [0.0] * n_actions(len(next(iter(outcomes))))
    for joint, won in outcomes.items():
        values[joint[agent]] = max(values[joint[agent]], won)
    return values


def shapley_credit(outcomes, agent):
    """Agent `agent`'s value of each action: PERSIST 0; REFINE its Shapley value in the game whose
    coalitions are the agents that REFINE (the rest PERSIST); a CONCEDE what it gains alone from
    the round where every agent PERSISTs."""
    agents = len(next(iter(outcomes)))
    nobody = (PERSIST,) * agents

    def value(coalition):
        return outcomes[tuple(REFINE if j in coalition else PERSIST for j in range(agents))]

    others = [j for j in range(agents) if j != agent]
    refine = 0.0
    for size in range(agents):
        weight = math.factorial(size) * math.factorial(agents - size - 1) / math.factorial(agents)
        for coalition in itertools.combinations(others, size):
            refine += weight * (value({*coalition, agent}) - value(set(coalition)))
    k = n_actions(agents)
    values = [outcomes[with_action(nobody, agent, a)] - outcomes[nobody] for a in range(k)]
    values[PERSIST], values[REFINE] = 0.0, refine
    return values


def credit_vectors(move, gold, task, credit, peer_probs=None):
    """Every agent's credit vector in `move` (--credit), a REFINE paying the agent's own cost
    (move.costs)."""
    outcomes = joint_outcomes(move, gold, task)
    vectors = []
    for i in range(len(move.before)):
        if credit == "marginal":
            vector = marginal_credit(outcomes, i, peer_probs)
        elif credit == "lenient":
            vector = lenient_credit(outcomes, i)
        else:
            vector = shapley_credit(outcomes, i)
        vector[REFINE] -= move.costs[i]
        vectors.append(vector)
    return vectors


def behaviour_probs(behaviour, move):
    """Each agent's action probabilities under the behaviour policy at its observation in `move`."""
    own = torch.tensor([o for o, _ in move.observations], dtype=torch.float32)
    peers = torch.tensor([p for _, p in move.observations], dtype=torch.float32)
    with torch.no_grad():
        logits = behaviour(own, peers, torch.arange(len(move.observations)))
    return torch.softmax(logits, -1).tolist()


# the study's change: stage 2's corpus (train_rl.scored_states with joint credit)
def joint_credit_states(engine, questions, behaviour, cfg, *, ranks, desc):
    """train_rl.scored_states' games, each state's reward vector the agent's --credit from the
    round's outcomes under every joint action."""
    games = train_rl.corpus_games(engine, questions, behaviour, cfg, ranks=ranks, desc=desc)

    def credits(g, m):
        probs = behaviour_probs(behaviour, m) if cfg.credit == "marginal" else None
        vectors = credit_vectors(m, g.example.answer, g.example.task, cfg.credit, probs)
        return [{"rewards": v} for v in vectors]

    return state_rows(games, credits)


def check(cfg, world):
    check_choice("--credit", cfg.credit, CREDITS)
    train_rl.check(cfg, world)


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train_rl.train(config, ranks, corpus=joint_credit_states)
