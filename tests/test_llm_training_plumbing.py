"""llm/training.py's plumbing in process, on the tiny random model (tests/conftest.py): the flags'
refusals (through the scripts' check), the trained weights and their rollout engines, sampling and
prompts, the weights the loss runs, the learning rate, resume, the step (llm_step.policy_step) and
its statistics (rollout_stats), validation's log and the saved weights. The scripts' tests
(train_solver.py, train_magrpo.py, train_mlpo.py) run all of it whole, their torchrun and SIGKILL
runs in processes of their own, which mutation testing cannot follow: each function's contract is
pinned here, with values computed by hand.
Run: python -m pytest -q tests/test_llm_training_plumbing.py"""

import contextlib
import copy
import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import data
import llm_step
import softrank
import train_magrpo
import train_mlpo
import train_solver
from common import FileRefused, Ranks, UsageError, load_file, parse_config, save_checkpoint
from llm import backbone, lora, training
from llm.engine import Engine
from llm.logprobs import completion_batch, completion_logprobs
from llm.team import Member, Team, read_adapter
from llm_step import Sequence, policy_step

CPU = torch.device("cpu")
ALONE = Ranks(0, 1, CPU)  # a run of one process


def refused(error, message, call, *args):
    """`call(*args)` raises `error` with exactly `message`."""
    with pytest.raises(error) as caught:
        call(*args)
    assert str(caught.value) == message


def adapted(tiny_model, rank=2, alpha=4.0, adapters=1, seed=0):
    """A copy of the tiny model with fresh adapters whose B is not zero (each its own)."""
    model = lora.add_lora(copy.deepcopy(tiny_model[0]), rank, alpha, adapters, seed)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


# --------------------------------------------------------------------------------------------------
# The flags' checks
# --------------------------------------------------------------------------------------------------
def test_check_refuses_each_shared_flag_in_one_line(tmp_path):
    """A trainer's check (train_magrpo.check, world 1: check_game, check_trainer and the rest): a
    game of fewer than 1 agent or rounds below 0, a --train-dtype other than float32 / bfloat16,
    the counts below their minimum (micro-batch and save-every 1, the rest 0), alpha 0,
    --eval-every without --val-n, and an --init-adapter without --lora-rank or of another rank or
    alpha: each refused with its one line; the boundary values (1 agent, 0 rounds, the minima
    themselves) accepted. train_mlpo.check likewise (it has --questions, at least 1)."""
    check = train_magrpo.check
    base = train_magrpo.Config()
    check(base, 1)
    # the boundaries: one agent (MAGRPO with one agent is GRPO), no REFINE round, bf16, minima
    check(dataclasses.replace(base, agents=1, rounds=0, train_dtype="bfloat16", micro_batch=1), 1)
    zeros = dict(save_every=1, val_n=0, eval_every=0, weight_decay=0.0, lr=0.0, lora_rank=0)
    check(dataclasses.replace(base, **zeros, lora_alpha=1e-6), 1)
    for name, value, minimum in (
        ("agents", 0, 1),
        ("rounds", -1, 0),
        ("micro_batch", 0, 1),
        ("save_every", 0, 1),
        ("val_n", -1, 0),
        ("eval_every", -1, 0),
        ("weight_decay", -0.5, 0),
        ("lr", -0.5, 0),
        ("lora_rank", -1, 0),
    ):
        flag = "--" + name.replace("_", "-")
        message = f"{flag} {value!r}: must be at least {minimum}"
        refused(UsageError, message, check, dataclasses.replace(base, **{name: value}), 1)
    refused(
        UsageError,
        "unknown --train-dtype 'auto': choose one of float32, bfloat16",
        check,
        dataclasses.replace(base, train_dtype="auto"),
        1,
    )
    refused(
        UsageError,
        "--lora-alpha 0.0: must be > 0",
        check,
        dataclasses.replace(base, lora_alpha=0.0),
        1,
    )
    # validation every N steps needs questions to validate on
    refused(
        UsageError,
        "--eval-every: validation needs held-out questions (--val-n >= 1)",
        check,
        dataclasses.replace(base, val_n=0, eval_every=2),
        1,
    )
    check(dataclasses.replace(base, val_n=1, eval_every=2), 1)
    # --init-adapter: only for adapters, and of this rank and alpha
    listed = tmp_path / "list.pt"
    torch.save([1, 2], listed)
    refused(
        UsageError,
        f"--init-adapter {listed}: not an adapter file",
        check,
        dataclasses.replace(base, init_adapter=str(listed), lora_rank=4),
        1,
    )
    path = tmp_path / "a.pt"
    torch.save({"format": lora.FORMAT, "rank": 4, "alpha": 8.0}, path)
    refused(
        UsageError,
        "--init-adapter: adapters train with --lora-rank >= 1",
        check,
        dataclasses.replace(base, init_adapter=str(path), lora_rank=0),
        1,
    )
    check(dataclasses.replace(base, init_adapter=str(path), lora_rank=4, lora_alpha=8.0), 1)
    for rank, alpha in ((4, 32.0), (2, 8.0)):
        refused(
            UsageError,
            f"--init-adapter {path}: rank 4, alpha 8.0 there, --lora-rank {rank} --lora-alpha "
            f"{alpha} here",
            check,
            dataclasses.replace(base, init_adapter=str(path), lora_rank=rank, lora_alpha=alpha),
            1,
        )
    missing = tmp_path / "missing.pt"
    with pytest.raises(FileRefused, match=re.escape(f"{missing}: cannot read the adapter file")):
        check(dataclasses.replace(base, init_adapter=str(missing)), 1)
    # MLPO's config: the same shared checks, and --questions (the candidates) at least 1
    mlpo = train_mlpo.Config()
    train_mlpo.check(dataclasses.replace(mlpo, questions=1, save_every=1, micro_batch=1), 1)
    for name, value, minimum in (("questions", 0, 1), ("save_every", 0, 1), ("micro_batch", 0, 1)):
        flag = "--" + name.replace("_", "-")
        message = f"{flag} {value!r}: must be at least {minimum}"
        cfg = dataclasses.replace(mlpo, **{name: value})
        refused(UsageError, message, train_mlpo.check, cfg, 1)
    refused(
        UsageError,
        "unknown --train-dtype 'auto': choose one of float32, bfloat16",
        train_mlpo.check,
        dataclasses.replace(mlpo, train_dtype="auto"),
        1,
    )


