"""Worked solutions (data/worked.py): every written solution ends in the gold answer, in the form
the game's answer extraction reads, and each of its steps computes right."""

import re
from fractions import Fraction
from pathlib import Path

import pytest

import data
from data import arith
from data.worked import WorkedSolutionMissing, expression_steps, worked_solution

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
STEP = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)$")
APPLY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: Fraction(a, b),
}


def check_arith_solution(ex):
    text = worked_solution(ex)
    *steps, last = text.split("\n")
    assert last == f"Answer: {ex.answer}"
    assert data.extract_answer(text, "arith") == ex.answer
    # one line per operation of the question's expression
    assert len(steps) == sum(ex.meta["expr"].count(op) for op in "+-*/")
    for line in steps:
        a, op, b, c = STEP.match(line).groups()
        assert APPLY[op](int(a), int(b)) == int(c), line
    # the last step computes the answer
    assert STEP.match(steps[-1]).group(4) == ex.answer


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_arith_solution_is_right_on_every_template_and_level(split):
    seen = set()
    for ex in arith.load(split, "mix"):
        check_arith_solution(ex)
        seen.add((ex.meta["template"], ex.meta["level"]))
    assert seen == {(t, lv) for t in arith.TEMPLATES for lv in arith.LEVELS}


def test_steps_follow_the_evaluation_order():
    steps, value = expression_steps("(3 + 4) * 2 - 10 / 5")
    assert steps == ["3 + 4 = 7", "7 * 2 = 14", "10 / 5 = 2", "14 - 2 = 12"]
    assert value == "12"
    assert expression_steps("7") == ([], "7")


@pytest.mark.parametrize(
    "expr, says",
    [
        ("7 / 2", "7/2 is not a whole number"),
        ("3 ** 2", "only whole numbers and"),
        ("x + 1", "only whole numbers and"),
        ("4 / 0", "'4 / 0' divides by zero"),
        ("2.5 + 1", "only whole numbers and"),
    ],
)
def test_expressions_beyond_whole_number_arithmetic_are_refused(expr, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        expression_steps(expr)


def test_gsm8k_solution_drops_the_calculator_annotations():
    ex = data.Example(
        question="q",
        answer="72",
        task="gsm8k",
        meta={"solution": "She sold 48/2 = <<48/2=24>>24 clips.\n\n48+24 = <<48+24=72>>72 in all."},
    )
    assert worked_solution(ex) == "She sold 48/2 = 24 clips.\n48+24 = 72 in all.\nAnswer: 72"


def test_tasks_without_solutions_say_so():
    ex = data.Example(question="q", answer="3", task="svamp")
    with pytest.raises(WorkedSolutionMissing, match="svamp"):
        worked_solution(ex)


@pytest.mark.skipif(not (SHARED / "gsm8k").exists(), reason="no ../shared/data/gsm8k here")
def test_every_gsm8k_solution_ends_in_its_gold_answer():
    examples = data.load_task("gsm8k", path=SHARED / "gsm8k" / "train.jsonl")
    for ex in examples:
        text = worked_solution(ex)
        assert "<<" not in text and ">>" not in text
        assert data.is_correct(data.extract_answer(text, "gsm8k"), ex.answer, "gsm8k"), ex.id
