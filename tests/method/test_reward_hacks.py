"""What a completion earns in training, worked by hand: the training reward reads only the `Answer:`
field the prompt asks for (data.strict_answer), and a rollout with a completion cut off at the token
budget earns nothing by accident (llm_step.rollout_update, --truncated zero or drop).

The planted hacks below are completions a model under RL finds when the reward reads leniently:
numbers repeated until the token cap ends the text, several answer lines, the answer in another
format, no answer at all (the evaluation's reader then takes the text's last number). Each is
written out with what it earns under the rule, and what it would earn with the rule switched off
(the evaluation's lenient reader as the reward, no truncation rule): the rule is what stands
between the hack and a gradient toward it. A well-formed right answer keeps its reward.
Run: python -m pytest -q tests/method/test_reward_hacks.py"""

from types import SimpleNamespace

import pytest
import torch

import data
import deliberate as D
import llm_step
import softrank
import train_magrpo
import train_mlpo
import train_solver
from common import Ranks, call_seed
from solutions import parse_solution, solve_prompt

EXAMPLE = data.Example(question="What is 2 + 3?", answer="5", task="arith", id="t/0")
# name -> (completion, how it ended: "eos" by itself, "length" at the token cap)
COMPLETIONS = {
    "well-formed": ("2 + 3 = 5\nAnswer: 5", "eos"),
    "numbers to the cap": ("5 5 5 5 5 5 5 5 5 5 5 5", "length"),
    "answer lines to the cap": ("Answer: 5\nAnswer: 5\nAnswer: 5\nAnswer: 5", "length"),
    "well-formed, cut off": ("2 + 3 = 5.\nAnswer: 5", "length"),
    "several answer lines": ("Answer: 4\nAnswer: 5", "eos"),
    "the answer is": ("2 + 3 is 5, so the answer is 5.", "eos"),
    "boxed": ("2 + 3 = \\boxed{5}", "eos"),
    "after the answer": ("Answer: 5\nor maybe 6, 5", "eos"),
    "a computation": ("Answer: 2 + 3 = 5", "eos"),
    "no answer": ("I count the apples: 5", "eos"),
}
HACKS = [name for name in COMPLETIONS if name != "well-formed"]
ALONE = Ranks(0, 1, torch.device("cpu"))


def test_what_each_reader_reads():
    """The strict reader reads the well-formed answer and the cut-off one (its text is well formed:
    the truncation rule, not the reader, stops it); every other hack is no answer to it, while the
    evaluation's lenient reader reads each one right."""
    strict = {name: data.strict_answer(text, "arith") for name, (text, _) in COMPLETIONS.items()}
    lenient = {name: data.extract_answer(text, "arith") for name, (text, _) in COMPLETIONS.items()}
    assert lenient == dict.fromkeys(COMPLETIONS, "5")
    assert strict == {name: "5" if "well-formed" in name else None for name in COMPLETIONS}
    only = [
        name for name, (text, _) in COMPLETIONS.items() if data.lenient_only(text, "5", "arith")
    ]
    assert only == [name for name in HACKS if name != "well-formed, cut off"]
    # other forms the prompt allows: a unit, currency, bold, a trailing period; the trailer's lines
    for text in ("Answer: 5 apples", "Answer: $5.", "**Answer:** 5", "Steps: 1\nAnswer: 5\n\n"):
        assert data.strict_answer(text, "arith") == "5", text
    assert data.strict_answer("Answer: (B)", "mc") == "B"
    assert data.strict_answer("Answer: B or C", "mc") is None
    assert data.strict_answer("Answer: \\boxed{\\frac{1}{2}}", "math") == "\\frac{1}{2}"


def sampled(names, cfg, seeds_of):
    """A sampler that answers each call with COMPLETIONS[names[k]], k the rollout its seed names
    (seeds_of: seed -> k), as the engine's Completions."""

    def sample(team, prompts, seeds, agents, asked):
        texts = [COMPLETIONS[names[seeds_of[seed]]] for seed in seeds]
        return [
            SimpleNamespace(text=text, token_ids=[1, 2], token_logprobs=None, finish=finish)
            for text, finish in texts
        ]

    return sample


