"""The fixed evaluation protocols, MLPO's leader and the game's bookkeeping, pinned on hand-built
games whose every call is worked out by hand here: for each protocol of run_protocol
(vanilla, alone, cot, sc, debate, mpdf-<fixed>, mpdf=<policy>, leader=<spec>) the number of LLM
calls, their prompts, seeds, agents (adapters), temperatures and sampling settings, the vote, the
tokens counted and the actions by round; for lead() what the leader is shown, which seeds its calls
and its peers' revisions use, and how its answer is scored; for decide() the observations, info,
per-(question, agent, round) uniforms and greedy flag the policy gets; for play() its records, the
critic's cost and its progress ticks; action_counts by kind and round.

No model: the engine answers by the call's seed (an unexpected seed fails the test) and each call
costs a fixed 100 prompt + 10 completion tokens, each critic pass 7, so every count is by hand."""

import re
from dataclasses import replace

import pytest
import torch
from method.test_meaning import (
    ACTIONS,
    BEFORE,
    GOLD,
    REFINED,
    Script,
    example,
    hand_vectors,
    move_of,
    sol,
)
from scripted import ScriptedEngine, played

import deliberate as D
import eval as E
from common import UsageError, call_seed
from deliberate import PERSIST, REFINE, concede
from llm.team import Member, Team
from solutions import (
    GameConfig,
    cot_prompt,
    leader_prompt,
    refine_prompt,
    solve_prompt,
    vanilla_prompt,
)

PROMPT, COMPLETION, CRITIC = 100, 10, 7
CALL = PROMPT + COMPLETION  # the tokens one LLM call counts


class Recorder(ScriptedEngine):
    """Answers `Answer: <answers[seed]>` (vote confidence 0.5 for all: ties go to the lower index);
    `log` keeps each generate call's prompts, seeds, adapters and sampling settings, `verdicts` the
    continuations each critic pass scored."""

    def __init__(self, answers):
        super().__init__(lambda prompt, seed: f"Answer: {answers[seed]}")
        self.log, self.verdicts = [], []

    def generate(self, prompts, seeds, **kw):
        self.log.append({"prompts": list(prompts), "seeds": list(seeds), **kw})
        completions = super().generate(prompts, seeds)
        return [replace(c, prompt_tokens=PROMPT, completion_tokens=COMPLETION) for c in completions]

    def encode(self, prompt):
        return [0] * CRITIC

    def continuation_logprobs(self, prompts, continuations):
        self.verdicts.append(continuations)
        return super().continuation_logprobs(prompts, continuations)

    def column(self, key):
        """One entry per prompt, over every call, of `key` (prompts, seeds, adapters, ...)."""
        return [x for call in self.log for x in call[key]]


def seeds(seed, qid, purpose, keys):
    """call_seed of each (agent, round) key (or sample k) of `purpose` for question qid."""
    return [call_seed(seed, qid, *key, purpose) for key in keys]


def game_replies(seed, qid, solve, refine=()):
    """solve: round-0 answers of agents 0, 1, ...; refine: (round, agent) -> answer."""
    out = {call_seed(seed, qid, i, 0, "solve"): a for i, a in enumerate(solve)}
    out.update({call_seed(seed, qid, i, t, "refine"): a for (t, i), a in dict(refine).items()})
    return out


def answers_by_round(result):
    return [r["answers"] for r in result["rounds"]]


