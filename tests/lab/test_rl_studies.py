"""The studies of stage 2 that left train_rl.py (experiments/LOG.md): each hands its own corpus to
train_rl.train from a lab file (experiments/rl_later_credit.py, rl_disagree_bonus.py,
rl_refine_pays.py). Pinned on hand-built games as tests/method/test_meaning.py pins the spine's
corpus; and one study trained through the door end to end."""

import json

import pytest
import torch
from handmade import ByRound, Script, SeedEngine, replies
from scripted import ScriptedEngine, arith_script

import common
import data
import deliberate as D
import train_rl
from common import UsageError
from deliberate import PERSIST, REFINE
from experiments import rl_disagree_bonus as bonus
from experiments import rl_later_credit as later
from experiments import rl_refine_pays as pays

ALONE = common.Ranks(0, 1, "cpu")


def example(qid, answer="5"):
    return data.Example(question=f"Question {qid}?", answer=answer, task="arith", id=qid)


def test_the_later_weight_credits_the_votes_gain_after_a_round_to_the_actions_taken():
    """experiments/rl_later_credit.py --later-weight: two games of R = 2 (gold 5; vote ties go to
    agent 0), agent 0 REFINEs and its peers PERSIST in round 1, all REFINE in round 2. q/up: 1,2,3
    -> 6,2,3 (wrong) -> 5,5,9 (right): round 1's taken actions gain +1 after it. q/down: 1,5,3
    (wrong) -> 5,5,3 (right) -> 1,2,9 (wrong): -1 after round 1. Round 2 is the game's end: no gain.
    The actions not taken keep their one-round rewards."""
    refine = {
        "q/up": {1: ("6", "7", "8"), 2: ("5", "5", "9")},
        "q/down": {1: ("5", "7", "8"), 2: ("1", "2", "9")},
    }
    solve = {"q/up": ("1", "2", "3"), "q/down": ("1", "5", "3")}
    table = {}
    for q in solve:
        calls = {(t, i): (a, 9) for t, answers in refine[q].items() for i, a in enumerate(answers)}
        table.update(replies(q, dict(enumerate(solve[q])), calls))
    plan = {1: [REFINE, PERSIST, PERSIST], 2: [REFINE] * 3}
    examples = [example("q/up"), example("q/down")]

    def corpus(states, weight):
        cfg = later.Config(agents=3, rounds=2, refine_cost=0.5, later_weight=weight)
        script = Script(lambda t, agent: plan[t][agent])
        return states(SeedEngine(table), examples, script, cfg, ranks=ALONE, desc="corpus")

    # the spine's corpus, and the study's at weight 0, are the one-round rewards
    plain = corpus(train_rl.scored_states, 0.25)
    assert corpus(later.later_credit_states, 0.0) == plain
    credited = corpus(later.later_credit_states, 0.25)
    gain = {("q/up", 1): 1.0, ("q/down", 1): -1.0, ("q/up", 2): 0.0, ("q/down", 2): 0.0}
    assert [r["key"] for r in credited] == [r["key"] for r in plain]
    for a, b in zip(plain, credited):
        qid, t, agent = a["key"]
        taken = plan[t][agent]
        assert b["action"] == taken
        shift = [0.25 * gain[qid, t] * (k == taken) for k in range(4)]
        assert b["rewards"] == pytest.approx([x + d for x, d in zip(a["rewards"], shift)])


class Bar:
    """tqdm's part that a progress bar's user sees: its settings, its updates, its close."""

    def __init__(self, **settings):
        self.settings, self.updates, self.closed = settings, 0, False

    def update(self, n):
        self.updates += n

    def close(self):
        self.closed = True


