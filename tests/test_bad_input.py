"""Bad input never runs silently wrong: each script refuses a bad value before it loads a model,
with one line naming the flag (common.UsageError -> exit status 2); the engine refuses sampling
settings that would sample from the wrong distribution; nothing stale is reused."""

import dataclasses
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import deliberate as D
from common import UsageError, parse_config
from data import DataError

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def script(name):
    spec = importlib.util.spec_from_file_location(Path(name).stem + "_checked", ROOT / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # inspect (parse_config's help) finds the source through it
    spec.loader.exec_module(module)
    return module


def refusal(name, argv, world=1):
    """The one line a script's check() refuses `argv` with (it loads no model)."""
    module = script(name)
    cfg = parse_config(module.Config, argv)
    with pytest.raises((UsageError, DataError)) as refused:
        module.check(cfg, world) if name != "eval.py" else module.check(cfg)
    message = str(refused.value)
    assert "\n" not in message
    return message


GAME = [  # (flag and bad value, what the line must say): every game script shares these
    (["--temperature", "-1"], "--temperature -1.0: must be at least 0"),
    (["--agents", "0"], "--agents 0: must be at least"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0: must be at least 1"),
    (["--max-new-tokens", "100000"], "--max-new-tokens 100000: the model's context holds"),
    (["--engine-batch-size", "0"], "--engine-batch-size 0: must be at least 1"),
    (["--task", "nope"], "unknown --task 'nope'"),
    (["--task", "gsm8k"], "--task gsm8k reads a data file: pass it with --path"),
    (["--vote", "loudest"], "unknown --vote 'loudest'"),
]


SCRIPTS = [
    "sft.py",
    "train_rl.py",
    "eval.py",
    "train_solver.py",
    "train_magrpo.py",
    "train_mlpo.py",
]


def takes(name, flag):
    """Whether the script has the flag (each takes the game's flags it uses)."""
    return flag[2:].replace("-", "_") in {f.name for f in dataclasses.fields(script(name).Config)}


@pytest.mark.parametrize(
    "name,argv,says",
    [(name, argv, says) for name in SCRIPTS for argv, says in GAME if takes(name, argv[0])],
)
def test_every_script_refuses_a_bad_game_flag(name, argv, says, tmp_path):
    out = ["--out-dir" if name != "eval.py" else "--out", str(tmp_path / "out")]
    assert says in refusal(name, argv + ["--model", ""] + out + init_for(name, tmp_path))


def init_for(name, tmp_path):
    """train_rl.py needs a policy to start from before it gets to the game's flags."""
    if name != "train_rl.py":
        return []
    path = tmp_path / "pi.safetensors"
    D.save_policy(D.MetaPolicy(agents=3), path)
    return ["--init", str(path)]


@pytest.mark.parametrize(
    "name,argv,says",
    [
        ("eval.py", ["--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
        ("eval.py", ["--n", "0"], "--n 0: must be at least 1"),
        ("eval.py", ["--agents", "1"], "--agents 1: must be at least 2"),
        ("eval.py", ["--rounds", "-1"], "--rounds -1: must be at least 0"),
        ("eval.py", ["--protocols", "vanilla,debate,foo"], "unknown protocol 'foo'"),
        ("eval.py", ["--protocols", "mpdf=nowhere.pt"], "no policy file 'nowhere.pt'"),
        ("eval.py", ["--protocols", "leader=/"], "not an HF checkpoint directory"),
        ("eval.py", ["--model", "/"], "--model '/': not an HF checkpoint directory"),
        ("eval.py", ["--seeds", "0,x"], "--seeds '0,x'"),
        ("eval.py", ["--protocols", "vanilla", "--reference", "sc"], "unknown --reference 'sc'"),
        ("sft.py", ["--batch-size", "0"], "--batch-size 0: must be at least 1"),
        ("sft.py", ["--rounds", "0"], "--rounds 0: must be at least 1"),
        ("sft.py", ["--hidden", "10", "--heads", "4"], "--hidden 10: must be a multiple"),
        ("sft.py", ["--behaviour", "nobody"], "policy 'nobody' is neither a fixed policy"),
        ("train_rl.py", ["--init", "nowhere.pt"], "--init 'nowhere.pt' is not a policy file"),
        ("train_rl.py", ["--algo", "dpo"], "unknown --algo 'dpo'"),
        ("train_rl.py", ["--objective", "max"], "unknown --objective 'max'"),
        ("train_rl.py", ["--refine-cost", "-0.1"], "--refine-cost -0.1: must be at least 0"),
        ("sft.py", ["--features", "nonsense"], "unknown --features 'nonsense'"),
        ("train_magrpo.py", ["--group", "1"], "--group 1: must be at least 2"),
        ("train_mlpo.py", ["--group", "1"], "--group 1: must be at least 2"),
        ("train_magrpo.py", ["--rollout-temperature", "0"], "--rollout-temperature 0.0: must be"),
        ("train_mlpo.py", ["--rollout-temperature", "0"], "--rollout-temperature 0.0: must be"),
        ("train_magrpo.py", ["--protocol", "vote"], "unknown --protocol 'vote'"),
        ("train_mlpo.py", ["--algo", "ppo"], "unknown --algo 'ppo'"),
        ("train_mlpo.py", ["--filter-easy", "2"], "--filter-easy 2.0: a share of the peers"),
        ("train_solver.py", ["--lora-rank", "-1"], "--lora-rank -1: must be at least 0"),
        ("train_magrpo.py", ["--lora-rank", "-1"], "--lora-rank -1: must be at least 0"),
        ("train_solver.py", ["--solutions", "mine"], "unknown --solutions 'mine'"),
        ("train_solver.py", ["--trailer"], "(drop --trailer)"),
        (
            "train_solver.py",
            ["--solutions", "sampled", "--refine-contexts", "a.pt"],
            "--refine-contexts: REFINE examples need --solutions worked",
        ),
        ("eval.py", ["--models", "default,default"], "--models: 2 entries for 3 agents"),
        ("eval.py", ["--models", "default,/,default"], "--models '/': not an HF checkpoint"),
        (
            "eval.py",
            ["--models", "default+no.pt,default,default"],
            "no adapter file or folder 'no.pt'",
        ),
        ("sft.py", ["--models", "default,default,default", "--model", "/x"], "pass one"),
        ("train_rl.py", ["--models", "default,default"], "--models: 2 entries for 3 agents"),
    ],
)
def test_script_specific_refusals(name, argv, says):
    assert says in refusal(name, argv)


@pytest.mark.parametrize(
    "name,argv",
    [
        ("train_solver.py", ["--critic"]),
        ("train_magrpo.py", ["--models", "default"]),
        ("train_mlpo.py", ["--refine-cost", "1"]),
        ("train_solver.py", ["--dtype", "float32"]),
        ("train_magrpo.py", ["--temperature", "0.7"]),
        ("eval.py", ["--lora-rank", "4"]),
    ],
)
def test_a_script_takes_only_the_flags_it_uses(name, argv, capsys):
    """The LLM-weight trainers have no flag of the meta-policy's game (--models, --critic,
    --refine-cost) nor the engine's --dtype (theirs is --train-dtype); MAGRPO samples at
    --rollout-temperature only: each is an unknown argument, as any flag a script does not take."""
    with pytest.raises(SystemExit) as ended:
        parse_config(script(name).Config, argv)
    assert ended.value.code == 2
    assert f"unrecognized arguments: {' '.join(argv)}" in capsys.readouterr().err


def test_batches_smaller_than_the_ranks_are_refused_before_any_work(tmp_path):
    assert "--batch-size 1: must be at least 2" in refusal("sft.py", ["--batch-size", "1"], world=2)
    pi = init_for("train_rl.py", tmp_path)
    assert "--batch-size 1: must be at least 2" in refusal(
        "train_rl.py", pi + ["--batch-size", "1"], 2
    )
    for name in ("train_magrpo.py", "train_mlpo.py"):
        said = refusal(name, ["--questions-per-step", "3"], world=2)
        assert "--questions-per-step 3 must be a multiple of the 2 processes" in said


def test_a_policy_with_per_agent_copies_plays_only_its_team(tmp_path):
    path = tmp_path / "separate.safetensors"
    D.save_policy(D.MetaPolicy(agents=3, separate=True), path)
    for agents in ("4", "5"):
        said = refusal("eval.py", ["--agents", agents, "--protocols", f"mpdf={path}"])
        assert f"for 3 agents cannot play {agents} agents" in said
        said = refusal("train_rl.py", ["--agents", agents, "--init", str(path)])
        assert f"for 3 agents cannot play {agents} agents" in said
    shared = tmp_path / "shared.safetensors"
    D.save_policy(D.MetaPolicy(agents=3), shared)
    module = script("eval.py")  # a shared policy plays any team size: no refusal
    module.check(parse_config(module.Config, ["--agents", "5", "--protocols", f"mpdf={shared}"]))


def test_a_policy_plays_only_the_game_it_was_trained_in_unless_asked(tmp_path):
    """A policy file whose stage recorded its game (task, agents, rounds) is refused in another
    game, naming what differs, before any model loads; --any-game plays it (a study of transfer);
    a file that records no game is played."""
    path = tmp_path / "policy.safetensors"
    game = {"task": "arith", "agents": 3, "rounds": 3}
    D.save_policy(D.MetaPolicy(agents=3), path, train_config=game | {"seed": 0})
    assert D.load_policy(path).trained_game == game
    protocols = ["--protocols", f"mpdf={path}"]
    said = refusal("eval.py", ["--rounds", "2", *protocols])
    assert said == (
        f"--protocols mpdf={path}: trained in another game (--rounds 3; here --rounds 2): pass "
        "--rounds 3, or --any-game to play it here anyway"
    )
    said = refusal("eval.py", ["--agents", "4", "--task", "split", *protocols])
    assert "(--task arith, --agents 3; here --task split, --agents 4)" in said
    module = script("eval.py")
    for argv in (["--rounds", "3"], ["--rounds", "2", "--any-game"]):
        module.check(parse_config(module.Config, argv + protocols))
    unrecorded = tmp_path / "unrecorded.safetensors"
    D.save_policy(D.MetaPolicy(agents=3), unrecorded)
    assert D.load_policy(unrecorded).trained_game is None
    module.check(
        parse_config(module.Config, ["--rounds", "2", "--protocols", f"mpdf={unrecorded}"])
    )


def test_a_refusal_is_one_line_and_exit_status_2(tmp_path):
    """As users see it, in a process of its own: one line on stderr, status 2 (the checks
    themselves: the in-process tests above)."""
    policy = tmp_path / "policy.safetensors"
    D.save_policy(
        D.MetaPolicy(agents=3), policy, train_config={"task": "arith", "agents": 3, "rounds": 3}
    )
    for argv in (
        ["eval.py", "--rounds", "2", "--protocols", f"mpdf={policy}"],
        ["train_rl.py", "--init", str(tmp_path / "nowhere.pt")],
    ):
        proc = subprocess.run(
            [sys.executable, str(ROOT / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith("error: --")


def test_the_engine_refuses_sampling_settings_that_sample_wrong(tiny_model):
    from llm.engine import Engine

    model, tokenizer = tiny_model
    engine = Engine(model=model, tokenizer=tokenizer)
    prompt = [engine.chat("Hi")]
    refused = [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ]
    for kwargs, says in refused:
        with pytest.raises(ValueError, match=says):
            engine.generate(prompt, [0], **{"max_new_tokens": 4, **kwargs})
    # max_new_tokens is honoured exactly, and temperature 0 is greedy: the same tokens for any seed
    out = [engine.generate(prompt, [s], max_new_tokens=3, temperature=0.0)[0] for s in (0, 1)]
    assert out[0].completion_tokens <= 3 and out[0].text == out[1].text


# ---------------------------------------------------------------- nothing stale is reused
SMALL = [
    "--questions",
    "8",
    "--val-n",
    "4",
    "--agents",
    "3",
    "--rounds",
    "2",
    "--max-new-tokens",
    "8",
]


def test_a_corpus_is_reused_only_under_its_own_settings(tmp_path):
    """A run killed before its first checkpoint leaves its corpus: rerun with another setting that
    shapes the corpus, it is refused (not trained on); rerun as it was, it is reused."""
    from launch import run

    out = ["--out-dir", str(tmp_path / "sft"), "--epochs", "2", "--batch-size", "8"]
    args = [str(ROOT / "sft.py"), *SMALL, *out, "--save-every", "100"]
    killed = run(args + ["--crash-at-step", "1"], tmp_path, check=False, scripted=True)
    assert killed.returncode == -9 and (tmp_path / "sft" / "corpus.pt").exists()
    assert not (tmp_path / "sft" / "checkpoint.pt").exists()
    other = run(args + ["--temperature", "0.9"], tmp_path, check=False, scripted=True)
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1
    assert "corpus.pt was collected with other settings (temperature: 0.5 there, 0.9 now)" in (
        other.stderr
    )
    same = run(args, tmp_path, scripted=True)
    assert "states from 8 questions" in same.stderr
    # more epochs extend a finished run from its checkpoint (other settings are refused:
    # tests/test_common.py's test_a_checkpoint_resumes_only_its_own_run)
    longer = run(args + ["--epochs", "3"], tmp_path, scripted=True)
    assert "extending the run: --epochs 2 -> 3" in longer.stderr


def test_train_rl_without_validation_questions(tmp_path):
    from launch import run

    sft = ["--out-dir", str(tmp_path / "sft"), "--epochs", "1", "--batch-size", "8"]
    run([str(ROOT / "sft.py"), *SMALL, *sft], tmp_path, scripted=True)
    rl = [
        str(ROOT / "train_rl.py"),
        *SMALL[:2],
        "--val-n",
        "0",
        *SMALL[4:],
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--init",
        str(tmp_path / "sft" / "policy.safetensors"),
        "--out-dir",
        str(tmp_path / "rl"),
    ]
    run(rl, tmp_path, scripted=True)
    summary = (tmp_path / "rl" / "summary.json").read_text()
    assert '"validation": "none (--val-n 0)"' in summary
    assert (tmp_path / "rl" / "policy.safetensors").exists()