# --------------------------------------------------------------------------------------------------
# single answers and self-consistency
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "protocol, prompt, asks",
    [
        ("vanilla", vanilla_prompt, "Answer with a number."),
        ("alone", solve_prompt, "End with 'Answer: <a number>'."),
        ("cot", cot_prompt, "Think step by step, then end with 'Answer: <a number>'."),
    ],
)
def test_single_answer_protocols_are_one_greedy_call_of_agent_0(protocol, prompt, asks):
    """One call per question, agent 0's (adapter 10 of the team's 10, 11, 12), at temperature 0
    whatever cfg.temperature, with cfg's top_p and max_new_tokens; its answer is the prediction."""
    cfg = GameConfig(agents=3, rounds=2, seed=7, temperature=0.5, top_p=0.9, max_new_tokens=64)
    examples = [example("q/1"), example("q/2", "8")]
    engine = Recorder({call_seed(7, "q/1", 0, protocol): 5, call_seed(7, "q/2", 0, protocol): 3})
    team = Team([Member(engine, 10), Member(engine, 11), Member(engine, 12)])
    results = E.run_protocol(team, examples, protocol, cfg)
    [call] = engine.log
    assert call["prompts"] == [prompt(ex) for ex in examples]
    assert all(p.endswith(asks) for p in call["prompts"])
    assert call["seeds"] == [call_seed(7, "q/1", 0, protocol), call_seed(7, "q/2", 0, protocol)]
    assert call["adapters"] == [10, 10]
    assert (call["temperature"], call["top_p"], call["max_new_tokens"]) == (0.0, 0.9, 64)
    assert results == [
        {
            "id": "q/1",
            "question": "Question q/1?",
            "gold": "5",
            "pred": "5",
            "correct": True,
            "tokens": CALL,
            "calls": 1,
            "texts": ["Answer: 5"],
            "answers": ["5"],
            "answer_correct": [True],
        },
        {
            "id": "q/2",
            "question": "Question q/2?",
            "gold": "8",
            "pred": "3",
            "correct": False,
            "tokens": CALL,
            "calls": 1,
            "texts": ["Answer: 3"],
            "answers": ["3"],
            "answer_correct": [False],
        },
    ]


def test_alone_asks_as_the_games_round_0_asks_with_its_trailer():
    """alone is the game's round-0 prompt of agent 0 (trailer and all), the words a trained agent
    learned, greedy, where vanilla asks in other words."""
    examples = [example("q/1")]
    for trailer in (False, True):
        cfg = GameConfig(agents=2, rounds=1, seed=3, temperature=0.7, trailer=trailer)
        engine = Recorder({call_seed(3, "q/1", 0, "alone"): 5})
        E.run_protocol(Team([Member(engine, 1), Member(engine, 2)]), examples, "alone", cfg)
        [call] = engine.log
        assert call["prompts"] == [solve_prompt(examples[0], trailer, 0)]
        assert call["prompts"] != [vanilla_prompt(examples[0])]
        assert (call["adapters"], call["temperature"]) == ([1], 0.0)


def test_self_consistency_votes_as_many_samples_as_debate_makes():
    """sc with 3 agents and 1 round: 3 x (1 + 1) = 6 cot samples per question, sample k from agent
    k mod 3, at cfg.temperature; the prediction is their majority vote."""
    cfg = GameConfig(agents=3, rounds=1, seed=2, temperature=0.7, top_p=0.8, max_new_tokens=32)
    examples = [example("q/1"), example("q/2", "8")]
    samples = {"q/1": [3, 5, 5, 4, 3, 5], "q/2": [8, 1, 1, 2, 8, 1]}  # votes: 5 (right), 1 (wrong)
    engine = Recorder(
        {
            call_seed(2, q, k, "sc"): a
            for q, answers in samples.items()
            for k, a in enumerate(answers)
        }
    )
    team = Team([Member(engine, 10), Member(engine, 11), Member(engine, 12)])
    results = E.run_protocol(team, examples, "sc", cfg)
    [call] = engine.log
    assert call["prompts"] == [cot_prompt(ex) for ex in examples for _ in range(6)]
    assert call["seeds"] == [call_seed(2, q, k, "sc") for q in ("q/1", "q/2") for k in range(6)]
    assert call["adapters"] == [10, 11, 12] * 4
    assert (call["temperature"], call["top_p"], call["max_new_tokens"]) == (0.7, 0.8, 32)
    assert [(r["id"], r["gold"], r["pred"], r["correct"]) for r in results] == [
        ("q/1", "5", "5", True),
        ("q/2", "8", "1", False),
    ]
    assert [r["calls"] for r in results] == [6, 6]
    assert [r["tokens"] for r in results] == [6 * CALL] * 2
    assert results[1]["texts"] == [f"Answer: {a}" for a in samples["q/2"]]
    assert results[1]["answers"] == [str(a) for a in samples["q/2"]]
    assert results[1]["answer_correct"] == [a == 8 for a in samples["q/2"]]


# --------------------------------------------------------------------------------------------------
# the game's protocols: gold 5, round 0 says 3, 5, 4 (vote: the three-way tie goes to agent 0's 3)
# --------------------------------------------------------------------------------------------------
GAME_CFG = GameConfig(agents=3, rounds=2, seed=1, temperature=0.6)
REFINES = {(1, 0): 5, (1, 1): 5, (1, 2): 4, (2, 0): 5, (2, 1): 5, (2, 2): 5}


