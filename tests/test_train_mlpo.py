"""train_mlpo.py: the peer pool and its filter, the peers the flags name (in process), and the
script as users run it (tests/launch.py, on a tiny random model): plain python vs a 2-process
torchrun, whose leader's whole weights FSDP2 shards."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
from test_train_magrpo import rollout_run

import common
import data
import train_magrpo
import train_mlpo
from common import Ranks, call_seed
from llm import training
from llm.engine import Engine
from solutions import leader_prompt, parse_solution


@pytest.mark.parametrize("torchrun", [False, True])
def test_mlpo_runs_filters_and_counts_flat_groups(tmp_path, tiny_model_dir, torchrun):
    out = tmp_path / "train_mlpo"
    # full fine-tuning (--lora-rank 0): an HF directory; on 2 processes sharded (FSDP2), the leader
    # saved whole by rank 0
    lines = rollout_run(
        tmp_path,
        tiny_model_dir,
        torchrun,
        "train_mlpo.py",
        "--questions",
        "6",
        "--agents",
        "3",
        "--beta",
        "0",
        "--lora-rank",
        "0",
        "--cache-dir",
        str(tmp_path / "cache"),
        *(["--fsdp"] if torchrun else []),
    )
    # random peers are never right: no question is filtered out
    assert json.loads((out / "pool.json").read_text()) == {
        "candidates": 6,
        "kept": 6,
        "kept_vote_right": 0,
        "peer_accuracy": 0.0,
    }
    assert [r["step"] for r in lines] == [1, 2]
    assert all(r["zero_std_groups"] == 2 and r["grad_norm"] == 0 for r in lines)
    # beta 0: flat groups are skipped; each rank still runs one (zero) backward for the all-reduce
    assert all(r["trained_sequences"] == (2 if torchrun else 1) for r in lines)
    checkpoint = common.load_file(out / "checkpoint.pt", "checkpoint")
    # the run's settings, the leader's own among them
    assert checkpoint["config"].keys() == {f.name for f in dataclasses.fields(train_mlpo.Config)}
    assert checkpoint["config"]["questions"] == 6 and checkpoint["config"]["filter_easy"] == 0.75
    assert Engine(model_path=str(out / "model")).model.config.num_hidden_layers == 2
    # the peers' generations of every rank in one database
    assert {p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()} == {"generations.db"}


def scripted_peers(right):
    """A run_llm whose peers answer question `id` right (5) `right[id]` times, then wrong (7)."""

    def run_llm(engine, calls, game):
        seen = {}
        outputs = []
        for ex, *_ in calls:
            k = seen[ex.id] = seen.get(ex.id, 0) + 1
            outputs.append(
                (parse_solution("Answer: " + ("5" if k <= right[ex.id] else "7"), "arith"), 1)
            )
        return outputs

    return run_llm


def test_leader_filter_drops_questions_the_peers_solve(monkeypatch, tmp_path):
    """--filter-easy 0.75: with 3 peers, a question 3/3 right is dropped, 2/3 (0.67) is kept."""
    examples = [
        data.Example(question=f"q{k}", answer="5", task="arith", id=f"t/{k}") for k in range(3)
    ]
    right = {"t/0": 3, "t/1": 2, "t/2": 0}
    monkeypatch.setattr(training, "training_pool", lambda cfg: examples)
    monkeypatch.setattr(train_mlpo, "make_engine", lambda cfg, agents, rank, device: None)
    monkeypatch.setattr(train_mlpo, "run_llm", scripted_peers(right))
    cfg = train_mlpo.Config(agents=3, questions=3, val_n=0)
    pool, stats = train_mlpo.peer_pool(cfg, Ranks(0, 1, "cpu"))
    assert [ex.id for ex, _ in pool] == ["t/1", "t/2"] and stats["kept"] == 2
    assert stats["kept_vote_right"] == 1
    assert stats["peer_accuracy"] == pytest.approx((1 + 2 / 3) / 3)
    keep_all = train_mlpo.Config(agents=3, questions=3, val_n=0, filter_easy=0)
    pool, _ = train_mlpo.peer_pool(keep_all, Ranks(0, 1, "cpu"))
    assert len(pool) == 3


def test_balance_vote_alternates_the_questions_the_vote_gets_wrong_and_right(monkeypatch):
    """--balance-vote: every question the peers' vote gets wrong, each followed by the next one it
    gets right, as far as both last (the vote as the game takes it: 1 of 3 right loses to two equal
    wrong answers, a 1-1 tie goes to the first agent); none of one kind ends the run."""
    right = {"t/0": 0, "t/1": 2, "t/2": 3, "t/3": 1, "t/4": 0, "t/5": 3}
    examples = [
        data.Example(question=f"q{k}", answer="5", task="arith", id=f"t/{k}") for k in range(6)
    ]
    monkeypatch.setattr(training, "training_pool", lambda cfg: examples)
    monkeypatch.setattr(train_mlpo, "make_engine", lambda cfg, agents, rank, device: None)
    monkeypatch.setattr(train_mlpo, "run_llm", scripted_peers(right))
    cfg = train_mlpo.Config(agents=3, questions=6, val_n=0, filter_easy=0, balance_vote=True)
    pool, stats = train_mlpo.peer_pool(cfg, Ranks(0, 1, "cpu"))
    assert [ex.id for ex, _ in pool] == ["t/0", "t/1", "t/3", "t/2", "t/4", "t/5"]
    assert stats["kept"] == 6 and stats["kept_vote_right"] == 3
    # --filter-easy first: the 3/3 questions go, so one right question is left for three wrong
    pool, stats = train_mlpo.peer_pool(
        dataclasses.replace(cfg, filter_easy=0.75), Ranks(0, 1, "cpu")
    )
    assert [ex.id for ex, _ in pool] == ["t/0", "t/1"] and stats["kept_vote_right"] == 1
    # two peers, one right: the tie goes to agent 0, the right one
    pool, stats = train_mlpo.peer_pool(dataclasses.replace(cfg, agents=2), Ranks(0, 1, "cpu"))
    assert [ex.id for ex, _ in pool] == ["t/0", "t/1", "t/4", "t/2"]
    assert train_mlpo.balanced(["a", "b", "c"], [True, True, False]) == (["c", "a"], [False, True])
    for kind in (0, 3):
        right.update({k: kind for k in right})
        with pytest.raises(SystemExit) as ended:
            train_mlpo.peer_pool(cfg, Ranks(0, 1, "cpu"))
        assert str(ended.value) == (
            "--balance-vote: of the 6 questions the peers' vote gets none wrong or none right: add "
            "--questions"
        )


def test_leader_peers_are_the_team_the_flag_names(monkeypatch, tmp_path):
    """--peers: the frozen peers' engine is built from that team (one entry per peer), and the flag
    is refused beside --peers-model or with one entry too few; MAGRPO has no such flag."""
    built = {}

    def make_engine(cfg, agents, rank, device):
        built.update(models=cfg.models, model=cfg.model)

    monkeypatch.setattr(train_mlpo, "make_engine", make_engine)
    monkeypatch.setattr(
        train_mlpo,
        "run_llm",
        lambda engine, calls, game: [(parse_solution("Answer: 5", "arith"), 1) for _ in calls],
    )
    examples = [data.Example(question="q", answer="5", task="arith", id="t/0")]
    adapter = tmp_path / "a.pt"
    adapter.write_bytes(b"")
    peers = f"default+{adapter},default"
    cfg = train_mlpo.Config(agents=2, peers=peers)
    train_mlpo.check(cfg, 1)
    [(example, solutions)] = train_mlpo.peer_solutions(examples, cfg, Ranks(0, 1, "cpu"))
    assert built == {"models": peers, "model": ""} and len(solutions) == 2
    for wrong in ({"peers_model": str(tmp_path)}, {"agents": 3}):
        with pytest.raises(common.UsageError, match="--peers:"):
            train_mlpo.check(dataclasses.replace(cfg, **wrong), 1)
    with pytest.raises(SystemExit):
        common.parse_config(train_magrpo.Config, ["--peers", peers])


def test_leader_config_checks_word_for_word(monkeypatch, tmp_path):
    """check(): at least one question, --filter-easy a share in [0, 1] (both ends allowed), --peers
    not beside --peers-model, and --peers-model checked as a model under its own flag."""
    check = train_mlpo.check
    check(train_mlpo.Config(questions=1, filter_easy=0), 1)
    check(train_mlpo.Config(questions=1, filter_easy=1), 1)
    # one peer is enough for a leader
    check(train_mlpo.Config(agents=1), 1)
    with pytest.raises(common.UsageError) as refused:
        check(train_mlpo.Config(questions=0), 1)
    assert str(refused.value) == "--questions 0: must be at least 1"
    for share in (-0.25, 1.5):
        with pytest.raises(common.UsageError) as refused:
            check(train_mlpo.Config(filter_easy=share), 1)
        assert str(refused.value) == f"--filter-easy {share}: a share of the peers, in [0, 1]"
    with pytest.raises(common.UsageError) as refused:
        check(train_mlpo.Config(agents=2, peers="default,default", peers_model=str(tmp_path)), 1)
    assert str(refused.value) == "--peers: the frozen peers as a team, not with --peers-model"
    # the engine's and the reward rule's flags, each under its own name
    for bad, message in [
        (dict(model="/"), "--model '/': not an HF checkpoint directory (no config.json)"),
        (dict(engine_batch_size=0), "--engine-batch-size 0: must be at least 1"),
        (dict(truncated="keep"), "unknown --truncated 'keep': choose one of zero, drop"),
    ]:
        with pytest.raises(common.UsageError) as refused:
            check(train_mlpo.Config(**bad), 1)
        assert str(refused.value) == message
    checked = []
    monkeypatch.setattr(train_mlpo, "check_model", lambda *args: checked.append(args))
    check(train_mlpo.Config(peers_model=str(tmp_path), max_new_tokens=77), 1)
    assert checked == [("--peers-model", str(tmp_path), 77)]


def test_leader_rollouts_sample_the_leader_over_each_items_peers(monkeypatch):
    """leader_rollouts: G samples of the leader (agent 0 of its team) per (question, peers) item,
    each prompt the leader's over that item's peers (with the trailer and whole solutions as the
    flags say), each sequence its own prompt's and completion's ids, cut off or answered only
    leniently as its completion was; held_out_rollouts samples the same team."""
    items = [
        (
            data.Example(question="q0", answer="5", task="arith", id="t/0"),
            # longer than the 300 characters a solution is cut to unless shown whole
            [parse_solution("6 - 0 = 6\n" * 40 + "Answer: 6", "arith")] * 2,
        ),
        (
            data.Example(question="q1", answer="8", task="arith", id="t/1"),
            [parse_solution("Answer: 8", "arith")] * 2,
        ),
    ]
    team = object()
    cfg = train_mlpo.Config(
        agents=2, group=2, trailer=True, whole_solutions=True, format_reward=0.0
    )
    texts = {
        (0, 0): "Answer: 5",
        (0, 1): "The answer is 5",
        (1, 0): "Answer: 8",
        (1, 1): "Answer: 8 and",
    }
    seeds = {
        call_seed(cfg.seed, "leader", 3, ex.id, g): (q, g)
        for q, (ex, _) in enumerate(items)
        for g in range(2)
    }

    def sample(leader, prompts, call_seeds, agents, asked):
        assert leader is team and asked is cfg and agents == [0] * len(prompts)
        out = []
        for prompt, seed in zip(prompts, call_seeds):
            q, g = seeds[seed]
            assert prompt == leader_prompt(*items[q], True, True)
            finish = "length" if (q, g) == (1, 1) else "eos"
            out.append(SimpleNamespace(text=texts[q, g], token_ids=[q, g], finish=finish))
        return out

    def prompt_ids(leader, prompt, agent):
        assert leader is team and agent == 0
        return [len(prompt)]

    monkeypatch.setattr(train_mlpo, "sample", sample)
    monkeypatch.setattr(train_mlpo, "prompt_ids", prompt_ids)
    sequences, rewards = train_mlpo.leader_rollouts(team, items, cfg, step=3)
    # the strict reader's rewards; the cut-off rollout is marked, for llm_step's truncation rule
    assert rewards.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    prompts = {q: len(leader_prompt(*items[q], True, True)) for q in range(2)}
    assert [
        (s.question, s.sample, s.agent, s.prompt_ids, s.completion_ids, s.truncated, s.lenient_only)
        for s in sequences
    ] == [
        (0, 0, 0, [prompts[0]], [0, 0], False, False),
        (0, 1, 0, [prompts[0]], [0, 1], False, True),
        (1, 0, 0, [prompts[1]], [1, 0], False, False),
        (1, 1, 0, [prompts[1]], [1, 1], True, False),
    ]
    assert "Other" not in leader_prompt(*items[0], True, True)
    assert leader_prompt(*items[0], True, True) != leader_prompt(*items[0], True, False)
    _, held_out = train_mlpo.held_out_rollouts(team, items, cfg, step=3)
    assert held_out.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_peer_pool_reads_the_config_and_says_what_it_kept(monkeypatch, capsys):
    """The candidates are the training pool of this config after its validation slice; a question
    exactly at --filter-easy is dropped; the engine is built for this rank and device, and its
    stats are printed by rank 0 alone; a pool left empty ends the run with what to change."""
    examples = [
        data.Example(question=f"q{k}", answer="5", task="arith", id=f"t/{k}") for k in range(4)
    ]
    right = {"t/0": 3, "t/1": 2, "t/2": 2, "t/3": 0}
    built, asked = [], []
    cfg = train_mlpo.Config(agents=3, questions=3, val_n=1, filter_easy=2 / 3)

    peers = scripted_peers(right)

    def run_llm(engine, calls, game):
        asked.append((engine, game))
        return peers(engine, calls, game)

    monkeypatch.setattr(training, "training_pool", lambda c: examples[: c.val_n + c.questions])
    monkeypatch.setattr(
        train_mlpo,
        "make_engine",
        lambda c, agents, rank, device: built.append((rank, device)) or "peers",
    )
    monkeypatch.setattr(train_mlpo, "run_llm", run_llm)
    pool, stats = train_mlpo.peer_pool(cfg, Ranks(0, 1, "cpu"))
    assert [ex.id for ex, _ in pool] == ["t/3"]
    expected = {
        "candidates": 3,
        "kept": 1,
        "kept_vote_right": 0,
        "peer_accuracy": (2 / 3 + 2 / 3 + 0) / 3,
    }
    assert stats == expected and built == [(0, "cpu")] and asked == [("peers", cfg.game())]
    assert capsys.readouterr().err == f"peer pool: {json.dumps(expected)}\n"
    train_mlpo.peer_pool(dataclasses.replace(cfg, filter_easy=0), Ranks(1, 1, "cpu"))
    assert built[-1] == (1, "cpu") and capsys.readouterr().err == ""
    right["t/3"] = 3
    with pytest.raises(SystemExit) as ended:
        train_mlpo.peer_pool(cfg, Ranks(0, 1, "cpu"))
    assert str(ended.value) == (
        f"every one of the 3 questions has >= {2 / 3} of its peers right: lower --filter-easy or "
        "add --questions"
    )


def test_peer_solutions_come_from_the_peers_model_on_this_ranks_shard(monkeypatch):
    """The peers' engine is built on --peers-model where it is given, else on --model; a rank
    generates every world-th question from its own, and returns them in the questions' order."""
    built, asked, engines = [], [], []

    def make_engine(c, agents, rank, device):
        engines.append((c, agents, rank, device))
        built.append(c.model)
        return "engine"

    monkeypatch.setattr(train_mlpo, "make_engine", make_engine)

    def run_llm(engine, calls, game):
        asked.append([ex.id for ex, *_ in calls])
        return [(parse_solution("Answer: 5", "arith"), 1) for _ in calls]

    monkeypatch.setattr(train_mlpo, "run_llm", run_llm)
    examples = [
        data.Example(question=f"q{k}", answer="5", task="arith", id=f"t/{k}") for k in range(5)
    ]
    cfg = train_mlpo.Config(agents=2, model="base")
    solved = train_mlpo.peer_solutions(examples, cfg, Ranks(0, 2, "cpu"))
    assert [ex.id for ex, _ in solved] == ["t/0", "t/2", "t/4"]
    assert asked == [["t/0", "t/0", "t/2", "t/2", "t/4", "t/4"]]
    train_mlpo.peer_solutions(
        examples, dataclasses.replace(cfg, peers_model="peers"), Ranks(1, 2, "cpu")
    )
    assert built == ["base", "peers"] and asked[-1] == ["t/1", "t/1", "t/3", "t/3"]
    # the peers' engine: the trainer's dtype, batch size and cache, a team of --agents, this rank
    flags = dict(train_dtype="bfloat16", engine_batch_size=5, cache_dir="here", peers="a,b")
    train_mlpo.peer_solutions(examples, dataclasses.replace(cfg, **flags), Ranks(1, 2, "cpu"))
    c, agents, rank, device = engines[-1]
    assert (c.dtype, c.engine_batch_size, c.cache_dir, c.models) == ("bfloat16", 5, "here", "a,b")
    assert (agents, rank, device) == (2, 1, "cpu")


