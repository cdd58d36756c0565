"""What a student reads to follow each stage, and the three rings the imports keep: the spine's
modules a script imports, transitively (the script included; the library aside), with their
non-blank lines, read from the imports with `ast`.

    python -m experiments.reading_sets          # a table, then each rule: ok or OVER

The rings, imports pointing inward (tests/test_layout.py checks them):
  library  llm/, data/, common.py: the engine, the tasks, the plumbing; imports no spine or lab
  spine    the scripts and the modules they share (solutions.py, deliberate.py, softrank.py,
           stats.py): all a method learns with; imports no lab, and no script imports another
  lab      experiments/: the studies; imports the spine's shared modules and the library
Sizes are advice, never a test: a reading set past about 4 files or 2,000 lines, or a script past
about 600 lines of its own, is worth a second look at its shape.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = (
    "sft.py",
    "train_rl.py",
    "eval.py",
    "train_solver.py",
    "train_magrpo.py",
    "train_mlpo.py",
    "view.py",
)
LIBRARY = ("llm", "data", "common")
ABOUT_FILES, ABOUT_LINES, ABOUT_SCRIPT = 4, 2000, 600


def lines(path):
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def imported(path):
    """The top-level names of every module `path` imports (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def spine_modules():
    """The top-level modules of the repository that are not the library: the spine."""
    return {p.stem for p in ROOT.glob("*.py")} - set(LIBRARY)


def reading_set(script):
    """The script and every spine module it imports, transitively."""
    spine, seen, todo = spine_modules(), set(), [script.removesuffix(".py")]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(imported(ROOT / f"{name}.py") & spine)
    return sorted(seen)


def advice():
    """(what, within) for each size worth a look: every script's reading set and its own lines."""
    size = {name: lines(ROOT / f"{name}.py") for name in spine_modules()}
    notes = []
    for script in SCRIPTS:
        names = reading_set(script)
        total = sum(size[n] for n in names)
        notes.append(
            (f"{script}: {len(names)} files (about {ABOUT_FILES})", len(names) <= ABOUT_FILES)
        )
        notes.append((f"{script}: {total} lines (about {ABOUT_LINES})", total <= ABOUT_LINES))
        own = size[script.removesuffix(".py")]
        notes.append(
            (f"{script}: {own} lines of its own (about {ABOUT_SCRIPT})", own <= ABOUT_SCRIPT)
        )
    return notes


def main():
    size = {name: lines(ROOT / f"{name}.py") for name in spine_modules()}
    print(f"{'script':<17}{'files':>6}{'lines':>7}  reading set (non-blank lines)")
    for script in SCRIPTS:
        names = reading_set(script)
        shown = ", ".join(f"{n}.py ({size[n]})" for n in names)
        print(f"{script:<17}{len(names):>6}{sum(size[n] for n in names):>7}  {shown}")
    print()
    for text, within in advice():
        print(f"{'ok  ' if within else 'look'} {text}")


if __name__ == "__main__":
    main()
