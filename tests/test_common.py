"""common.py's checks and files, llm/team.py's engine from flags and data's training questions, by
hand, in process and without a model: the flags that data.check_task, solutions.check_game and
llm.team.check_engine refuse and the one line each says (task, --path, level, agents, rounds,
temperature, token budget, vote, dtype, --model / --models, checkpoint directories, context),
team_entries, the training pool and its validation / iteration slices, make_engine's arguments (and
a team's engines and adapters), rows as tensors, the settings a corpus is saved with and refused
under, the data order of every epoch and the rows each rank takes, a script's config made of
its own flags (common.field_docs). Fast, so the mutation runs of common.py and llm/ use them
(experiments/mutation.py)."""

import dataclasses
import hashlib
import io
import json
import random
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch

import common
import data
import deliberate
import llm.team as teams
import solutions
from common import FileRefused, UsageError
from llm import lora
from solutions import GameConfig


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
        task="arith",
        path="",
        level=0,
        agents=2,
        rounds=1,
        temperature=0.0,
        val_n=0,
        max_new_tokens=63,
        engine_batch_size=1,
        vote="mean_prob",
        dtype="auto",
        models="",
        model=str(tmp_path / "model"),
        top_p=1.0,
    )
    if not (tmp_path / "model").exists():
        model_dir(tmp_path)
    return SimpleNamespace(**{**settings, **kw})


def check_flags(cfg, **kw):
    """What a game script checks first: its task, game and engine flags."""
    data.check_task(cfg)
    solutions.check_game(cfg, **kw)
    teams.check_engine(cfg, cfg.agents, cfg.max_new_tokens)


def refused(cfg, message, **kw):
    with pytest.raises((UsageError, data.DataError)) as error:
        check_flags(cfg, **kw)
    assert str(error.value) == message


# ---------------------------------------------------------- check_task, check_game, check_engine
def test_check_game_accepts_the_edges(tmp_path):
    """Levels 0 and 4, 2 agents and 1 round (the defaults' minimums), temperature and val_n 0, one
    token below the context, each dtype; a trainer's game and engine settings."""
    for kw in (
        {},
        {"level": 4},
        {"dtype": "float32"},
        {"dtype": "bfloat16"},
        {"vote": "index"},
        {"max_new_tokens": 1, "engine_batch_size": 1},
    ):
        check_flags(game(tmp_path, **kw))
    check_flags(game(tmp_path, agents=1, rounds=0), min_agents=1, min_rounds=0)
    data_file = tmp_path / "q.jsonl"
    data_file.write_text("")
    check_flags(game(tmp_path, task="gsm8k", path=str(data_file)))
    # a trainer's share of the flags (no rounds, temperature, top-p, vote, dtype or models): the
    # game's and the engine's settings it builds, the others at their defaults
    model = str(tmp_path / "model")
    solutions.check_game(GameConfig(agents=1, max_new_tokens=63), min_agents=1)
    teams.check_engine(teams.EngineConfig(model=model, engine_batch_size=1), 1, 63)
    with pytest.raises(UsageError, match="^--engine-batch-size 0: must be at least 1$"):
        teams.check_engine(teams.EngineConfig(model=model, engine_batch_size=0), 1, 63)


def test_check_game_refuses_in_one_line(tmp_path):
    tmp = str(tmp_path)
    data_file = tmp_path / "q.jsonl"
    data_file.write_text("")
    cases = [
        ({"task": "chess"}, "unknown --task 'chess': choose one of " + ", ".join(data.TASKS)),
        ({"task": "gsm8k"}, "--task gsm8k reads a data file: pass it with --path"),
        ({"task": "gsm8k", "path": tmp + "/none"}, f"--path {tmp + '/none'!r}: no such file"),
        (
            {"path": str(data_file)},
            f"--path {str(data_file)!r}: task arith is generated and reads no file",
        ),
        ({"level": 5}, "--level 5: choose 1..4 (0: the task's default)"),
        ({"level": -1}, "--level -1: choose 1..4 (0: the task's default)"),
        ({"agents": 1}, "--agents 1: must be at least 2"),
        ({"rounds": 0}, "--rounds 0: must be at least 1"),
        ({"temperature": -0.5}, "--temperature -0.5: must be at least 0"),
        ({"top_p": 0}, "--top-p 0: must be in (0, 1]"),
        ({"top_p": 1.5}, "--top-p 1.5: must be in (0, 1]"),
        ({"max_new_tokens": 0}, "--max-new-tokens 0: must be at least 1"),
        ({"engine_batch_size": 0}, "--engine-batch-size 0: must be at least 1"),
        (
            {"vote": "loudest"},
            "unknown --vote 'loudest': choose one of min_prob, mean_prob, tail_prob, index",
        ),
        (
            {"dtype": "int4"},
            "unknown --dtype 'int4': choose one of auto, float32, bfloat16, float16, int8",
        ),
        (
            {"models": "default,default"},
            "--model and --models: pass one (--models names every agent's model)",
        ),
        (
            {"max_new_tokens": 64},
            "--max-new-tokens 64: the model's context holds 64 tokens, prompt included",
        ),
        ({"model": tmp}, f"--model {tmp!r}: not an HF checkpoint directory (no config.json)"),
        (
            {"model": "", "models": f"{tmp}/model,{tmp}/model+{tmp}/none.pt"},
            f"--models: no adapter file or folder {tmp + '/none.pt'!r}",
        ),
        (
            {"model": "", "models": f"{tmp}/model"},
            "--models: 1 entries for 2 agents (one per agent)",
        ),
        (
            {"model": "", "models": f"{tmp}/model,{tmp}"},
            f"--models {tmp!r}: not an HF checkpoint directory (no config.json)",
        ),
    ]
    for kw, message in cases:
        refused(game(tmp_path, **kw), message)
    refused(game(tmp_path, agents=2), "--agents 2: must be at least 3", min_agents=3)
    refused(game(tmp_path, rounds=1), "--rounds 1: must be at least 2", min_rounds=2)


