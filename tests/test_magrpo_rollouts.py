"""MAGRPO's rollouts and rewards in process (train_magrpo.py joint_rollouts, revision_reward): a
scripted sampler answers by (question, rollout, agent, round), read back from the call seeds, so
every sequence, every prompt and every reward can be checked against what the script wrote."""

import dataclasses
import re
from types import SimpleNamespace

import pytest

import data
import train_magrpo
from common import UsageError, call_seed
from solutions import solve_prompt

EXAMPLES = [
    data.Example(question="q0", answer="5", task="arith", id="t/0"),
    data.Example(question="q1", answer="8", task="arith", id="t/1"),
]


# the team the rollouts sample from: the scripted sampler checks that it is the one passed
TEAM = object()


def scripted(monkeypatch, cfg, plan, step=0, logprob=None, examples=EXAMPLES):
    """Replaces the sampler: the call (question q, rollout g, agent i, round t) answers
    plan(q, g, i, t) (None: no answer line), its tokens of log-probability logprob(q, g, i, t)
    (None: unknown). Returns the list of (key, prompt) calls made."""
    keys = {
        call_seed(cfg.seed, "agents", step, ex.id, g, i, t): (q, g, i, t)
        for q, ex in enumerate(examples)
        for g in range(cfg.group)
        for i in range(cfg.agents)
        for t in range(cfg.rounds + 1)
    }
    calls = []

    def sample(team, prompts, seeds, agents, asked):
        assert team is TEAM and asked.group == cfg.group
        out = []
        for prompt, seed, agent in zip(prompts, seeds, agents):
            q, g, i, t = key = keys[seed]
            assert agent == i
            calls.append((key, prompt))
            answer = plan(q, g, i, t)
            text = f"{answer} - 0 = {answer}\nAnswer: {answer}" if answer else "I am not sure."
            ids = [q, g, i, t]
            logprobs = [logprob(*key)] * 4 if logprob else None
            out.append(
                SimpleNamespace(
                    text=text,
                    token_ids=ids,
                    completion_tokens=4,
                    token_logprobs=logprobs,
                    finish="eos",
                )
            )
        return out

    def prompt_ids(team, prompt, i):
        assert team is TEAM
        return [len(prompt), i]

    monkeypatch.setattr(train_magrpo, "sample", sample)
    monkeypatch.setattr(train_magrpo, "prompt_ids", prompt_ids)
    return calls


def config(**changes):
    fields = dict(agents=3, rounds=1, group=2, format_reward=0.0, vote="index")
    return train_magrpo.Config(**(fields | changes))


def gold(q):
    return int(EXAMPLES[q].answer)


def fixed_by_one(q, g, i, t):
    """Round 0: agent 0 right, agents 1 and 2 wrong alike. Round 1, rollout 0: agent 1 mends (the
    vote turns right), rollout 1: agent 0 breaks (every agent wrong)."""
    if t == 0:
        return gold(q) if i == 0 else gold(q) + 1
    if g == 0:
        return gold(q) if i in (0, 1) else gold(q) + 1
    return gold(q) + 1


def test_every_agent_of_every_rollout_answers_each_round_from_its_own_team(monkeypatch):
    cfg = config()
    calls = scripted(monkeypatch, cfg, fixed_by_one)
    sequences, rewards = train_magrpo.joint_rollouts(TEAM, EXAMPLES, cfg, step=0)
    keys = [key for key, _ in calls]
    assert sorted(keys) == sorted(
        (q, g, i, t) for q in range(2) for g in range(2) for i in range(3) for t in range(2)
    )
    # a sequence: its own prompt's ids and its own completion's, its question row, sample, agent
    assert [s.completion_ids for s in sequences] == [list(k) for k in keys]
    assert [(s.question, s.sample, s.agent) for s in sequences] == [k[:3] for k in keys]
    assert [s.prompt_ids for s in sequences] == [[len(p), k[2]] for k, p in calls]
    for (q, g, i, t), prompt in calls:
        if t == 0:
            assert "Other agents" not in prompt and EXAMPLES[q].question in prompt
            continue
        # round 1 reads its own rollout's round-0 answers, simultaneous moves
        others = [f"Agent {j + 1}: {fixed_by_one(q, g, j, 0)}" for j in range(3) if j != i]
        assert f"Other agents' answers: {', '.join(others)}." in prompt
        assert f"Answer: {fixed_by_one(q, g, i, 0)}" in prompt
    # the joint reward: the vote after the last round, per (question, rollout)
    assert rewards.tolist() == [[1.0, 0.0], [1.0, 0.0]]


