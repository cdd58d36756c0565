"""What a student reads to follow each stage: the project's own top-level modules a script imports,
transitively (the script included; common.py, llm/ and data/ aside, the plumbing and the tasks),
with their non-blank lines, read from the imports with `ast`.

    python experiments/reading_sets.py          # a table, then each limit: ok or OVER

The limits (issue 55): stage 1 (sft.py), stage 2 (train_rl.py) and each LLM-weight trainer
(train_solver.py, train_magrpo.py, train_mlpo.py) at most 3 files and 1,500 lines each;
deliberate.py at most 700, softrank.py 300, every script 500; no top-level module shared by the
scripts besides deliberate.py, softrank.py and common.py.
"""

import ast
import sys
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
# the scripts that train, each read on its own: the limits on its reading set
TRAINERS = ("sft.py", "train_rl.py", "train_solver.py", "train_magrpo.py", "train_mlpo.py")
ASIDE = ("common",)
SHARED = ("deliberate", "softrank", "common")


def lines(path):
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def top_level_imports(path, modules):
    """The project's top-level modules (names in `modules`) that `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split(".")[0]]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def reading_set(script, modules):
    """The script and every top-level module it imports, transitively, but those ASIDE."""
    seen, todo = set(), [script[: -len(".py")]]
    while todo:
        name = todo.pop()
        if name in seen or name in ASIDE:
            continue
        seen.add(name)
        todo += top_level_imports(ROOT / f"{name}.py", modules)
    return sorted(seen)


def main():
    modules = {p.stem for p in ROOT.glob("*.py")}
    sets = {script: reading_set(script, modules) for script in SCRIPTS}
    size = {name: lines(ROOT / f"{name}.py") for name in modules}
    print(f"{'script':<17}{'files':>6}{'lines':>7}  reading set (non-blank lines)")
    for script, names in sets.items():
        total = sum(size[n] for n in names)
        shown = ", ".join(f"{n}.py ({size[n]})" for n in names)
        print(f"{script:<17}{len(names):>6}{total:>7}  {shown}")
    used_by = {n: [s for s in SCRIPTS if n in sets[s] and f"{n}.py" != s] for n in modules}
    used_by["common"] = [s for s in SCRIPTS if "common" in top_level_imports(ROOT / s, modules)]
    shared = sorted(n for n, users in used_by.items() if len(users) > 1 and n not in SHARED)
    checks = [(f"{s}: {len(sets[s])} files <= 3", len(sets[s]) <= 3) for s in TRAINERS]
    checks += [
        (
            f"{s}: {sum(size[n] for n in sets[s])} lines <= 1500",
            sum(size[n] for n in sets[s]) <= 1500,
        )
        for s in TRAINERS
    ]
    checks += [(f"deliberate.py: {size['deliberate']} lines <= 700", size["deliberate"] <= 700)]
    checks += [(f"softrank.py: {size['softrank']} lines <= 300", size["softrank"] <= 300)]
    checks += [(f"{s}: {size[s[:-3]]} lines <= 500", size[s[:-3]] <= 500) for s in SCRIPTS]
    others = sorted(modules - {s[:-3] for s in SCRIPTS} - set(SHARED))
    checks += [(f"top-level modules besides the scripts and {SHARED}: {others}", not others)]
    checks += [(f"modules shared by scripts besides {SHARED}: {shared}", not shared)]
    print()
    for text, ok in checks:
        print(f"{'ok  ' if ok else 'OVER'} {text}")
    return all(ok for _, ok in checks)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
