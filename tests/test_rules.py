"""The rules that decide when a team talks (rules.py): the exact actions for constructed states
(unanimous, split 2-1, all different, unparsed answers; a threshold at its edge), the trigger's
features and score, a fitted rule's file checked whole, and a rule playing the game on a scripted
engine. Fitting them, and the studies of the rules: tests/lab/test_rule_studies.py."""

import json
import math

import pytest
from handmade import sol

import rules
from deliberate import PERSIST, REFINE

P, R = PERSIST, REFINE


def team(*answers, confidences=None):
    confidences = confidences or [0.5] * len(answers)
    return [sol(a, c) for a, c in zip(answers, confidences)]


TWO_ONE = math.log2(3) - 2 / 3  # the entropy of a 2-1 split: -(2/3 log2 2/3 + 1/3 log2 1/3)


def test_answer_entropy_counts_an_unparsed_answer_as_agreeing_with_no_one():
    assert rules.answer_entropy(["4", "4", "4"]) == 0.0
    assert rules.answer_entropy(["4", "4", "5"]) == pytest.approx(TWO_ONE, abs=1e-12)
    assert rules.answer_entropy(["1", "2", "3"]) == pytest.approx(math.log2(3), abs=1e-12)
    assert rules.answer_entropy([None, None, "1"]) == pytest.approx(math.log2(3), abs=1e-12)
    assert rules.answer_entropy(["4", "4", None, None]) == pytest.approx(1.5, abs=1e-12)


@pytest.mark.parametrize(
    "answers, freeze, minority",
    [
        (("4", "4", "4"), [P, P, P], [P, P, P]),
        (("4", "4", "5"), [R, R, R], [P, P, R]),
        (("5", "4", "4"), [R, R, R], [R, P, P]),
        ((None, None, None), [R, R, R], [R, R, R]),
        (("4", None, "4"), [R, R, R], [P, R, P]),
    ],
)
def test_freeze_and_minority_act_on_the_teams_answers(answers, freeze, minority):
    for t in (1, 2, 3):
        assert rules.Rule("freeze").team_actions(team(*answers), t) == freeze
        assert rules.Rule("minority").team_actions(team(*answers), t) == minority


def test_minority_follows_the_votes_tie_break_when_all_answers_differ():
    """All different: the vote is the most confident answer, and only its agent PERSISTs."""
    solutions = team("1", "2", "3", confidences=[0.2, 0.9, 0.4])
    assert rules.Rule("minority").team_actions(solutions, 1) == [R, P, R]


def test_the_gate_debates_only_above_its_threshold_and_keeps_debating_after_round_one():
    at_edge = rules.Rule("gate", {"threshold": rules.answer_entropy(["4", "4", "5"])})
    below = rules.Rule("gate", {"threshold": rules.answer_entropy(["4", "4", "5"]) - 1e-9})
    assert at_edge.team_actions(team("4", "4", "5"), 1) == [P, P, P]
    assert below.team_actions(team("4", "4", "5"), 1) == [R, R, R]
    assert at_edge.team_actions(team("1", "2", "3"), 1) == [R, R, R]
    assert below.team_actions(team("4", "4", "4"), 1) == [P, P, P]
    assert rules.Rule("gate", {"threshold": 0.0}).team_actions(team("4", "4", "4"), 1) == [P] * 3
    assert rules.Rule("gate", {"threshold": -1.0}).team_actions(team("4", "4", "4"), 1) == [R] * 3
    # a game still running after round 1 is one the gate opened: it debates
    assert at_edge.team_actions(team("4", "4", "4"), 2) == [R, R, R]


def test_the_triggers_features_of_a_constructed_state():
    """Answers 4, 4, 5 with mean token probabilities 0.9, 0.7, 0.2: entropy of a 2-1 split, two
    of three on the vote, none unparsed, mean 0.6, min 0.2, the vote's agents 0.8."""
    features = rules.round0_features(["4", "4", "5"], [0.9, 0.7, 0.2], "4")
    assert features == pytest.approx([TWO_ONE, 2 / 3, 0.0, 0.6, 0.2, 0.8], abs=1e-12)
    assert len(features) == len(rules.TRIGGER_FEATURES)
    assert rules.round0_features([None, None, "3"], [0.5, 0.5, 0.8], "3") == pytest.approx(
        [math.log2(3), 1 / 3, 2 / 3, 0.6, 0.5, 0.8], abs=1e-12
    )
    assert rules.round0_features([None, None], [0.4, 0.6], None) == pytest.approx(
        [1.0, 0.0, 1.0, 0.5, 0.4, 0.0], abs=1e-12
    )


