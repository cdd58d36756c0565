"""Worked solutions: a correct step-by-step solution to a training question, the target that
supervised agent training (train_solver.py --solutions worked) teaches.

    from data.worked import worked_solution
    worked_solution(example)   # "3 * 4 = 12\n12 - 2 = 10\nAnswer: 10"

The format is the one the solve prompt asks for: short steps, then `Answer: n` on the last line.
- arith: derived from the question's expression (meta["expr"]), one line per operation, in the
  order Python evaluates it (innermost first, left to right).
- gsm8k: the file's own rationale with its calculator annotations (`<<48/2=24>>`) removed.
- split: the values the agent holds stated, each one it lacks counted as 0, then the steps
  (data/split.py worked); with every value, the gold answer.
Other tasks carry no solution: WorkedSolutionMissing says so.
"""

import re

from .split import worked as split_worked
from .steps import expression_steps

CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")


class WorkedSolutionMissing(ValueError):
    """An example whose task carries no worked solution."""


def worked_solution(example, agent=None) -> str:
    """The worked solution of one example, ending in `Answer: <gold>`; task split: from the values
    `agent` holds (None: every one; data/split.py worked)."""
    if example.task == "split":
        return split_worked(example, agent)
    if example.task == "arith":
        steps, value = expression_steps(example.meta["expr"])
        return "\n".join([*steps, f"Answer: {value}"])
    if example.task == "gsm8k" and example.meta.get("solution"):
        text = CALCULATOR_ANNOTATION.sub("", example.meta["solution"])
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return "\n".join([*lines, f"Answer: {example.answer}"])
    raise WorkedSolutionMissing(
        f"task {example.task!r} carries no worked solution (arith and gsm8k do)"
    )
