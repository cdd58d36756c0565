"""experiments/blind_slices.py: the slices where a rule is blind, read from round 0 by hand."""

import json

import pytest

from common import FileRefused
from experiments import blind_slices


def game(qid, answers, vote_right, right, tokens):
    first = {"answers": answers, "correct": vote_right}
    return {"id": qid, "rounds": [first], "correct": right, "tokens": tokens}


# q1: unanimous and wrong; q2: 2-1 and wrong; q3: 1-1-1 and wrong (neither); q4: right (neither)
ROUND0 = {"q1": ([5, 5, 5], False), "q2": ([5, 5, 7], False), "q3": ([1, 2, 3], False)}
ROUND0["q4"] = ([4, 4, 9], True)


def table(final):
    """An eval.py JSON with transcripts: mpdf-persist stops at round 0; freeze ends as `final`
    says ({id: (right, tokens)})."""
    persist = [game(q, a, ok, ok, 100) for q, (a, ok) in ROUND0.items()]
    freeze = [game(q, a, ok, *final[q]) for q, (a, ok) in ROUND0.items()]
    return {"details": {"mpdf-persist": persist, "freeze": freeze}}


def test_round0_names_the_slice_of_each_question():
    assert [
        blind_slices.round0_slice(game(q, a, ok, ok, 0)["rounds"][0])
        for q, (a, ok) in ROUND0.items()
    ] == ["unanimous-wrong", "majority-wrong", None, None]
    # an answer that could not be read counts as an answer like any other
    assert blind_slices.round0_slice({"answers": [None, None, 2], "correct": False}) == (
        "majority-wrong"
    )


def test_slices_pool_the_tables_and_read_each_protocols_games():
    one = table({"q1": (False, 100), "q2": (True, 300), "q3": (True, 500), "q4": (True, 100)})
    two = table({"q1": (True, 200), "q2": (True, 400), "q3": (False, 500), "q4": (True, 100)})
    figures = blind_slices.slice_figures([("a", one), ("b", two)], "mpdf-persist")
    freeze = figures["freeze"]
    assert (freeze["unanimous-wrong"].n, freeze["unanimous-wrong"].accuracy) == (2, 0.5)
    assert freeze["unanimous-wrong"].tokens == 150
    assert (freeze["majority-wrong"].accuracy, freeze["majority-wrong"].tokens) == (1.0, 350)
    assert figures["mpdf-persist"]["majority-wrong"].accuracy == 0.0
    text = blind_slices.slice_table(figures)
    assert "| freeze | 2, 0.500, 150 | 2, 1.000, 350 |" in text


def test_a_table_without_transcripts_or_the_reference_is_refused(tmp_path, capsys):
    with pytest.raises(FileRefused, match="--no-details"):
        blind_slices.slice_figures([("t.json", {"freeze": {}})], "mpdf-persist")
    with pytest.raises(FileRefused, match="no protocol debate"):
        blind_slices.slice_figures([("t.json", table({q: (True, 1) for q in ROUND0}))], "debate")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table({q: (True, 1) for q in ROUND0})))
    blind_slices.main([str(path)])
    assert "| freeze | 1, 1.000, 1 | 1, 1.000, 1 |" in capsys.readouterr().out


def test_a_protocol_that_played_another_round_0_is_named(capsys):
    other = table({q: (True, 1) for q in ROUND0})
    other["details"]["freeze"][1]["rounds"][0]["answers"] = [5, 7, 7]
    blind_slices.slice_figures([("t.json", other)], "mpdf-persist")
    assert capsys.readouterr().err.strip() == "t.json: freeze played another round 0 on q2"