def test_the_trigger_reads_the_vote_the_team_plays_on_a_tie():
    """Answers 1, 2, 3 with vote confidences 0.2, 0.9, 0.5: the team votes 2 (the tie goes to the
    more confident). A trigger that debates when the vote's agents' mean token probability
    exceeds 0.45 debates: it reads answer 2's 0.6, not the first answer counted (answer 1's 0.3)."""
    solutions = team("1", "2", "3", confidences=[0.2, 0.9, 0.5])
    for s, p in zip(solutions, [0.3, 0.6, 0.4]):
        s.token_logprobs = [math.log(p)]  # its mean_prob
    n = len(rules.TRIGGER_FEATURES)
    of_vote = [10.0 * (f == "mean_prob_of_vote") for f in rules.TRIGGER_FEATURES]
    settings = {"mean": [0.0] * n, "scale": [1.0] * n, "weights": of_vote, "bias": -4.5}
    assert rules.Rule("trigger", settings | {"threshold": 0.5}).talks(solutions)
    solutions[1].confidence = 0.1  # now answer 3 (0.5) wins the tie: 0.4, below
    assert not rules.Rule("trigger", settings | {"threshold": 0.5}).talks(solutions)


def trigger_on_entropy(threshold, weight=10.0, bias=-5.0):
    """A trigger that reads the entropy alone: p = sigmoid(weight * entropy + bias)."""
    n = len(rules.TRIGGER_FEATURES)
    return {
        "mean": [0.0] * n,
        "scale": [1.0] * n,
        "weights": [weight] + [0.0] * (n - 1),
        "bias": bias,
        "threshold": threshold,
    }


def test_the_trigger_scores_standardized_features():
    """p = sigmoid(w . (x - mean) / scale + b), by hand: x = (2, 5), mean (1, 3), scale (2, 4),
    w (1, -2), b 0.5: (0.5, 0.5) -> 0.5 - 1 + 0.5 = 0, p = 1/2; and x = (3, 3): (1, 0) -> 1.5."""
    trigger = {"mean": [1.0, 3.0], "scale": [2.0, 4.0], "weights": [1.0, -2.0], "bias": 0.5}
    assert rules.trigger_score([2.0, 5.0], trigger) == pytest.approx(0.5, abs=1e-12)
    expected = 1 / (1 + math.exp(-1.5))
    assert rules.trigger_score([3.0, 3.0], trigger) == pytest.approx(expected, abs=1e-12)


def test_the_trigger_debates_where_its_score_exceeds_the_threshold():
    score = rules.trigger_score(
        rules.round0_features(["4", "4", "5"], [0.5] * 3, "4"), trigger_on_entropy(0)
    )
    assert score == pytest.approx(1 / (1 + math.exp(-(10 * TWO_ONE - 5))), abs=1e-12)
    trigger = rules.Rule("trigger", trigger_on_entropy(0.5))
    assert trigger.team_actions(team("4", "4", "4"), 1) == [P, P, P]
    assert trigger.team_actions(team("4", "4", "5"), 1) == [R, R, R]
    assert (
        rules.Rule("trigger", trigger_on_entropy(score)).team_actions(team("4", "4", "5"), 1)
        == [P] * 3
    )
    assert trigger.team_actions(team("4", "4", "4"), 3) == [R, R, R]


def test_a_rule_loads_from_its_protocol_spec_and_refuses_what_it_cannot_play(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"gate": {"threshold": 0.5}, "trigger": trigger_on_entropy(0.5)}))
    gate = rules.load_rule(f"gate={path}")
    assert gate.name == "gate" and gate.settings == {"threshold": 0.5}
    assert rules.load_rule(f"trigger={path}").settings["threshold"] == 0.5
    assert rules.load_rule("freeze").name == "freeze"
    with pytest.raises(
        ValueError, match="^the freeze rule is fitted to nothing: it reads no file$"
    ):
        rules.load_rule(f"freeze={path}")
    with pytest.raises(ValueError) as refused:
        rules.load_rule("silence")
    assert str(refused.value) == "unknown rule 'silence'; known: freeze, minority, gate, trigger"
    for name in ("gate", "trigger"):
        with pytest.raises(ValueError, match=f"the {name} rule needs its fitted settings"):
            rules.load_rule(name)


def rule_game(protocol, solve, refine, rounds=3):
    from test_protocols import Recorder, example, game_replies

    import eval as E
    from solutions import GameConfig

    engine = Recorder(game_replies(1, "q/1", solve, refine))
    cfg = GameConfig(agents=3, rounds=rounds, seed=1, temperature=0.6)
    [result] = E.run_protocol(engine, [example("q/1")], protocol, cfg)
    actions = [r.get("actions") for r in result["rounds"][1:]]
    answers = [r["answers"] for r in result["rounds"]]
    return engine, result, actions, answers


def refine_seeds(keys):
    from common import call_seed

    return [call_seed(1, "q/1", i, t, "refine") for t, i in keys]


def test_short_debates_are_debates_first_rounds_with_its_seeds():
    """debate-1 in a 3-round game: round 0, then one round of every agent's REFINE, the same calls
    (seeds) as debate's round 1, so a cached debate pays for it."""
    refine = {(1, 0): 5, (1, 1): 5, (1, 2): 4, (2, 0): 5, (2, 1): 5, (2, 2): 5}
    engine, result, actions, answers = rule_game("debate-1", [3, 5, 4], refine)
    assert actions == [[R, R, R]] and answers == [["3", "5", "4"], ["5", "5", "4"]]
    assert engine.column("seeds")[3:] == refine_seeds([(1, 0), (1, 1), (1, 2)])
    engine, result, actions, answers = rule_game("debate-2", [3, 5, 4], refine)
    assert actions == [[R, R, R], [R, R, R]] and result["pred"] == "5"