def test_unseen_questions_leave_out_what_the_peers_and_the_leaders_start_drew(
    monkeypatch, tmp_path
):
    """--unseen-questions: the candidates and the validation questions leave out the questions a
    peer's adapter (--peers) and the leader's starting adapter (--init-adapter) were trained on;
    the peers' base models (`default`) record nothing and are not asked."""
    examples = [
        data.Example(question=f"q{k}", answer="5", task="arith", id=f"t/{k}") for k in range(5)
    ]
    for module in (training, data):
        monkeypatch.setattr(module, "training_pool", lambda cfg: examples)
    monkeypatch.setattr(train_mlpo, "make_engine", lambda cfg, agents, rank, device: None)
    monkeypatch.setattr(train_mlpo, "run_llm", scripted_peers({f"t/{k}": 0 for k in range(5)}))
    drew = {"peer": 1, "start": 3}
    for name, first in drew.items():
        (tmp_path / name).mkdir()
        record = {"task": "arith", "seed": 0, "val_n": first, "questions": 1}
        (tmp_path / name / "mpdf.json").write_text(json.dumps({"training": record}))
    cfg = train_mlpo.Config(
        agents=3,
        questions=3,
        val_n=1,
        filter_easy=0,
        unseen_questions=True,
        peers=f"default,default+{tmp_path / 'peer'},default",
        init_adapter=str(tmp_path / "start"),
    )
    pool, _ = train_mlpo.peer_pool(cfg, Ranks(0, 1, "cpu"))
    assert [ex.id for ex, _ in pool] == ["t/2", "t/4"]
    assert train_mlpo.starting_adapters(cfg) == [str(tmp_path / "start"), str(tmp_path / "peer")]
    with pytest.raises(common.UsageError) as refused:
        train_mlpo.starting_adapters(dataclasses.replace(cfg, peers="default,default"))
    assert str(refused.value) == "--peers: 2 entries for 3 agents (one per agent)"
    every = dataclasses.replace(cfg, unseen_questions=False)
    assert [ex.id for ex, _ in train_mlpo.peer_pool(every, Ranks(0, 1, "cpu"))[0]] == [
        "t/1",
        "t/2",
        "t/3",
    ]
