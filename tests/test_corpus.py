"""corpus.py by hand, in process and without a model (issue 43, the mutation run of corpus.py): the
game's flags that check_game refuses and the one line it says (task, --path, level, agents, rounds,
temperature, val_n, token budget, vote, dtype, --model / --models, checkpoint directories, context),
team_entries, the training pool and its validation / iteration slices, make_engine's arguments (and
a team's engines and adapters), what collect_states asks play for and the empty corpus, the corpus
tensors, the settings a corpus is saved with and refused under, and action_distribution,
corpus_statistics and evaluate_policy on hand-built numbers. Fast, so the mutation run of corpus.py
uses these (experiments/mutation.py) instead of tests/test_train.py's script subprocesses."""

import json
import random
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch
from test_meaning import Script

import corpus
import data
import deliberate as D
from common import FileRefused, UsageError
from llm import lora
from state import PERSIST, REFINE, concede


def model_dir(
    tmp_path, name="model", context=64, key="max_position_embeddings", tok="tokenizer.json"
):
    """A directory that passes for an HF checkpoint: config.json (with a context length) and a
    tokenizer file."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({key: context} if key else {}))
    if tok:
        (folder / tok).write_text("{}")
    return folder


def game(tmp_path, **kw):
    """A valid game's flags (a checkpoint directory of context 64), `kw` changed."""
    settings = dict(
        task="arith", path="", level=0, agents=2, rounds=1, temperature=0.0, val_n=0,
        max_new_tokens=63, engine_batch_size=1, vote="mean_prob", dtype="auto", models="",
        model=str(tmp_path / "model"),
    )  # fmt: skip
    if not (tmp_path / "model").exists():
        model_dir(tmp_path)
    return SimpleNamespace(**{**settings, **kw})


def refused(cfg, message, **kw):
    with pytest.raises(UsageError) as error:
        corpus.check_game(cfg, **kw)
    assert str(error.value) == message


# ------------------------------------------------------------------------------------ check_game
def test_check_game_accepts_the_edges(tmp_path):
    """Levels 0 and 4, 2 agents and 1 round (the defaults' minimums), temperature and val_n 0, one
    token below the context, each dtype, a config without val_n or models."""
    for kw in (
        {}, {"level": 4}, {"dtype": "float32"}, {"dtype": "bfloat16"}, {"vote": "index"},
        {"max_new_tokens": 1, "engine_batch_size": 1},
    ):  # fmt: skip
        corpus.check_game(game(tmp_path, **kw))
    corpus.check_game(game(tmp_path, agents=1, rounds=0), min_agents=1, min_rounds=0)
    bare = game(tmp_path)
    del bare.val_n, bare.models
    corpus.check_game(bare)
    data_file = tmp_path / "q.jsonl"
    data_file.write_text("")
    corpus.check_game(game(tmp_path, task="gsm8k", path=str(data_file)))


def test_check_game_refuses_in_one_line(tmp_path):
    tmp = str(tmp_path)
    data_file = tmp_path / "q.jsonl"
    data_file.write_text("")
    cases = [
        ({"task": "chess"}, "unknown --task 'chess': choose one of " + ", ".join(data.TASKS)),
        ({"task": "gsm8k"}, "--task gsm8k reads a data file: pass it with --path"),
        ({"task": "gsm8k", "path": tmp + "/none"}, f"--path {tmp + '/none'!r}: no such file"),
        ({"path": str(data_file)}, f"--path {str(data_file)!r}: task arith is generated and reads "
         "no file"),
        ({"level": 5}, "--level 5: choose 1..4 (0: the task's default)"),
        ({"level": -1}, "--level -1: choose 1..4 (0: the task's default)"),
        ({"agents": 1}, "--agents 1: must be at least 2"),
        ({"rounds": 0}, "--rounds 0: must be at least 1"),
        ({"temperature": -0.5}, "--temperature -0.5: must be at least 0"),
        ({"val_n": -1}, "--val-n -1: must be at least 0"),
        ({"max_new_tokens": 0}, "--max-new-tokens 0: must be at least 1"),
        ({"engine_batch_size": 0}, "--engine-batch-size 0: must be at least 1"),
        ({"vote": "loudest"}, "unknown --vote 'loudest': choose one of min_prob, mean_prob, "
         "tail_prob, index"),
        ({"dtype": "int4"}, "unknown --dtype 'int4': choose one of auto, float32, bfloat16, "
         "float16, int8"),
        ({"models": "default,default"}, "--model and --models: pass one (--models names every "
         "agent's model)"),
        ({"max_new_tokens": 64}, "--max-new-tokens 64: the model's context holds 64 tokens, prompt "
         "included"),
        ({"model": tmp}, f"--model {tmp!r}: not an HF checkpoint directory (no config.json)"),
        ({"model": "", "models": f"{tmp}/model,{tmp}/model+{tmp}/none.pt"},
         f"--models: no adapter file {tmp + '/none.pt'!r}"),
        ({"model": "", "models": f"{tmp}/model"}, "--models: 1 entries for 2 agents (one per "
         "agent)"),
        ({"model": "", "models": f"{tmp}/model,{tmp}"}, f"--models {tmp!r}: not an HF checkpoint "
         "directory (no config.json)"),
    ]  # fmt: skip
    for kw, message in cases:
        refused(game(tmp_path, **kw), message)
    refused(game(tmp_path, agents=2), "--agents 2: must be at least 3", min_agents=3)
    refused(game(tmp_path, rounds=1), "--rounds 1: must be at least 2", min_rounds=2)