def test_debate_refines_every_agent_every_round():
    """debate = every agent REFINEs in each of the 2 rounds (never all PERSIST: no early stop): 3 +
    3 + 3 calls at cfg.temperature, each from the round's solutions; 3,5,4 -> 5,5,4 -> 5,5,5."""
    engine = Recorder(game_replies(1, "q/1", [3, 5, 4], REFINES))
    [result] = E.run_protocol(engine, [example("q/1")], "debate", GAME_CFG)
    assert [r.get("actions") for r in result["rounds"]] == [None, [REFINE] * 3, [REFINE] * 3]
    assert answers_by_round(result) == [["3", "5", "4"], ["5", "5", "4"], ["5", "5", "5"]]
    assert [r["vote"] for r in result["rounds"]] == ["3", "5", "5"]
    assert (result["pred"], result["correct"]) == ("5", True)
    assert (result["calls"], result["tokens"]) == (9, 9 * CALL)
    assert [len(call["prompts"]) for call in engine.log] == [3, 3, 3]
    assert {call["temperature"] for call in engine.log} == {0.6}
    keys = [(i, t) for t in (1, 2) for i in range(3)]
    assert engine.column("seeds")[3:] == seeds(1, "q/1", "refine", keys)
    # round 1's prompts show the round-0 answers: agent 2 sees agents 1 and 2 say 3 and 5
    assert engine.log[1]["prompts"][2] == refine_prompt(
        example("q/1"), [sol("3"), sol("5"), sol("4")], 2
    )
    assert "Your previous solution:\nAnswer: 4" in engine.log[1]["prompts"][2]
    assert "Other agents' answers: Agent 1: 3, Agent 2: 5." in engine.log[1]["prompts"][2]


@pytest.mark.parametrize(
    "protocol, actions, answers, calls",
    [
        # all PERSIST: the game stops after round 1; the tie keeps agent 0's wrong 3
        ("mpdf-persist", [[PERSIST] * 3], [["3", "5", "4"]], 3),
        # agent 0 concedes to its peer 0 (agent 1, right), agent 2 to its peer 1 (agent 1); then all
        # are right and PERSIST (round 2 ends the game); no REFINE call at all
        ("mpdf-oracle", [[concede(0), PERSIST, concede(1)], [PERSIST] * 3], [["5"] * 3] * 2, 3),
        ("mpdf=refine", [[REFINE] * 3] * 2, [["5", "5", "4"], ["5"] * 3], 9),
    ],
)
def test_policy_protocols_play_the_named_policy(protocol, actions, answers, calls):
    engine = Recorder(game_replies(1, "q/1", [3, 5, 4], REFINES))
    [result] = E.run_protocol(engine, [example("q/1")], protocol, GAME_CFG)
    assert [r["actions"] for r in result["rounds"][1:]] == actions
    assert answers_by_round(result) == [["3", "5", "4"], *answers]
    assert result["pred"] == answers[-1][0] and result["correct"] == (answers[-1][0] == "5")
    assert (result["calls"], result["tokens"], engine.calls) == (calls, calls * CALL, calls)


def test_unknown_protocols_and_a_leader_without_its_engine_are_refused():
    known = "vanilla, alone, cot, sc, debate, debate-1, debate-2, mpdf-persist, mpdf-random, "
    known += "mpdf-oracle, freeze, minority, gate=PATH, trigger=PATH, mpdf=PATH, leader=PATH, "
    known += "leader=default"
    engine, leader = Recorder({}), Recorder({})
    message = re.escape(f"unknown protocol 'magic'; known: {known}") + "$"
    # a leader engine does not make any protocol a leader's
    with pytest.raises(ValueError, match=message):
        E.run_protocol(engine, [example("q/1")], "magic", GAME_CFG, leader=leader)
    with pytest.raises(ValueError, match="'leader=default' needs its leader's engine"):
        E.run_protocol(engine, [example("q/1")], "leader=default", GAME_CFG)
    assert engine.calls == leader.calls == 0