@pytest.mark.parametrize("script", [train_magrpo, train_mlpo, train_solver])
def test_trainers_take_no_flag_of_a_policy_driven_game(script, capsys):
    """The trained weights are --model's and no policy decides: no trainer's Config has --models,
    --critic or --refine-cost (nor the game's --dtype: the trainers' is --train-dtype), and its
    command line refuses them as unknown flags."""
    names = {f.name for f in dataclasses.fields(script.Config)}
    assert not names & {"models", "critic", "refine_cost", "dtype"}
    assert "train_dtype" in names and "model" in names
    for argv in (["--models", "default,default"], ["--critic"], ["--refine-cost", "1"]):
        with pytest.raises(SystemExit) as caught:
            parse_config(script.Config, argv)
        assert caught.value.code == 2
        assert f"unrecognized arguments: {' '.join(argv)}" in capsys.readouterr().err
    # the renamed dtype flag: --dtype is no flag of theirs, --train-dtype is
    with pytest.raises(SystemExit):
        parse_config(script.Config, ["--dtype", "bfloat16"])
    capsys.readouterr()
    assert parse_config(script.Config, ["--train-dtype", "bfloat16"]).train_dtype == "bfloat16"


def test_check_rollouts_refuses_each_group_flag_in_one_line():
    """check_rollouts, given the scripts' choices (softrank's advantages and aggregations): an
    unknown --algo or --loss-agg, no step or question, a group of one (no baseline), a negative KL
    weight or format reward, a zero temperature or tau, and questions that the processes cannot
    share whole: each refused with its line; the boundaries accepted."""
    base = train_magrpo.Config()

    def check(cfg, world):
        # the advantages and aggregations the scripts pass: softrank's
        training.check_rollouts(cfg, world, softrank.GROUP_ADVANTAGES, softrank.PG_KINDS)

    check(base, 1)
    edge = dict(steps=1, questions_per_step=3, group=2, beta=0.0, format_reward=0.0)
    check(dataclasses.replace(base, **edge, rollout_temperature=1e-3, tau=1e-3), 3)
    check(train_mlpo.Config(), 1)
    refused(
        UsageError,
        "unknown --algo 'ppo': choose one of magrpo, grpo, softrank",
        check,
        dataclasses.replace(base, algo="ppo"),
        1,
    )
    refused(
        UsageError,
        "unknown --loss-agg 'mean': choose one of token, seq, const, sum",
        check,
        dataclasses.replace(base, loss_agg="mean"),
        1,
    )
    for name, value, minimum in (
        ("steps", 0, 1),
        ("questions_per_step", 0, 1),
        ("group", 1, 2),
        ("beta", -0.5, 0),
        ("format_reward", -0.5, 0),
    ):
        flag = "--" + name.replace("_", "-")
        message = f"{flag} {value!r}: must be at least {minimum}"
        refused(UsageError, message, check, dataclasses.replace(base, **{name: value}), 1)
    for name in ("rollout_temperature", "tau"):
        flag = "--" + name.replace("_", "-")
        cfg = dataclasses.replace(base, **{name: 0.0})
        refused(UsageError, f"{flag} 0.0: must be > 0", check, cfg, 1)
    refused(
        UsageError,
        "--questions-per-step 6 must be a multiple of the 4 processes (every rank owns whole "
        "questions)",
        check,
        dataclasses.replace(base, questions_per_step=6),
        4,
    )


def test_learning_rate_defaults_per_weights_kind():
    """--lr 0: the script's adapter default for adapters, 1e-5 for whole weights; any --lr wins
    over both."""
    for lora_rank, lr, expected in (
        (4, 0.0, 5e-4),
        (0, 0.0, 1e-5),
        (4, 3e-3, 3e-3),
        (0, 3e-3, 3e-3),
    ):
        cfg = SimpleNamespace(lr=lr, lora_rank=lora_rank)
        assert training.learning_rate(cfg, adapter_lr=5e-4) == expected
    assert training.learning_rate(SimpleNamespace(lr=0.0, lora_rank=1), 2e-3) == 2e-3


# --------------------------------------------------------------------------------------------------
# The trained weights and their rollout engines
# --------------------------------------------------------------------------------------------------
def team_config(tiny_model_dir, **changes):
    return dataclasses.replace(
        train_magrpo.Config(model=tiny_model_dir, engine_batch_size=6, seed=3), **changes
    )


def test_trained_team_of_adapters_on_one_frozen_base(tiny_model, tiny_model_dir):
    """--lora-rank r: one model, its base frozen, `n_trained` fresh adapters (B zero, A seeded by
    --seed) on the layers --lora-targets names (empty parts ignored), one fp32 engine of
    --engine-batch-size slots, and agent k's member that engine with adapter k."""
    cfg = team_config(tiny_model_dir, lora_rank=2, lora_alpha=4.0, lora_targets="q_proj,,v_proj,")
    models, team = training.trained_team(cfg, 3, CPU)
    [model] = models
    assert team.engines()[0].model is model and team.first.batch_size == 6
    assert team.first.device == "cpu"
    assert team.first.dtype == "float32" and next(model.parameters()).dtype == torch.float32
    assert team.members == [Member(team.first, k) for k in range(3)]
    assert model.lora["rank"] == 2 and model.lora["alpha"] == 4.0
    assert model.lora["names"] == ["unsaved0", "unsaved1", "unsaved2"]
    targets = model.lora["targets"]
    assert len(targets) == 4 and all(t.endswith(("q_proj", "v_proj")) for t in targets)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters() if ".lora_" in n}
    assert len(trainable) == 4 * 2 * 3
    # the adapters add_lora gives with the same seed: A seeded, B zero
    expected = lora.add_lora(copy.deepcopy(tiny_model[0]), 2, 4.0, 3, 3, ["q_proj", "v_proj"])
    for k in range(3):
        for ours, theirs in zip(
            lora.adapter_parameters(model, k), lora.adapter_parameters(expected, k)
        ):
            assert torch.equal(ours, theirs)
    assert all((layer.lora_B[k] == 0).all() for layer in lora.lora_layers(model).values())
    # no targets named: every linear layer of the 2 blocks but the LM head
    models, _ = training.trained_team(dataclasses.replace(cfg, lora_targets=""), 1, CPU)
    assert len(models[0].lora["targets"]) == 2 * 7 and lora.n_adapters(models[0]) == 1


def test_trained_team_of_whole_models_one_per_agent(tiny_model_dir):
    """--lora-rank 0: `n_trained` whole models, every weight trainable, each agent's member its own
    engine (no adapter); one model when they are shared."""
    cfg = team_config(tiny_model_dir, lora_rank=0)
    models, team = training.trained_team(cfg, 2, CPU)
    assert len(models) == 2 and models[0] is not models[1]
    assert [e.model for e in team.engines()] == models
    assert team.members == [Member(team.engines()[0]), Member(team.engines()[1])]
    assert all(not hasattr(m, "lora") for m in models)
    assert all(p.requires_grad for m in models for p in m.parameters())
    assert all(e.batch_size == 6 and e.dtype == "float32" for e in team.engines())
    models, team = training.trained_team(cfg, 1, CPU)
    assert len(models) == 1 and len(team.members) == 1 and team.first.model is models[0]


