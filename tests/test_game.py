"""The deliberation game: parsing and state features, the prompts, the policies, and play() driven
by a scripted engine (exact, fast) and by a tiny random model (the real engine path). The vote and
the shaped reward, worked by hand: tests/method/test_vote_and_reward.py."""

import dataclasses
import math

import pytest
import torch
from handmade import sol
from scripted import ScriptedEngine, played

import data
import deliberate as D
import eval as E
from common import UsageError, call_seed
from deliberate import PERSIST, REFINE
from llm.engine import Engine
from solutions import (
    GameConfig,
    generation_confidence,
    leader_prompt,
    parse_solution,
    refine_prompt,
    says_missing,
    solve_prompt,
    steps_check,
)


# ---------------------------------------------------------------- parsing and state features
def test_parse_full_trailer():
    s = parse_solution(
        "3 * 4 = 12. 12 - 2 = 10.\nSteps: 2\nConfidence: 9/10\nAnswer: 10", "arith", 30
    )
    assert (s.answer, s.steps, s.self_confidence, s.trailer_ok) == ("10", 2, 0.9, True)
    assert s.n_operations == 2 and s.consistent and s.completion_tokens == 30


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Steps: many\nConfidence: high\nAnswer:",
        "Confidence: 11/10 Steps: -3",
        "Answer: \n\n",
        "Steps: 3\nConfidence: 8/10\nAnswer: 7" * 2000,
        "\x00\x01 garbage Steps Confidence Answer ::::",
        "Steps: 99999999999999999999\nConfidence: 7/10\nAnswer: 5",
    ],
)
def test_parse_garbled_never_crashes(text):
    s = parse_solution(text, "arith")
    features = D.profile(s)
    assert len(features) == len(D.PROFILE_FEATURES) and all(0.0 <= f <= 1.0 for f in features)


def test_parse_garbled_defaults():
    s = parse_solution("I think it is 12 apples", "arith")
    assert s.answer == "12" and not s.trailer_ok and s.steps is None and s.self_confidence is None
    # unknown
    assert s.confidence == 0.5 and s.signals == {
        "mean_prob": 0.5,
        "min_prob": 0.5,
        "tail_prob": 0.5,
    }
    missing = parse_solution("Steps: 2\nConfidence: 8/10\nAnswer:", "arith")
    # a trailer without a value is no answer
    assert missing.answer is None and not missing.trailer_ok


def test_inconsistent_answer_flag():
    assert not parse_solution("5 + 5 = 10\nAnswer: 11", "arith").consistent
    assert parse_solution("5 + 5 = 10\nAnswer: 10", "arith").consistent


def test_observe_relations_not_values():
    team = [sol("4"), sol("4"), sol("7")]
    own, peers = D.observe(
        team, 0, 1, 3, view="q", changed=[False, True, False], last_actions=[REFINE, None, None]
    )
    f = dict(zip(D.OWN_FEATURES, own))
    assert len(own) == len(D.OWN_FEATURES) and all(len(p) == len(D.PEER_FEATURES) for p in peers)
    assert (
        f["peer_agreement"] == 0.5
        and f["is_majority"] == 1.0
        and f["round"] == pytest.approx(1 / 3)
    )
    assert f["last_refine"] == 1.0 and f["last_none"] == 0.0
    p1, p2 = (dict(zip(D.PEER_FEATURES, p)) for p in peers)
    assert (
        p1["same_as_me"],
        p1["peer_changed_last"],
        p2["same_as_me"],
        p2["peer_is_majority"],
    ) == (1, 1, 0, 0)
    # the answer values themselves never appear: relabelling every answer gives the same observation
    relabelled = [sol("40"), sol("40"), sol("70")]
    assert D.observe(
        relabelled,
        0,
        1,
        3,
        view="q",
        changed=[False, True, False],
        last_actions=[REFINE, None, None],
    ) == (own, peers)


def test_unparseable_peers_never_agree():
    team = [sol(None), sol(None)]
    own, peers = D.observe(
        team, 0, 0, 3, view="q", changed=[False, False], last_actions=[None, None]
    )
    assert dict(zip(D.OWN_FEATURES, own))["peer_agreement"] == 0.0
    assert dict(zip(D.PEER_FEATURES, peers[0]))["same_as_me"] == 0.0


