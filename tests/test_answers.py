"""Edge cases of answer extraction and comparison (data/answers.py), task by task.

Each table pins one thing a student would check by hand: "1\\,000" is 1000, "1e-25" is written out,
"€-5" is negative, "Answer: **b**" is option B, "\\dfrac{\\pi}{2}" is "\\frac{\\pi}{2}", "2X" is
not 2 in MATH, a bool or "-inf" is never an answer. tests/test_data.py holds the common cases; these
are the corners the mutation run (experiments/mutation.py answers) found untested.

Run from the repo root: python -m pytest -q tests/test_answers.py  (well under a second).
"""

import sys
from pathlib import Path

import pytest

# the repo root, wherever pytest runs from
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.answers import (  # noqa: E402
    extract_answer,
    is_correct,
    normalize_number,
    strict_answer,
)

# 2·(5·2^60 + 1): its odd part rounds to 5·2^60 as a float, so only integer arithmetic keeps 1/BIG
# a fraction (a float would find the powers of 2 and 5 only and write a wrong decimal)
BIG = 2 * (5 * 2**60 + 1)


# --------------------------------------------------------------------------------------------------
# numeric tasks: the canonical string of an extracted number


@pytest.mark.parametrize(
    "text, expected",
    [
        # decimals whose denominator holds 5s: 1/5, 1/25 (two 5s), 21/20 (2s and a 5)
        ("Answer: 1/5", "0.2"),
        ("Answer: 0.04", "0.04"),
        ("Answer: 1.05", "1.05"),
        ("Answer: 0.125", "0.125"),
        # scientific notation is written out exactly, however many digits it takes
        ("Answer: 1e-25", "0." + "0" * 24 + "1"),
        (f"Answer: 1/{BIG}", f"1/{BIG}"),  # no finite decimal: stays a fraction
        ("Answer: 6/1", "6"),  # a denominator of 1 is a whole number, not an invalid token
        ("Answer: 2.5/5", "0.5"),  # a decimal numerator over a denominator
        # blanks around "/" are part of the token
        ("Answer: 3 / 4", "0.75"),
        ("Answer: 3\t/\t4", "0.75"),
        # LaTeX around the number
        ("Answer: 1\\,000", "1000"),  # a thin space as thousands separator
        ("Answer: \\$12", "12"),
        ("Answer: -\\$5", "-5"),  # an escaped dollar after the minus sign keeps the sign
        ("Answer: \\text{12 apples}", "12"),  # a number inside \text{} is still read
        ("Answer: \\text{Rs. }500", "500"),  # a currency in \text{} before the number
        # inside one "Answer:" span
        ("Answer: 4 bags of 3, so \\boxed{12}", "12"),  # the box wins over earlier numbers
        ("Answer: x = 3 + 4 = 7", "7"),  # the result after the last "="
        # several "Answer:" trailers: the last one that holds a value
        ("Answer: 41\nAnswer: 42\nAnswer:", "42"),
        ("Answer: 4 Answer: 5 Answer:", "5"),  # on one line: each value ends at the next trailer
        # a "step:" label is blanked as a trailer field, and the "-7" after it stays negative
        ("The last step: -7", "-7"),
        # a confidence written without its leading zero is a trailer field, not the answer (it was
        # read as the answer 0.9 before the trailer pattern took ".9")
        ("The total is 12.\nConfidence: .9", "12"),
        ("The total is 12.\nConfidence: .9/1", "12"),
    ],
)
def test_extract_numeric_canonical(text, expected):
    assert extract_answer(text, "gsm8k") == expected


def test_number_length_limit_counts_digits_not_the_sign():
    # 64 characters is the longest number read; a leading minus does not count against it
    assert normalize_number("9" * 64) == 1e64
    assert normalize_number("9" * 65) is None
    assert extract_answer("Answer: -" + "9" * 64, "gsm8k") == "-" + "9" * 64


def test_errors_name_the_problem():
    with pytest.raises(TypeError, match="expects a str completion, got int"):
        extract_answer(42, "gsm8k")
    with pytest.raises(ValueError, match=r"known tasks: arith, arith1, .*, svamp, mc, math$"):
        extract_answer("Answer: 1", "nope")


# --------------------------------------------------------------------------------------------------
# multiple choice and MATH extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: **b**", "B"),  # markdown bold around a lowercase letter
        ("Answer: `c`", "C"),  # ... or code quotes
        ("Answer: \\text{B}", "B"),
        ("Answer: not A but (C)", "C"),  # a letter in parentheses beats a bare capital before it
        ("Answer: b Answer:", "B"),  # a later, empty trailer on the same line is skipped
    ],
)
def test_extract_mc_edge_cases(text, expected):
    assert extract_answer(text, "mc") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("**Answer:** $x^2+1$", "x^2+1"),  # bold markers and $ delimiters go
        ("Answer: 2X", "2X"),  # a capital X is part of the answer, not something to strip
        ("Answer: 2X.", "2X"),  # the sentence's full stop goes
    ],
)
def test_extract_math_trailer(text, expected):
    assert extract_answer(text, "math") == expected