def test_trained_team_samples_from_bf16_copies_that_refresh_copies_weights(tiny_model_dir):
    """--train-dtype bfloat16: fp32 master weights, rollouts from a bf16 copy (the same tokenizer
    and slots); refresh_rollout_weights copies each model's current weights into its own copy and
    puts the models in eval mode (generation's KV cache)."""
    cfg = team_config(tiny_model_dir, lora_rank=0, train_dtype="bfloat16")
    models, team = training.trained_team(cfg, 2, CPU)
    engines = team.engines()
    assert len(engines) == 2 and all(e.batch_size == 6 for e in engines)
    for m, e in zip(models, engines):
        assert e.model is not m and next(e.model.parameters()).dtype == torch.bfloat16
        assert e.device == "cpu"
        assert next(m.parameters()).dtype == torch.float32
    assert team.members == [Member(engines[0]), Member(engines[1])]
    with torch.no_grad():
        for e, m in enumerate(models):
            for p in m.parameters():
                p.add_(1.0 + e)
    for m in models:
        m.train()
    training.refresh_rollout_weights(models, team)
    for m, e in zip(models, engines):
        assert not m.training
        for rollout_weight, weight in zip(e.model.parameters(), m.parameters()):
            assert torch.equal(rollout_weight, weight.to(torch.bfloat16))
    # adapters: one bf16 copy of the base and its adapters, every agent's member on it
    cfg = team_config(tiny_model_dir, lora_rank=2, lora_alpha=4.0, train_dtype="bfloat16")
    [model], team = training.trained_team(cfg, 2, CPU)
    assert team.members == [Member(team.first, 0), Member(team.first, 1)]
    assert team.first.model is not model and lora.n_adapters(team.first.model) == 2
    with torch.no_grad():
        lora.adapter_parameters(model, 1)[1].add_(0.5)
    training.refresh_rollout_weights([model], team)
    copied = lora.adapter_parameters(team.first.model, 1)[1]
    assert torch.equal(copied, torch.full_like(copied, 0.5))


def test_refresh_rollout_weights_without_a_copy_only_sets_eval(tiny_model_dir):
    """fp32: the engine samples from the trained model itself; refresh puts it in eval mode."""
    models, team = training.trained_team(team_config(tiny_model_dir, lora_rank=0), 1, CPU)
    before = [p.detach().clone() for p in models[0].parameters()]
    models[0].train()
    training.refresh_rollout_weights(models, team)
    assert not models[0].training and team.first.model is models[0]
    assert all(torch.equal(a, p) for a, p in zip(before, models[0].parameters()))


def test_trained_team_starts_every_adapter_from_the_init_file(tiny_model, tiny_model_dir, tmp_path):
    """--init-adapter: each of the `n_trained` adapters a copy of the file's, named as unsaved
    weights; a file for another base refused in one line naming the file."""
    path = tmp_path / "a.pt"
    torch.save(lora.adapter_state(adapted(tiny_model), 0, "tiny"), path)
    cfg = team_config(tiny_model_dir, lora_rank=2, lora_alpha=4.0, init_adapter=str(path))
    [model], team = training.trained_team(cfg, 2, CPU)
    assert lora.n_adapters(model) == 2 and model.lora["names"] == ["unsaved0", "unsaved1"]
    assert team.members == [Member(team.first, 0), Member(team.first, 1)]
    saved = load_file(path, "adapter")["tensors"]
    for k in range(2):
        state = lora.adapter_state(model, k, "tiny")["tensors"]
        assert all(torch.equal(state[name], saved[name]) for name in saved)
    other = copy.deepcopy(tiny_model[0])
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    foreign = tmp_path / "foreign.pt"
    torch.save(lora.adapter_state(lora.add_lora(other, 2, 4.0, adapters=1), 0, "x"), foreign)
    with pytest.raises(FileRefused) as caught:
        training.trained_team(dataclasses.replace(cfg, init_adapter=str(foreign)), 2, CPU)
    assert str(caught.value).startswith(f"{foreign}: an adapter for another base model (")
    missing = tmp_path / "missing.pt"
    with pytest.raises(FileRefused, match=re.escape(f"{missing}: cannot read the adapter file")):
        training.trained_team(dataclasses.replace(cfg, init_adapter=str(missing)), 2, CPU)


def test_trained_team_starts_each_adapter_from_its_own_file(tiny_model, tiny_model_dir, tmp_path):
    """--init-adapter A,B: adapter k starts from the k-th file, each at its own rank (the lower
    one padded: the same logits as that file alone); a count that is neither 1 nor one each, or a
    listed file that is no adapter, refused in one line."""
    files = []
    for rank, seed in ((2, 0), (1, 5)):
        files.append(tmp_path / f"r{rank}.pt")
        state = lora.adapter_state(adapted(tiny_model, rank=rank, seed=seed), 0, "tiny")
        torch.save(state, files[-1])
    both = ",".join(map(str, files))
    cfg = team_config(tiny_model_dir, lora_rank=3, lora_alpha=4.0, init_adapter=both)
    train_magrpo.check(cfg, 1)
    [model], _ = training.trained_team(cfg, 2, CPU)
    assert model.lora["names"] == ["unsaved0", "unsaved1"]
    ids = torch.tensor([[3, 8, 1, 40, 7]])
    for k, path in enumerate(files):
        alone = copy.deepcopy(tiny_model[0])
        lora.load_adapter(alone, read_adapter(str(path)))
        with torch.no_grad(), lora.selecting(model, k), lora.selecting(alone, 0):
            assert torch.allclose(
                model(input_ids=ids).logits, alone(input_ids=ids).logits, atol=1e-6
            )
    three = dataclasses.replace(cfg, init_adapter=f"{both},{files[0]}")
    said = "--init-adapter: 3 adapters for 2 trained ones (one for all, or one each)"
    with pytest.raises(UsageError, match=f"^{re.escape(said)}$"):
        training.trained_team(three, 2, CPU)
    listed = tmp_path / "list.pt"
    torch.save([1, 2], listed)
    with pytest.raises(
        UsageError, match=re.escape(f"--init-adapter {listed}: not an adapter file")
    ):
        train_magrpo.check(dataclasses.replace(cfg, init_adapter=f"{files[0]},{listed}"), 1)


