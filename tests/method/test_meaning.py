"""What the game and its corpus mean, pinned on tiny hand-built games whose right answer is worked
out by hand here. Each expected value comes from a definition (docs/design.md §2-§6, the
docstrings), never from the function under test: the counterfactual reward vectors with the peers
held at what they did and each agent's own REFINE cost, the oracle label of the state an agent
decided in, which (round, agent) states the corpus holds, every state feature, the fixed policies'
reach, the policy's sampling distribution, and answer comparison edge cases.

No model: the engine is a lookup of each call's reply by its seed."""

import math

import pytest
import torch
from handmade import ByRound, Script, SeedEngine, replies

import common
import data
import deliberate as D
import eval as E
import sft
import train_rl
from common import call_seed
from deliberate import PERSIST, REFINE, concede
from solutions import GameConfig, parse_solution

GOLD = "5"


def sol(answer, text=None, tokens=10, logprobs=None):
    """A hand-built Solution: its vote confidence is 0.5 (no token log-probs), so vote ties go to
    the lower agent index."""
    text = text or (f"Answer: {answer}" if answer is not None else "no idea")
    return parse_solution(text, "arith", tokens, logprobs, vote="mean_prob")


def example(qid, answer=GOLD):
    return data.Example(question=f"Question {qid}?", answer=answer, task="arith", id=qid)


# --------------------------------------------------------------------------------------------------
# (a) the counterfactual reward vector (docs/design.md §4, §6), peers that actually moved
# --------------------------------------------------------------------------------------------------
# gold 5, three agents, every confidence 0.5 (vote ties -> lower agent index). Before the round:
# agent 0 says 3, agent 1 says 5 (right), agent 2 says 4. Their REFINE samples: 5, 7, 5. They play
# agent 0 PERSIST, agent 1 CONCEDE(1) (its peers are 0, 2: it adopts agent 2's 4), agent 2 REFINE.
# After: 3, 4, 5. Agent i's vector: K = 4 actions (PERSIST, REFINE, CONCEDE to peer 0, to peer 1),
# agent i's solution swapped, the two others held at what they did (after); r = (own after - own
# before) + (vote of all - vote without i), each 0/1 for wrong/right.
BEFORE, REFINED, AFTER = ["3", "5", "4"], ["5", "7", "5"], ["3", "4", "5"]
ACTIONS = [PERSIST, concede(1), REFINE]
COSTS = [0.1, 0.2, 0.3]  # each agent's own REFINE cost (different token counts)


# one process: rank 0 of 1, on the CPU
ALONE = common.Ranks(0, 1, "cpu")


def move_of(before, after, refined, costs=(0.0, 0.0, 0.0)):
    """A decision round's Move holding what counterfactual_rewards reads."""
    return D.Move(1, [], [], before, after, refined, list(costs))


def hand_vectors(costs):
    c0, c1, c2 = costs
    return [
        # agent 0 (wrong before; peers held at 4, 5):
        #   PERSIST  3,4,5: own 0-0; vote 3-way tie -> agent 0's 3 wrong; without 0: 4 vs 5 -> 4:  0
        #   REFINE   5,4,5: own 1-0; vote 5 right; without 0: 4 vs 5 -> 4 wrong: 1+1-0 = 2, - c0
        #   C(0)=1   adopts agent 1's old 5: as REFINE, free: 2
        #   C(1)=2   adopts agent 2's old 4: 4,4,5: own 0; vote 4 wrong; without 0: 4 wrong: 0
        [0, 2 - c0, 2, 0],
        # agent 1 (right before; peers held at 3, 5):
        #   PERSIST  3,5,5: own 1-1; vote 5 right; without 1: 3 vs 5 -> agent 0's 3 wrong: 0+1-0 = 1
        #   REFINE   3,7,5: own 0-1; 3-way tie -> 3 wrong; without 1: 3 wrong: -1, - c1
        #   C(0)=0   adopts 3: 3,3,5: own -1; vote 3 wrong; without: 3 wrong: -1
        #   C(1)=2   adopts agent 2's old 4: 3,4,5: own -1; tie -> 3 wrong: -1 (its actual reward)
        [1, -1 - c1, -1, -1],
        # agent 2 (wrong before; peers held at 3, 4):
        #   PERSIST  3,4,4: own 0; vote 4 wrong; without 2: 3 vs 4 -> 3 wrong: 0
        #   REFINE   3,4,5: own 1-0; tie -> 3 wrong; without 2: 3 wrong: 1 + 0 - 0 = 1, - c2
        #   C(0)=0   adopts 3: 3,4,3: own 0; vote 3 wrong: 0
        #   C(1)=1   adopts agent 1's old 5: 3,4,5: own +1, votes wrong: 1
        [0, 1 - c2, 0, 1],
    ]


