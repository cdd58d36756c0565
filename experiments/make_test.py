"""The student's `make test` timed from nothing, kept: results/tests/make-test-<commit>.json.

    python -m experiments.make_test 3caa81a HEAD   # run on a quiet machine: it is a timing

For each commit, in turn: a fresh shallow clone (`git clone --depth 1`) in a temporary folder, with
this checkout's ../shared linked beside it (the data its tests read), a model cache of its own
(MPDF_CACHE, so `make model` converts the backbone again), then `make test` timed from its start to
its end: the virtual environment, the pinned requirements (pip's download cache stays warm), the
conversion, ruff and pytest. Written with the commit, the machine, pytest's summary line and its
slowest tests.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine

ROOT = Path(__file__).resolve().parents[1]


def git(*args):
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def make_test_from_nothing(commit):
    """{seconds, status, summary, slowest} of `make test` in a fresh shallow clone of commit."""
    branch = f"make-test-{commit}"
    git("branch", "-f", branch, commit)
    try:
        with tempfile.TemporaryDirectory() as folder:
            clone = Path(folder) / "clone"
            git("clone", "-q", "--depth", "1", "--branch", branch, f"file://{ROOT}", str(clone))
            # the data beside the clone, as beside this checkout (its tests skip without it)
            if (ROOT.parent / "shared").is_dir():
                (Path(folder) / "shared").symlink_to(ROOT.parent / "shared")
            env = dict(os.environ, MPDF_CACHE=str(Path(folder) / "model-cache"))
            start = time.time()
            proc = subprocess.run(
                ["make", "test"], cwd=clone, env=env, capture_output=True, text=True
            )
            seconds = time.time() - start
    finally:
        git("branch", "-D", branch)
    lines = proc.stdout.splitlines()
    slowest = [i for i, line in enumerate(lines) if "slowest" in line and "durations" in line]
    return {
        "seconds": round(seconds, 1),
        "status": proc.returncode,
        "summary": next((line for line in reversed(lines) if " in " in line), ""),
        "slowest": lines[slowest[-1] + 1 : slowest[-1] + 11] if slowest else [],
    }


def main(commits):
    for name in commits:
        commit = git("rev-parse", "--short", name)
        result = {"commit": commit, "machine": machine(), **make_test_from_nothing(commit)}
        out = ROOT / "results" / "tests" / f"make-test-{commit}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(
            f"make test from nothing at {commit}: {result['seconds']:.0f} s, status "
            f"{result['status']}; {result['summary']}; {out}"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or ["HEAD"])