# --------------------------------------------------------------------------------------------------
# Sampling and prompts
# --------------------------------------------------------------------------------------------------
class RecordingTeam:
    """A team that records what it is asked to generate."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, seeds, agents, **params):
        self.calls.append((prompts, seeds, agents, params))
        return ["done"] * len(prompts)


def test_sample_asks_for_tokens_at_the_rollout_temperature_without_top_p():
    """sample: the prompts, seeds and agents as given, --max-new-tokens, --rollout-temperature (not
    the game's --temperature or --top-p: the loss scores the whole tempered distribution), and the
    token ids back. (MLPO's config: MAGRPO's has no --temperature or --top-p at all.)"""
    cfg = train_mlpo.Config(max_new_tokens=11, rollout_temperature=0.8, temperature=0.3, top_p=0.5)
    team = RecordingTeam()
    out = training.sample(team, ["p0", "p1"], [5, 6], [1, 0], cfg)
    assert out == ["done", "done"]
    assert team.calls == [
        (
            ["p0", "p1"],
            [5, 6],
            [1, 0],
            dict(max_new_tokens=11, temperature=0.8, top_p=1.0, return_tokens=True),
        )
    ]


def test_sample_routes_each_prompt_to_its_agents_adapter(tiny_model, tiny_model_dir):
    """Through a real team of adapters: each completion carries its sampled ids (EOS included,
    within the budget); agent 0's untrained adapter samples as the base model does, token for
    token, and agent 1's trained one, from the same prompt and seed, otherwise."""
    cfg = team_config(tiny_model_dir, lora_rank=2, lora_alpha=4.0, max_new_tokens=6)
    [model], team = training.trained_team(cfg, 2, CPU)
    with torch.no_grad():
        for p in lora.adapter_parameters(model, 1):
            p.add_(0.5)
    training.refresh_rollout_weights([model], team)
    out = training.sample(team, ["What is 2 + 3?"] * 2, [9, 9], [0, 1], cfg)
    assert all(c.token_ids and len(c.token_ids) == c.completion_tokens <= 6 for c in out)
    base = Engine(model=tiny_model[0], tokenizer=tiny_model[1])
    [plain] = base.generate(
        [base.chat("What is 2 + 3?")], [9], 6, temperature=1.0, top_p=1.0, return_tokens=True
    )
    assert out[0].token_ids == plain.token_ids and out[1].token_ids != plain.token_ids


class ChatEngine:
    """An engine whose chat format and tokenizer say whose they are."""

    def __init__(self, tag):
        self.tag = tag

    def chat(self, prompt):
        return f"<{self.tag}>{prompt}"

    def encode(self, text):
        return [self.tag] + [ord(c) for c in text]


def test_prompt_ids_read_the_prompt_in_its_agents_chat_format(tiny_model):
    """prompt_ids: the user prompt in agent i's own engine's chat format, encoded by that engine
    without special tokens (what the engine prefilled)."""
    team = Team([Member(ChatEngine(10)), Member(ChatEngine(20))])
    assert training.prompt_ids(team, "ab", 1) == [
        20,
        ord("<"),
        ord("2"),
        ord("0"),
        ord(">"),
        97,
        98,
    ]
    assert training.prompt_ids(team, "ab", 0)[0] == 10
    model, tokenizer = tiny_model
    engine = Engine(model=model, tokenizer=tokenizer)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "ab"}], tokenize=False, add_generation_prompt=True
    )
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert training.prompt_ids(Team([Member(engine)]), "ab", 2) == expected


# --------------------------------------------------------------------------------------------------
# The weights the loss runs, and resume
# --------------------------------------------------------------------------------------------------
def test_loss_modules_of_adapters_and_of_whole_models(tiny_model, monkeypatch):
    """loss_modules: adapters train as they are, the base their KL's reference (None); whole models
    are DDP-wrapped on the run's device, and with a KL term (`kl` True) each gets a frozen eval-mode
    copy of its weights as they are now, without one none; gradient checkpointing as asked."""
    wrapped = record_wrap_ddp(monkeypatch)
    model = adapted(tiny_model, adapters=2)
    cfg = SimpleNamespace(lora_rank=2, gradient_checkpointing=True, fsdp=False)
    assert training.loss_modules([model], cfg, CPU, kl=True) == ([model], None)
    assert wrapped == [] and model.is_activation_checkpointing
    whole = [copy.deepcopy(tiny_model[0]).train() for _ in range(2)]
    cfg = SimpleNamespace(lora_rank=0, gradient_checkpointing=False, fsdp=False)
    modules, references = training.loss_modules(whole, cfg, CPU, kl=False)
    assert wrapped == [(whole[0], CPU, False), (whole[1], CPU, False)]
    assert modules == whole and references is None
    assert not any(m.is_activation_checkpointing for m in whole)
    _, references = training.loss_modules(whole, cfg, CPU, kl=True)
    for reference, m in zip(references, whole):
        assert reference is not m
        assert not reference.training and m.training
        assert not any(p.requires_grad for p in reference.parameters())
        assert all(p.requires_grad for p in m.parameters())
        for a, b in zip(reference.parameters(), m.parameters()):
            assert torch.equal(a, b) and a is not b


def test_checkpointed_fresh_adapters(tiny_model, tmp_path):
    """A fresh run of adapters: AdamW over the adapters' parameters alone at the given lr and
    --weight-decay, the adapters' ParameterList as the checkpoint's holder, step 0."""
    model = adapted(tiny_model, adapters=2)
    cfg = train_magrpo.Config(lora_rank=2, lora_alpha=4.0, weight_decay=0.25)
    optimizer, holder, counters = training.checkpointed(
        [model], cfg, tmp_path, ALONE, lr=3e-4, extendable="steps"
    )
    assert type(optimizer) is torch.optim.AdamW and len(optimizer.param_groups) == 1
    group = optimizer.param_groups[0]
    assert group["lr"] == 3e-4 and group["weight_decay"] == 0.25
    adapters = lora.adapter_parameters(model, 0) + lora.adapter_parameters(model, 1)
    assert {id(p) for p in group["params"]} == {id(p) for p in adapters}
    assert len(group["params"]) == len(adapters)
    assert isinstance(holder, torch.nn.ParameterList)
    assert [id(p) for p in holder] == [id(p) for p in group["params"]]
    assert counters == {"step": 0}


def record_wrap_ddp(monkeypatch):
    """Records wrap_ddp's (module, device, find_unused) calls; the module comes back unwrapped."""
    calls = []

    def wrap_ddp(module, device, find_unused):
        calls.append((module, device, find_unused))
        return module

    monkeypatch.setattr(training, "wrap_ddp", wrap_ddp)
    return calls


def test_checkpointed_fresh_whole_models(tiny_model, tmp_path):
    """Whole weights: every parameter of every model in the optimizer, the models' ModuleList as
    the holder."""
    models = [copy.deepcopy(tiny_model[0]) for _ in range(2)]
    cfg = train_magrpo.Config(lora_rank=0)
    optimizer, holder, counters = training.checkpointed(
        models, cfg, tmp_path, ALONE, lr=1e-5, extendable="steps"
    )
    params = [p for m in models for p in m.parameters()]
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in params]
    assert optimizer.param_groups[0]["weight_decay"] == 0.0
    assert isinstance(holder, torch.nn.ModuleList) and list(holder) == models
    assert counters == {"step": 0}