def captured_update(monkeypatch, sequences, rewards, cfg):
    """llm_step.rollout_update with policy_step replaced by a recorder: (the sequences and
    advantages the step would train on, the logged statistics)."""
    seen = {}

    def policy_step(models, optimizer, sequences, advantages, **kw):
        seen.update(models=models, optimizer=optimizer, settings=kw)
        seen.update(sequences=sequences, advantages=advantages)
        return {"loss": 0.0, "kl": 0.0, "trained": len(sequences), "tokens": 0, "grad_norm": 0.0}

    monkeypatch.setattr(llm_step, "policy_step", policy_step)
    stats = llm_step.rollout_update(
        MODULES, "the optimizer", sequences, rewards, cfg, pad=5, ranks=ALONE, references="refs"
    )
    return seen, stats


MODULES = [torch.nn.Linear(1, 1)]


def test_the_update_steps_under_the_rollouts_flags(monkeypatch):
    """rollout_update passes the step its modules, optimizer and references, and the rollouts'
    flags: the aggregation, the KL weight, the sampling temperature (the log-probs'), the token
    budget, the micro-batch, the pad id, bf16 exactly under --train-dtype bfloat16; the group
    advantages at --tau (SoftRank's temperature changes them)."""
    sequences = [llm_step.Sequence(0, g, 0, [1], [2]) for g in range(3)]
    rewards = torch.tensor([[0.0, 1.0, 3.0]])
    flags = dict(loss_agg="seq", beta=0.3, rollout_temperature=0.7, max_new_tokens=40)
    cfg = train_mlpo.Config(**flags, micro_batch=3, train_dtype="bfloat16", algo="softrank")
    seen, _ = captured_update(monkeypatch, sequences, rewards, cfg)
    assert seen["models"] is MODULES and seen["optimizer"] == "the optimizer"
    assert seen["settings"] == dict(
        agg="seq", beta=0.3, temperature=0.7, max_len=40, micro_batch=3, pad=5, bf16=True,
        ranks=ALONE, references="refs",
    )  # fmt: skip
    softrank_of = {tau: softrank.softrank_advantages(rewards, tau) for tau in (0.5, 0.9)}
    assert torch.equal(seen["advantages"], softrank_of[0.5])
    seen, _ = captured_update(
        monkeypatch, sequences, rewards, train_mlpo.Config(algo="softrank", tau=0.9)
    )
    assert torch.equal(seen["advantages"], softrank_of[0.9]) and seen["settings"]["bf16"] is False


def test_the_truncation_rule_over_several_groups_logs_each_share(monkeypatch):
    """Three groups under --truncated drop: the first's every rollout cut off (it teaches nothing,
    a flat group); the second's kept rollouts differ (not flat); the third's kept rollouts tie, its
    cut-off one earned more (flat: the dropped reward is out of its statistics). The truncated
    share and the lenient-only share are over every completion of the step, one alone included."""
    S = llm_step.Sequence
    sequences = [
        S(0, 0, 0, [1], [2], truncated=True),
        S(0, 1, 0, [1], [2], truncated=True, lenient_only=True),
        S(1, 0, 0, [1], [2]),
        S(1, 1, 0, [1], [2], lenient_only=True),
        S(2, 0, 0, [1], [2]),
        S(2, 1, 0, [1], [2], truncated=True),
    ]
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    drop = train_mlpo.Config(truncated="drop")
    seen, stats = captured_update(monkeypatch, sequences, rewards, drop)
    assert seen["sequences"] == [sequences[2], sequences[3], sequences[4]]
    assert seen["advantages"].tolist() == [[0.0, 0.0], [-0.5, 0.5], [0.0, 0.0]]
    assert stats["frac_zero_std"] == 2 / 3 and stats["mean_reward"] == 1 / 3
    assert stats["truncated"] == 0.5 and stats["lenient_only"] == 2 / 6
    # a step of one completion, cut off and right only leniently
    one = [S(0, 0, 0, [1], [2], truncated=True, lenient_only=True)]
    _, stats = captured_update(monkeypatch, one, torch.tensor([[1.0]]), drop)
    assert stats["truncated"] == 1.0 and stats["lenient_only"] == 1.0


def magrpo_rollouts(monkeypatch, names, **flags):
    """MAGRPO's rollouts of one agent (GRPO) on EXAMPLE, rollout g answering
    COMPLETIONS[names[g]]."""
    cfg = train_magrpo.Config(
        agents=1, protocol="parallel", group=len(names), vote="index", **flags
    )
    seeds = {call_seed(cfg.seed, "agents", 0, EXAMPLE.id, g, 0, 0): g for g in range(cfg.group)}
    monkeypatch.setattr(train_magrpo, "sample", sampled(names, cfg, seeds))
    monkeypatch.setattr(train_magrpo, "prompt_ids", lambda team, prompt, i: [7])
    return cfg