# ---------------------------------------------------------------- the prompts
def test_the_prompts_word_for_word():
    """Every prompt exactly: the generation cache's keys and the adapters trained on the solve and
    refine prompts depend on each character. A solution is shown by its last 300 characters
    (refine and leader), a peer by its answer, an unparseable one as 'no answer'."""
    ex = data.Example(question="Tom has 7 pens and buys 5 more. How many pens?", answer="12",
                      task="arith", id="t/1")  # fmt: skip
    long = "x" * 50 + "y" * 291 + "Answer: 1"
    sols = [sol(None, text=long), sol(None, text="no idea"), sol(13, text="7 + 5 = 12\nAnswer: 13")]
    question = "Tom has 7 pens and buys 5 more. How many pens?"
    plain = "End with 'Answer: <a number>'."
    trailer = (
        "Show short steps, then end with three lines:\nSteps: <number of steps>\n"
        "Confidence: <0-10>/10\nAnswer: <a number>"
    )
    assert solve_prompt(ex) == f"{question}\n{plain}"
    assert solve_prompt(ex, True) == (
        f"Solve the problem. {trailer}\n\nExample:\nProblem: Ann has 3 bags with 4 apples in "
        "each bag. She eats 2 apples. How many apples are left?\n3 * 4 = 12. 12 - 2 = 10.\n"
        f"Steps: 2\nConfidence: 9/10\nAnswer: 10\n\nProblem: {question}\n"
    )
    tail = "y" * 291 + "Answer: 1"
    assert refine_prompt(ex, sols, 0) == (
        f"{question}\n\nYour previous solution:\n{tail}\n\nOther agents' answers: Agent 2: no "
        f"answer, Agent 3: 13.\nCheck the solutions and solve the problem again. {plain}"
    )
    assert refine_prompt(ex, sols, 2, True) == (
        f"{question}\n\nYour previous solution:\n7 + 5 = 12\nAnswer: 13\n\nOther agents' "
        "answers: Agent 1: 1, Agent 2: no answer.\nCheck the solutions and solve the problem "
        f"again. {trailer}"
    )
    assert leader_prompt(ex, sols) == (
        f"{question}\n\nSolutions from 3 agents:\n\nAgent 1:\n{tail}\n\nAgent 2:\nno idea\n\n"
        "Agent 3:\n7 + 5 = 12\nAnswer: 13\n\nCheck these solutions and solve the problem. "
        f"{plain}"
    )
    assert leader_prompt(ex, sols[1:], True).endswith(
        f"Solutions from 2 agents:\n\nAgent 1:\nno idea\n\nAgent 2:\n7 + 5 = 12\nAnswer: 13"
        f"\n\nCheck these solutions and solve the problem. {trailer}"
    )
    # whole solutions: the own one and every peer's, untruncated
    assert refine_prompt(ex, sols, 2, whole=True) == (
        f"{question}\n\nYour previous solution:\n7 + 5 = 12\nAnswer: 13\n\nOther agents' "
        f"solutions:\n\nAgent 1:\n{long}\n\nAgent 2:\nno idea\n\nCheck the solutions and "
        f"solve the problem again. {plain}"
    )
    assert refine_prompt(ex, sols, 0, whole=True).startswith(
        f"{question}\n\nYour previous solution:\n{long}\n\nOther agents' solutions:\n\nAgent 2:"
    )
    assert leader_prompt(ex, sols, whole=True).startswith(
        f"{question}\n\nSolutions from 3 agents:\n\nAgent 1:\n{long}\n\nAgent 2:\nno idea\n\n"
    )
    assert D.critic_prompt(ex, sols[2]) == (
        f"Problem: {question}\n\nProposed solution:\n7 + 5 = 12\nAnswer: 13\n\n"
        "Is the proposed solution correct? Reply with one word: Correct or Incorrect."
    )


