"""Every script's command line explains itself: each flag is declared in the script's own flat
config class, with a one-line description (its field's docstring) and its default in --help; and a
flag's name keeps one meaning across the scripts that take it (the same type, default and help)."""

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


# the stage scripts, whose flags a user carries from one command to the next
STAGES = [script for script in SCRIPTS if not script.startswith("experiments/")]
# flags that name the same kind of setting in every script, with each stage's own value and words:
# where the stage writes, and its own optimization (type kept, default and help the stage's)
STAGE_OWN = {
    "out_dir": "what the stage writes there",
    "out": "what the stage writes there",
    "epochs": "passes over that stage's own data",
    "batch_size": "states (the policy) or sequences (the solver) per step",
    "lr": "each stage's measured rate",
    "algo": "the policy's full-action-set algorithms, or the LLM trainers' group advantages",
    "beta": "the study's KL weight for the policy; 0 in the MAGRPO and MLPO papers",
    "loss_agg": "each paper's aggregation: CoMLRL's sum for MAGRPO, Dr.GRPO's const for MLPO",
}


def flags_of(scripts):
    """{flag name: {script: (type, default, help)}} over `scripts`."""
    flags = {}
    for script in scripts:
        config = config_of(script)
        docs = field_docs(config)
        for f in dataclasses.fields(config):
            flags.setdefault(f.name, {})[script] = (type(f.default), f.default, docs[f.name])
    return flags


def inconsistent(flags):
    """The flags declared differently in two scripts: another type, or (but for STAGE_OWN)
    another default or help."""
    found = []
    for name, declared in flags.items():
        kept = {d[:1] if name in STAGE_OWN else d for d in declared.values()}
        if len(kept) > 1:
            found.append(name)
    return found


def test_a_flag_name_keeps_one_meaning_across_the_scripts():
    """Every flag two stage scripts share has one type, default and help (but for STAGE_OWN, each
    stage's own value and words for the same kind of setting); and the check sees one script's
    default moved."""
    flags = flags_of(STAGES)
    assert inconsistent(flags) == []
    shared = {name for name, declared in flags.items() if len(declared) > 1}
    assert {"seed", "agents", "max_new_tokens", "lora_rank", "group", "tau"} <= shared
    assert set(STAGE_OWN) <= shared
    for name, script, change in (
        ("seed", "train_magrpo.py", 1),
        ("micro_batch", "train_solver.py", 1),
        ("lr", "train_rl.py", "0.001"),
    ):
        moved = {k: dict(v) for k, v in flags.items()}
        kind, default, text = moved[name][script]
        moved[name][script] = (
            (type(change), change, text) if name == "lr" else (kind, default + change, text)
        )
        assert inconsistent(moved) == [name]
