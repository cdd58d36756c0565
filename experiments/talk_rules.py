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

import rules
from common import machine

GAMES = Path("runs/rules")


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
                "features": rules.round0_features(first["answers"], mean_probs),
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
    gate = {"threshold": rules.best_threshold(entropy, vote, debate)}
    features = [r["features"] for r in rows]
    trigger = rules.fit_trigger(features, [d and not v for v, d in zip(vote, debate)])
    scores = [rules.trigger_score(x, trigger) for x in features]
    trigger |= {
        "features": list(rules.TRIGGER_FEATURES),
        "threshold": rules.best_threshold(scores, vote, debate),
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