def test_check_model_reads_the_context_and_the_tokenizer_files(tmp_path):
    """The context is max_position_embeddings, else n_positions; none: any budget. Any one of the
    three tokenizer files will do; none is refused. The budget is checked against the --models
    entries' context too (an adapter that exists passes)."""
    for tok in ("tokenizer.json", "tokenizer.model", "vocab.json"):
        corpus.check_model("--model", str(model_dir(tmp_path, tok, tok=tok)), 63)
    gpt2 = model_dir(tmp_path, "gpt2", context=32, key="n_positions", tok="vocab.json")
    corpus.check_model("--model", str(gpt2), 31)
    with pytest.raises(UsageError, match="^--max-new-tokens 32: the model's context holds 32 "):
        corpus.check_model("--model", str(gpt2), 32)
    corpus.check_model("--model", str(model_dir(tmp_path, "open", key=None)), 10**6)
    bare = model_dir(tmp_path, "bare", tok=None)
    with pytest.raises(UsageError) as error:
        corpus.check_model("--models", str(bare), 1)
    assert str(error.value) == (
        f"--models {str(bare)!r}: no tokenizer files (tokenizer.json) in the directory"
    )
    adapter = tmp_path / "a.pt"
    adapter.write_text("")
    corpus.check_models("--models", f"{gpt2}+{adapter},{gpt2}", 2, 31)
    with pytest.raises(UsageError, match="^--max-new-tokens 32: "):
        corpus.check_models("--models", f"{gpt2}+{adapter},{gpt2}", 2, 32)
    cfg = game(tmp_path, model="", models=f"{gpt2},{gpt2}", max_new_tokens=32)
    refused(cfg, "--max-new-tokens 32: the model's context holds 32 tokens, prompt included")


def test_team_entries():
    """One (base, adapter) per agent, blanks around an entry dropped, `default` the embedded
    backbone (""), the flag named in the refusal."""
    assert corpus.team_entries(" default , m1+a.pt,m2 ", 3) == [
        ("", ""),
        ("m1", "a.pt"),
        ("m2", ""),
    ]
    for call, flag in (
        (lambda: corpus.team_entries("a,b", 3), "--models"),
        (lambda: corpus.team_entries("a,b", 3, "--team"), "--team"),
        (lambda: corpus.check_models("--team", "a,b", 3, 1), "--team"),
    ):
        with pytest.raises(UsageError) as error:
            call()
        assert str(error.value) == f"{flag}: 2 entries for 3 agents (one per agent)"