def test_a_policy_with_a_copy_per_agent_plays_only_its_own_team_size():
    """check_team: a shared policy plays a team of any size; one with a copy per agent
    (--separate) refuses another size, naming the file and the flag that fixes it."""
    from types import SimpleNamespace

    shared = SimpleNamespace(config={"agents": 3, "separate": False})
    separate = SimpleNamespace(config={"agents": 3, "separate": True})
    for agents in (2, 3, 5):
        D.check_team(shared, agents, "p.pt")
    D.check_team(separate, 3, "p.pt")
    with pytest.raises(UsageError) as refused:
        D.check_team(separate, 2, "p.pt")
    assert str(refused.value) == (
        "p.pt: a policy with one copy per agent for 3 agents cannot play 2 agents: pass "
        "--agents 3, or train a shared policy"
    )


# ---------------------------------------------------------------- policies
def test_oracle_action():
    # agent 0 of a team of 3: its peers are agents 1 and 2, CONCEDE(0) = 2, CONCEDE(1) = 3
    assert D.oracle_action(0, [True, False, True], [0.5, 0.1, 0.9]) == PERSIST
    # the most confident right peer
    assert D.oracle_action(0, [False, True, True], [0.5, 0.3, 0.9]) == 2 + 1
    assert D.oracle_action(0, [False, True, False], [0.5, 0.3, 0.9]) == 2 + 0
    assert D.oracle_action(0, [False, False, False], [0.5, 0.3, 0.9]) == REFINE
    # agent 2: its peers are agents 0 and 1; a tie in confidence goes to the lower peer index
    assert D.oracle_action(2, [True, True, False], [0.7, 0.7, 0.9]) == 2 + 0
    assert D.oracle_action(2, [False, True, False], [0.9, 0.2, 0.1]) == 2 + 1