@pytest.mark.parametrize("hack", HACKS)
def test_magrpo_pays_a_hack_nothing_and_a_well_formed_answer_its_reward(monkeypatch, hack):
    """One group: a well-formed right answer and the hack. Under the rule the hack earns 0 and its
    advantage is negative (the gradient leads away from it), the well-formed answer earns 1; with
    the rule switched off (the lenient reader, no truncation rule) both earn 1: a flat group, the
    hack as good as the answer."""
    cfg = magrpo_rollouts(monkeypatch, ["well-formed", hack])
    sequences, rewards = train_magrpo.joint_rollouts(None, [EXAMPLE], cfg, step=0)
    cut = COMPLETIONS[hack][1] == "length"
    assert [s.truncated for s in sequences] == [False, cut]
    assert [s.lenient_only for s in sequences] == [False, hack != "well-formed, cut off"]
    seen, stats = captured_update(monkeypatch, sequences, rewards, cfg)
    assert stats["mean_reward"] == 0.5 and stats["truncated"] == cut / 2
    assert stats["lenient_only"] == (hack != "well-formed, cut off") / 2
    assert seen["advantages"].tolist() == [[0.5, -0.5]]
    assert seen["sequences"] == sequences
    # the rule switched off: the lenient reader pays the hack as the answer
    _, lenient = train_magrpo.joint_rollouts(None, [EXAMPLE], cfg, step=0, read=data.extract_answer)
    assert lenient.tolist() == [[1.0, 1.0]]


def test_a_truncated_rollout_earns_zero_or_leaves_the_step(monkeypatch):
    """--truncated zero: the cut-off rollouts earn 0 before the advantages, though the strict reader
    reads the well-formed one right; --truncated drop: they leave the group's statistics (the group
    mean is the kept rollouts') and the loss (their sequences are not passed to the step)."""
    names = ["well-formed", "well-formed, cut off", "several answer lines", "numbers to the cap"]
    cfg = magrpo_rollouts(monkeypatch, names)
    sequences, rewards = train_magrpo.joint_rollouts(None, [EXAMPLE], cfg, step=0)
    assert rewards.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    seen, stats = captured_update(monkeypatch, sequences, rewards, cfg)
    assert seen["advantages"].tolist() == [[0.75, -0.25, -0.25, -0.25]]
    assert stats["truncated"] == 0.5 and stats["mean_reward"] == 0.25
    drop = magrpo_rollouts(monkeypatch, names, truncated="drop")
    seen, stats = captured_update(monkeypatch, sequences, rewards, drop)
    assert seen["sequences"] == [sequences[0], sequences[2]]
    assert seen["advantages"].tolist() == [[0.5, 0.0, -0.5, 0.0]]
    assert stats["mean_reward"] == 0.5 and stats["truncated"] == 0.5
    # a group whose every rollout is cut off teaches nothing, and logs so
    drop = magrpo_rollouts(
        monkeypatch, ["numbers to the cap", "well-formed, cut off"], truncated="drop"
    )
    sequences, rewards = train_magrpo.joint_rollouts(None, [EXAMPLE], drop, step=0)
    seen, stats = captured_update(monkeypatch, sequences, rewards, drop)
    assert seen["sequences"] == [] and seen["advantages"].tolist() == [[0.0, 0.0]]
    assert stats["frac_zero_std"] == 1.0 and stats["truncated"] == 1.0


def test_the_revision_reward_and_the_format_reward_read_strictly(monkeypatch):
    """--reward revision and --format-reward read the same field: an agent whose answer is right
    only leniently in round 1 earns the wrong -> wrong revision, and no format reward."""
    cfg = train_magrpo.Config(
        agents=1, rounds=1, group=2, reward="revision", format_reward=0.5, vote="index"
    )
    rounds = {0: "several answer lines", 1: "well-formed"}
    seeds = {
        call_seed(cfg.seed, "agents", 0, EXAMPLE.id, g, 0, t): g for g in range(2) for t in (0, 1)
    }
    names = {g: rounds[g] for g in range(2)}
    monkeypatch.setattr(train_magrpo, "sample", sampled(names, cfg, seeds))
    monkeypatch.setattr(train_magrpo, "prompt_ids", lambda team, prompt, i: [7])
    _, rewards = train_magrpo.joint_rollouts(None, [EXAMPLE], cfg, step=0)
    # rollout 0 hedges in both rounds: nothing; rollout 1 is right twice: vote 1 + format 0.5 + 2
    assert rewards.tolist() == [[0.0, 3.5]]