def test_counterfactual_vectors_hold_peers_at_what_they_did():
    before, refined = [sol(a) for a in BEFORE], dict(enumerate(sol(a) for a in REFINED))
    after = [D.outcome(before, i, a, refined) for i, a in enumerate(ACTIONS)]
    assert [s.answer for s in after] == AFTER
    vectors = D.counterfactual_rewards(move_of(before, after, refined, COSTS), GOLD, "arith")
    assert vectors == [pytest.approx(v) for v in hand_vectors(COSTS)]
    # (peers held at `before` instead would give agent 0's PERSIST 3,5,4: without 0, 5 vs 4 -> 5
    # right: -1, not 0)


def test_counterfactual_vectors_through_play_and_the_corpus(capsys):
    """The same state played: each agent's REFINE call spends its own tokens (200, 400, 600) and
    pays refine_cost 0.5 per 1000 of them: 0.1, 0.2, 0.3, on its own REFINE entry only."""
    refine = {(1, i): (a, n) for i, (a, n) in enumerate(zip(REFINED, (200, 400, 600)))}
    engine = SeedEngine(replies("q/a", dict(enumerate(BEFORE)), refine))
    script = Script(lambda t, agent: ACTIONS[agent])
    cfg = train_rl.Config(agents=3, rounds=1, refine_cost=0.5)
    [game] = D.play(engine, [example("q/a")], script, cfg, refine_all=True, refine_cost=0.5)
    record, [move] = game.rounds[1], game.moves
    assert record["answers"] == AFTER and record["actions"] == ACTIONS
    expected = hand_vectors(COSTS)
    vectors = D.counterfactual_rewards(move, GOLD, "arith")
    assert vectors == [pytest.approx(v) for v in expected]
    # the reward of the action taken: 0, -1 and agent 2's REFINE 1 - 0.3
    assert record["rewards"] == pytest.approx([0, -1, 1 - 0.3])
    assert engine.calls == 3 + 3  # round 0, then one REFINE sample per agent
    engine = SeedEngine(replies("q/a", dict(enumerate(BEFORE)), refine))
    capsys.readouterr()
    rows = train_rl.scored_states(
        engine, [example("q/a")], script, cfg, ranks=ALONE, desc="corpus 3"
    )
    assert [r["rewards"] for r in rows] == [pytest.approx(v) for v in expected]
    # rank 0's progress bar, named by the caller
    assert "corpus 3:" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# (b) the oracle label of the state the agent decided in (docs/design.md §5); (c) which states