# --------------------------------------------------------------------------------------------------
# comparison


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("\\$1,234", "1234", True),
        ("1\\,000", "1000", True),
        ("12", "12 apples", True),  # the gold may carry a unit too
        ("12", "12\\text{ apples}", True),
        # a rounded decimal matches an integer within REL_TOL; only two integers must be exact
        ("2.9999999", "3", True),
        ("2.99", "3", False),
        # near zero the relative tolerance is useless: ABS_TOL decides
        ("1e-10", "0", True),
        ("0.001", "0", False),
    ],
)
def test_is_correct_numeric_edge_cases(pred, gold, expected):
    assert is_correct(pred, gold, "gsm8k") is expected


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("$0.5$", "\\frac{1}{2}", True),  # $...$ around a number: still compared as numbers
        ("50\\%", "50", True),  # a percent sign is allowed after a MATH number
        ("50", "50\\%", True),
        ("50%", "50", True),
        ("\\dfrac{\\pi}{2}", "\\frac{\\pi}{2}", True),  # \dfrac and \tfrac are \frac
        ("\\tfrac{1}{x}", "\\frac{1}{x}", True),
        ("\\sqrt{2}.", "\\sqrt{2}", True),  # a trailing full stop is no part of the answer
        ("$\\sqrt{2}$", "\\sqrt{2}", True),
        # no unit stripping in MATH, on either side, whatever the case of the variable
        ("2X", "2", False),
        ("2", "2x", False),
        # "-inf" and "+nan" are never answers, not even as LaTeX strings
        ("-inf", "-inf", False),
        ("+nan", "+nan", False),
    ],
)
def test_is_correct_math_edge_cases(pred, gold, expected):
    assert is_correct(pred, gold, "math") is expected


@pytest.mark.parametrize(
    "pred, gold, task",
    [
        # a bool is no answer (its text "True" would otherwise equal itself as a MATH string)
        (True, True, "math"),
        (True, "True", "math"),
        (True, 1, "gsm8k"),
        # a caller's mistake (a list) is a wrong answer, not a crash
        (["12"], "12", "gsm8k"),
        ("12", ["12"], "math"),
        # a capital glued to another is part of a word, not an option
        ("BX", "B", "mc"),
    ],
)
def test_is_correct_rejects_non_answers(pred, gold, task):
    assert is_correct(pred, gold, task) is False


@pytest.mark.parametrize(
    "s, expected",
    [
        ("+5", 5.0),
        ("- 5", -5.0),  # a blank after the sign
        # currency signs other than "$" (which is stripped like a LaTeX delimiter)
        ("€5", 5.0),
        ("£3.50", 3.5),
        ("¥1,000", 1000.0),
        ("€ 5", 5.0),
        ("+$20", 20.0),  # a sign before the currency
        ("€-5", -5.0),  # ... or after it
        ("€+5", 5.0),
        ("€ - 5", -5.0),
        ("\\text{12 apples}", 12.0),
        (True, None),  # bool is an int to Python, not a number here
        (False, None),
    ],
)
def test_normalize_number_signs_and_currencies(s, expected):
    assert normalize_number(s) == expected


# --------------------------------------------------------------------------------------------------
# the training reward's strict reader: the one `Answer:` field on the last line, one value
@pytest.mark.parametrize(
    "text, task, expected",
    [
        ("Answer: 5", "arith", "5"),
        ("2 + 3 = 5\nAnswer: 5\n\n", "arith", "5"),
        # any text after the answer line, a trailing newline or not
        ("Answer: 5\nand more words\n", "arith", None),
        ("Answer: 5\nand more words", "arith", None),
        ("Answer: 5 apples", "arith", "5"),
        ("Answer: 4 + 1", "arith", None),
        ("Answer: (C)", "mc", "C"),
        ("Answer: C, or D", "mc", None),
        # math: a value as written, its $ delimiters and a final period taken off, a box opened
        ("Answer: $x^2$.", "math", "x^2"),
        ("Answer: 3X.", "math", "3X"),
        ("Answer: X+1", "math", "X+1"),
        ("Answer: \\boxed{\\frac{1}{2}}", "math", "\\frac{1}{2}"),
        ("Answer: y = \\boxed{3}", "math", "y = \\boxed{3}"),
        ("Answer: $", "math", None),
    ],
)
def test_strict_answer(text, task, expected):
    assert strict_answer(text, task) == expected
