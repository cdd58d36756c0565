"""eval.py's statistics: paired differences on the same questions (bootstrap intervals), the sample
std over seeds, and --reference as users run it."""

import json
from pathlib import Path

import pytest
from launch import run

import stats

ROOT = Path(__file__).resolve().parents[1]


def outcomes(correct, ids=None):
    return {
        "question_ids": ids or [f"q{k}" for k in range(len(correct))],
        "correct": [bool(c) for c in correct],
    }


def test_paired_difference_hand_values():
    better, worse = outcomes([1, 1, 1, 0, 1, 1]), outcomes([0, 1, 0, 0, 1, 0])
    v = stats.paired_difference(better, worse)
    assert v["diff"] == pytest.approx(3 / 6) and v["disagree"] == 3
    assert 0 < v["ci95"][0] < 0.5 < v["ci95"][1] <= 1.0
    assert stats.paired_difference(worse, better)["diff"] == pytest.approx(-0.5)
    # identical outcomes: no difference and no uncertainty
    assert stats.paired_difference(better, better) == {
        "diff": 0.0,
        "ci95": [0.0, 0.0],
        "disagree": 0,
    }
    # always right against always wrong: the interval is the single point 1
    assert stats.paired_difference(outcomes([1] * 5), outcomes([0] * 5))["ci95"] == [1.0, 1.0]


def test_paired_difference_matches_questions_by_id_not_position():
    a = outcomes([1, 0, 0], ids=["x", "y", "z"])
    b = outcomes([0, 0, 1], ids=["z", "y", "x"])  # the same answers, listed in another order
    assert stats.paired_difference(a, b) == {"diff": 0.0, "ci95": [0.0, 0.0], "disagree": 0}
    with pytest.raises(ValueError, match="same questions"):
        stats.paired_difference(a, outcomes([1, 0, 0], ids=["x", "y", "w"]))


def test_paired_interval_is_narrower_than_unpaired_when_protocols_agree_mostly():
    """The point of pairing: two protocols right on the same 40 of 100 questions, one also on 5
    more. The paired interval excludes 0; two independent standard errors would not."""
    a = outcomes([1] * 45 + [0] * 55)
    b = outcomes([1] * 40 + [0] * 60)
    v = stats.paired_difference(a, b)
    assert v["diff"] == pytest.approx(0.05) and v["disagree"] == 5 and v["ci95"][0] > 0
    unpaired_se = (0.45 * 0.55 / 100 + 0.40 * 0.60 / 100) ** 0.5
    assert v["diff"] - 1.96 * unpaired_se < 0


def test_the_interval_is_the_seeded_percentile_bootstrap(monkeypatch):
    """The 2.5th and 97.5th percentiles of 10,000 resampled means, resampled by a generator seeded
    0: the same interval every time, and the one written out here by hand."""
    import numpy as np

    asked = []
    percentile, generator = np.percentile, np.random.default_rng

    def recording_percentile(values, q):
        asked.append(("percentiles", list(q), len(values)))
        return percentile(values, q)

    monkeypatch.setattr(np, "percentile", recording_percentile)
    monkeypatch.setattr(
        np.random, "default_rng", lambda seed: asked.append(seed) or generator(seed)
    )

    a, b = outcomes([1, 0, 1, 1, 0, 1, 1, 0]), outcomes([0, 0, 1, 0, 0, 1, 0, 1])
    d = np.array([1, 0, 0, 1, 0, 0, 1, -1], dtype=float)
    means = d[np.random.default_rng(0).integers(0, 8, (10_000, 8))].mean(1)
    v = stats.paired_difference(a, b)
    assert v["ci95"] == [float(x) for x in np.percentile(means, [2.5, 97.5])]
    assert stats.paired_difference(a, b) == v
    assert asked[-2:] == [0, ("percentiles", [2.5, 97.5], 10_000)]
    said = "a paired difference needs both protocols on the same questions"
    with pytest.raises(ValueError, match=f"^{said}$"):
        stats.paired_difference(a, outcomes([1]))


def test_pooled_keys_each_question_by_its_seed():
    by_seed = {0: outcomes([1, 0], ids=["a", "b"]), 2: outcomes([0], ids=["a"])}
    assert stats.pooled(by_seed) == {
        "question_ids": ["0:a", "0:b", "2:a"],
        "correct": [True, False, False],
    }


def test_auroc_counts_ties_half_and_needs_both_classes():
    assert stats.auroc([0.9, 0.8, 0.3], [1, 1, 0]) == 1.0
    assert stats.auroc([0.2, 0.8, 0.3], [1, 0, 0]) == 0.0
    # pairs (positive, negative): (0.5, 0.5) ties, (0.5, 0.2) wins, (0.1, 0.5) and (0.1, 0.2) lose
    assert stats.auroc([0.5, 0.1, 0.5, 0.2], [1, 1, 0, 0]) == pytest.approx((0.5 + 1) / 4)
    assert stats.auroc([0.5, 0.7], [1, 1]) is None and stats.auroc([0.5], [0]) is None


def test_sample_std():
    assert stats.sample_std([0.1, 0.2, 0.3]) == pytest.approx(0.1)  # n - 1, not n
    assert stats.sample_std([0.2]) == 0.0


def test_eval_reference_in_table_and_json(tmp_path, tiny_model_dir):
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
        "vanilla,mpdf-persist",
        "--reference",
        "mpdf-persist",
        "--seeds",
        "0,1",
        "--out",
        str(out),
    ]
    proc = run(cmd, tmp_path)
    assert (
        "vs mpdf-persist [95% CI] (disagree)" in proc.stdout and "pooled over seeds" in proc.stdout
    )
    seed0 = json.loads((tmp_path / "seeds-seed0.json").read_text())
    assert seed0["mpdf-persist"]["vs_reference"] == {
        "reference": "mpdf-persist",
        "diff": 0.0,
        "ci95": [0.0, 0.0],
        "disagree": 0,
    }
    assert len(seed0["vanilla"]["correct"]) == 2 and len(seed0["vanilla"]["question_ids"]) == 2
    pooled = json.loads(out.read_text())["vanilla"]["vs_reference"]
    assert pooled["reference"] == "mpdf-persist" and set(pooled) == {
        "reference",
        "diff",
        "ci95",
        "disagree",
    }
    bad = run(cmd[:-2] + ["--reference", "debate"], tmp_path, check=False)
    assert (
        bad.returncode == 2 and "unknown --reference 'debate': choose one of vanilla" in bad.stderr
    )