def test_checkpointed_restores_the_checkpoint_weights_optimizer_and_rngs(
    tiny_model, tmp_path, capsys
):
    """A checkpoint in the out dir: the adapters' weights, AdamW's state, the step and the RNGs
    come back, --steps may grow (the `extendable` flag) but not shrink, another setting is
    refused; rank 1 says nothing."""
    cfg = train_magrpo.Config(lora_rank=2, lora_alpha=4.0, steps=2)
    model = adapted(tiny_model, adapters=2)
    optimizer, holder, _ = training.checkpointed(
        [model], cfg, tmp_path, ALONE, lr=1e-2, extendable="steps"
    )
    for p in holder:
        p.grad = torch.ones_like(p)
    optimizer.step()
    saved = [p.detach().clone() for p in holder]
    moments = [optimizer.state[p]["exp_avg"].clone() for p in holder]
    save_checkpoint(tmp_path, holder, optimizer, {"step": 3}, cfg, 0)
    after_save = torch.rand(4)
    torch.rand(100)  # the RNG moves on

    fresh = adapted(tiny_model, adapters=2, seed=5)
    longer = dataclasses.replace(cfg, steps=4, save_every=9)
    capsys.readouterr()
    optimizer, holder, counters = training.checkpointed(
        [fresh], longer, tmp_path, ALONE, lr=1e-2, extendable="steps"
    )
    assert capsys.readouterr().err.startswith(f"resuming from {tmp_path / 'checkpoint.pt'}")
    assert torch.equal(torch.rand(4), after_save)
    assert counters == {"step": 3}
    assert all(torch.equal(p, s) for p, s in zip(holder, saved))
    assert all(
        torch.equal(optimizer.state[p]["exp_avg"], m) and optimizer.state[p]["step"] == 1
        for p, m in zip(holder, moments)
    )
    # rank 1: the same weights, nothing said
    _, _, counters = training.checkpointed(
        [adapted(tiny_model, adapters=2)],
        longer,
        tmp_path,
        Ranks(1, 2, CPU),
        lr=1e-2,
        extendable="steps",
    )
    assert capsys.readouterr().err == "" and counters == {"step": 3}
    for changed, difference in (
        ({"steps": 1}, "steps: 2 there, 1 now"),
        ({"questions_per_step": 16}, "questions_per_step: 8 there, 16 now"),
    ):
        with pytest.raises(UsageError, match=re.escape(difference)):
            training.checkpointed(
                [adapted(tiny_model, adapters=2)],
                dataclasses.replace(cfg, **changed),
                tmp_path,
                ALONE,
                lr=1e-2,
                extendable="steps",
            )


# --------------------------------------------------------------------------------------------------
# The optimizer step and its statistics
# --------------------------------------------------------------------------------------------------
# 2 questions x 2 samples, sample g written by agent g; completions of 2, 3, 4 and 5 tokens
FOUR_SEQUENCES = [
    Sequence(q, g, g, [5 + q, 6], list(range(20, 22 + 2 * q + g)))
    for q in range(2)
    for g in range(2)
]


def step(models, optimizer, sequences, advantages, *, pad, world=1, **kw):
    """llm_step.policy_step on rank 0 of `world` on the CPU, MAGRPO's defaults (the sum, no KL,
    micro-batches of 8, the rollouts' temperature 1, a budget of 16 tokens) unless `kw` says."""
    kw = dict(agg="sum", beta=0.0, temperature=1.0, max_len=16, micro_batch=8, bf16=False) | kw
    ranks = Ranks(0, world, CPU)
    return policy_step(models, optimizer, sequences, advantages, pad=pad, ranks=ranks, **kw)


def test_policy_step_statistics_skip_flat_groups_and_keep_every_rank_in_step(
    tiny_model, monkeypatch
):
    """llm_step.policy_step's statistics, one shared model (every agent's sequences), one sequence
    per micro-batch, on rank 0 of 2 (the other rank's counts summed in): the loss over the step's
    sequences of every rank (each aggregation's normalizer from the global counts, divided by the
    world), the flat group's sequences counted but not trained on, the tokens of every rank; with
    every group flat one sequence still runs (at advantage 0: no gradient); a rank with no sequence
    runs the filler at advantage 0; with a KL term nothing is skipped and the KL is that of every
    sequence; the gradient is clipped to norm 1."""
    model, tokenizer = tiny_model
    model = copy.deepcopy(model).train()
    pad = tokenizer.pad_token_id
    sequences = FOUR_SEQUENCES
    advantages = torch.tensor([[0.0, 0.0], [0.5, -0.25]])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
        batch = completion_batch([(s.prompt_ids, s.completion_ids) for s in sequences], pad, CPU)
        logp, mask = completion_logprobs(model, batch)
        ref_logp, _ = completion_logprobs(reference, batch)
    mask = mask.bool()
    summed = torch.where(mask, logp, 0).sum(-1)
    k3 = torch.where(mask, torch.exp(ref_logp - logp) - (ref_logp - logp) - 1, 0)
    trained = -(0.5 * summed[2] - 0.25 * summed[3])
    # the other rank: 4 sequences of 14 tokens in all; world 2
    devices = []
    monkeypatch.setattr(llm_step, "all_reduce_sum", two_ranks([4, 14], devices))
    one = dict(pad=pad, world=2, micro_batch=1)
    # sum: / 8 sequences; const: / 8 x 16; token: / 28 tokens; each / world 2
    for agg, normalizer in (("sum", 4), ("const", 64), ("token", 14)):
        stats = step([model], optimizer, sequences, advantages, agg=agg, **one)
        assert stats["loss"] == pytest.approx((trained / normalizer).item(), rel=1e-5)
        assert stats["kl"] == 0.0 and stats["trained"] == 2 and stats["tokens"] == 28
        assert stats["grad_norm"] > 0 and all(p.grad is None for p in model.parameters())
    assert devices == [CPU] * 3
    flat = step([model], optimizer, sequences, torch.zeros(2, 2), **one)
    assert flat == {"loss": 0.0, "kl": 0.0, "trained": 1, "tokens": 28, "grad_norm": 0.0}
    empty = step([model], optimizer, [], advantages, **one)
    assert empty == {"loss": 0.0, "kl": 0.0, "trained": 0, "tokens": 14, "grad_norm": 0.0}
    monkeypatch.undo()
    # no sequence on any rank (every rollout dropped): the filler's 0 over a normalizer of 1, no nan
    for agg in ("sum", "token"):
        empty = step([model], optimizer, [], advantages, agg=agg, pad=pad)
        assert empty == {"loss": 0.0, "kl": 0.0, "trained": 0, "tokens": 0, "grad_norm": 0.0}
    monkeypatch.setattr(llm_step, "all_reduce_sum", two_ranks([4, 14], devices))
    held = []

    def accumulating(module, last):
        held.append((module, last))
        return contextlib.nullcontext()

    monkeypatch.setattr(llm_step, "accumulating", accumulating)
    # the filler still runs its backward (the all-reduce's), but adds nothing, its KL term neither
    # (the reference differs: its KL is not 0)
    with_kl = dict(beta=0.1, references=[reference])
    empty = step([model], optimizer, [], advantages, **one, **with_kl)
    assert empty == {"loss": 0.0, "kl": 0.0, "trained": 0, "tokens": 14, "grad_norm": 0.0}
    assert held == [(model, True)]
    held.clear()
    # micro-batches of 3 and 1: DDP's all-reduce held back until the last one's backward
    stats = step(
        [model], optimizer, sequences, advantages, pad=pad, world=2, micro_batch=3, **with_kl
    )
    assert held == [(model, False), (model, True)]
    assert stats["trained"] == 4
    assert stats["kl"] == pytest.approx((k3.sum() / 4).item(), rel=1e-4)
    assert stats["loss"] == pytest.approx((trained / 4 + 0.1 * k3.sum() / 4).item(), rel=1e-4)
    # large advantages: the gradient is clipped to norm 1 (SGD at lr 1 moves the weights by it)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = step([model], optimizer, sequences, 400 * advantages, **one)
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    assert stats["grad_norm"] > 1.5 and moved.norm().item() == pytest.approx(1.0, rel=1e-3)


