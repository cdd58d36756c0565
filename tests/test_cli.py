"""Every script's command line explains itself: each flag has a one-line description (its config
field's docstring) and its default in --help."""

import dataclasses
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from common import field_docs, parse_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [
    "sft.py",
    "train_rl.py",
    "train_solver.py",
    "train_magrpo.py",
    "train_mlpo.py",
    "eval.py",
    "view.py",
    "experiments/bench.py",
]


def config_of(script):
    """The script's Config (the scripts run nothing on import: a __main__ guard); a module of the
    lab as `python -m experiments.NAME` imports it."""
    if script.startswith("experiments/"):
        return importlib.import_module(script.removesuffix(".py").replace("/", ".")).Config
    spec = importlib.util.spec_from_file_location(Path(script).stem + "_cli", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # inspect finds a class's source through its module
    spec.loader.exec_module(module)
    return module.Config


def help_text(script, capsys):
    """The script's --help: as users run it (a script by its path, a module of the lab with -m,
    from the root) for the first and the last of SCRIPTS, in process for the others (the same
    argparse help; a process start is seconds)."""
    if script in (SCRIPTS[0], SCRIPTS[-1]):
        run = [str(ROOT / script)]
        if script.startswith("experiments/"):
            run = ["-m", script.removesuffix(".py").replace("/", ".")]
        proc = subprocess.run(
            [sys.executable, *run, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout
    with pytest.raises(SystemExit) as ended:
        parse_config(config_of(script), ["--help"])
    assert ended.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_has_a_description_and_a_default(script, capsys):
    config = config_of(script)
    fields = dataclasses.fields(config)
    docs = field_docs(config)
    assert [f.name for f in fields if not docs.get(f.name)] == []  # no field without its docstring
    # argparse wraps lines, at spaces and after hyphens
    text = "".join(help_text(script, capsys).split())
    for f in fields:
        if f.name in getattr(config, "POSITIONAL", ()):
            # an argument of the command: no flag, no default
            flag, entry = f.name, "".join(docs[f.name].split())
        else:
            flag = "--" + f.name.replace("_", "-")
            entry = "".join(f"{docs[f.name]} (default: {f.default!r})".split())
        assert flag in text and entry in text, (flag, entry)


def test_parse_config_reads_docstrings_types_and_booleans():
    @dataclasses.dataclass
    class Config:
        name: str = "a"
        """the name, 100%"""
        steps: int = 3
        """how many"""
        on: bool = True
        """a switch"""

    assert field_docs(Config) == {"name": "the name, 100%", "steps": "how many", "on": "a switch"}
    cfg = parse_config(Config, ["--name", "b", "--steps", "5", "--no-on"])
    assert (cfg.name, cfg.steps, cfg.on) == ("b", 5, False)
    Config.POSITIONAL = ("name",)
    cfg = parse_config(Config, ["c", "--steps", "6"])
    assert (cfg.name, cfg.steps, cfg.on) == ("c", 6, True)
