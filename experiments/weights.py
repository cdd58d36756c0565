"""The lab's weights out of the tree, none lost.

A clone is for reading: the tree keeps the weights `make demo` loads (the Makefile names them),
those the report computes a number from (REPORT_READS) and those a pending piece needs. A finished
study's weights leave it, each file with a row in results/weights.jsonl (its path, sha256, bytes,
the commit that holds it, the piece that trains it), and one command puts any of them back: from
git history where this clone has that commit (sha256 checked), else by running the piece again (its
sha256 compared: training on another CPU kind may round differently). A training log the report
does not read (results/training/*.metrics.jsonl) can leave the same way: retire takes any file a
piece writes.

    python -m experiments.weights list                 # every weight: in the tree, here, or gone
    python -m experiments.weights restore PATH [...]   # a file, or every file under a folder
    python -m experiments.weights retire PATH [...]    # out of the tree: manifest rows, git rm
    python -m experiments.weights check                # weights the tree keeps for no reason

A study's weights leave when its tables are committed: `check` (and tests/lab/test_weights.py) names
every weight in the tree that nothing above loads.
"""

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from common import UsageError, load_tensors, machine, user_errors
from experiments.piece_kit import outputs
from experiments.pieces import PIECES
from experiments.tables import REWARD_SCALE_POLICIES
from llm.team import read_adapter

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "results/weights.jsonl"
WEIGHT_SUFFIXES = (".pt", ".safetensors")
# the report computes the largest weight change between these policies, so it needs their tensors
REPORT_READS = REWARD_SCALE_POLICIES


def git(*args):
    """A git command in the repository; its stdout as bytes (raises on failure)."""
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=True).stdout


def relative(path):
    """A path as the manifest writes it: relative to the repository, without a trailing slash."""
    path = Path(path)
    if path.is_absolute() and path.resolve().is_relative_to(ROOT):
        path = path.resolve().relative_to(ROOT)
    return path.as_posix()


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest():
    """Every file that left the tree: its path -> its row."""
    path = ROOT / MANIFEST
    lines = path.read_text().splitlines() if path.exists() else []
    return {row["path"]: row for row in map(json.loads, filter(str.strip, lines))}


def rows_under(path):
    """The manifest's rows of `path`: the file itself, or every file under the folder."""
    path = relative(path)
    return [row for name, row in manifest().items() if name == path or name.startswith(path + "/")]


def present(path):
    """True when `path` is here, or left the tree and can be restored."""
    return (ROOT / path).exists() or bool(rows_under(path))


def recorded(path, field):
    """A weight's sha256 or bytes (`field`): the file's own where it is here, else the manifest's;
    None when neither has it. The report reads weights through this, so a clone without them
    writes the same tables."""
    here = ROOT / relative(path)
    if here.exists():
        return sha256(here) if field == "sha256" else here.stat().st_size
    row = manifest().get(relative(path))
    return row[field] if row else None


def is_weight(path):
    return Path(path).suffix in WEIGHT_SUFFIXES


def producer(path):
    """The piece whose outputs include `path` (the file, or a folder above it), or None."""
    path = Path(path)
    for name, piece in PIECES.items():
        for out in outputs(piece):
            if path == out or out in path.parents:
                return name
    return None


def keep(source, target):
    """A run's file committed as its piece's target: a PEFT adapter folder or a safetensors policy
    in the .pt form that piece's target has always had (the runner skips a piece whose target
    exists), or as it is where the target is in that form too (a safetensors policy with its
    settings' JSON); anything else (an adapter folder included) copied."""
    if target.suffix == ".pt" and source.is_dir():
        torch.save(read_adapter(source), target)
    elif target.suffix == ".pt" and source.suffix == ".safetensors":
        tensors, settings = load_tensors(source, "policy")
        torch.save({**settings, "state_dict": tensors}, target)
    elif target.suffix == source.suffix == ".safetensors":
        shutil.copyfile(source, target)
        shutil.copyfile(source.with_suffix(".json"), target.with_suffix(".json"))
    elif source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copyfile(source, target)


def rerun_file(path, copies):
    """Writes the file `path` from a finished run of its piece (`copies`: run file -> target),
    through keep() where the target is that file, else copied alone from the run's folder."""
    path = Path(path)
    for source, target in copies.items():
        source, target = ROOT / source, Path(target)
        if path == target and path.suffix == ".pt":
            keep(source, ROOT / path)
            return
        if path == target:
            shutil.copyfile(source, ROOT / path)
            return
        if target in path.parents:
            shutil.copyfile(source / path.relative_to(target), ROOT / path)
            return
    raise UsageError(f"{path}: its piece's run writes no such file")


def is_restored(row):
    here = ROOT / row["path"]
    return here.exists() and sha256(here) == row["sha256"]


