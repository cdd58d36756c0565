"""An agent's solution, as every script asks for it and reads it (docs/design.md §1, §2, §8), read
top to bottom:
1. Solution  - one agent's answer: its parse, profile and generation confidence
2. Prompts   - solve / refine / leader, and the answer trailer
3. The vote  - the team's majority vote over its solutions
4. The calls - the game's settings (GameConfig), the LLM calls that answer the prompts, round 0's
               calls
All that the LLM-weight trainers (train_solver.py, train_magrpo.py, train_mlpo.py) use of the game;
not the game itself: no state, policy, reward, critic pass, play or corpus (deliberate.py, which
reads this module).
"""

import math
import operator
import re
from dataclasses import dataclass, fields
from typing import NamedTuple

import data
from common import UsageError, call_seed, check_at_least, check_choice
from llm.team import as_team


# --------------------------------------------------------------------------------------------------
# 1. Solution: one agent's answer with its reasoning profile (docs/design.md §2)
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
    steps_checked: bool  # it writes steps and every one recomputes right (steps_check)
    missing_said: bool  # it says a value it needs is not known (says_missing)
    critic: float | None = None  # introspective confidence p(Correct) from the critic pass
    # log p of every sampled token under the untempered model (engine)
    token_logprobs: list | None = None
    confidence: float = 0.5  # what breaks vote ties: the signal the vote rule names (VOTE_RULES)

    @property
    def signals(self):
        return generation_confidence(self.token_logprobs)


# Generation confidence (docs/design.md §2; the paper has none): statistics of the probabilities the
# model gave the tokens it sampled, free with the text; 0.5 when unknown (a hand-made solution).
# The answer line ("Answer: 42" and EOS) is the last few tokens.
TAIL_TOKENS = 8
CONFIDENCE_SIGNALS = ("mean_prob", "min_prob", "tail_prob")


def generation_confidence(token_logprobs):
    """mean_prob = exp(mean log p), min_prob = the least likely token's probability, tail_prob =
    exp(mean log p) of the last TAIL_TOKENS (the answer)."""
    if not token_logprobs:
        return dict.fromkeys(CONFIDENCE_SIGNALS, 0.5)
    tail = token_logprobs[-TAIL_TOKENS:]
    return {
        "mean_prob": math.exp(sum(token_logprobs) / len(token_logprobs)),
        "min_prob": math.exp(min(token_logprobs)),
        "tail_prob": math.exp(sum(tail) / len(tail)),
    }


_STEPS_RE = re.compile(r"steps?\s*:\s*\**\s*(\d{1,3})", re.IGNORECASE)
_CONFIDENCE_RE = re.compile(r"confidence\s*:\s*\**\s*(\d{1,2}(?:\.\d)?)\s*(/\s*10)?", re.IGNORECASE)
_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*\S", re.IGNORECASE)
_OPERATION_RE = re.compile(r"\d\s*[-+*/×x÷]\s*\(?\$?\d")
_RESULT_RE = re.compile(r"=\s*\$?\s*(-?[\d,]*\.?\d+)")


def parse_solution(text, task, completion_tokens=0, token_logprobs=None, vote="index"):
    """A Solution from a completion (a garbled or missing trailer: defaults, trailer_ok False);
    `vote` (VOTE_RULES) names the signal that becomes its vote confidence."""
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
        # the confidence line is taken out first: `9/10` is no operation
        n_operations=len(_OPERATION_RE.findall(_CONFIDENCE_RE.sub("", text))),
        consistent=consistent,
        steps_checked=steps_check(text),
        missing_said=says_missing(text),
        token_logprobs=token_logprobs,
        confidence=0.5 if vote == "index" else generation_confidence(token_logprobs)[vote],
    )


def same_answer(a, b):
    return a.answer is not None and a.answer == b.answer


# A step as worked solutions write it, on a line of its own: `a op b = c` over integers.
STEP_RE = re.compile(r"^\s*(-?\d+)\s*([-+*×])\s*(-?\d+)\s*=\s*(-?\d+)\s*$", re.M)
_STEP_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "×": operator.mul}


def steps_check(text):
    """The text writes at least one step (STEP_RE) and every one is right: recomputing them
    catches a slip of arithmetic."""
    steps = STEP_RE.findall(text)
    return bool(steps) and all(_STEP_OPS[op](int(a), int(b)) == int(c) for a, op, b, c in steps)


