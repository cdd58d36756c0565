"""Where a rule is blind: each protocol's accuracy and tokens on two slices of the questions, named
by round 0 of the team's games:
  unanimous-wrong  every agent's round-0 answer the same, and wrong: freeze ("REFINE while the team
                   disagrees") stops there by construction;
  majority-wrong   the round-0 vote wrong and held by a majority short of every agent (2-1 at three
                   agents), where the learned policies lost to freeze.
Every team protocol of a table plays the same round 0 (same prompts, same seeds), so one game per
question names its slice: `round0` plays the team's vote (mpdf-persist, round 0 alone) with eval.py
and keeps only the slices' question ids, a small file; `show` reads every protocol's per-question
outcomes (eval.py's question_ids, correct, question_tokens, kept with --no-details too) from the
tables of those questions, several seeds pooled.

    python -m experiments.blind_slices round0 --out results/slices/split-seed0.json -- \
        --task split --seed 0 --split test --n 300 ...
    python -m experiments.blind_slices show results/slices/split-seed0.json \
        results/tables/split-seed0-*.json
"""

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common import FileRefused, user_errors

ROOT = Path(__file__).resolve().parents[1]
SLICES = ("unanimous-wrong", "majority-wrong")
REFERENCE = "mpdf-persist"


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


def members(games):
    """{slice: [question ids]} of eval.py transcripts (one game per question)."""
    named = {name: [] for name in SLICES}
    for g in games:
        name = round0_slice(g["rounds"][0])
        if name is not None:
            named[name].append(g["id"])
    return named


@dataclass
class SliceFigure:
    n: int
    accuracy: float
    tokens: float


def slice_figures(pairs):
    """{protocol: {slice: SliceFigure}} pooled over `pairs`, each (slices file, tables of its
    questions): each protocol's per-question outcomes (its summary's question_ids, correct,
    question_tokens) on the slices' questions. Raises FileRefused where a table lacks one of
    them."""
    outcomes = {}
    for named, tables in pairs:
        for path, table in tables:
            for protocol, summary in table.items():
                if not isinstance(summary, dict) or "question_ids" not in summary:
                    continue
                played = dict(
                    zip(
                        summary["question_ids"],
                        zip(summary["correct"], summary["question_tokens"], strict=True),
                        strict=True,
                    )
                )
                for name in SLICES:
                    missing = [q for q in named["slices"][name] if q not in played]
                    if missing:
                        raise FileRefused(
                            f"{path}: {protocol} did not play {missing[0]} of {named['path']}"
                        )
                    got = outcomes.setdefault(protocol, {}).setdefault(name, [])
                    got += [played[q] for q in named["slices"][name]]
    return {
        protocol: {
            name: SliceFigure(
                n=len(games),
                accuracy=sum(right for right, _ in games) / len(games) if games else 0.0,
                tokens=sum(tokens for _, tokens in games) / len(games) if games else 0.0,
            )
            for name, games in by_slice.items()
        }
        for protocol, by_slice in outcomes.items()
    }


# a table's header cells for the slices, and one protocol's cells under them
SLICE_HEAD = " | ".join(f"{s}: n, accuracy, tokens/q" for s in SLICES)


def slice_cells(by_slice):
    return " | ".join(
        f"{f.n}, {f.accuracy:.3f}, {f.tokens:.0f}" if f.n else "0, -, -"
        for f in (by_slice[s] for s in SLICES)
    )


def slice_table(figures):
    """A markdown table: a row per protocol, accuracy and tokens per question on each slice."""
    lines = [f"| protocol | {SLICE_HEAD} |", "|---|" + "---|" * len(SLICES)]
    lines += [f"| {protocol} | {slice_cells(f)} |" for protocol, f in figures.items()]
    return "\n".join(lines)


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise FileRefused(f"{path}: not a JSON file ({error})") from None


def round0(out, eval_flags):
    """Plays the team's round 0 (eval.py, REFERENCE, transcripts kept in a scratch folder) and
    writes the slices' question ids to `out` with the eval settings that name them."""
    with tempfile.TemporaryDirectory() as scratch:
        played = Path(scratch) / "round0.json"
        command = [sys.executable, str(ROOT / "eval.py"), *eval_flags]
        command += ["--protocols", REFERENCE, "--out", str(played)]
        subprocess.run(command, check=True)
        table = read_json(played)
    if not table.get("details"):
        raise FileRefused(f"{' '.join(eval_flags)}: eval.py kept no transcripts (--no-details)")
    record = {"reference": REFERENCE, "config": table["config"]}
    record["slices"] = members(table["details"][REFERENCE])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    counts = ", ".join(f"{name} {len(ids)}" for name, ids in record["slices"].items())
    print(f"{out}: {counts} of {len(table['details'][REFERENCE])} questions")


def show(paths):
    """The slices files among `paths` and the tables after each (those of its questions)."""
    pairs = []
    for path in paths:
        data = read_json(path)
        if "slices" in data:
            pairs.append((data | {"path": path}, []))
        elif not pairs:
            raise FileRefused(f"{path}: a table before any slices file (round0's output)")
        else:
            pairs[-1][1].append((path, data))
    print(slice_table(slice_figures(pairs)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    first = commands.add_parser("round0", help="name the slices' questions from the team's round 0")
    first.add_argument("--out", required=True, help="the slices file to write (JSON)")
    first.add_argument("eval_flags", nargs="+", help="eval.py's flags for the questions, after --")
    figures = commands.add_parser("show", help="each protocol's accuracy and tokens on the slices")
    figures.add_argument(
        "paths", nargs="+", help="a slices file, then the eval.py tables of its questions; repeat"
    )
    args = parser.parse_args(argv)
    if args.command == "round0":
        round0(args.out, args.eval_flags)
    else:
        show(args.paths)


if __name__ == "__main__":
    with user_errors():
        main()
