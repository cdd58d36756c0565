"""Whether a solution's written steps check (experiments/checked_steps.py), and the rules that read
it played on debate's games: transcripts and tables written by hand; checked stop played as a game
of its own on a scripted engine."""

import json
from types import SimpleNamespace

import pytest
from scripted import ScriptedEngine

import data
from common import FileRefused, UsageError, call_seed
from deliberate import PERSIST, REFINE, play
from experiments import checked_steps as C
from solutions import GameConfig

RIGHT = "A box holds 21 cards.\nMaria takes 6 of them.\n21 - 6 = 15\nAnswer: 15"
SLIP = "A box holds 21 cards.\nMaria takes 6 of them.\n21 - 6 = 14\nAnswer: 14"
MISSING = "Not known: how many Maria takes. I count it as 0.\n21 - 0 = 21\nAnswer: 21"


def record(texts, answers, right, confidence=(0.5, 0.5, 0.5), vote_right=None):
    if vote_right is None:  # the plain vote: most agents, then confidence, then index
        best = max(
            range(len(answers)), key=lambda i: (answers.count(answers[i]), confidence[i], -i)
        )
        vote_right = right[best]
    return {
        "texts": list(texts),
        "answers": list(answers),
        "agent_correct": list(right),
        "confidence": list(confidence),
        "correct": vote_right,
    }


def test_the_checked_vote_reads_only_the_solutions_that_check():
    # two agents agree on 14 after a slip, one is right: the plain vote is wrong, the checked right
    team = C.Team(record([SLIP, SLIP, RIGHT], ["14", "14", "15"], [False, False, True]))
    assert team.vote_right is False
    assert team.checked_vote_right() is True
    # nothing checks: the plain vote
    team = C.Team(record([SLIP, SLIP, MISSING], ["14", "14", "21"], [False, False, False]))
    assert team.checked_vote_right() is False
    # two answers check, one agent each: the higher confidence wins, as in the game's vote
    other = RIGHT.replace("Maria takes 6", "Maria takes 5").replace("6 = 15", "5 = 16")
    other = other.replace("Answer: 15", "Answer: 16")
    answers, right = ["16", "15", "14"], [False, True, False]
    team = C.Team(record([other, RIGHT, SLIP], answers, right, (0.4, 0.9, 0.1)))
    assert team.checked_vote_right() is True
    team = C.Team(record([other, RIGHT, SLIP], answers, right, (0.9, 0.4, 0.1)))
    assert team.checked_vote_right() is False


def game(rounds):
    return [C.Team(r) for r in rounds]


def test_freeze_stops_at_the_first_unanimous_round_and_checked_stop_where_a_solution_checks():
    r0 = record([MISSING, MISSING, SLIP], ["21", "21", "14"], [False, False, False])
    r1 = record([SLIP, RIGHT, SLIP], ["14", "15", "14"], [False, True, False])
    r2 = record([SLIP, SLIP, SLIP], ["14", "14", "14"], [False, False, False])
    r3 = record([RIGHT] * 3, ["15"] * 3, [True] * 3)
    teams = game([r0, r1, r2, r3])
    assert C.freeze(teams) == (2, False)
    assert C.freeze_checked_vote(teams) == (2, False)  # nothing checks at round 2
    # round 0 says a value is missing; round 1 has a solution that checks: stop, answer 15
    assert C.checked_stop(teams) == (1, True)
    assert C.debate_checked_vote(teams) == (3, True)
    # never unanimous, nothing checks: both stop after the last round
    never = game([r0, r1, r0, r0])
    assert C.freeze(never)[0] == 3
    assert C.checked_stop(game([r0, r0, r0, r0]))[0] == 3


def test_the_signal_counts_each_part_and_round_and_its_auroc():
    r0 = record([RIGHT, SLIP, RIGHT], ["15", "14", "15"], [True, False, True])
    counts = C.signal_counts({"a": game([r0]), "b": game([r0])}, {"a": False, "b": True})
    shared = counts["shared 0"]
    assert shared == {"checks_right": 2, "checks_wrong": 0, "fails_right": 0, "fails_wrong": 1}
    assert counts["split 0"] == shared and sum(counts["shared 1"].values()) == 0
    assert C.auroc_of(shared) == 1.0
    # a check that passes half the right and half the wrong ones tells nothing
    half = {"checks_right": 1, "checks_wrong": 2, "fails_right": 1, "fails_wrong": 2}
    assert C.auroc_of(half) == 0.5
    assert C.auroc_of(counts["shared 1"]) is None


