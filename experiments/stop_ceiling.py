"""The ceiling of every team-wide rule of when to stop: per question, the best in hindsight of the
team stopping after round 0 (persist) or after 1, 2 or 3 rounds of debate (every agent REFINEs
every round), read from those protocols' tables. A rule that decides for the whole team when to
stop (freeze, a vote-entropy gate, a stopping policy whose agents act as one) can do no better on
those questions; what the oracle gains above it comes from choosing which agents REFINE.

    python -m experiments.stop_ceiling results/tables/split300-team-split-seed{0,1,2}
"""

import argparse

from common import FileRefused, user_errors
from experiments.blind_slices import read_json
from experiments.tables import summary_of
from stats import format_paired, paired_difference, pooled, sample_std

STOPS = ("persist", "debate1", "debate2", "debate")
REFERENCE = "freeze"


def outcomes(path):
    """The summary of an eval.py table of one protocol (its question_ids and correct)."""
    table = read_json(path)
    if not any(isinstance(s, dict) and "question_ids" in s for s in table.values()):
        raise FileRefused(f"{path}: not an eval.py table")
    return summary_of(table)


def best_of(summaries):
    """Per question, right if any of `summaries` (the same questions) is right."""
    ids = summaries[0]["question_ids"]
    right = [dict(zip(s["question_ids"], s["correct"])) for s in summaries]
    if any(set(r) != set(ids) for r in right):
        raise FileRefused("the stopping protocols' tables hold different questions")
    return {"question_ids": ids, "correct": [any(r[q] for r in right) for q in ids]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "prefixes",
        nargs="+",
        help="one per seed: the tables' path before -persist.json, -freeze.json, ...",
    )
    args = parser.parse_args(argv)
    ceiling, reference = {}, {}
    for seed, prefix in enumerate(args.prefixes):
        ceiling[seed] = best_of([outcomes(f"{prefix}-{name}.json") for name in STOPS])
        reference[seed] = outcomes(f"{prefix}-{REFERENCE}.json")
    per_seed = [sum(s["correct"]) / len(s["correct"]) for s in ceiling.values()]
    mine, theirs = pooled(ceiling), pooled(reference)
    print(
        f"the best of {', '.join(STOPS)} per question: "
        f"{sum(mine['correct']) / len(mine['correct']):.3f} ± {sample_std(per_seed):.3f} "
        f"({len(per_seed)} seeds); vs {REFERENCE} {format_paired(paired_difference(mine, theirs))}"
    )


if __name__ == "__main__":
    with user_errors():
        main()
