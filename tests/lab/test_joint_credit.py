"""Credit for the team's joint action (experiments/joint_credit.py), worked by hand on two rounds
of three agents, gold 5. Each vote is the plurality, ties to the higher confidence
(solutions.majority_vote); the actions are PERSIST, REFINE, CONCEDE to the first peer, to the
second (agent 0's peers are agents 1 and 2; agent 1's are 0 and 2)."""

import pytest
from handmade import sol

import deliberate as D
from deliberate import PERSIST, REFINE, concede
from experiments import joint_credit as J

P, R = PERSIST, REFINE


def move(before, refined, actions, costs=(0.0, 0.0, 0.0)):
    """A decision round: solutions (answer, confidence) before, each agent's REFINE sample, the
    actions taken."""
    before = [sol(a, c) for a, c in before]
    refined = {i: sol(a, c) for i, (a, c) in enumerate(refined)}
    after = [D.outcome(before, i, a, refined) for i, a in enumerate(actions)]
    return D.Move(1, [], list(actions), before, after, refined, list(costs))


# Two REFINEs together turn the vote, one alone changes nothing. Before: A 3 (.9), B 3 (.8), C 4
# (.5): the vote 3, wrong. REFINE samples: A 7 (.1), B 8 (.1), C 5 (.6), right. Taken: A and B
# PERSIST, C REFINEs: 3, 3, 5 -> 3. With A and B both REFINEing: 7, 8, 5 -> three singletons, 5 the
# most confident: right. A alone: 7, 3, 5 -> 3 (.8) wrong; B alone: 3, 8, 5 -> 3 (.9) wrong.
JOINT = move([("3", 0.9), ("3", 0.8), ("4", 0.5)], [("7", 0.1), ("8", 0.1), ("5", 0.6)], [P, P, R])


def test_the_per_agent_counterfactual_prices_a_joint_refine_at_persists_value():
    """train_rl.py's vector for A, its peers held at PERSIST (B) and REFINE (C): PERSIST 3,3,5
    (own 0; the vote 3 wrong with A and without it, 3 (.8) against 5 (.6)): 0. REFINE 7,3,5 (own
    wrong to wrong; 3 wins with and without A): 0. The same for B by symmetry."""
    vectors = D.counterfactual_rewards(JOINT, "5", "arith")
    assert vectors[0][P] == vectors[0][R] == 0.0
    assert vectors[1][P] == vectors[1][R] == 0.0


