"""What an agent knows in the game (docs/design.md §1, §2): its solution, the action space, the team
vote, and the meta-cognitive state vector the policy reads.

Read top to bottom:
  Actions   - PERSIST, REFINE, CONCEDE(k): the one home of the action encoding
  Solution  - one agent's current solution: parsed answer, self-reported and measured profile,
              confidence
  Vote      - the team's majority vote (the game's final answer)
  State     - the features of an agent's observation o_t^i = (own features, one row per peer)
"""

import math
import re
from dataclasses import dataclass

import data

# --------------------------------------------------------------------------------------------------
# Actions. For N agents there are K = 2 + (N - 1) actions: PERSIST, REFINE, then CONCEDE(k) to the
# k-th peer, the peers of agent i being the other agents in agent order (i itself left out).
# --------------------------------------------------------------------------------------------------
PERSIST, REFINE = 0, 1
ACTION_KINDS = ("persist", "refine", "concede")


def n_actions(agents):
    """K for a team of `agents`."""
    return 2 + (agents - 1)


def concede(k):
    """The action index of CONCEDE to the k-th peer."""
    return 2 + k


def peers_of(agent, agents):
    """The peers of `agent`, in the order their CONCEDE actions have."""
    return [j for j in range(agents) if j != agent]


def adopted_agent(agent, action, agents):
    """The agent whose solution `agent` adopts with a CONCEDE `action`."""
    return peers_of(agent, agents)[action - 2]


def action_kind(action):
    return ACTION_KINDS[min(action, 2)]


# --------------------------------------------------------------------------------------------------
# Solution: one agent's answer with its reasoning profile (docs/design.md §2)
# --------------------------------------------------------------------------------------------------
@dataclass
class Solution:
    text: str
    answer: str | None  # canonical answer string from data.extract_answer; None = unparseable
    steps: int | None  # self-reported `Steps:`
    self_confidence: float | None  # self-reported `Confidence: c/10`, as c/10
    trailer_ok: bool  # all three trailer lines were found
    completion_tokens: int
    n_operations: int  # arithmetic operations written out (`3 * 4`)
    consistent: bool  # the answer equals the last computed result shown (`... = 10`)
    critic: float | None = None  # introspective confidence p(Correct) from the critic pass
    # log p of every sampled token under the untempered model (engine)
    token_logprobs: list | None = None
    confidence: float = 0.5  # what breaks vote ties: the signal the vote rule names (VOTE_RULES)

    @property
    def signals(self):
        return generation_confidence(self.token_logprobs)


# Generation confidence (docs/design.md §2; the paper has none): statistics of the probabilities the
# model gave the tokens it sampled, free because the engine returns them with the text. Each is a
# probability in [0, 1]; 0.5 when unknown (a hand-made solution). On 240 round-0 arith solutions the
# minimum token probability told right from wrong best (AUROC 0.61-0.68; `eval.py` reports each
# signal's AUROC as confidence_auroc).
TAIL_TOKENS = 8  # the answer line ("Answer: 42" and EOS) is the last few tokens
CONFIDENCE_SIGNALS = ("mean_prob", "min_prob", "tail_prob")


def generation_confidence(token_logprobs):
    """{signal: value}: mean_prob = exp(mean log p), the geometric mean token probability;
    min_prob = the least likely token's probability; tail_prob = exp(mean log p) of the last
    TAIL_TOKENS, the answer."""
    if not token_logprobs:
        return dict.fromkeys(CONFIDENCE_SIGNALS, 0.5)
    tail = token_logprobs[-TAIL_TOKENS:]
    return {
        "mean_prob": math.exp(sum(token_logprobs) / len(token_logprobs)),
        "min_prob": math.exp(min(token_logprobs)),
        "tail_prob": math.exp(sum(tail) / len(tail)),
    }


# The vote rule (docs/design.md §1): majority; ties go to the higher confidence, then the lower
# agent index. The confidence is a generation-confidence signal, the same for every protocol (it
# costs no LLM call), or "index" (ties to the lower agent index alone).
VOTE_RULES = ("min_prob", "mean_prob", "tail_prob", "index")


def describe_vote(rule):
    return (
        "majority; ties to the lower agent index"
        if rule == "index"
        else f"majority; ties to the higher {rule} (generation confidence), then the lower agent "
        "index"
    )


_STEPS_RE = re.compile(r"steps?\s*:\s*\**\s*(\d{1,3})", re.IGNORECASE)
_CONFIDENCE_RE = re.compile(r"confidence\s*:\s*\**\s*(\d{1,2}(?:\.\d)?)\s*(/\s*10)?", re.IGNORECASE)
_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*\S", re.IGNORECASE)
_OPERATION_RE = re.compile(r"\d\s*[-+*/×x÷]\s*\(?\$?\d")
_RESULT_RE = re.compile(r"=\s*\$?\s*(-?[\d,]*\.?\d+)")