# --------------------------------------------------------------------------------------------------
def test_oracle_label_is_of_the_state_before_the_round():
    """Round 0: 3, 5, 4 (gold 5). Round 1: agents 0 and 1 REFINE (to 5, and to 5 again), agent 2
    PERSISTs: 3,5,4 -> 5,5,4. Round 2: all PERSIST (the game stops). A round-1 label reads round 0:
    agent 0 concedes to its peer 0 (agent 1, right) = 2; agent 1 is right: PERSIST; agent 2 concedes
    to its peer 1 (agent 1) = 3. Labels of the round's outcome (5,5,4) would be PERSIST, PERSIST, 2
    (agent 2's right peers 0 and 1 tie in confidence: the lower peer index)."""
    refine = {(1, 0): ("5", 9), (1, 1): ("5", 9)}
    engine = SeedEngine(replies("q/b", dict(enumerate(BEFORE)), refine))
    plan = {1: [REFINE, REFINE, PERSIST], 2: [PERSIST] * 3}
    script = Script(lambda t, agent: plan[t][agent])
    cfg = GameConfig(agents=3, rounds=2, seed=0)
    rows = sft.labelled_states(engine, [example("q/b")], script, cfg, ALONE)
    assert [r["key"] for r in rows] == [("q/b", t, i) for t in (1, 2) for i in range(3)]
    # round 2 reads round 1 (5,5,4): agents 0 and 1 right: PERSIST; agent 2 concedes to peer 0
    labels = [concede(0), PERSIST, concede(1)] + [PERSIST, PERSIST, concede(0)]
    assert [r["label"] for r in rows] == labels
    assert [r["action"] for r in rows] == plan[1] + plan[2]
    assert [r["agent"] for r in rows] == [0, 1, 2] * 2
    # the state features of each row are its own round's (d, in the game): round index (t-1)/R,
    # each agent's answer changed last round (agent 0: 3->5; agent 1 refined 5 to 5 and agent 2
    # kept 4: no change), its last action
    own = [dict(zip(D.OWN_FEATURES, r["own"])) for r in rows]
    assert [f["round"] for f in own] == [0, 0, 0, 0.5, 0.5, 0.5]
    assert [f["changed_last"] for f in own] == [0, 0, 0, 1, 0, 0]
    last = [
        [f[k] for k in ("last_none", "last_persist", "last_refine", "last_concede")] for f in own
    ]
    assert last == [[1, 0, 0, 0]] * 3 + [[0, 0, 1, 0]] * 2 + [[0, 1, 0, 0]]
    # in round 2, agent 2's peers are agents 0 (changed) and 1; agent 0's peers 1 and 2
    peers = [[dict(zip(D.PEER_FEATURES, p)) for p in r["peers"]] for r in rows]
    assert [p["peer_changed_last"] for p in peers[5]] == [1, 0]
    assert [p["peer_changed_last"] for p in peers[3]] == [0, 0]
    # round 2 (5,5,4): agent 0's peer 1 shares its answer, the vote; agent 1's peer 0 is the vote
    assert [p["same_as_me"] for p in peers[3]] == [1, 0] and own[3]["is_majority"] == 1
    assert [p["peer_is_majority"] for p in peers[4]] == [1, 0]


def test_a_rank_labels_and_scores_the_states_of_its_own_shard_only():
    """Rank 1 of 2 over three questions plays the second alone (examples[1::2]); without a process
    group nothing is gathered, so its rows are the second question's states only."""
    qids = ["q/0", "q/1", "q/2"]
    refine = {(1, i): (a, 9) for i, a in enumerate(REFINED)}
    engine = SeedEngine(
        {k: v for q in qids for k, v in replies(q, dict(enumerate(BEFORE)), refine).items()}
    )
    cfg = train_rl.Config(agents=3, rounds=1, seed=0)
    persist = Script(lambda t, agent: PERSIST)
    examples = [example(q) for q in qids]
    second = common.Ranks(1, 2, "cpu")
    labelled = sft.labelled_states(engine, examples, persist, cfg, second)
    scored = train_rl.scored_states(engine, examples, persist, cfg, ranks=second, desc="corpus")
    for rows in (labelled, scored):
        assert [r["key"] for r in rows] == [("q/1", 1, i) for i in range(3)]


