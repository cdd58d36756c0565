"""The runner behind results/: every reported number is a small committed file, computed once, piece
by piece.

    python -m experiments.run --list            # every piece, done or not
    python -m experiments.run                   # compute what is missing, in order
    python -m experiments.run auroc- --commit   # the pieces whose name starts so; commit each
                                                # when done
    python -m experiments.run --check after-worked-L1-r8-seed0-level1
                                                # rerun a committed eval piece from scratch and
                                                # compare its accuracies with the committed file's

A piece is a command and the files it leaves in results/; it runs only when one of them is missing,
so a rerun skips what is done, and a piece cut off (a session ends, a process is killed) starts
again. Training runs write under runs/results/ (resumable there: a killed run continues from its
checkpoint), then their policy, summary and metrics are copied into results/. Generations are cached
in cache/generations, so a piece that replays games another piece played costs no LLM call.
Weights that left the tree (results/weights.jsonl, experiments/weights.py) count as done, and a
piece's needs among them are restored before it runs. A piece whose code left the tree with its
study (`code_at`: the last commit that holds it, experiments/LOG.md) stays listed with its files,
and runs or is checked only from a worktree at that commit.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine
from experiments import weights
from experiments.piece_kit import outputs
from experiments.pieces import PIECES

ROOT = Path(__file__).resolve().parents[1]


def run_piece(name, piece, commit):
    began = time.time()
    print(f"== {name}: {' '.join(map(str, piece['command']))}", flush=True)
    subprocess.run(piece["command"], check=True)
    for source, target in piece.get("copies", {}).items():
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        weights.keep(Path(source), Path(target))
    log = Path("results/pieces.jsonl")
    with open(log, "a") as f:
        record = {
            "piece": name,
            "outputs": list(map(str, outputs(piece))),
            "machine": machine(),
            "wall_s": round(time.time() - began, 1),
            "finished": time.strftime("%Y-%m-%d %H:%M"),
        }
        f.write(json.dumps(record) + "\n")
    if commit:
        files = [str(p) for p in outputs(piece)] + [str(log)]
        # weights are ignored by .gitignore, so that restored ones are not committed again
        subprocess.run(["git", "add", "--force", *files], check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"results: {name}", "--", *files], check=True)


def code_left(name, piece):
    """Why a piece whose code left the tree with its study runs only at the commit that holds it."""
    return (
        f"{name}: its code left the tree with its study (experiments/LOG.md): run it from a "
        f"worktree at {piece['code_at']} (git worktree add DIR {piece['code_at']})"
    )


def check_piece(name, piece, tolerance):
    """Reruns a committed eval.py piece from scratch (no generation cache, its JSON written to a
    scratch folder) and prints each protocol's accuracy beside the committed one; True when every
    one lies within `tolerance` of it."""
    command = list(map(str, piece["command"]))
    if not any(a.endswith("eval.py") for a in command) or not all(
        p.exists() for p in outputs(piece)
    ):
        sys.exit(f"--check: {name} is not a committed eval.py piece")
    committed = json.loads(Path(command[command.index("--out") + 1]).read_text())
    with tempfile.TemporaryDirectory() as scratch:
        command[command.index("--out") + 1] = str(Path(scratch) / "rerun.json")
        print(f"== {name} (rerun, no cache): {' '.join(command)}", flush=True)
        subprocess.run([*command, "--cache-dir", ""], check=True)
        rerun = json.loads((Path(scratch) / "rerun.json").read_text())
    within = True
    for protocol, mine in rerun.items():
        if not isinstance(mine, dict) or "accuracy" not in mine:
            continue
        theirs = committed[protocol]["accuracy"]
        close = abs(mine["accuracy"] - theirs) <= tolerance
        within &= close
        print(
            f"{name} {protocol}: committed {theirs:.4f}, rerun {mine['accuracy']:.4f} "
            f"({'within' if close else 'NOT within'} {tolerance}; rerun on {rerun['machine']})"
        )
    return within


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "prefixes", nargs="*", help="run only the pieces whose name starts with one of these"
    )
    parser.add_argument(
        "--list", action="store_true", help="list the pieces and whether they are done"
    )
    parser.add_argument(
        "--commit", action="store_true", help="git-commit each piece's files when it is done"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="rerun the chosen committed eval.py pieces without the cache and compare their "
        "accuracies with the committed files' (exit 1 if one differs by more than --tolerance)",
    )
    parser.add_argument("--tolerance", type=float, default=0.02, help="for --check")
    args = parser.parse_args()
    os.chdir(ROOT)  # every path of a piece is relative to the repository
    chosen = {
        name: p
        for name, p in PIECES.items()
        if not args.prefixes or name.startswith(tuple(args.prefixes))
    }
    if not chosen:
        sys.exit(f"no piece starts with {args.prefixes}; pieces: {', '.join(PIECES)}")
    if args.check:
        checked = []
        for name, piece in chosen.items():
            if "code_at" in piece:
                print(f"--check: skipped: {code_left(name, piece)}", file=sys.stderr)
            else:
                checked.append(check_piece(name, piece, args.tolerance))
        if not checked:
            sys.exit("--check: no chosen piece has its code in this tree")
        sys.exit(0 if all(checked) else 1)
    for name, piece in chosen.items():
        # a weight that left the tree (experiments/weights.py) counts as done: it can be restored
        done = all(weights.present(p) for p in outputs(piece))
        if args.list:
            print(f"{'done   ' if done else 'missing'}  {name}")
        elif not done and "code_at" in piece:
            print(f"== skipped: {code_left(name, piece)}", file=sys.stderr)
        elif not done and not all(weights.present(p) for p in piece.get("needs", [])):
            # a policy not trained yet, or LLM weights (out
            # of git: a later session may not have them)
            llm = any(not p.startswith("results/") for p in piece["needs"])
            print(
                f"== {name}: skipped, needs {', '.join(piece['needs'])}: run the piece that writes "
                "it first"
                + (
                    " (LLM weights stay out of git: if that piece is done, delete its results "
                    "file to train again)"
                    if llm
                    else ""
                ),
                file=sys.stderr,
            )
        elif not done:
            for need in piece.get("needs", []):
                if need.startswith("results/"):
                    weights.restore(need)
            run_piece(name, piece, args.commit)


if __name__ == "__main__":
    main()
