"""Tests of data/: answer extraction and comparison, the file loaders, and the arith generator.

Run from the repo root: python -m pytest -q tests/test_data.py  (a few seconds; the real-data tests
skip when /work/shared/data is absent).
"""

import ast
import hashlib
import json
import math
import random
import re
import sys
import time
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

# the repo root, wherever pytest runs from
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import data  # noqa: E402
from data import (  # noqa: E402
    DataError,
    Example,
    arith,
    extract_answer,
    is_correct,
    load_task,
    normalize_number,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# --------------------------------------------------------------------------------------------------
# extraction: numeric tasks


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: 42", "42"),
        ("answer:42", "42"),
        ("  ANSWER :  42  ", "42"),
        ("Steps: 3\nConfidence: 8/10\nAnswer: 42", "42"),
        ("Answer: 42\nSteps: 3\nConfidence: 8/10", "42"),
        # several trailers: last wins
        ("Answer: 41\nwait, I made a mistake\nAnswer: 42", "42"),
        # last trailer has no value
        ("Answer: 41\nAnswer:", "41"),
        ("Answer: 5 Answer: 6", "6"),
        ("Answer: $1,234.50", "1234.5"),
        ("Answer: 1,000,000", "1000000"),
        ("Answer: -5", "-5"),
        ("Answer: -$5", "-5"),
        ("Answer: \u22125", "-5"),  # unicode minus
        ("Answer: 12 apples", "12"),
        ("Answer: 5 km.", "5"),
        ("Answer: 50%", "50"),
        ("Answer: 3.50", "3.5"),
        ("Answer: 3/4", "0.75"),
        ("Answer: 1/3", "1/3"),
        ("Answer: 007", "7"),
        ("Answer: 12.", "12"),
        ("Answer: 48 + 24 = 72", "72"),
        ("**Answer:** 72", "72"),
        ("**Final Answer**: 72", "72"),
        ("Answer: \\boxed{72}", "72"),
        ("Answer: 42 (Confidence: 8/10)", "42"),
        ("Answer: forty-two\nSteps: 2\nConfidence: 5/10", None),
        ("so the total is $\\boxed{72}$.", "72"),
        ("\\boxed{1} first, then \\boxed{2}", "2"),
        ("\\boxed{\\frac{3}{4}}", "0.75"),
        ("\\boxed{-\\dfrac{1}{2}}", "-0.5"),
        ("\\boxed{{12}}", "12"),  # nested braces
        ("Therefore, the answer is 18.", "18"),
        ("The answer is 18. Check: 9 + 9 = 18, and 2 * 9 too.", "18"),
        ("The final answer is $-3$.", "-3"),
        ("He has 5 apples and buys 7, so 12", "12"),
        ("x = -4", "-4"),
        ("it takes 3.5 hours", "3.5"),
        # numbers inside words
        ("I used my mp3 player and drank H2O", None),
        ("COVID19 tests: 3", "3"),
        # empty trailer: fallback
        ("We get 17 in total.\nSteps: 2\nConfidence: 9/10\nAnswer:", "17"),
        # ... never the confidence
        ("Steps: 3\nConfidence: 8/10\nAnswer:", None),
        ("Steps: 3\nConfidence: 80%\nAnswer:", None),
        ("The result: 30\nConfidence (1-10): 7", "30"),
        ("Answer:\n42", "42"),
        # unclosed box: fallback
        ("the total is \\boxed{12", "12"),
        # overflows: not an answer
        ("Answer: 1e400", None),
        ("total 1,234,567 apples", "1234567"),
        ("", None),
        ("   \n\t  ", None),
        ("no numbers here", None),
    ],
)
def test_extract_numeric(text, expected):
    assert extract_answer(text, "gsm8k") == expected


@pytest.mark.parametrize("task", ["arith", "arith2", "gsm8k", "mawps", "svamp"])
def test_numeric_tasks_share_extraction(task):
    assert extract_answer("Steps: 2\nConfidence: 7/10\nAnswer: 1,024", task) == "1024"


def test_extract_none_and_type_errors():
    assert extract_answer(None, "gsm8k") is None
    with pytest.raises(TypeError):
        extract_answer(42, "gsm8k")
    with pytest.raises(ValueError, match="known tasks"):
        extract_answer("Answer: 1", "nope")
    with pytest.raises(ValueError, match="known tasks"):
        is_correct("1", "1", "nope")