def test_the_trailer_flag_reaches_every_prompt(monkeypatch):
    cfg = config(trailer=True)
    calls = scripted(monkeypatch, cfg, fixed_by_one)
    train_magrpo.joint_rollouts(TEAM, EXAMPLES, cfg, step=0)
    for (q, g, i, t), prompt in calls:
        assert "Confidence: <0-10>/10" in prompt
        if t == 0:
            assert prompt == solve_prompt(EXAMPLES[q], True)


def test_the_vote_breaks_ties_by_the_rule_on_the_samples_log_probs(monkeypatch):
    """Three different answers: --vote mean_prob picks the most confident agent (agent 2, right);
    by agent index it would be agent 0 (wrong)."""
    cfg = config(protocol="parallel", vote="mean_prob")

    def plan(q, g, i, t):
        return gold(q) + (2 - i)

    scripted(monkeypatch, cfg, plan, logprob=lambda q, g, i, t: -1.0 + 0.4 * i)
    _, rewards = train_magrpo.joint_rollouts(TEAM, EXAMPLES, cfg, step=0)
    assert rewards.flatten().tolist() == [1.0] * 4
    scripted(monkeypatch, cfg, plan, logprob=lambda q, g, i, t: -1.0 - 0.4 * i)
    _, rewards = train_magrpo.joint_rollouts(TEAM, EXAMPLES, cfg, step=0)
    assert rewards.flatten().tolist() == [0.0] * 4


def test_whole_solutions_show_each_peers_text(monkeypatch):
    cfg = config(whole_solutions=True)
    calls = scripted(monkeypatch, cfg, fixed_by_one)
    train_magrpo.joint_rollouts(TEAM, EXAMPLES, cfg, step=0)
    for (q, g, i, t), prompt in calls:
        if t:
            peer = 2 if i != 2 else 1
            wrong = fixed_by_one(q, g, peer, 0)
            assert f"Agent {peer + 1}:\n{wrong} - 0 = {wrong}\nAnswer: {wrong}" in prompt
            assert "Other agents' solutions:" in prompt


def test_parallel_plays_round_0_alone_and_format_reward_counts_parsed_answers(monkeypatch):
    cfg = config(protocol="parallel", format_reward=0.3, rounds=2)

    def plan(q, g, i, t):
        return None if (g, i) == (1, 2) else gold(q) + (i == 1 and g == 0)

    calls = scripted(monkeypatch, cfg, plan)
    sequences, rewards = train_magrpo.joint_rollouts(TEAM, EXAMPLES, cfg, step=0)
    assert {key[3] for key, _ in calls} == {0} and len(sequences) == 12
    # rollout 0: 2 of 3 right, all parse; rollout 1: 2 right, 1 unparseable
    assert rewards.flatten().tolist() == pytest.approx([1.3, 1.2, 1.3, 1.2])


@pytest.mark.parametrize("bonus", [0.0, 0.5, 0.9])
def test_revision_reward_shapes_each_change_of_the_agents_own_answer(bonus):
    ex = EXAMPLES[0]
    right, wrong = (train_magrpo.parse_solution(f"Answer: {a}", "arith") for a in ("5", "6"))
    garbled = train_magrpo.parse_solution("no idea", "arith")

    def reward(first, final):
        return train_magrpo.revision_reward(first, final, ex, bonus)

    assert reward(right, right) == 2.0 and reward(wrong, wrong) == 0.0
    assert reward(wrong, right) == pytest.approx(1 + bonus)
    assert reward(right, wrong) == pytest.approx(1 - bonus)
    assert reward(right, garbled) == reward(right, wrong) and reward(garbled, garbled) == 0.0