@pytest.mark.parametrize("hack", HACKS)
def test_mlpo_pays_the_leaders_hack_nothing(monkeypatch, hack):
    """The leader's rollouts (train_mlpo.leader_rollouts), with the format reward: the well-formed
    answer earns 1 + 0.5, the hack nothing (its advantage negative); the held-out accuracy reads as
    eval.py does, and counts both right."""
    names = ["well-formed", hack]
    cfg = train_mlpo.Config(agents=2, group=2, format_reward=0.5)
    seeds = {call_seed(cfg.seed, "leader", 0, EXAMPLE.id, g): g for g in range(2)}
    monkeypatch.setattr(train_mlpo, "sample", sampled(names, cfg, seeds))
    monkeypatch.setattr(train_mlpo, "prompt_ids", lambda team, prompt, i: [7])
    peers = [parse_solution("Answer: 5", "arith")] * 2
    sequences, rewards = train_mlpo.leader_rollouts(None, [(EXAMPLE, peers)], cfg, step=0)
    format_paid = 0.5 * (hack == "well-formed, cut off")
    assert rewards.tolist() == [[1.5, 1.0 * (hack == "well-formed, cut off") + format_paid]]
    seen, _ = captured_update(monkeypatch, sequences, rewards, cfg)
    assert seen["advantages"].tolist() == [[0.75, -0.75]]
    _, held_out = train_mlpo.held_out_rollouts(None, [(EXAMPLE, peers)], cfg, step=0)
    assert held_out.tolist() == [[1.5, 1.5]]


def test_rejection_sampling_keeps_only_well_formed_right_answers_that_ended(monkeypatch):
    """train_solver.py --solutions sampled: of every planted completion, only the well-formed right
    answer that ended by itself is a training solution."""
    names = list(COMPLETIONS)
    cfg = train_solver.Config(solutions="sampled", samples=len(names), questions=1, val_n=0)
    monkeypatch.setattr(train_solver, "training_questions", lambda c: ([EXAMPLE], []))

    class Engine:
        tokenizer = SimpleNamespace(eos_token_id=0)

        def chat(self, prompt):
            return prompt

        def encode(self, text):
            return [len(text)]

        def generate(self, prompts, seeds, **kw):
            texts = [COMPLETIONS[names[k]] for k in range(len(prompts))]
            return [SimpleNamespace(text=text, finish=finish) for text, finish in texts]

    kept = train_solver.right_solutions(Engine(), cfg, ALONE)
    assert kept == [([len(solve_prompt(EXAMPLE))], [len(COMPLETIONS["well-formed"][0]), 0])]


def test_the_meta_policys_corpus_pays_what_the_evaluation_counts():
    """The counterfactual corpus (train_rl.py) reads answers as the game and its evaluation do:
    the meta-policy learns which action to take in a game scored by that reader, and no weight that
    writes a completion learns from it, so a hack has no gradient to ride. A REFINE sample that
    hedges earns its REFINE what the team's vote counts (here the vote turns right), the same
    reward whether the text is well formed or not."""
    before = [parse_solution(text, "arith") for text in ("Answer: 4", "Answer: 4", "Answer: 5")]
    rewards = {}
    for name in ("well-formed", "several answer lines", "numbers to the cap"):
        # every agent's REFINE sample is drawn (train_rl.py's corpus): agents 1 and 2 keep theirs
        refined = {0: parse_solution(COMPLETIONS[name][0], "arith"), 1: before[1], 2: before[2]}
        move = D.Move(1, [], [D.PERSIST] * 3, before, before, refined, [0.0] * 3)
        rewards[name] = D.counterfactual_rewards(move, "5", "arith")[0][D.REFINE]
    # agent 0 mends its own answer (+1) and turns the vote (4, 4, 5 -> 5, 4, 5: +1)
    assert rewards == dict.fromkeys(rewards, 2.0)
