"""What going on is worth in the stop credit's corpus (experiments/stop_credit.py), by the shape of
round 0's vote: the debate games of stage 2's training questions, each question's round-0 vote
named by whether it is right and how many agents hold it (3, 2 or 1 of 3), and for each shape how
often the vote is right if the team stops there (PERSIST's value), if it goes on until the --init
policy stops (REFINE's value in the corpus) and if it debates to the last round. Where going on
turns as many wrong votes as it breaks right ones, the team's REFINE is worth PERSIST's and a
policy that cannot tell the two apart has nothing to learn there.

    python -m experiments.stop_corpus --init runs/sft/policy.safetensors --out-dir runs/stop-corpus
"""

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import train_rl
from common import Ranks, machine, parse_config, user_errors
from data import training_questions
from deliberate import load_policy
from experiments.stop_credit import debate_games, going_on, stops, vote_right
from llm.team import make_engine, resolve_engine_dtype
from solutions import majority_vote


@dataclass
class Config(train_rl.Config):
    """train_rl.py's flags (the study's corpus is stop_credit.py's), its --out-dir the folder of
    round0.json."""


def vote_shape(solutions, gold, task):
    """'right-2of3': whether the vote is right, and how many agents hold its answer."""
    answer, _ = majority_vote(solutions)
    held = sum(s.answer == answer for s in solutions) if answer is not None else 0
    right = "right" if vote_right(solutions, gold, task) else "wrong"
    return f"{right}-{held}of{len(solutions)}"


def tally(games, behaviour):
    """{shape: {questions, stop, going on, debate}}: round 0's counts of right votes."""
    counts = {}
    for g in games:
        gold, task = g.example.answer, g.example.task
        stopping = [stops(behaviour, m) for m in g.moves]
        row = counts.setdefault(vote_shape(g.moves[0].before, gold, task), Counter())
        row["questions"] += 1
        row["stop"] += vote_right(g.moves[0].before, gold, task)
        row["going on"] += going_on(g.moves, stopping, gold, task)[0]
        row["debate"] += vote_right(g.moves[-1].after, gold, task)
    return {shape: dict(row) for shape, row in sorted(counts.items())}


if __name__ == "__main__":
    cfg = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(cfg.out_dir):
        train_rl.check(cfg, 1)
        ranks = Ranks(0, 1, "cpu")
        cfg, _ = resolve_engine_dtype(cfg, ranks.device)
        engine = make_engine(cfg, cfg.agents, ranks.rank, ranks.device)
        questions, _ = training_questions(cfg, 0)
        games = debate_games(engine, questions, cfg, ranks=ranks, desc="debate games")
        shapes = tally(games, load_policy(cfg.init))
        out = Path(cfg.out_dir) / "round0.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {"init": cfg.init, "seed": cfg.seed, "machine": machine(), "shapes": shapes},
                indent=1,
            )
        )
        for shape, row in shapes.items():
            print(shape, row)