def test_check_model_reads_the_context_and_the_tokenizer_files(tmp_path):
    """The context is max_position_embeddings, else n_positions; none: any budget. Any one of the
    three tokenizer files will do; none is refused. The budget is checked against the --models
    entries' context too (an adapter that exists passes)."""
    for tok in ("tokenizer.json", "tokenizer.model", "vocab.json"):
        teams.check_model("--model", str(model_dir(tmp_path, tok, tok=tok)), 63)
    gpt2 = model_dir(tmp_path, "gpt2", context=32, key="n_positions", tok="vocab.json")
    teams.check_model("--model", str(gpt2), 31)
    with pytest.raises(UsageError, match="^--max-new-tokens 32: the model's context holds 32 "):
        teams.check_model("--model", str(gpt2), 32)
    teams.check_model("--model", str(model_dir(tmp_path, "open", key=None)), 10**6)
    bare = model_dir(tmp_path, "bare", tok=None)
    with pytest.raises(UsageError) as error:
        teams.check_model("--models", str(bare), 1)
    assert str(error.value) == (
        f"--models {str(bare)!r}: no tokenizer files (tokenizer.json) in the directory"
    )
    # a model the engine cannot decode is refused in backbone.refusal's words, naming the flag
    t5 = model_dir(tmp_path, "t5")
    (t5 / "config.json").write_text(json.dumps({"is_encoder_decoder": True, "model_type": "t5"}))
    with pytest.raises(UsageError) as error:
        teams.check_model("--peers-model", str(t5), 1)
    assert str(error.value) == (
        f"--peers-model {str(t5)!r}: t5 is an encoder-decoder model; the engine runs decoder-only "
        "causal LMs of text"
    )
    adapter = tmp_path / "a.pt"
    adapter.write_text("")
    teams.check_models("--models", f"{gpt2}+{adapter},{gpt2}", 2, 31)
    with pytest.raises(UsageError, match="^--max-new-tokens 32: "):
        teams.check_models("--models", f"{gpt2}+{adapter},{gpt2}", 2, 32)
    cfg = game(tmp_path, model="", models=f"{gpt2},{gpt2}", max_new_tokens=32)
    refused(cfg, "--max-new-tokens 32: the model's context holds 32 tokens, prompt included")