# --------------------------------------------------------------------------------------------------
# MLPO's leader: 2 peers, 2 revision rounds, the trailer on, two questions (gold 5 and 8)
# --------------------------------------------------------------------------------------------------
LEAD_CFG = GameConfig(agents=2, rounds=2, seed=3, temperature=0.5, trailer=True)
# per question: the peers' answers in round 0 and after each revision, the leader's in each round
PEERS = {"q/1": [[3, 4], [5, 4], [5, 5]], "q/2": [[8, 8], [8, 8], [8, 8]]}
LEADER = {"q/1": [4, 5, 6], "q/2": [8, 7, 8]}
GOLDS = {"q/1": "5", "q/2": "8"}


def lead_engines():
    peers = {}
    for q, rounds in PEERS.items():
        peers.update({call_seed(3, q, i, 0, "solve"): a for i, a in enumerate(rounds[0])})
        for t in (1, 2):
            peers.update({call_seed(3, q, i, t, "revise"): a for i, a in enumerate(rounds[t])})
    leader = {
        call_seed(3, q, t, "lead"): a for q, said in LEADER.items() for t, a in enumerate(said)
    }
    return Recorder(peers), Recorder(leader), Recorder({})


def test_lead_shows_the_leader_every_peer_and_scores_its_last_answer():
    """Round 0: the peers solve, the leader (greedy, its team's agent 0) reads both solutions. Each
    of the 2 further rounds: every peer revises reading its peer and the leader's last answer (as
    one more agent), then the leader answers again. q/1: the leader says 4, 5, 6 (right only in
    round 1): its last answer 6 is the prediction, wrong; q/2: 8, 7, 8, right. 2 + 2 + 2 peer calls
    and 3 leader calls per question."""
    peers, leader, second = lead_engines()
    examples = [example("q/1"), example("q/2", "8")]
    results = E.lead(peers, Team([Member(leader), Member(second)]), examples, LEAD_CFG)
    assert second.calls == 0
    assert [(r["id"], r["gold"], r["pred"], r["correct"]) for r in results] == [
        ("q/1", "5", "6", False),
        ("q/2", "8", "8", True),
    ]
    assert [r["leader_correct"] for r in results] == [[False, True, False], [True, False, True]]
    # the transcript: per round, the peers' answers the leader read, then the leader's
    assert [r["leader_answers"] for r in results] == [[str(a) for a in LEADER[q]] for q in GOLDS]
    assert [r["peer_answers"] for r in results] == [
        [[str(a) for a in said] for said in PEERS[q]] for q in GOLDS
    ]
    assert results[0]["peer_correct"] == [[False, False], [True, False], [True, True]]
    # round 0's peers: 3 vs 4 ties to agent 0's wrong 3; 8, 8 right
    assert [r["peer_vote_correct"] for r in results] == [False, True]
    assert [r["texts"] for r in results] == [
        [f"Answer: {a}" for a in LEADER[q]] for q in ("q/1", "q/2")
    ]
    assert [(r["calls"], r["tokens"]) for r in results] == [(9, 9 * CALL)] * 2
    # the leader: one greedy call per round, both questions together
    assert [call["seeds"] for call in leader.log] == [
        [call_seed(3, "q/1", t, "lead"), call_seed(3, "q/2", t, "lead")] for t in range(3)
    ]
    assert {call["temperature"] for call in leader.log} == {0.0}
    assert {call["temperature"] for call in peers.log} == {0.5}
    shown = [[sol(str(a)) for a in rounds] for rounds in PEERS["q/1"]]
    q1 = example("q/1")
    assert [call["prompts"][0] for call in leader.log] == [
        leader_prompt(q1, shown[t], True) for t in range(3)
    ]
    assert "Agent 1:\nAnswer: 5\n\nAgent 2:\nAnswer: 4" in leader.log[1]["prompts"][0]
    assert all("Confidence: <0-10>/10" in call["prompts"][0] for call in leader.log)
    # the peers' revisions: round t, agent i; its peer and the leader's answer of round t - 1
    assert [call["seeds"] for call in peers.log[1:]] == [
        seeds(3, "q/1", "revise", [(i, t) for i in range(2)])
        + seeds(3, "q/2", "revise", [(i, t) for i in range(2)])
        for t in (1, 2)
    ]
    leader_said = [sol(str(a)) for a in LEADER["q/1"]]
    for t in (1, 2):
        assert peers.log[t]["prompts"][:2] == [
            refine_prompt(q1, shown[t - 1] + [leader_said[t - 1]], i, True) for i in range(2)
        ]
    assert "Other agents' answers: Agent 1: 3, Agent 3: 4." in peers.log[1]["prompts"][1]
    assert "Other agents' answers: Agent 2: 4, Agent 3: 5." in peers.log[2]["prompts"][0]
    assert "Steps: <number of steps>" in peers.log[2]["prompts"][0]