# ----------------------------------------------------------------------- the training questions
def test_training_pool_and_questions(monkeypatch):
    """The pool is the train split shuffled by the seed (level 0: the task's default level, 1);
    validation comes first, then `questions` per iteration; one question too many is refused."""
    cfg = SimpleNamespace(task="arith", path="", level=0, seed=3, val_n=4, questions=5)
    pool = data.load_task("arith", split="train", level=1)
    random.Random(3).shuffle(pool)
    assert corpus.training_pool(cfg) == pool
    mixed = data.load_task("arith", split="train", level=3)
    random.Random(3).shuffle(mixed)
    assert corpus.training_pool(SimpleNamespace(**{**vars(cfg), "level": 3})) == mixed
    assert corpus.training_questions(cfg) == (pool[4:9], pool[:4])
    # a file task: the file's train split
    asked = []
    monkeypatch.setattr(
        corpus.data, "load_task", lambda *a, **kw: asked.append((a, kw)) or list(range(6))
    )
    file_cfg = SimpleNamespace(task="gsm8k", path="g.jsonl", level=2, seed=3)
    assert sorted(corpus.training_pool(file_cfg)) == list(range(6))
    assert asked == [(("gsm8k",), {"path": "g.jsonl", "split": "train", "level": 2})]
    monkeypatch.undo()
    assert corpus.training_questions(cfg, 2) == (pool[14:19], pool[:4])
    # a pool of 19: iterations 0..2 fit exactly, iteration 3 does not
    monkeypatch.setattr(corpus, "training_pool", lambda cfg: list(range(19)))
    assert corpus.training_questions(cfg, 2) == ([14, 15, 16, 17, 18], [0, 1, 2, 3])
    with pytest.raises(UsageError) as error:
        corpus.training_questions(cfg, 3)
    assert str(error.value) == (
        "task 'arith' has 19 training questions: not enough for val_n=4 + questions=5 per "
        "iteration over 4 iteration(s)"
    )


def test_resolve_engine_dtype(monkeypatch):
    resolved, why = corpus.resolve_engine_dtype(EngineConfig(dtype="float16", seed=1), "cuda:0")
    assert (resolved.dtype, why) == ("float16", "as asked (--dtype)") and resolved.seed == 1
    # auto asks the device (the GPU on a GPU, "cpu" by default) and, on a CPU, the probe of the
    # model the engines run (a team's: its first agent's base) at the engine's batch size
    monkeypatch.setattr(corpus, "resolve_dtype", lambda dtype, *args: (f"{dtype} on {args}", "why"))
    assert corpus.resolve_engine_dtype(EngineConfig(dtype="auto"))[0].dtype == (
        "auto on ('cpu', None, 1)"
    )
    resolved, why = corpus.resolve_engine_dtype(
        EngineConfig(dtype="auto", engine_batch_size=64, model="M"), "cuda:1"
    )
    assert (resolved.dtype, why) == ("auto on ('cuda:1', 'M', 64)", "why")
    team = EngineConfig(dtype="auto", models="A+a0.pt,default+a1.pt")
    assert corpus.resolve_engine_dtype(team)[0].dtype == "auto on ('cpu', 'A', 1)"


@dataclass
class EngineConfig:
    model: str = ""
    models: str = ""
    agents: int = 2
    dtype: str = "float32"
    engine_batch_size: int = 1
    cache_dir: str = ""
    seed: int = 0


class FakeEngine:
    def __init__(self, **kw):
        self.kw, self.model = kw, f"weights of {kw['model_path']}"


def test_make_engine_arguments(monkeypatch):
    """One engine: the model (None for the default), dtype, device as text, batch size, cache
    directory (None for none), and a progress bar on rank 0 only."""
    monkeypatch.setattr(corpus, "Engine", FakeEngine)
    cfg = SimpleNamespace(model="m", dtype="bfloat16", engine_batch_size=7, cache_dir="c")
    assert corpus.make_engine(cfg, 0, torch.device("cpu")).kw == dict(
        model_path="m", dtype="bfloat16", device="cpu", batch_size=7, cache_dir="c",
        progress=True,
    )  # fmt: skip
    cfg = SimpleNamespace(model="", dtype="float32", engine_batch_size=2, cache_dir="", models="")
    assert corpus.make_engine(cfg, 1).kw == dict(
        model_path=None, dtype="float32", device="cpu", batch_size=2, cache_dir=None,
        progress=False,
    )  # fmt: skip