def test_team_entries():
    """One (base, adapter) per agent, blanks around an entry dropped, `default` the embedded
    backbone (""), the flag named in the refusal."""
    assert teams.team_entries(" default , m1+a.pt,m2 ", 3) == [("", ""), ("m1", "a.pt"), ("m2", "")]
    for call, flag in (
        (lambda: teams.team_entries("a,b", 3), "--models"),
        (lambda: teams.team_entries("a,b", 3, "--team"), "--team"),
        (lambda: teams.check_models("--team", "a,b", 3, 1), "--team"),
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
    assert data.training_pool(cfg) == pool
    mixed = data.load_task("arith", split="train", level=3)
    random.Random(3).shuffle(mixed)
    assert data.training_pool(SimpleNamespace(**{**vars(cfg), "level": 3})) == mixed
    assert data.training_questions(cfg) == (pool[4:9], pool[:4])
    # a file task: the file's train split
    asked = []
    monkeypatch.setattr(data, "load_task", lambda *a, **kw: asked.append((a, kw)) or list(range(6)))
    file_cfg = SimpleNamespace(task="gsm8k", path="g.jsonl", level=2, seed=3)
    assert sorted(data.training_pool(file_cfg)) == list(range(6))
    assert asked == [(("gsm8k",), {"path": "g.jsonl", "split": "train", "level": 2})]
    monkeypatch.undo()
    assert data.training_questions(cfg, 2) == (pool[14:19], pool[:4])
    # a pool of 19: iterations 0..2 fit exactly, iteration 3 does not
    monkeypatch.setattr(data, "training_pool", lambda cfg: list(range(19)))
    assert data.training_questions(cfg, 2) == ([14, 15, 16, 17, 18], [0, 1, 2, 3])
    with pytest.raises(data.DataError) as error:
        data.training_questions(cfg, 3)
    assert str(error.value) == (
        "task 'arith' has 19 training questions: not enough for val_n=4 + questions=5 per "
        "iteration over 4 iteration(s)"
    )


def test_resolve_engine_dtype(monkeypatch):
    resolved, why = teams.resolve_engine_dtype(EngineConfig(dtype="float16", seed=1), "cuda:0")
    assert (resolved.dtype, why) == ("float16", "as asked (--dtype)") and resolved.seed == 1
    # auto asks the device (the GPU on a GPU, "cpu" by default) and, on a CPU, the probe of the
    # model the engines run (a team's: its first agent's base) at the engine's batch size
    monkeypatch.setattr(teams, "resolve_dtype", lambda dtype, *args: (f"{dtype} on {args}", "why"))
    assert teams.resolve_engine_dtype(EngineConfig(dtype="auto"))[0].dtype == (
        "auto on ('cpu', None, 1)"
    )
    resolved, why = teams.resolve_engine_dtype(
        EngineConfig(dtype="auto", engine_batch_size=64, model="M"), "cuda:1"
    )
    assert (resolved.dtype, why) == ("auto on ('cuda:1', 'M', 64)", "why")
    team = EngineConfig(dtype="auto", models="A+a0.pt,default+a1.pt")
    assert teams.resolve_engine_dtype(team)[0].dtype == "auto on ('cpu', 'A', 1)"


@dataclass
class EngineConfig(teams.EngineConfig):
    """A script's engine flags, some other defaults, and one of the game's (seed)."""

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
    monkeypatch.setattr(teams, "Engine", FakeEngine)
    cfg = SimpleNamespace(
        model="m", models="", dtype="bfloat16", engine_batch_size=7, cache_dir="c"
    )
    assert teams.make_engine(cfg, 2, 0, torch.device("cpu")).kw == dict(
        model_path="m", dtype="bfloat16", device="cpu", batch_size=7, cache_dir="c", progress=True
    )
    cfg = SimpleNamespace(model="", dtype="float32", engine_batch_size=2, cache_dir="", models="")
    assert teams.make_engine(cfg, 2, 1).kw == dict(
        model_path=None, dtype="float32", device="cpu", batch_size=2, cache_dir=None, progress=False
    )


def test_make_engine_of_a_team(monkeypatch):
    """--models: one engine per distinct base (on the rank and device given), each distinct
    (base, adapter) loaded once into its base's engine; a mismatched adapter is refused naming the
    file."""
    monkeypatch.setattr(teams, "Engine", FakeEngine)
    loads = []

    def load_adapter(model, state):
        loads.append((model, state))
        return f"adapter {state}"

    monkeypatch.setattr(teams.lora, "load_adapter", load_adapter)
    monkeypatch.setattr(teams, "load_file", lambda path, what: f"{path} as {what}")
    cfg = EngineConfig(models="default+a.pt,b,default+a.pt,b+c.pt", engine_batch_size=3)
    team = teams.make_engine(cfg, 4, 1, "cuda:1")
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

    # adapters of mixed ranks on one base: the highest loads first (it wraps the engine), each
    # agent keeps its own
    files = {"lo.pt": {"rank": 4}, "hi.pt": {"rank": 8}, "mid.pt": {"rank": 4}}
    monkeypatch.setattr(teams, "load_file", lambda path, what: dict(files[path], path=path))
    loads.clear()
    team = teams.make_engine(replace(cfg, models="b+lo.pt,b+hi.pt,b+mid.pt"), 3, 0)
    assert [state["path"] for _, state in loads] == ["hi.pt", "lo.pt", "mid.pt"]
    names = ["lo.pt", "hi.pt", "mid.pt"]
    assert [m.adapter for m in team.members] == [f"adapter {dict(files[n], path=n)}" for n in names]
    monkeypatch.setattr(teams, "load_file", lambda path, what: f"{path} as {what}")

    # rank 0's engines show progress
    assert all(m.engine.kw["progress"] for m in teams.make_engine(cfg, 4, 0, "cpu").members)

    def mismatch(model, state):
        raise lora.AdapterMismatch("rank 8 there, 4 here")

    monkeypatch.setattr(teams.lora, "load_adapter", mismatch)
    with pytest.raises(FileRefused) as error:
        teams.make_engine(replace(cfg, models="b+x.pt,b"), 2, 0)
    assert str(error.value) == "x.pt: rank 8 there, 4 here"


# -------------------------------------------------------------------------- the corpus as tensors
def test_stack_rows():
    rows = [
        {"own": [0, 1], "peers": [[2]], "agent": a, "action": 3 - a, "rewards": r, "x": None}
        for a, r in ((0, [1, 2]), (1, [3.5, 4]))
    ]
    t = common.stack_rows(rows, floats=("own", "peers", "rewards"), ints=("agent", "action"))
    assert list(t) == ["own", "peers", "rewards", "agent", "action"]
    assert t["own"].dtype == t["peers"].dtype == t["rewards"].dtype == torch.float32
    assert t["own"].tolist() == [[0, 1], [0, 1]] and t["peers"].tolist() == [[[2]], [[2]]]
    assert t["agent"].tolist() == [0, 1] and t["action"].tolist() == [3, 2]
    assert t["rewards"].tolist() == [[1, 2], [3.5, 4]]
    assert t["action"].dtype == t["agent"].dtype == torch.int64


# ------------------------------------------------------------------------- saving and loading one
def test_corpus_settings_save_and_load(tmp_path):
    """The settings of a corpus: the task, every game setting, the agents' models and dtype (not
    the engine's batch size or cache), and the settings a script adds; a missing file is None; a
    file without settings, or with a setting changed, is refused in one line; a setting the file
    does not have (an older script's) is not compared; only rank 0 writes."""
    task = {"task": "arith", "path": "", "level": 2}
    cfg = SimpleNamespace(**task, **vars(teams.EngineConfig()), questions=4, crash_at_step=3)
    settings = deliberate.corpus_settings(cfg, GameConfig(seed=1), questions=cfg.questions)
    game = [*task, *vars(GameConfig()), "model", "models", "dtype"]
    assert list(settings) == game + ["questions"] and settings["seed"] == 1
    assert settings["questions"] == 4 and settings["temperature"] == 0.5 and settings["level"] == 2
    path = tmp_path / "corpus.pt"
    assert common.load_made_under(path, settings, "corpus") is None
    common.save_made_under([{"key": 1}], path, settings, 1)
    assert not path.exists()
    small = {"task": "arith", "seed": 1, "temperature": 0.5}
    common.save_made_under([{"key": 1}], path, small, 0)
    assert torch.load(path)["settings"] == small
    assert common.load_made_under(path, small, "corpus") == [{"key": 1}]
    assert common.load_made_under(path, settings, "corpus") == [{"key": 1}]
    fewer = {"task": "arith", "seed": 1}
    assert common.load_made_under(path, fewer, "corpus") == [{"key": 1}]
    with pytest.raises(UsageError) as error:
        common.load_made_under(path, {**small, "seed": 2, "temperature": 0.9}, "corpus")
    assert str(error.value) == (
        f"{path} was collected with other settings (seed: 1 there, 2 now, temperature: 0.5 "
        "there, 0.9 now): rerun with the same flags, or pass another --out-dir"
    )
    with pytest.raises(FileRefused, match=f"^{tmp_path}: cannot read the corpus file"):
        common.load_made_under(tmp_path, small, "corpus")
    for old in ([{"key": 1}], {"rows": [{"key": 1}]}):
        torch.save(old, path)
        with pytest.raises(UsageError) as error:
            common.load_made_under(path, small, "corpus")
        assert str(error.value) == (
            f"{path}: a corpus without its settings (an older version): delete it"
        )


# ---------------------------------------------------------------- the data order, rows per rank
def test_every_epoch_takes_its_own_data_order():
    """batch_schedule: each epoch shuffles with its own seed (seed, tag, epoch), so epochs differ,
    while the same (seed, tag) gives the same schedule; the last partial batch is dropped."""
    batches = common.batch_schedule(12, 4, 3, seed=0, tag="sft")
    assert len(batches) == 9 and all(len(b) == 4 for b in batches)
    epochs = [torch.cat(batches[e * 3 : (e + 1) * 3]).tolist() for e in range(3)]
    assert all(sorted(order) == list(range(12)) for order in epochs)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2] and epochs[0] != epochs[2]
    again = common.batch_schedule(12, 4, 3, seed=0, tag="sft")
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    other = common.batch_schedule(12, 4, 3, seed=1, tag="sft")
    assert [b.tolist() for b in other] != [b.tolist() for b in batches]
    # the tag too: stage 2's iterations (rl-0, rl-1) each take their own order
    other = common.batch_schedule(12, 4, 3, seed=0, tag="rl-0")
    assert [b.tolist() for b in other] != [b.tolist() for b in batches]
    assert len(common.batch_schedule(13, 4, 2, seed=0, tag="x")) == 6
    assert len(common.batch_schedule(3, 4, 2, seed=0, tag="x")) == 2


