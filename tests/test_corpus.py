"""The corpus of a training stage by hand, in process and without a model: the states that
deliberate.collect_states keeps of the games it asks play for, action_distribution, and
train_rl.py's corpus_statistics, best_action_kinds and validation on hand-built numbers."""

from types import SimpleNamespace

import pytest
import torch
from handmade import Script

import deliberate as D
import train_rl
from common import Ranks
from deliberate import PERSIST, REFINE, concede
from solutions import GameConfig

ALONE = Ranks(0, 1, "cpu")


# --------------------------------------------------------------------------------- collect_states
def played_game(qid, rounds):
    """A played game of 2 agents: each decision round's observations and actions."""
    moves = [
        D.Move(t, [([t, 0.0], [[t, 2.0]]), ([t, 1.0], [[t, 3.0]])], [REFINE, PERSIST], *[None] * 4)
        for t in range(1, rounds + 1)
    ]
    return SimpleNamespace(example=SimpleNamespace(id=qid), moves=moves)


class Bar:
    def __init__(self, total):
        self.total = total

    def close(self):
        pass


def test_collect_states_asks_play_for_the_shard_and_the_game(monkeypatch):
    """play gets this rank's shard, the config's game with sampled actions, and (play_shard asked
    for them: train_rl.py's corpus) every REFINE sample at the cost asked for, else play's
    defaults; rows come in key order, each with its observation, agent, action and what `more`
    adds; no state at all is an error."""
    asked = []

    def play(engine, shard, policy, cfg, *, greedy, refine_all, refine_cost, progress):
        asked.append((engine, shard, policy, cfg, greedy, refine_all, refine_cost, progress.total))
        return [played_game(q, 2) for q in reversed(shard)]

    monkeypatch.setattr(D, "play", play)
    bars = []
    monkeypatch.setattr(D, "tqdm", lambda **kw: bars.append(kw) or Bar(kw["total"]))
    cfg = GameConfig(agents=2, rounds=2, seed=5)

    def more(game, move):
        return [{"t": (game.example.id, move.round, agent)} for agent in range(2)]

    second = Ranks(1, 2, "cpu")
    rows = D.collect_states("E", ["a", "b", "c"], "pi", cfg, more, ranks=second)
    assert asked == [("E", ["b"], "pi", cfg, False, False, 0.0, 2)]
    assert [r["key"] for r in rows] == [("b", t, i) for t in (1, 2) for i in (0, 1)]
    assert [r["t"] for r in rows] == [r["key"] for r in rows]
    assert [r["own"] for r in rows] == [[1, 0.0], [1, 1.0], [2, 0.0], [2, 1.0]]
    assert [r["peers"] for r in rows] == [[[1, 2.0]], [[1, 3.0]], [[2, 2.0]], [[2, 3.0]]]
    assert [r["action"] for r in rows] == [REFINE, PERSIST] * 2
    assert [r["agent"] for r in rows] == [0, 1] * 2
    rows = D.collect_states("E", ["a", "b", "c"], "pi", cfg, more, ranks=ALONE)
    assert [r["key"][0] for r in rows] == ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    D.play_shard("E", ["a", "b"], "pi", cfg, ranks=second, refine_all=True, refine_cost=0.2)
    assert asked[-1] == ("E", ["b"], "pi", cfg, False, True, 0.2, 2)
    D.collect_states("E", ["a"], "pi", cfg, more, ranks=ALONE, desc="sft")
    # a bar of the rounds on rank 0 only, named by `desc` ("collect"), cleared when done
    bar = dict(total=2, desc="collect", disable=False, leave=False)
    assert bars == [{**bar, "disable": True}, bar, {**bar, "disable": True}, {**bar, "desc": "sft"}]
    monkeypatch.setattr(D, "play", lambda *a, **kw: [played_game("a", 0)])
    with pytest.raises(ValueError, match=r"^the games visited no state after round 0 \(did every "):
        D.collect_states("E", ["a"], Script(None), cfg, more, ranks=ALONE)


