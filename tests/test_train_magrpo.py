"""train_magrpo.py as users run it (tests/launch.py, on a tiny random model or the default
backbone): plain python (adapters), a 2-process torchrun (whole weights sharded by FSDP2), and a run
killed with SIGKILL and resumed."""

from pathlib import Path

import pytest
from launch import metrics, run

import common
from llm import lora
from llm.engine import Engine
from llm.team import read_adapter

ROOT = Path(__file__).resolve().parents[1]


def rollout_run(tmp_path, model_dir, torchrun, script, *extra):
    """train_magrpo.py or train_mlpo.py for 2 steps of 2 questions x 2 rollouts into
    tmp_path/<the script's name>, validated at steps 0 and 2; returns its training metric lines."""
    out = tmp_path / Path(script).stem
    run(
        [
            str(ROOT / script),
            "--algo",
            "magrpo",
            "--model",
            model_dir,
            "--questions-per-step",
            "2",
            "--group",
            "2",
            "--max-new-tokens",
            "6",
            "--steps",
            "2",
            "--val-n",
            "4",
            "--micro-batch",
            "3",
            "--eval-every",
            "2",
            "--out-dir",
            str(out),
            *extra,
        ],
        tmp_path,
        torchrun,
    )
    lines = metrics(out)
    # held-out validation at steps 0 and 2, on all 4
    # validation questions whatever the number of ranks
    assert [(r["step"], r["val_questions"]) for r in lines if "val_accuracy" in r] == [
        (0, 4),
        (2, 4),
    ]
    return [r for r in lines if "loss" in r]


@pytest.mark.parametrize("torchrun", [False, True])
def test_magrpo_runs_and_counts_flat_groups(tmp_path, tiny_model_dir, torchrun):
    """One model per agent: in one process an adapter each (the default), in the bf16 path
    (rollouts from a bf16 copy, autocast loss); on 2 processes whole weights sharded by FSDP2 (a KL
    reference sharded alike), the rollouts sampled from whole copies refreshed from the shards."""
    out = tmp_path / "train_magrpo"
    weights = ["--lora-rank", "0", "--fsdp"] if torchrun else ["--train-dtype", "bfloat16"]
    lines = rollout_run(
        tmp_path,
        tiny_model_dir,
        torchrun,
        "train_magrpo.py",
        *("--agents", "2", "--rounds", "1", "--beta", "0.1", "--separate-agents"),
        *weights,
    )
    assert [r["step"] for r in lines] == [1, 2]
    # random weights never answer right: every group is flat, counted, and teaches nothing
    assert all(
        r["zero_std_groups"] == 2 and r["frac_zero_std"] == 1.0 and r["grad_norm"] == 0
        for r in lines
    )
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["agent0", "agent1"]
    engine = Engine(model_path=tiny_model_dir)
    for name in ("agent0", "agent1"):
        if torchrun:  # rank 0 saved each model whole, an HF directory --model takes
            engine = Engine(model_path=str(out / name))
            adapters = None
        else:  # a small adapter folder (PEFT's layout) that a team of the base model plays
            adapters = [lora.load_adapter(engine.model, read_adapter(out / name))]
        prompt = [engine.chat("Hi")]
        completion = engine.generate(prompt, [0], max_new_tokens=4, adapters=adapters)[0]
        assert completion.completion_tokens > 0


@pytest.mark.slow
def test_magrpo_resumes_exactly_after_sigkill(tmp_path, default_model_dir):
    """MAGRPO on the default backbone from the committed worked-solution adapter (its answers end
    on their `Answer:` line within the budget, so the strict reward and its format term vary),
    killed after step 1 of 2 and resumed: the same weights as an uninterrupted run, no metric step
    logged twice."""
    args = [
        str(ROOT / "train_magrpo.py"),
        "--algo",
        "magrpo",
        "--protocol",
        "parallel",
        "--agents",
        "1",
        "--questions-per-step",
        "2",
        "--group",
        "2",
        "--max-new-tokens",
        "24",
        "--format-reward",
        "0.5",
        "--steps",
        "2",
        "--save-every",
        "1",
        "--lr",
        "1e-4",
        "--val-n",
        "4",
        "--init-adapter",
        str(ROOT / "results" / "agents" / "worked-L1-r4-seed0"),
        "--lora-rank",
        "4",
    ]
    run(args + ["--out-dir", str(tmp_path / "whole")], tmp_path)
    killed = run(
        args + ["--out-dir", str(tmp_path / "resumed"), "--crash-at-step", "1"],
        tmp_path,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run(args + ["--out-dir", str(tmp_path / "resumed")], tmp_path)
    assert "resuming from" in resumed.stderr
    whole = metrics(tmp_path / "whole")
    again = metrics(tmp_path / "resumed")
    assert [r["step"] for r in again] == [1, 2]
    assert any(r["grad_norm"] > 0 for r in whole)  # the run learned something
    assert [r["mean_reward"] for r in again] == [r["mean_reward"] for r in whole]
    a, b = (
        common.load_file(tmp_path / d / "checkpoint.pt", "checkpoint")["model"]
        for d in ("whole", "resumed")
    )
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0
