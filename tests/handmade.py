"""Hand-built pieces that several test files share.

sol          - a Solution built from an answer, for the vote and the rewards
magrpo_step  - llm_step.policy_step as train_magrpo.py calls it, on rank 0 of 1 on the CPU
SeedEngine   - play()'s engine as a lookup of each call's reply by its seed (replies builds one)
Script       - a policy that plays a script of (decision round, agent) -> action
ByRound      - a policy that reads its round from the state: a replayed game meets the same plan
"""

import torch

import deliberate as D
import solutions
from common import Ranks, call_seed
from llm.engine import Completion
from llm_step import policy_step


def sol(answer, confidence=0.5, text=None):
    """A hand-built Solution for vote / reward tests; `confidence` is what breaks vote ties."""
    text = text or (f"Answer: {answer}" if answer is not None else "no idea")
    s = solutions.parse_solution(text, "arith", completion_tokens=10)
    s.confidence = confidence
    return s


def magrpo_step(models, optimizer, sequences, advantages, cfg, pad):
    """One step of train_magrpo.py's `cfg` (its aggregation, KL weight, budget and micro-batch) at
    the rollouts' temperature 1, in fp32, one process."""
    return policy_step(
        models,
        optimizer,
        sequences,
        advantages,
        agg=cfg.loss_agg,
        beta=cfg.beta,
        temperature=1.0,
        max_len=cfg.max_new_tokens,
        micro_batch=cfg.micro_batch,
        pad=pad,
        bf16=False,
        ranks=Ranks(0, 1, torch.device("cpu")),
    )


class SeedEngine:
    """The engine's interface for play(): each call's reply (answer, completion tokens) is looked up
    by its seed, the game's call_seed(seed, question, agent, round, purpose)."""

    def __init__(self, replies):
        self.replies, self.calls = replies, 0

    def chat(self, user):
        return user

    def encode(self, prompt):
        return prompt.split()

    def generate(self, prompts, seeds, **kw):
        self.calls += len(prompts)
        return [Completion(f"Answer: {a}", 0, n, "eos") for a, n in map(self.replies.get, seeds)]


def replies(qid, solve, refine=()):
    """solve: agent -> round-0 answer; refine: (round, agent) -> (answer, tokens of that call)."""
    out = {call_seed(0, qid, i, 0, "solve"): (a, 5) for i, a in solve.items()}
    out.update({call_seed(0, qid, i, t, "refine"): r for (t, i), r in dict(refine).items()})
    return out


class Script:
    """A policy that plays a script: `choose(t, agent)` is the action of `agent` in decision round t
    (the t-th call of act)."""

    reads_critic = False

    def __init__(self, choose):
        self.choose, self.t = choose, 0

    def act(self, own, peers, agent_index, uniforms, greedy=True):
        self.t += 1
        return [self.choose(self.t, int(i)) for i in agent_index]


class ByRound:
    """A policy that plays plan[t][agent] in round t, read from the state (its round feature), so
    that a game played again with an action forced meets the same plan."""

    reads_critic = False

    def __init__(self, plan, rounds):
        self.plan, self.rounds = plan, rounds

    def act(self, own, peers, agent_index, uniforms, greedy=True):
        # the corpus's games and their branches sample the behaviour policy
        assert greedy is False
        t = [round(float(o[D.OWN_FEATURES.index("round")]) * self.rounds) + 1 for o in own]
        return [self.plan[r][int(i)] for r, i in zip(t, agent_index)]