# ------------------------------------------------------------------------------------ statistics
def test_action_distribution():
    """K = 5 (3 CONCEDE targets): 1 PERSIST, 2 REFINE, 3 CONCEDE to two of the targets."""
    actions = torch.tensor([PERSIST, REFINE, REFINE, concede(0), concede(2), concede(2)])
    assert D.action_distribution(actions, 5) == {
        "persist": round(1 / 6, 4),
        "refine": round(2 / 6, 4),
        "concede": 0.5,
    }
    # minlength: K counted even where the last kinds never occur
    assert D.action_distribution(torch.tensor([PERSIST]), 4) == {
        "persist": 1.0,
        "refine": 0.0,
        "concede": 0.0,
    }


def test_corpus_statistics_by_hand():
    """4 states, K = 4: flat; two values; three values; four values. Actions taken: PERSIST,
    REFINE, CONCEDE 0, CONCEDE 1."""
    rewards = torch.tensor(
        [[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 1.0, 1.0], [0.0, 0.25, 1.0, 0.0], [-1.0, 0.0, 0.5, 0.75]]
    )
    actions = torch.tensor([PERSIST, REFINE, concede(0), concede(1)])
    stats = train_rl.corpus_statistics({"rewards": rewards, "action": actions}, 4)
    assert stats["states"] == 4
    assert stats["frac_zero_std"] == 0.25 and stats["frac_multi_valued"] == 0.5
    assert stats["behaviour_actions"] == {"persist": 0.25, "refine": 0.25, "concede": 0.5}
    assert stats["mean_reward_taken"] == pytest.approx((0.5 + 0 + 1 + 0.75) / 4)
    # the mean of each state's best (the best of each action over the states would be 0.875)
    assert stats["mean_reward_best"] == pytest.approx((0.5 + 1 + 1 + 0.75) / 4)
    # best kinds: flat (tied), PERSIST = CONCEDE (tied), CONCEDE alone, CONCEDE alone
    assert stats["best_kind"] == {"persist": 0.0, "refine": 0.0, "concede": 0.5, "tied": 0.5}
    assert stats["refine_minus_persist"] == pytest.approx((0 - 1 + 0.25 + 1) / 4)


def test_best_action_kinds_counts_ties_and_the_best_concede():
    """A tie of REFINE and CONCEDE (not PERSIST), a CONCEDE that wins by its better target, a
    three-way tie, a REFINE alone; 3 peers (K = 5)."""
    rewards = torch.tensor(
        [
            [0.0, 1.0, 1.0, 0.0, 0.0],
            [0.5, 0.0, 0.0, 0.0, 0.75],
            [1.0, 1.0, 0.0, 1.0, 0.0],
            [0.0, 0.5, 0.25, 0.0, 0.0],
        ]
    )
    stats = train_rl.best_action_kinds(rewards)
    assert stats["best_kind"] == {"persist": 0.0, "refine": 0.25, "concede": 0.25, "tied": 0.5}
    assert stats["refine_minus_persist"] == pytest.approx((1 - 0.5 + 0 + 0.5) / 4)
    # shares are rounded to 4 places
    thirds = train_rl.best_action_kinds(rewards[1:])["best_kind"]
    assert thirds == {"persist": 0.0, "refine": 0.3333, "concede": 0.3333, "tied": 0.3333}


# ------------------------------------------------------------------------------------ validate
class Log:
    def __init__(self):
        self.lines = []

    def write(self, **record):
        self.lines.append(record)


