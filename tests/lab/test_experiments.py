"""The results pipeline: experiments/run.py skips what is done, experiments/tables.py writes tables
from results/."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import common
import eval as eval_script
from experiments import (
    dtype_tables,
    llm_pieces,
    piece_kit,
    revision_tables,
    rule_pieces,
    split_tables,
    studies,
    tables,
    team_tables,
    teams,
    weights,
)
from experiments import run as runner
from experiments.mutation_modules import mutated_source

ROOT = Path(__file__).resolve().parents[2]


def test_report_tables_come_from_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in tables.auroc_table() and "auroc/mawps.json" in tables.auroc_table()
    (tmp_path / "auroc").mkdir()
    (tmp_path / "auroc" / "arith.json").write_text(
        json.dumps(
            {
                "solutions": 6,
                "right": 2,
                "critic_prompt_tokens_per_solution": 100.0,
                "auroc": {"min_prob": 0.7},
            }
        )
    )
    partial = tables.auroc_table()
    assert (
        "| min_prob | 0.700 |" in partial
        and "not computed yet: `results/auroc/mawps.json`" in partial
    )
    for task, value in (("arith", 0.61), ("mawps", 0.48)):
        (tmp_path / "auroc" / f"{task}.json").write_text(
            json.dumps(
                {
                    "solutions": 600,
                    "right": 60,
                    "critic_prompt_tokens_per_solution": 141.2,
                    "auroc": {"critic_sequence": value, "min_prob": value + 0.1},
                }
            )
        )
    table = tables.auroc_table()
    assert "| min_prob | 0.710 | 0.580 |" in table and "arith (600 solutions, 60 right)" in table
    (tmp_path / "tables").mkdir()

    def table_file(part, protocol, summary):
        (tmp_path / "tables" / f"t-{part}.json").write_text(
            json.dumps({"config": {"vote": "mean_prob"}, protocol: summary})
        )

    table_file(
        "vanilla",
        "vanilla",
        {
            "accuracy": 0.5,
            "stderr": 0.03,
            "tokens_per_question": 110,
            "calls_per_question": 1,
            "question_ids": [1, 2, 3, 4],
            "correct": [True, True, False, False],
        },
    )
    assert "vs softrank" not in tables.protocol_table("t", ["vanilla", "softrank"], "softrank")
    # paired by id, not by position
    table_file(
        "softrank",
        "mpdf=results/policies/x.pt",
        {
            "accuracy": 0.25,
            "stderr": 0.03,
            "tokens_per_question": 400,
            "calls_per_question": 3,
            "accuracy_per_round": [0.2, 0.25],
            "actions": {"persist": 0.5, "refine": 0.1, "concede": 0.4},
            "question_ids": [4, 3, 2, 1],
            "correct": [False, False, False, True],
        },
    )
    table = tables.protocol_table("t", ["vanilla", "softrank"], "softrank")
    assert "vs softrank [95% CI]" in table and "| vanilla | 0.500 ± 0.030 | 110 | 1.0 |" in table
    assert (
        "+0.250 [" in table
        and "(1) |" in table
        and "0.50/0.10/0.40" in table
        and "`mean_prob`" in table
    )


def test_report_llm_curves_and_temperature_study_from_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in studies.llm_curves("m", "run")
    (tmp_path / "llm").mkdir()
    for seed, final in ((0, 0.30), (1, 0.20)):
        lines = [{"step": 0, "val_accuracy": 0.10}]
        lines += [
            {"step": k, "mean_reward": 0.1 * k, "frac_zero_std": 0.5, "step_s": 60.0, "tokens": 100}
            for k in range(1, 5)
        ]
        lines.append({"step": 4, "val_accuracy": final})
        (tmp_path / "llm" / f"m-seed{seed}.metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in lines)
        )
    table = studies.llm_curves("m", "run")
    assert (
        "| m-seed0 | 0: 0.10, 4: 0.30 | 0.100 → 0.300 | 0.100 → 0.400 | 0.50 | 4 min | 400 |"
        in table
    )
    assert "over 2 seeds: +0.150 (sample std 0.071)" in table
    assert "by step: 0: 0.100 ± 0.000, 4: 0.250 ± 0.071." in table
    # a sweep: another setting's run is listed, never pooled with these seeds
    other = tmp_path / "llm" / "m-lr2-seed0.metrics.jsonl"
    other.write_text((tmp_path / "llm" / "m-seed0.metrics.jsonl").read_text())
    table = studies.llm_curves("m", "run")
    assert "| m-lr2-seed0 |" in table
    assert "held-out accuracy (m) over 2 seeds: +0.150 (sample std 0.071)" in table
    assert "(m-lr2)" not in table and "over 3 seeds" not in table
    other.unlink()
    assert "not computed yet" in studies.temperature_table()
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "temperature-T0.3.json").write_text(
        json.dumps(
            {
                "machine": "cpu",
                "mpdf-persist": {
                    "n": 4,
                    "accuracy": 0.5,
                    "stderr": 0.03,
                    "agent_accuracy_round0": 0.15,
                    "any_agent_right_round0": 0.75,
                    "tokens_per_question": 300,
                    "question_ids": [1, 2, 3, 4],
                    "correct": [True, True, False, False],
                },
            }
        )
    )
    table = studies.temperature_table()
    assert (
        "| 0.3 | 0.150 | 0.500 ± 0.030 | 0.750 | 300 |  |" in table
        and "temperature-T0.7.json" in table
    )
    (tmp_path / "study" / "temperature-greedy.json").write_text(
        json.dumps(
            {
                "machine": "cpu",
                "vanilla": {
                    "n": 4,
                    "accuracy": 0.25,
                    "tokens_per_question": 100,
                    "question_ids": [4, 3, 2, 1],
                    "correct": [False, False, False, True],
                },
            }
        )
    )
    table = studies.temperature_table()
    assert (
        "| one greedy answer (vanilla) | 0.250 |" in table
        and "| 300 | +0.250 [" in table
        and "(1) |" in table
    )


def test_runner_lists_and_skips_done_pieces(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out, blocked = tmp_path / "results" / "x.json", tmp_path / "results" / "y.json"
    left = tmp_path / "results" / "z.json"
    monkeypatch.setattr(
        runner,
        "PIECES",
        {
            "demo-x": {
                "command": [sys.executable, "-c", f"open({str(out)!r}, 'w')"],
                "outputs": [str(out)],
            },
            # trained weights that are not there (out of git): skipped with a message, not failed
            "demo-y": {
                "command": [sys.executable, "-c", f"open({str(blocked)!r}, 'w')"],
                "outputs": [str(blocked)],
                "needs": [str(tmp_path / "runs" / "model")],
            },
            # a study's piece whose code left the tree: run only from a worktree at its commit
            "demo-z": {
                "command": [sys.executable, "-c", f"open({str(left)!r}, 'w')"],
                "outputs": [str(left)],
                "code_at": "abc1234",
            },
        },
    )
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    (tmp_path / "results").mkdir()
    monkeypatch.setattr(sys, "argv", ["run.py"])
    runner.main()
    assert (
        out.exists()
        and json.loads((tmp_path / "results" / "pieces.jsonl").read_text())["piece"] == "demo-x"
    )
    said = capsys.readouterr().err
    assert not blocked.exists() and "demo-y: skipped, needs" in said
    assert not left.exists() and "demo-z: its code left the tree" in said
    assert "git worktree add DIR abc1234" in said
    monkeypatch.setattr(sys, "argv", ["run.py", "--check", "demo-z"])
    with pytest.raises(SystemExit, match="no chosen piece has its code in this tree"):
        runner.main()
    assert "--check: skipped: demo-z: its code left" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["run.py"])
    out.write_text("kept")
    runner.main()  # done: not run again
    assert (
        out.read_text() == "kept"
        and len((tmp_path / "results" / "pieces.jsonl").read_text().splitlines()) == 1
    )
    monkeypatch.setattr(sys, "argv", ["run.py", "nothing-"])
    with pytest.raises(SystemExit, match="no piece starts with"):
        runner.main()


def test_runner_checks_a_committed_eval_piece_by_rerunning_it_without_the_cache(
    tmp_path, monkeypatch, capsys
):
    """--check: the piece's eval.py command rerun with the cache off, its JSON to a scratch file
    (the committed one untouched), each protocol's accuracy against the committed within the
    tolerance; exit 1 when one is not."""
    fake_eval = tmp_path / "eval.py"
    fake_eval.write_text(
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "assert args[-2:] == ['--cache-dir', ''], args\n"
        "out = args[args.index('--out') + 1]\n"
        "json.dump({'machine': 'm', 'config': {}, 'vanilla': {'accuracy': 0.70}}, open(out, 'w'))\n"
    )
    committed = tmp_path / "results" / "after" / "x.json"
    committed.parent.mkdir(parents=True)
    piece = {"command": [sys.executable, str(fake_eval), "--out", str(committed)]}
    monkeypatch.setattr(runner, "PIECES", {"after-x": dict(piece, outputs=[str(committed)])})
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    # runner.main changes into its ROOT: monkeypatch puts the test's own directory back after
    monkeypatch.chdir(tmp_path)
    for accuracy, code in ((0.71, 0), (0.73, 1)):
        committed.write_text(json.dumps({"vanilla": {"accuracy": accuracy}}))
        monkeypatch.setattr(sys, "argv", ["run.py", "--check", "after-x"])
        with pytest.raises(SystemExit) as exit:
            runner.main()
        assert exit.value.code == code
        assert json.loads(committed.read_text())["vanilla"]["accuracy"] == accuracy
        said = capsys.readouterr().out
        assert f"committed {accuracy:.4f}, rerun 0.7000" in said
        assert ("NOT within" in said) == bool(code)


def test_runner_pieces_name_existing_scripts():
    """Every piece runs a script of the spine (python SCRIPT.py) or a module of the lab (python -m
    experiments.NAME); `python -m experiments.run --list` names them all from the repository's
    root."""
    for name, piece in runner.PIECES.items():
        command = [str(a) for a in piece["command"]]
        if command[1] == "-m":
            assert command[2].startswith("experiments."), name
            script = command[2].replace(".", "/") + ".py"
        else:
            script = command[1]
        assert (ROOT / script).is_file(), name
    listing = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert listing.returncode == 0 and all(name in listing.stdout for name in runner.PIECES)


def test_a_piece_commits_a_safetensors_policy_with_its_settings():
    """A safetensors file does not load without the JSON beside it: a piece that copies one lists
    both among its outputs (the runner commits its outputs), and every such pair finished is in
    the tree."""
    copies = {"runs/x/policy.safetensors": "results/p/x.safetensors"}
    piece = {"command": ["python"], "copies": copies}
    assert Path("results/p/x.json") in piece_kit.outputs(piece)
    for name, piece in runner.PIECES.items():
        for out in piece_kit.outputs(piece):
            if out.suffix == ".safetensors":
                assert out.with_suffix(".json") in piece_kit.outputs(piece), name
                if weights.present(out):
                    assert (ROOT / out.with_suffix(".json")).is_file(), name


def test_every_piece_of_a_script_passes_flags_the_script_takes():
    """A script's --help lists only the flags it uses: every piece's command parses with its
    script's flags (a flag the script does not take would end the piece at its start)."""
    import importlib

    parsed = 0
    for name, piece in runner.PIECES.items():
        command = [str(a) for a in piece["command"]]
        if command[1] == "-m":
            continue
        module = importlib.import_module(command[1].removesuffix(".py"))
        common.parse_config(module.Config, command[2:])
        parsed += 1
    assert parsed > 100


