"""Runs a stage script with the scripted arith engine instead of a model, as users run it:

    python tests/scripted_run.py train_rl.py --init ... --out-dir ...
    torchrun --nproc_per_node=2 tests/scripted_run.py train_rl.py ...

The scripts take their engine from llm.team.make_engine; it is replaced before the script is loaded.
"""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from launch import scripted_engine  # noqa: E402

script, sys.argv = sys.argv[1], sys.argv[1:]
with scripted_engine():
    runpy.run_path(str(ROOT / script), run_name="__main__")