def test_validate_sums_the_shard(monkeypatch):
    """play gets this rank's shard, a frozen copy of the policy and the config's game (greedy);
    accuracy and tokens are per question, actions shares of every decision (none taken: all 0),
    logged at the step."""
    asked = []

    def transcript(correct, tokens, rounds):
        return SimpleNamespace(
            transcript=lambda: dict(correct=correct, tokens=tokens, rounds=rounds)
        )

    def play(engine, shard, policy, cfg):
        asked.append((engine, shard, policy, cfg))
        return [
            transcript(True, 30, [{}, {"actions": [PERSIST, concede(1)]}]),
            transcript(False, 10, [{}, {"actions": [REFINE, REFINE]}]),
            transcript(True, 20, [{}]),
        ][: len(shard)]

    monkeypatch.setattr(train_rl, "play", play)
    monkeypatch.setattr(train_rl, "frozen_copy", lambda policy: f"frozen {policy}")
    devices = []
    real_sum = train_rl.all_reduce_sum
    monkeypatch.setattr(
        train_rl,
        "all_reduce_sum",
        lambda values, device: devices.append(device) or real_sum(values, device),
    )
    cfg, log = GameConfig(agents=2, rounds=1, seed=4, critic=True), Log()
    out = train_rl.validate(
        "E", list("abcdefg"), "pi", cfg, ranks=Ranks(1, 2, "cpu"), log=log, step=7
    )
    assert asked == [("E", ["b", "d", "f"], "frozen pi", cfg)]
    assert out == {
        "val_accuracy": 2 / 3,
        "val_tokens": 20.0,
        "val_actions": {"persist": 0.25, "refine": 0.5, "concede": 0.25},
    }
    assert log.lines == [{"step": 7, **out}]
    out = train_rl.validate(
        "E", list("abcdefg"), "pi", cfg, ranks=Ranks(2, 3, "cpu"), log=log, step=8
    )
    assert asked[-1][1] == ["c", "f"] and devices == ["cpu", "cpu"]
    # shares rounded to 4 places; a single decision in all has share 1
    for actions, shares in (([PERSIST, REFINE, concede(0)], [0.3333] * 3), ([REFINE], [0, 1, 0])):
        game = transcript(1, 3, [{}, {"actions": actions}])
        monkeypatch.setattr(train_rl, "play", lambda *a, game=game: [game])
        out = train_rl.validate("E", ["a"], "pi", cfg, ranks=Ranks(0, 1, "cpu"), log=log, step=9)
        assert list(out["val_actions"].values()) == shares
    monkeypatch.setattr(train_rl, "play", lambda *a: [transcript(0, 4, [{}])])
    out = train_rl.validate("E", ["a"], "pi", cfg, ranks=Ranks(0, 1, "cpu"), log=log, step=10)
    assert out == {
        "val_accuracy": 0.0,
        "val_tokens": 4.0,
        "val_actions": {"persist": 0.0, "refine": 0.0, "concede": 0.0},
    }
    assert train_rl.validate("E", [], "pi", cfg, ranks=Ranks(0, 1, "cpu"), log=log, step=11) == {
        "val_accuracy": None,
        "validation": "none (--val-n 0)",
    }


def test_validate_reports_on_rank_0_alone_on_stderr(monkeypatch, capsys):
    game = SimpleNamespace(
        transcript=lambda: dict(correct=True, tokens=5, rounds=[{}, {"actions": [PERSIST]}])
    )
    monkeypatch.setattr(train_rl, "play", lambda *a: [game])
    monkeypatch.setattr(train_rl, "frozen_copy", lambda policy: policy)
    cfg = GameConfig(agents=1, rounds=1)
    train_rl.validate("E", ["a", "b"], "pi", cfg, ranks=Ranks(1, 2, "cpu"), log=Log(), step=3)
    assert capsys.readouterr() == ("", "")
    train_rl.validate("E", ["a"], "pi", cfg, ranks=Ranks(0, 1, "cpu"), log=Log(), step=3)
    assert capsys.readouterr() == (
        "",
        "step 3: val accuracy 1.000, actions {'persist': 1.0, 'refine': 0.0, 'concede': 0.0}\n",
    )


def test_a_saved_corpus_names_the_function_that_made_it_and_a_studys_own_settings():
    """train_rl.study_settings: the corpus function's name, and the fields a study's Config adds
    to train_rl's (a corpus saved by one is refused by the other, common.load_made_under)."""
    from dataclasses import dataclass

    @dataclass
    class Study(train_rl.Config):
        bonus: float = 0.25
        """a study's own flag"""

    def later_states():
        pass

    assert train_rl.study_settings(train_rl.Config(), train_rl.scored_states) == {
        "corpus": "scored_states"
    }
    assert train_rl.study_settings(Study(seed=3), later_states) == {
        "corpus": "later_states",
        "bonus": 0.25,
    }
