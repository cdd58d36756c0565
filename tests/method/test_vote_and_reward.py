"""The vote and the shaped reward (docs/design.md §1, §4), worked by hand: who wins a vote, its
tie-breaks, the vote without an agent, and each agent's reward for its move,

    r_i = (1[i right after] - 1[i right before]) + (1[vote of all right] - 1[vote without i right]),

row by row, with the arithmetic of each expected value written beside it.
Run: python -m pytest -q tests/method/test_vote_and_reward.py"""

import pytest
from handmade import sol

import deliberate as D
from solutions import majority_vote, unanimous


# ---------------------------------------------------------------- the vote
def test_vote_majority():
    assert majority_vote([sol("1"), sol("2"), sol("2")]) == ("2", 1)


def test_vote_unparseable_never_wins():
    assert majority_vote([sol(None), sol(None), sol("3")])[0] == "3"
    assert majority_vote([sol(None), sol(None)]) == (None, None)


def test_vote_tie_goes_to_confidence_then_index():
    assert majority_vote([sol("1", 0.2), sol("2", 0.9), sol(None)])[0] == "2"
    assert majority_vote([sol("1", 0.5), sol("2", 0.5)])[0] == "1"
    # two-vs-two tie: the group with the single most confident member wins
    team = [sol("1", 0.6), sol("1", 0.6), sol("2", 0.1), sol("2", 0.95)]
    assert majority_vote(team) == ("2", 3)


def test_vote_without_agent():
    team = [sol("1"), sol("2"), sol("2")]
    assert majority_vote(team, exclude=1)[0] == "1"  # 1 vs 2 tie, lower index wins
    assert majority_vote(team, exclude=0)[0] == "2"


def test_unanimous_needs_one_parsed_answer_from_everyone():
    """freeze's stop: every agent gave the same answer, and it is an answer (three unparsed
    solutions agree on nothing)."""
    assert unanimous([sol("4"), sol("4"), sol("4")])
    assert not unanimous([sol("4"), sol("4"), sol("5")])
    assert not unanimous([sol("4"), sol("5"), sol("6")])
    assert not unanimous([sol(None), sol(None), sol(None)])
    assert not unanimous([sol("4"), sol(None), sol("4")])


# ---------------------------------------------------------------- the shaped reward
GOLD = "5"


@pytest.mark.parametrize(
    "before, after, agent, expected",
    [
        # i fixes its own answer and flips the vote: +1 own,
        # +1 consensus (without i: 5 vs 4 vs 4 -> wrong)
        (["3", "5", "4", "4"], ["5", "5", "4", "4"], 0, 1 + (1 - 0)),
        # i fixes its own answer, but the others alone
        # already vote right (5 vs 4 tie -> lower index): +1
        (["3", "5", "4"], ["5", "5", "4"], 0, 1 + (1 - 1)),
        # i already right and persists; the vote is right with or without i: 0
        (["5", "5", "4"], ["5", "5", "4"], 0, 0),
        # i breaks a right answer and flips the vote to
        # wrong: -1 own, and vote wrong vs without-i right
        (["5", "5", "4"], ["4", "5", "4"], 0, -1 + (0 - 1)),
        # consensus without i: the others alone tie 5 vs
        # 4 -> lower index (agent 1, "5") wins -> right
        (["5", "5", "4"], ["5", "5", "4"], 2, 0 + (1 - 1)),
        # i is wrong before and after; others right: 0 + (1 - 1)
        (["3", "5", "5"], ["3", "5", "5"], 0, 0),
        # an unparseable answer is wrong: going from None to right is +1
        ([None, "5", "4", "4"], ["5", "5", "4", "4"], 0, 1 + (1 - 0)),
    ],
)
def test_shaped_reward(before, after, agent, expected):
    r = D.shaped_reward([sol(a) for a in before], [sol(a) for a in after], agent, GOLD, "arith")
    assert r == expected


def test_reward_two_agents_consensus_without_i_is_the_peer():
    # N = 2: the vote without i is the peer's answer alone
    r = D.shaped_reward([sol("3"), sol("5")], [sol("5"), sol("5")], 0, GOLD, "arith")
    assert r == 1 + (1 - 1)