def test_every_joint_credit_prices_the_joint_refine_above_persist():
    """A's values. Lenient: REFINE reaches the right vote (all three REFINE), PERSIST never (A's 3
    at .9 ties or beats any single 5, at .6); CONCEDE to B (its 3 at .8) never; CONCEDE to C's 4
    (.5) with B REFINEing (8) and C REFINEing (5 at .6): right. Marginal, B REFINEing with
    probability .5 and C surely: REFINE .5 (right only when B REFINEs too), PERSIST 0, CONCEDE to
    C .5 (4, 8, 5 right; 4, 3, 5 wrong). Shapley over REFINE coalitions (the others PERSIST, C
    at its 4): only all three right, so each agent's REFINE is worth 1/3; a lone CONCEDE
    (3 or 4 with 3, 4) changes no vote: 0."""
    outcomes = J.joint_outcomes(JOINT, "5", "arith")
    assert len(outcomes) == 4**3 and outcomes[R, R, R] == 1.0
    assert outcomes[R, P, R] == outcomes[P, R, R] == outcomes[R, R, P] == 0.0
    assert J.lenient_credit(outcomes, 0) == [0.0, 1.0, 0.0, 1.0]
    peers = [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    assert J.marginal_credit(outcomes, 0, peers) == [0.0, 0.5, 0.0, 0.5]
    assert J.shapley_credit(outcomes, 0) == pytest.approx([0.0, 1 / 3, 0.0, 0.0])
    # each REFINE pays its agent's own cost
    paid = move(
        [("3", 0.9), ("3", 0.8), ("4", 0.5)],
        [("7", 0.1), ("8", 0.1), ("5", 0.6)],
        [P, P, R],
        costs=(0.25, 0.5, 0.0),
    )
    shapley = J.credit_vectors(paid, "5", "arith", "shapley")
    assert [v[R] for v in shapley] == pytest.approx([1 / 3 - 0.25, 1 / 3 - 0.5, 1 / 3])
    marginal = J.credit_vectors(paid, "5", "arith", "marginal", peers)
    assert marginal[0] == pytest.approx([0.0, 0.5 - 0.25, 0.0, 0.5])


# A round with a CONCEDE. Before: A 5 (.3), right, B 2 (.9), C 3 (.5): the vote 2, wrong. Every
# REFINE sample repeats its agent's answer and confidence. Taken: B CONCEDEs to A (its first peer)
# and the others PERSIST: 5, 5, 3 -> 5, right.
CONCEDED = move(
    [("5", 0.3), ("2", 0.9), ("3", 0.5)], [("5", 0.3), ("2", 0.9), ("3", 0.5)], [P, concede(0), P]
)


def test_each_credit_on_a_round_with_a_concede():
    """B's values. Marginal, its peers as they played (A PERSIST, C PERSIST): PERSIST and REFINE
    5, 2, 3 -> 2 wrong; CONCEDE to A 5, 5, 3 right; CONCEDE to C 5, 3, 3 -> 3 wrong. Lenient:
    every B action has a joint action that is right (C CONCEDEing to A makes 5 a pair; with B's
    own 5 or 2 or 3 beside it, 5 wins). Shapley: no REFINE changes an answer, so REFINE's value is
    0; a lone CONCEDE to A turns the vote (+1), to C it does not (0). A's marginal: with B
    CONCEDEing to it, A's PERSIST and REFINE keep the right pair; A CONCEDEing to B's old 2 (.9)
    or to C's 3 loses it."""
    outcomes = J.joint_outcomes(CONCEDED, "5", "arith")
    played = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert J.marginal_credit(outcomes, 1, played) == [0.0, 0.0, 1.0, 0.0]
    assert J.lenient_credit(outcomes, 1) == [1.0, 1.0, 1.0, 1.0]
    assert J.shapley_credit(outcomes, 1) == [0.0, 0.0, 1.0, 0.0]
    assert J.marginal_credit(outcomes, 0, played) == [1.0, 1.0, 0.0, 0.0]
    # the per-agent counterfactual of the same round agrees with marginal where the peers' play
    # is certain, on who is right (its own bracket aside)
    vectors = D.counterfactual_rewards(CONCEDED, "5", "arith")
    assert vectors[1][concede(0)] > vectors[1][P] == vectors[1][R]


def test_joint_credit_checks_its_flag():
    with pytest.raises(D.UsageError, match="--credit"):
        J.check(J.Config(credit="oracle"), 1)


@pytest.mark.parametrize("credit", J.CREDITS)
def test_joint_credit_trains_through_the_door(credit, tmp_path, monkeypatch):
    """experiments/joint_credit.py's corpus in train_rl.train on the scripted arith engine: every
    state's vector is the agent's credit from its round's joint outcomes (recomputed here from the
    games), the behaviour policy's probabilities weighing the peers for the marginal."""
    import torch
    from scripted import ScriptedEngine, arith_script

    import common
    import data
    import train_rl

    monkeypatch.setattr(train_rl, "make_engine", lambda *a, **k: ScriptedEngine(arith_script()))
    torch.manual_seed(0)
    init = tmp_path / "init.safetensors"
    D.save_policy(D.MetaPolicy(agents=3), init)
    out = tmp_path / "run"
    out.mkdir()
    cfg = J.Config(agents=3, rounds=2, questions=6, val_n=0, epochs=1, batch_size=8, init=str(init))
    cfg.out_dir, cfg.credit, cfg.refine_cost, cfg.dtype = str(out), credit, 0.0, "float32"
    alone = common.Ranks(0, 1, "cpu")
    train_rl.train(cfg, alone, corpus=J.joint_credit_states)
    stored = torch.load(out / "corpus-0.pt", weights_only=False)
    assert stored["settings"]["corpus"] == "joint_credit_states"
    assert stored["settings"]["credit"] == credit
    behaviour = D.load_policy(init).eval()
    questions, _ = data.training_questions(cfg, 0)
    games = train_rl.corpus_games(
        ScriptedEngine(arith_script()), questions, behaviour, cfg, ranks=alone, desc=""
    )
    expected = {}
    for g in games:
        for m in g.moves:
            probs = J.behaviour_probs(behaviour, m)
            for i, vector in enumerate(
                J.credit_vectors(m, g.example.answer, "arith", credit, probs)
            ):
                expected[g.example.id, m.round, i] = vector
    assert {r["key"]: r["rewards"] for r in stored["rows"]} == expected
