"""The gate and the trigger of rules.py, fitted on validation questions: debate's games on the
seed's validation questions (eval.py, its transcripts kept under runs/rules/), then, from each
game's round-0 state and whether debate turned the vote right, the entropy threshold and the
logistic regression with its threshold, each the most accurate gated play on those questions. One
JSON (results/rules/NAME.json), which eval.py's gate=PATH and trigger=PATH read as data.

    python -m experiments.talk_rules --out results/rules/split-team-split-seed0.json -- \
        --task split --split val --n 200 --seed 0 ...     # eval.py's flags: the game, the questions
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import rules
from common import machine

GAMES = Path("runs/rules")


def fit_trigger(features, labels, l2=1.0, steps=50):
    """A logistic regression of `labels` (0/1) on `features` (standardized; their mean and scale
    kept), by Newton's method with an L2 penalty on the weights (the optimum is unique, and a
    feature that separates the labels does not diverge). Labels all alike leave nothing to learn:
    every weight and the bias stay 0, every score 0.5."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    penalty = np.diag([l2] * (z.shape[1] - 1) + [0.0])
    for _ in range(steps if 0 < y.sum() < len(y) else 0):
        p = 1 / (1 + np.exp(-z @ w))
        gradient = z.T @ (p - y) + penalty @ w
        hessian = z.T @ (z * (p * (1 - p))[:, None]) + penalty
        w -= np.linalg.solve(hessian, gradient)
    return {
        "mean": mean.tolist(),
        "scale": scale.tolist(),
        "weights": w[:-1].tolist(),
        "bias": float(w[-1]),
    }


def best_threshold(scores, vote_right, debate_right):
    """The threshold on `scores` whose gated play (debate where the score exceeds it, else the
    vote) is right most often on these questions; on a tie the highest, which debates least."""
    scores = np.asarray(scores, dtype=np.float64)
    gain = np.asarray(debate_right, dtype=np.float64) - np.asarray(vote_right, dtype=np.float64)
    # below every score: debate everywhere
    candidates = np.concatenate([[scores.min() - 1.0], np.unique(scores)])
    right = [gain[scores > c].sum() for c in candidates]
    best = max(right)
    return float(max(c for c, r in zip(candidates, right) if r == best))


def validation_rows(transcripts):
    """Per question of debate's games: the trigger's features of the round-0 state, and whether the
    round-0 vote and debate's final vote are right."""
    rows = []
    for game in transcripts:
        first = game["rounds"][0]
        mean_probs = [signals["mean_prob"] for signals in first["signals"]]
        rows.append(
            {
                "id": game["id"],
                "features": rules.round0_features(first["answers"], mean_probs, first["vote"]),
                "vote_right": bool(first["correct"]),
                "debate_right": bool(game["correct"]),
            }
        )
    return rows


def gated_accuracy(debates, rows):
    """Accuracy of the play that debates where `debates` says, else keeps the round-0 vote."""
    return sum(r["debate_right"] if d else r["vote_right"] for d, r in zip(debates, rows)) / len(
        rows
    )


def fit(rows):
    """The gate's entropy threshold, and the trigger (a logistic regression whose label is
    'debate turns a wrong vote right') with its threshold; each threshold the most accurate on
    `rows`; and what each does on them."""
    vote = [r["vote_right"] for r in rows]
    debate = [r["debate_right"] for r in rows]
    entropy = [r["features"][rules.TRIGGER_FEATURES.index("entropy")] for r in rows]
    gate = {"threshold": best_threshold(entropy, vote, debate)}
    features = [r["features"] for r in rows]
    trigger = fit_trigger(features, [d and not v for v, d in zip(vote, debate)])
    scores = [rules.trigger_score(x, trigger) for x in features]
    trigger |= {
        "features": list(rules.TRIGGER_FEATURES),
        "threshold": best_threshold(scores, vote, debate),
    }
    debates = {
        "gate": [h > gate["threshold"] for h in entropy],
        "trigger": [s > trigger["threshold"] for s in scores],
    }
    validation = {
        "questions": len(rows),
        "vote_accuracy": sum(vote) / len(rows),
        "debate_accuracy": sum(debate) / len(rows),
        **{f"{k}_accuracy": gated_accuracy(d, rows) for k, d in debates.items()},
        **{f"{k}_debated": sum(d) / len(rows) for k, d in debates.items()},
    }
    return gate, trigger, validation


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the fitted rules' JSON")
    parser.add_argument("eval_flags", nargs=argparse.REMAINDER, help="-- then eval.py's flags")
    args = parser.parse_args(argv)
    flags = args.eval_flags[1:] if args.eval_flags[:1] == ["--"] else args.eval_flags
    games = GAMES / f"{Path(args.out).stem}-debate.json"
    command = [sys.executable, "eval.py", *flags, "--protocols", "debate", "--out", str(games)]
    subprocess.run(command, check=True)
    transcripts = json.loads(games.read_text())["details"]["debate"]
    rows = validation_rows(transcripts)
    gate, trigger, validation = fit(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fitted = {
        "gate": gate,
        "trigger": trigger,
        "validation": validation,
        "eval_flags": flags,
        "machine": machine(),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(fitted, indent=1) + "\n")
    print(json.dumps(validation))


if __name__ == "__main__":
    main()