# --------------------------------------------------------------------------------------------------
# extraction: multiple choice and MATH


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: (B)", "B"),
        ("Answer: b", "B"),
        ("Answer: C) 42", "C"),
        ("the answer is b", "B"),
        ("The answer is (c).", "C"),
        ("B) is right because ...", "B"),
        ("I choose option d.", "D"),
        ("\\boxed{A}", "A"),
        ("Answer: A\nhmm, no.\nAnswer: C", "C"),
        ("Answer: I think it is C", "C"),
        ("A) 1\nB) 2\nC) 3\nD) 4\n\nFinal answer:\nB", "B"),
        ("Answer: a dog is an animal", None),  # a lowercase article is not option A
        ("Answer: 42", None),
        ("", None),
    ],
)
def test_extract_mc(text, expected):
    assert extract_answer(text, "mc") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $\\boxed{\\frac{3}{4}}$", "\\frac{3}{4}"),
        ("\\boxed{\\sqrt{\\frac{1}{2}}}", "\\sqrt{\\frac{1}{2}}"),
        ("\\boxed{1} and finally \\boxed{ x^2+1 }", "x^2+1"),
        ("Answer: $x^2+1$.", "x^2+1"),
        ("no box, the result is 5", "5"),
        ("", None),
    ],
)
def test_extract_math(text, expected):
    assert extract_answer(text, "math") == expected


# --------------------------------------------------------------------------------------------------
# comparison


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("12", "12", True),
        ("12.0", "12", True),
        ("007", "7", True),
        ("1,234", "1234", True),
        ("$1,234.50", "1234.5", True),
        ("50%", "50", True),
        ("12 apples", "12", True),
        ("5 km", "5", True),
        ("12.", "12", True),
        ("-5", "-5", True),
        ("-5", "5", False),
        ("3/4", "0.75", True),
        ("0.75", "3/4", True),
        ("0.8333333", "0.8333333333333334", True),  # a rounded decimal matches (relative 1e-6)
        ("0.83", "5/6", False),
        ("1000001", "1000000", False),  # integers match exactly, even large ones
        ("12", "13", False),
        (12, "12", True),
        (None, "12", False),
        ("", "12", False),
        ("   ", "12", False),
        ("12", None, False),
        ("nan", "nan", False),  # nan and inf are always wrong
        ("NaN", "12", False),
        ("inf", "inf", False),
        ("-inf", "-inf", False),
        (float("nan"), float("nan"), False),
        (float("inf"), "inf", False),
        ("abc", "abc", False),
        ("12 + 3", "12", False),
    ],
)
def test_is_correct_numeric(pred, gold, expected):
    assert is_correct(pred, gold, "gsm8k") is expected


@pytest.mark.parametrize(
    "pred, gold, task, expected",
    [
        ("B", "B", "mc", True),
        ("b", "B", "mc", True),
        ("(B)", "B", "mc", True),
        ("C", "B", "mc", False),
        (None, "B", "mc", False),
        ("", "B", "mc", False),
        ("\\frac{3}{4}", "\\frac{3}{4}", "math", True),
        ("\\dfrac{3}{4}", "\\frac{3}{4}", "math", True),
        ("0.75", "\\frac{3}{4}", "math", True),
        ("x^2 + 1", "x^2+1", "math", True),
        ("5\\text{ cm}", "5", "math", True),
        ("2x", "2", "math", False),  # no unit stripping for MATH: 2x is not 2
        ("\\sqrt{2}", "\\sqrt{3}", "math", False),
        ("nan", "nan", "math", False),
        (None, "5", "math", False),
    ],
)
def test_is_correct_mc_math(pred, gold, task, expected):
    assert is_correct(pred, gold, task) is expected


@pytest.mark.parametrize(
    "s, expected",
    [
        ("$1,234.50", 1234.5),
        ("12 apples", 12.0),
        ("007", 7.0),
        ("-3", -3.0),
        ("3/4", 0.75),
        ("50%", 50.0),
        ("12.", 12.0),
        ("$-5", -5.0),
        ("-$5", -5.0),
        ("\\frac{3}{4}", 0.75),
        (" 42 ", 42.0),
        (7, 7.0),
        ("", None),
        ("nan", None),
        ("inf", None),
        ("abc", None),
        ("12 + 3", None),
        ("1,23", None),
        ("3/0", None),
        (None, None),
        (float("nan"), None),
        ("9" * 1000, None),
    ],
)
def test_normalize_number(s, expected):
    assert normalize_number(s) == expected


