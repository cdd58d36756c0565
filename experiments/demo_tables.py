"""`make demo`'s tables beside the committed figures: each protocol the demo plays on its 32
questions, with the same protocol's accuracy over the committed full-size tables (3 seeds x 300
test questions, results/tables/), so that a demo's noise is not read as the result.

    python -m experiments.demo_tables runs/demo/results.json arith
    python -m experiments.demo_tables runs/demo/competent.json competent
    python -m experiments.demo_tables runs/demo/split.json split
"""

import argparse
import json
from pathlib import Path

from experiments.tables import by_seed, mean, sample_std

# regime -> (the full-size tables' prefix, {the demo's protocol: the committed table's part})
COMMITTED = {
    "arith": (
        "arith300",
        {
            "vanilla": "vanilla",
            "mpdf-persist": "persist",
            "sc": "sc",
            "mpdf=results/policies/arith-seed0-softrank.safetensors": "softrank",
        },
    ),
    "competent": (
        "arith300-team-varied",
        {
            "vanilla": "vanilla-m0",
            "mpdf-persist": "persist",
            "mpdf=results/policies/arith-team-varied-seed0-ranks.safetensors": "ranks",
        },
    ),
    "split": (
        "split300-team-split",
        {
            "alone": "alone-m0",
            "mpdf-persist": "persist",
            "mpdf=results/policies/split300-team-split-seed0-softrank.safetensors": "softrank",
        },
    ),
}


def committed_figure(regime, protocol):
    """The committed accuracy of the demo's `protocol` in `regime`: 'mean ± sample std (seeds x
    questions)', or why there is none (the demo's own policies have no full-size table)."""
    prefix, parts = COMMITTED[regime]
    if protocol not in parts:
        return "none: no full-size table"
    runs = by_seed(prefix, parts[protocol])
    if not runs:
        return "not computed"
    accuracy = [s["accuracy"] for s in runs.values()]
    n = next(iter(runs.values()))["n"]
    spread = f" ± {sample_std(accuracy):.3f}" if len(accuracy) > 1 else ""
    return f"{mean(accuracy):.3f}{spread} ({len(accuracy)} × {n})"


def table(run, regime):
    """The demo's eval.py JSON as a table: each protocol's accuracy on the demo's questions and
    its committed figure."""
    protocols = {k: s for k, s in run.items() if isinstance(s, dict) and "accuracy" in s}
    n = next(iter(protocols.values()))["n"]
    width = max(len(name) for name in protocols) + 2
    lines = [f"{'protocol':<{width}}{f'demo, {n} q.':>14}   committed: mean ± std (seeds × q.)"]
    for name, s in protocols.items():
        lines.append(f"{name:<{width}}{s['accuracy']:>14.3f}   {committed_figure(regime, name)}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a demo's eval.py JSON (runs/demo/*.json)")
    parser.add_argument("regime", choices=tuple(COMMITTED), help="which of the demo's tables")
    args = parser.parse_args()
    print(table(json.loads(Path(args.results).read_text()), args.regime))