def test_corpus_holds_every_agent_of_every_played_round_and_none_of_round_0():
    """Two games of R = 3 rounds: in q/right every agent is right, PERSISTs in round 1, and the game
    stops there; in q/wrong nobody is right, every agent REFINEs (still wrong) in all 3 rounds. The
    corpus: 3 states of q/right (round 1), 9 of q/wrong (rounds 1-3), none of round 0."""
    wrong = {(t, i): ("6", 9) for t in (1, 2, 3) for i in range(3)}
    engine = SeedEngine(
        {
            **replies("q/right", {0: "5", 1: "5", 2: "5"}),
            **replies("q/wrong", {0: 1, 1: 2, 2: 3}, wrong),
        }
    )
    # the oracle: PERSIST when right, else REFINE when no peer is right
    cfg = GameConfig(agents=3, rounds=3, seed=0)
    examples = [example("q/wrong"), example("q/right")]

    def nothing(game, move):
        return [{}] * 3

    rows = D.collect_states(engine, examples, D.Oracle(), cfg, nothing, ranks=ALONE)
    keys = [("q/right", 1, i) for i in range(3)]
    keys += [("q/wrong", t, i) for t in (1, 2, 3) for i in range(3)]
    assert [r["key"] for r in rows] == keys
    assert [r["action"] for r in rows] == [PERSIST] * 3 + [REFINE] * 9
    assert [dict(zip(D.OWN_FEATURES, r["own"]))["round"] for r in rows] == pytest.approx(
        [0] * 3 + [0, 0, 0, 1 / 3, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 2 / 3]
    )
    # a rank's shard: rank 1 of 2 plays examples[1::2] (q/right) alone
    shard = D.collect_states(
        engine, examples, D.Oracle(), cfg, nothing, ranks=common.Ranks(1, 2, "cpu")
    )
    assert [r["key"] for r in shard] == keys[:3]


def test_a_forced_action_replaces_the_policys_for_its_agent_in_its_round_only():
    """deliberate.play(forced=...): per example, None or (round, agent, action). Every agent
    PERSISTs by the policy (R = 2, round 0: 1, 2, 3); q/a forces agent 2 to REFINE (to 5) in round
    1, so the game goes on to round 2, where the policy decides again; q/b, not forced, stops after
    round 1. The examples and the forced list must match one to one."""
    refine = {(1, 2): ("5", 9), (2, 0): ("4", 9)}
    table = {
        **replies("q/a", {0: "1", 1: "2", 2: "3"}, refine),
        **replies("q/b", {0: "1", 1: "2", 2: "3"}),
    }
    policy = ByRound({1: [PERSIST] * 3, 2: [REFINE, PERSIST, PERSIST]}, rounds=2)
    cfg = GameConfig(agents=3, rounds=2, seed=0)
    forced = [(1, 2, REFINE), None]
    a, b = D.play(
        SeedEngine(table),
        [example("q/a"), example("q/b")],
        policy,
        cfg,
        greedy=False,
        forced=forced,
    )
    assert [r["actions"] for r in a.rounds[1:]] == [[PERSIST, PERSIST, REFINE], policy.plan[2]]
    assert [r["answers"] for r in a.rounds[1:]] == [["1", "2", "5"], ["4", "2", "5"]]
    assert [r["actions"] for r in b.rounds[1:]] == [[PERSIST] * 3]
    with pytest.raises(ValueError):
        D.play(
            SeedEngine(table),
            [example("q/a"), example("q/b")],
            policy,
            cfg,
            greedy=False,
            forced=[None],
        )


def test_best_action_kinds_by_hand():
    """3 agents, K = 4 (PERSIST, REFINE, CONCEDE to peer 1, to peer 2), rewards per state:
    PERSIST alone best; REFINE alone best (and paying 0.75 over PERSIST); the second CONCEDE alone
    best; PERSIST and CONCEDE tied at the top; all equal (flat)."""
    rewards = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 0.75, 0.0, 0.0],
            [0.0, 0.0, 0.5, 1.0],
            [1.0, 0.0, 1.0, 0.0],
            [0.5, 0.5, 0.5, 0.5],
        ]
    )
    stats = train_rl.best_action_kinds(rewards)
    assert stats["best_kind"] == {"persist": 0.2, "refine": 0.2, "concede": 0.2, "tied": 0.4}
    assert stats["refine_minus_persist"] == pytest.approx((-1 + 0.75 + 0 - 1 + 0) / 5)


