"""The record every task loader returns, the error every loader raises on bad input, and the split
rule."""

import hashlib
from dataclasses import dataclass, field


def split_of(question: str) -> str:
    """ "test" for about 1 question in 6, decided by the text alone: stable across machines, files
    and arith levels, so a question in any test split is never in a train split."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 6 == 0 else "train"


class DataError(ValueError):
    """A data file is missing, malformed or empty. The message names the file (and the line when
    known)."""


@dataclass
class Example:
    """One question with its gold answer.

    question: the text shown to the agents (for multiple choice without the options; see render()).
    answer:   the gold answer as a string: "72", "0.75", "B", or a LaTeX string for task "math".
    task:     the answer kind the reward and the evaluation use ("arith", "gsm8k", "mawps",
              "svamp", "mc", "math").
    choices:  the four option texts A-D for multiple choice, else None.
    id:       stable identifier, e.g. "gsm8k/train/12" (task / file stem / line) or
              "arith/test/L1/5".
    meta:     free-form extras (arith: level, template, expr; gsm8k: solution; mawps: equation,
              ...).
    """

    question: str
    answer: str
    task: str
    choices: list[str] | None = None
    id: str = ""
    meta: dict = field(default_factory=dict)

    def render(self, agent=None) -> str:
        """The question as a prompt shows it: multiple-choice options appended as "A) ..." lines. A
        question whose facts are dealt among the agents (task split: meta["views"]) shows `agent`
        the facts it holds and the others as unknown; agent None, the facts every agent holds (what
        one outside the team, the leader, is told)."""
        question = self.question
        if "views" in self.meta:
            views = [set(view) for view in self.meta["views"]]
            held = views[agent] if agent is not None else set.intersection(*views)
            facts = self.meta["facts"]
            shown = [known if k in held else unknown for k, (known, unknown) in enumerate(facts)]
            question = " ".join([*shown, self.meta["query"]])
        if not self.choices:
            return question
        options = "\n".join(f"{letter}) {text}" for letter, text in zip("ABCD", self.choices))
        return f"{question}\n{options}"
