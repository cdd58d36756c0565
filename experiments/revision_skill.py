"""The revision skill measured directly, whatever a meta-policy does with it: at the first decision
of each test game, every agent's REFINE sample is drawn (the game's prompt and seed), and for each
state class of the agent, from round 0's answers against the gold one,

    own right, a peer wrong | own wrong, a peer right | all wrong | all right

the share of states where REFINE ends right, against PERSIST (its own answer) and against CONCEDE
to the peer its policy would pick (the likeliest of the policy's CONCEDE actions; with no learned
policy, the most confident peer by the vote's signal), with paired 95% intervals over states.

    python -m experiments.revision_skill --models default+A,default+B,default+C --n 300 --seed 0 \
        --policy results/policies/arith-team-varied-seed0-ranks.safetensors \
        [--whole-solutions] --out results/revision/NAME.json

The game is eval.py's (same prompts and seeds: its round 0 comes from the generation cache when a
table piece of the same team and seed ran first); the decisions are the policy's, but only the
first decision's states are scored, so the numbers do not depend on what the policy did next.
"""

import dataclasses
from dataclasses import dataclass

import torch

import data
import deliberate
from common import machine, parse_config, write_result
from deliberate import MetaPolicy, adopted_agent, concede, make_policy, peers_of
from experiments.refine_value import study_setup
from solutions import STEP_RE, GameConfig, steps_check
from stats import paired_difference

STATE_CLASSES = ("own right, a peer wrong", "own wrong, a peer right", "all wrong", "all right")
# what each state's outcome is compared under: REFINE against the two cheaper moves
OUTCOMES = ("refine", "persist", "concede")


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
    policy: str = "persist"
    """the policy that decides (a policy file, or a fixed one) and picks the peer to CONCEDE to"""
    split: str = "test"
    """which split's questions"""
    n: int = 300
    """how many questions"""
    dtype: str = "float32"
    """the engine's dtype (the tables' pieces: float32)"""
    out: str = ""
    """the JSON written"""


def state_class(right, agent):
    """The STATE_CLASSES entry of `agent` in a team whose answers are `right` (one bool each)."""
    peers = [right[j] for j in peers_of(agent, len(right))]
    if right[agent]:
        return STATE_CLASSES[3] if all(peers) else STATE_CLASSES[0]
    return STATE_CLASSES[1] if any(peers) else STATE_CLASSES[2]


def concede_pick(policy, observation, agent, before):
    """The agent `agent` would CONCEDE to: the likeliest CONCEDE of a learned policy on its
    `observation` (own, peers), else the peer whose solution `before` is most confident (the lower
    agent on ties)."""
    peers = peers_of(agent, len(before))
    if isinstance(policy, MetaPolicy):
        own, theirs = (torch.tensor([x]) for x in observation)
        with torch.no_grad():
            logits = policy(own, theirs, torch.tensor([agent]))[0]
        k = int(logits[concede(0) :].argmax())
        return adopted_agent(agent, concede(k), len(before))
    return max(peers, key=lambda j: (before[j].confidence, -j))


def steps_right(text):
    """Whether every step `a op b = c` written on a line of its own in `text` is right (True where
    none is written)."""
    return not STEP_RE.search(text) or steps_check(text)


def pooling(example, agent, move):
    """Task split, a question whose values were dealt: what the agent's REFINE had to pool and
    what it did, a fact counted as stated where a text has it as the question words it: whether
    the peers' first solutions state every value the agent lacks, whether its REFINE states every
    value, and whether every step the REFINE writes is right (so a REFINE that ends wrong is told
    apart: a value no peer gave, a value not taken, a slip of arithmetic, or a wrong expression)."""
    facts = [known for known, _ in example.meta["facts"]]
    lacked = [k for k in range(len(facts)) if k not in example.meta["views"][agent]]
    peers = [move.before[j].text for j in peers_of(agent, len(move.before))]
    text = move.refined[agent].text
    return {
        "peers_state_lacked": all(any(facts[k] in peer for peer in peers) for k in lacked),
        "refine_states_all": all(fact in text for fact in facts),
        "refine_steps_right": steps_right(text),
    }


def first_decisions(games, policy):
    """One row per (game, agent) at the game's first decision: its state class, whether REFINE,
    PERSIST and CONCEDE (to concede_pick) end right, the policy's action and the REFINE call's
    tokens; on a split question (task split) also what its REFINE pooled (`pooling`)."""
    rows = []
    for game in games:
        ex, move = game.example, game.moves[0]

        def right(solution):
            return bool(data.is_correct(solution.answer, ex.answer, ex.task))

        team = [right(s) for s in move.before]
        for i in range(len(move.before)):
            peer = concede_pick(policy, move.observations[i], i, move.before)
            rows.append(
                {
                    "id": f"{ex.id}:{i}",
                    "class": state_class(team, i),
                    "refine": right(move.refined[i]),
                    "persist": team[i],
                    "concede": team[peer],
                    "action": deliberate.action_kind(move.actions[i]),
                    # play(refine_cost=1000): the cost is the REFINE call's tokens
                    "refine_tokens": int(move.costs[i]),
                    # task split: whether the question's values were dealt among the agents
                    **({"dealt": ex.meta["dealt"]} if "dealt" in ex.meta else {}),
                    **(pooling(ex, i, move) if ex.meta.get("dealt") else {}),
                }
            )
    return rows


def skill_table(rows):
    """Per state class (and over all states): how many, each outcome's rate of ending right, and
    REFINE minus PERSIST and minus CONCEDE, paired over the same states."""

    def summary(rows, outcome):
        return {"question_ids": [r["id"] for r in rows], "correct": [r[outcome] for r in rows]}

    table = {}
    for name in (*STATE_CLASSES, "all states"):
        mine = [r for r in rows if name in (r["class"], "all states")]
        if not mine:
            table[name] = {"states": 0}
            continue
        refine = summary(mine, "refine")
        table[name] = {
            "states": len(mine),
            **{f"{o}_right": sum(r[o] for r in mine) / len(mine) for o in OUTCOMES},
            "refine_vs_persist": paired_difference(refine, summary(mine, "persist")),
            "refine_vs_concede": paired_difference(refine, summary(mine, "concede")),
            "refine_tokens": sum(r["refine_tokens"] for r in mine) / len(mine),
        }
    return table


def split_and_shared(rows):
    """Task split: skill_table over the states of the questions whose values were dealt among the
    agents and over those of the shared ones, apart (`parts`); other tasks: nothing."""
    if not rows or "dealt" not in rows[0]:
        return {}
    parts = {
        "split": [r for r in rows if r["dealt"]],
        "shared": [r for r in rows if not r["dealt"]],
    }
    return {"parts": {part: skill_table(mine) for part, mine in parts.items() if mine}}


def main(cfg):
    cfg, dtype_reason, examples, engine = study_setup(cfg)
    policy = make_policy(cfg.policy)
    # one decision round: the first decision reads the same state whatever --rounds says
    first = dataclasses.replace(GameConfig.of(cfg), rounds=1)
    games = deliberate.play(engine, examples, policy, first, refine_all=True, refine_cost=1000.0)
    rows = first_decisions(games, policy)
    return write_result(
        {
            "config": dataclasses.asdict(cfg),
            "machine": machine(),
            "dtype_reason": dtype_reason,
            "questions": len(games),
            "table": skill_table(rows),
            **split_and_shared(rows),
            "rows": rows,
        },
        cfg.out,
    )


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