def test_revision_rewards_are_each_agents_own_in_its_own_row(monkeypatch):
    cfg = config(reward="revision", revision_bonus=0.5, format_reward=0.1)
    calls = scripted(monkeypatch, cfg, fixed_by_one)
    sequences, rewards = train_magrpo.joint_rollouts(TEAM, EXAMPLES, cfg, step=0)
    # each sequence learns from its agent's row, round 0's tokens as the revision's
    assert [s.question for s in sequences] == [q * 3 + i for (q, _, i, _), _ in calls]
    assert rewards.shape == (6, 2)
    vote = [1.1, 0.1]
    # rollout 0: agent 0 right -> right (2), agent 1 wrong -> right (1.5), agent 2 wrong (0);
    # rollout 1: agent 0 right -> wrong (0.5), the others wrong -> wrong
    own = [[2.0, 0.5], [1.5, 0.0], [0.0, 0.0]]
    for q in range(2):
        for i in range(3):
            expected = [vote[g] + own[i][g] for g in range(2)]
            assert rewards[q * 3 + i].tolist() == pytest.approx(expected)
    # the held-out accuracy is the vote's, one row per question
    _, right = train_magrpo.vote_rollouts(TEAM, EXAMPLES, cfg, step=0)
    assert right.flatten().tolist() == pytest.approx(vote + vote)


def test_the_revision_reward_is_refused_where_nothing_is_revised():
    ok = config(reward="revision", protocol="debate")
    train_magrpo.check(ok, 1)
    # the joint reward on one agent and no REFINE round (MAGRPO with one agent is GRPO)
    train_magrpo.check(config(agents=1, rounds=0, revision_bonus=0.0), 1)
    unrevised = "--reward revision rewards a revision: pass --protocol debate, --rounds >= 1"
    for bad, message in [
        (dict(protocol="parallel"), unrevised),
        (dict(rounds=0), unrevised),
        (dict(reward="mine"), "unknown --reward 'mine': choose one of vote, revision"),
        (dict(protocol="panel"), "unknown --protocol 'panel': choose one of parallel, debate"),
        (dict(revision_bonus=-0.1), "--revision-bonus -0.1: must be at least 0"),
    ]:
        with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
            train_magrpo.check(dataclasses.replace(ok, **bad), 1)


def test_check_passes_each_setting_to_its_check():
    ok = config()
    for bad, message in [
        (dict(agents=0), "--agents 0: must be at least 1"),
        (dict(rounds=-1), "--rounds -1: must be at least 0"),
        (dict(max_new_tokens=0), "--max-new-tokens 0: must be at least 1"),
        (
            dict(vote="bogus"),
            "unknown --vote 'bogus': choose one of min_prob, mean_prob, tail_prob, index",
        ),
        (dict(model="/"), "--model '/': not an HF checkpoint directory (no config.json)"),
        (dict(engine_batch_size=0), "--engine-batch-size 0: must be at least 1"),
        (dict(truncated="keep"), "unknown --truncated 'keep': choose one of zero, drop"),
    ]:
        with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
            train_magrpo.check(dataclasses.replace(ok, **bad), 1)


def test_held_out_rollouts_read_as_the_evaluation_and_reward_the_vote(monkeypatch):
    """vote_rollouts: an answer only the lenient reader finds counts (the training reward, strict,
    gives it 0), and the reward is the vote's whatever --reward says."""
    cfg = config(reward="revision", protocol="debate")
    scripted(monkeypatch, cfg, fixed_by_one)
    lenient = train_magrpo.sample

    def unfielded(*args):
        out = lenient(*args)
        for o in out:
            o.text = o.text.replace("Answer: ", "The answer is ")
        return out

    monkeypatch.setattr(train_magrpo, "sample", unfielded)
    _, right = train_magrpo.vote_rollouts(TEAM, EXAMPLES, cfg, step=0)
    assert right.flatten().tolist() == [1.0, 0.0, 1.0, 0.0]
    _, strict = train_magrpo.joint_rollouts(TEAM, EXAMPLES, config(), step=0)
    assert strict.flatten().tolist() == [0.0] * 4


def test_each_agent_answers_round_0_from_its_own_view(monkeypatch):
    """Task split: agent i's first prompt is the question as agent i sees it."""
    examples = data.load_task("split", split="test", n=2, seed=0, agents=3, held=2, share=1.0)
    cfg = config(protocol="parallel", task="split")
    calls = scripted(monkeypatch, cfg, lambda q, g, i, t: 1, examples=examples)
    train_magrpo.joint_rollouts(TEAM, examples, cfg, step=0)
    for (q, g, i, t), prompt in calls:
        assert prompt == solve_prompt(examples[q], cfg.trailer, i)
    # the three agents are told different things
    assert len({prompt for (q, g, _, _), prompt in calls if (q, g) == (0, 0)}) == 3
