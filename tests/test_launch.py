"""tests/launch.py: a script run in this process reports what a process of its own would (its exit
status, stdout and stderr, its working directory, arguments and environment), and leaves this
process as it found it."""

import os
import sys

import torch
from launch import run

SCRIPT = """import os, sys, torch
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "env", os.environ["PLANTED"])
print("to stderr", file=sys.stderr)
torch.manual_seed(123)
torch.set_num_threads(3)
os.environ["LEFT_BEHIND"] = "1"
ending = sys.argv[1]
if ending == "error":
    sys.exit("error: a planted refusal")
if ending == "status":
    sys.exit(2)
if ending == "raise":
    raise ValueError("planted")
"""


def test_a_script_in_this_process_reports_as_its_own_process_would(tmp_path):
    script = tmp_path / "planted.py"
    script.write_text(SCRIPT)
    (tmp_path / "here").mkdir()
    before = (os.getcwd(), list(sys.argv), dict(os.environ), torch.get_num_threads())
    rng = torch.random.get_rng_state()
    runs = {
        ending: run([script, ending], tmp_path / "here", check=False, env={"PLANTED": "yes"})
        for ending in ("none", "error", "status", "raise")
    }
    assert runs["none"].stdout == "argv ['none'] cwd here env yes\n"
    assert runs["none"].returncode == 0 and runs["none"].stderr == "to stderr\n"
    # sys.exit with a message: the message on stderr, status 1, as Python does
    assert runs["error"].returncode == 1
    assert runs["error"].stderr == "to stderr\nerror: a planted refusal\n"
    assert runs["status"].returncode == 2 and runs["status"].stderr == "to stderr\n"
    assert runs["raise"].returncode == 1
    assert runs["raise"].stderr.splitlines()[-1] == "ValueError: planted"
    assert "Traceback" in runs["raise"].stderr
    assert (os.getcwd(), sys.argv, dict(os.environ), torch.get_num_threads()) == before
    assert torch.equal(torch.random.get_rng_state(), rng)