def says_missing(text):
    """The text says a value it needs is not known: a split question's view (`(you do not know
    ...)`) or a solution's words for it (`Not known: ... I count it as 0.`)."""
    return _MISSING_RE.search(text) is not None


_MISSING_RE = re.compile(
    r"\bnot known\b|\b(?:do not|don't|does not|doesn't) know\b|\bunknown\b|\bnot given\b"
    r"|\bmissing\b",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------------------------------
# 2. Prompts (docs/design.md §2). Short: the 135M default backbone loses accuracy on every extra
# instruction, so the trailer is opt-in (GameConfig.trailer) and the state falls back to defaults
# without it.
# --------------------------------------------------------------------------------------------------
ANSWER_HINT = {
    "number": "a number",
    "mc": "the letter of the correct option",
    "math": "a LaTeX expression",
}
WORKED_EXAMPLE = (
    "Problem: Ann has 3 bags with 4 apples in each bag. She eats 2 apples. "
    "How many apples are left?\n3 * 4 = 12. 12 - 2 = 10.\nSteps: 2\nConfidence: 9/10\nAnswer: 10"
)
TRAILER = "Steps: <number of steps>\nConfidence: <0-10>/10\nAnswer: <{hint}>"


def hint(task):
    return ANSWER_HINT[data.answer_kind(task)]


def answer_request(example, trailer):
    if trailer:
        return (
            "Show short steps, then end with three lines:\n"
            f"{TRAILER.format(hint=hint(example.task))}"
        )
    return f"End with 'Answer: <{hint(example.task)}>'."


def solve_prompt(example, trailer=False, agent=None):
    """Round 0 of the game, the question as `agent` sees it (task split: the values it holds;
    Example.render). With `trailer`, one worked example of the Steps / Confidence / Answer
    trailer."""
    if trailer:
        return (
            f"Solve the problem. {answer_request(example, True)}\n\nExample:\n{WORKED_EXAMPLE}\n\n"
            f"Problem: {example.render(agent)}\n"
        )
    return f"{example.render(agent)}\n{answer_request(example, False)}"


def shown(solution, whole):
    """A solution as REFINE and the leader see it: whole, or its last 300 characters (the 135M
    backbone rambles on long prompts: docs/design.md, Deviations)."""
    return solution.text.strip() if whole else solution.text.strip()[-300:]


def refine_prompt(example, solutions, agent, trailer=False, whole=False):
    """REFINE: the LLM-Debate update from the agent's own solution and its peers' current solutions.
    By default the peers appear through their final answers only; with `whole`
    (GameConfig.whole_solutions) every solution appears whole, the own one included."""
    peers = [(j, s) for j, s in enumerate(solutions) if j != agent]
    if whole:
        whole_peers = "\n\n".join(f"Agent {j + 1}:\n{s.text.strip()}" for j, s in peers)
        others = f"Other agents' solutions:\n\n{whole_peers}\n\n"
    else:
        answers = [
            f"Agent {j + 1}: {'no answer' if s.answer is None else s.answer}" for j, s in peers
        ]
        others = f"Other agents' answers: {', '.join(answers)}.\n"
    return (
        f"{example.render(agent)}\n\nYour previous solution:\n{shown(solutions[agent], whole)}\n\n"
        f"{others}Check the solutions and solve the problem again. "
        f"{answer_request(example, trailer)}"
    )


def leader_prompt(example, solutions, trailer=False, whole=False):
    """MLPO's leader (docs/design.md §8) reads every peer's solution (as `shown`) and answers; told
    the question as one outside the team is (task split: the values every agent holds)."""
    team = "\n\n".join(f"Agent {j + 1}:\n{shown(s, whole)}" for j, s in enumerate(solutions))
    return (
        f"{example.render()}\n\nSolutions from {len(solutions)} agents:\n\n{team}\n\n"
        f"Check these solutions and solve the problem. {answer_request(example, trailer)}"
    )


def vanilla_prompt(example, agent=None):
    """A baseline's (eval.py vanilla): one answer to the question as `agent` sees it (task split:
    the values it holds)."""
    return f"{example.render(agent)}\nAnswer with {hint(example.task)}."


def cot_prompt(example, agent=None):
    """A baseline's (eval.py cot, sc): one chain-of-thought answer."""
    return (
        f"{example.render(agent)}\nThink step by step, then end with 'Answer: "
        f"<{hint(example.task)}>'."
    )


# --------------------------------------------------------------------------------------------------
# 3. The vote (docs/design.md §1): the game's final answer, and the consensus terms of the reward
# --------------------------------------------------------------------------------------------------
# The vote's tie-break signals: a generation-confidence signal, or "index" (ties to the lower agent
# index alone).
VOTE_RULES = ("min_prob", "mean_prob", "tail_prob", "index")


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

    def strength(a):
        return len(groups[a]), max(solutions[i].confidence for i in groups[a]), -min(groups[a])

    answer = max(groups, key=strength)
    return answer, min(groups[answer], key=lambda i: (-solutions[i].confidence, i))


def unanimous(solutions):
    """Every agent gave the same parsed answer."""
    return len({s.answer for s in solutions}) == 1 and solutions[0].answer is not None


# --------------------------------------------------------------------------------------------------
# 4. The calls: the game's settings and the LLM calls that answer its prompts
# --------------------------------------------------------------------------------------------------
@dataclass
class GameConfig:
    """The game's settings. A script builds it from its flags of the same names (a trainer that
    takes no flag for a setting plays at its default here); every function of the game reads these
    and nothing else of the script's flags."""

    # seeds every LLM call (with the question id, agent and round) and every sampled action
    seed: int = 0
    agents: int = 3
    # deliberation rounds after round 0 (0: round 0 only, the team's vote of independent answers)
    rounds: int = 3
    # the agents' sampling temperature and nucleus mass
    temperature: float = 0.5
    top_p: float = 1.0
    # token budget of each LLM call
    max_new_tokens: int = 192
    # ask for the Steps / Confidence / Answer trailer
    trailer: bool = False
    # run the critic pass: its p(Correct) in the state
    critic: bool = False
    # the vote's tie-break signal (VOTE_RULES)
    vote: str = "mean_prob"
    # REFINE and the leader read every solution whole, not peers' answers and last 300 characters
    whole_solutions: bool = False

    @classmethod
    def of(cls, flags):
        """The game's settings of a script that declares a flag of the same name for each of them
        (sft.py, train_rl.py, eval.py)."""
        return cls(**{f.name: getattr(flags, f.name) for f in fields(cls)})


def check_game(game, min_agents=2, min_rounds=1):
    """The game's settings, before anything is loaded: a mistake is one line (UsageError) naming
    the flag, not a traceback after minutes of work."""
    check_at_least(min_agents, agents=game.agents)
    check_at_least(min_rounds, rounds=game.rounds)
    check_at_least(0, temperature=game.temperature)
    check_at_least(1, max_new_tokens=game.max_new_tokens)
    if not 0 < game.top_p <= 1:
        raise UsageError(f"--top-p {game.top_p}: must be in (0, 1]")
    check_choice("--vote", game.vote, VOTE_RULES)


class Call(NamedTuple):
    """One LLM call of the game: `agent` answers `prompt` about `example`, seeded by `seed`."""

    example: data.Example
    prompt: str
    seed: int
    agent: int


def run_llm(engine, calls, cfg, temperature=None):
    """Calls -> [(Solution, prompt + completion tokens)], in one call per engine: `engine` is an
    Engine, or a llm.team.Team whose agents differ."""
    if not calls:
        return []
    completions = as_team(engine).generate(
        [c.prompt for c in calls],
        [c.seed for c in calls],
        [c.agent for c in calls],
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature if temperature is None else temperature,
        top_p=cfg.top_p,
    )
    return [
        (
            parse_solution(c.text, x.example.task, c.completion_tokens, c.token_logprobs, cfg.vote),
            c.prompt_tokens + c.completion_tokens,
        )
        for x, c in zip(calls, completions)
    ]


def solve_calls(examples, cfg):
    """Round 0: every agent solves every example (question-major)."""
    return [
        Call(ex, solve_prompt(ex, cfg.trailer, i), call_seed(cfg.seed, ex.id, i, 0, "solve"), i)
        for ex in examples
        for i in range(cfg.agents)
    ]


def per_question(flat, n):
    """A flat list of n items per question (question-major, as solve_calls makes them) -> lists."""
    return [flat[k : k + n] for k in range(0, len(flat), n)]
