"""Mutation testing, one module of the method or of its plumbing at a time.

mutmut makes many small edits of a module's code (a mutant each: `<` for `<=`, `i` for `i + 1`, a
dropped argument), and runs the tests that reach the edited function against each one. A mutant the
tests still pass has *survived*: the code could mean something else and nothing would notice. Each
survivor gets a test that kills it, or is marked equivalent with the reason the edit cannot change
any result (experiments/equivalent_mutants.json). A development tool, run outside `make test` and
outside requirements.txt:

    pip install mutmut==3.3.1
    python -m experiments.mutation deliberate  # -> results/mutation/deliberate.json
    python -m experiments.mutation --list      # the modules and the tests that cover each

Each run works in a fresh scratch copy of the repository, runs/mutation/<module>/ (`mutmut browse`
there shows every mutant), with one test process at a time (--max-children) next to other work.
mutmut 3 mutates the code inside functions and methods, never a decorated one (its trampolines
cannot wrap them) nor module-level constants: the JSON lists the functions left out.
"""

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from difflib import unified_diff
from pathlib import Path

from experiments.mutation_modules import MODULES, STAGE_FUNCTIONS, mutated_source

ROOT = Path(__file__).resolve().parents[1]

VERSION = "3.3.1"
# `mutmut run` under pytest 9: mutmut 3.3.1 records each test by `item._nodeid`, which pytest 9 no
# longer has (its public name is `nodeid`)
SHIM = """import sys
from _pytest.nodes import Node
if not hasattr(Node, "_nodeid"):
    Node._nodeid = property(lambda self: self.nodeid)
from mutmut.__main__ import cli
cli(sys.argv[1:])
"""
# mutants reviewed as equivalent, with the reason each edit cannot change a result: a data file,
# since the review grows with every module
REVIEW = Path(__file__).with_name("equivalent_mutants.json")


def equivalent_mutants(module):
    """{mutant name: why no test can tell it from the code} of `module`'s reviewed mutants."""
    review = json.loads(REVIEW.read_text())
    reasons = review["reasons"]
    return {name: reasons.get(why, why) for name, why in review["mutants"].get(module, {}).items()}


def scratch_copy(module, path, tests, deselect):
    """runs/mutation/<module>/: the repository's files (tracked and new, not ignored) and a
    setup.cfg that tells mutmut what to mutate and which tests to run."""
    work = ROOT / "runs" / "mutation" / module
    if work.exists():
        shutil.rmtree(work)
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    write_setup(work, path, tests, deselect)
    return work


def write_setup(work, path, tests, deselect):
    """`work`/setup.cfg: what mutmut mutates, the tests it runs and what it copies beside them."""
    # mutmut copies these next to the mutated module: every top-level file and folder, the folders
    # that hold the module entry by entry (never the module itself: it would overwrite the mutants)
    siblings, folder = [], work
    for part in Path(path).parts:
        siblings += [str(p.relative_to(work)) for p in sorted(folder.iterdir()) if p.name != part]
        folder = folder / part
    addopts = "-p no:cacheprovider" + (f' -k "not ({" or ".join(deselect)})"' if deselect else "")
    lines = ["[mutmut]", f"paths_to_mutate = {path}", "tests_dir ="]
    lines += [f"    {t}" for t in tests] + ["also_copy ="] + [f"    {s}" for s in siblings]
    lines += ["", "[tool:pytest]", f"addopts = {addopts}", ""]
    (work / "setup.cfg").write_text("\n".join(lines))


def decorated_functions(path):
    """The functions and methods mutmut 3 leaves alone: those with a decorator."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found += [
                f"{node.name}.{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef) and f.decorator_list
            ]
    found += [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.decorator_list]
    return found


def read_results(work, path):
    """{mutant: (status, diff)} from mutmut's record of the run, in the scratch copy."""
    import libcst
    import mutmut
    import mutmut.__main__ as cli

    os.chdir(work)
    mutmut.config = cli.load_config()
    codes = json.loads((work / "mutants" / f"{path}.meta").read_text())["exit_code_by_key"]
    # parsed once: mutmut's get_diff_for_mutant parses the whole mutated file (every mutant of the
    # module, 1.9 MB for deliberate.py) on each call, minutes per diff on two busy cores
    module = cli.read_mutants_module(path)
    results = {}
    for name, code in sorted(codes.items()):
        status = cli.status_by_exit_code.get(code, f"exit {code}")
        diff = ""
        if status != "killed":
            original, mutant = (
                libcst.Module([read(module, name)]).code.strip().split("\n")
                for read in (cli.read_original_function, cli.read_mutant_function)
            )
            diff = "\n".join(unified_diff(original, mutant, path, path, lineterm=""))
        results[name] = (status, diff)
    os.chdir(ROOT)
    return results