# --------------------------------------------------------------------------------------------------
# (d) every feature of the observation (docs/design.md §2; deliberate.OWN_FEATURES, PEER_FEATURES)
# --------------------------------------------------------------------------------------------------
def test_every_observed_feature_by_hand():
    # agent 0: a full trailer, one operation shown ("3 * 4"; "8/10" is not one), its last "= 12" is
    # its answer, 64 tokens, token probabilities 0.5 and 0.2 (mean and tail: sqrt(0.1)); critic 0.9
    a0 = sol(
        "12",
        "3 * 4 = 12\nSteps: 2\nConfidence: 8/10\nAnswer: 12",
        64,
        [math.log(0.5), math.log(0.2)],
    )
    a0.critic = 0.9
    # agent 1: a bare answer, 512 tokens (length clipped to 1); agent 2: nothing parses, and it
    # says a value is not known. Agent 0's one step (3 * 4 = 12) checks; agent 1 writes none
    team = [a0, sol("12", tokens=512), sol(None, "Not known: Ann has some pens.", tokens=32)]
    changed, last = [True, False, True], [REFINE, concede(1), None]
    # agent 1's prompt says a value is unknown (a split question's view); the others' do not
    split_view = "Tom has 3 pens. Ann has some pens (you do not know how many). How many in all?"
    plain = "Tom has 3 pens. Ann has 4 pens. How many in all?"
    own, peers = D.observe(team, 1, 2, 4, view=split_view, changed=changed, last_actions=last)
    profile0 = [1, 1, 0.2, 0.8, 0.9, math.sqrt(0.1), 0.2, math.sqrt(0.1), 0.25, 0.1, 1]
    profile1 = [1, 0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 1, 0, 0]
    profile2 = [0, 0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 32 / 256, 0, 0]
    # agent 1 (12): peers 0 (12) and 2 (none): agreement 1/2; the vote is 12; round 2 of 4; its
    # answer did not change; last action CONCEDE; its view lacks a value, its solution says none
    # and writes no step
    assert dict(zip(D.OWN_FEATURES, own, strict=True)) == pytest.approx(
        dict(zip(D.OWN_FEATURES, profile1 + [0.5, 1, 0.5, 0, 0, 0, 0, 1, 1, 0, 0], strict=True))
    )
    # peer rows in agent order: agent 0 (same answer, the vote, changed, its step checks), agent 2
    # (none, changed, says a value is not known)
    assert [dict(zip(D.PEER_FEATURES, p, strict=True)) for p in peers] == [
        pytest.approx(dict(zip(D.PEER_FEATURES, profile0 + [1, 1, 1, 0, 1], strict=True))),
        pytest.approx(dict(zip(D.PEER_FEATURES, profile2 + [0, 0, 1, 1, 0], strict=True))),
    ]
    # agent 2 (unparseable) agrees with nobody and is not the vote; no previous action; round 0;
    # its own solution says a value is not known
    own, peers = D.observe(team, 2, 0, 3, view=plain, changed=changed, last_actions=last)
    assert dict(zip(D.OWN_FEATURES, own, strict=True)) == pytest.approx(
        dict(zip(D.OWN_FEATURES, profile2 + [0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0], strict=True))
    )
    assert [p[len(D.PROFILE_FEATURES) :] for p in peers] == [[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]]
    # agent 0 (12), last REFINE: peer 1 (agent 1) shares its answer, peer 2 (agent 2) does not
    own, peers = D.observe(team, 0, 1, 3, view=plain, changed=changed, last_actions=last)
    f = dict(zip(D.OWN_FEATURES, own))
    assert (f["peer_agreement"], f["is_majority"], f["changed_last"]) == (0.5, 1, 1)
    assert f["round"] == pytest.approx(1 / 3) and (f["last_refine"], f["last_concede"]) == (1, 0)
    assert (f["view_missing"], f["says_missing"], f["steps_check"]) == (0, 0, 1)
    assert [p[len(D.PROFILE_FEATURES) :] for p in peers] == [[1, 1, 0, 0, 0], [0, 0, 1, 1, 0]]