def test_rows_shard_over_ranks_without_dropping_any():
    """shard_rows: rank r takes rows r::world of the global batch, the last rows included when they
    do not divide evenly; each rank's weight is its share of the rows times the world size, so the
    ranks' weighted means add up to the batch mean."""
    tensors = {"x": torch.arange(10.0) * 10}
    rows = torch.tensor([9, 8, 7, 6, 5, 4, 3])
    shards = [common.shard_rows(tensors, rows, r, 3, "cpu") for r in range(3)]
    assert [s["x"].tolist() for s, _ in shards] == [[90, 60, 30], [80, 50], [70, 40]]
    assert sorted(v for s, _ in shards for v in s["x"].tolist()) == sorted((rows * 10).tolist())
    assert [w for _, w in shards] == [pytest.approx(9 / 7), pytest.approx(6 / 7), 6 / 7]
    means = sum(s["x"].mean() * w for s, w in shards) / 3
    assert means.item() == pytest.approx((rows * 10.0).mean().item())
    with pytest.raises(ValueError, match="a batch of 2 rows cannot be split over 3 ranks"):
        common.shard_rows(tensors, rows[:2], 0, 3, "cpu")
    # as many rows as ranks: one each, weight 1
    assert [common.shard_rows(tensors, rows[:3], r, 3, "cpu")[1] for r in range(3)] == [1.0] * 3
    # on the device asked for
    assert common.shard_rows(tensors, rows, 1, 3, "meta")[0]["x"].device.type == "meta"


# --------------------------------------------------------------------------- the rest of common.py
@dataclass
class Flags:
    seed: int = 0
    """the seed"""
    extra: bool = False
    """a flag of the script"""


@dataclass
class Sub(Flags):
    agents: int = 4
    """the subclass's own words"""


def test_a_studys_config_adds_its_flags_to_the_scripts():
    """field_docs reads a script's class's docstrings, and a study's subclass adds its own (a lab
    file beside the script: experiments/rl_later_credit.py)."""
    assert common.field_docs(Flags) == {"seed": "the seed", "extra": "a flag of the script"}
    own = {"agents": "the subclass's own words"}
    assert common.field_docs(Sub) == common.field_docs(Flags) | own
    cfg = common.parse_config(Flags, ["--seed", "3", "--extra"])
    assert cfg == Flags(seed=3, extra=True) and common.parse_config(Flags, []) == Flags()
    assert common.parse_config(Sub, ["--agents", "2"]) == Sub(agents=2)