def test_leader_protocol_runs_lead_with_the_leaders_engine():
    peers, leader, _ = lead_engines()
    examples = [example("q/1"), example("q/2", "8")]
    results = E.run_protocol(peers, examples, "leader=default", LEAD_CFG, leader=leader)
    assert [(r["pred"], r["leader_correct"]) for r in results] == [
        ("6", [False, True, False]),
        ("8", [True, False, True]),
    ]
    assert (peers.calls, leader.calls) == (2 * 6, 2 * 3)


# --------------------------------------------------------------------------------------------------
# play(): its records, prompts with the trailer, the critic's cost, progress
# --------------------------------------------------------------------------------------------------
class Ticks:
    def __init__(self):
        self.n = 0

    def update(self, n):
        self.n += n


def test_play_records_prompts_and_progress():
    """Trailer on, 3 agents, 2 rounds: round 1 agents 0 and 2 REFINE (to 5 and 5), agent 1
    PERSISTs; round 2 all PERSIST. 3 solves + 2 refines, one progress tick per round played."""
    cfg = GameConfig(agents=3, rounds=2, seed=0, trailer=True)
    engine = Recorder(game_replies(0, "q/1", [3, 5, 4], {(1, 0): 5, (1, 2): 5}))
    plan = {1: [REFINE, PERSIST, REFINE], 2: [PERSIST] * 3}
    ticks = Ticks()
    [result] = played(
        engine, [example("q/1")], Script(lambda t, agent: plan[t][agent]), cfg, progress=ticks
    )
    assert ticks.n == 2
    solve, refine = engine.log[0]["prompts"], engine.log[1]["prompts"]
    assert solve == [solve_prompt(example("q/1"), True)] * 3 and "Example:\n" in solve[0]
    assert refine == [
        refine_prompt(example("q/1"), [sol("3"), sol("5"), sol("4")], i, True) for i in (0, 2)
    ]
    assert (
        "Your previous solution:\nAnswer: 3" in refine[0] and "Agent 2: 5, Agent 3: 4" in refine[0]
    )
    assert (
        "Your previous solution:\nAnswer: 4" in refine[1] and "Agent 1: 3, Agent 2: 5" in refine[1]
    )
    assert all("Confidence: <0-10>/10" in p for p in refine)
    first, second, third = result["rounds"]
    assert [r["round"] for r in result["rounds"]] == [0, 1, 2]
    assert first["texts"] == ["Answer: 3", "Answer: 5", "Answer: 4"]
    assert first["trailer_ok"] == [False] * 3  # no Steps / Confidence lines in the replies
    assert [s["mean_prob"] for s in first["signals"]] == [pytest.approx(0.5)] * 3
    assert second["texts"] == ["Answer: 5"] * 3 and third["texts"] == ["Answer: 5"] * 3
    assert not any(key in r for r in result["rounds"] for key in ("own", "peers"))
    assert (result["calls"], result["tokens"]) == (5, 5 * CALL)


def test_play_needs_two_agents():
    with pytest.raises(ValueError, match="^the game needs at least 2 agents$"):
        played(Recorder({}), [example("q/1")], Script(None), GameConfig(agents=1))


def test_the_critic_pass_costs_tokens_calls_and_refine_reward():
    """critic on, refine_cost 1 per 1000 tokens: each LLM call (110 tokens) adds a critic pass (7
    prompt tokens) and counts as 2 calls. Gold 5, round 0: 3, 5; agent 0 REFINEs to 5, agent 1
    PERSISTs. Agent 0: own +1, vote 5 right, without it agent 1's 5 right: 1 + 1 - 1 = 1, less
    117 / 1000. Agent 1: own 0, vote right, without it agent 0's 5 right: 0."""
    cfg = GameConfig(agents=2, rounds=1, seed=0, critic=True)
    engine = Recorder(game_replies(0, "q/1", [3, 5], {(1, 0): 5}))
    script = Script(lambda t, agent: [REFINE, PERSIST][agent])
    [result] = played(engine, [example("q/1")], script, cfg, refine_cost=1.0)
    assert engine.verdicts == [["Correct", "Incorrect"]] * 2  # round 0's pass, then the REFINE's
    assert result["rounds"][0]["critic"] == [pytest.approx(0.7)] * 2
    assert result["rounds"][1]["rewards"] == pytest.approx([1 - (CALL + CRITIC) / 1000, 0])
    assert (result["calls"], result["tokens"]) == (3 * 2, 3 * (CALL + CRITIC))