def test_make_engine_of_a_team(monkeypatch):
    """--models: one engine per distinct base (on the rank and device given), each distinct
    (base, adapter) loaded once into its base's engine; a mismatched adapter is refused naming the
    file."""
    monkeypatch.setattr(corpus, "Engine", FakeEngine)
    loads = []

    def load_adapter(model, state):
        loads.append((model, state))
        return f"adapter {state}"

    monkeypatch.setattr(corpus.lora, "load_adapter", load_adapter)
    monkeypatch.setattr(corpus, "load_file", lambda path, what: f"{path} as {what}")
    cfg = EngineConfig(models="default+a.pt,b,default+a.pt,b+c.pt", agents=4, engine_batch_size=3)
    team = corpus.make_engine(cfg, 1, "cuda:1")
    engines = [m.engine for m in team.members]
    assert engines[0] is engines[2] and engines[1] is engines[3] and engines[0] is not engines[1]
    assert [e.kw["model_path"] for e in engines] == [None, "b", None, "b"]
    assert all(e.kw["device"] == "cuda:1" for e in engines)
    assert all(e.kw["progress"] is False and e.kw["batch_size"] == 3 for e in engines)
    assert [m.adapter for m in team.members] == [
        "adapter a.pt as adapter",
        None,
        "adapter a.pt as adapter",
        "adapter c.pt as adapter",
    ]
    assert loads == [("weights of None", "a.pt as adapter"), ("weights of b", "c.pt as adapter")]

    def mismatch(model, state):
        raise lora.AdapterMismatch("rank 8 there, 4 here")

    monkeypatch.setattr(corpus.lora, "load_adapter", mismatch)
    with pytest.raises(FileRefused) as error:
        corpus.make_engine(replace(cfg, models="b+x.pt,b", agents=2), 0)
    assert str(error.value) == "x.pt: rank 8 there, 4 here"


# --------------------------------------------------------------------------------- collect_states
def transcript(qid, rounds):
    """A played game: each round's actions, 2 agents (agent 1 right in round 0, agent 0 wrong)."""
    records = [{"agent_correct": [False, True], "confidence": [0.5, 0.5]}]
    for t in range(1, rounds + 1):
        records.append({
            "own": [[t, 0.0], [t, 1.0]], "peers": [[[t, 2.0]], [[t, 3.0]]],
            "actions": [REFINE, PERSIST], "reward_vectors": [[t, 0, 0], [0, t, 0]],
            "agent_correct": [True, True], "confidence": [0.5, 0.5],
        })  # fmt: skip
    return {"id": qid, "rounds": records}


class Bar:
    def __init__(self, total):
        self.total = total

    def close(self):
        pass


def test_collect_states_asks_play_for_the_shard_and_the_game(monkeypatch):
    """play gets this rank's shard, the game of the config with sampled actions, the critic and the
    REFINE cost asked for, states recorded, counterfactual rewards as asked; rows come in key
    order, rewards only when counterfactual; no state at all is an error."""
    asked = []

    def play(engine, shard, policy, game, record_states, counterfactual, progress):
        asked.append((engine, shard, policy, game, record_states, counterfactual, progress.total))
        return [transcript(q, 2) for q in reversed(shard)]

    monkeypatch.setattr(corpus.deliberate, "play", play)
    bars = []
    monkeypatch.setattr(corpus, "tqdm", lambda **kw: bars.append(kw) or Bar(kw["total"]))
    cfg = SimpleNamespace(agents=2, rounds=2, seed=5, temperature=0.7)
    rows = corpus.collect_states("E", ["a", "b", "c"], "pi", cfg, True, 1, 2, critic=True,
                                 refine_cost=0.25)  # fmt: skip
    [(engine, shard, policy, game, record, counterfactual, total)] = asked
    assert (engine, shard, policy, record, counterfactual, total) == (
        "E",
        ["b"],
        "pi",
        True,
        True,
        2,
    )
    assert game == D.GameConfig(
        agents=2, rounds=2, seed=5, temperature=0.7, greedy_policy=False, critic=True,
        refine_cost=0.25,
    )  # fmt: skip
    assert [r["key"] for r in rows] == [("b", t, i) for t in (1, 2) for i in (0, 1)]
    assert [r["rewards"] for r in rows] == [[1, 0, 0], [0, 1, 0], [2, 0, 0], [0, 2, 0]]
    assert [r["own"] for r in rows] == [[1, 0.0], [1, 1.0], [2, 0.0], [2, 1.0]]
    assert [r["peers"] for r in rows] == [[[1, 2.0]], [[1, 3.0]], [[2, 2.0]], [[2, 3.0]]]
    # round 1's labels read round 0 (agent 0 wrong: concede to its right peer); round 2's round 1
    assert [r["label"] for r in rows] == [concede(0), PERSIST, PERSIST, PERSIST]
    rows = corpus.collect_states("E", ["a", "b", "c"], "pi", cfg, False, 0, 1)
    assert [r["key"][0] for r in rows] == ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    assert all(r["rewards"] is None for r in rows)
    corpus.collect_states("E", ["a"], "pi", cfg, False, 0, 1, desc="sft")
    # a bar of the rounds on rank 0 only, named by `desc` ("collect"), cleared when done
    bar = dict(total=2, desc="collect", disable=False, leave=False)
    assert bars == [{**bar, "disable": True}, bar, {**bar, "desc": "sft"}]
    assert asked[-2][3] == D.GameConfig(agents=2, rounds=2, seed=5, temperature=0.7,
                                        greedy_policy=False)  # fmt: skip
    monkeypatch.setattr(corpus.deliberate, "play", lambda *a, **kw: [transcript("a", 0)])
    with pytest.raises(ValueError, match=r"^the games visited no state after round 0 \(did every "):
        corpus.collect_states("E", ["a"], Script(None), cfg, False, 0, 1)


