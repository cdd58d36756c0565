"""The ceiling of a team-wide stopping rule (experiments/stop_ceiling.py): per question the best of
the stopping protocols, paired against freeze, on tables written by hand."""

import json

import pytest

from common import FileRefused
from experiments import stop_ceiling as C


def summary(correct, ids=("a", "b", "c", "d")):
    return {"question_ids": list(ids), "correct": list(correct)}


def test_a_question_is_right_when_any_stop_is_right_there():
    best = C.best_of([summary([1, 0, 0, 0]), summary([0, 0, 1, 0]), summary([1, 0, 0, 0])])
    assert best == summary([True, False, True, False])


def test_questions_are_matched_by_id_not_by_position():
    best = C.best_of([summary([1, 0, 0, 0]), summary([0, 0, 0, 1], ids=("d", "c", "b", "a"))])
    assert best["correct"] == [True, False, False, False]


def test_tables_of_other_questions_are_refused():
    with pytest.raises(FileRefused):
        C.best_of([summary([1, 0, 0, 0]), summary([1, 0, 0, 0], ids=("a", "b", "c", "e"))])


def write(tmp_path, seed, name, correct):
    table = {"config": {}, name: summary(correct) | {"accuracy": sum(correct) / 4}}
    (tmp_path / f"s{seed}-{name}.json").write_text(json.dumps(table))


def test_the_ceiling_over_seeds_and_its_paired_difference_to_freeze(tmp_path, capsys):
    # seed 0: the stops are right on a, b, c (0.75), freeze on a (0.25); seed 1: the stops on a
    # alone (0.25), freeze on a and d (0.50). Pooled: 4/8 against 3/8, +0.125; per seed 0.75, 0.25
    stops = {0: ([1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]), 1: ([1, 0, 0, 0],) * 4}
    for seed, tables in stops.items():
        for name, correct in zip(C.STOPS, tables, strict=True):
            write(tmp_path, seed, name, correct)
    write(tmp_path, 0, "freeze", [1, 0, 0, 0])
    write(tmp_path, 1, "freeze", [1, 0, 0, 1])
    C.main([str(tmp_path / "s0"), str(tmp_path / "s1")])
    out = capsys.readouterr().out
    assert "per question: 0.500 ± 0.354 (2 seeds)" in out
    assert "vs freeze +0.125 [" in out and "(3)" in out