# --------------------------------------------------------------------------------------------------
# decide(): what the policy is given
# --------------------------------------------------------------------------------------------------
class Spy(Script):
    """Script that keeps the arguments of each act call."""

    def __init__(self, choose):
        super().__init__(choose)
        self.seen = []

    def act(self, own, peers, agent_index, uniforms, greedy=True):
        self.seen.append(dict(own=own, peers=peers, agents=agent_index, u=uniforms))
        self.seen[-1]["greedy"] = greedy
        self.t += 1
        return self.choose(self.t)


@pytest.mark.parametrize("default_dtype", [torch.float32, torch.float64])
def test_decide_gives_the_policy_each_agents_state_and_its_own_uniform(default_dtype):
    """Two questions, 2 agents, 2 rounds, seed 9, sampled actions (greedy False): in each round the
    policy sees one row per (question, agent), question-major, the agent indices, and uniform
    call_seed(9, question, agent, round, "act") / 2^60 in float64 (float32 would round the
    uniforms); never the gold answer. Both whatever torch's default dtype: the observations are
    float32 (the policy's weights are), the uniforms float64."""
    cfg = GameConfig(agents=2, rounds=2, seed=9)
    engine = Recorder(
        {
            **game_replies(9, "q/1", [5, 3], {(1, 1): 5}),
            **game_replies(9, "q/2", [1, 8], {(1, 0): 2}),
        }
    )
    # round 1: the wrong agents (q/1's agent 1, q/2's agent 0) REFINE; round 2: all PERSIST
    spy = Spy(lambda t: [PERSIST, REFINE, REFINE, PERSIST] if t == 1 else [PERSIST] * 4)
    default = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)
    try:
        played(engine, [example("q/1"), example("q/2", "8")], spy, cfg, greedy=False)
    finally:
        torch.set_default_dtype(default)
    assert len(spy.seen) == 2  # round 2: q/1 is all right, q/2's agent 0 stays wrong: PERSIST
    rows = [("q/1", 0), ("q/1", 1), ("q/2", 0), ("q/2", 1)]
    for t, seen in enumerate(spy.seen, start=1):
        assert seen["u"].dtype == torch.float64
        assert seen["u"].tolist() == [call_seed(9, q, i, t, "act") / 2**60 for q, i in rows]
        assert seen["agents"].tolist() == [0, 1, 0, 1]
        assert seen["greedy"] is False
        assert (seen["own"].dtype, seen["peers"].dtype) == (torch.float32, torch.float32)
        assert seen["own"].shape[0] == 4 and seen["peers"].shape[:2] == (4, 1)
    assert set(spy.seen[0]) == {"own", "peers", "agents", "u", "greedy"}


# --------------------------------------------------------------------------------------------------
# action_counts and the reward vector without costs
# --------------------------------------------------------------------------------------------------
TRANSCRIPTS = [
    {"rounds": [{"round": 0}, {"actions": [PERSIST, REFINE, concede(0)]}, {"actions": [3, 3, 0]}]},
    {"rounds": [{"round": 0}, {"actions": [REFINE, REFINE, concede(2)]}]},
]


def test_action_counts_by_kind_and_round():
    """Round 1: PERSIST once, REFINE 3 times, CONCEDE twice (to any peer); round 2: PERSIST once,
    CONCEDE twice; round 0 has no actions and round 3 was never played."""
    assert D.action_counts(TRANSCRIPTS) == {"persist": 2, "refine": 3, "concede": 4}
    assert D.action_counts(TRANSCRIPTS, 1) == {"persist": 1, "refine": 3, "concede": 2}
    assert D.action_counts(TRANSCRIPTS, 2) == {"persist": 1, "refine": 0, "concede": 2}
    assert D.action_counts(TRANSCRIPTS, 3) == {"persist": 0, "refine": 0, "concede": 0}