def parse_solution(text, task, completion_tokens=0, token_logprobs=None, vote="index"):
    """A Solution from a completion. A garbled or missing trailer gives defaults and
    trailer_ok=False. `vote` (one of VOTE_RULES) names the signal that becomes the solution's vote
    confidence."""
    if vote not in VOTE_RULES:
        raise ValueError(f"unknown vote rule {vote!r}: choose one of {', '.join(VOTE_RULES)}")
    answer = data.extract_answer(text, task)
    steps = [int(m) for m in _STEPS_RE.findall(text)]
    confidences = [float(c) for c, _ in _CONFIDENCE_RE.findall(text)]
    confidence = min(confidences[-1], 10.0) / 10 if confidences else None
    results = _RESULT_RE.findall(text)
    consistent = bool(results) and answer is not None and data.is_correct(answer, results[-1], task)
    return Solution(
        text=text,
        answer=answer,
        steps=steps[-1] if steps else None,
        self_confidence=confidence,
        trailer_ok=bool(steps and confidences and _ANSWER_LINE_RE.search(text)),
        completion_tokens=completion_tokens,
        n_operations=len(_OPERATION_RE.findall(_CONFIDENCE_RE.sub("", text))),  # not `9/10`
        consistent=consistent,
        token_logprobs=token_logprobs,
        confidence=0.5 if vote == "index" else generation_confidence(token_logprobs)[vote],
    )


def same_answer(a, b):
    return a.answer is not None and a.answer == b.answer


# --------------------------------------------------------------------------------------------------
# The vote (docs/design.md §1): the game's final answer, and the consensus terms of the reward
# --------------------------------------------------------------------------------------------------
def majority_vote(solutions, exclude=None):
    """(answer, agent) of the team vote. Unparseable answers never win; ties go to the higher
    confidence (Solution.confidence: the vote rule's signal), then to the lower agent index. (None,
    None) when no answer parses."""
    groups = {}
    for i, s in enumerate(solutions):
        if i != exclude and s.answer is not None:
            groups.setdefault(s.answer, []).append(i)
    if not groups:
        return None, None
    answer = max(
        groups,
        key=lambda a: (
            len(groups[a]),
            max(solutions[i].confidence for i in groups[a]),
            -min(groups[a]),
        ),
    )
    return answer, min(groups[answer], key=lambda i: (-solutions[i].confidence, i))


# --------------------------------------------------------------------------------------------------
# The meta-cognitive state: what the policy sees of one solution (never the raw answer value, only
# its relations to the others)
# --------------------------------------------------------------------------------------------------
PROFILE_FEATURES = (
    "parse_ok",  # the answer could be extracted
    "trailer_ok",  # the Steps / Confidence / Answer trailer was complete
    "steps",  # self-reported steps / 10, clipped to 1 (0 when missing)
    "self_confidence",  # self-reported confidence in [0, 1] (0.5 when missing)
    "critic",  # p(Correct) from the critic pass (0.5 when not measured)
    "mean_prob",  # generation confidence: geometric mean probability of the sampled tokens
    "min_prob",  # generation confidence: probability of the least likely sampled token
    # generation confidence: geometric mean probability of the last 8 tokens (the answer)
    "tail_prob",
    "length",  # completion tokens / 256, clipped to 1
    "operations",  # arithmetic operations shown / 10, clipped to 1
    "consistent",  # the answer equals the last computed result shown
)
OWN_FEATURES = PROFILE_FEATURES + (
    "peer_agreement",  # fraction of peers with the same (parsed) answer
    "is_majority",  # own answer is the current team vote
    "round",  # t / R
    "changed_last",  # own answer changed in the previous round
    "last_none",
    "last_persist",
    "last_refine",
    "last_concede",  # previous action, one-hot
)
PEER_FEATURES = PROFILE_FEATURES + (
    "same_as_me",  # this peer's answer equals mine
    "peer_is_majority",  # this peer's answer is the current team vote
    "peer_changed_last",
)


def profile(solution):
    """PROFILE_FEATURES of one solution, in that order."""
    s, signals = solution, solution.signals
    return [
        float(s.answer is not None),
        float(s.trailer_ok),
        min((s.steps or 0) / 10, 1.0),
        s.self_confidence if s.self_confidence is not None else 0.5,
        s.critic if s.critic is not None else 0.5,
        *(signals[k] for k in CONFIDENCE_SIGNALS),
        min(s.completion_tokens / 256, 1.0),
        min(s.n_operations / 10, 1.0),
        float(s.consistent),
    ]


def observe(solutions, agent, round_index, rounds, changed, last_actions):
    """Agent `agent`'s observation o_t^i = (own features, one feature row per peer), at round index
    `round_index` of `rounds`; `changed` and `last_actions` describe every agent's previous
    round."""
    vote, _ = majority_vote(solutions)
    own = solutions[agent]
    peers = peers_of(agent, len(solutions))
    last = last_actions[agent]
    last_onehot = [float(last is None)] + [
        float(last is not None and action_kind(last) == k) for k in ACTION_KINDS
    ]
    own_features = (
        profile(own)
        + [
            sum(same_answer(own, solutions[j]) for j in peers) / len(peers),
            float(own.answer is not None and own.answer == vote),
            round_index / rounds,
            float(changed[agent]),
        ]
        + last_onehot
    )
    peer_features = [
        profile(solutions[j])
        + [
            float(same_answer(own, solutions[j])),
            float(solutions[j].answer is not None and solutions[j].answer == vote),
            float(changed[j]),
        ]
        for j in peers
    ]
    return own_features, peer_features