@pytest.mark.parametrize("agents", [2, 3, 5])
def test_policy_net_any_team_size_and_permutation_equivariant(agents):
    torch.manual_seed(0)
    policy = D.MetaPolicy(agents=agents)
    own = torch.rand(4, len(D.OWN_FEATURES))
    peers = torch.rand(4, agents - 1, len(D.PEER_FEATURES))
    logits = policy(own, peers, torch.zeros(4, dtype=torch.long))
    assert logits.shape == (4, 2 + agents - 1)
    perm = torch.randperm(agents - 1)
    permuted = policy(own, peers[:, perm], torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(permuted[:, :2], logits[:, :2])
    torch.testing.assert_close(permuted[:, 2:], logits[:, 2:][:, perm])


def test_policy_size_and_separate_copies(tmp_path):
    shared, separate = D.MetaPolicy(agents=3), D.MetaPolicy(agents=3, separate=True)
    n_params = sum(p.numel() for p in shared.parameters())
    assert 10_000 <= n_params <= 100_000  # "tens of thousands of parameters"
    assert sum(p.numel() for p in separate.parameters()) == 3 * n_params
    own, peers = torch.rand(6, len(D.OWN_FEATURES)), torch.rand(6, 2, len(D.PEER_FEATURES))
    index = torch.tensor([0, 1, 2, 0, 1, 2])
    logits = separate(own, peers, index)
    n_own, n_peer = D.state_widths("all")  # the features it reads
    agent1 = separate.nets[1](own[1:2, :n_own], peers[1:2, :, :n_peer])
    torch.testing.assert_close(logits[1], agent1[0])
    D.save_policy(separate, tmp_path / "p.safetensors")
    torch.testing.assert_close(D.load_policy(tmp_path / "p.safetensors")(own, peers, index), logits)


def test_policy_feature_sets_read_only_their_features(tmp_path):
    """features=paper never sees the generation confidence, features=confidence never the
    self-report; a checkpoint keeps its set."""
    torch.manual_seed(0)
    own, peers = torch.rand(4, len(D.OWN_FEATURES)), torch.rand(4, 2, len(D.PEER_FEATURES))
    index = torch.zeros(4, dtype=torch.long)
    for features, hidden_name, seen_name in (
        ("paper", "mean_prob", "self_confidence"),
        ("confidence", "self_confidence", "mean_prob"),
    ):
        policy = D.MetaPolicy(agents=3, features=features)
        for name, changes in ((hidden_name, False), (seen_name, True)):
            own2, peers2 = own.clone(), peers.clone()
            own2[:, D.OWN_FEATURES.index(name)] += 0.5
            peers2[:, :, D.PEER_FEATURES.index(name)] += 0.5
            moved = not torch.allclose(policy(own2, peers2, index), policy(own, peers, index))
            assert moved == changes, (features, name)
        D.save_policy(policy, tmp_path / "p.safetensors")
        assert D.load_policy(tmp_path / "p.safetensors").config["features"] == features
    with pytest.raises(ValueError, match="unknown feature set"):
        D.MetaPolicy(features="nope")


def test_only_a_text_policy_reads_what_the_texts_tell(tmp_path):
    """The text features, appended last, move the logits of a features=text policy and of no
    other; the others' first layer ends before them (state_widths), so a policy file of that older
    width loads and plays the full observation as it was trained."""
    torch.manual_seed(0)
    own, peers = torch.rand(4, len(D.OWN_FEATURES)), torch.rand(4, 2, len(D.PEER_FEATURES))
    index = torch.zeros(4, dtype=torch.long)
    assert D.state_widths("text") == (len(D.OWN_FEATURES), len(D.PEER_FEATURES))
    for features in ("all", "paper", "confidence"):
        assert D.state_widths(features) == (len(D.OWN_FEATURES) - 3, len(D.PEER_FEATURES) - 2)
    text = [("view_missing", None), ("says_missing", None), ("steps_check", None)]
    text += [(None, "peer_says_missing"), (None, "peer_steps_check")]
    for features in ("all", "paper", "text"):
        policy = D.MetaPolicy(agents=3, features=features)
        for own_name, peer_name in text:
            own2, peers2 = own.clone(), peers.clone()
            if own_name:
                own2[:, D.OWN_FEATURES.index(own_name)] += 1
            else:
                peers2[:, :, D.PEER_FEATURES.index(peer_name)] += 1
            moved = not torch.allclose(policy(own2, peers2, index), policy(own, peers, index))
            assert moved == (features == "text"), (features, own_name, peer_name)
    older = D.MetaPolicy(agents=3)
    n_own, n_peer = D.state_widths("all")
    assert older.nets[0].embed_own[0].in_features == n_own
    assert older.nets[0].embed_peer[0].in_features == n_peer
    D.save_policy(older, tmp_path / "older.safetensors")
    loaded = D.load_policy(tmp_path / "older.safetensors")
    torch.testing.assert_close(loaded(own, peers, index), older(own, peers, index))
    torch.testing.assert_close(
        loaded(own, peers, index), older(own[:, :n_own], peers[..., :n_peer], index)
    )
    wide = D.MetaPolicy(agents=3, features="text")
    D.save_policy(wide, tmp_path / "text.safetensors")
    torch.testing.assert_close(
        D.load_policy(tmp_path / "text.safetensors")(own, peers, index), wide(own, peers, index)
    )


def test_says_missing_reads_a_split_view_and_a_solution_that_lacks_a_value():
    """Every agent's view of a split question says a value is unknown, no view of a shared one
    does; so does the split team's way of writing that it lacks one."""
    examples = data.load_task("split", split="test", n=40, agents=3, held=2, share=0.5)
    dealt = [ex.meta["dealt"] for ex in examples]
    assert any(dealt) and not all(dealt)
    for ex in examples:
        assert [says_missing(ex.render(i)) for i in range(3)] == [ex.meta["dealt"]] * 3
    assert says_missing("Not known: A box holds some books. I count it as 0.\nAnswer: -3")
    assert not says_missing("A box holds 21 cards.\n21 - 6 = 15\n15 - 3 = 12\nAnswer: 12")


def test_steps_check_recomputes_every_step_on_a_line_of_its_own():
    right = "A box holds 21 cards.\n21 - 6 = 15\n15 - 3 = 12\nAnswer: 12"
    assert steps_check(right)
    assert not steps_check(right.replace("15 - 3 = 12", "15 - 3 = 13"))  # a slip in one of two
    assert not steps_check("Answer: 12")  # no step written: nothing to check
    assert not steps_check("It is 21 - 6 = 15 cards.")  # not on a line of its own
    # each operation: +, -, *, × and a negative operand
    assert steps_check("2 + 3 = 5\n7 - 9 = -2\n4 * 3 = 12\n2 × 6 = 12\n-3 + 5 = 2")
    for wrong in ("2 + 3 = 6", "7 - 9 = 2", "4 * 3 = 7", "2 × 6 = 8", "-3 + 5 = 8"):
        assert not steps_check(wrong), wrong


def test_make_policy_errors():
    with pytest.raises(UsageError, match="neither a fixed policy"):
        D.make_policy("no/such/policy.pt")


# ---------------------------------------------------------------- play() with a scripted engine
def make_examples(n=2):
    return [
        data.Example(question=f"What is {k} + 5?", answer=str(k + 5), task="arith", id=f"t/{k}")
        for k in range(n)
    ]


def solve_script(cfg, answers):
    """round-0 answers per (question id, agent) through the call seed; refine always answers
    gold."""
    seeds = {call_seed(cfg.seed, ex_id, i, 0, "solve"): a for (ex_id, i), a in answers.items()}

    def script(prompt, seed):
        if seed in seeds:
            return f"Steps: 1\nConfidence: 5/10\nAnswer: {seeds[seed]}"
        gold = int(prompt.split("What is ")[1].split(" ")[0]) + 5
        return f"Steps: 1\nConfidence: 9/10\nAnswer: {gold}"

    return script


def test_play_oracle_concedes_and_stops_early():
    cfg = GameConfig(agents=3, rounds=3)
    examples = make_examples(2)
    # question 0: agent 2 alone is right -> agents 0 and 1 concede to it, then everyone persists
    # question 1: nobody right -> everyone refines (refine answers gold), then everyone persists
    answers = {
        ("t/0", 0): 1,
        ("t/0", 1): 2,
        ("t/0", 2): 5,
        ("t/1", 0): 1,
        ("t/1", 1): 2,
        ("t/1", 2): 3,
    }
    engine = ScriptedEngine(solve_script(cfg, answers))
    games = D.play(engine, examples, D.Oracle(), cfg)
    out = [game.transcript() for game in games]
    r0 = out[0]["rounds"]
    assert r0[0]["answers"] == ["1", "2", "5"] and r0[0]["vote"] == "1" and not r0[0]["correct"]
    # agent 0's peers are (1, 2): agent 2 is peer 1
    assert r0[1]["actions"] == [2 + 1, 2 + 1, PERSIST]
    assert r0[1]["answers"] == ["5", "5", "5"] and r0[1]["correct"]
    # agents 0 and 1 fix themselves but the two others
    # alone already vote right; agent 2 changes nothing
    assert r0[1]["rewards"] == [1 + 1 - 1, 1 + 1 - 1, 0 + 1 - 1]
    assert r0[2]["stopped"] and len(r0) == 3 and out[0]["correct"] and out[0]["pred"] == "5"
    assert out[1]["rounds"][1]["actions"] == [REFINE] * 3 and out[1]["correct"]
    observations = games[0].moves[0].observations
    assert len(observations) == 3 and len(observations[0][1]) == 2
    # calls: 6 solves + 3 refines; the oracle does not read the state, so no critic pass
    assert engine.calls == 9 and engine.critic_calls == 0
    assert out[0]["calls"] == 3 and out[1]["calls"] == 6


def test_play_debate_refines_every_round_and_counts_tokens():
    cfg = GameConfig(agents=2, rounds=2)
    engine = ScriptedEngine(solve_script(cfg, {}))
    out = played(engine, make_examples(1), D.FixedPolicy("refine"), cfg)
    assert [r.get("actions") for r in out[0]["rounds"]] == [None, [REFINE] * 2, [REFINE] * 2]
    assert out[0]["calls"] == 2 * 3 and engine.calls == 6
    assert out[0]["tokens"] > 0


def test_play_learned_policy_pays_for_the_critic_only_when_trained_with_it():
    cfg = GameConfig(agents=3, rounds=1)
    engine = ScriptedEngine(solve_script(cfg, {}))
    out = played(engine, make_examples(2), D.MetaPolicy(agents=3, critic=True), cfg)
    assert engine.critic_calls >= 6
    assert all(c == pytest.approx(0.7) for c in out[0]["rounds"][0]["critic"])
    without = ScriptedEngine(solve_script(cfg, {}))
    out = played(without, make_examples(2), D.MetaPolicy(agents=3), cfg)
    assert without.critic_calls == 0 and out[0]["rounds"][0]["critic"] == [None] * 3
    assert out[0]["calls"] == 3 + sum(a == REFINE for a in out[0]["rounds"][1]["actions"])


def test_play_keeps_what_a_learned_policy_saw_and_gave_each_action():
    """A learned policy's round records keep, per agent, its action probabilities (the greedy
    action the most likely) and the EXPLAINED_FEATURES of its feature set; a fixed policy's none."""
    cfg = GameConfig(agents=3, rounds=1)
    torch.manual_seed(0)
    [game] = played(ScriptedEngine(solve_script(cfg, {})), make_examples(1), D.MetaPolicy(), cfg)
    record = game["rounds"][1]
    for action, why in zip(record["actions"], record["policy"]):
        assert len(why["probs"]) == 4 and sum(why["probs"]) == pytest.approx(1, abs=1e-3)
        assert max(why["probs"]) == why["probs"][action]
        assert tuple(why["state"]) == D.EXPLAINED_FEATURES
    [game] = played(
        ScriptedEngine(solve_script(cfg, {})), make_examples(1), D.MetaPolicy(features="paper"), cfg
    )
    assert [tuple(w["state"]) for w in game["rounds"][1]["policy"]] == [
        ("peer_agreement", "is_majority")
    ] * 3
    [game] = played(
        ScriptedEngine(solve_script(cfg, {})), make_examples(1), D.FixedPolicy("refine"), cfg
    )
    assert "policy" not in game["rounds"][1]


def test_play_random_is_seeded():
    cfg = GameConfig(agents=3, rounds=3, seed=4)
    runs = [
        played(
            ScriptedEngine(solve_script(cfg, {("t/0", 0): 1, ("t/1", 1): 0})),
            make_examples(2),
            D.FixedPolicy("random"),
            cfg,
        )
        for _ in range(2)
    ]
    assert [[r.get("actions") for r in t["rounds"]] for t in runs[0]] == [
        [r.get("actions") for r in t["rounds"]] for t in runs[1]
    ]


def reward_vectors(game):
    """train_rl.py's counterfactual reward vectors of a game's first decision round."""
    move, ex = game.moves[0], game.example
    return D.counterfactual_rewards(move, ex.answer, ex.task)


def test_counterfactual_reward_vectors():
    """Every action's reward, peers held at their actions; the taken action's entry is the actual
    reward."""
    cfg = GameConfig(agents=3, rounds=1)
    # only agent 2 is right; refine answers gold
    answers = {("t/0", 0): 1, ("t/0", 1): 2, ("t/0", 2): 5}
    engine = ScriptedEngine(solve_script(cfg, answers))
    [game] = D.play(engine, make_examples(1), D.FixedPolicy("persist"), cfg, refine_all=True)
    record, vectors = game.rounds[1], reward_vectors(game)
    assert record["actions"] == [PERSIST] * 3 and record["rewards"] == [0, 0, 0]
    # vote ties go to the higher confidence (round-0 answers 5/10, refined ones 9/10), then the
    # lower index agent 0 (peers 1, 2): refine or concede to agent 2 make it right (+1) and the full
    # vote right (+1), while the vote without it (2 vs 5, tied) stays wrong; concede to agent 1
    # changes nothing
    assert vectors[0] == [0, 2, 0, 2]
    assert vectors[1] == [0, 2, 0, 2]
    # agent 2 is right: conceding to a wrong peer costs its correctness; refining keeps it right and
    # its higher confidence now wins the three-way tie of the full vote
    assert vectors[2] == [0, 1, -1, -1]
    assert [v[a] for v, a in zip(vectors, record["actions"])] == record["rewards"]
    assert engine.calls == 3 + 3  # one counterfactual REFINE sample per agent


def test_play_is_independent_of_the_batch():
    """A question's game does not depend on which other questions share the batch (rank
    sharding)."""
    cfg = GameConfig(agents=3, rounds=3, seed=1)
    answers = {("t/0", 0): 1, ("t/1", 1): 0, ("t/2", 2): 3}
    torch.manual_seed(0)
    policy = D.MetaPolicy(agents=3)
    engine = ScriptedEngine(solve_script(cfg, answers))
    together = played(engine, make_examples(3), policy, cfg, greedy=False)
    alone = played(engine, make_examples(3)[1:2], policy, cfg, greedy=False)
    assert [r.get("actions") for r in alone[0]["rounds"]] == [
        r.get("actions") for r in together[1]["rounds"]
    ]


def test_sample_actions_inverse_cdf():
    probs = torch.tensor([[0.1, 0.2, 0.7]] * 4)
    assert D.sample_actions(probs, torch.tensor([0.0, 0.15, 0.35, 0.999], dtype=torch.float64)) == [
        0,
        1,
        2,
        2,
    ]


# ---------------------------------------------------------------- the real engine path, tiny model
def test_protocols_on_tiny_model(tiny_model, tmp_path):
    model, tokenizer = tiny_model
    engine = Engine(model=model, tokenizer=tokenizer, cache_dir=tmp_path / "cache")
    cfg = GameConfig(agents=2, rounds=1, max_new_tokens=8)
    examples = data.load_task("arith", split="test", n=2, seed=0)
    for protocol in (
        "vanilla",
        "cot",
        "sc",
        "debate",
        "mpdf-persist",
        "mpdf-random",
        "mpdf-oracle",
    ):
        results = E.run_protocol(engine, examples, protocol, cfg)
        assert len(results) == 2 and all(r["tokens"] > 0 and r["calls"] >= 1 for r in results)
        # random weights answer nothing sensible: an unparseable answer is never counted correct
        assert all(r["correct"] == data.is_correct(r["pred"], r["gold"], "arith") for r in results)
    assert E.run_protocol(engine, examples, "sc", cfg)[0]["calls"] == 2 * (1 + 1)
    with pytest.raises(ValueError, match="unknown protocol"):
        E.run_protocol(engine, examples, "magic", cfg)


def test_lead_peers_vote_then_leader_decides_and_peers_revise():
    """MLPO's protocol: round-0 peers (play's calls), the leader reads them; with rounds=1 the peers
    revise after reading the leader's answer and the leader answers again; its last answer is the
    prediction."""
    cfg = GameConfig(agents=3, rounds=1)
    examples = make_examples(2)
    peers = ScriptedEngine(
        solve_script(
            cfg,
            {
                ("t/0", 0): 1,
                ("t/0", 1): 1,
                ("t/0", 2): 5,
                ("t/1", 0): 6,
                ("t/1", 1): 6,
                ("t/1", 2): 2,
            },
        )
    )
    seen = []

    def leader_script(prompt, seed):  # answers agent 3's round-0 answer, then what most peers say
        seen.append(prompt)
        answers = [
            line.split("Answer: ")[1] for line in prompt.splitlines() if line.startswith("Answer: ")
        ]
        return f"Answer: {answers[2] if len(seen) <= 2 else max(set(answers), key=answers.count)}"

    leader = ScriptedEngine(leader_script)
    out = E.lead(peers, leader, examples, cfg)
    # 1,1,5 votes 1 (gold 5); 6,6,2 votes 6
    assert [r["peer_vote_correct"] for r in out] == [False, True]
    # the leader picked agent 3 both times
    assert [r["leader_correct"][0] for r in out] == [True, False]
    # round 1: the peers refine (the script answers gold), the leader follows them
    assert [r["leader_correct"] for r in out] == [[True, True], [False, True]]
    assert [r["pred"] for r in out] == ["5", "6"] and all(r["correct"] for r in out)
    assert "Solutions from 3 agents" in seen[0] and "Agent 3:" in seen[0]
    assert (
        peers.calls == 6 + 6 and leader.calls == 4 and all(r["calls"] == 3 + 1 + 3 + 1 for r in out)
    )
    assert all(r["tokens"] > 0 for r in out)


# ----------------------------------------------------------------
# generation confidence and the one vote rule
def test_generation_confidence_signals():
    logprobs = [math.log(0.9)] * 10 + [math.log(0.2)] + [math.log(0.8)] * 7
    signals = generation_confidence(logprobs)
    assert signals["min_prob"] == pytest.approx(0.2)
    assert signals["tail_prob"] == pytest.approx(math.exp((math.log(0.2) + 7 * math.log(0.8)) / 8))
    assert signals["mean_prob"] == pytest.approx(math.exp(sum(logprobs) / len(logprobs)))
    s = parse_solution("Answer: 3", "arith", 18, logprobs, vote="min_prob")
    assert s.confidence == pytest.approx(0.2) and s.signals == signals
    assert (
        parse_solution("Answer: 3", "arith", 18, logprobs, vote="tail_prob").confidence
        == signals["tail_prob"]
    )
    assert parse_solution("Answer: 3", "arith", 18, logprobs, vote="index").confidence == 0.5
    with pytest.raises(ValueError, match="unknown vote rule"):
        parse_solution("Answer: 3", "arith", vote="critic")
    features = dict(zip(D.PROFILE_FEATURES, D.profile(s)))
    assert (
        features["min_prob"] == pytest.approx(0.2) and features["mean_prob"] == signals["mean_prob"]
    )


def test_every_protocol_votes_the_same_round_0_answers_the_same_way():
    """Round-0 ties (1 vs 2 vs 5) break by generation confidence for every protocol, critic on or
    off."""
    cfg = GameConfig(agents=3, rounds=1)

    def script(prompt, seed):  # three different answers; agent 2 is the most confident
        agent = {call_seed(cfg.seed, "t/0", i, 0, "solve"): i for i in range(3)}.get(seed)
        return (
            f"Answer: {agent + 1}\nConfidence: {[3, 4, 9][agent]}/10"
            if agent is not None
            else "Answer: 7"
        )

    votes = []
    for policy, critic in (
        (D.FixedPolicy("refine"), False),
        (D.FixedPolicy("persist"), False),
        (D.FixedPolicy("persist"), True),
        (D.MetaPolicy(agents=3, critic=True), False),
    ):
        out = played(
            ScriptedEngine(script),
            make_examples(1),
            policy,
            dataclasses.replace(cfg, critic=critic),
        )
        votes.append(out[0]["rounds"][0]["vote"])
    assert votes == ["3"] * 4
    index_rule = played(
        ScriptedEngine(script),
        make_examples(1),
        D.FixedPolicy("persist"),
        dataclasses.replace(cfg, vote="index"),
    )
    assert index_rule[0]["rounds"][0]["vote"] == "1"


@pytest.mark.parametrize("cost", [100.0, -100.0])
def test_refine_cost_is_paid_by_refine_only(cost):
    """play's refine_cost (train_rl.py's --refine-cost; below 0, experiments/rl_refine_pays.py): a
    REFINE's reward, taken or counterfactual, pays per 1000 tokens of its call; a negative cost is
    earned."""
    answers = {("t/0", 0): 1, ("t/0", 1): 2, ("t/0", 2): 5}
    runs = {}
    for c in (0.0, cost):
        cfg = GameConfig(agents=3, rounds=1)
        engine = ScriptedEngine(solve_script(cfg, answers))
        [game] = D.play(
            engine, make_examples(1), D.FixedPolicy("refine"), cfg, refine_all=True, refine_cost=c
        )
        runs[c] = game.rounds[1], reward_vectors(game)
    (free, free_vectors), (paid, paid_vectors) = runs[0.0], runs[cost]
    for i in range(3):
        spent = free_vectors[i][REFINE] - paid_vectors[i][REFINE]
        # it refined, and paid or earned as the cost's sign says
        assert spent * cost > 0 and spent == pytest.approx(free["rewards"][i] - paid["rewards"][i])
        others = [a for a in range(4) if a != REFINE]
        assert [paid_vectors[i][a] for a in others] == [free_vectors[i][a] for a in others]


def test_a_policy_with_a_copy_per_agent_explains_each_agents_own_probabilities():
    """--separate: each agent's recorded probabilities are those of its own copy of the network."""
    cfg = GameConfig(agents=3, rounds=1)
    torch.manual_seed(0)
    policy = D.MetaPolicy(agents=3, separate=True)
    engine = ScriptedEngine(solve_script(cfg, {}))
    [game] = D.play(engine, make_examples(1), policy, cfg)
    [move] = game.moves
    own = torch.tensor([o for o, _ in move.observations])
    peers = torch.tensor([p for _, p in move.observations])
    probs = torch.softmax(policy(own, peers, torch.tensor([0, 1, 2])), -1)
    recorded = torch.tensor([why["probs"] for why in game.rounds[1]["policy"]])
    torch.testing.assert_close(recorded, probs, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="unknown fixed policy 'oracle'"):
        # the oracle is no FixedPolicy: it is the one policy that reads the gold answer
        D.FixedPolicy("oracle")