# -------------------------------------------------------------------------- the corpus as tensors
def test_states_to_tensors():
    rows = [
        {"own": [0, 1], "peers": [[2]], "agent": a, "action": 3 - a, "label": a, "rewards": r}
        for a, r in ((0, [1, 2]), (1, [3, 4]))
    ]
    t = corpus.states_to_tensors(rows)
    assert t["own"].dtype == t["peers"].dtype == t["rewards"].dtype == torch.float32
    assert t["own"].tolist() == [[0, 1], [0, 1]] and t["peers"].tolist() == [[[2]], [[2]]]
    assert t["agent"].tolist() == [0, 1] and t["action"].tolist() == [3, 2]
    assert t["label"].tolist() == [0, 1] and t["rewards"].tolist() == [[1, 2], [3, 4]]
    assert t["action"].dtype == torch.int64
    assert "rewards" not in corpus.states_to_tensors([{**r, "rewards": None} for r in rows])
    assert corpus.states_to_tensors(rows[:1])["rewards"].tolist() == [[1, 2]]


# ------------------------------------------------------------------------- saving and loading one
def test_corpus_settings_save_and_load(tmp_path):
    """The settings saved are the corpus settings the config has; a missing file is None; a file
    without settings, or with a setting changed, is refused in one line; a setting the config does
    not have (an older script's) is not compared; only rank 0 writes."""
    cfg = SimpleNamespace(task="arith", seed=1, temperature=0.5, cache_dir="x", crash_at_step=3)
    assert corpus.corpus_settings(cfg) == {"task": "arith", "seed": 1, "temperature": 0.5}
    path = tmp_path / "corpus.pt"
    assert corpus.load_corpus(path, cfg) is None
    corpus.save_corpus([{"key": 1}], path, 1, cfg)
    assert not path.exists()
    corpus.save_corpus([{"key": 1}], path, 0, cfg)
    assert torch.load(path)["settings"] == {"task": "arith", "seed": 1, "temperature": 0.5}
    assert corpus.load_corpus(path, cfg) == [{"key": 1}]
    other = SimpleNamespace(task="arith", seed=1, temperature=0.5, vote="index", cache_dir="y")
    assert corpus.load_corpus(path, other) == [{"key": 1}]
    fewer = SimpleNamespace(task="arith", seed=1)
    assert corpus.load_corpus(path, fewer) == [{"key": 1}]
    with pytest.raises(UsageError) as error:
        corpus.load_corpus(path, SimpleNamespace(task="arith", seed=2, temperature=0.9))
    assert str(error.value) == (
        f"{path} was collected with other settings (seed: 1 there, 2 now, temperature: 0.5 "
        "there, 0.9 now): rerun with the same flags, or pass another --out-dir"
    )
    with pytest.raises(FileRefused, match=f"^{tmp_path}: cannot read the corpus file"):
        corpus.load_corpus(tmp_path, cfg)
    for old in ([{"key": 1}], {"rows": [{"key": 1}]}):
        torch.save(old, path)
        with pytest.raises(UsageError) as error:
            corpus.load_corpus(path, cfg)
        assert str(error.value) == (
            f"{path}: a corpus without its settings (an older version): delete it"
        )


# ------------------------------------------------------------------------------------ statistics
def test_action_distribution():
    """K = 5 (3 CONCEDE targets): 1 PERSIST, 2 REFINE, 3 CONCEDE to two of the targets."""
    actions = torch.tensor([PERSIST, REFINE, REFINE, concede(0), concede(2), concede(2)])
    assert corpus.action_distribution(actions, 5) == {
        "persist": round(1 / 6, 4), "refine": round(2 / 6, 4), "concede": 0.5,
    }  # fmt: skip
    # minlength: K counted even where the last kinds never occur
    assert corpus.action_distribution(torch.tensor([PERSIST]), 4) == {
        "persist": 1.0, "refine": 0.0, "concede": 0.0,
    }  # fmt: skip