def from_history(row):
    """Writes the file from the commit that holds it; False where this clone lacks that commit (a
    shallow clone)."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "blob", f"{row['commit']}:{row['path']}"],
        capture_output=True,
    )
    if found.returncode != 0:
        return False
    if hashlib.sha256(found.stdout).hexdigest() != row["sha256"]:
        raise UsageError(f"{row['path']}: the bytes in {row['commit'][:12]} are not the manifest's")
    here = ROOT / row["path"]
    here.parent.mkdir(parents=True, exist_ok=True)
    here.write_bytes(found.stdout)
    print(f"{row['path']}: restored from commit {row['commit'][:12]}, sha256 equal")
    return True


def by_piece(name, rows):
    """Runs the piece that trained `rows`' files (its own needs restored first) and copies only
    those files out of its run, so the piece's committed results stay as they are; says for each
    file whether its sha256 is the manifest's, and on which CPU each was made."""
    piece = PIECES[name]
    for need in piece.get("needs", []):
        restore(need)
    print(f"== {name}: {' '.join(map(str, piece['command']))}", flush=True)
    subprocess.run(list(map(str, piece["command"])), check=True, cwd=ROOT)
    for row in rows:
        (ROOT / row["path"]).parent.mkdir(parents=True, exist_ok=True)
        rerun_file(row["path"], piece.get("copies", {}))
        mine = sha256(ROOT / row["path"])
        verdict = "equal" if mine == row["sha256"] else f"differs (here {mine[:12]})"
        print(
            f"{row['path']}: restored by running {name} on {machine()}: sha256 {verdict} to the "
            f"manifest's {row['sha256'][:12]} (made on {row.get('machine', 'an unrecorded CPU')})"
        )


def restore(path):
    """Puts back every file of `path` that left the tree and is not here with its sha256: from git
    history where this clone has the commit, else by running its piece. Nothing to do for a file
    in the tree."""
    rows = rows_under(path)
    if not rows and not (ROOT / path).exists():
        raise UsageError(f"{path}: neither in the tree nor in {MANIFEST}")
    rerun = {}
    for row in rows:
        if not is_restored(row) and not from_history(row):
            rerun.setdefault(row["piece"], []).append(row)
    for name, missing in rerun.items():
        by_piece(name, missing)


def piece_machines():
    """piece -> the CPU (or GPU) its last committed run was made on, from results/pieces.jsonl."""
    log = ROOT / "results" / "pieces.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return {r["piece"]: r.get("machine") for r in map(json.loads, filter(str.strip, lines))}


def tracked_files(path):
    """The committed files of `path`, a file or a folder (an adapter's config and weights)."""
    files = [f for f in git("ls-files", "-z", "--", path).decode().split("\0") if f]
    if not files:
        raise UsageError(f"{path}: not in the tree")
    return files


def retire(paths):
    """Takes the files of `paths` (weights, adapter folders; a policy's settings JSON stays, the
    report reads it) out of the tree: a manifest row each, then git rm. Refuses a file with
    uncommitted changes or that no piece trains (a clone could not get it back)."""
    rows = manifest()
    made_on = piece_machines()
    files = [file for path in map(relative, paths) for file in tracked_files(path)]
    reasons = keeping()
    for file in files:
        if reason := reason_kept(file, reasons):
            raise UsageError(f"{file}: the tree keeps it ({reason} loads it)")
        piece = producer(file)
        if piece is None:
            raise UsageError(f"{file}: no piece trains it, so a clone could not restore it")
        if git("status", "--porcelain", "--", file).strip():
            raise UsageError(f"{file}: has uncommitted changes; commit them first")
        commit = git("log", "-1", "--format=%H", "--", file).decode().strip()
        rows[file] = {
            "path": file,
            "sha256": sha256(ROOT / file),
            "bytes": (ROOT / file).stat().st_size,
            "commit": commit,
            "piece": piece,
            "machine": made_on.get(piece),
        }
    (ROOT / MANIFEST).write_text("".join(json.dumps(rows[k]) + "\n" for k in sorted(rows)))
    git("rm", "-q", "--", *files)
    git("add", MANIFEST)
    return files


def demo_weights():
    """The weights `make demo` loads, as the Makefile names them."""
    return set(re.findall(r"results/\w+/[\w.-]+", (ROOT / "Makefile").read_text()))


def pending_needs():
    """What the pieces not done yet need."""
    return {
        need
        for piece in PIECES.values()
        if not all(present(p) for p in outputs(piece))
        for need in piece.get("needs", [])
    }


def tree_weights():
    """The weight files committed under results/."""
    return [f for f in git("ls-files", "-z", "results").decode().split("\0") if is_weight(f)]


def keeping():
    """Why the tree keeps weights: each reason -> the files and folders it names."""
    return {"demo": demo_weights(), "report": set(REPORT_READS), "pending": pending_needs()}


def reason_kept(file, reasons):
    """The first of `reasons` (keeping()) that names `file` or a folder above it, else None."""
    path = Path(file)
    for reason, paths in reasons.items():
        if any(path == Path(p) or Path(p) in path.parents for p in paths):
            return reason
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("list", "restore", "retire", "check"))
    parser.add_argument("paths", nargs="*", help="for restore and retire: files or folders")
    args = parser.parse_args(argv)
    with user_errors():
        if args.command in ("restore", "retire") and not args.paths:
            raise UsageError(f"{args.command}: name the files or folders")
        if args.command == "restore":
            for path in args.paths:
                restore(relative(path))
        elif args.command == "retire":
            files = retire(args.paths)
            print(f"{len(files)} files left the tree (their rows in {MANIFEST}); commit both")
        elif args.command == "list":
            reasons = keeping()
            for file in tree_weights():
                print(f"tree      {file} ({reason_kept(file, reasons) or 'no reason'})")
            for row in manifest().values():
                where = "here" if is_restored(row) else "gone"
                print(f"left,{where} {row['path']} ({row['bytes']:,} bytes; piece {row['piece']})")
        else:
            reasons = keeping()
            unkept = [f for f in tree_weights() if reason_kept(f, reasons) is None]
            for file in unkept:
                print(f"{file}: no demo, report or pending piece loads it: retire it")
            sys.exit(1 if unkept else 0)


if __name__ == "__main__":
    main()