# --------------------------------------------------------------------------------------------------
# (e) the fixed policies reach every action; (f) the learned policy samples softmax(logits)
# --------------------------------------------------------------------------------------------------
def uniforms(n):
    """The game's uniforms (deliberate.decide): one per (question, agent, round)."""
    seeds = [call_seed(0, f"q/{k}", k % 3, 1, "act") for k in range(n)]
    return torch.tensor(seeds, dtype=torch.float64) / 2**60


def assert_frequencies(actions, probs):
    """Empirical frequencies within 4 binomial standard errors of `probs`."""
    n = len(actions)
    for k, p in enumerate(probs):
        assert abs(actions.count(k) / n - p) <= 4 * math.sqrt(p * (1 - p) / n), (k, p)


@pytest.mark.parametrize("agents", [2, 3, 4])
def test_random_policy_reaches_every_action_uniformly(agents):
    n, k = 3000, 2 + (agents - 1)  # K: PERSIST, REFINE and one CONCEDE per peer
    own, peers = torch.zeros(n, len(D.OWN_FEATURES)), torch.zeros(n, agents - 1, 3)
    actions = D.FixedPolicy("random").act(own, peers, None, uniforms(n), greedy=False)
    assert set(actions) == set(range(k))
    assert_frequencies(actions, [1 / k] * k)


# agent -> (the one right agent -> the oracle's action): CONCEDE(k) to the k-th peer in agent order
ORACLE_CONCEDES = {0: {1: 2, 2: 3}, 1: {0: 2, 2: 3}, 2: {0: 2, 1: 3}}


@pytest.mark.parametrize("agent", [0, 1, 2])
def test_oracle_concedes_to_the_right_peer_from_every_position(agent):
    for right, action in ORACLE_CONCEDES[agent].items():
        correct = [j == right for j in range(3)]
        assert D.oracle_action(agent, correct, [0.5] * 3) == action
        assert D.adopted_agent(agent, action, 3) == right
    # two right peers: the more confident one, whichever index it has
    peer_a, peer_b = sorted(ORACLE_CONCEDES[agent])
    for confident, action in ((peer_a, 2), (peer_b, 3)):
        confidence = [0.9 if j == confident else 0.4 for j in range(3)]
        correct = [j != agent for j in range(3)]
        assert D.oracle_action(agent, correct, confidence) == action
    assert D.oracle_action(agent, [j == agent for j in range(3)], [0.5] * 3) == PERSIST
    assert D.oracle_action(agent, [False] * 3, [0.5] * 3) == REFINE
    # a team of 4: agent 3's peers are 0, 1, 2; the last of them is CONCEDE(2) = 4
    assert D.oracle_action(3, [False, False, True, False], [0.5] * 4) == 4


LOGITS = [0.1, 0.2, 0.3, 0.4]  # softmax ~ [.214, .236, .261, .289]; as probabilities: .1 .. .4


