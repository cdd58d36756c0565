"""eval.py as users run it (tests/launch.py) on a tiny random model, twice (the second run is all
cache hits)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from launch import run

ROOT = Path(__file__).resolve().parents[1]


def run_eval(tmp_path, model_dir, *extra, env=None):
    out = tmp_path / "results.json"
    cmd = [
        str(ROOT / "eval.py"),
        "--model",
        model_dir,
        "--n",
        "3",
        "--agents",
        "2",
        "--rounds",
        "1",
        "--max-new-tokens",
        "6",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out),
        "--protocols",
        "vanilla,sc,debate,mpdf-persist,mpdf-oracle",
        *extra,
    ]
    proc = run(cmd, tmp_path, env=env)
    return proc.stdout, json.loads(out.read_text())


def test_eval_cli_table_json_and_cache(tmp_path, tiny_model_dir):
    stdout, first = run_eval(tmp_path, tiny_model_dir)
    assert "protocol" in stdout and "mpdf-oracle" in stdout  # the printed table
    for name in ("vanilla", "sc", "debate", "mpdf-persist", "mpdf-oracle"):
        s = first[name]
        assert {
            "accuracy",
            "stderr",
            "tokens_per_question",
            "calls_per_question",
            "unparseable",
            "wall_s",
        } <= s.keys()
        assert 0.0 <= s["accuracy"] <= 1.0 and s["tokens_per_question"] > 0
    # budget-matched with debate's generations
    assert first["sc"]["calls_per_question"] == 2 * (1 + 1)
    assert (
        first["debate"]["actions"]["refine"] == 1.0
        and len(first["debate"]["accuracy_per_round"]) == 2
    )
    assert first["engine"]["calls"] > 0
    # --dtype auto (the default) is recorded as what it chose on this machine, with the reason
    assert first["config"]["dtype"] in ("float32", "bfloat16")
    assert first["dtype_reason"].startswith("auto: ") and "(" in first["machine"]
    _, second = run_eval(tmp_path, tiny_model_dir)
    assert second["engine"]["calls"] == 0 and second["engine"]["cache_hits"] > 0  # zero LLM calls
    # the cache off (protocols that share calls make them again): the same games, every text and
    # token log-prob the same
    _, off = run_eval(tmp_path, tiny_model_dir, "--cache-dir", "")
    assert off["engine"]["calls"] > first["engine"]["calls"] and off["engine"]["cache_hits"] == 0
    assert first["details"] == second["details"] == off["details"]
    for name in ("vanilla", "debate", "mpdf-oracle"):
        assert second[name]["accuracy"] == off[name]["accuracy"] == first[name]["accuracy"]
        assert second[name]["tokens_per_question"] == first[name]["tokens_per_question"]


def test_eval_cli_rejects_bad_input(tmp_path, tiny_model_dir):
    cmd = [str(ROOT / "eval.py"), "--model", tiny_model_dir, "--task", "gsm8k", "--n", "2"]
    proc = run(cmd, tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr == "error: --task gsm8k reads a data file: pass it with --path\n"


def test_eval_over_seeds(tmp_path, tiny_model_dir):
    out = tmp_path / "seeds.json"
    cmd = [
        str(ROOT / "eval.py"),
        "--model",
        tiny_model_dir,
        "--n",
        "2",
        "--agents",
        "2",
        "--rounds",
        "1",
        "--max-new-tokens",
        "4",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--protocols",
        "vanilla,mpdf-random",
        "--seeds",
        "0,1",
        "--out",
        str(out),
    ]
    proc = run(cmd, tmp_path)
    table = json.loads(out.read_text())
    per_seed = [json.loads((tmp_path / f"seeds-seed{s}.json").read_text()) for s in (0, 1)]
    assert table["vanilla"]["accuracy_per_seed"] == [r["vanilla"]["accuracy"] for r in per_seed]
    assert per_seed[0]["config"]["seed"] == 0 and per_seed[1]["config"]["seed"] == 1
    assert {"accuracy_mean", "accuracy_std", "tokens_per_question_mean"} <= table[
        "mpdf-random"
    ].keys()
    assert "over seeds [0, 1]" in proc.stdout


def test_eval_leader_protocol(tmp_path, tiny_model_dir):
    """leader=PATH loads a second model as the leader; the peers' vote and the per-round leader
    accuracy are reported; a path that is not a checkpoint is a clear error."""
    _, results = run_eval(
        tmp_path, tiny_model_dir, "--protocols", f"debate,leader={tiny_model_dir}"
    )
    s = results[f"leader={tiny_model_dir}"]
    assert {"peer_vote_accuracy", "accuracy_per_round"} <= s.keys() and len(
        s["accuracy_per_round"]
    ) == 2
    assert s["calls_per_question"] == 2 + 1 + 2 + 1  # peers, leader, peers revise, leader again
    # the peers' round 0 is debate's round 0: the same calls, so the same vote
    assert s["peer_vote_accuracy"] == results["debate"]["accuracy_per_round"][0]
    assert (
        len(s["peer_vote_correct"]) == 3
        and sum(s["peer_vote_correct"]) / 3 == s["peer_vote_accuracy"]
    )
    # leader=default: the default backbone ($MPDF_MODEL_DIR,
    # here the tiny model) leads, the same games
    _, by_default = run_eval(
        tmp_path,
        tiny_model_dir,
        "--protocols",
        "leader=default",
        env={"MPDF_MODEL_DIR": tiny_model_dir},
    )
    texts = [r["texts"] for r in results["details"][f"leader={tiny_model_dir}"]]
    assert [r["texts"] for r in by_default["details"]["leader=default"]] == texts and texts[0][0]
    cmd = [
        str(ROOT / "eval.py"),
        "--model",
        tiny_model_dir,
        "--n",
        "1",
        "--protocols",
        f"leader={tmp_path / 'nowhere'}",
        "--cache-dir",
        "",
    ]
    proc = run(cmd, tmp_path, check=False)
    assert proc.returncode != 0 and "not an HF checkpoint directory" in proc.stderr


def test_split_val_is_the_validation_slice_training_holds_out():
    """The levers are studied on `--split val`: the questions a training run of the same seed
    validates on (corpus.training_questions), never the ones it trains on, and never test
    questions."""
    import eval as evaluate
    from data import training_questions

    val = evaluate.load_examples(evaluate.Config(task="arith", split="val", n=16, seed=3))
    train, held_out = training_questions(
        SimpleNamespace(task="arith", path="", level=0, seed=3, val_n=16, questions=64)
    )
    assert len(val) == 16 and [ex.id for ex in val] == [ex.id for ex in held_out]
    assert not {ex.question for ex in val} & {ex.question for ex in train}
    test = evaluate.load_examples(evaluate.Config(task="arith", split="test", n=200))
    assert not {ex.question for ex in val} & {ex.question for ex in test}


def test_summary_round0_accuracies_on_hand_made_games():
    """One agent's round-0 accuracy, the share of questions some agent got right (a perfect
    selector's bound before any REFINE) and the vote's accuracy per round, on three 3-agent games
    written by hand."""
    import eval as evaluate

    def game(agents_right, vote_right):
        signals = [
            dict.fromkeys(("mean_prob", "min_prob", "tail_prob"), 0.8 if right else 0.2)
            for right in agents_right
        ]
        round0 = {
            "agent_correct": agents_right,
            "trailer_ok": [False] * 3,
            "critic": [None] * 3,
            "signals": signals,
            "correct": vote_right,
            "actions": [],
        }
        return {
            "id": str(len(agents_right)),
            "correct": vote_right,
            "pred": "1",
            "tokens": 100,
            "calls": 3,
            "rounds": [round0],
        }

    games = [
        game([True, False, False], False),
        game([False, False, False], False),
        game([True, True, False], True),
    ]
    s = evaluate.summarize(games, wall_s=1.0)
    assert s["agent_accuracy_round0"] == pytest.approx(3 / 9)
    assert s["any_agent_right_round0"] == pytest.approx(2 / 3)
    assert s["accuracy"] == s["accuracy_per_round"][0] == pytest.approx(1 / 3)
    # right solutions carry the higher confidence here: every signal separates them perfectly
    assert s["confidence_auroc"]["mean_prob"] == pytest.approx(1.0)


def test_summary_action_shares_by_round_on_hand_made_games():
    """actions_by_round: each decision round's shares of PERSIST / REFINE / CONCEDE, counting only
    the games still playing (one game here stops after its first decision round)."""
    import eval as evaluate
    from deliberate import PERSIST, REFINE, concede

    def round_record(actions):
        return {
            "agent_correct": [False] * 3,
            "trailer_ok": [False] * 3,
            "critic": [None] * 3,
            "correct": False,
            "signals": [dict.fromkeys(("mean_prob", "min_prob", "tail_prob"), 0.5)] * 3,
            "actions": actions,
        }

    two_rounds = {
        "id": "a",
        "correct": False,
        "pred": "1",
        "tokens": 100,
        "calls": 4,
        "rounds": [
            round_record([]),
            round_record([REFINE, PERSIST, concede(0)]),
            round_record([PERSIST] * 3),
        ],
    }
    one_round = {
        "id": "b",
        "correct": False,
        "pred": "1",
        "tokens": 100,
        "calls": 3,
        "rounds": [round_record([]), round_record([PERSIST] * 3)],
    }
    s = evaluate.summarize([two_rounds, one_round], wall_s=1.0)
    first, second = s["actions_by_round"]
    assert first == pytest.approx({"persist": 4 / 6, "refine": 1 / 6, "concede": 1 / 6})
    assert second == pytest.approx({"persist": 1.0, "refine": 0.0, "concede": 0.0})
    assert s["actions"] == pytest.approx({"persist": 7 / 9, "refine": 1 / 9, "concede": 1 / 9})
