"""The lab's studies of the rules that decide when a team talks: fitting the gate and the trigger
(experiments/talk_rules.py: the logistic regression against scipy, the threshold chosen on
validation questions, the fit on debate's validation games), the frontier and on-policy tables,
and where the rules lose (experiments/rule_losses.py, rule_tables.py)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize
from test_rules import TWO_ONE

import rules
from deliberate import PERSIST, REFINE
from experiments import talk_rules

P, R = PERSIST, REFINE


def write_table(tmp_path, name, tokens, correct, **more):
    """One protocol's eval.py summary on questions 0..n-1 (tables/NAME.json)."""
    summary = {
        "accuracy": sum(correct) / len(correct),
        "tokens_per_question": tokens,
        "question_ids": list(range(len(correct))),
        "correct": correct,
        **more,
    }
    (tmp_path / "tables" / f"{name}.json").write_text(json.dumps({"p": summary}))


def test_fit_trigger_is_the_penalized_maximum_likelihood():
    """Newton's method lands on scipy's minimum of the same objective: the negative log-likelihood
    of standardized features plus l2/2 |w|^2 (the bias free)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 3)) * [1.0, 3.0, 0.5] + [0.0, 2.0, -1.0]
    y = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(size=80) > 1.0).astype(float)
    # the default penalty, 1, is the one the objective below writes out
    fitted = talk_rules.fit_trigger(x, y)
    z = (x - x.mean(0)) / x.std(0)

    def objective(w):
        logits = z @ w[:-1] + w[-1]
        return np.sum(np.logaddexp(0, logits) - y * logits) + 0.5 * np.sum(w[:-1] ** 2)

    reference = minimize(objective, np.zeros(4), method="BFGS", options={"gtol": 1e-10}).x
    assert fitted["weights"] == pytest.approx(reference[:-1].tolist(), abs=1e-5)
    assert fitted["bias"] == pytest.approx(reference[-1], abs=1e-5)
    assert fitted["mean"] == pytest.approx(x.mean(0).tolist()) and fitted["scale"] == pytest.approx(
        x.std(0).tolist()
    )
    # a constant feature is kept out of the way, not divided by zero
    constant = talk_rules.fit_trigger(np.hstack([x, np.ones((80, 1))]), y)
    assert constant["scale"][-1] == 1.0 and constant["weights"][-1] == pytest.approx(0.0, abs=1e-9)
    # labels all alike: nothing to learn, every score 0.5
    for alike in (np.zeros(80), np.ones(80)):
        flat = talk_rules.fit_trigger(x, alike)
        assert flat["weights"] == [0.0] * 3 and flat["bias"] == 0.0


def test_the_threshold_chosen_on_validation_is_the_most_accurate_gate_and_the_highest_on_a_tie():
    scores = [0.1, 0.2, 0.3, 0.4, 0.5]
    vote = [1, 0, 0, 1, 0]
    debate = [0, 0, 1, 1, 1]
    # debating above 0.2 gains questions 3 and 5 and loses none: 0.2 (and not 0.1, which loses 1)
    assert talk_rules.best_threshold(scores, vote, debate) == 0.2
    # nothing to gain: the highest score, which debates nowhere
    assert talk_rules.best_threshold(scores, [1] * 5, [1] * 5) == 0.5
    # every question gains: below the lowest score, which debates everywhere
    assert talk_rules.best_threshold(scores, [0] * 5, [1] * 5) == pytest.approx(-0.9)


def test_the_gate_and_the_trigger_are_fitted_on_debates_validation_games():
    """Four validation games: unanimous and right (debate keeps it), 2-1 and wrong (debate turns it
    right), all different and wrong (debate does not help), 2-1 and right (debate breaks it). The
    gate cannot debate the one 2-1 game debate helps without the one it breaks, so its most
    accurate threshold ties the vote; the trigger tells them apart by their confidence."""

    def game(answers, vote, probs, vote_right, debate_right):
        signals = [{"mean_prob": p, "min_prob": p, "tail_prob": p} for p in probs]
        first = {"answers": answers, "signals": signals, "vote": vote, "correct": vote_right}
        return {"id": len(answers), "rounds": [first, {}], "correct": debate_right}

    transcripts = [
        game(["4", "4", "4"], "4", [0.9, 0.9, 0.9], True, True),
        game(["4", "4", "5"], "4", [0.3, 0.3, 0.9], False, True),
        game(["1", "2", "3"], "1", [0.5, 0.5, 0.5], False, False),
        game(["4", "4", "5"], "4", [0.9, 0.9, 0.3], True, False),
    ]
    rows = talk_rules.validation_rows(transcripts)
    assert [r["vote_right"] for r in rows] == [True, False, False, True]
    assert [r["debate_right"] for r in rows] == [True, True, False, False]
    assert rows[1]["features"] == pytest.approx([TWO_ONE, 2 / 3, 0.0, 0.5, 0.3, 0.3], abs=1e-12)
    gate, trigger, validation = talk_rules.fit(rows)
    # debating the 2-1 games gains one and loses one: the highest tied threshold debates nowhere
    assert gate == {"threshold": pytest.approx(math.log2(3))}
    # the trigger tells the two 2-1 games apart by their confidence: it debates game 2 alone
    scores = [rules.trigger_score(r["features"], trigger) for r in rows]
    assert [s > trigger["threshold"] for s in scores] == [False, True, False, False]
    assert trigger["features"] == list(rules.TRIGGER_FEATURES)
    assert validation == {
        "questions": 4,
        "vote_accuracy": 0.5,
        "debate_accuracy": 0.5,
        "gate_accuracy": 0.5,
        "trigger_accuracy": 0.75,
        "gate_debated": 0.0,
        "trigger_debated": 0.25,
    }


def test_the_frontier_names_the_rules_pareto_points_and_pairs_each_policy_with_its_nearest_rule(
    tmp_path, monkeypatch
):
    """Three rules on 4 questions and 2 seeds: the vote (cheap, 2 right), freeze (middle, 3
    right), debate (dear, 3 right), which freeze dominates. A policy near freeze's cost, right on
    all 4: its nearest rule is freeze, the only rule at no fewer tokens is debate."""
    from experiments import rule_tables, tables

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    monkeypatch.setattr(rule_tables, "RESULTS", tmp_path)
    monkeypatch.setattr(rule_tables, "SEEDS", (0, 1))
    (tmp_path / "tables").mkdir()
    right = {
        "persist": (100, [1, 1, 0, 0]),
        "freeze": (300, [1, 1, 1, 0]),
        "debate": (900, [1, 1, 1, 0]),
        "mine": (310, [1, 1, 1, 1]),
    }
    for part, (tokens, correct) in right.items():
        for seed in (0, 1):
            write_table(tmp_path, f"x-seed{seed}-{part}", tokens, correct)
    points = {"a": (1, 0.5), "b": (2, 0.6), "c": (3, 0.6), "d": (0.5, 0.4), "e": (2, 0.6)}
    # c spends more for b's accuracy; b and e tie, and neither dominates the other
    assert rule_tables.pareto(points) == ["a", "b", "d", "e"]
    table = rule_tables.frontier_table("x", rule_tables.learned(["mine"]))
    rows = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")
    }
    assert "| 2 | 0.500 (± 0.000) | 100 | yes |" in rows["the vote (round 0) (`persist`)"]
    assert "| 900 | no |" in rows["debate, 3 rounds (`debate`)"]
    assert "| 300 | yes |" in rows["freeze: REFINE unless unanimous (`freeze`)"]
    # nearest on a log scale: freeze (300), not the vote; at no fewer tokens: debate alone (900)
    cells = [c.strip() for c in rows["learned policy: mine (`mine`)"].split("|")[2:-1]]
    assert cells[:4] == ["2", "1.000 (± 0.000)", "310", ""]
    assert cells[4].startswith("freeze: +0.250 [") and cells[4].endswith("(2)")
    assert cells[5].startswith("debate: +0.250 [") and cells[5].endswith("(2)")
    assert "not computed yet" in table and "x-seed0-minority.json" in table
    assert (tmp_path / "rules" / "x-frontier.png").exists() or "![" not in table
    # one seed has no spread to show, rather than a spread of 0
    assert rule_tables.accuracy_text({0: {"accuracy": 0.5}}) == "0.500 (one seed)"
    assert rule_tables.accuracy_text({0: {"accuracy": 0.5}, 1: {"accuracy": 0.7}}) == (
        "0.600 (± 0.141)"
    )


def test_an_onpolicy_run_is_stage_2_with_its_corpus_collected_again():
    """Each on-policy run is its seed's committed stage-2 command with --iterations n+1 (the
    corpus collected again n times) into a folder of its own, and its table plays the policy it
    trains."""
    from experiments import onpolicy_pieces as O
    from experiments.run import PIECES

    for algo in O.ALGOS:
        stage2 = PIECES[f"train-split300-team-split-seed1-{algo}"]["command"]
        for n in O.AGAIN:
            name = O.onpolicy_name(1, algo, n)
            train, play = PIECES[f"train-{name}"], PIECES[f"table-{name}"]
            command = list(map(str, train["command"]))
            at = command.index("--iterations")
            assert command[at + 1] == str(n + 1)
            del command[at : at + 2]
            out = command.index("--out-dir")
            assert command[out + 1].endswith(name)
            command[out + 1] = str(stage2[stage2.index("--out-dir") + 1])
            assert command == list(map(str, stage2))
            policy = f"results/policies/{name}.safetensors"
            assert policy in train["copies"].values()
            assert f"mpdf={policy}" in play["command"] and policy in play["needs"]


def test_the_onpolicy_table_pairs_each_iteration_with_stage_2_and_debate(tmp_path, monkeypatch):
    """Stage 2 right on 2 of 4 questions, its on-policy run on 3, debate on 4, over 2 seeds: the
    REFINE shares of all, split and shared questions, and the paired differences."""
    from experiments import rule_tables, tables

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    monkeypatch.setattr(rule_tables, "SEEDS", (0, 1))
    (tmp_path / "tables").mkdir()

    def shares(refine):
        return {"persist": 1 - refine, "refine": refine, "concede": 0.0}

    right = {
        "p": (200, [1, 1, 0, 0], 0.2),
        "p-onpolicy1": (300, [1, 1, 1, 0], 0.4),
        "debate": (900, [1, 1, 1, 1], 1.0),
    }
    for part, (tokens, correct, refine) in right.items():
        parts = {"split": {"actions": shares(refine + 0.1)}, "shared": {"actions": shares(0)}}
        for seed in (0, 1):
            name = f"x-seed{seed}-{part}"
            write_table(tmp_path, name, tokens, correct, actions=shares(refine), parts=parts)
    table = rule_tables.onpolicy_table("x", "p", again=(1, 2))
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    stage2, again = ([c.strip() for c in row.split("|")[1:-1]] for row in rows)
    assert stage2[:6] == ["0 (`p`)", "2", "0.500 (± 0.000)", "200", "0.20 / 0.30 / 0.00", ""]
    assert stage2[6].startswith("-0.500 [") and stage2[6].endswith("(4)")
    assert again[:5] == ["1 (`p-onpolicy1`)", "2", "0.750 (± 0.000)", "300", "0.40 / 0.50 / 0.00"]
    assert again[5].startswith("+0.250 [") and again[5].endswith("(2)")
    assert again[6].startswith("-0.250 [") and again[6].endswith("(2)")
    assert "x-seed0-p-onpolicy2.json" in table


def transcript(qid, answers, gold, actions=None, correct=None, dealt=False, tokens=100):
    """A game as eval.py's details keep it: round 0's answers, then a round of `actions`."""
    first = {
        "answers": answers,
        "agent_correct": [a == gold for a in answers],
        "correct": max(answers, key=answers.count) == gold,
    }
    rounds = [first] + ([{"actions": actions}] if actions else [])
    game = {"id": qid, "rounds": rounds, "correct": correct, "tokens": tokens}
    # the split task keeps every question's views: a shared question's are all the same
    return game | {"views": ["a", "b", "c"] if dealt else ["a", "a", "a"]}


def test_the_round0_classes_of_a_team_of_three():
    from experiments.rule_losses import split_of, state_class

    assert split_of(["1", "1", "1"]) == "unanimous"
    assert split_of(["1", "1", "2"]) == "majority"
    assert split_of(["1", "2", "3"]) == split_of(["1", None, "2"]) == "all different"
    # two unparsed answers agree with no one: not a majority
    assert split_of([None, None, "2"]) == "all different"
    assert split_of([None, None, None]) == "all different"
    game = transcript("q", ["1", "2", "2"], "1", dealt=True)
    assert state_class(game) == {
        "split": "majority",
        "vote": "vote wrong, an agent right",
        "facts": "dealt",
    }
    shared = state_class(transcript("q", ["3", "2", "2"], "1"))
    assert (shared["vote"], shared["facts"]) == ("no agent right", "shared")
    assert state_class(transcript("q", ["2", "2", "2"], "2"))["vote"] == "vote right"


def test_rule_losses_counts_per_class_who_alone_is_right_and_the_round1_actions():
    """Three questions: on a dealt 2-1 with the minority right, the rule REFINEs all and is right
    where the policy PERSISTs and is wrong (twice); on a unanimous right vote the policy stops and
    is right where the rule is wrong."""
    from experiments.rule_losses import compare

    policy = [
        transcript("a", ["1", "2", "2"], "1", [0, 0, 0], False, dealt=True, tokens=300),
        transcript("b", ["1", "2", "2"], "1", [1, 0, 2], False, dealt=True, tokens=400),
        transcript("c", ["5", "5", "5"], "5", None, True, tokens=200),
    ]
    rule = [
        transcript("a", ["1", "2", "2"], "1", [1, 1, 1], True, dealt=True, tokens=900),
        transcript("b", ["1", "2", "2"], "1", [1, 1, 1], True, dealt=True, tokens=900),
        transcript("c", ["5", "5", "5"], "5", [1, 1, 1], False, tokens=800),
    ]
    worst, best = compare(policy, rule)
    assert worst["split"] == "majority" and worst["facts"] == "dealt"
    assert (worst["questions"], worst["rule_only_right"], worst["policy_only_right"]) == (2, 2, 0)
    assert worst["policy_actions_where_rule_only"] == {"persist": 4, "refine": 1, "concede": 1}
    assert worst["rule_actions_where_rule_only"] == {"refine": 6}
    assert worst["rule_only_ids"] == ["a", "b"]
    assert (worst["policy_tokens"], worst["rule_tokens"]) == (700, 1800)
    assert worst["rule_only_apart"] == {"1": 2} and worst["policy_only_apart"] == {}
    # the policy stopped after round 0 where the rule played round 1
    assert best["policy_only_apart"] == {"1": 1} and best["rule_only_apart"] == {}
    assert (best["vote"], best["policy_only_right"], best["rule_only_right"]) == (
        "vote right",
        1,
        0,
    )
    assert best["policy_actions_where_rule_only"] == {}
    with pytest.raises(ValueError, match="differ in their questions"):
        compare(policy[:1], rule[1:2])
    with pytest.raises(ValueError):
        compare(policy, rule[:2])


def test_two_games_act_apart_first_in_the_round_whose_actions_differ():
    from experiments.rule_losses import first_apart

    def game(*decisions):
        return {"rounds": [{"answers": ["1", "2", "2"]}] + [{"actions": a} for a in decisions]}

    refine = [1, 1, 1]
    assert first_apart(game(refine, refine), game(refine, refine)) == 0
    assert first_apart(game([1, 2, 1]), game(refine, refine)) == 1
    assert first_apart(game(refine, [0, 1, 3]), game(refine, [0, 1, 2])) == 2
    # a round one game plays and the other does not: they part there, either way round
    assert first_apart(game(refine), game(refine, refine)) == 2
    assert first_apart(game(refine, refine, [0, 0, 0]), game(refine, refine)) == 3
    assert first_apart(game(), game(refine)) == 1


def test_rule_losses_plays_both_in_one_eval_and_writes_its_totals(tmp_path, monkeypatch):
    """The command asks eval.py for the policy and the rule on the given game flags, in one run;
    the JSON holds the totals and each class."""
    from experiments import rule_losses

    asked = []

    def fake_eval(command, check):
        asked.append(command)
        out = Path(command[command.index("--out") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        policy = [transcript("a", ["1", "2", "2"], "1", [0, 0, 0], False)]
        rule = [transcript("a", ["1", "2", "2"], "1", [1, 1, 1], True)]
        out.write_text(json.dumps({"details": {"mpdf=p.safetensors": policy, "freeze": rule}}))

    monkeypatch.setattr(rule_losses.subprocess, "run", fake_eval)
    monkeypatch.setattr(rule_losses, "GAMES", tmp_path / "games")
    out = tmp_path / "losses.json"
    argv = ["--policy", "p.safetensors", "--rule", "freeze", "--out", str(out), "--"]
    rule_losses.main([*argv, "--task", "split", "--n", "3"])
    [command] = asked
    at = command.index("--protocols")
    assert command[at - 2 : at] == ["--n", "3"] and command[at + 1] == "mpdf=p.safetensors,freeze"
    written = json.loads(out.read_text())
    totals = [written[k] for k in ("questions", "rule_only_right", "policy_only_right")]
    assert totals == [1, 1, 0]
    assert written["classes"][0]["policy_actions_where_rule_only"] == {"persist": 3}
    assert written["eval_flags"] == ["--task", "split", "--n", "3"]


def test_the_losses_table_pools_each_class_over_the_seeds(tmp_path, monkeypatch):
    """Two seeds' comparisons: a class where the rule alone is right 3 times (the policy PERSISTs)
    comes first, pooled with its actions; a class with no such question shows no actions; the
    missing seed is named."""
    from experiments import rule_tables, tables

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    monkeypatch.setattr(rule_tables, "SEEDS", (0, 1, 2))
    (tmp_path / "rules").mkdir()

    def row(split, questions, mine, theirs, actions, apart):
        return {
            "split": split,
            "vote": "vote right",
            "facts": "dealt",
            "questions": questions,
            "policy_only_right": mine,
            "rule_only_right": theirs,
            "policy_actions_where_rule_only": actions,
            "rule_actions_where_rule_only": {"refine": 3 * theirs} if theirs else {},
            **apart,
        }

    # seed 0's file predates the first round apart: its counts stay out of that column
    older = {}
    newer = {"policy_only_apart": {"2": 1, "0": 1}, "rule_only_apart": {"1": 2}}
    for seed, theirs, apart in ((0, 1, older), (1, 2, newer)):
        compared = {
            "classes": [
                row("majority", 10, 0, theirs, {"persist": 3 * theirs}, apart),
                row("unanimous", 20, 1, 0, {}, apart and {**apart, "rule_only_apart": {}}),
            ]
        }
        (tmp_path / "rules" / f"losses-x-seed{seed}-p-freeze.json").write_text(json.dumps(compared))
    table = rule_tables.losses_table("x", "p", "freeze")
    assert "where p / freeze alone is right (seeds 1) |" in table.splitlines()[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "vote right" in line]
    assert rows[0] == (
        "| majority, vote right, dealt | 20 | 0 | 3 | 9/0/0 / 0/9/0 | never: 1/0, round 1: 0/2, "
        "round 2: 1/0 |"
    )
    assert rows[1] == "| unanimous, vote right, dealt | 40 | 2 | 0 |  | never: 1/0, round 2: 1/0 |"
    assert "losses-x-seed2-p-freeze.json" in table and "seed0" not in table


def test_the_rules_target_holds_only_against_every_costlier_rule_and_debate(tmp_path, monkeypatch):
    """Every rule on 4 questions and 2 seeds: debate at 1000 tokens right on 3, freeze at 500 on
    4. Policy `a` (400 tokens, right on 4) is at least as accurate as every rule (ties freeze) and
    debate at 40% of its tokens; `b` (400 tokens, right on 2) loses to freeze most; `c` (600
    tokens, right on 4) is over the 50% budget; `d` has one seed."""
    from experiments import rule_tables, tables

    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    monkeypatch.setattr(rule_tables, "SEEDS", (0, 1))
    (tmp_path / "tables").mkdir()
    rules_at = {"persist": 100, "debate1": 300, "debate2": 700, "debate": 1000, "freeze": 500}
    right = {
        **{r: (t, [1, 1, 0, 0]) for r, t in rules_at.items()},
        **{r: (200, [1, 0, 0, 0]) for r in ("minority", "gate", "trigger")},
        "debate": (1000, [1, 1, 1, 0]),
        "freeze": (500, [1, 1, 1, 1]),
        "a": (400, [1, 1, 1, 1]),
        "b": (400, [1, 1, 0, 0]),
        "c": (600, [1, 1, 1, 1]),
        "d": (400, [1, 1, 1, 1]),
    }
    for part, (tokens, correct) in right.items():
        for seed in (0,) if part == "d" else (0, 1):
            write_table(tmp_path, f"x-seed{seed}-{part}", tokens, correct)
    table = rule_tables.rules_target_table("x", ["a", "b", "c", "d"], debate_budget=0.5)
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| `")
    }
    assert "seeds 0, 1" in table.splitlines()[0] and "`d`" not in rows
    assert rows["`a`"][0] == "400 (40%)" and rows["`a`"][1].startswith("freeze: +0.000 [")
    # +0.25 over debate, but on two disagreements the interval reaches 0: short of the aim
    assert rows["`a`"][2].startswith("+0.250 [+0.000") and rows["`a`"][3] == "no"
    assert rows["`a`"][4] == "rules ✓, debate ✓, 2 seeds ✓"
    assert rows["`b`"][1].startswith("freeze: -0.500 [") and rows["`b`"][3] == "no"
    assert rows["`b`"][4] == "rules ✗, debate ✗, 2 seeds ✓"
    # c beats every rule at ≥ its tokens but spends 60% of debate's
    assert rows["`c`"][4] == "rules ✓, debate ✗, 2 seeds ✓"


# --------------------------------------------------------------------------------------------------
# the rules as eval.py's protocols, on hand-built games (tests/test_protocols.py's engine)
# --------------------------------------------------------------------------------------------------