def test_policy_step_with_a_model_per_agent_averages_their_losses(tiny_model):
    """Two whole models (--separate-agents): model e trains on agent e's sequences alone,
    normalized by their own count; the logged loss is the models' mean, the tokens every
    sequence's."""
    model, tokenizer = tiny_model
    models = [copy.deepcopy(model).train() for _ in range(2)]
    pad = tokenizer.pad_token_id
    sequences = FOUR_SEQUENCES
    with torch.no_grad():
        batch = completion_batch([(s.prompt_ids, s.completion_ids) for s in sequences], pad, CPU)
        logp, mask = completion_logprobs(model, batch)
        summed = torch.where(mask.bool(), logp, 0).sum(-1)
    # agent 0: (q1, g0) at 0.5, its flat (q0, g0) skipped; agent 1: (q1, g1) at -0.25; each / 2
    expected = (-0.5 * summed[2] / 2 + 0.25 * summed[3] / 2) / 2
    parameters = [p for m in models for p in m.parameters()]
    stats = step(
        models,
        torch.optim.SGD(parameters, lr=0.0),
        sequences,
        torch.tensor([[0.0, 0.0], [0.5, -0.25]]),
        pad=pad,
        micro_batch=2,
    )
    assert stats["loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert stats["trained"] == 2 and stats["tokens"] == 14 and stats["kl"] == 0.0


def test_policy_step_trains_each_adapter_on_its_agents_sequences(tiny_model, monkeypatch):
    """Adapters (--separate-agents): adapter e's loss runs with adapter e on agent e's sequences;
    an adapter whose agent's groups are all flat gets no update, the frozen base none."""
    model, tokenizer = tiny_model
    model = adapted(tiny_model, adapters=2).train()
    pad = tokenizer.pad_token_id
    sequences = FOUR_SEQUENCES
    # agent 1's rollouts (sample 1) all at advantage 0
    advantages = torch.tensor([[0.0, 0.0], [0.5, 0.0]])
    with torch.no_grad(), lora.selecting(model, 0):
        batch = completion_batch([(s.prompt_ids, s.completion_ids) for s in sequences], pad, CPU)
        logp, mask = completion_logprobs(model, batch)
        summed = torch.where(mask.bool(), logp, 0).sum(-1)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    # DDP cannot wrap adapters: each adapter's gradients averaged over the ranks by hand
    averaged = []
    monkeypatch.setattr(
        llm_step, "average_gradients", lambda params, world: averaged.append((params, world))
    )
    stats = step([model], optimizer, sequences, advantages, pad=pad)
    assert averaged == [(lora.adapter_parameters(model, e), 1) for e in (0, 1)]
    monkeypatch.undo()
    # adapter 0: -(0.5 x its summed log-prob) over agent 0's 2 sequences; adapter 1: 0; the mean
    assert stats["loss"] == pytest.approx((-0.5 * summed[2] / 2 / 2).item(), rel=1e-5)
    assert stats["trained"] == 2
    changed = {
        name
        for (name, p), b in zip(model.named_parameters(), before)
        if not torch.equal(p.detach(), b)
    }
    assert changed and all(re.search(r"\.lora_[AB]\.0$", name) for name in changed)
    # with a KL term (to the base, adapter off), both agents trained: the logged kl is the
    # adapters' mean, the gradient norm that of both adapters' gradients together
    advantages = torch.tensor([[0.0, 0.0], [0.5, -0.25]])
    beta, norms, kls = 0.2, [], []
    for e in range(2):
        rows = [k for k, s in enumerate(sequences) if s.agent == e]
        with torch.no_grad():
            ref, _ = completion_logprobs(model, batch)
        with lora.selecting(model, e):
            logp, _ = completion_logprobs(model, batch)
        own = mask.bool()[rows]
        A = advantages[[sequences[k].question for k in rows], [sequences[k].sample for k in rows]]
        k3 = softrank.kl_k3(logp[rows], ref[rows])
        terms = torch.where(own, -A[:, None] * logp[rows] + beta * k3, 0)
        grads = torch.autograd.grad(terms.sum() / 2, lora.adapter_parameters(model, e))
        norms.append(torch.cat([g.flatten() for g in grads]).norm())
        kls.append(torch.where(own, k3, 0).sum().item() / 2)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    stats = step([model], optimizer, sequences, advantages, pad=pad, beta=beta)
    assert stats["trained"] == 4 and min(kls) > 0
    assert stats["kl"] == pytest.approx(sum(kls) / 2, rel=1e-4)
    assert stats["grad_norm"] == pytest.approx(torch.stack(norms).norm().item(), rel=1e-4)


def test_policy_step_under_bfloat16_takes_the_loss_of_a_bf16_autocast_forward(tiny_model):
    """--train-dtype bfloat16: the loss's forward runs in bf16 autocast on the fp32 weights, so
    the step's loss is that forward's (not the fp32 one's, which differs)."""
    model, tokenizer = tiny_model
    model = copy.deepcopy(model).train()
    pad = tokenizer.pad_token_id
    # question 0's group is flat: sequences 2 and 3 alone are trained, in one micro-batch
    advantages = torch.tensor([[0.0, 0.0], [0.5, -0.25]])
    trained = [(s.prompt_ids, s.completion_ids) for s in FOUR_SEQUENCES[2:]]
    losses = []
    for bf16 in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logp, mask = completion_logprobs(model, completion_batch(trained, pad, CPU))
        summed = torch.where(mask.bool(), logp.float(), 0).sum(-1)
        # sum: over the step's 4 sequences
        expected = (-(0.5 * summed[0] - 0.25 * summed[1]) / 4).item()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        stats = step([model], optimizer, FOUR_SEQUENCES, advantages, pad=pad, bf16=bf16)
        assert stats["loss"] == pytest.approx(expected, rel=1e-6)
        losses.append(stats["loss"])
    assert abs(losses[0] - losses[1]) > 1e-5 * abs(losses[0])


def two_ranks(other, devices):
    """all_reduce_sum as if a second rank had summed in `other` (recording the device)."""

    def reduce(values, device):
        devices.append(device)
        return [float(a + b) for a, b in zip(values, other)]

    return reduce


def test_rollout_stats_sum_over_ranks_by_hand(monkeypatch):
    """rollout_stats over two ranks (the flat groups given, as softrank.flat_groups finds them):
    the loss and kl averaged over the ranks, the mean reward over every rollout, the flat groups'
    count and share over every group, the trained sequences summed; the gradient norm and tokens
    are this rank's (already global)."""
    update = {"loss": 0.75, "kl": 0.5, "trained": 5, "tokens": 40, "grad_norm": 1.5}
    # question 0 flat (all 1), question 1 not: rewards sum 4.5 over 6
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.5]])
    devices = []
    # the other rank: loss 0.25, kl 0.25, rewards 1.5 over 6, 2 flat groups of 2, 3 trained
    monkeypatch.setattr(
        training, "all_reduce_sum", two_ranks([0.25, 0.25, 1.5, 6, 2, 2, 3], devices)
    )
    flat = softrank.flat_groups(rewards)
    assert flat.tolist() == [[True], [False]]
    stats = training.rollout_stats(update, rewards, flat, Ranks(0, 2, "dev"))
    assert devices == ["dev"]
    assert stats == {
        "loss": 0.5,
        "kl": 0.375,
        "mean_reward": 0.5,
        "frac_zero_std": 0.75,
        "zero_std_groups": 3.0,
        "grad_norm": 1.5,
        "tokens": 40,
        "trained_sequences": 8.0,
    }
    monkeypatch.undo()
    one = training.rollout_stats(update, rewards, flat, ALONE)
    assert (one["loss"], one["kl"], one["mean_reward"]) == (0.75, 0.5, 0.75)
    assert (one["frac_zero_std"], one["zero_std_groups"], one["trained_sequences"]) == (0.5, 1, 5)
    # the rewards counted after --truncated drop: one left is its own mean, none is 0 (not NaN)
    lone = training.rollout_stats(update, torch.tensor([0.5]), flat, ALONE)
    assert lone["mean_reward"] == 0.5
    assert training.rollout_stats(update, torch.tensor([]), flat, ALONE)["mean_reward"] == 0.0