def test_the_fsdp_gpu_runs_pass_flags_their_trainers_take_and_table_the_last_full_run(tmp_path):
    """experiments/fsdp_gpu.py runs on a lent GPU only: its trainer commands parse with each
    trainer's flags here, and its table takes each run from the last file where it ended well,
    its peak against the plan's FSDP2 memory on one GPU."""
    import importlib

    from experiments import fsdp_gpu

    for script, *flags in fsdp_gpu.TRAINERS.values():
        module = importlib.import_module(script.removesuffix(".py"))
        cfg = common.parse_config(module.Config, [*fsdp_gpu.COMMON, *flags, "--model", "m"])
        assert (cfg.fsdp, cfg.lora_rank, cfg.train_dtype) == (True, 0, "bfloat16")
    plan = {"MAGRPO/MLPO, whole weights, FSDP2": 20.0}
    steps = [{"step_s": 9.0, "peak_memory_mb": 1000.0}, {"step_s": 3.0, "peak_memory_mb": 25e3}]
    failed = {"returncode": 1, "stderr_tail": "graph capture"}
    files = []
    for k, magrpo in enumerate((failed, {"returncode": 0, "steps": steps})):
        runs = {"magrpo": magrpo, "solver": {"returncode": 0, "steps": steps[:1]}}
        model = {"parameters": 1.2e9, "plan_gb_per_gpu": plan, "runs": runs}
        result = {"gpu": "GPU X", "models": {"llama-1b": model, "qwen2.5-1.5b": {"skipped": "x"}}}
        files.append(tmp_path / f"r{k}.json")
        files[-1].write_text(json.dumps(result))
    rows = fsdp_gpu.table(files[:1]).splitlines()[2:]
    assert [r.split(" | ")[2] for r in rows] == ["solver"]
    rows = fsdp_gpu.table(files).splitlines()[2:]
    assert rows[0] == (
        "| llama-1b | 1.20 B | magrpo | 20.0 | 26.2 | 1.31 | 3.0 | r1.json (GPU X) |"
    )
    assert [r.split(" | ")[2] for r in rows] == ["magrpo", "solver"]


def test_every_piece_pins_its_engine_dtype():
    """The scripts' --dtype auto runs bf16 on a CPU with native bf16: a committed piece must give
    the same file on any machine, so each one names its dtype (float32: what they all ran)."""
    scripts = ("eval.py", "sft.py", "train_rl.py")
    pieces = {n: p["command"] for n, p in runner.PIECES.items() if p["command"][1] in scripts}
    assert len(pieces) > 100
    for name, command in pieces.items():
        dtype = command[command.index("--dtype") + 1]
        assert dtype == ("bfloat16" if name.endswith("-bfloat16") else "float32"), name
        assert command.count("--dtype") == 1, name


def test_the_old_critic_compared_first_differing_tokens(tiny_model):
    """experiments/confidence_auroc.py keeps the critic as it was, to measure it: on the default
    tokenizer `Correct` and `Incorrect` differ at their first token (`Correct` vs `In`)."""
    from experiments import confidence_auroc

    good, bad, prefix = confidence_auroc.verdict_token_ids(tiny_model[1])
    assert good != bad and prefix == ""
    assert tiny_model[1].decode([bad]) == "In"


