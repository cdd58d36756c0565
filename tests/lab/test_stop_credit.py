"""Credit for the team's joint REFINE to the game's end (experiments/stop_credit.py), worked by hand
on a debate game of three agents and three rounds, gold 5. Each vote is the plurality, ties to the
higher confidence (solutions.majority_vote); the actions are PERSIST, REFINE, CONCEDE to the first
peer, to the second (agent 1's peers are agents 0 and 2)."""

from handmade import sol

import deliberate as D
from deliberate import PERSIST, REFINE, concede
from experiments import stop_credit as S

P, R = PERSIST, REFINE


def team(*pairs):
    return [sol(a, c) for a, c in pairs]


def debate_move(t, before, refined, costs=(0.0, 0.0, 0.0)):
    """Round t of a debate game: every agent REFINEs, so the answers after are its samples."""
    samples = dict(enumerate(refined))
    return D.Move(t, [], [R, R, R], before, list(refined), samples, list(costs))


# The vote turns a round after the REFINE that sets it up. Entering round 1: A 3 (.9), B 3 (.8),
# C 4 (.5), the vote 3, wrong. Round 1's samples: A 3 (.9), B 7 (.5), C 5 (.6): three singletons,
# 3 the most confident, still wrong. Round 2's: 5, 5, 5, right; round 3 keeps them.
ROUND0 = team(("3", 0.9), ("3", 0.8), ("4", 0.5))
ROUND1 = team(("3", 0.9), ("7", 0.5), ("5", 0.6))
ROUND2 = team(("5", 0.7), ("5", 0.7), ("5", 0.6))
GAME = [
    debate_move(1, ROUND0, ROUND1),
    debate_move(2, ROUND1, ROUND2),
    debate_move(3, ROUND2, ROUND2),
]


def test_the_per_agent_counterfactual_prices_a_refine_whose_vote_turns_later_at_nothing():
    """train_rl.py's vector for B in round 1, its peers held at their REFINEs (3 and 5): PERSIST
    3, 3, 5 -> 3 wrong; REFINE 3, 7, 5 -> 3 (.9) wrong; own wrong either way: 0 and 0."""
    vectors = D.counterfactual_rewards(GAME[0], "5", "arith")
    assert vectors[1][P] == vectors[1][R] == 0.0


def test_going_on_ends_where_the_policy_stops():
    """With the policy stopping in round 3 (the answers entering it: round 2's, right), going on
    from rounds 1 and 2 is worth 1, from round 3 the last round's answers (right); stopping in
    round 2 instead ends round 1 on its answers (wrong), and never stopping ends on round 3's."""
    assert S.going_on(GAME, [False, False, True], "5", "arith") == [1.0, 1.0, 1.0]
    assert S.going_on(GAME, [False, True, False], "5", "arith") == [0.0, 1.0, 1.0]
    assert S.going_on(GAME, [True, True, True], "5", "arith") == [0.0, 1.0, 1.0]
    assert S.going_on(GAME[:1], [False], "5", "arith") == [0.0]


def test_stop_credit_prices_the_joint_refine_above_persist():
    """Round 1, going on worth 1: every agent's PERSIST is the vote entering it (3, wrong: 0), its
    REFINE 1 less its own cost; a CONCEDE makes the vote 3 (A to B: 3, 3, 4; B to A: 3, 3, 4;
    C to A or B: 3, 3, 3), wrong: 0."""
    paid = debate_move(1, ROUND0, ROUND1, costs=(0.25, 0.0, 0.5))
    vectors = S.stop_credit_vectors(paid, 1.0, "5", "arith")
    assert vectors == [[0.0, 0.75, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0]]


def test_stop_credit_on_a_round_with_a_concede():
    """Entering the round: A 5 (.3), right, B 2 (.9), C 3 (.5): the vote 2, wrong, so PERSIST is
    worth 0. B CONCEDEing to A: 5, 5, 3 -> 5, right; to C: 5, 3, 3 -> 3, wrong. A CONCEDEing to B:
    2, 2, 3, wrong; to C: 3, 2, 3 -> 3, wrong. C to A: 5, 2, 5, right; to B: 5, 2, 2, wrong.
    Going on worth 0 here: every REFINE 0."""
    before = team(("5", 0.3), ("2", 0.9), ("3", 0.5))
    vectors = S.stop_credit_vectors(debate_move(1, before, before), 0.0, "5", "arith")
    assert vectors[0] == [0.0, 0.0, 0.0, 0.0]
    assert vectors[1][P] == 0.0 and vectors[1][concede(0)] == 1.0 and vectors[1][concede(1)] == 0.0
    assert vectors[2] == [0.0, 0.0, 1.0, 0.0]
    # a vote already right: stopping keeps it, whatever going on would do
    right = team(("5", 0.9), ("5", 0.8), ("3", 0.5))
    assert S.stop_credit_vectors(debate_move(1, right, right), 0.0, "5", "arith")[2][P] == 1.0