def test_freeze_talks_until_the_team_is_unanimous_then_stops():
    """3, 5, 4 -> everyone REFINEs -> 5, 5, 4 -> everyone REFINEs -> 5, 5, 5 -> all PERSIST: the
    game ends after round 3 with 9 calls; a unanimous start ends at round 1 with 3."""
    refine = {(1, 0): 5, (1, 1): 5, (1, 2): 4, (2, 0): 5, (2, 1): 5, (2, 2): 5}
    engine, result, actions, answers = rule_game("freeze", [3, 5, 4], refine)
    assert actions == [[R, R, R], [R, R, R], [P, P, P]]
    assert answers[-1] == ["5", "5", "5"] and result["rounds"][-1]["stopped"]
    assert result["calls"] == 9
    engine, result, actions, _ = rule_game("freeze", [5, 5, 5], {})
    assert actions == [[P, P, P]] and result["calls"] == 3


def test_minority_refines_only_the_agents_off_the_vote():
    """3, 5, 4 tie: the vote is agent 0's 3 (equal confidence, lower index), so agents 1 and 2
    REFINE (to 5 and 4: the vote stays 3), then again (to 5 and 5: the vote turns to 5), then
    agent 0 alone, off the vote, REFINEs to 5."""
    refine = {(1, 1): 5, (1, 2): 4, (2, 1): 5, (2, 2): 5, (3, 0): 5}
    engine, result, actions, answers = rule_game("minority", [3, 5, 4], refine)
    assert actions == [[P, R, R], [P, R, R], [R, P, P]]
    assert answers == [["3", "5", "4"], ["3", "5", "4"], ["3", "5", "5"], ["5", "5", "5"]]
    assert engine.column("seeds")[3:] == refine_seeds([(1, 1), (1, 2), (2, 1), (2, 2), (3, 0)])
    assert result["calls"] == 8


def test_the_gate_protocol_reads_its_fitted_threshold(tmp_path):
    """Threshold 1.0 bit: all different (1.58 bits) debates every round; a 2-1 split (0.92 bits)
    keeps the round-0 vote and stops."""
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"gate": {"threshold": 1.0}}))
    refine = {(t, i): 5 for t in (1, 2, 3) for i in range(3)}
    engine, result, actions, _ = rule_game(f"gate={path}", [3, 5, 4], refine)
    assert actions == [[R, R, R]] * 3 and result["calls"] == 12
    engine, result, actions, _ = rule_game(f"gate={path}", [5, 5, 4], refine)
    assert actions == [[P, P, P]] and result["calls"] == 3 and result["pred"] == "5"


def test_eval_refuses_a_rule_it_cannot_play(tmp_path):
    import eval as E
    from common import UsageError

    cfg = E.Config()
    for protocol in ("debate-1", "debate-2", "freeze", "minority"):
        E.check_protocol(protocol, cfg)
    fitted = tmp_path / "rules.json"
    fitted.write_text(json.dumps({"gate": {"threshold": 1.0}}))
    E.check_protocol(f"gate={fitted}", cfg)
    # files that would fail only once a game reads them: a misnamed key, a list, a trigger short
    # of a feature's weight, a threshold that is not a number
    misnamed, listed, short, text = (tmp_path / f"{k}.json" for k in range(4))
    misnamed.write_text(json.dumps({"gate": {"thr": 1}}))
    listed.write_text(json.dumps([{"gate": {"threshold": 1.0}}]))
    trigger = trigger_on_entropy(0.5)
    short.write_text(json.dumps({"trigger": dict(trigger, weights=trigger["weights"][:-1])}))
    text.write_text(json.dumps({"gate": {"threshold": "1"}}))
    n = len(rules.TRIGGER_FEATURES)
    for protocol, says in (
        (f"gate={tmp_path / 'none.json'}", "no file"),
        (f"trigger={fitted}", f"{fitted} holds no fitted trigger"),
        (f"gate={misnamed}", f"{misnamed}: the gate's 'threshold' must be a number, not None"),
        (f"gate={listed}", f"{listed} holds no fitted gate"),
        (
            f"trigger={short}",
            f"{short}: the trigger's 'weights' must be {n} numbers (one per feature: "
            f"{', '.join(rules.TRIGGER_FEATURES)}), not {trigger['weights'][:-1]!r}",
        ),
        (f"gate={text}", "the gate's 'threshold' must be a number, not '1'"),
        ("freezing", "unknown protocol"),
        ("debate-3", "unknown protocol"),
    ):
        with pytest.raises(UsageError) as refused:
            E.check_protocol(protocol, cfg)
        assert says in str(refused.value) and "\n" not in str(refused.value)