def write_tables(tmp_path, ids, tokens, freeze_correct, dealt):
    for r, name in enumerate(C.STOPPED_AT):
        summary = {"accuracy": 0, "question_ids": ids, "question_tokens": [tokens[r]] * len(ids)}
        (tmp_path / f"t-{name}.json").write_text(json.dumps({name: summary}))
    freeze = {"accuracy": 0, "question_ids": ids, "correct": freeze_correct}
    freeze["question_tokens"] = [tokens[1]] * len(ids)
    freeze = {"freeze": freeze | {"question_dealt": dealt}}
    (tmp_path / "t-freeze.json").write_text(json.dumps(freeze))


def write_games(tmp_path, games):
    details = [{"id": q, "rounds": rounds} for q, rounds in games.items()]
    (tmp_path / "g.json").write_text(json.dumps({"details": {"debate": details}}))


def run(tmp_path, out):
    C.main(
        ["--tables", str(tmp_path / "t"), "--games", str(tmp_path / "g.json"), "--out", str(out)]
    )


def test_the_rules_on_debate_games_against_freeze_s_own_table(tmp_path, capsys):
    wrong0 = record([SLIP, SLIP, RIGHT], ["14", "14", "15"], [False, False, True])
    unanimous_wrong = record([SLIP] * 3, ["14"] * 3, [False] * 3)
    split0 = record([MISSING] * 3, ["21"] * 3, [False] * 3)
    split1 = record([RIGHT, SLIP, SLIP], ["15", "14", "14"], [True, False, False])
    games = {
        # freeze stops at round 1 (unanimous, wrong); the checked vote is right at round 0 already
        "a": [wrong0, unanimous_wrong, unanimous_wrong, unanimous_wrong],
        # dealt: round 0 unanimous and missing a value, freeze stops there; checked stop goes on
        "b": [split0, split1, split1, split1],
    }
    write_games(tmp_path, games)
    write_tables(tmp_path, ["a", "b"], [100, 200, 300, 400], [False, False], [False, True])
    out = tmp_path / "out.json"
    run(tmp_path, out)
    rules = json.loads(out.read_text())["rules"]
    assert rules["freeze"]["correct"] == [False, False]
    assert rules["freeze"]["question_tokens"] == [200, 100]
    # a: a solution checks at round 0 and none says missing: stop there, the checked vote is
    # right; b: round 0 says missing, round 1 checks: stop there, right
    assert rules["checked stop"] == {
        "question_ids": ["a", "b"],
        "correct": [True, True],
        "question_tokens": [100, 200],
        "stopped_at": [0, 1],
    }
    table = capsys.readouterr().out
    # the report's table of this one seed: +1.000 against freeze on both questions
    assert (
        "| checked stop (out) | 1.000 ± 0.000 | 1.000 | 1.000 | 150 | +1.000 [+1.000, +1.000] (2) |"
        in table
    )
    assert "| freeze (out) | 0.000 ± 0.000 | 0.000 | 0.000 | 150 |  |" in table
    # two seeds of the same file pool to the same figures, with the differing questions twice
    pooled_table = C.checked_table([out, out])
    assert (
        "| checked stop (out, out) | 1.000 ± 0.000 | 1.000 | 1.000 | 150 "
        "| +1.000 [+1.000, +1.000] (4) |" in pooled_table
    )
    # the slices where a rule is blind: b's round 0 is unanimous and wrong, a's a wrong 2-1 vote
    slices = tmp_path / "slices.json"
    slices.write_text(json.dumps({"slices": {"unanimous-wrong": ["b"], "majority-wrong": ["a"]}}))
    by_slice = C.checked_table([out], [slices])
    assert "| freeze | 1, 0.000, 100 | 1, 0.000, 200 |" in by_slice
    assert "| checked stop | 1, 1.000, 200 | 1, 1.000, 100 |" in by_slice
    # round 0 of question a, twice: of 6 solutions 2 check, both right; the 4 others wrong
    assert "| shared 0 | 6 | 0.333 | 1.000 | 0.000 | 1.000 |" in pooled_table


def test_games_that_are_not_freeze_s_are_refused(tmp_path):
    right = record([RIGHT] * 3, ["15"] * 3, [True] * 3)
    write_games(tmp_path, {"a": [right] * 4})
    write_tables(tmp_path, ["a"], [1, 2, 3, 4], [False], [False])  # freeze's table says wrong
    with pytest.raises(FileRefused, match="not .*freeze"):
        run(tmp_path, tmp_path / "o.json")
    (tmp_path / "g.json").write_text(json.dumps({"debate": {}}))
    with pytest.raises(FileRefused, match="no transcripts"):
        run(tmp_path, tmp_path / "o.json")
    with pytest.raises(FileRefused, match="no eval.py flags"):
        C.main(["--tables", "t", "--games", str(tmp_path / "none.json"), "--out", "o.json"])
    assert C.checked_table([tmp_path / "none.json"]).startswith("*(not computed yet: ")