def test_sampled_actions_follow_softmax_of_the_logits(monkeypatch):
    n = 4000
    softmax = [math.exp(x) / sum(math.exp(y) for y in LOGITS) for x in LOGITS]
    raw = LOGITS  # what sampling the logits themselves as a distribution would give
    policy = D.MetaPolicy(agents=3)
    logits = torch.tensor([LOGITS] * n)
    monkeypatch.setattr(policy, "forward", lambda own, peers, agent_index: logits)
    args = (torch.zeros(n, 1), torch.zeros(n, 2, 1), torch.zeros(n, dtype=torch.long))
    sampled = policy.act(*args, uniforms(n), greedy=False)
    assert_frequencies(sampled, softmax)
    assert abs(sampled.count(0) / n - raw[0]) > 0.05  # 0.214 against 0.1: far from raw logits
    assert policy.act(*args, uniforms(n), greedy=True) == [3] * n  # greedy: the argmax
    # sample_actions itself, on probabilities: the inverse CDF
    assert_frequencies(D.sample_actions(torch.tensor([softmax] * n), uniforms(n)), softmax)
    # each row by its own uniform: u < 0.1 -> 0, [0.1, 0.3) -> 1, [0.3, 0.6) -> 2, above -> 3
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]] * 6, dtype=torch.float64)
    u = torch.tensor([0.0, 0.0999, 0.1001, 0.2999, 0.5999, 0.9999], dtype=torch.float64)
    assert D.sample_actions(probs, u) == [0, 0, 1, 1, 2, 3]


# --------------------------------------------------------------------------------------------------
# (g) answer comparison edge cases (those tests/test_data.py does not already hold)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, task, expected",
    [
        ("Answer: 1,234.", "gsm8k", "1234"),  # thousands commas and a trailing period
        ("Answer: -1,250.75", "gsm8k", "-1250.75"),
        ("Answer: -3/4", "gsm8k", "-0.75"),  # a negative fraction, canonical decimal
        ("Answer: 4/6", "gsm8k", "2/3"),  # reduced; no finite decimal: stays a fraction
        ("Answer: .5", "gsm8k", "0.5"),
        ("Answer: 0.50.", "arith", "0.5"),
        ("The answer is -7.", "svamp", "-7"),
        ("we get 10-5", "mawps", "5"),  # a '-' glued to a number is no sign
        ("so x = 1e3", "gsm8k", "1000"),
        ("Answer: (d).", "mc", "D"),
        ("Answer: c.", "mc", "C"),
        ("The answer is \\boxed{-3}.", "math", "-3"),
        ("\\boxed{\\left( 1, 2 \\right)}", "math", "\\left( 1, 2 \\right)"),
        ("\\boxed{}", "math", None),  # an empty box is no answer
    ],
)
def test_extract_edge_cases(text, task, expected):
    assert data.extract_answer(text, task) == expected


@pytest.mark.parametrize(
    "pred, gold, task, expected",
    [
        ("-1/2", "-0.5", "gsm8k", True),
        ("1.5", "3/2", "gsm8k", True),
        ("2/3", "0.6666667", "gsm8k", True),  # within 1e-6 relative
        ("2/3", "0.67", "gsm8k", False),
        ("1,234.", "1234", "arith", True),
        ("-0", "0", "arith", True),
        ("twelve", "12", "arith", False),  # unparseable: wrong
        ("c.", "C", "mc", True),
        ("E", "E", "mc", False),  # no option beyond D
        ("-\\frac{1}{2}", "-0.5", "math", True),
        ("\\left( 1, 2 \\right)", "(1,2)", "math", True),
        ("0.5.", "\\frac{1}{2}", "math", True),  # a trailing period after a number
        ("", "", "math", False),  # empty is always wrong
    ],
)
def test_is_correct_edge_cases(pred, gold, task, expected):
    assert data.is_correct(pred, gold, task) is expected


# --------------------------------------------------------------------------------------------------
# the policies' mutants the tests above let survive (python -m experiments.mutation deliberate)
# --------------------------------------------------------------------------------------------------
def test_inverse_cdf_edges():
    # action k owns u in [cdf_(k-1), cdf_k): a u equal to a CDF value goes to the next action, so an
    # action of probability 0 is never drawn, even at u = 0; a u past the last CDF value (rounding:
    # the probabilities sum to 0.95 here) is the last action, never K
    probs = torch.tensor(
        [[0.0, 0.5, 0.5], [0.25, 0.25, 0.5], [0.5, 0.25, 0.2]], dtype=torch.float64
    )
    u = torch.tensor([0.0, 0.5, 0.97], dtype=torch.float64)
    assert D.sample_actions(probs, u) == [1, 2, 2]


