"""experiments/blind_slices.py: the slices where a rule is blind, named by round 0 and read from the
tables' per-question outcomes, by hand."""

import json

import pytest

from common import FileRefused
from experiments import blind_slices


def game(qid, answers, vote_right):
    return {"id": qid, "rounds": [{"answers": answers, "correct": vote_right}]}


# q1: unanimous and wrong; q2: 2-1 and wrong; q3: 1-1-1 and wrong (neither); q4: right (neither)
ROUND0 = {"q1": ([5, 5, 5], False), "q2": ([5, 5, 7], False), "q3": ([1, 2, 3], False)}
ROUND0["q4"] = ([4, 4, 9], True)


def test_round0_names_the_slice_of_each_question():
    assert [blind_slices.round0_slice(game(q, *r)["rounds"][0]) for q, r in ROUND0.items()] == [
        "unanimous-wrong",
        "majority-wrong",
        None,
        None,
    ]
    # an answer that could not be read counts as an answer like any other
    assert blind_slices.round0_slice({"answers": [None, None, 2], "correct": False}) == (
        "majority-wrong"
    )
    games = [game(q, *r) for q, r in ROUND0.items()]
    assert blind_slices.members(games) == {"unanimous-wrong": ["q1"], "majority-wrong": ["q2"]}


def summary(outcomes):
    """A protocol's summary in an eval.py table: {id: (right, tokens)}, in that order."""
    return {
        "question_ids": list(outcomes),
        "correct": [right for right, _ in outcomes.values()],
        "question_tokens": [tokens for _, tokens in outcomes.values()],
    }


def slices(seed, unanimous, majority):
    return {"slices": {"unanimous-wrong": unanimous, "majority-wrong": majority}, "path": seed}


def test_slices_pool_the_seeds_and_read_each_protocols_outcomes():
    # seed 0: q1 unanimous-wrong, q2 2-1 wrong; seed 1 (other questions): a1 unanimous-wrong
    seed0 = {
        "config": {"seed": 0},
        "freeze": summary({"q1": (False, 100), "q2": (True, 300), "q3": (True, 500)}),
        "debate": summary({"q3": (True, 9), "q2": (False, 900), "q1": (True, 700)}),
    }
    seed1 = {"freeze": summary({"a1": (True, 200), "a2": (False, 50)})}
    seed1["debate"] = summary({"a1": (True, 800), "a2": (True, 800)})
    pairs = [
        (slices("s0", ["q1"], ["q2"]), [("t0.json", seed0)]),
        (slices("s1", ["a1"], []), [("t1.json", seed1)]),
    ]
    figures = blind_slices.slice_figures(pairs)
    freeze, debate = figures["freeze"], figures["debate"]
    assert (freeze["unanimous-wrong"].n, freeze["unanimous-wrong"].accuracy) == (2, 0.5)
    assert freeze["unanimous-wrong"].tokens == 150
    assert (freeze["majority-wrong"].n, freeze["majority-wrong"].accuracy) == (1, 1.0)
    assert (debate["unanimous-wrong"].accuracy, debate["unanimous-wrong"].tokens) == (1.0, 750)
    assert (debate["majority-wrong"].accuracy, debate["majority-wrong"].tokens) == (0.0, 900)
    text = blind_slices.slice_table(figures)
    assert "| freeze | 2, 0.500, 150 | 1, 1.000, 300 |" in text
    assert "| debate | 2, 1.000, 750 | 1, 0.000, 900 |" in text
    # an empty slice reads as such
    one = blind_slices.slice_figures([(slices("s1", ["a1"], []), [("t1.json", seed1)])])
    assert "| freeze | 1, 1.000, 200 | 0, -, - |" in blind_slices.slice_table(one)


def test_a_table_without_a_slice_question_is_refused():
    table = {"freeze": summary({"q1": (True, 1)})}
    with pytest.raises(FileRefused, match=r"^t\.json: freeze did not play q2 of s0$"):
        blind_slices.slice_figures([(slices("s0", ["q1"], ["q2"]), [("t.json", table)])])