def test_checked_stop_as_a_rule_refines_until_a_solution_checks_and_none_says_missing():
    rule = C.CheckedStop()

    def team(*texts):
        return [SimpleNamespace(text=t) for t in texts]

    assert rule.team_actions(team(SLIP, SLIP, SLIP), 1) == [REFINE] * 3
    assert rule.team_actions(team(RIGHT, SLIP, MISSING), 2) == [REFINE] * 3
    assert rule.team_actions(team(RIGHT, SLIP, SLIP), 1) == [PERSIST] * 3
    assert not rule.reads_critic


def live_game(script_of, qid="q/1", gold="15", rounds=3):
    """Checked stop's game on one question: `script_of(round, agent)` is the agent's text."""
    texts = {
        call_seed(1, qid, i, t, "solve" if t == 0 else "refine"): script_of(t, i)
        for t in range(rounds + 1)
        for i in range(3)
    }
    engine = ScriptedEngine(lambda prompt, seed: texts[seed])
    example = data.Example(question=f"Question {qid}?", answer=gold, task="arith", id=qid)
    cfg = GameConfig(agents=3, rounds=rounds, seed=1, temperature=0.6)
    [g] = play(engine, [example], C.CheckedStop(), cfg)
    return g.transcript()


def test_checked_stop_played_live_gives_what_the_replay_gives(tmp_path):
    # a: round 0 says a value is missing; round 1 has one solution that checks (15, right) and two
    # slips that agree (14): the game stops after round 1 and the checked vote is right where the
    # plain vote is wrong. b: nothing ever checks: every round is played, the plain vote (14).
    def a(t, i):
        return MISSING if t == 0 else (RIGHT if i == 0 else SLIP)

    games = {"a": live_game(a, "a"), "b": live_game(lambda t, i: SLIP, "b")}
    assert [len(g["rounds"]) for g in games.values()] == [3, 4]
    assert games["a"]["rounds"][2]["stopped"] and games["a"]["pred"] == "14"
    assert games["a"]["calls"] == 6 and games["b"]["calls"] == 12
    (tmp_path / "g.json").write_text(json.dumps({"details": {C.LIVE: list(games.values())}}))
    write_tables(tmp_path, ["a", "b"], [1, 2, 3, 4], [False, False], [True, False])
    out = tmp_path / "out.json"
    args = ["--live", "--tables", str(tmp_path / "t"), "--games", str(tmp_path / "g.json")]
    C.main([*args, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["signal"] is None
    assert result["rules"][C.LIVE] == {
        "question_ids": ["a", "b"],
        "correct": [True, False],
        "question_tokens": [games["a"]["tokens"], games["b"]["tokens"]],
        "stopped_at": [1, 3],
    }
    # the same rounds replayed as debate's (rounds past the stop unplayed) give the same outcome
    replayed = [C.checked_stop([C.Team(r) for r in g["rounds"]]) for g in games.values()]
    assert replayed == [(1, True), (3, False)]
    # a live seed pools with a seed that replayed debate: each rule over the seeds that have it
    table = C.checked_table([out])
    assert "| freeze (out) | 0.000 ± 0.000 | 0.000 | 0.000 | " in table
    assert "| checked stop (out) | 0.500 ± 0.000 | 1.000 | 0.000 | " in table
    assert "part, round" not in table  # no signal counts from a live seed
    # a policy against checked stop and freeze on the same questions
    policy = {"accuracy": 0.5, "question_ids": ["a", "b"], "correct": [False, True]}
    (tmp_path / "p.json").write_text(json.dumps({"mpdf": policy | {"question_tokens": [5, 7]}}))
    table = C.checked_table([out], policies={"sft": [tmp_path / "p.json"]})
    assert "| sft (out) | 0.500 | 6 | +0.000 [-1.000, +1.000] (2) | +0.500 " in table
    # and on the slices where a rule is blind, beside the rules
    slices = tmp_path / "slices.json"
    slices.write_text(json.dumps({"slices": {"unanimous-wrong": ["b"], "majority-wrong": ["a"]}}))
    table = C.checked_table([out], [slices], {"sft": [tmp_path / "p.json"]})
    assert "| sft | 1, 1.000, 7 | 1, 0.000, 5 |" in table


def test_a_live_game_that_did_not_stop_where_the_rule_says_is_refused(tmp_path):
    game = live_game(lambda t, i: RIGHT if t == 1 else MISSING, "a")
    game["rounds"].insert(2, game["rounds"][1])  # a round played past the rule's stop
    (tmp_path / "g.json").write_text(json.dumps({"details": {C.LIVE: [game]}}))
    write_tables(tmp_path, ["a"], [1, 2, 3, 4], [False], [True])
    args = ["--live", "--tables", str(tmp_path / "t"), "--games", str(tmp_path / "g.json")]
    with pytest.raises(FileRefused, match="stopped after round 2, the rule at 1"):
        C.main([*args, "--out", str(tmp_path / "o.json")])


def test_a_task_that_deals_no_values_has_only_shared_questions(tmp_path):
    games = {"a": live_game(lambda t, i: RIGHT, "a")}  # checks at once: stops after round 0
    (tmp_path / "g.json").write_text(json.dumps({"details": {C.LIVE: list(games.values())}}))
    freeze = {"accuracy": 1, "question_ids": ["a"], "correct": [True], "question_tokens": [9]}
    (tmp_path / "t-freeze.json").write_text(json.dumps({"freeze": freeze}))  # no question_dealt
    out = tmp_path / "out.json"
    args = ["--live", "--tables", str(tmp_path / "t"), "--games", str(tmp_path / "g.json")]
    C.main([*args, "--out", str(out)])
    assert json.loads(out.read_text())["dealt"] == {"a": False}
    table = C.checked_table([out])
    assert "| checked stop (out) | 1.000 ± 0.000 | – | 1.000 | " in table


def test_a_policy_s_games_answered_by_the_checked_vote(tmp_path):
    # the policy's team stops on a 2-1 vote for a slip (14) while one solution checks (15)
    last = record([SLIP, RIGHT, SLIP], ["14", "15", "14"], [False, True, False])
    first = record([MISSING] * 3, ["21"] * 3, [False] * 3)
    policy = "results/policies/t-sft-text.safetensors"
    game = {"id": "a", "rounds": [first, last], "correct": False, "tokens": 40}
    (tmp_path / "g.json").write_text(json.dumps({"details": {f"mpdf={policy}": [game]}}))
    table = {"accuracy": 0, "question_ids": ["a"], "correct": [False], "question_tokens": [40]}
    (tmp_path / "t-sft-text.json").write_text(json.dumps({f"mpdf={policy}": table}))
    args = ["--tables", str(tmp_path / "t"), "--games", str(tmp_path / "g.json")]
    out = tmp_path / "p.json"
    C.main([*args, "--policy", "sft-text", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["plain"]["correct"] == [False] and result["checked vote"]["correct"] == [True]
    assert result["checked vote"]["question_tokens"] == [40]
    # games that are not the policy's table's are refused
    table["correct"] = [True]
    (tmp_path / "t-sft-text.json").write_text(json.dumps({f"mpdf={policy}": table}))
    with pytest.raises(FileRefused, match="not the games of"):
        C.main([*args, "--policy", "sft-text", "--out", str(out)])
    with pytest.raises(UsageError, match="one at a time"):
        C.main([*args, "--policy", "sft-text", "--live", "--out", str(out)])


def test_the_pieces_read_debate_on_seed_0_play_the_rule_live_elsewhere_and_the_text_policy():
    from experiments import pieces

    for seed in (0, 1, 2):
        name = f"split300-team-split-seed{seed}"
        rule = pieces.PIECES[f"checked-{name}"]["command"]
        assert ("--live" in rule) == (seed != 0)
        assert rule[rule.index("--tables") + 1] == f"results/tables/{name}"
        assert rule[rule.index("--seed") + 1] == str(seed)
        policy = pieces.PIECES[f"checked-{name}-sft-text"]
        assert policy["command"][policy["command"].index("--policy") + 1] == "sft-text"
        assert f"results/policies/{name}-sft-text.safetensors" in policy["needs"]
        assert policy["outputs"] == [f"results/study/checked-steps/{name}-sft-text.json"]
    arith = pieces.PIECES["checked-arith300-team-varied-seed1"]["command"]
    assert "--live" in arith and arith[arith.index("--task") + 1] == "arith"
    assert arith[arith.index("--dtype") + 1] == "float32"


def test_an_older_table_that_keeps_only_its_mean_tokens(tmp_path):
    games = {"a": live_game(lambda t, i: RIGHT, "a"), "b": live_game(lambda t, i: RIGHT, "b")}
    (tmp_path / "g.json").write_text(json.dumps({"details": {C.LIVE: list(games.values())}}))
    freeze = {"accuracy": 1, "question_ids": ["a", "b"], "correct": [True, False]}
    (tmp_path / "t-freeze.json").write_text(
        json.dumps({"freeze": freeze | {"question_tokens": [9, 9]}})
    )
    out = tmp_path / "out.json"
    args = ["--live", "--tables", str(tmp_path / "t"), "--games", str(tmp_path / "g.json")]
    C.main([*args, "--out", str(out)])
    old = {"accuracy": 0.5, "question_ids": ["a", "b"], "correct": [True, False]}
    (tmp_path / "old.json").write_text(json.dumps({"mpdf": old | {"tokens_per_question": 12.5}}))
    table = C.checked_table([out], policies={"sft": [tmp_path / "old.json"]})
    assert "| sft (out) | 0.500 | 12 | -0.500 " in table