def test_rollouts_credit_the_tied_action_not_taken_with_its_own_games_gain(monkeypatch):
    """experiments/rl_later_credit.py --rollouts, R = 2, gold 5, vote ties to agent 0; round 2 has
    every agent REFINE to 5, 5, 9 (right). q/stop: 1, 2, 3, all PERSIST in round 1, and the game
    stops wrong; agents 0 and 1 would REFINE to their own answers (tied with PERSIST), agent 2 to 5
    (its REFINE pays +1 alone: no tie, no rollout). Forcing agent 0's or 1's REFINE keeps the game
    going to round 2: its branch gains +1. q/go: 1, 2, 3, agent 0 REFINEs to 1 in round 1, its peers
    PERSIST (every REFINE keeps its answer: all tied); the game gains +1 after round 1. Forcing
    agent 0's PERSIST stops the branch (gain 0); forcing agent 1's or 2's REFINE changes nothing
    after (gain +1). q/peer: 1, 2, 5, all PERSIST in round 1, every REFINE keeping its answer:
    agents 0 and 1 tie REFINE with PERSIST below CONCEDE to agent 2 (+2: no rollout); agent 2's tie
    is its best (its CONCEDEs pay -1): rolled out, +1. q/pivot: 5, 1, 3 (the vote right by agent 0
    alone), all PERSIST, every REFINE keeping its answer: agent 0's PERSIST and REFINE tie at +1,
    its branch gains 0 (right after round 1 and at the end); its peers' CONCEDE to it pays +1 alone.
    Round 2 is the last: no rollout. A rank-0 bar of the branches' rounds, cleared when done."""
    solve = {"q/stop": ("1", "2", "3"), "q/go": ("1", "2", "3"), "q/peer": ("1", "2", "5")}
    first = {"q/stop": ("1", "2", "5"), "q/go": ("1", "2", "3"), "q/peer": ("1", "2", "5")}
    solve["q/pivot"] = first["q/pivot"] = ("5", "1", "3")
    table = {}
    for q in solve:
        answers = {1: first[q], 2: ("5", "5", "9")}
        calls = {(t, i): (a, 9) for t, ans in answers.items() for i, a in enumerate(ans)}
        table.update(replies(q, dict(enumerate(solve[q])), calls))
    plans = {"q/stop": [PERSIST] * 3, "q/go": [REFINE, PERSIST, PERSIST], "q/peer": [PERSIST] * 3}
    plans["q/pivot"] = [PERSIST] * 3
    ends = {}
    bars = []
    monkeypatch.setattr(later, "tqdm", lambda **kw: bars.append(Bar(**kw)) or bars[-1])
    w = 0.5

    def corpus(q, rollouts):
        cfg = later.Config(agents=3, rounds=2, refine_cost=0.0, later_weight=w, rollouts=rollouts)
        policy = ByRound({1: plans[q], 2: [REFINE] * 3}, rounds=2)
        engine = SeedEngine(table)
        rows = later.later_credit_states(
            engine, [example(q)], policy, cfg, ranks=ALONE, desc="corpus"
        )
        ends.update({r["key"]: r["refine_ends_better"] for r in rows if "refine_ends_better" in r})
        return {r["key"]: r["rewards"] for r in rows}, engine.calls

    # the one-round rewards by hand (PERSIST, REFINE, CONCEDE to peer 0, to peer 1) and the taken
    # action's gain after the round
    expected = {
        ("q/stop", 1, 0): [0, 0 + w, 0, 0],
        ("q/stop", 1, 1): [0, 0 + w, 0, 0],
        ("q/stop", 1, 2): [0, 1, 0, 0],
        ("q/go", 1, 0): [0 + 0, 0 + w, 0, 0],
        ("q/go", 1, 1): [0 + w, 0 + w, 0, 0],
        ("q/go", 1, 2): [0 + w, 0 + w, 0, 0],
        ("q/peer", 1, 0): [0, 0, 0, 2],
        ("q/peer", 1, 1): [0, 0, 0, 2],
        ("q/peer", 1, 2): [0, 0 + w, -1, -1],
        ("q/pivot", 1, 0): [1, 1 + 0, -1, -1],
        ("q/pivot", 1, 1): [0, 0, 1, -1],
        ("q/pivot", 1, 2): [0, 0, 1, -1],
    }
    # the game's calls (3 per round, every REFINE sample drawn), then each branch's: round 0 again,
    # its REFINEs taken: q/stop's two branches 3 + 1 + 3; q/go's 3 + 0 (stopped), 3 + 2 + 3 twice;
    # q/peer's one 3 + 1 + 3
    calls = {"q/stop": (6, 6 + 2 * 7), "q/go": (9, 9 + 3 + 2 * 8), "q/peer": (6, 6 + 7)}
    calls["q/pivot"] = (6, 6 + 7)
    rounds = {"q/stop": (1,), "q/go": (1, 2), "q/peer": (1,), "q/pivot": (1,)}
    # per question, a rolled-out state: (round, agent, the action not taken, its branch's gain)
    untaken = {"q/stop": (1, 0, REFINE, 1), "q/go": (1, 0, PERSIST, 0), "q/peer": (1, 2, REFINE, 1)}
    untaken["q/pivot"] = (1, 0, REFINE, 0)
    for q in plans:
        (plain, plain_calls), bars[:] = corpus(q, False), []
        rolled, rolled_calls = corpus(q, True)
        assert [(b.settings, b.updates, b.closed) for b in bars] == [
            (dict(total=2, desc="rollouts", disable=False, leave=False), 2, True)
        ]
        assert (plain_calls, rolled_calls) == calls[q]
        assert list(rolled) == list(plain) == [(q, t, i) for t in rounds[q] for i in range(3)]
        for key, vector in expected.items():
            if key[0] == q:
                assert rolled[key] == pytest.approx(vector), key
        # without rollouts the actions not taken keep their one-round rewards
        t, agent, action, gain = untaken[q]
        assert plain[q, t, agent][action] == rolled[q, t, agent][action] - w * gain
        # round 2, the last, is rolled out nowhere
        assert all(rolled[k] == plain[k] for k in rolled if k[1] == 2)
    # how each rolled-out state's two sides ended: +1 where the REFINE side ended right and the
    # PERSIST side wrong (q/stop's and q/peer's REFINE branches, q/go's REFINE game)
    assert ends == {
        ("q/stop", 1, 0): 1,
        ("q/stop", 1, 1): 1,
        ("q/go", 1, 0): 1,
        ("q/go", 1, 1): 0,
        ("q/go", 1, 2): 0,
        ("q/peer", 1, 2): 1,
        ("q/pivot", 1, 0): 0,
    }