def test_report_after_training_pairs_each_run_with_the_untrained_model(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in studies.after_table()
    (tmp_path / "after").mkdir()

    def summary(correct, tokens=100, **extra):
        return {
            "accuracy": sum(correct) / len(correct),
            "tokens_per_question": tokens,
            "question_ids": [1, 2, 3, 4],
            "correct": correct,
            **extra,
        }

    def write(name, **protocols):
        (tmp_path / "after" / f"{name}.json").write_text(json.dumps(protocols))

    write(
        "untrained-parallel",
        vanilla=summary([True, False, False, False]),
        **{"mpdf-persist": summary([True, False, False, False], 300)},
    )
    write("untrained-leader", **{"leader=default": summary([False, False, False, False])})
    write(
        "magrpo-L1-seed0-parallel",
        vanilla=summary([True, True, False, False]),
        **{"mpdf-persist": summary([True, True, True, False], 250)},
    )
    write(
        "magrpo-L1-seed1-parallel",
        vanilla=summary([True, True, True, False]),
        **{"mpdf-persist": summary([True, False, False, False], 250)},
    )
    write(
        "mlpo-L1-seed0-leader",
        **{
            "leader=runs/results/mlpo-L1-seed0/model": summary(
                [True, True, False, False], 400, peer_vote_correct=[True, False, False, False]
            )
        },
    )
    table = studies.after_table()
    assert "| MAGRPO: one greedy answer | 0 | 0.500 | 0.250 | +0.250 [" in table
    assert "| MAGRPO: the parallel vote of 3 agents | 0 | 0.750 | 0.250 | +0.500 [" in table
    assert "| 250 / 300 |" in table
    assert "| MAGRPO: one greedy answer | mean of 2 | | | +0.375 (sample std 0.177) | |" in table
    assert (
        "| MLPO: trained leader vs its untrained peers' vote | 0 | 0.500 | 0.250 | +0.250 ["
        in table
    )
    assert "| MLPO: trained leader vs the untrained leader | 0 | 0.500 | 0.000 | +0.500 [" in table
    assert "debate" not in table.split("Settings")[0]  # no file, no row


def test_report_study_levers_pair_each_policy_with_the_strongest_fixed_protocol(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in studies.study_table()
    for folder in ("study", "training"):
        (tmp_path / folder).mkdir()

    def summary(accuracy, correct, **extra):
        return {
            "accuracy": accuracy,
            "stderr": 0.02,
            "tokens_per_question": 100 * (1 + len(extra)),
            "calls_per_question": 3,
            "question_ids": [1, 2, 3, 4],
            "correct": correct,
            **extra,
        }

    (tmp_path / "study" / "temperature-greedy.json").write_text(
        json.dumps({"vanilla": summary(0.25, [True, False, False, False])})
    )
    # the strongest fixed protocol here
    (tmp_path / "study" / "baseline-debate.json").write_text(
        json.dumps({"debate": summary(0.5, [True, True, False, False])})
    )
    (tmp_path / "study" / "policy-softrank.json").write_text(
        json.dumps(
            {
                "mpdf=results/policies/study-softrank.pt": summary(
                    0.75,
                    [True, True, True, False],
                    actions={"persist": 0.6, "refine": 0.3, "concede": 0.1},
                    accuracy_per_round=[0.5, 0.75],
                )
            }
        )
    )
    (tmp_path / "training" / "study-softrank.json").write_text(
        json.dumps({"corpus": {"states": 768, "frac_zero_std": 0.61}})
    )
    table = studies.study_table()
    assert (
        "vs debate [95% CI]" in table
        and "| debate | 0.500 ± 0.020 | 100 | 3.0 |  |  |  |  |" in table
    )
    assert "| one greedy answer (vanilla) | 0.250 ± 0.020 |" in table and "| -0.250 [" in table
    assert (
        "| softrank | 0.750 ± 0.020 | 300 | 3.0 | 0.50/0.75 | 0.60/0.30/0.10 | 768, 0.61 | +0.250 ["
        in table
    )
    # the missing pieces, named
    assert "study/baseline-sc.json" in table and "study/policy-grpo.json" in table


def test_report_tables_a_to_d_pool_seeds_and_pair_by_question(tmp_path, monkeypatch):
    """Tables a/b: mean ± sample std over the seeds present and the paired difference pooled over
    the seeds both protocols have; table c: validation curves per reward variant; table d: one row
    per team."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "tables").mkdir()
    (tmp_path / "training").mkdir()

    def summary(correct, tokens, actions=None):
        s = {
            "accuracy": sum(correct) / len(correct),
            "stderr": 0.1,
            "tokens_per_question": tokens,
            "calls_per_question": 3.0,
            "question_ids": list(range(len(correct))),
            "correct": correct,
        }
        if actions:
            s["actions"] = actions
            s["actions_by_round"] = [actions, {"persist": 1.0, "refine": 0.0, "concede": 0.0}]
        return s

    def write(name, s):
        (tmp_path / "tables" / f"{name}.json").write_text(json.dumps({"config": {}, "p": s}))

    policy_actions = {"persist": 0.5, "refine": 0.25, "concede": 0.25}
    write("a-seed0-softrank", summary([True, True, False, False], 400, policy_actions))
    write("a-seed1-softrank", summary([True, True, True, False], 600, policy_actions))
    # seed 1 missing: pairs on seed 0 only
    write("a-seed0-persist", summary([True, False, False, False], 300))
    table = tables.seeds_table(
        "a", ["persist", "softrank"], "softrank", seeds=(0, 1), pictures=True
    )
    assert "| softrank | 2 | 0.625 ± 0.177 | 500 | 3.0 | 0.50/0.25/0.25 |  |" in table
    assert "| persist | 1 | 0.250 ± – | 300 | 3.0 |  | -0.250 [" in table and "(1) |" in table
    assert "not computed yet: `results/tables/a-seed1-persist.json`" in table
    if tables.plots.pyplot() is not None:
        assert (tmp_path / "tables" / "a-frontier.png").exists() and (
            tmp_path / "tables" / "a-actions.png"
        ).exists()
    # now pooled: 8 (seed, question) pairs
    write("a-seed1-persist", summary([False, False, False, True], 300))
    table = tables.seeds_table("a", ["persist", "softrank"], "softrank", seeds=(0, 1))
    assert "| persist | 2 | 0.250 ± 0.000 |" in table and "-0.375 [" in table and "(5) |" in table

    assert "not computed yet" in tables.reward_scale_table()
    # softrank: 22 evaluations (the table shows every 2nd and the last); grpo: two
    curves = {
        ("softrank", "x1"): [(10 * k, 0.3 if k < 11 else 0.5) for k in range(21)] + [(210, 0.4)],
        ("grpo", "x10"): [(0, 0.3), (10, 0.2)],
    }
    for (algo, variant), points in curves.items():
        rows = [
            row
            for step, accuracy in points
            for row in ({"step": step, "val_accuracy": accuracy}, {"step": step + 5, "loss": 1.0})
        ]
        (tmp_path / "training" / f"arith-seed0-{algo}-{variant}.metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    (tmp_path / "policies").mkdir()
    for algo, variant, w in (("grpo", "x1", [1.0, 2.0]), ("grpo", "x10", [1.0, 2.5])):
        torch.save(
            {"state_dict": {"w": torch.tensor(w)}},
            tmp_path / "policies" / f"arith-seed0-{algo}-{variant}.pt",
        )
    table = tables.reward_scale_table()
    # mean of 10 × 0.5 and 0.4
    assert (
        "| softrank | x1 | 0: 0.30, 20: 0.30, 40: 0.30, 60: 0.30, 80: 0.30, 100: 0.30, "
        "120: 0.50, 140: 0.50, 160: 0.50, 180: 0.50, 200: 0.50, 210: 0.40 | 0.491 | 0.400 | – |"
    ) in table
    assert "| grpo | x10 | 0: 0.30, 10: 0.20 | 0.200 | 0.200 | 5.0e-01 |" in table
    assert "arith-seed0-grpo-exp.metrics.jsonl" in table

    write("scaling-a2-r3-persist", summary([True, False, False, False], 200))
    write("scaling-a2-r3-softrank", summary([True, True, False, False], 250))
    table = tables.scaling_table([(2, 3), (3, 1)])
    assert (
        "| 2 | 3 | 0.250 (200) | 0.500 (250) | – | +0.250 [" in table and "| 3 | 1 |" not in table
    )
    # debate is expected for 3 agents only (run.scaling_protocols): a missing 2-agent debate is not
    # listed
    assert "scaling-a3-r1-debate.json" in table and "scaling-a2-r3-debate.json" not in table


def test_report_lora_pairs_adapters_with_full_fine_tuning(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in studies.lora_table()
    for folder in ("after", "agents", "llm", "bench"):
        (tmp_path / folder).mkdir()

    def write(name, correct, tokens):
        vote = {
            "accuracy": sum(correct) / 4,
            "tokens_per_question": tokens,
            "question_ids": [1, 2, 3, 4],
            "correct": correct,
        }
        (tmp_path / "after" / f"{name}.json").write_text(json.dumps({"mpdf-persist": vote}))

    write("untrained-parallel", [True, False, False, False], 300)
    write("magrpo-sum-L1-seed0-parallel", [True, True, False, False], 250)
    write("magrpo-lora-lr1e-4-L1-seed0-parallel", [True, True, True, False], 240)
    (tmp_path / "agents" / "magrpo-lora-lr1e-4-L1-seed0.pt").write_bytes(b"x" * 1234)
    for kind, steps in (("full", (9.0, 10.0, 20.0)), ("lora", (9.0, 8.0, 12.0))):
        rows = [
            {
                "step": k + 1,
                "mean_reward": 0.1,
                "step_s": s,
                "rollout_s": 4.0,
                "peak_memory_mb": 100.0 * (k + 1),
            }
            for k, s in enumerate(steps)
        ]
        path = tmp_path / "llm" / f"cost-{kind}-L1.metrics.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = studies.lora_table()
    assert "| full fine-tuning (sum), seed 0 | 0.500 | +0.250 [" in table
    # the adapters against the untrained team and against full fine-tuning, with the file's size
    row = next(line for line in table.splitlines() if line.startswith("| magrpo-lora-lr1e-4"))
    assert row.startswith("| magrpo-lora-lr1e-4-L1-seed0 | 0.750 | +0.500 [")
    assert "| +0.250 [" in row and row.endswith("| 240 | 1,234 |")
    # more seeds: each against the full run of its own seed, else seed 0's (said so); the mean
    write("magrpo-sum-L1-seed1-parallel", [False, False, False, False], 250)
    write("magrpo-lora-lr1e-4-L1-seed1-parallel", [True, False, False, False], 240)
    write("magrpo-lora-lr1e-4-L1-seed2-parallel", [False, False, False, False], 240)
    table = studies.lora_table()
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert "| +0.250 [" in rows["magrpo-lora-lr1e-4-L1-seed1"]  # 0.25 - 0.00 (seed 1's full)
    assert "| -0.500 [" in rows["magrpo-lora-lr1e-4-L1-seed2"]  # 0.00 - 0.50 (seed 0's full)
    assert "(seed 0's)" in rows["magrpo-lora-lr1e-4-L1-seed2"]
    assert "(seed 0's)" not in rows["magrpo-lora-lr1e-4-L1-seed1"]
    assert rows["lr 1e-4, mean of 3 seeds"].startswith(
        "| lr 1e-4, mean of 3 seeds | 0.333 (sample std 0.382) |"
    )
    # the full runs' mean; the adapters' mean gap to the full run of their own seed (seeds 0, 1:
    # +0.25 each; seed 2 has no full run of its own, so it is left out of the mean), and the paired
    # difference pooled over those seeds' questions (8 pairs, 2 of them disagree)
    assert rows["full fine-tuning (sum), mean of 2 seeds"].startswith(
        "| full fine-tuning (sum), mean of 2 seeds | 0.250 (sample std 0.354) |"
    )
    gap = "| +0.250 (sample std 0.000, 2 seeds paired with their own; pooled: +0.250 ["
    assert gap in rows["lr 1e-4, mean of 3 seeds"]
    assert rows["lr 1e-4, mean of 3 seeds"].endswith("] (2)) | | |")
    # the cost of a step leaves the first (warm-up) step out
    assert "| full fine-tuning | 15 | 4 | 11 | 300 |" in table
    assert "| LoRA rank 4 | 10 | 4 | 6 | 300 |" in table


def test_report_dtype_tables_pair_bf16_with_fp32_by_question(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in dtype_tables.dtype_accuracy_table()
    assert "not computed yet" in dtype_tables.dtype_bench_table()
    for folder in ("dtype", "tables", "bench"):
        (tmp_path / folder).mkdir()

    def summary(correct, tokens):
        return {
            "accuracy": sum(correct) / 4,
            "tokens_per_question": tokens,
            "question_ids": [1, 2, 3, 4],
            "correct": correct,
        }

    for seed in (0, 1):  # seed 2 missing: named, the rest pooled over the seeds both have
        softrank = f"mpdf=results/policies/arith-seed{seed}-softrank.pt"
        for dtype, vote in (("bfloat16", [1, 1, 0, 0]), ("float32", [1, 0, 0, 0])):
            run = {
                "vanilla": summary([1, 0, 0, 0], 100),
                "mpdf-persist": summary(vote, 300),
                softrank: summary([1, 1, 1, 0], 300),
                "machine": "cpu: X (amx)",
            }
            (tmp_path / "dtype" / f"arith300-seed{seed}-{dtype}.json").write_text(json.dumps(run))
        (tmp_path / "tables" / f"arith300-seed{seed}-persist.json").write_text(
            json.dumps({"mpdf-persist": summary([0, 0, 0, 0], 300)})
        )
    table = dtype_tables.dtype_accuracy_table()
    vote = next(line for line in table.splitlines() if line.startswith("| the team's vote"))
    # bf16 0.5, fp32 0.25 in both seeds: +0.250, 2 of 8 pairs disagree; table a's fp32 0.0
    assert vote.startswith(
        "| the team's vote after round 0 | 0.500 ± 0.000 | 0.250 ± 0.000 | +0.250 ["
    )
    assert "(2) | 300 / 300 | 0.000 ± 0.000 | +0.250 [" in vote
    assert (
        "| one greedy answer | 0.250 ± 0.000 | 0.250 ± 0.000 | +0.000 [+0.000, +0.000] (0) |"
        in table
    )
    assert "arith300-seed2-bfloat16.json" in table and "cpu: X (amx)" in table
    (tmp_path / "bench" / "generate-dtypes.json").write_text(
        json.dumps(
            {
                "prompts": 4,
                "hf_tok_s": 100.0,
                "hf_bfloat16_tok_s": 150.0,
                "engine_float32_tok_s": 200.0,
                "engine_bfloat16_tok_s": 400.0,
                "ratio_fp32": 2.0,
                "ratio_bf16": 400 / 150,
                "ratio_bf16_vs_hf_fp32": 4.0,
                "rows_matching": 4,
                "rows_matching_bf16": 3,
                "rows_matching_bf16_vs_hf_fp32": 2,
                "repeats": 2,
                "all_tok_s": {"hf": [100.0]},
                "engine_int8_tok_s": 300.0,
                "roofline_frac_fp32": 0.4,
                "peak_flops_fp32": 3e11,
                "roofline_frac_bf16": 0.2,
                "peak_flops_bf16": 2e12,
                "machine": "cpu: X",
            }
        )
    )
    bench = dtype_tables.dtype_bench_table()
    assert "| 100.0 | 150.0 | 200.0 | 400.0 | 2.00 | 2.67 | **4.00** | 4/4; 3/4; 2/4 |" in bench
    assert "round-dtypes.json" in bench  # the missing round, named


def test_the_aggregator_at_another_rate_changes_its_rate_and_names_only():
    """The lr-1e-4 aggregator is the preset's run with --lr 1e-4 (named once), its adapter, metrics
    and table named by the rate; only seed 0 runs at the preset's rate."""
    preset = runner.PIECES["llm-mlpo-aggregator-varied-seed0"]["command"]
    slower = runner.PIECES["llm-mlpo-aggregator-varied-lr1e-4-seed0"]["command"]
    assert preset[preset.index("--lr") + 1] == "5e-4" and slower.count("--lr") == 1
    assert slower[slower.index("--lr") + 1] == "1e-4"
    renamed = [
        "5e-4" if a == "1e-4" else a.replace("-lr1e-4", "") if isinstance(a, str) else a
        for a in slower
    ]
    assert renamed == preset
    table = runner.PIECES["table-arith300-team-varied-seed0-aggregator-lr1e-4"]
    assert "leader=default+results/agents/mlpo-aggregator-varied-lr1e-4-seed0" in table["command"]
    assert table["outputs"] == ["results/tables/arith300-team-varied-seed0-aggregator-lr1e-4.json"]
    seeds = {n[-1] for n in runner.PIECES if n.startswith("llm-mlpo-aggregator-varied-")}
    assert seeds == {"0", "1", "2"} and "llm-mlpo-aggregator-varied-seed1" not in runner.PIECES


def test_team_pieces_play_the_team_and_need_its_adapters():
    """A trained team's pieces: every training and evaluation piece of a team passes its --models
    (and the team's game flags) and needs its committed adapters; the policies of a team are its
    own; one greedy answer per distinct member."""
    for team, models in teams.TEAMS.items():
        adapters = [e.partition("+")[2] for e in models.split(",") if "+" in e]
        mine = {n: p for n, p in runner.PIECES.items() if f"team-{team}-seed0" in n}
        members = list(dict.fromkeys(models.split(",")))
        vanilla = {n: p for n, p in mine.items() if "-vanilla-m" in n}
        assert len(vanilla) == len(members)
        for j, member in enumerate(members):
            command = vanilla[f"table-arith300-team-{team}-seed0-vanilla-m{j}"]["command"]
            assert command[command.index("--models") + 1] == ",".join([member] * 3)
        names = {n.split(f"team-{team}-seed0-")[1] for n in mine if n.startswith("table-")}
        # the competent teams add plain ranks, leave-one-out and an MLPO leader
        competent = {"ranks", "loo", "leader"} if team in ("worked", "varied", "revised") else set()
        # and team varied an aggregator leader over whole solutions, at two learning rates, each
        # again under the reward rules (-strict), and its MLPO leader under them
        competent |= (
            {"aggregator", "aggregator-lr1e-4", "aggregator-strict", "aggregator-lr1e-4-strict"}
            | {"leader-strict"}
            if team == "varied"
            else set()
        )
        # and the rules that decide when to talk, beside team varied's policies
        competent |= (
            set(rule_pieces.FIXED_RULES) | {"gate", "trigger"} if team == "varied" else set()
        )
        # and the SFT policy that reads whether the written steps check (the split study's)
        competent |= {"sft-text"} if team == "varied" else set()
        assert names == {
            *(f"vanilla-m{j}" for j in range(len(members))),
            "persist",
            "sft",
            "softrank",
            "grpo",
            "softrank-cost0",
            "sc",
            "debate",
            *competent,
        }
        for name, piece in mine.items():
            command = piece["command"]
            assert set(adapters) <= set(piece["needs"]), name
            if name.startswith("llm-mlpo-team-"):
                # the leader's frozen peers are the team
                assert command[command.index("--peers") + 1] == models, name
            elif "vanilla" not in name:
                assert command[command.index("--models") + 1] == models, name
            # a team's own game flags reach every piece that plays its game (the revised team:
            # whole solutions); a member alone plays no REFINE
            playing = "vanilla" not in name
            assert all(f in command for f in teams.TEAM_GAME.get(team, [])) == playing or (
                team not in teams.TEAM_GAME
            ), name
            policy = next((a for a in command if str(a).startswith("mpdf=")), "")
            if policy:
                algo = name.split("seed0-")[1]
                # the policy's committed file (its one copy: llm_pieces.CONVERTED; a newer one
                # is written as safetensors)
                old = f"results/policies/arith-team-{team}-seed0-{algo}.pt"
                assert policy in (
                    f"mpdf={llm_pieces.committed(old)}",
                    f"mpdf={old.removesuffix('.pt')}.safetensors",
                )
                assert policy[5:] in piece["needs"]
        rl = mine[f"train-arith-team-{team}-seed0-softrank"]["command"]
        assert rl[rl.index("--init") + 1] == f"results/policies/arith-team-{team}-seed0-sft.pt"
        free = mine[f"train-arith-team-{team}-seed0-softrank-cost0"]["command"]
        assert free[free.index("--refine-cost") + 1] == "0" and "--refine-cost" not in rl
        assert free[free.index("--algo") + 1] == "softrank"
        if competent:
            leader = mine[f"table-arith300-team-{team}-seed0-leader"]
            adapter = f"results/agents/mlpo-team-{team}-seed0.pt"
            assert f"leader=default+{adapter}" in leader["command"] and adapter in leader["needs"]
            assert leader["command"][leader["command"].index("--rounds") + 1] == "0"
            assert mine[f"llm-mlpo-team-{team}-seed0"]["copies"]
    # the default team's pieces keep their names and files, each weight committed once
    policy = piece_kit.table_policy("arith", "softrank", 1)
    assert policy == "results/policies/arith-seed1-softrank.pt"
    policy = piece_kit.table_policy("arith", "softrank", 0)
    assert policy == "results/policies/arith-seed0-softrank.safetensors"
    assert "default+results/agents/worked-L1-r8-seed0," in teams.TEAMS["varied"]
    for old, new in llm_pieces.CONVERTED.items():
        assert (ROOT / new).exists() and not (ROOT / old).exists(), old
    assert "--models" not in runner.PIECES["train-arith-seed0-sft"]["command"]


def test_report_refine_table_pairs_rounds_and_teams(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in team_tables.refine_table()
    (tmp_path / "after").mkdir()

    def write(name, before, after, round0=None):
        ids = [1, 2, 3, 4]
        vote = {"accuracy": sum(before) / 4, "question_ids": ids, "correct": before}
        debate = {
            "accuracy": sum(after) / 4,
            "question_ids": ids[::-1],
            "correct": after[::-1],
            "accuracy_per_round": [sum(before) / 4 if round0 is None else round0, sum(after) / 4],
        }
        (tmp_path / "after" / f"{name}-parallel.json").write_text(
            json.dumps({"mpdf-persist": vote})
        )
        (tmp_path / "after" / f"{name}-debate.json").write_text(json.dumps({"debate": debate}))

    # untrained: REFINE loses question 1 (-0.25); seed 0 trained to revise: gains questions 2 and 3
    # (+0.5), loses none; seed 1: gains 2, loses 1 (0)
    write("untrained", [True, False, False, False], [False, False, False, False])
    write("magrpo-debate-L1-seed0", [True, False, False, False], [True, True, True, False])
    write("magrpo-debate-L1-seed1", [True, False, False, True], [False, True, False, True], 0.4)
    # a run warm-started from seed 0's parallel-trained adapters is compared with their REFINE
    # (which loses questions 1 and 2), not with the untrained team's: +0.25 - (-0.5)
    write("magrpo-lora-lr5e-4-L1-seed0", [True, True, False, False], [False, False, False, False])
    write("magrpo-debate-warm-L1-seed0", [True, False, False, False], [True, False, True, False])
    rows = [line for line in team_tables.refine_table().splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| untrained agents |  | 0.250 | 0.000 | -0.250 [")
    assert rows[1].endswith("(1) |  |")
    assert rows[2].startswith("| MAGRPO on parallel answers, adapters (lr 5e-4) | 0 | 0.500 | ")
    seed0 = "| MAGRPO on debate, adapters (lr 5e-4) | 0 | 0.250 | 0.750 | +0.500 ["
    assert rows[3].startswith(seed0)
    # +0.5 - (-0.25), per question
    assert rows[3].endswith("(2) | +0.750 [+0.250, +1.000] (3) (untrained) |")
    assert "| 1 | 0.500 (debate's round 0: 0.400) | 0.500 | +0.000 [" in rows[4]
    assert rows[5].endswith("| mean of 2 | | | +0.250 (sample std 0.354) | |")
    warm = "| MAGRPO on parallel answers (adapters), then on debate | 0 | 0.250 | 0.500 | +0.250 ["
    assert rows[6].startswith(warm)
    assert rows[6].endswith("| +0.750 [+0.250, +1.000] (3) (magrpo-lora-lr5e-4-L1-seed0) |")
    # the README's sentence waits for every seed, then averages the changes (+0.5, 0) and their
    # paired differences from the untrained change (+0.75, +0.25)
    assert team_tables.debate_training_sentence() is None
    sentence = team_tables.debate_training_sentence(seeds=(0, 1))
    assert "; 2 seeds)" in sentence
    assert "vote by +0.250 (sample std 0.354) against the untrained agents' -0.250" in sentence
    assert "+0.500 (sample std 0.354) paired with the untrained agents' change" in sentence


def test_report_action_values_per_team_from_the_corpus_statistics(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "arith-team-mixed-seed0-softrank.json" in team_tables.action_value_table(
        {"mixed": "arith-team-mixed"}
    )
    (tmp_path / "training").mkdir()
    summary = {
        "corpus": {
            "states": 120,
            "refine_minus_persist": -0.0312,
            "best_kind": {"persist": 0.1, "refine": 0.25, "concede": 0.4, "tied": 0.25},
        },
        "policy_actions_on_corpus": {"persist": 0.5, "refine": 0.125, "concede": 0.375},
    }
    path = tmp_path / "training" / "arith-team-mixed-seed1-softrank.json"
    path.write_text(json.dumps(summary))
    table = team_tables.action_value_table({"mixed": "arith-team-mixed"})
    assert "| mixed | 1 | 120 | 0.10 / 0.25 / 0.40 / 0.25 | -0.031 | 0.50/0.12/0.38 |" in table
    assert "arith-team-mixed-seed0-softrank.json" in table  # the seeds still missing


def test_report_refine_value_per_team_seed_and_policy(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "not computed yet" in team_tables.refine_value_table(["mixed"])
    (tmp_path / "refine").mkdir()
    gain = {"decisions": 40, "mean_gain": 0.125, "ci95": [0.05, 0.2]}
    result = {
        "accuracy": 0.41,
        "shares": {"persist": 0.5, "refine": 0.2, "concede": 0.3},
        "taken_vs_persist": {"refine": gain, "concede": {"decisions": 0}, "persist": gain},
        "refine_at_every_decision_vs_persist": {**gain, "mean_gain": -0.25, "decisions": 200},
    }
    path = tmp_path / "refine" / "arith300-team-mixed-seed2-grpo.json"
    path.write_text(json.dumps(result))
    table = team_tables.refine_value_table(["mixed"])
    row = "| mixed | 2 | grpo | 0.410 | 0.20 | +0.125 [+0.050, +0.200] (40) | 0.30 | – (0) | "
    assert row + "-0.250 [+0.050, +0.200] (200) |" in table
    assert "arith300-team-mixed-seed0-sft.json" in table  # the pieces still missing


def test_report_after_differences_pair_each_seed_with_its_reference(tmp_path, monkeypatch):
    """The headline's paired gaps: a run minus the untrained one, or minus a reference run of the
    same seed (adapters against full fine-tuning); no sentence until every seed has both."""
    from experiments import report

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "after").mkdir()

    def write(name, correct):
        vote = {"accuracy": sum(correct) / 4, "question_ids": [1, 2, 3, 4], "correct": correct}
        (tmp_path / "after" / f"{name}.json").write_text(json.dumps({"mpdf-persist": vote}))

    for seed, (mine, full) in enumerate([(2, 3), (1, 1), (4, 2)]):
        write(f"lora-seed{seed}", [k < mine for k in range(4)])
        if seed < 2:
            write(f"full-seed{seed}", [k < full for k in range(4)])
    name, reference = "lora-seed{}", "full-seed{}"
    assert report.after_differences(name, "mpdf-persist", reference) == []  # seed 2's full missing
    write("full-seed2", [k < 2 for k in range(4)])
    assert report.after_differences(name, "mpdf-persist", reference) == [-0.25, 0.0, 0.5]
    write("untrained", [False] * 4)
    assert report.after_differences(name, "mpdf-persist", "untrained") == [0.5, 0.25, 1.0]


def test_team_sentence_names_the_strongest_fixed_protocol_and_the_free_policys_refines(
    tmp_path, monkeypatch
):
    """README's team sentence: the strongest fixed protocol is the one with the highest mean
    accuracy over the complete seeds (here sc, not the team's vote), paired with SoftRankPO on the
    same questions; a seed without its refine-value file does not count."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert team_tables.team_sentence("revisers") is None
    (tmp_path / "tables").mkdir()
    (tmp_path / "refine").mkdir()
    ids = [1, 2, 3, 4]
    correct = {
        "vanilla-m0": [0, 0, 0, 1],
        "persist": [1, 0, 0, 0],
        "sc": [1, 1, 0, 0],
        "debate": [0, 0, 0, 0],
        "softrank": [1, 1, 1, 0],
        "softrank-cost0": [1, 0, 1, 0],
    }
    for seed in (0, 1):
        for part, right in correct.items():
            summary = {
                "accuracy": sum(right) / 4,
                "question_ids": ids,
                "correct": right,
                "actions": {"persist": 0.8, "refine": 0.0, "concede": 0.2},
                "any_agent_right_round0": 0.75,
            }
            path = tmp_path / "tables" / f"arith300-team-revisers-seed{seed}-{part}.json"
            path.write_text(json.dumps({part: summary}))
    value = {
        "shares": {"persist": 0.5, "refine": 0.25, "concede": 0.25},
        "taken_vs_persist": {"refine": {"decisions": 8, "mean_gain": -0.125, "ci95": [-0.25, 0.0]}},
    }
    (tmp_path / "refine" / "arith300-team-revisers-seed0-softrank-cost0.json").write_text(
        json.dumps(value)
    )
    text = team_tables.team_sentence("revisers")
    assert "× 1 seed)" in text  # seed 1 has no refine-value file yet
    assert (
        "SoftRankPO 0.750 against the team's strongest fixed protocol (self-consistency, 0.500): "
        "+0.250 [" in text
    )
    assert "REFINE on 0% of its decisions" in text
    # the vote 0.25, the oracle 0.75: SoftRankPO's 0.75 closes the whole gap
    assert (
        "closing +100% of the gap from the team's vote (0.250) to the oracle (any member right in "
        "round 0, 0.750)" in text
    )
    assert "it plays 0.500 (+0.000 [" in text and "] (2) against the same)" in text
    assert "REFINEs on 25% of its decisions and each REFINE gains -0.125 [-0.250, +0.000]" in text


def test_competent_team_table_measures_the_gap_to_the_oracle_and_where_the_vote_is_wrong(
    tmp_path, monkeypatch
):
    """A competent team's table: the strongest fixed protocol (sc here) is each row's reference; the
    gap from the vote (0.25) to the oracle (0.75) closed, and the accuracy on the questions the vote
    gets wrong (2, 3 and 4)."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "tables").mkdir()
    # a team's aggregator leader has its row beside the policies
    monkeypatch.setattr(team_tables, "TEAM_AGGREGATORS", {"worked": ["aggregator-lr1e-4"]})
    correct = {
        "persist": [1, 0, 0, 0],
        "sc": [1, 1, 0, 0],
        "softrank": [1, 1, 1, 0],
        "aggregator-lr1e-4": [0, 1, 1, 0],
    }
    for part, right in correct.items():
        summary = {
            "accuracy": sum(right) / 4,
            "question_ids": [1, 2, 3, 4],
            "correct": right,
            "tokens_per_question": 100,
            "any_agent_right_round0": 0.75,
        }
        path = tmp_path / "tables" / f"arith300-team-worked-seed0-{part}.json"
        path.write_text(json.dumps({part: summary}))
    text = team_tables.competent_team_table("worked", seeds=(0,))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()]
    rows = {row[0]: row for row in cells if len(row) == 8}
    assert "vs self-consistency" in text
    assert rows["self-consistency"][6:8] == ["+0.50", "0.333 (3)"]
    assert rows["softrank"][6:8] == ["+1.00", "0.667 (3)"]
    assert (
        rows["aggregator-lr1e-4"][2].startswith("0.500") and rows["aggregator-lr1e-4"][6] == "+0.50"
    )
    assert rows["the team's vote"][6:8] == ["", ""]
    assert rows["oracle: any member right in round 0"][2].startswith("0.750")
    assert "arith300-team-worked-seed0-debate.json" in text  # a missing protocol, named


def test_revision_skill_table_pools_the_seeds_per_view_class_and_agent(tmp_path, monkeypatch):
    """The revision table: per view and state class, the seeds' states pooled (a state is a seed,
    question and agent), the rates of REFINE, PERSIST and CONCEDE and REFINE's tokens; each
    agent's own answer against its REFINE; the files not there named."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "revision").mkdir()

    def row(id, cls, refine, persist, concede, tokens):
        keys = ("id", "class", "refine", "persist", "concede", "refine_tokens")
        return dict(zip(keys, (id, cls, refine, persist, concede, tokens)))

    whole = [
        row("t/1:0", "own right, a peer wrong", False, True, False, 100),
        row("t/1:1", "own wrong, a peer right", True, False, True, 200),
        row("t/2:0", "all wrong", True, False, False, 300),
        row("t/2:1", "all right", True, True, True, 100),
    ]
    answers = [row("t/1:0", "all right", True, True, True, 50)]
    for name, rows in (("seed0-whole", whole), ("seed1-whole", whole), ("seed0-answers", answers)):
        (tmp_path / "revision" / f"x-{name}.json").write_text(json.dumps({"rows": rows}))
    text = revision_tables.revision_skill_table("x")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()]
    rows = {(c[0], c[1]): c[2:] for c in cells if len(c) == 9}
    assert rows[("whole solutions (seeds 0,1)", "all states")][:4] == [
        "8",
        "0.750",
        "0.500",
        "0.500",
    ]
    assert rows[("whole solutions (seeds 0,1)", "all states")][-1] == "175"
    assert rows[("whole solutions (seeds 0,1)", "own right, a peer wrong")][:4] == [
        "2",
        "0.000",
        "1.000",
        "0.000",
    ]
    assert rows[("whole solutions (seeds 0,1)", "own right, a peer wrong")][4].startswith("-1.000")
    assert rows[("peers' answers (seeds 0)", "all states")][:4] == ["1", "1.000", "1.000", "1.000"]
    assert ("peers' answers (seeds 0)", "all wrong") not in rows
    assert "- peers' answers (seeds 0): agent 0 1.000 → 1.000\n" in text
    assert "- whole solutions (seeds 0,1): agent 0 0.500 → 0.500, agent 1 0.500 → 1.000" in text
    assert "`results/revision/x-seed1-answers.json`" in text
    assert "`results/revision/x-seed2-whole.json`" in text
    assert "x-seed0-whole.json`" not in text
    assert "not computed yet" in revision_tables.revision_skill_table("y")


def test_target_table_judges_each_criterion_on_the_seeds_pooled(tmp_path, monkeypatch):
    """The three conditions on a competent team: REFINE share >= 10% of decisions, the REFINEs'
    pooled gain over PERSIST above 0, >= 3 points over the strongest fixed protocol with its
    interval above 0, 3 seeds. softrank-cost0 meets each at 2 seeds but the seed count; softrank
    never REFINEs; a policy whose refine file lacks the per-decision gains waits; the leader and
    debate against the vote."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "tables").mkdir()
    (tmp_path / "refine").mkdir()
    ids = list(range(40))
    right = {
        **{f"vanilla-m{j}": [q < 20 for q in ids] for j in range(3)},
        "sc": [q < 24 for q in ids],  # the strongest fixed protocol
        "debate": [q < 10 for q in ids],
        "persist": [q < 22 for q in ids],
        "leader": [q < 23 for q in ids],
        "aggregator": [q < 21 for q in ids],
        "softrank-cost0": [q < 36 for q in ids],
        "softrank": [q < 24 or q == 39 for q in ids],
    }
    for seed in (0, 1):
        for part, correct in right.items():
            if part == "aggregator" and seed:
                continue
            summary = {"accuracy": sum(correct) / 40, "question_ids": ids, "correct": correct}
            path = tmp_path / "tables" / f"arith300-team-worked-seed{seed}-{part}.json"
            path.write_text(json.dumps({part: summary}))
        refines = {
            "softrank-cost0": {"decisions": 3, "gains": [1.0, 0.5, 1.0]},
            "softrank": {"decisions": 0},
            "grpo": {"decisions": 2, "mean_gain": 0.5},  # no per-decision gains: waits
        }
        for policy, refine in refines.items():
            path = tmp_path / "refine" / f"arith300-team-worked-seed{seed}-{policy}.json"
            path.write_text(json.dumps({"decisions": 20, "taken_vs_persist": {"refine": refine}}))
        (tmp_path / "tables" / f"arith300-team-worked-seed{seed}-grpo.json").write_text(
            json.dumps({"grpo": {"accuracy": 0.5, "question_ids": ids, "correct": right["sc"]}})
        )
    text = team_tables.target_table("worked", seeds=(0, 1, 2))
    rows = {
        row[0]: row
        for row in ([c.strip() for c in line.strip("|").split("|")] for line in text.splitlines())
        if len(row) == 5
    }
    assert "vs self-consistency" in text and "policy (2 seeds)" in text
    assert rows["softrank-cost0"][1:3] == ["15.0%", "+0.833 [+0.667, +1.000] (6)"]
    assert rows["softrank-cost0"][3].startswith("+0.300 [+0.2")
    assert rows["softrank-cost0"][4] == "not met: 3 seeds"
    assert rows["softrank"][1:3] == ["0.0%", "no REFINE"]
    assert rows["softrank"][4] == "not met: REFINE share, REFINE gain, margin, 3 seeds"
    assert "grpo" not in rows and "waiting for the table and refine-value pieces of" in text
    assert "grpo" in text.split("waiting")[1]
    assert "The MLPO leader against the team's vote (2 seeds, paired): +0.025" in text
    assert "Debate against the team's vote (2 seeds, paired): -0.300" in text
    assert (
        "The aggregator leader at learning rate 5e-4 against "
        "the team's vote (1 seed, paired): -0.025" in text
    )


def split_summary(right, dealt, tokens, refine=None, **extra):
    """eval.py's summary of the split task over questions 0..len(right)-1, with its parts."""
    n = len(right)
    summary = {
        "n": n,
        "accuracy": sum(right) / n,
        "question_ids": list(range(n)),
        "correct": right,
        "question_tokens": [tokens] * n,
        "tokens_per_question": tokens,
        **extra,
    }
    if refine is not None:
        summary["question_actions"] = [
            {"persist": int(not refine(q)), "refine": int(refine(q)), "concede": 0}
            for q in range(n)
        ]
    examples = [SimpleNamespace(id=q, meta={"dealt": dealt[q]}) for q in range(n)]
    return eval_script.by_part(summary, examples)


def test_split_tables_judge_each_target_on_the_split_and_shared_questions_apart(
    tmp_path, monkeypatch
):
    """The split task's tables: the vote right on shared questions only, debate the strongest fixed
    protocol; SoftRankPO meets every target (+0.30 over the vote, +0.05 over debate at half its
    tokens, its split REFINEs gaining, REFINE 6x as often where split); SFT fails the vote margin
    and the REFINE ratio; the other policies wait; the leader against its peers' vote and debate;
    MAGRPO's debate against the vote and the team's own debate, and the two debates round by round;
    the agents' targets per member."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    for folder in ("tables", "refine", "revision"):
        (tmp_path / folder).mkdir()
    ids = range(40)
    dealt = [q % 2 == 0 for q in ids]
    plays = {
        "persist": ([not d for d in dealt], 300),
        "sc": ([not d for d in dealt], 1200),
        "debate": ([not d or q < 20 for q, d in zip(ids, dealt)], 1000),
        "softrank": ([not d or q < 24 for q, d in zip(ids, dealt)], 500),
        "magrpo-debate": ([not d or q < 24 for q, d in zip(ids, dealt)], 1000),
        "sft": ([not d for d in dealt], 400),
        "vanilla-m0": ([q < 2 for q in ids], 100),
        **{f"alone-m{j}": ([not d and q < 30 for q, d in zip(ids, dealt)], 100) for j in range(3)},
    }
    for seed in (0, 1, 2):
        # the members' first answers and the team's answer per round, for MAGRPO's round by round
        per_round = {
            "debate": {"agent_accuracy_round0": 0.4, "accuracy_per_round": [0.3, 0.7]},
            "magrpo-debate": {
                "agent_accuracy_round0": 0.1 * seed,
                "accuracy_per_round": [0.25, 0.5 + 0.1 * seed],
            },
        }
        for part, (right, tokens) in plays.items():
            refine = (lambda q: q % 2 == 0 or q % 12 == 1) if part == "softrank" else None
            summary = split_summary(right, dealt, tokens, refine, **per_round.get(part, {}))
            path = tmp_path / "tables" / f"split300-team-split-seed{seed}-{part}.json"
            path.write_text(json.dumps({part: summary}))
        leader = split_summary(
            [not d or q < 4 for q, d in zip(ids, dealt)],
            dealt,
            200,
            peer_vote_correct=[not d for d in dealt],
        )
        (tmp_path / "tables" / f"split300-team-split-seed{seed}-leader.json").write_text(
            json.dumps({"leader": leader})
        )
        for policy, (split_share, shared_share, gains) in {
            "softrank": (0.6, 0.1, [1.0, 0.0, 1.0]),
            "sft": (0.1, 0.1, [0.0, -1.0]),
        }.items():
            parts = {
                "split": {
                    "shares": {"refine": split_share},
                    "taken_vs_persist": {"refine": {"gains": gains}},
                },
                "shared": {"shares": {"refine": shared_share}},
            }
            path = tmp_path / "refine" / f"split300-team-split-seed{seed}-{policy}.json"
            path.write_text(json.dumps({"parts": parts}))
        rows = [
            {"id": f"{q}:{j}", "refine": d and (j < 2 or q < 10), "dealt": d}
            for q, d in zip(ids, dealt)
            for j in range(3)
        ]
        path = tmp_path / "revision" / f"split300-team-split-seed{seed}.json"
        path.write_text(json.dumps({"rows": rows}))

    def cells(text, width):
        lines = ([c.strip() for c in line.strip("|").split("|")] for line in text.splitlines())
        return {row[0]: row for row in lines if len(row) == width}

    target = cells(split_tables.split_target_table(), 7)
    assert "vs debate (every agent REFINEs every round) (≥ 0)" in split_tables.split_target_table()
    assert target["softrank"][1].startswith("+0.300 [")
    assert target["softrank"][2].startswith("+0.050 [") and target["softrank"][3] == "50%"
    assert target["softrank"][4].startswith("+0.667 [") and target["softrank"][5] == "0.60 / 0.10"
    assert target["softrank"][6] == "met"
    assert target["sft"][6] == "not met: vote, strongest, REFINE gain, REFINE where split"
    text = split_tables.split_target_table()
    assert "grpo" not in target and "grpo" in text.split("waiting")[1]

    def line_after(prefix):
        return text.split(prefix)[1].split("\n")[0]

    # the leader gains on split questions only; every line says each part apart
    leader_vote = line_after("The MLPO leader against its peers' vote (3 seeds, paired): ")
    assert leader_vote.startswith("+0.050 [")
    assert "; split questions +0.100 [" in leader_vote
    assert "; shared questions +0.000 [+0.000, +0.000] (0)." in leader_vote
    versus = "The MLPO leader against debate (every agent REFINEs every round) (3 seeds, paired): "
    leader_debate = line_after(versus)
    assert leader_debate.startswith("-0.200 [") and "; split questions -0.400 [" in leader_debate
    assert leader_debate.endswith(
        "; shared questions +0.000 [+0.000, +0.000] (0); at 20% of its tokens."
    )
    debated = "Debate by the MAGRPO-trained agents against the team's"
    magrpo_vote = line_after(f"{debated} vote (3 seeds, paired): ")
    assert magrpo_vote.startswith("+0.300 [") and "; split questions +0.600 [" in magrpo_vote
    assert magrpo_vote.endswith("; shared questions +0.000 [+0.000, +0.000] (0).")
    magrpo_debate = line_after(f"{debated} own debate (3 seeds, paired): ")
    assert magrpo_debate.startswith("+0.050 [") and "; split questions +0.100 [" in magrpo_debate
    assert line_after("Round by round, the team's own debate → the MAGRPO-trained agents' ") == (
        "(mean over 3 seeds): members' own first answers right 0.400 → 0.100; the team's answer "
        "after round 0 0.300 → 0.250, after round 1 0.700 → 0.600."
    )
    team = cells(split_tables.split_team_table(), 10)
    assert team["the team's vote after round 0"][2:5] == ["0.500 ± 0.000", "0.000", "1.000"]
    # REFINE on every split question, on 4 of the 20 shared ones
    assert team["softrank"][6:8] == ["0.00/1.00/0.00", "0.80/0.20/0.00"]
    assert team["softrank"][8].startswith("+0.300 [") and team["softrank"][9].startswith("+0.600 [")
    assert "split300-team-split-seed0-grpo.json" in split_tables.split_team_table()
    agents = cells(split_tables.split_agents_table(), 5)
    rows = {row[0][0]: row for row in agents.values() if row[0][0].isdigit()}
    assert rows["0"][1:4] == ["0.000", "0.750", "1.000"] and rows["2"][3] == "0.250"


def test_the_split_revision_table_keeps_the_split_and_shared_states_apart(tmp_path, monkeypatch):
    """Each part's states per class, pooled over the seeds computed: on split questions every state
    all wrong and REFINE right in 3 of 4; on shared ones the classes as played, CONCEDE mending
    where a peer was right; each agent's own answer → its REFINE per part; a seed not computed
    named."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "revision").mkdir()

    def row(q, agent, dealt, cls, refine, persist, concede):
        return {
            "id": f"{q}:{agent}",
            "class": cls,
            "refine": refine,
            "persist": persist,
            "concede": concede,
            "refine_tokens": 100 + 100 * dealt,
            "dealt": dealt,
        }

    for seed in (0, 1):
        rows = [
            row(q, j, True, "all wrong", q % 4 != 0, False, False) for q in range(4) for j in (0, 1)
        ]
        # seed 1 kept why: question 0's agent 0 got no value from its peers, its agent 1 slipped
        if seed:
            for r in rows:
                r |= {"peers_state_lacked": True, "refine_states_all": True}
                r["refine_steps_right"] = r["id"] != "0:1"
            rows[0]["peers_state_lacked"] = False
        rows += [row(4, 0, False, "own right, a peer wrong", True, True, False)]
        rows += [row(4, 1, False, "own wrong, a peer right", False, False, True)]
        (tmp_path / "revision" / f"split300-team-split-seed{seed}.json").write_text(
            json.dumps({"rows": rows})
        )
    text = split_tables.split_revision_table()
    cells = {
        (row[0], row[1]): row[2:]
        for row in ([c.strip() for c in line.strip("|").split("|")] for line in text.splitlines())
        if len(row) == 9
    }
    split_all = cells[("split (seeds 0,1)", "all wrong")]
    assert split_all[:4] == ["16", "0.750", "0.000", "0.000"] and split_all[-1] == "200"
    assert ("split (seeds 0,1)", "own right, a peer wrong") not in cells
    mended = cells[("shared (seeds 0,1)", "own wrong, a peer right")]
    assert mended[:4] == ["2", "0.000", "0.000", "1.000"] and mended[-1] == "100"
    assert cells[("shared (seeds 0,1)", "all states")][:4] == ["4", "0.500", "0.500", "0.500"]
    misses = text.split("the REFINEs that ended wrong")[1]
    assert misses.startswith(" (2 of 8 states), by cause: a value it lacked stated by no peer's")
    assert "first solution: 1; given by a peer, not stated in its REFINE: 0; every value" in misses
    assert "a step's arithmetic wrong: 1; every value stated and every step right" in misses
    assert "(8 states of revision files without the causes left out.)" in misses
    assert "- split questions: agent 0 0.000 → 0.750, agent 1 0.000 → 0.750" in text
    assert "- shared questions: agent 0 1.000 → 1.000, agent 1 0.000 → 0.000" in text
    assert "split300-team-split-seed2.json" in text


def test_every_piece_names_each_flag_once_with_the_value_it_runs_with():
    """A preset followed by a piece's changes becomes one command: the later value in the earlier
    one's place, a flag without a value kept, positional arguments kept in order."""
    command = ["py", "x.py", "--lr", "1e-5", "--quiet", "--n", "3", "--lr", "5e-4", "--quiet"]
    assert piece_kit.flags_once(command) == ["py", "x.py", "--lr", "5e-4", "--quiet", "--n", "3"]
    assert piece_kit.flags_once(["py", "--lam", "-0.1", "--lam", "0"]) == ["py", "--lam", "0"]
    for name, piece in runner.PIECES.items():
        flags = [str(t) for t in piece["command"] if str(t).startswith("--")]
        assert len(flags) == len(set(flags)), name


def test_team_change_pairs_each_protocol_of_two_teams_on_the_same_questions(tmp_path, monkeypatch):
    """Each protocol both teams played, after minus before on the same questions pooled over the
    seeds both have (a seed only one team played is left out); the oracle of each team."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "tables").mkdir()
    ids = list(range(10))

    def write(team, seed, part, right, oracle=None):
        summary = {"accuracy": sum(right) / 10, "question_ids": ids, "correct": right}
        if oracle is not None:
            summary["any_agent_right_round0"] = oracle
        path = tmp_path / "tables" / f"arith300-team-{team}-seed{seed}-{part}.json"
        path.write_text(json.dumps({part: summary}))

    for seed in (0, 1):
        write("varied", seed, "persist", [q < 5 for q in ids], oracle=0.6)
        write("revised", seed, "persist", [q < 7 for q in ids], oracle=0.8 + 0.1 * seed)
        write("varied", seed, "ranks", [q < 8 for q in ids])
        # seed 0: two questions lost, one gained; seed 1: the same as before
        write("revised", seed, "ranks", [q < 6 or (q == 9 and not seed) for q in ids])
    write("varied", 2, "persist", [False] * 10, oracle=0.0)  # only one team: left out
    text = team_tables.team_change("varied", "revised", seeds=(0, 1, 2))
    rows = {
        row[0]: row
        for row in ([c.strip() for c in line.strip("|").split("|")] for line in text.splitlines())
        if len(row) == 5
    }
    assert rows["the team's vote"][1:4] == ["2", "0.500", "0.700"]
    assert rows["the team's vote"][4].startswith("+0.200 [") and "(4)" in rows["the team's vote"][4]
    # ranks: (-2 + 1) / 10 at seed 0, -2 / 10 at seed 1, pooled over 20 questions: -0.150
    assert rows["ranks"][1:4] == ["2", "0.800", "0.650"]
    assert rows["ranks"][4].startswith("-0.150 [") and "(5)" in rows["ranks"][4]
    assert "sft" not in rows
    assert rows["oracle: any member right in round 0"][2:4] == ["0.600", "0.850"]
    assert "not computed yet" in team_tables.team_change("worked", "revised")


def test_each_team_table_asks_for_its_own_members_greedy_answers(tmp_path, monkeypatch):
    """revisers has one distinct member, mixed three: each table's missing files say so (a report
    lambda that read the loop's last team would ask revisers for three)."""
    from experiments import report

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    revisers, mixed = report.TABLES["team-revisers"](), report.TABLES["team-mixed"]()
    assert "team-revisers-seed0-vanilla-m0.json" in revisers
    assert "vanilla-m1" not in revisers
    assert "team-mixed-seed0-vanilla-m2.json" in mixed


def test_mutation_table_lists_every_run_from_its_file(tmp_path, monkeypatch):
    """Each run's counts, and whether the code it mutated is today's: the whole module's, or only
    the functions a stage script's run named (an edit elsewhere in the file leaves it current)."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    assert "not computed yet" in tables.mutation_table()
    (tmp_path / "mutation").mkdir()
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "x.py").write_text("def f():\n    return 1\n")
    (tmp_path / "y.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    run = {
        "path": "llm/x.py",
        "only": [],
        "mutants": 10,
        "killed": 6,
        "timeouts": 1,
        "equivalent_by_review": 2,
        "survived": 1,
        "score": 0.875,
        "finished": "2026-11-27 04:00",
    }
    named = dict(run, path="y.py", only=["y.x_f__mutmut_*"])
    for name, r in {"llm.x": run, "y": named, "old": dict(run, path="gone.py")}.items():
        r = dict(r, mutated_source_sha256=mutated_source(tmp_path, r["path"], r["only"]))
        (tmp_path / "mutation" / f"{name}.json").write_text(json.dumps(r))
    (tmp_path / "mutation" / "z.json").write_text(json.dumps(run))
    head = "| 10 | 6 | 1 | 2 | 1 | 0.8750 | 2026-11-27 04:00 |"
    assert tables.mutation_table().splitlines()[2:] == [
        f"| `llm.x.json` | `llm/x.py` {head} today's |",
        f"| `old.json` | `gone.py` {head} its file is gone |",
        f"| `y.json` | `y.py` (the functions named) {head} today's |",
        f"| `z.json` | `llm/x.py` {head} not recorded |",
    ]
    # g was not mutated: its edit leaves y's score current; f's makes it stale, as any edit of x
    (tmp_path / "y.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 3\n")
    assert tables.mutation_table().splitlines()[4].endswith("| today's |")
    (tmp_path / "y.py").write_text("def f():\n    return 0\n\n\ndef g():\n    return 3\n")
    (tmp_path / "llm" / "x.py").write_text("def f():\n    return 1  # one\n")
    lines = tables.mutation_table().splitlines()
    assert lines[2].endswith("| changed since |") and lines[4].endswith("| changed since |")
    assert lines[5].endswith("| not recorded |")


def test_the_demo_tables_show_the_competent_team_where_the_demo_played_it(tmp_path, monkeypatch):
    """make-demo.json: the untrained backbone's table with the run's time; the competent team's
    table after it when the demo played one (an older file without it: the first table alone);
    the split task's after that, each part of its questions on its own row."""
    from experiments import report

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert "python -m experiments.make_demo" in report.demo_table()

    def played(reference, rounds, accuracy, models=""):
        config = {"seed": 0, "agents": 3, "rounds": rounds, "reference": reference}
        row = {"n": 32, "stderr": 0.05, "tokens_per_question": 100.0}
        paired = {"diff": -0.25, "ci95": [-0.5, 0.0], "disagree": 8}
        return {
            "config": config | ({"models": models} if models else {}),
            "machine": "cpu: Chip",
            "vanilla": row | {"accuracy": 0.5, "vs_reference": paired},
            reference: row
            | {"accuracy": accuracy, "actions": {"persist": 1.0, "refine": 0.0, "concede": 0.0}},
        }

    run = played("mpdf=a.pt", 2, 0.25)
    run["make_demo"] = {"seconds": 500.0, "setup_seconds": 70.0, "commit": "abc1234"}
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "make-demo.json").write_text(json.dumps(run))
    first = report.demo_table()
    assert first.splitlines()[2:4] == [
        "| `vanilla` | 0.500 ± 0.050 | 100 |  | -0.250 [-0.500, +0.000] (8) | not computed |",
        "| `mpdf=a.pt` | 0.250 ± 0.050 | 100 | 1.00/0.00/0.00 |  | none: no full-size table |",
    ]
    assert first.endswith(
        "32 `arith` test questions (seed 0), 3 agents, 2 rounds. `make demo` took 500 s in a fresh "
        "clone with a cold generation cache, at commit abc1234 (cpu: Chip; `make setup model` "
        "before it: 70 s)."
    )
    run["competent"] = played("mpdf=b.pt", 3, 0.875, models="default+x.pt")
    (tmp_path / "demo" / "make-demo.json").write_text(json.dumps(run))
    both = report.demo_table()
    assert both.startswith(first)
    second = both[len(first) :]
    assert "team `varied` (`--models default+x.pt`)" in second
    assert "| `mpdf=b.pt` | 0.875 ± 0.050 | 100 | 1.00/0.00/0.00 |  | none: " in second
    assert second.endswith("32 `arith` test questions (seed 0), 3 agents, 3 rounds.")
    split = played("mpdf=c.pt", 3, 0.75, models="default+y")
    split["config"]["task"] = "split"
    parts = {"split": 0.5, "shared": 1.0}
    split["mpdf=c.pt"]["parts"] = {
        part: {"n": 16, "accuracy": accuracy, "tokens_per_question": 80.0 + 40 * (part == "split")}
        | {"actions": {"persist": 0.5, "refine": 0.5 * (part == "split"), "concede": 0.0}}
        for part, accuracy in parts.items()
    }
    run["split"] = split
    (tmp_path / "demo" / "make-demo.json").write_text(json.dumps(run))
    third = report.demo_table()[len(both) :]
    assert "team `split` (`--models default+y`)" in third
    row = "| `mpdf=c.pt` | 0.750 ± 0.050 | 100 | 1.00/0.00/0.00 |  | none: no full-size table |\n"
    assert third.split(row)[1].startswith(
        "| ↳ split questions (16) | 0.500 | 120 | 0.50/0.50/0.00 |  |  |\n"
        "| ↳ shared questions (16) | 1.000 | 80 | 0.50/0.00/0.00 |  |  |\n"
    )
    assert third.endswith("32 `split` test questions (seed 0), 3 agents, 3 rounds.")


def test_every_reviewed_mutant_has_a_known_module_and_a_reason_in_words():
    """experiments/equivalent_mutants.json: a module mutation.py runs, mutant names of that
    module, and each reason a sentence or the name of one under "reasons" (a misspelt name
    would otherwise stand in the JSON as the reason)."""
    from experiments import mutation

    review = json.loads(mutation.REVIEW.read_text())
    assert set(review["mutants"]) <= set(mutation.MODULES)
    for module, mutants in review["mutants"].items():
        # mutmut names a mutant by its file's dotted path
        dotted = mutation.MODULES[module][0].removesuffix(".py").replace("/", ".")
        assert all(name.startswith(f"{dotted}.x") for name in mutants), module
        for why in mutation.equivalent_mutants(module).values():
            assert " " in why and why not in review["reasons"], why


def test_revision_change_pairs_before_and_after_by_question_over_the_seeds_with_both(
    tmp_path, monkeypatch
):
    """After minus before per outcome, a question's agents averaged (the interval resamples
    questions), over the seeds where both files are; a seed with one file is left out."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "revision").mkdir()

    def rows(refine, persist):
        # question q's agents 0 and 1; CONCEDE always right
        ids = [f"t/{q}:{a}" for q in (1, 2) for a in (0, 1)]
        return [
            {"id": i, "refine": r, "persist": p, "concede": True}
            for i, r, p in zip(ids, refine, persist)
        ]

    files = {
        "b-seed0-whole": rows([False, False, True, True], [True, False, True, False]),
        "a-seed0-whole": rows([True, True, True, False], [True, True, True, False]),
        "b-seed1-whole": rows([False] * 4, [False] * 4),
        "a-seed1-whole": rows([True, False, False, False], [False] * 4),
        "b-seed2-whole": rows([True] * 4, [True] * 4),
    }
    for name, content in files.items():
        (tmp_path / "revision" / f"{name}.json").write_text(json.dumps({"rows": content}))
    text = revision_tables.revision_change("b", "a")
    assert "paired over the same 4 questions (seeds 0,1;" in text
    # REFINE per question: seed 0 (+1, -0.5), seed 1 (+0.5, 0): mean +0.25, 3 questions move
    assert "REFINE +0.250 [" in text and "] (3)" in text.split("PERSIST")[0]
    # PERSIST: seed 0 (+0.5, 0), seed 1 (0, 0): one question moves
    assert "PERSIST +0.125 [+0.000, +0.375] (1)" in text
    assert "CONCEDE +0.000 [+0.000, +0.000] (0)" in text
    assert "not computed yet" in revision_tables.revision_change("b", "nothing")


def test_the_split_cost_table_shows_each_cost_with_its_refine_gains_by_round(tmp_path, monkeypatch):
    """SoftRankPO by REFINE's cost: each cost's row over the seeds it has, debate paired on the same
    questions, REFINE's gains at every decision pooled over the seeds per part and round (split
    round 1 apart from later rounds); a cost without its files waits, a refine file written before
    the gains by round is named to compute again."""
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    for folder in ("tables", "refine"):
        (tmp_path / folder).mkdir()
    ids = range(20)
    dealt = [q % 2 == 0 for q in ids]
    plays = {
        "debate": ([True] * 20, 1000),
        "softrank-cost0.25": ([q < 18 for q in ids], 400),
        "softrank": ([q < 16 for q in ids], 300),
    }
    by_round = {
        "split": [{"gains": [1.0, 1.0]}, {"gains": [0.0, 0.5]}, {"gains": [0.5]}],
        "shared": [{"gains": [0.0, -1.0]}, {"gains": [1.0]}],
    }
    (tmp_path / "policies").mkdir()
    for seed in (0, 1):
        # the cost-0.25 weights: the default's at seed 0, others at seed 1
        for policy, data in (("softrank", b"w"), ("softrank-cost0.25", b"wv"[seed : seed + 1])):
            name = f"split300-team-split-seed{seed}-{policy}"
            (tmp_path / "policies" / f"{name}.safetensors").write_bytes(data)
            cost = 0.5 if policy == "softrank" else 0.25
            settings = {"train_config": {"refine_cost": cost}}
            (tmp_path / "policies" / f"{name}.json").write_text(json.dumps(settings))
        for part, (right, tokens) in plays.items():
            summary = split_summary(right, dealt, tokens)
            path = tmp_path / "tables" / f"split300-team-split-seed{seed}-{part}.json"
            path.write_text(json.dumps({part: summary}))
        for policy in ("softrank-cost0.25", "softrank"):
            parts = {
                part: {
                    "shares": {"refine": 0.5 if part == "split" else 0.1},
                    **(
                        {"refine_at_every_decision_by_round": rounds}
                        if policy != "softrank"
                        else {}
                    ),
                }
                for part, rounds in by_round.items()
            }
            path = tmp_path / "refine" / f"split300-team-split-seed{seed}-{policy}.json"
            path.write_text(json.dumps({"parts": parts}))
    text = split_tables.split_cost_table()
    rows = {
        row[0]: row
        for row in ([c.strip() for c in line.strip("|").split("|")] for line in text.splitlines())
        if len(row) == 12
    }
    row = rows["0.25 (`softrank-cost0.25`)"]
    assert row[1:6] == ["2", "0.900 ± 0.000", "0.900", "0.900", "400"]
    assert row[6] == "0.50 / 0.10" and row[7].startswith("-0.100 [")
    # round 1 of both seeds: 1, 1, 1, 1; later: 0, 0.5, 0.5 twice; shared: 0, -1, 1 twice
    assert row[8].startswith("+1.000 [") and row[8].endswith("(4)")
    assert row[9].startswith("+0.333 [") and row[9].endswith("(6)")
    assert row[10].startswith("+0.000 [") and row[10].endswith("(6)")
    assert not any("`softrank`" in key or key.startswith("0.1 ") for key in rows)
    # seed 0's cost-0.25 weights are the default's byte for byte, seed 1's differ
    assert row[11] == "0"
    assert "split300-team-split-seed0-softrank-cost0.1.json" in text.split("not computed")[1]
    stale = text.split("to compute again")[1]
    assert "seed0-softrank.json" in stale and "seed1-softrank.json" in stale
    assert "cost0.25" not in stale