def rerun_with_current_tests(work, path, tests, deselect):
    """Runs the survivors and the timeouts of the finished run in `work` again against the
    repository's current tests (copied in, the module's test files as MODULES lists them now),
    keeping every other mutant's result (a timeout on a loaded machine is no detection; a mutant
    that --only left out stays unchecked): tests added for the survivors can only kill more, as
    long as the module is
    unchanged and no test was taken away (the module and the test files' presence are checked).
    Which tests reach which function is recorded anew (a test changed to reach a survivor's
    function counts). mutmut rewrites its record for a run of named mutants, so the earlier
    results are put back around the new ones."""
    import mutmut.__main__ as cli

    meta = work / "mutants" / f"{path}.meta"
    if not meta.is_file():
        sys.exit(f"--rerun-survivors: no finished mutmut run in {work}")
    if (work / path).read_bytes() != (ROOT / path).read_bytes():
        sys.exit(f"--rerun-survivors: {path} changed since the run in {work}: run it whole")
    for old in (work / "tests").glob("*.py"):
        if not (ROOT / "tests" / old.name).is_file():
            sys.exit(f"--rerun-survivors: tests/{old.name} is gone since the run: run it whole")
    before = json.loads(meta.read_text())["exit_code_by_key"]
    again = [
        name
        for name, code in before.items()
        if cli.status_by_exit_code.get(code) not in ("killed", "not checked")
    ]
    if not again:
        # `mutmut run` without names would run every mutant
        sys.exit(f"--rerun-survivors: the run in {work} left no survivor nor timeout")
    for folder in (work / "tests", work / "mutants" / "tests"):
        shutil.copytree(ROOT / "tests", folder, dirs_exist_ok=True)
    write_setup(work, path, tests, deselect)
    (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    env = mutant_env(work)
    with open(work.parent / f"{work.name}-rerun.log", "w") as f:
        subprocess.run(
            [sys.executable, "-c", SHIM, "run", "--max-children", "1", *again],
            cwd=work, stdout=f, stderr=subprocess.STDOUT, env=env, check=True,
        )  # fmt: skip
    after = json.loads(meta.read_text())
    after["exit_code_by_key"] = before | {name: after["exit_code_by_key"][name] for name in again}
    meta.write_text(json.dumps(after))
    # what was rerun, for the summary (also of a later --summarize-only); a whole run starts over
    (work / "rerun.json").write_text(json.dumps(again))
    return again


def mutant_env(work):
    """The environment the mutants run in: one thread, offline, and a model cache of the run's own
    (a copy of the converted default model), so that a mutant of the backbone's conversion or of
    its dtype probe writes there, never into the user's cache."""
    from llm import backbone

    # beside the work folders (which mutmut copies), one for every run, fresh: an earlier run's
    # mutants may have changed it
    cache = work.parent / "mpdf-cache"
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(backbone.default_model_path(), cache / "smollm2-135m-instruct")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", MPDF_CACHE=str(cache))
    env.pop("MPDF_MODEL_DIR", None)
    return env


def run(module, max_children, out, summarize_only=False, only=(), rerun_survivors=False):
    # imported here, not above: pieces.py reads MODULES without loading torch
    from common import machine

    try:
        import mutmut
    except ImportError:
        sys.exit(f"mutation testing needs mutmut: pip install mutmut=={VERSION}")
    if mutmut.__version__ != VERSION:
        print(f"note: mutmut {mutmut.__version__}, this script was written for {VERSION}")
    path, tests, deselect = MODULES[module]
    began = time.time()
    work = ROOT / "runs" / "mutation" / module
    if summarize_only:
        if not (work / "mutants" / f"{path}.meta").is_file():
            sys.exit(f"--summarize-only: no finished mutmut run in {work}")
    elif rerun_survivors:
        rerun_with_current_tests(work, path, tests, deselect)
    else:
        work = scratch_copy(module, path, tests, deselect)
        log = work.parent / f"{module}.log"
        env = mutant_env(work)
        with open(log, "w") as f:
            proc = subprocess.run(
                [sys.executable, "-c", SHIM, "run", "--max-children", str(max_children), *only],
                cwd=work, stdout=f, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        if proc.returncode != 0:
            sys.exit(f"mutmut failed (exit {proc.returncode}): see {log}")
    results = read_results(work, path)
    if only:
        # the mutants of the functions named: the others were not run
        results = {n: r for n, r in results.items() if r[0] != "not checked"}
    equivalent = equivalent_mutants(module)
    statuses = Counter(status for status, _ in results.values())
    survivors = [
        {"mutant": n, "diff": d}
        for n, (s, d) in results.items()
        if s != "killed" and s != "timeout" and n not in equivalent
    ]
    reviewed = [
        {"mutant": n, "reason": equivalent[n], "status": results[n][0], "diff": results[n][1]}
        for n in equivalent
        if n in results
    ]
    # a mutant reviewed as equivalent counts on neither side, whatever its status (a timeout of
    # one on a loaded machine is no detection)
    detected = sum(
        status in ("killed", "timeout") and name not in equivalent
        for name, (status, _) in results.items()
    )
    considered = len(results) - len(reviewed)
    summary = {
        "module": module,
        "path": path,
        "tool": f"mutmut {mutmut.__version__}",
        "machine": machine(),
        "tests": tests,
        "tests_left_out": deselect,
        "only": list(only),
        "mutated_source_sha256": mutated_source(ROOT, path, only),
        "mutants": len(results),
        "killed": statuses["killed"],
        "survived": len(survivors),
        "timeouts": statuses["timeout"],
        "equivalent_by_review": len(reviewed),
        "statuses": dict(statuses),
        "score": round(detected / considered, 4) if considered else None,
        "score_definition": "(killed + timeouts) / (mutants - equivalent by review); a mutant no "
        "test reaches ('no tests') counts as survived",
        "not_mutated": {"decorated": decorated_functions(ROOT / path), "module_level": "constants"},
        "survivors": survivors,
        "equivalent": reviewed,
        "rerun_with_later_tests": (
            json.loads((work / "rerun.json").read_text()) if (work / "rerun.json").is_file() else []
        ),
        "wall_s": round(time.time() - began, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M"),
    }
    out = Path(out or ROOT / "results" / "mutation" / f"{module}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    print(
        f"{module}: {len(results)} mutants, {statuses['killed']} killed, {len(survivors)} "
        f"survived, {statuses['timeout']} timeouts, {len(reviewed)} equivalent; score "
        f"{summary['score']} -> {out}"
    )


def default_only(module):
    """mutmut's names of the mutants of a stage script's functions (none: the whole module)."""
    return tuple(f"{module}.x_{name}__mutmut_*" for name in STAGE_FUNCTIONS.get(module, ()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", nargs="?", choices=MODULES)
    parser.add_argument("--list", action="store_true", help="the modules and their tests")
    parser.add_argument("--max-children", type=int, default=1, help="test processes at once")
    parser.add_argument("--out", default="", help="default: results/mutation/<module>.json")
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="write the JSON from the last mutmut run in runs/mutation/<module>/ (after new "
        "equivalents are reviewed, or a run stopped while writing it); wall_s counts this only",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=(),
        help="mutmut's names of the mutants to run (globs, e.g. 'deliberate.x_play__mutmut_*'); "
        "a stage script's default: the functions in STAGE_FUNCTIONS",
    )
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="run the survivors and timeouts of the last run in runs/mutation/<module>/ again "
        "against the current tests (the module unchanged), keeping the other mutants' results",
    )
    args = parser.parse_args()
    if args.list or not args.module:
        for name, (path, tests, deselect) in MODULES.items():
            left_out = f" (not: {', '.join(deselect)})" if deselect else ""
            print(f"{name:11s} {path:16s} {' '.join(tests)}{left_out}")
        return
    run(
        args.module,
        args.max_children,
        args.out,
        args.summarize_only,
        tuple(args.only) or default_only(args.module),
        args.rerun_survivors,
    )


if __name__ == "__main__":
    main()