def test_rollout_statistics_by_hand():
    """Eight states, four rolled out: the REFINE side ended better in two, the PERSIST side in
    one, alike in one; none rolled out; shares of a third."""
    rows = [{"refine_ends_better": e} for e in (1, 1, -1, 0)] + [{}] * 4
    assert later.rollout_statistics(rows) == {
        "share_of_states": 0.5,
        "refine_ends_better": 0.5,
        "persist_ends_better": 0.25,
    }
    assert later.rollout_statistics([{}]) == {
        "share_of_states": 0.0,
        "refine_ends_better": 0.0,
        "persist_ends_better": 0.0,
    }
    # thirds, to 4 decimals: one state of three rolled out; three of six, one of each ending
    assert later.rollout_statistics([{"refine_ends_better": 1}, {}, {}]) == {
        "share_of_states": 0.3333,
        "refine_ends_better": 1.0,
        "persist_ends_better": 0.0,
    }
    rows = [{"refine_ends_better": e} for e in (1, -1, 0)] + [{}] * 3
    assert later.rollout_statistics(rows) == {
        "share_of_states": 0.5,
        "refine_ends_better": 0.3333,
        "persist_ends_better": 0.3333,
    }


def test_the_disagree_bonus_lowers_refines_cost_where_the_team_disagrees_only():
    """experiments/rl_disagree_bonus.py: every agent REFINEs (free) in R = 1; t/split answers 1, 2,
    5 (the team disagrees), t/same 3, 3, 3. A REFINE's reward, taken or counterfactual, earns the
    bonus in t/split only; the other actions' rewards are the spine's."""
    solve = {"t/split": ("1", "2", "5"), "t/same": ("3", "3", "3")}
    table = {}
    for q, team in solve.items():
        calls = {(1, i): (a, 9) for i, a in enumerate(team)}
        table.update(replies(q, dict(enumerate(team)), calls))
    examples = [example(q) for q in solve]
    refine = Script(lambda t, agent: REFINE)
    cfg = bonus.Config(agents=3, rounds=1, refine_cost=0.0, disagree_bonus=0.25)
    plain = train_rl.scored_states(SeedEngine(table), examples, refine, cfg, ranks=ALONE, desc="")
    paid = bonus.disagree_bonus_states(
        SeedEngine(table), examples, refine, cfg, ranks=ALONE, desc=""
    )
    assert [r["key"] for r in paid] == [r["key"] for r in plain]
    for a, b in zip(plain, paid):
        earned = 0.25 if a["key"][0] == "t/split" else 0.0
        assert b["rewards"][REFINE] - a["rewards"][REFINE] == pytest.approx(earned)
        assert [b["rewards"][k] for k in (0, 2, 3)] == [a["rewards"][k] for k in (0, 2, 3)]