def test_the_game_of_a_scripts_flags():
    """GameConfig.of: every setting of the game from the flag of the same name, and no other flag;
    a script without one of them cannot use it (AttributeError names the missing one)."""
    flags = {f.name: f.default for f in dataclasses.fields(GameConfig)}
    changed = flags | {"rounds": 1, "vote": "index", "whole_solutions": True, "seed": 7}
    game = GameConfig.of(SimpleNamespace(**changed, questions=3))
    assert dataclasses.asdict(game) == changed
    with pytest.raises(AttributeError, match="top_p"):
        GameConfig.of(SimpleNamespace(**{k: v for k, v in flags.items() if k != "top_p"}))


def test_checks_name_the_flag_and_the_value():
    with pytest.raises(UsageError, match=r"^--steps 0: must be at least 1$"):
        common.check_at_least(1, ok=1, steps=0)
    common.check_at_least(0, steps=0)
    with pytest.raises(UsageError, match=r"^--lr 0\.0: must be > 0$"):
        common.check_positive(ok=1, lr=0.0)
    with pytest.raises(UsageError, match=r"^--tau -1\.0: must be > 0$"):
        common.check_positive(tau=-1.0)
    with pytest.raises(UsageError, match=r"^--questions-per-step 0: must be at least 2$"):
        common.check_at_least(2, questions_per_step=0)
    with pytest.raises(UsageError, match=r"^unknown --x 'c': choose one of a, 1$"):
        common.check_choice("--x", "c", ("a", 1))
    common.check_choice("--x", 1, ("a", 1))


def test_user_errors_end_in_one_line(capsys):
    """A user's mistake: its line on stderr, exit status 2; Ctrl-C: how to resume, status 130."""
    for error in (UsageError("bad flag"), FileRefused("bad file"), data.DataError("bad data")):
        with pytest.raises(SystemExit) as stop, common.user_errors("runs/x"):
            raise error
        assert stop.value.code == 2 and capsys.readouterr().err == f"error: {error}\n"
    with pytest.raises(SystemExit) as stop, common.user_errors("runs/x"):
        raise KeyboardInterrupt
    assert stop.value.code == 130
    assert capsys.readouterr().err == (
        "\ninterrupted: rerun the same command to resume from the last checkpoint in runs/x\n"
    )
    with pytest.raises(SystemExit), common.user_errors():
        raise KeyboardInterrupt
    assert capsys.readouterr().err.endswith("to resume (finished generations are cached)\n")
    with pytest.raises(ValueError, match="a bug"), common.user_errors():
        raise ValueError("a bug")


def test_one_process_without_torchrun(tmp_path, monkeypatch):
    """Under plain python: rank 0 of 1 on the CPU (no GPU here), out_dir created, collectives that
    are the identity, DDP wrapping and gradient averaging that do nothing."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert common.launch_world_size() == 3
    monkeypatch.delenv("WORLD_SIZE")
    assert common.launch_world_size() == 1
    with common.distributed(tmp_path / "out" / "run") as (rank, world, device):
        assert (rank, world, device) == (0, 1, torch.device("cpu"))
        assert (tmp_path / "out" / "run").is_dir()
        assert common.world_size() == 1
        assert common.all_reduce_sum([1, 2.5], device) == [1.0, 2.5]
        assert common.all_gather_list((3, 1)) == [3, 1]
        assert common.global_mean({"b": 2.0, "a": 4.0}, 5, device) == {"a": 4.0, "b": 2.0}
        model = torch.nn.Linear(2, 1)
        assert common.wrap_ddp(model, device, find_unused=False) is model
        model(torch.ones(1, 2)).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        common.average_gradients(list(model.parameters()), 1)
        common.average_gradients(list(model.parameters()), 2)
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
        with common.accumulating(model, last=False):
            pass
        common.barrier()
    assert common.peak_memory_mb(torch.device("cpu")) > 10
    assert common.machine().startswith("cpu: ")


def test_metrics_log_is_rank_0s_and_drops_the_redone_steps(tmp_path):
    log = common.MetricsLog(tmp_path, 0, 0)
    for step in (1, 2, 3):
        log.write(step=step, loss=step / 2)
    common.MetricsLog(tmp_path, 1, 0).write(step=9)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": s, "loss": s / 2} for s in (1, 2, 3)]
    # a run resumed from step 2's checkpoint redoes step 3: its old line goes; rank 1 keeps it all
    common.MetricsLog(tmp_path, 1, 0)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    (tmp_path / "metrics.jsonl").write_text(
        (tmp_path / "metrics.jsonl").read_text() + '\n{"val": 1}\n'
    )
    common.MetricsLog(tmp_path, 0, 2).write(step=3, loss=0.0)
    # a line without a step (written before step 1) survives a resume from a checkpoint; a run
    # begun again without one (killed before its first) writes its step 0 anew: nothing is kept
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "metrics.jsonl").write_text('{"val": 0}\n{"step": 0}\n{"step": 1}\n')
    common.MetricsLog(tmp_path / "zero", 0, 0)
    assert (tmp_path / "zero" / "metrics.jsonl").read_text() == ""
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "loss": 0.5},
        {"step": 2, "loss": 1.0},
        {"val": 1},
        {"step": 3, "loss": 0.0},
    ]


@dataclass
class Run:
    seed: int = 0
    epochs: int = 2
    lr: float = 0.1
    cache_dir: str = "a"
    crash_at_step: int = 0


def test_a_checkpoint_resumes_only_its_own_run(tmp_path, capsys):
    """Rank 0 writes, every rank may read; a missing checkpoint is {}; another setting is refused
    naming it, but the free ones (cache, crash switch) and a grown `extendable` count pass."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    assert common.load_checkpoint(tmp_path, model, optimizer, 0, Run()) == {}
    common.save_checkpoint(tmp_path, model, optimizer, {"step": 4}, Run(), rank=1)
    assert not (tmp_path / "checkpoint.pt").exists()
    common.save_checkpoint(tmp_path, model, optimizer, {"step": 4}, Run(), rank=0)
    assert not list(tmp_path.glob("*.tmp"))
    resumed = common.load_checkpoint(tmp_path, model, optimizer, 0, Run(cache_dir="b"))
    assert resumed == {"step": 4}
    assert (
        capsys.readouterr().err == f"resuming from {tmp_path / 'checkpoint.pt'} at {{'step': 4}}\n"
    )
    assert common.load_checkpoint(tmp_path, model, optimizer, 1, Run(crash_at_step=9)) == {
        "step": 4
    }
    assert capsys.readouterr().err == ""
    common.load_checkpoint(tmp_path, model, optimizer, 0, Run(epochs=5), extendable=("epochs",))
    assert capsys.readouterr().err.endswith("extending the run: --epochs 2 -> 5\n")
    for changed, extendable in ((Run(epochs=1), ("epochs",)), (Run(epochs=5), ())):
        with pytest.raises(UsageError, match=r"with other settings \(epochs: 2 there, "):
            common.load_checkpoint(tmp_path, model, optimizer, 0, changed, extendable=extendable)
    with pytest.raises(UsageError) as error:
        common.load_checkpoint(tmp_path, model, optimizer, 0, Run(seed=1, lr=0.5))
    assert str(error.value) == (
        f"{tmp_path / 'checkpoint.pt'} was written with other settings (seed: 0 there, 1 now, lr: "
        "0.1 there, 0.5 now): rerun with the same flags, or pass another --out-dir"
    )