# --------------------------------------------------------------------------------------------------
# Validation's log and the saved weights
# --------------------------------------------------------------------------------------------------
class Log:
    def __init__(self):
        self.lines = []

    def write(self, **record):
        self.lines.append(record)


def test_log_accuracy_logs_the_accuracy_over_every_rank(monkeypatch, capsys):
    """log_accuracy: right answers over questions, summed over the ranks, logged at the step; rank
    0 prints it (3 places), another rank does not."""
    log = Log()
    training.log_accuracy(torch.tensor([1.0, 0.0, 1.0, 1.0]), log, 6, ALONE)
    assert log.lines == [{"step": 6, "val_accuracy": 0.75, "val_questions": 4}]
    assert type(log.lines[0]["val_questions"]) is int
    assert capsys.readouterr().err == "step 6: val accuracy 0.750 (4 questions)\n"
    devices = []
    monkeypatch.setattr(training, "all_reduce_sum", two_ranks([0, 2], devices))
    training.log_accuracy(torch.tensor([1.0]), log, 8, Ranks(1, 2, "dev"))
    assert log.lines[-1] == {"step": 8, "val_accuracy": 1 / 3, "val_questions": 3}
    assert devices == ["dev"] and capsys.readouterr().err == ""


class OneEngineTeam:
    def __init__(self, model):
        self.engine = SimpleNamespace(model=model)

    def engines(self):
        return [self.engine]


def test_validate_plays_greedy_single_rollouts_of_the_fresh_weights(monkeypatch, capsys):
    """validate: the rollout engines refreshed first, then the script's rollouts of this rank's
    shard with one greedy rollout per question and no format reward (the rest of the config as it
    is), their rewards logged as the accuracy; an empty shard plays nothing and logs the other
    ranks' accuracy."""
    model, rollout_copy = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    team = OneEngineTeam(rollout_copy)
    cfg = train_magrpo.Config(group=4, rollout_temperature=0.9, format_reward=0.3, agents=2)
    asked = []

    def rollouts(team_, shard, greedy, step):
        # the weights were copied before the rollouts
        assert torch.equal(team_.engine.model.weight, model.weight) and not model.training
        asked.append((team_, shard, greedy, step))
        return "sequences", torch.tensor([1.0, 0.0, 1.0])

    log = Log()
    model.train()
    training.validate([model], team, rollouts, ["a", "b", "c"], cfg, step=5, ranks=ALONE, log=log)
    [(team_, shard, greedy, step)] = asked
    assert team_ is team and shard == ["a", "b", "c"] and step == 5
    assert greedy == dataclasses.replace(cfg, group=1, rollout_temperature=0.0, format_reward=0.0)
    assert (cfg.group, cfg.rollout_temperature, cfg.format_reward) == (4, 0.9, 0.3)
    assert log.lines == [{"step": 5, "val_accuracy": 2 / 3, "val_questions": 3}]
    assert capsys.readouterr().err == "step 5: val accuracy 0.667 (3 questions)\n"
    # a rank with no validation question (fewer than the ranks): the others' 1 of 2
    devices = []
    monkeypatch.setattr(training, "all_reduce_sum", two_ranks([1, 2], devices))
    training.validate([model], team, rollouts, [], cfg, step=7, ranks=Ranks(1, 2, CPU), log=log)
    assert len(asked) == 1 and devices == [CPU]
    assert log.lines[-1] == {"step": 7, "val_accuracy": 0.5, "val_questions": 2}


@dataclasses.dataclass
class Saved:
    """The flags save_trained reads and records."""

    lora_rank: int = 2
    model: str = ""