def test_stop_credit_trains_through_the_door(tmp_path, monkeypatch):
    """experiments/stop_credit.py's corpus in train_rl.train on the scripted arith engine: debate
    games (every action REFINE), every state's vector its stop credit, going on read from the
    behaviour policy's greedy stops (recomputed here from the same games)."""
    import torch
    from scripted import ScriptedEngine, arith_script

    import common
    import data
    import train_rl
    from solutions import GameConfig

    monkeypatch.setattr(train_rl, "make_engine", lambda *a, **k: ScriptedEngine(arith_script()))
    torch.manual_seed(0)
    init = tmp_path / "init.safetensors"
    D.save_policy(D.MetaPolicy(agents=3), init)
    out = tmp_path / "run"
    out.mkdir()
    cfg = train_rl.Config(
        agents=3, rounds=2, questions=6, val_n=0, epochs=1, batch_size=8, init=str(init)
    )
    cfg.out_dir, cfg.refine_cost, cfg.dtype = str(out), 0.1, "float32"
    alone = common.Ranks(0, 1, "cpu")
    train_rl.train(cfg, alone, corpus=S.stop_credit_states)
    stored = torch.load(out / "corpus-0.pt", weights_only=False)
    assert stored["settings"]["corpus"] == "stop_credit_states"
    assert {r["action"] for r in stored["rows"]} == {R}
    behaviour = D.load_policy(init).eval()
    questions, _ = data.training_questions(cfg, 0)
    games = D.play_shard(
        ScriptedEngine(arith_script()),
        questions,
        D.FixedPolicy("refine"),
        GameConfig.of(cfg),
        ranks=alone,
        refine_all=True,
        refine_cost=0.1,
    )
    expected = {}
    for g in games:
        gold = g.example.answer
        stopping = [S.stops(behaviour, m) for m in g.moves]
        for m, value in zip(g.moves, S.going_on(g.moves, stopping, gold, "arith")):
            for i, vector in enumerate(S.stop_credit_vectors(m, value, gold, "arith")):
                expected[g.example.id, m.round, i] = vector
    assert len(expected) == 6 * 2 * 3
    assert {r["key"]: r["rewards"] for r in stored["rows"]} == expected


def test_stops_reads_the_greedy_actions():
    """The team stops where every agent's most likely action is PERSIST, not where one agent's
    is REFINE."""
    import torch

    seen = [([0.0], [[0.0], [0.0]])] * 3
    move = D.Move(1, seen, [R, R, R], ROUND0, ROUND1, dict(enumerate(ROUND1)), [0.0] * 3)

    def policy(rows):
        return lambda own, peers, agents: torch.tensor(rows)

    persist, refine = [2.0, 1.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]
    assert S.stops(policy([persist] * 3), move)
    assert not S.stops(policy([persist, refine, persist]), move)


def test_the_corpus_tally_names_round_0s_vote_and_counts_what_going_on_is_worth(monkeypatch):
    """experiments/stop_corpus.py on two hand-made games, gold 5: GAME (a wrong 2-1 vote, 3 3 4,
    that going on turns right) and a right 2-1 vote (5 5 3) whose round broke it (3 3 5 after,
    every later round too). The policy stops nowhere, so going on ends on the last round's
    answers: right in GAME, wrong in the other."""
    from types import SimpleNamespace

    from experiments import stop_corpus as T

    right, broken = (
        team(("5", 0.9), ("5", 0.8), ("3", 0.5)),
        team(("3", 0.9), ("3", 0.8), ("5", 0.5)),
    )
    other = [debate_move(1, right, broken), debate_move(2, broken, broken)]
    games = [
        SimpleNamespace(example=SimpleNamespace(answer="5", task="arith"), moves=moves)
        for moves in (GAME, other)
    ]
    monkeypatch.setattr(T, "stops", lambda behaviour, move: False)
    assert T.vote_shape(ROUND0, "5", "arith") == "wrong-2of3"
    assert T.vote_shape(ROUND2, "5", "arith") == "right-3of3"
    assert T.vote_shape(ROUND1, "5", "arith") == "wrong-1of3"
    assert T.tally(games, behaviour=None) == {
        "right-2of3": {"questions": 1, "stop": 1.0, "going on": 0.0, "debate": 0.0},
        "wrong-2of3": {"questions": 1, "stop": 0.0, "going on": 1.0, "debate": 1.0},
    }
    # the policy stopping entering round 2: going on from round 1 ends on round 1's answers
    monkeypatch.setattr(T, "stops", lambda behaviour, move: move.round == 2)
    assert T.tally(games, behaviour=None)["wrong-2of3"] == {
        "questions": 1,
        "stop": 0.0,
        "going on": 0.0,
        "debate": 1.0,
    }
