"""experiments/refine_value.py: what a policy's actions gain over PERSIST in its own test games."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import lab_command

from experiments import refine_value

ROOT = Path(__file__).resolve().parents[2]

# actions: 0 PERSIST, 1 REFINE, 2+ CONCEDE to a peer; reward_vectors[i][a]: agent i's reward for a
GAMES = [
    {
        "rounds": [
            {},
            {
                "actions": [1, 0, 2],
                "reward_vectors": [
                    [0.0, 1.0, 0.5, 0.0],
                    [0.5, 0.0, 0.0, 0.0],
                    [0.0, -1.0, 1.0, 0.0],
                ],
            },
            {
                "actions": [1, 1, 0],
                "reward_vectors": [
                    [0.5, 0.0, 0.0, 0.0],
                    [0.0, 0.0, 0.0, 0.0],
                    [0.0, 1.0, 0.0, 0.0],
                ],
            },
        ]
    }
]


def test_decision_values_by_hand():
    values = refine_value.decision_values(GAMES)
    assert values["decisions"] == 6
    assert values["shares"] == {"persist": 2 / 6, "refine": 3 / 6, "concede": 1 / 6}
    assert values["shares_by_round"] == [
        {"persist": 1 / 3, "refine": 1 / 3, "concede": 1 / 3},
        {"persist": 1 / 3, "refine": 2 / 3, "concede": 0.0},
    ]
    refine = values["taken_vs_persist"]["refine"]
    # the REFINEs taken: 1 - 0, 0 - 0.5, 0 - 0 -> mean 1/6; one better, one worse
    assert refine["decisions"] == 3 and refine["mean_gain"] == pytest.approx(1 / 6)
    assert refine["better"] == pytest.approx(1 / 3) and refine["worse"] == pytest.approx(1 / 3)
    assert refine["ci95"][0] < 1 / 6 < refine["ci95"][1]
    assert refine["gains"] == [1.0, -0.5, 0.0]
    # seeds pooled: their gains together, the interval over all their decisions
    pooled = refine_value.gain_summary(refine["gains"] + [1.0, 1.0, 1.0])
    assert pooled["decisions"] == 6 and pooled["mean_gain"] == pytest.approx(3.5 / 6)
    assert pooled["better"] == pytest.approx(4 / 6) and pooled["worse"] == pytest.approx(1 / 6)
    concede = values["taken_vs_persist"]["concede"]  # the taken concede (index 2): 1.0 - 0.0
    assert concede["decisions"] == 1 and concede["mean_gain"] == 1.0
    assert values["taken_vs_persist"]["persist"]["mean_gain"] == 0.0
    # REFINE at every decision: 1, -0.5, -1, -0.5, 0, 1 -> 0
    everywhere = values["refine_at_every_decision_vs_persist"]
    assert everywhere["decisions"] == 6 and everywhere["mean_gain"] == pytest.approx(0.0)
    # round by round: 1, -0.5, -1 in round 1; -0.5, 0, 1 in round 2
    first, second = values["refine_at_every_decision_by_round"]
    assert first["gains"] == [1.0, -0.5, -1.0] and second["gains"] == [-0.5, 0.0, 1.0]
    assert refine_value.gain_over_persist([]) == {"decisions": 0}


def test_split_questions_and_shared_ones_apart():
    # the game above on a split question (its agents told different things) and a shared one
    split = {**GAMES[0], "views": ["a", "b", "a"]}
    shared = {
        "views": ["c", "c", "c"],
        "rounds": [{}, {"actions": [1, 0], "reward_vectors": [[0.0, 1.0], [1.0, 0.0]]}],
    }
    parts = refine_value.split_and_shared([split, shared])["parts"]
    assert parts["split"] == refine_value.decision_values([split])
    assert parts["shared"]["decisions"] == 2 and parts["shared"]["shares"]["refine"] == 0.5
    assert parts["shared"]["taken_vs_persist"]["refine"]["gains"] == [1.0]
    assert refine_value.split_and_shared(GAMES) == {}


def test_refine_value_plays_the_game_eval_plays(tmp_path, tiny_model_dir):
    """The counterfactual samples change nothing in the game: the random policy's actions by
    round and the per-question outcomes are eval.py's mpdf-random ones."""
    game = [
        "--model",
        tiny_model_dir,
        "--n",
        "4",
        "--agents",
        "3",
        "--rounds",
        "2",
        "--max-new-tokens",
        "6",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--dtype",
        "float32",
    ]
    mine = tmp_path / "refine.json"
    argv, env = lab_command("refine_value")
    run = subprocess.run(
        [*argv, *game, "--policy", "random", "--out", str(mine)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = tmp_path / "eval.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "eval.py"),
            *game,
            "--protocols",
            "mpdf-random",
            "--out",
            str(theirs),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    mine, theirs = json.loads(mine.read_text()), json.loads(theirs.read_text())["mpdf-random"]
    assert mine["question_ids"] == theirs["question_ids"]
    assert mine["correct"] == theirs["correct"] and mine["accuracy"] == theirs["accuracy"]
    assert mine["shares_by_round"] == theirs["actions_by_round"]
    assert mine["decisions"] == 4 * 3 * 2 and mine["shares"]["refine"] > 0