def test_policy_defaults_copies_files_and_messages(tmp_path):
    # docs/design.md §3: hidden 64, 4 heads; 3 agents by default
    assert (D.PolicyNet().attend.embed_dim, D.PolicyNet().attend.num_heads) == (64, 4)
    config = {"agents": 3, "hidden": 64, "heads": 4, "separate": False, "critic": False}
    assert D.MetaPolicy().config == {**config, "features": "all"}
    assert D.MetaPolicy(hidden=16, heads=2).nets[0].attend.num_heads == 2
    # one shared network answers every agent's row alike
    torch.manual_seed(0)
    own = torch.rand(1, len(D.OWN_FEATURES)).expand(3, -1)
    peers = torch.rand(1, 2, len(D.PEER_FEATURES)).expand(3, -1, -1)
    shared, index = D.MetaPolicy(agents=3), torch.tensor([0, 1, 2])
    logits = shared(own, peers, index)
    n_own, n_peer = D.state_widths("all")  # the features it reads
    read = shared.nets[0](own[:, :n_own], peers[..., :n_peer])
    torch.testing.assert_close(logits, read.expand(3, -1))
    D.save_policy(shared, tmp_path / "p.safetensors")
    loaded = D.make_policy(str(tmp_path / "p.safetensors"))
    torch.testing.assert_close(loaded(own, peers, index), logits)
    assert D.make_policy("oracle").name == "oracle"
    with pytest.raises(common.FileRefused, match="cannot read the policy file"):
        D.load_policy(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="choose one of all, paper, confidence, text$"):
        D.MetaPolicy(features="nope")
    with pytest.raises(ValueError, match="unknown fixed policy 'nope'"):
        D.FixedPolicy("nope")
    fixed = r"fixed policy \(persist, random, refine, oracle\) nor a policy file$"
    with pytest.raises(common.UsageError, match=fixed):
        D.make_policy("no/such/policy.pt")


def test_is_majority_needs_a_parsed_answer_equal_to_the_vote():
    """A parsed answer that is not the vote is not the majority; with nothing parsed there is no
    vote, and nobody is its majority (None == None must not count)."""

    def is_majority(team):
        n = len(team)
        return [
            dict(
                zip(
                    D.OWN_FEATURES,
                    D.observe(
                        team, i, 0, 2, view="q", changed=[False] * n, last_actions=[None] * n
                    )[0],
                )
            )["is_majority"]
            for i in range(n)
        ]

    assert is_majority([sol("12"), sol("12"), sol("7")]) == [1, 1, 0]
    assert is_majority([sol(None), sol(None), sol(None)]) == [0, 0, 0]


def test_profile_caps_and_defaults():
    """Written-out operations count up to 10 (the feature caps at 1); a solution parsed without a
    token count has 0 completion tokens; the vote rule refused lists the known ones."""
    many = parse_solution("1 + 1 = 2\n" * 25 + "Answer: 2", "arith")
    assert many.n_operations == 25 and many.completion_tokens == 0
    assert dict(zip(D.PROFILE_FEATURES, D.profile(many)))["operations"] == 1.0
    with pytest.raises(ValueError, match=r"choose one of min_prob, mean_prob, tail_prob, index$"):
        parse_solution("Answer: 2", "arith", vote="loudest")


def test_describe_vote_names_the_tie_break():
    assert E.describe_vote("index") == "majority; ties to the lower agent index"
    assert E.describe_vote("mean_prob") == (
        "majority; ties to the higher mean_prob (generation confidence), then the lower agent index"
    )