def test_the_crash_switch_and_a_result_file(tmp_path, monkeypatch, capsys):
    kills = []
    monkeypatch.setattr(common.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    for crash_at, step in ((0, 0), (0, 3), (3, 2), (3, 4)):
        common.crash_if_asked(Run(crash_at_step=crash_at), step)
    assert kills == []
    common.crash_if_asked(Run(crash_at_step=3), 3)
    assert kills == [(common.os.getpid(), common.signal.SIGKILL)]
    path = tmp_path / "deep" / "er" / "r.json"
    for result in ({"a": 1}, {"a": [2]}):
        # folders made as needed, the file replaced, indented by one
        assert common.write_result(result, str(path)) == result
        assert capsys.readouterr().out == json.dumps(result) + "\n"
        assert path.read_text() == json.dumps(result, indent=1)
    common.write_result({"b": 2}, "")
    assert capsys.readouterr().out == '{"b": 2}\n'


class Echo:
    """An engine that answers each prompt with its name, the prompt and the adapter it ran."""

    def __init__(self, name):
        self.name, self.stats = name, {"calls": 0}

    def chat(self, prompt):
        return f"<{prompt}>"

    def generate(self, prompts, seeds, adapters, **params):
        self.stats["calls"] += len(prompts)
        return [f"{self.name}:{p}:{s}:{a}:{params}" for p, s, a in zip(prompts, seeds, adapters)]


def test_a_team_routes_each_agent_to_its_engine_and_adapter():
    """engines(): the distinct engines in the members' order; generate: each prompt through its
    agent's engine and adapter, in chat format, one call per engine, the results in the prompts'
    order, an engine with no prompt of this call skipped (not the end of the loop); team_name."""
    a, b = Echo("a"), Echo("b")
    team = teams.Team([teams.Member(a, 0), teams.Member(b), teams.Member(a, 1)])
    assert team.first is a and team.engines() == [a, b] and team.member(2).adapter == 1
    out = team.generate(["p", "q", "r"], [7, 8, 9], [2, 1, 0], top_p=1.0)
    assert out == [
        "a:<p>:7:1:{'top_p': 1.0}",
        "b:<q>:8:None:{'top_p': 1.0}",
        "a:<r>:9:0:{'top_p': 1.0}",
    ]
    assert team.generate(["s"], [1], [1]) == ["b:<s>:1:None:{}"]
    assert team.stats == {"calls": 4} and (a.stats, b.stats) == ({"calls": 2}, {"calls": 2})
    one = teams.as_team(a)
    assert one.engines() == [a] and one.member(5).engine is a and teams.as_team(team) is team
    assert teams.team_name(SimpleNamespace(models="m1,m2", model="")) == "m1,m2"
    assert teams.team_name(SimpleNamespace(models="", model="m")) == "m"
    assert teams.team_name(SimpleNamespace(models="", model="")) == "default"


def test_a_process_group_of_one_rank_as_torchrun_starts_it(tmp_path, monkeypatch):
    """With torchrun's variables: a gloo group (no GPU here) of one rank, whose collectives give
    the values back and whose teardown leaves no group behind."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    for key, value in {**env, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    with common.distributed(tmp_path / "run") as (rank, world, device):
        assert common.dist.is_initialized() and common.dist.get_backend() == "gloo"
        assert (rank, world, device) == (0, 1, torch.device("cpu"))
        assert common.world_size() == 1 and (tmp_path / "run").is_dir()
        assert common.all_reduce_sum([1, 2.5], device) == [1.0, 2.5]
        assert common.all_gather_list((3, 1)) == [3, 1]
        assert common.global_mean({"a": 4.0}, 5, device) == {"a": 4.0}
        model = torch.nn.Linear(2, 1)
        assert common.wrap_ddp(model, device, find_unused=False) is model
        common.barrier()
        # by hand, as for adapters: each gradient all-reduced then divided by the world, and a
        # parameter without a gradient counts as zeros
        model(torch.ones(1, 2)).sum().backward()
        grads, unused = (
            [p.grad.clone() for p in model.parameters()],
            torch.nn.Parameter(torch.ones(3)),
        )
        common.average_gradients([*model.parameters(), unused], 2)
        assert all(torch.equal(p.grad, g / 2) for p, g in zip(model.parameters(), grads))
        assert torch.equal(unused.grad, torch.zeros(3))
        ddp = common.DDP(model)
        with common.accumulating(ddp, last=False):
            assert not ddp.require_backward_grad_sync
        with common.accumulating(ddp, last=True):
            assert ddp.require_backward_grad_sync
    assert not common.dist.is_initialized()


def test_what_produced_a_result(monkeypatch):
    """machine(): the CPU's name and the flags its matmul speed depends on; the GPU where there is
    one. peak_memory_mb: the peak RSS in MB on a CPU, torch's CUDA peak on a GPU."""
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common, "cpuinfo", lambda field: {"model name": "Chip"}[field])
    monkeypatch.setattr(common, "cpu_flags", lambda: {"sse", "avx2", "amx_bf16"})
    assert common.machine() == "cpu: Chip (avx2 amx_bf16)"
    monkeypatch.setattr(common, "cpuinfo", lambda field: "")
    monkeypatch.setattr(common, "cpu_flags", lambda: set())
    assert common.machine() == "cpu: unknown (no avx2)"
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common.torch.cuda, "get_device_name", lambda index: f"GPU {index}")
    assert common.machine() == "cuda: GPU 0"

    # Linux's ru_maxrss is in KB; a fixed one, as the real peak may grow between two readings
    monkeypatch.setattr(
        common.resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=3 * 1024 * 1024)
    )
    assert common.peak_memory_mb(torch.device("cpu")) == 3072.0
    asked = []
    monkeypatch.setattr(
        common.torch.cuda, "max_memory_allocated", lambda device: asked.append(device) or 3 * 2**20
    )
    gpu = SimpleNamespace(type="cuda", index=1)
    assert common.peak_memory_mb(gpu) == 3.0 and asked == [gpu]
    # a GPU's RNG state is kept with the others, and set again on a GPU: not from a file without
    # one (a run begun on a CPU), nor on a machine without a GPU
    monkeypatch.setattr(common.torch.cuda, "get_rng_state_all", lambda: ["gpu state"])
    states = common.rng_states()
    assert states["cuda"] == ["gpu state"]
    restored = []
    monkeypatch.setattr(common.torch.cuda, "set_rng_state_all", restored.append)
    common.set_rng_states(states)
    common.set_rng_states(states | {"cuda": None})
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: False)
    common.set_rng_states(states)
    assert restored == [["gpu state"]]