def test_save_trained_writes_adapter_folders_that_load_back(tiny_model, tmp_path):
    """Adapters: PEFT folders adapter/ for one, agent0/, agent1/, ... for several, each adapter k's
    tensors and settings with --model's name (the default backbone's GGUF when empty) as its base,
    the run's flags and the agent among the extras; loaded into the plain base it gives the trained
    model's logits."""
    model = adapted(tiny_model, adapters=1)
    cfg = Saved()
    out = tmp_path / "one"
    out.mkdir()
    assert training.save_trained([model], tiny_model[1], out, cfg, 0) == [str(out / "adapter")]
    assert sorted(p.name for p in out.iterdir()) == ["adapter"]
    assert sorted(p.name for p in (out / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "mpdf.json",
    ]
    extras = json.loads((out / "adapter" / "mpdf.json").read_text())
    assert extras["agent"] is None and extras["training"] == {"lora_rank": 2, "model": ""}
    state = read_adapter(out / "adapter")
    assert state["base"] == backbone.DEFAULT_NAME
    assert (state["rank"], state["alpha"]) == (2, 4.0)
    plain = copy.deepcopy(tiny_model[0])
    k = lora.load_adapter(plain, state)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), lora.selecting(plain, k), lora.selecting(model, 0):
        torch.testing.assert_close(plain(ids).logits, model(ids).logits)
    several = adapted(tiny_model, adapters=3)
    out = tmp_path / "three"
    out.mkdir()
    # rank 1 names the folders and writes nothing: rank 0 writes
    elsewhere = tmp_path / "rank1"
    elsewhere.mkdir()
    paths = training.save_trained([several], tiny_model[1], elsewhere, Saved(model="m"), 1)
    assert paths == [str(elsewhere / f"agent{k}") for k in range(3)]
    assert list(elsewhere.iterdir()) == []
    paths = training.save_trained([several], tiny_model[1], out, Saved(model="m"), 0)
    assert paths == [str(out / f"agent{k}") for k in range(3)]
    for k, path in enumerate(paths):
        state = read_adapter(path)
        assert (
            state["base"] == "m"
            and json.loads((Path(path) / "mpdf.json").read_text())["agent"] == k
        )
        expected = lora.adapter_state(several, k, "m")["tensors"]
        assert all(torch.equal(state["tensors"][n], t) for n, t in expected.items())


def test_save_trained_writes_whole_models_as_hf_directories(tiny_model, tmp_path):
    """Whole weights: model/ for one, agent0/, agent1/ for several, each an HF directory (weights
    and tokenizer) holding its own model's weights; the models left in eval mode."""
    models = [copy.deepcopy(tiny_model[0]).train() for _ in range(2)]
    with torch.no_grad():
        models[1].lm_head.weight.add_(1.0)
    cfg = SimpleNamespace(lora_rank=0, model="")
    paths = training.save_trained(models, tiny_model[1], tmp_path, cfg, 0)
    assert paths == [str(tmp_path / "agent0"), str(tmp_path / "agent1")]
    assert not any(m.training for m in models)
    for m, path in zip(models, paths):
        loaded, tokenizer = backbone.load_model(path)
        assert tokenizer.get_vocab() == tiny_model[1].get_vocab()
        assert torch.equal(loaded.lm_head.weight, m.lm_head.weight)
    one = tmp_path / "one"
    one.mkdir()
    assert training.save_trained(models[:1], tiny_model[1], one, cfg, 0) == [str(one / "model")]
    assert sorted(p.name for p in one.iterdir()) == ["model"]
    assert (Path(one / "model") / "config.json").is_file()


def test_policy_step_normalizes_each_of_three_learners_by_its_own_count(tiny_model):
    """Three whole models, one sequence each (agents 0, 1, 2), MAGRPO's sum: each model's loss is
    its sequence's -A x summed log-prob over a count of 1, and the logged loss their mean."""
    model, tokenizer = tiny_model
    models = [copy.deepcopy(model).train() for _ in range(3)]
    pad = tokenizer.pad_token_id
    sequences = [Sequence(0, e, e, [5, 6], list(range(20, 23 + e))) for e in range(3)]
    advantages = torch.tensor([[0.5, -0.25, 1.0]])
    expected = []
    with torch.no_grad():
        for s in sequences:
            batch = completion_batch([(s.prompt_ids, s.completion_ids)], pad, CPU)
            logp, mask = completion_logprobs(model, batch)
            expected.append(-advantages[0, s.sample] * torch.where(mask.bool(), logp, 0).sum())
    parameters = [p for m in models for p in m.parameters()]
    stats = step(models, torch.optim.SGD(parameters, lr=0.0), sequences, advantages, pad=pad)
    assert stats["loss"] == pytest.approx((sum(expected) / 3).item(), rel=1e-5)
    assert stats["trained"] == 3 and stats["tokens"] == 3 + 4 + 5


def recorded(folder, **settings):
    """An adapter folder holding only its recorded training settings (mpdf.json)."""
    folder.mkdir()
    (folder / lora.EXTRAS).write_text(json.dumps({"training": settings}))
    return str(folder)


def test_unseen_pool_leaves_out_every_question_the_starting_adapters_and_theirs_drew(tmp_path):
    """--unseen-questions: the pool less the questions each adapter drew (its seed's shuffle, after
    its validation slice) and those of the adapters it started from (--init-adapter) or read
    (--refine-contexts), each followed once; the rest in the pool's order, validation first.
    Without the flag the pool is whole; an adapter with no record or one that is not JSON, or a
    record that does not say which questions it drew, is refused."""
    split = dict(task="split", path="", level=1, agents=3, values_held=2, split_questions=0.5)

    def drew(name, seed, val_n, questions, **read_from):
        """An adapter recorded as trained on its seed's pool[val_n : val_n + questions]."""
        return recorded(
            tmp_path / name, **split, seed=seed, val_n=val_n, questions=questions, **read_from
        )

    first = drew("first", 1, 0, 2)
    read = drew("read", 2, 1, 1)
    # `read` is reached through an --init-adapter only, and `first` twice, the second time while
    # `read` still waits to be read
    middle = drew("middle", 2, 3, 1, init_adapter=read, refine_contexts=first)
    last = drew("last", 0, 2, 3, init_adapter=middle, refine_contexts=first)
    assert len(training.adapter_trainings([last])) == 4
    cfg = SimpleNamespace(**split, seed=0, unseen_questions=True)
    pool = {s: data.training_pool(SimpleNamespace(**split, seed=s)) for s in (0, 1, 2)}
    seen = {e.question for e in pool[0][2:5] + pool[1][:2] + pool[2][1:2] + pool[2][3:4]}
    unseen = training.unseen_pool(cfg, [last])
    assert not seen & {e.question for e in unseen}
    assert len(unseen) == len(pool[0]) - len(seen)
    assert unseen == [e for e in pool[0] if e.question not in seen]
    assert unseen[:2] == pool[0][:2]
    whole = SimpleNamespace(**split, seed=0, unseen_questions=False)
    assert training.unseen_pool(whole, [last]) == pool[0]
    refused(
        UsageError,
        f"{tmp_path / 'none'}: records no training settings (its mpdf.json), so its questions "
        "cannot be told apart",
        training.unseen_pool,
        cfg,
        [str(tmp_path / "none")],
    )
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / lora.EXTRAS).write_text("{not json")
    refused(
        UsageError,
        f"{tmp_path / 'garbled'}: records no training settings (its mpdf.json), so its questions "
        "cannot be told apart",
        training.unseen_pool,
        cfg,
        [str(tmp_path / "garbled")],
    )
    vague = recorded(tmp_path / "vague", **split, seed=0, out_dir="runs/vague")
    refused(
        data.DataError,
        "a training run of runs/vague does not record which questions it drew (task, seed, "
        "val_n, questions)",
        training.unseen_pool,
        cfg,
        [vague],
    )
