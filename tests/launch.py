"""The stage scripts as users run them, for the tests that run them whole.

    run([ROOT / "eval.py", "--n", "3", ...], tmp_path)        # -> subprocess.CompletedProcess

`python script.py args` runs in this process: the script is executed as `__main__` (runpy), with
its arguments, working directory and environment, its exit status, stdout and stderr captured
as a subprocess's would be. Starting a Python process costs seconds of imports (torch,
transformers) that a test's own checks do not need. A run gets a process of its own only where
the process boundary is what is tested: a 2-process torchrun, and a run that kills itself with
SIGKILL (--crash-at-step), whose checkpoint the next run resumes from.

In process, the script shares this process's imported modules; what it changes of the process
(the working directory, sys.argv, the environment, torch's global random state and thread count)
is put back when it ends.
"""

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

import torch
from scripted import ScriptedEngine, arith_script

import llm.team

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def run(args, cwd, torchrun=False, check=True, scripted=False, env=None):
    """A stage script (args[0], its path) with its arguments, run from the folder cwd: in this
    process, or (torchrun, or --crash-at-step) in processes of its own. scripted: with the scripted
    arith engine instead of a model (tests/scripted_run.py), so its games have right and wrong
    answers. env: variables set for the run. check: its exit status must be 0."""
    if torchrun or "--crash-at-step" in args:
        proc = in_processes(args, cwd, torchrun, scripted, env)
    else:
        proc = in_this_process(args, cwd, scripted, env)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def in_processes(args, cwd, torchrun, scripted, env):
    launcher = TORCHRUN if torchrun else [sys.executable]
    if scripted:
        launcher = launcher + [str(ROOT / "tests" / "scripted_run.py")]
        args = [Path(args[0]).name, *args[1:]]
    variables = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [*launcher, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=variables,
    )


def in_this_process(args, cwd, scripted, env):
    script, args = str(args[0]), [str(a) for a in args]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as undo:
        undo.enter_context(_restored_process_state(cwd, args, env))
        if scripted:
            undo.enter_context(scripted_engine())
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = _exit_status(script)
    return subprocess.CompletedProcess(args, status, stdout.getvalue(), stderr.getvalue())


def _exit_status(script):
    """Runs the script as `python script` would; its exit status (a traceback and 1 on an
    exception, as Python prints it)."""
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as ended:
        if ended.code is None or isinstance(ended.code, int):
            return ended.code or 0
        print(ended.code, file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    return 0


@contextlib.contextmanager
def _restored_process_state(cwd, argv, env):
    before = (os.getcwd(), sys.argv, dict(os.environ))
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    os.chdir(cwd)
    sys.argv = argv
    os.environ.update(env or {})
    try:
        yield
    finally:
        os.chdir(before[0])
        sys.argv = before[1]
        os.environ.clear()
        os.environ.update(before[2])
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)


@contextlib.contextmanager
def scripted_engine():
    """with scripted_engine(): ... -- the scripts' engine (llm.team.make_engine) is the scripted
    arith engine (tests/scripted.py) inside the block."""
    real = llm.team.make_engine
    llm.team.make_engine = lambda cfg, agents, rank, device="cpu": ScriptedEngine(arith_script())
    try:
        yield
    finally:
        llm.team.make_engine = real


def metrics(out_dir):
    """The lines of a run's metrics.jsonl."""
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