def test_ddp_wraps_a_model_of_several_ranks(monkeypatch):
    """Several ranks: DDP wraps the module, on the GPU with the device's index, on the CPU with no
    device ids; unused parameters as asked. A sum over ranks keeps float64 on the device given;
    global_mean sums on the device given."""
    made = []
    monkeypatch.setattr(common, "world_size", lambda: 2)
    monkeypatch.setattr(common, "DDP", lambda module, **kw: made.append((module, kw)) or "ddp")
    model = torch.nn.Linear(2, 1)
    assert common.wrap_ddp(model, torch.device("cpu"), find_unused=True) == "ddp"
    assert common.wrap_ddp(model, SimpleNamespace(type="cuda", index=1), find_unused=False)
    assert made == [
        (model, {"device_ids": None, "find_unused_parameters": True}),
        (model, {"device_ids": [1], "find_unused_parameters": False}),
    ]
    assert common.all_reduce_sum([1 + 1e-12, 2], "cpu") == [1 + 1e-12, 2.0]
    with pytest.raises(NotImplementedError):
        # a tensor on the meta device has no values to give back: it was made there
        common.all_reduce_sum([1.0], "meta")
    devices = []
    monkeypatch.setattr(
        common, "all_reduce_sum", lambda values, device: devices.append(device) or values
    )
    assert common.global_mean({"a": 2.0}, 3, "dev") == {"a": 2.0} and devices == ["dev"]


@dataclass
class Documented:
    name: str = "a"
    """the name, 100% of it"""
    plain: str = "b"
    other: str = "c"
    steps: int = 3
    """how many"""
    count: int = 1
    0
    verbose: bool = False
    """say more"""


