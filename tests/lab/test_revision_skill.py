"""The revision-skill measurement (experiments/revision_skill.py): each agent's state class at the
first decision, the peer it would CONCEDE to, and the per-class table of where REFINE, PERSIST and
CONCEDE end right."""

from types import SimpleNamespace

import pytest
import torch

import data
import deliberate as D
from experiments import revision_skill as R
from solutions import parse_solution

OWN_RIGHT, OWN_WRONG, ALL_WRONG, ALL_RIGHT = R.STATE_CLASSES


def test_each_agent_falls_in_the_class_its_teams_answers_say():
    assert [R.state_class([True, False, True], i) for i in range(3)] == [
        OWN_RIGHT,
        OWN_WRONG,
        OWN_RIGHT,
    ]
    assert [R.state_class([False, False, True], i) for i in range(3)] == [
        OWN_WRONG,
        OWN_WRONG,
        OWN_RIGHT,
    ]
    assert R.state_class([False] * 3, 1) == ALL_WRONG
    assert R.state_class([True] * 3, 2) == ALL_RIGHT
    assert R.state_class([True, True], 0) == ALL_RIGHT


def solution(answer, confidence=0.5):
    s = parse_solution(f"Answer: {answer}" if answer is not None else "no idea", "arith")
    s.confidence = confidence
    return s


def test_the_peer_to_concede_to_is_the_policys_likeliest_else_the_most_confident():
    before = [solution(1, 0.9), solution(2, 0.4), solution(3, 0.7)]
    assert R.concede_pick(D.FixedPolicy("persist"), None, 0, before) == 2
    assert R.concede_pick(D.FixedPolicy("persist"), None, 2, before) == 0
    tied = [solution(1, 0.5), solution(2, 0.5), solution(3, 0.5)]
    assert R.concede_pick(D.FixedPolicy("persist"), None, 1, tied) == 0
    policy = D.MetaPolicy(agents=3)
    seen = []

    def forward(own, peers, agent_index):
        seen.append((own.shape, peers.shape, agent_index.tolist()))
        # PERSIST likeliest of all: the pick reads the CONCEDE logits alone
        return torch.tensor([[9.0, 8.0, 1.0, 5.0]])

    policy.forward = forward
    observation = D.observe(before, 1, 0, 3, view="q", changed=[False] * 3, last_actions=[None] * 3)
    # agent 1's peers are agents 0 and 2: its second CONCEDE is to agent 2
    assert R.concede_pick(policy, observation, 1, before) == 2
    assert R.concede_pick(policy, observation, 0, before) == 2
    assert R.concede_pick(policy, observation, 2, before) == 1
    n_own, n_peer = len(D.OWN_FEATURES), len(D.PEER_FEATURES)
    assert seen[0] == ((1, n_own), (1, 2, n_peer), [1])


def row(id, cls, refine, persist, concede, tokens=100):
    return dict(id=id, refine=refine, persist=persist, concede=concede, refine_tokens=tokens) | {
        "class": cls
    }


def test_the_table_pairs_each_outcome_on_the_same_states():
    rows = [
        row("a", OWN_WRONG, True, False, True, 90),
        row("b", OWN_WRONG, False, False, True, 110),
        row("c", OWN_WRONG, True, False, False, 100),
        row("d", OWN_RIGHT, False, True, True, 120),
    ]
    table = R.skill_table(rows)
    wrong = table[OWN_WRONG]
    assert wrong["states"] == 3 and wrong["refine_tokens"] == 100
    assert wrong["refine_right"] == pytest.approx(2 / 3)
    assert wrong["persist_right"] == 0 and wrong["concede_right"] == pytest.approx(2 / 3)
    assert wrong["refine_vs_persist"]["diff"] == pytest.approx(2 / 3)
    assert wrong["refine_vs_persist"]["disagree"] == 2
    assert wrong["refine_vs_concede"]["diff"] == 0 and wrong["refine_vs_concede"]["disagree"] == 2
    right = table[OWN_RIGHT]
    assert right["states"] == 1 and right["refine_vs_persist"]["diff"] == -1.0
    assert table[ALL_WRONG] == {"states": 0} and table[ALL_RIGHT] == {"states": 0}
    every = table["all states"]
    assert every["states"] == 4 and every["refine_right"] == 0.5
    assert every["refine_tokens"] == 105 and every["refine_vs_concede"]["diff"] == -0.25


def test_split_questions_and_shared_ones_apart():
    rows = [
        {**row("a", OWN_WRONG, True, False, True, 90), "dealt": True},
        {**row("b", OWN_WRONG, False, False, True, 110), "dealt": False},
        {**row("c", OWN_WRONG, True, False, False, 100), "dealt": True},
    ]
    parts = R.split_and_shared(rows)["parts"]
    assert parts["split"] == R.skill_table([rows[0], rows[2]])
    assert parts["split"][OWN_WRONG]["refine_right"] == 1.0
    assert parts["shared"][OWN_WRONG]["refine_right"] == 0.0
    assert R.split_and_shared([row("a", OWN_WRONG, True, False, True, 90)]) == {}


