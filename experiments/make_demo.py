"""Times `make demo` as a new user meets it and keeps its table: results/demo/make-demo.json.

    python -m experiments.make_demo          # run on a quiet machine: it is a timing

A fresh clone of this checkout's HEAD in a temporary folder, so the generation cache is cold (the
converted default backbone under ~/.cache/mpdf is reused: converting it is part of `make model`,
timed separately); `make setup model`, then `make demo`, each timed; eval.py's JSONs of the demo
(runs/demo/results.json, the competent team's runs/demo/competent.json under "competent" and the
split task's runs/demo/split.json under "split") are written with the times, the commit and the
machine.
"""

import json
import subprocess
import tempfile
import time
from pathlib import Path

from common import machine

ROOT = Path(__file__).resolve().parents[1]


def timed(command, cwd):
    start = time.time()
    subprocess.run(command, cwd=cwd, check=True)
    return time.time() - start


def main():
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        setup_s = timed(["make", "setup", "model"], clone)
        demo_s = timed(["make", "demo"], clone)
        demo = clone / "runs" / "demo"
        result = json.loads((demo / "results.json").read_text())
        for regime in ("competent", "split"):
            result[regime] = json.loads((demo / f"{regime}.json").read_text())
    # the transcripts: megabytes, and eval.py reproduces them
    for run in (result, result["competent"], result["split"]):
        run.pop("details", None)
    result["make_demo"] = {
        "seconds": demo_s,
        "setup_seconds": setup_s,
        "commit": commit,
        "cold_cache": True,
        "machine": machine(),
    }
    out = ROOT / "results" / "demo" / "make-demo.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"make demo: {demo_s:.0f} s (setup {setup_s:.0f} s) at {commit}; {out}")


if __name__ == "__main__":
    main()
