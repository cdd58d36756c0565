"""Where a rule is blind: each protocol's accuracy and tokens on two slices of the questions, read
from round 0 of the games that eval.py keeps with --details (the default):
  unanimous-wrong  every agent's round-0 answer the same, and wrong: freeze ("REFINE while the team
                   disagrees") stops there by construction;
  majority-wrong   the round-0 vote wrong and held by a majority short of every agent (2-1 at three
                   agents), where the learned policies lost to freeze.
A question's slice is read from the reference protocol's round 0 (every team protocol of a table
plays the same round 0: same prompts, same seeds; one whose round 0 differs is named). Several
tables (seeds) are pooled.

    python -m experiments.blind_slices runs/split-seed0.json runs/split-seed1.json \
        --reference mpdf-persist
"""

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common import FileRefused, user_errors

SLICES = ("unanimous-wrong", "majority-wrong")


def round0_slice(first):
    """The slice of a question from its game's round 0 (a transcript's rounds[0]: the agents'
    answers and the vote's correctness), or None where it is in neither."""
    if first["correct"]:
        return None
    counts = Counter(map(str, first["answers"]))
    held = counts.most_common(1)[0][1]
    if held == len(first["answers"]):
        return "unanimous-wrong"
    return "majority-wrong" if held > 1 else None


@dataclass
class SliceFigure:
    n: int
    accuracy: float
    tokens: float


def slice_figures(tables, reference):
    """{protocol: {slice: SliceFigure}} pooled over `tables` (eval.py JSONs with details); the
    questions of each slice read from `reference`'s round 0. Raises FileRefused where a table
    keeps no transcripts or lacks the reference."""
    records = {}
    for path, table in tables:
        details = table.get("details")
        if not details:
            raise FileRefused(f"{path}: no transcripts (eval.py ran with --no-details)")
        if reference not in details:
            raise FileRefused(f"{path}: no protocol {reference} (it has {', '.join(details)})")
        sliced = {g["id"]: round0_slice(g["rounds"][0]) for g in details[reference]}
        first = {g["id"]: g["rounds"][0]["answers"] for g in details[reference]}
        for protocol, games in details.items():
            for g in games:
                # a one-agent protocol (alone, vanilla) plays no team round 0 to compare
                answers = g.get("rounds", [{}])[0].get("answers")
                team = answers is not None and len(answers) == len(first[g["id"]])
                if team and answers != first[g["id"]]:
                    print(
                        f"{path}: {protocol} played another round 0 on {g['id']}", file=sys.stderr
                    )
                if sliced[g["id"]] is not None:
                    records.setdefault(protocol, {}).setdefault(sliced[g["id"]], []).append(g)
    return {
        protocol: {
            name: SliceFigure(
                n=len(games),
                accuracy=sum(g["correct"] for g in games) / len(games),
                tokens=sum(g["tokens"] for g in games) / len(games),
            )
            for name, games in by_slice.items()
        }
        for protocol, by_slice in records.items()
    }


def slice_table(figures):
    """A markdown table: a row per protocol, accuracy and tokens per question on each slice."""
    head = " | ".join(f"{s}: n, accuracy, tokens/q" for s in SLICES)
    lines = [f"| protocol | {head} |", "|---|" + "---|" * len(SLICES)]
    for protocol, by_slice in figures.items():
        cells = []
        for s in SLICES:
            f = by_slice.get(s)
            cells.append(f"{f.n}, {f.accuracy:.3f}, {f.tokens:.0f}" if f else "0, -, -")
        lines.append(f"| {protocol} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", help="eval.py JSON files kept with their transcripts")
    parser.add_argument(
        "--reference", default="mpdf-persist", help="the protocol whose round 0 names the slices"
    )
    args = parser.parse_args(argv)
    tables = []
    for path in args.tables:
        try:
            tables.append((path, json.loads(Path(path).read_text())))
        except (OSError, ValueError) as error:
            raise FileRefused(f"{path}: not an eval.py JSON file ({error})") from None
    print(slice_table(slice_figures(tables, args.reference)))


if __name__ == "__main__":
    with user_errors():
        main()