def test_first_decisions_score_each_agents_refine_sample_and_moves():
    ex = data.Example(question="q", answer="5", task="arith", id="t/0")
    before = [solution(5, 0.6), solution(7, 0.9), solution(None, 0.1)]
    move = D.Move(
        round=1,
        observations=[None] * 3,
        actions=[D.PERSIST, D.REFINE, D.concede(0)],
        before=before,
        after=before,
        refined={0: solution(7), 1: solution(5), 2: solution(None)},
        costs=[120.0, 131.0, 99.0],
    )
    later = D.Move(
        2, [None] * 3, [D.REFINE] * 3, before, before, {i: solution(5) for i in range(3)}, [1.0] * 3
    )
    game = SimpleNamespace(example=ex, moves=[move, later])
    rows = R.first_decisions([game], D.FixedPolicy("persist"))
    assert rows == [
        row("t/0:0", OWN_RIGHT, False, True, False, 120) | {"action": "persist"},
        row("t/0:1", OWN_WRONG, True, False, True, 131) | {"action": "refine"},
        # agent 2 concedes to the most confident peer, agent 1: wrong
        row("t/0:2", OWN_WRONG, False, False, False, 99) | {"action": "concede"},
    ]


def test_first_decisions_concede_to_the_peer_the_learned_policy_picks():
    """With a learned policy, CONCEDE goes where its likeliest CONCEDE points, read from each
    agent's own observation: here each agent's first peer, the least confident one."""
    ex = data.Example(question="q", answer="5", task="arith", id="t/1")
    before = [solution(5, 0.1), solution(7, 0.2), solution(5, 0.9)]
    observations = [
        D.observe(before, i, 0, 3, view="q", changed=[False] * 3, last_actions=[None] * 3)
        for i in range(3)
    ]
    move = D.Move(
        1, observations, [D.PERSIST] * 3, before, before, dict(enumerate(before)), [1.0] * 3
    )
    policy = D.MetaPolicy(agents=3)
    read = []

    def forward(own, peers, agent_index):
        read.append((own[0].tolist(), agent_index.tolist()))
        return torch.tensor([[0.0, 0.0, 2.0, 1.0]])

    policy.forward = forward
    rows = R.first_decisions([SimpleNamespace(example=ex, moves=[move])], policy)
    # agent 0 -> agent 1 (wrong), agent 1 -> agent 0 (right), agent 2 -> agent 0 (right)
    assert [r["concede"] for r in rows] == [False, True, True]
    assert read == [(pytest.approx(observations[i][0]), [i]) for i in range(3)]


def test_steps_right_checks_each_step_on_a_line_of_its_own():
    assert R.steps_right("Tom has 2.\n2 + 3 = 5\n5 - 1 = 4\nAnswer: 4")
    assert not R.steps_right("27 + 24 = 41\n41 + 4 = 45")
    assert not R.steps_right("6 * 7 = 41") and R.steps_right("12 - -3 = 15")
    # a chain on one line is not a step as the worked solutions write one; no step: nothing wrong
    assert R.steps_right("3 + 4 + 5 = 13") and R.steps_right("I do not know.")


def test_pooling_tells_apart_what_a_refine_on_a_split_question_missed():
    """On a dealt question: whether the peers' first solutions state the values the agent lacks,
    whether its REFINE states every value (as the question words it), and whether its steps are
    right; a REFINE that ends wrong with every value and step right took a wrong expression."""
    from data import split as split_task

    ex = next(e for e in split_task.deal(split_task.load("test"), 3, 2, 1.0) if e.meta["dealt"])
    facts = [known for known, _ in ex.meta["facts"]]
    lacked = [k for k in range(3) if k not in ex.meta["views"][0]][0]
    told = [k for k in range(3) if k in ex.meta["views"][1]]

    def sol(text):
        return parse_solution(text + "\nAnswer: 1", "split")

    before = [sol(facts[0]), sol(" ".join(facts[k] for k in told)), sol("")]
    whole = " ".join(facts)

    def move(refined):
        return D.Move(1, [None] * 3, [D.REFINE] * 3, before, before, {0: sol(refined)}, [1.0] * 3)

    gave = lacked in told or any(facts[lacked] in b.text for b in before[1:])
    got = R.pooling(ex, 0, move(whole + "\n2 + 3 = 5"))
    assert got == {
        "peers_state_lacked": gave,
        "refine_states_all": True,
        "refine_steps_right": True,
    }
    got = R.pooling(ex, 0, move(facts[0] + "\n2 + 3 = 6"))
    assert not got["refine_states_all"] and not got["refine_steps_right"]
    # the peer holding the lacked value states it: given; no peer states anything: not given
    before[2] = sol(facts[lacked])
    assert R.pooling(ex, 0, move(whole))["peers_state_lacked"]
    before[1] = before[2] = sol("I hold nothing I can say.")
    assert not R.pooling(ex, 0, move(whole))["peers_state_lacked"]
    # each row of a dealt question carries it
    played = move(whole)
    played.refined = {i: sol(whole) for i in range(3)}
    rows = R.first_decisions(
        [SimpleNamespace(example=ex, moves=[played])], D.FixedPolicy("persist")
    )
    assert [r["dealt"] for r in rows] == [True] * 3
    assert [{k: r[k] for k in got} for r in rows] == [R.pooling(ex, i, played) for i in range(3)]