def test_refine_pays_below_zero_only_in_its_study():
    """train_rl.py refuses a negative REFINE cost in one line; experiments/rl_refine_pays.py takes
    it (and still checks the rest of train_rl.py's flags)."""
    cfg = pays.Config(init="missing.safetensors")
    with pytest.raises(UsageError, match="^--refine-cost -0.1: must be at least 0"):
        train_rl.check(train_rl.Config(refine_cost=-0.1, init=cfg.init), 1)
    with pytest.raises(UsageError, match="^--init 'missing.safetensors' is not a policy file"):
        pays.check(cfg, 1)
    with pytest.raises(UsageError, match="^--lr 0.0: "):
        pays.check(pays.Config(lr=0.0), 1)
    with pytest.raises(UsageError, match="^--rollouts credits --later-weight"):
        later.check(later.Config(later_weight=0.0, rollouts=True, init=_policy_file()), 1)


def _policy_file(path="/tmp/mpdf-test-init.safetensors"):
    torch.manual_seed(0)
    D.save_policy(D.MetaPolicy(agents=3), path)
    return path


def test_a_study_trains_through_the_door(tmp_path, monkeypatch):
    """experiments/rl_later_credit.py trains with train_rl.train, its corpus handed in: the corpus
    it saves is its own (its function and its settings recorded), its rewards are the study's,
    and the spine run in the same folder refuses that corpus rather than train on it."""
    monkeypatch.setattr(train_rl, "make_engine", lambda *a, **k: ScriptedEngine(arith_script()))
    init = _policy_file(tmp_path / "init.safetensors")
    cfg = later.Config(
        agents=3,
        rounds=2,
        questions=8,
        val_n=0,
        epochs=1,
        batch_size=8,
        init=str(init),
        out_dir=str(tmp_path / "run"),
        later_weight=0.5,
        dtype="float32",
    )
    later.check(cfg, 1)
    (tmp_path / "run").mkdir()  # as common.distributed makes it
    summary = train_rl.train(cfg, ALONE, corpus=later.later_credit_states)
    stored = torch.load(tmp_path / "run" / "corpus-0.pt", weights_only=False)
    assert stored["settings"]["corpus"] == "later_credit_states"
    assert stored["settings"]["later_weight"] == 0.5 and "rollouts" in stored["settings"]
    questions, _ = data.training_questions(cfg, 0)
    engine = ScriptedEngine(arith_script())
    behaviour = D.load_policy(init).eval()
    again = later.later_credit_states(engine, questions, behaviour, cfg, ranks=ALONE, desc="")
    assert [r["rewards"] for r in stored["rows"]] == [r["rewards"] for r in again]
    assert summary["corpus"]["states"] == len(again)
    assert (
        json.loads((tmp_path / "run" / "policy.json").read_text())["train_config"]["later_weight"]
        == 0.5
    )
    spine = train_rl.Config(
        **{k: v for k, v in vars(cfg).items() if k not in ("later_weight", "rollouts")}
    )
    (tmp_path / "run" / "summary.json").unlink()
    (tmp_path / "run" / "checkpoint.pt").unlink()
    with pytest.raises(UsageError, match="corpus"):
        train_rl.train(spine, ALONE)


@pytest.mark.parametrize("study", [later, bonus, pays])
def test_a_studys_help_lists_the_scripts_flags_and_its_own(study, capsys):
    with pytest.raises(SystemExit) as ended:
        common.parse_config(study.Config, ["--help"])
    text = capsys.readouterr().out
    assert ended.value.code == 0 and "--init" in text and "--algo" in text
    own = {later: "--later-weight", bonus: "--disagree-bonus", pays: "--refine-cost"}[study]
    assert own in text