def test_long_adversarial_texts_are_fast():
    n = 100_000
    texts = [
        "1" * n,
        "Answer: " * (n // 8),
        "answer is " * (n // 10),
        "\\boxed{" * (n // 7),
        "{" * n,
        "Steps" + " " * n + "x",
        "Confidence:" + " " * n,
        "a1" * (n // 2),
        "1," * (n // 2),
        "(" * n,
        "-" * n,
        "A) " * (n // 3),
        "1 /" * (n // 3),
        "blah 7 " * (n // 7) + "\nAnswer: 42",
    ]
    start = time.perf_counter()
    for text in texts:
        for task in ("gsm8k", "mc", "math"):
            extract_answer(text, task)
        is_correct(text, "42", "gsm8k")
    assert extract_answer(texts[-1], "gsm8k") == "42"
    # ~1 s on a quiet machine, 15 s with the cores
    # busy; catastrophic backtracking would take minutes
    assert time.perf_counter() - start < 60.0


def test_extracted_answers_vote_as_strings():
    # canonical strings: equal values are equal strings, so the game's majority vote can count them
    outs = ["Answer: 1,234.0", "\\boxed{1234}", "the answer is $1234.00", "so 1234"]
    assert {extract_answer(o, "gsm8k") for o in outs} == {"1234"}


# --------------------------------------------------------------------------------------------------
# file loaders (small fixtures)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(path: Path, rows) -> Path:
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def test_gsm8k_fixture(tmp_path):
    p = _jsonl(
        tmp_path / "tiny.jsonl",
        [
            {"question": "How many?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"},
            {"question": "How much?", "answer": "a lot\n#### 1,234"},
        ],
    )
    ex = load_task("gsm8k", path=p)
    assert [e.answer for e in ex] == ["4", "1234"]
    assert ex[0].task == "gsm8k" and ex[0].id == "gsm8k/tiny/1" and ex[1].id == "gsm8k/tiny/2"
    assert ex[0].meta["solution"].startswith("2 + 2")
    assert is_correct(extract_answer("Answer: 1,234", "gsm8k"), ex[1].answer, "gsm8k")


@pytest.mark.parametrize(
    "content, line, words",
    [
        (
            '{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": \n',
            2,
            "malformed JSON",
        ),
        (
            '{"question": "q", "answer": "#### 1"}\n\n{"answer": "#### 2"}\n',
            3,
            "missing field 'question'",
        ),
        ('{"question": "q", "answer": "no final line"}\n', 1, "####"),
        ('{"question": "q", "answer": "#### many"}\n', 1, "not a number"),
        ('{"question": "", "answer": "#### 1"}\n', 1, "empty"),
        ('["question", "answer"]\n', 1, "JSON object"),
    ],
)
def test_gsm8k_errors_name_file_and_line(tmp_path, content, line, words):
    p = _write(tmp_path / "bad.jsonl", content)
    with pytest.raises(DataError) as err:
        load_task("gsm8k", path=p)
    assert f"{p}:{line}:" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize(
    "name, content",
    [
        ("empty.jsonl", ""),
        ("blank.jsonl", "\n  \n"),
        ("empty.json", "[]"),
        ("empty.csv", "question,answer\n"),
    ],
)
def test_empty_files_are_errors(tmp_path, name, content):
    p = _write(tmp_path / name, content)
    with pytest.raises(DataError, match=re.escape(str(p)) + ".*no examples"):
        load_task("gsm8k", path=p)


def test_missing_file_and_missing_path(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl.*not found"):
        load_task("gsm8k", path=tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="path"):
        load_task("gsm8k")
    with pytest.raises(DataError, match="unsupported file type"):
        load_task("gsm8k", path=_write(tmp_path / "x.txt", "hi"))
    with pytest.raises(ValueError) as unknown:
        load_task("gsm9k", path=tmp_path / "x.jsonl")
    assert str(unknown.value) == "unknown task 'gsm9k'; known tasks: " + ", ".join(data.TASKS)
    with pytest.raises(ValueError) as option:
        load_task("gsm8k", path=tmp_path / "x.jsonl", level=2, size=3)
    assert str(option.value) == "unexpected option(s) for task 'gsm8k': level, size"
    with pytest.raises(ValueError) as option:
        load_task("arith", fast=True, big=1)
    assert str(option.value) == "unexpected option(s) for task 'arith': big, fast (known: level)"


def test_svamp_fixture_and_errors(tmp_path):
    rows = [
        {
            "ID": "chal-1",
            "Body": "Jack has 8 pens.",
            "Question": "How many pens does he have?",
            "Answer": 8.0,
            "Equation": "( 8.0 )",
            "Type": "Addition",
        },
        {
            "ID": "chal-2",
            "Body": "A box has 2.5 kg.",
            "Question": "How much in 2 boxes?",
            "Answer": 5.0,
        },
    ]
    p = _write(tmp_path / "svamp.json", json.dumps(rows, indent=2))
    ex = load_task("svamp", path=p)
    assert ex[0].question == "Jack has 8 pens. How many pens does he have?"
    assert [e.answer for e in ex] == ["8", "5"] and ex[0].meta["id"] == "chal-1"
    # line numbers of elements in the list
    assert ex[0].meta["line"] == 2 and ex[1].meta["line"] > 2

    del rows[1]["Body"]
    p = _write(tmp_path / "svamp_missing.json", json.dumps(rows, indent=2))
    with pytest.raises(DataError) as err:
        load_task("svamp", path=p)
    assert f"{p}:{ex[1].meta['line']}:" in str(err.value) and "'body'" in str(err.value)

    p = _write(
        tmp_path / "svamp_bad.json",
        '[\n  {"Body": "a", "Question": "b", "Answer": 1},\n  {"Body": ]\n',
    )
    with pytest.raises(DataError, match=re.escape(f"{p}:3:") + ".*malformed JSON"):
        load_task("svamp", path=p)


def test_mc_jsonl_and_csv(tmp_path):
    p = _jsonl(
        tmp_path / "mc.jsonl",
        [
            {"question": "2+2?", "choices": ["3", "4", "5", "6"], "answer": 1},
            {
                "question": "Capital of France?",
                "A": "Rome",
                "B": "Oslo",
                "C": "Paris",
                "D": "Bern",
                "answer": "(c)",
            },
        ],
    )
    ex = load_task("mc", path=p)
    assert [e.answer for e in ex] == ["B", "C"] and ex[1].choices == [
        "Rome",
        "Oslo",
        "Paris",
        "Bern",
    ]
    assert ex[0].render().endswith("A) 3\nB) 4\nC) 5\nD) 6")
    assert is_correct(extract_answer("Answer: (b)", "mc"), ex[0].answer, "mc")

    p = _write(
        tmp_path / "mc.csv",
        'question,A,B,C,D,answer\n"Largest, by far?",1,2,3,"4\nfour",D\n2+2?,3,4,5,6,B\n',
    )
    ex = load_task("mc", path=p)
    assert (
        [e.answer for e in ex] == ["D", "B"]
        and ex[0].choices[3] == "4\nfour"
        and ex[1].meta["line"] == 4
    )


@pytest.mark.parametrize(
    "name, content, line, words",
    [
        ("bad.csv", "question,A,B,C,D,answer\nq,1,2,3,4,E\n", 2, "letter A-D"),
        ("bad.csv", "question,A,B,C,answer\nq,1,2,3,A\n", 2, "missing field 'd'"),
        ("bad.csv", "question,A,B,C,D,answer\nq,1,2,3,4,A\nq,1,2,,4,A\n", 3, "'c' is empty"),
        ("bad.jsonl", '{"question": "q", "choices": ["1", "2"], "answer": "A"}\n', 1, "list of 4"),
    ],
)
def test_mc_errors(tmp_path, name, content, line, words):
    p = _write(tmp_path / name, content)
    with pytest.raises(DataError) as err:
        load_task("mc", path=p)
    assert f"{p}:{line}:" in str(err.value) and words in str(err.value)


def test_math_fixture_and_errors(tmp_path):
    p = _jsonl(
        tmp_path / "math.jsonl",
        [
            {
                "problem": "Compute 3/4.",
                "solution": "It is $\\boxed{\\frac{3}{4}}$.",
                "level": "Level 1",
            },
            {
                "problem": "Root?",
                "solution": "first \\boxed{1}, no: $\\boxed{\\sqrt{\\frac{1}{2}}}$",
            },
        ],
    )
    ex = load_task("math", path=p)
    assert [e.answer for e in ex] == ["\\frac{3}{4}", "\\sqrt{\\frac{1}{2}}"] and ex[0].meta[
        "level"
    ] == "Level 1"
    assert is_correct(extract_answer("so \\boxed{\\dfrac{3}{4}}", "math"), ex[0].answer, "math")
    assert is_correct(extract_answer("Answer: 0.75", "math"), ex[0].answer, "math")

    p = _jsonl(
        tmp_path / "math_bad.jsonl",
        [{"problem": "p", "solution": "\\boxed{1}"}, {"problem": "p", "solution": "no box here"}],
    )
    with pytest.raises(DataError, match=re.escape(f"{p}:2:") + ".*boxed"):
        load_task("math", path=p)


MAWPS_HEADER = "Question,Numbers,Equation,Answer,group_nums,Body,Ques\n"


def test_mawps_fixture_keeps_rows_the_equation_supports(tmp_path):
    rows = [
        '"Bryan has number0 books on each of number1 shelves , how many ?",56.0 9.0,* number0 '
        "number1,504.0,[],b,q",
        '"A $ number0 toy and a $ number1 toy , total ?",2.5 1.0,+ number0 number1,3.5,[],b,q',
        # constant in equation
        '"Ann has number0 pies .",5.0,+ number0 1.0,6.0,[],b,q',
        # rounded answer
        '"Split number0 among number1 .",10.0 3.0,/ number0 number1,3.33,[],b,q',
        # number2 missing
        '"Has number0 and number2 .",1.0 2.0,+ number0 number1,3.0,[],b,q',
        # number1 not asked
        '"Has number0 only .",1.0 2.0,+ number0 number1,3.0,[],b,q',
        # malformed
        '"Broken number0 .",1.0,+ number0,1.0,[],b,q',
    ]
    p = _write(tmp_path / "mawps.csv", MAWPS_HEADER + "\n".join(rows) + "\n")
    ex = load_task("mawps", path=p)
    assert [e.answer for e in ex] == ["504", "3.5", "6"]
    assert ex[0].question == "Bryan has 56 books on each of 9 shelves, how many?"
    assert ex[1].question == "A $2.5 toy and a $1 toy, total?"
    stats = data.load_stats["mawps"]
    assert (stats["rows"], stats["kept"], stats["dropped"]) == (7, 3, 4)

    p = _write(tmp_path / "mawps_bad.csv", "Question,Numbers,Answer\nq,1.0,1.0\n")
    with pytest.raises(DataError, match=re.escape(f"{p}:2:") + ".*'equation'"):
        load_task("mawps", path=p)
    p = _write(tmp_path / "mawps_none.csv", MAWPS_HEADER + rows[3] + "\n")
    with pytest.raises(DataError, match="no usable rows"):
        load_task("mawps", path=p)


def test_subsets(tmp_path):
    p = _jsonl(
        tmp_path / "g.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(50)]
    )
    a = load_task("gsm8k", path=p, n=10, seed=3)
    assert [e.id for e in a] == [e.id for e in load_task("gsm8k", path=p, n=10, seed=3)]
    assert [e.id for e in a] != [e.id for e in load_task("gsm8k", path=p, n=10, seed=4)]
    assert len(load_task("gsm8k", path=p)) == 50 and len(load_task("gsm8k", path=p, n=50)) == 50
    with pytest.raises(ValueError, match="n=51.*only 50"):
        load_task("gsm8k", path=p, n=51)
    # the default seed is 0; n=0 is an empty subset; n is an int, not a float nor a bool
    assert [e.id for e in load_task("gsm8k", path=p, n=10)] == [
        e.id for e in random.Random(0).sample(load_task("gsm8k", path=p), 10)
    ]
    assert load_task("gsm8k", path=p, n=0) == []
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="n must be"):
            load_task("gsm8k", path=p, n=bad)


def test_file_splits_by_question_hash(tmp_path):
    p = _jsonl(
        tmp_path / "g.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(600)]
    )
    whole = load_task("gsm8k", path=p)
    assert [e.id for e in load_task("gsm8k", path=p, split="all")] == [e.id for e in whole]
    train, test = (
        load_task("gsm8k", path=p, split="train"),
        load_task("gsm8k", path=p, split="test"),
    )
    # a partition of the file, in file order, decided by the text alone (the rule arith's pools use)
    assert sorted(e.id for e in train + test) == sorted(e.id for e in whole)
    assert all(data.split_of(e.question) == "test" for e in test) and 60 < len(test) < 140
    assert {e.meta["split"] for e in test} == {"test"} and {e.meta["split"] for e in whole} == {
        "all"
    }
    assert all(
        data.split_of(e.question) == "test" for e in load_task("arith", split="test", level=1)[:200]
    )
    with pytest.raises(ValueError, match="all, train and test"):
        load_task("gsm8k", path=p, split="validation")


# --------------------------------------------------------------------------------------------------
# the real data sets (skipped where /work/shared/data is absent)


def test_gsm8k_real_file():
    path = SHARED / "gsm8k" / "train.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present")
    ex = load_task("gsm8k", path=path)
    assert len(ex) == 7473
    assert ex[0].answer == "72" and "Natalia" in ex[0].question
    assert all(normalize_number(e.answer) is not None and "," not in e.answer for e in ex)
    assert all(
        is_correct(extract_answer(f"...\nAnswer: {e.answer}", "gsm8k"), e.answer, "gsm8k")
        for e in ex
    )


def test_mawps_real_file():
    path = SHARED / "mawps_asdiv" / "train.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    ex = load_task("mawps", path=path)
    stats = data.load_stats["mawps"]
    assert stats["rows"] == 3138 and stats["kept"] == len(ex) == 3120 and stats["dropped"] == 18
    for e in ex:
        assert not re.search(r"number\d", e.question) and normalize_number(e.answer) is not None
        assert is_correct(extract_answer(f"Answer: {e.answer}", "mawps"), e.answer, "mawps")
    assert ex[0].question.startswith(
        "Bryan took a look at his books as well. If Bryan has 56 books"
    )
    test = load_task("mawps", path=path, split="test")
    assert len(test) == 507 and len(load_task("mawps", path=path, split="train")) == 3120 - 507


# --------------------------------------------------------------------------------------------------
# arith

# sha256 of the first 20 level-1 test questions joined by "\n". If this fails on one machine only,
# the generator is not deterministic there; if it fails after an edit of data/arith.py, the pools
# changed.
GOLDEN_L1_TEST = "999fd28d4fa17521c7b27723e93963838d02eb557baa6631716a9746a51f4e60"
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _eval(expr: str) -> Fraction:
    """Exact value of a +-*/ expression over integers (no eval())."""

    def ev(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unexpected {ast.dump(node)} in {expr!r}")

    return ev(ast.parse(expr, mode="eval").body)


def test_arith_golden_and_deterministic():
    first = load_task("arith", split="test", level=1)
    digest = hashlib.sha256("\n".join(e.question for e in first[:20]).encode("utf-8")).hexdigest()
    assert digest == GOLDEN_L1_TEST
    arith._pools.cache_clear()  # regenerate from scratch: the same stream gives the same pool
    again = load_task("arith", split="test", level=1)
    assert [(e.question, e.answer, e.id) for e in again] == [
        (e.question, e.answer, e.id) for e in first
    ]
    a = load_task("arith", split="train", n=64, seed=7)
    assert [e.id for e in a] == [e.id for e in load_task("arith", split="train", n=64, seed=7)]
    assert [e.id for e in a] != [e.id for e in load_task("arith", split="train", n=64, seed=8)]


def test_arith_pools_sizes_disjoint_and_unique():
    train, test = (
        load_task("arith", split="train", level="mix"),
        load_task("arith", split="test", level=0),
    )
    assert len(train) == 4 * 10000 and len(test) == 4 * 2000
    train_q, test_q = {e.question for e in train}, {e.question for e in test}
    # unique across all levels too
    assert len(train_q) == len(train) and len(test_q) == len(test)
    assert not train_q & test_q
    assert len({e.id for e in train + test}) == len(train) + len(test)


def test_arith_every_level_and_template_and_computable():
    allowed_constants = {2, 100}  # "half", "twice", "percent"
    for level in arith.LEVELS:
        pool = load_task("arith", split="test", level=level) + load_task(
            "arith", split="train", level=level, n=500, seed=level
        )
        assert {e.meta["template"] for e in pool} == set(arith.TEMPLATES)
        for e in pool:
            assert e.task == "arith" and e.meta["level"] == level and e.choices is None
            assert re.fullmatch(r"[0-9]+", e.answer), e
            assert _eval(e.meta["expr"]) == int(e.answer), e
            stated = {int(x) for x in re.findall(r"[0-9]+", e.question)}
            used = {int(x) for x in re.findall(r"[0-9]+", e.meta["expr"])}
            assert used <= stated | allowed_constants, e
            assert is_correct(
                extract_answer(f"So it is {e.answer}.\nAnswer: {e.answer}", "arith"),
                e.answer,
                "arith",
            )


def test_arith_levels_get_harder():
    def ops(e):
        return len(re.findall(r"[-+*/]", e.meta["expr"]))

    stats = {}
    for level in arith.LEVELS:
        pool = load_task("arith", split="test", level=level)
        stats[level] = (max(ops(e) for e in pool), sum(int(e.answer) for e in pool) / len(pool))
    assert stats[1][0] <= 2 and stats[4][0] >= 4
    assert stats[1][1] < stats[2][1] < stats[4][1]
    assert all(
        max(int(x) for x in re.findall(r"[0-9]+", e.question)) <= 60
        for e in load_task("arith", split="test", level=1)
    )


def test_arith_options():
    assert load_task("arith", split="test", n=5, seed=1) == load_task(
        "arith1", split="test", n=5, seed=1
    )
    assert {e.meta["level"] for e in load_task("arith3", split="test", n=50)} == {3}
    assert {e.meta["level"] for e in load_task("arith", split="test", level="mix")} == {1, 2, 3, 4}
    assert load_task("arith2", split="test", level=2, n=3) == load_task(
        "arith", split="test", level=2, n=3
    )
    with pytest.raises(ValueError, match="level 2"):
        load_task("arith2", level=3)
    with pytest.raises(ValueError, match="no path"):
        load_task("arith", path="x.jsonl")
    with pytest.raises(ValueError, match="level"):
        load_task("arith", level=5)
    with pytest.raises(ValueError, match="splits"):
        load_task("arith", split="validation")
    with pytest.raises(ValueError, match="unexpected option"):
        load_task("arith", levle=2)
    with pytest.raises(ValueError, match="only 2000"):
        load_task("arith", split="test", n=2001)


def test_example_defaults():
    e = Example(question="q", answer="1", task="arith")
    assert e.choices is None and e.meta == {} and e.render() == "q"
    assert math.isfinite(normalize_number(e.answer))


def test_trained_questions_are_the_questions_each_recorded_run_drew(tmp_path):
    """data.trained_questions: the union of each run's training slice (training_questions of its
    recorded settings; a setting it does not record is the scripts' default: no path, the task's
    default level), its validation slice left out; a run that does not say what it drew is refused
    and named by its out_dir when it has one."""
    arith = {"task": "arith", "seed": 3, "val_n": 2, "questions": 4}
    pool = data.load_task("arith", split="train", level=1)
    random.Random(3).shuffle(pool)
    assert data.trained_questions([arith]) == {e.question for e in pool[2:6]}
    later = arith | {"seed": 4, "level": 2}
    drew = data.training_questions(SimpleNamespace(path="", **later))[0]
    assert data.trained_questions([arith, later]) == {e.question for e in pool[2:6] + drew}
    assert data.trained_questions([]) == set()
    # a file task's record: its path; no level, which a file task would refuse
    rows = [{"question": f"How many {k}?", "answer": f"#### {k}"} for k in range(30)]
    gsm8k = {"task": "gsm8k", "path": str(_jsonl(tmp_path / "g.jsonl", rows)), "seed": 0}
    gsm8k |= {"val_n": 1, "questions": 2}
    drew = data.training_questions(SimpleNamespace(level=0, **gsm8k))[0]
    assert data.trained_questions([gsm8k]) == {e.question for e in drew}
    for record, origin in (
        ({"task": "arith", "seed": 0, "val_n": 2}, "unknown origin"),
        ({"seed": 0, "val_n": 2, "questions": 4, "out_dir": "runs/a"}, "runs/a"),
    ):
        with pytest.raises(data.DataError) as refused:
            data.trained_questions([record])
        assert str(refused.value) == (
            f"a training run of {origin} does not record which questions it drew (task, seed, "
            "val_n, questions)"
        )