def test_show_pairs_each_slices_file_with_the_tables_after_it(tmp_path, capsys):
    paths = {}
    for name, data in (
        ("s0", slices("s0", ["q1"], ["q2"])),
        ("t0", {"freeze": summary({"q1": (True, 10), "q2": (False, 30)})}),
        ("s1", slices("s1", ["a1"], [])),
        ("t1", {"freeze": summary({"a1": (False, 20)})}),
    ):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    blind_slices.main(["show", *map(str, paths.values())])
    assert "| freeze | 2, 0.500, 15 | 1, 0.000, 30 |" in capsys.readouterr().out
    with pytest.raises(FileRefused, match="a table before any slices file"):
        blind_slices.main(["show", str(paths["t0"]), str(paths["s0"])])


def test_round0_plays_the_vote_with_eval_and_keeps_only_the_slices(tmp_path, tiny_model_dir):
    """On the tiny random model no answer parses: every round 0 is unanimous (no answer) and
    wrong."""
    out = tmp_path / "slices" / "tiny.json"
    flags = ["--model", tiny_model_dir, "--n", "3", "--agents", "3", "--rounds", "1"]
    flags += ["--max-new-tokens", "4", "--cache-dir", ""]
    blind_slices.main(["round0", "--out", str(out), "--", *flags])
    record = json.loads(out.read_text())
    assert record["reference"] == "mpdf-persist" and record["config"]["n"] == 3
    assert (
        len(record["slices"]["unanimous-wrong"]) == 3 and record["slices"]["majority-wrong"] == []
    )
    assert "details" not in record


def test_the_report_reads_the_slices_and_the_oracles_headroom_from_committed_files(
    tmp_path, monkeypatch
):
    """Two seeds: the rules, the oracle and a policy on each seed's slices, and the policy's share
    of the oracle's headroom above freeze (mean accuracies over the seeds)."""
    from experiments import rule_tables, tables

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    (tmp_path / "slices").mkdir()
    (tmp_path / "tables").mkdir()
    outcomes = {
        # part: per seed, {id: (right, tokens)} over that seed's questions q1 (unanimous-wrong),
        # q2 (2-1 wrong), q3 (neither)
        "freeze": [{"q1": (False, 10), "q2": (True, 30), "q3": (True, 30)}] * 2,
        "oracle": [{"q1": (True, 40), "q2": (True, 40), "q3": (True, 10)}] * 2,
        "p": [
            {"q1": (True, 50), "q2": (False, 20), "q3": (True, 30)},
            {"q1": (True, 50), "q2": (True, 20), "q3": (True, 30)},
        ],
    }
    for seed in (0, 1):
        named = slices(seed, ["q1"], ["q2"])["slices"]
        (tmp_path / "slices" / f"x-seed{seed}.json").write_text(json.dumps({"slices": named}))
        for part, by_seed in outcomes.items():
            found = by_seed[seed]
            right = [r for r, _ in found.values()]
            table = summary(found) | {"accuracy": sum(right) / len(right)}
            path = tmp_path / "tables" / f"x-seed{seed}-{part}.json"
            path.write_text(json.dumps({"config": {}, part: table}))
    text = rule_tables.blind_table("x", {"p": "learned policy: p"}, seeds=(0, 1))
    lines = text.splitlines()
    assert lines[0].startswith("| protocol (seeds 0, 1) |")
    assert (
        "| freeze: REFINE unless unanimous (`freeze`) | 2, 0.000, 10 | 2, 1.000, 30 |  |" in lines
    )
    assert (
        "| the oracle (reads the gold answer) (`oracle`) | 2, 1.000, 40 | 2, 1.000, 40 |  |"
        in lines
    )
    # p: accuracy 2/3 and 1 (mean 5/6), freeze 2/3, the oracle 1: half the headroom
    assert "| learned policy: p (`p`) | 2, 1.000, 50 | 2, 0.500, 20 | +50% |" in lines
    assert "not on every seed of the slices yet: persist, debate1" in text