def test_counterfactual_vectors_without_costs_leave_refine_free():
    before, refined = [sol(a) for a in BEFORE], dict(enumerate(sol(a) for a in REFINED))
    after = [D.outcome(before, i, a, refined) for i, a in enumerate(ACTIONS)]
    vectors = D.counterfactual_rewards(move_of(before, after, refined), GOLD, "arith")
    assert vectors == [pytest.approx(v) for v in hand_vectors([0.0, 0.0, 0.0])]


def test_a_team_answers_each_call_with_its_own_agent_and_whole_solutions_reach_refine():
    """A team of three engines, one per agent: round 0 and every REFINE go to the agent they are
    for; with --whole-solutions each REFINE prompt shows the round's solutions whole."""
    replies = game_replies(1, "q/1", [3, 5, 4], REFINES)
    engines = [Recorder(replies) for _ in range(3)]
    team = Team([Member(engine) for engine in engines])
    cfg = replace(GAME_CFG, rounds=1, whole_solutions=True)
    [game] = D.play(team, [example("q/1")], D.FixedPolicy("refine"), cfg)
    for i, engine in enumerate(engines):
        assert engine.column("seeds") == seeds(1, "q/1", "solve", [(i, 0)]) + seeds(
            1, "q/1", "refine", [(i, 1)]
        )
        before = [sol("3"), sol("5"), sol("4")]
        assert engine.log[1]["prompts"] == [refine_prompt(example("q/1"), before, i, whole=True)]
    assert (
        "Other agents' solutions:\n\nAgent 1:\nAnswer: 3\n\nAgent 2:\nAnswer: 5"
        in (engines[2].log[1]["prompts"][0])
    )
    assert game.rounds[1]["answers"] == ["5", "5", "4"]


def test_a_policy_or_a_leader_is_checked_before_any_model_loads(tmp_path):
    """check_protocol, in process: an mpdf=PATH that is no file, a per-agent policy for another
    team size, a policy trained in another game (played with --any-game), and a leader that is no
    model are each refused in one line naming the protocol; a shared policy of its own game and
    the default leader pass."""
    cfg = replace(E.Config(), task="arith", agents=3, rounds=3)
    missing = tmp_path / "none.safetensors"
    refusals = [(f"mpdf={missing}", f"--protocols mpdf={missing}: no policy file '{missing}'")]
    separate = tmp_path / "separate.safetensors"
    D.save_policy(D.MetaPolicy(agents=2, separate=True), separate)
    refusals.append(
        (f"mpdf={separate}", f"--protocols mpdf={separate}: a policy with one copy per agent for 2")
    )
    other = tmp_path / "other.safetensors"
    game = {"task": "arith", "agents": 3, "rounds": 2}
    D.save_policy(D.MetaPolicy(agents=3), other, train_config=game)
    refusals.append((f"mpdf={other}", f"--protocols mpdf={other}: trained in another game"))
    nowhere = tmp_path / "nowhere"
    refusals.append(
        (f"leader={nowhere}", f"--protocols leader={nowhere}: '{nowhere}': not an HF checkpoint")
    )
    for protocol, says in refusals:
        with pytest.raises(UsageError) as refused:
            E.check_protocol(protocol, cfg)
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    with pytest.raises(UsageError, match="; known: vanilla, alone, cot, sc, debate, debate-1"):
        E.check_protocol("debate-9", cfg)
    E.check_protocol(f"mpdf={other}", replace(cfg, any_game=True))
    own = tmp_path / "own.safetensors"
    D.save_policy(D.MetaPolicy(agents=3), own, train_config=dict(game, rounds=3))
    E.check_protocol(f"mpdf={own}", cfg)
    three = tmp_path / "three.safetensors"
    D.save_policy(D.MetaPolicy(agents=3, separate=True), three)
    E.check_protocol(f"mpdf={three}", cfg)


def test_only_a_leader_of_its_own_names_a_model_to_check(monkeypatch):
    """check_protocol checks a leader's model (one agent, the game's token budget) and no model
    for the default leader or any other protocol."""
    checked = []
    monkeypatch.setattr(E, "check_models", lambda *args: checked.append(args))
    cfg = replace(E.Config(), max_new_tokens=77)
    for protocol in ("leader=default", "freeze", "vanilla", "debate-1"):
        E.check_protocol(protocol, cfg)
    assert checked == []
    E.check_protocol("leader=some/model", cfg)
    assert checked == [("--protocols leader=some/model:", "some/model", 1, 77)]