def test_the_help_is_each_fields_docstring(capsys):
    """A field's help: its docstring (% kept as written) and its default; a field without one has
    none (the next field's default is no docstring, nor is a number); the description heads it; a
    positional field keeps its type."""
    docs = {"name": "the name, 100% of it", "steps": "how many", "verbose": "say more"}
    assert common.field_docs(Documented) == docs
    with pytest.raises(SystemExit):
        common.parse_config(Documented, ["--help"], description="What it does.")
    text = " ".join(capsys.readouterr().out.split())
    assert "What it does." in text
    assert "--name NAME the name, 100% of it (default: 'a')" in text
    assert "--plain PLAIN (default: 'b')" in text and "--steps STEPS how many (default: 3)" in text
    assert "--verbose, --no-verbose say more (default: False)" in text
    Documented.POSITIONAL = ("steps",)
    try:
        assert common.parse_config(Documented, ["7"]).steps == 7
        with pytest.raises(SystemExit):
            common.parse_config(Documented, ["--help"])
        assert "positional arguments: steps how many " in " ".join(capsys.readouterr().out.split())
    finally:
        del Documented.POSITIONAL


def test_files_are_written_whole_and_read_back_named(tmp_path, monkeypatch):
    """atomic_save writes `path`.tmp, then renames it; a checkpoint that is not one is refused
    naming what was expected; one without a config (an older run's) still resumes."""
    written = []
    real_save = common.torch.save
    monkeypatch.setattr(
        common.torch, "save", lambda obj, path: written.append(str(path)) or real_save(obj, path)
    )
    common.atomic_save({"a": 1}, tmp_path / "f.pt")
    assert written == [str(tmp_path / "f.pt") + ".tmp"] and torch.load(tmp_path / "f.pt") == {
        "a": 1
    }
    assert not (tmp_path / "f.pt.tmp").exists()
    monkeypatch.undo()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    (tmp_path / "checkpoint.pt").write_text("not a checkpoint")
    with pytest.raises(FileRefused, match="not a plain-data checkpoint file"):
        common.load_checkpoint(tmp_path, model, optimizer, 0, Run())
    common.save_checkpoint(tmp_path, model, optimizer, {"step": 2}, Run(), rank=0)
    state = torch.load(tmp_path / "checkpoint.pt")
    del state["config"]
    torch.save(state, tmp_path / "checkpoint.pt")
    assert common.load_checkpoint(tmp_path, model, optimizer, 1, Run(seed=5)) == {"step": 2}


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Test CPU 9000: rev 2 @ 2.20GHz
flags\t\t: fpu sse4_2 avx2 avx512f amx_bf16
bugs\t\t: spectre_v1

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Test CPU 9000: rev 2 @ 2.20GHz
flags\t\t: fpu
"""


def test_cpuinfo_reads_the_first_value_of_a_field(monkeypatch):
    """The value after the field's first colon, stripped, from the first processor; "" for a
    field it lacks."""

    def planted_open(path, *args, **kwargs):
        if path != "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return io.StringIO(CPUINFO)

    monkeypatch.setattr(common, "open", planted_open, raising=False)
    assert common.cpuinfo("model name") == "Test CPU 9000: rev 2 @ 2.20GHz"
    assert common.cpuinfo("flags") == "fpu sse4_2 avx2 avx512f amx_bf16"
    assert common.cpu_flags() == {"fpu", "sse4_2", "avx2", "avx512f", "amx_bf16"}
    assert common.cpuinfo("microcode") == ""


def test_cpuinfo_is_empty_where_there_is_no_proc_cpuinfo(monkeypatch):
    def planted_open(path, *args, **kwargs):
        raise FileNotFoundError(path)

    monkeypatch.setattr(common, "open", planted_open, raising=False)
    assert common.cpuinfo("model name") == "" and common.cpu_flags() == set()


def test_call_seed_is_the_first_60_bits_of_the_parts_sha256():
    """One LLM call's seed, by hand: the first 15 hex digits (60 bits) of the sha256 of the parts as
    JSON, so the same parts draw the same seed in every process and any order of calls."""
    parts = (0, "t/1", 2, 1, "refine")
    digest = hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()
    assert common.call_seed(*parts) == int(digest[:15], 16)
    seeds = [common.call_seed(i, "q") for i in range(200)]
    assert all(0 <= s < 2**60 for s in seeds) and max(seeds) >= 2**56


def test_a_tensor_is_sharded_only_as_fsdps_dtensor_under_a_process_group():
    assert not torch.distributed.is_initialized()
    assert common.sharded_tensor(torch.zeros(3)) is False


def test_state_bytes_counts_the_local_part_of_a_shard(monkeypatch):
    """An FSDP2 parameter counts the part this rank holds (to_local), a plain tensor its whole: the
    bytes that sharding divides by the world size."""

    class Shard:
        grad = None

        def to_local(self):
            return torch.zeros(2)  # this rank's part: 2 float32 = 8 bytes

    monkeypatch.setattr(common, "sharded_tensor", lambda t: isinstance(t, Shard))
    plain = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    plain.grad = torch.zeros(3, dtype=torch.float64)
    optimizer = SimpleNamespace(state={plain: {"exp_avg": torch.zeros(4), "step": 3}})
    # the shard's local part, the plain weight and its gradient, the optimizer's one tensor
    assert common.state_bytes([Shard(), plain], optimizer) == 8 + 24 + 24 + 16