def test_corpus_statistics_by_hand():
    """4 states, K = 4: flat; two values; three values; four values. Actions taken: PERSIST,
    REFINE, CONCEDE 0, CONCEDE 1."""
    rewards = torch.tensor(
        [[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 1.0, 1.0], [0.0, 0.25, 1.0, 0.0], [-1.0, 0.0, 0.5, 0.75]]
    )
    actions = torch.tensor([PERSIST, REFINE, concede(0), concede(1)])
    stats = corpus.corpus_statistics({"rewards": rewards, "action": actions}, 4)
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
    stats = corpus.best_action_kinds(rewards)
    assert stats["best_kind"] == {"persist": 0.0, "refine": 0.25, "concede": 0.25, "tied": 0.5}
    assert stats["refine_minus_persist"] == pytest.approx((1 - 0.5 + 0 + 0.5) / 4)
    # shares are rounded to 4 places
    thirds = corpus.best_action_kinds(rewards[1:])["best_kind"]
    assert thirds == {"persist": 0.0, "refine": 0.3333, "concede": 0.3333, "tied": 0.3333}


# -------------------------------------------------------------------------------- evaluate_policy
def test_evaluate_policy_sums_the_shard(monkeypatch):
    """play gets this rank's shard and the config's game with a greedy policy; accuracy and tokens
    are per question, actions shares of every decision (none taken: all 0)."""
    asked = []

    def play(engine, shard, policy, game):
        asked.append((engine, shard, policy, game))
        return [
            {"correct": True, "tokens": 30, "rounds": [{}, {"actions": [PERSIST, concede(1)]}]},
            {"correct": False, "tokens": 10, "rounds": [{}, {"actions": [REFINE, REFINE]}]},
            {"correct": True, "tokens": 20, "rounds": [{}]},
        ][: len(shard)]

    monkeypatch.setattr(corpus.deliberate, "play", play)
    devices = []
    real_sum = corpus.all_reduce_sum
    monkeypatch.setattr(
        corpus,
        "all_reduce_sum",
        lambda values, device: devices.append(device) or real_sum(values, device),
    )
    # a config that samples its policy (greedy_policy False) is still evaluated greedily
    cfg = SimpleNamespace(agents=2, rounds=1, seed=4, critic=True, greedy_policy=False)
    out = corpus.evaluate_policy("E", list("abcdefg"), "pi", cfg, 1, 2, "cpu")
    assert asked == [
        (
            "E",
            ["b", "d", "f"],
            "pi",
            D.GameConfig(agents=2, rounds=1, seed=4, critic=True, greedy_policy=True),
        )
    ]
    assert out == {
        "val_accuracy": 2 / 3, "val_tokens": 20.0,
        "val_actions": {"persist": 0.25, "refine": 0.5, "concede": 0.25},
    }  # fmt: skip
    out = corpus.evaluate_policy("E", list("abcdefg"), "pi", cfg, 2, 3, "cpu")
    assert asked[-1][1] == ["c", "f"] and devices == ["cpu", "cpu"]
    # shares rounded to 4 places; a single decision in all has share 1
    for actions, shares in (([PERSIST, REFINE, concede(0)], [0.3333] * 3), ([REFINE], [0, 1, 0])):
        game = {"correct": 1, "tokens": 3, "rounds": [{}, {"actions": actions}]}
        monkeypatch.setattr(corpus.deliberate, "play", lambda *a, game=game: [game])
        out = corpus.evaluate_policy("E", ["a"], "pi", cfg, 0, 1, "cpu")
        assert list(out["val_actions"].values()) == shares
    monkeypatch.setattr(
        corpus.deliberate, "play", lambda *a: [{"correct": 0, "tokens": 4, "rounds": [{}]}]
    )
    out = corpus.evaluate_policy("E", ["a"], "pi", cfg, 0, 1, "cpu")
    assert out == {
        "val_accuracy": 0.0, "val_tokens": 4.0,
        "val_actions": {"persist": 0.0, "refine": 0.0, "concede": 0.0},
    }  # fmt: skip
