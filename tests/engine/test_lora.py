"""LoRA adapters (llm/lora.py) and the engine running rows with different adapters in one batch, on
tiny random models."""

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch
from launch import run

from common import FileRefused, load_file
from llm import backbone, lora
from llm.engine import Engine
from llm.team import read_adapter

ROOT = Path(__file__).resolve().parents[2]


def adapted(tiny_model, adapters, rank=4, seed=1):
    """A copy of the tiny model with `adapters` LoRA adapters whose B is random (a zero B is the
    base model: nothing to tell apart)."""
    model = lora.add_lora(copy.deepcopy(tiny_model[0]), rank, alpha=8, adapters=adapters, seed=0)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            for b in layer.lora_B:
                b.copy_(torch.randn(b.shape, generator=generator) * 0.5)
    return model


def logits(model, ids, adapter=None):
    with torch.no_grad(), lora.selecting(model, adapter):
        return model(input_ids=ids).logits


IDS = torch.tensor([[1, 5, 9, 200, 31, 7], [4, 4, 100, 2, 17, 9], [8, 3, 3, 60, 5, 11]])


def test_a_fresh_adapter_is_the_base_model_bit_for_bit(tiny_model):
    model = lora.add_lora(copy.deepcopy(tiny_model[0]), rank=4, alpha=8, adapters=2)
    base = logits(tiny_model[0], IDS)
    for k in (0, 1):
        assert torch.equal(logits(model, IDS, k), base)
    # and a mixed batch: adapter 1, the base, adapter 0
    assert torch.equal(logits(model, IDS, torch.tensor([1, -1, 0])), base)
    # the base is frozen, the adapters train
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)


def test_a_mixed_batch_gives_each_row_its_own_adapters_logits(tiny_model):
    model = adapted(tiny_model, adapters=3)
    rows = torch.tensor([2, 0, -1])
    mixed = logits(model, IDS, rows)
    for row, k in enumerate(rows.tolist()):
        alone = logits(model, IDS[row : row + 1], None if k < 0 else k)[0]
        torch.testing.assert_close(mixed[row], alone, rtol=1e-5, atol=1e-5)
        reference = tiny_model[0] if k < 0 else lora.merged_copy(model, k)
        torch.testing.assert_close(
            mixed[row], logits(reference, IDS[row : row + 1])[0], rtol=1e-4, atol=1e-4
        )
    # the adapters differ from each other and from the base (the test can tell them apart)
    assert not torch.allclose(logits(model, IDS, 0), logits(model, IDS, 1), atol=1e-2)
    assert not torch.allclose(logits(model, IDS, 0), logits(tiny_model[0], IDS), atol=1e-2)


def test_engine_batch_mixing_adapters_gives_each_row_its_adapters_greedy_tokens(tiny_model):
    """12 prompts over 4 slots, rows of adapters 0, 1, 2 and the base mixed; rows stop at different
    steps (some of their tokens declared EOS), so rows leave, move slots and new rows come in while
    others decode: each row must keep its own adapter throughout."""
    model = adapted(tiny_model, adapters=3)
    engine = Engine(model=model, tokenizer=tiny_model[1], batch_size=4)
    prompts = [engine.chat(f"What is {k} + {k + 2}?") for k in range(4)] * 3
    adapters = [k % 3 if k % 4 else None for k in range(len(prompts))]
    seeds = list(range(len(prompts)))
    engine.eos_ids = set()  # the random model never stops by itself: its free-running text first
    free = engine.generate(prompts, seeds, 16, 0, adapters=adapters, return_tokens=True)
    engine.eos_ids = {free[1].token_ids[2], free[6].token_ids[7], free[11].token_ids[11]}
    mixed = engine.generate(prompts, seeds, 16, 0, adapters=adapters)
    assert len({c.completion_tokens for c in mixed}) >= 3  # rows left at different steps
    for k, (prompt, adapter) in enumerate(zip(prompts, adapters)):
        alone = engine.generate([prompt], [k], 16, 0, adapters=[adapter])[0]
        assert mixed[k].text == alone.text, (k, adapter)
    # the base rows are the plain engine's
    plain = Engine(model=tiny_model[0], tokenizer=tiny_model[1])
    plain.eos_ids = engine.eos_ids
    base_rows = [k for k, a in enumerate(adapters) if a is None]
    want = plain.generate([prompts[k] for k in base_rows], [0] * len(base_rows), 16, 0)
    assert [mixed[k].text for k in base_rows] == [c.text for c in want]
    # adapters change the text (else the comparison above proves nothing)
    assert len({mixed[k].text for k in (1, 2, 3)}) > 1


def test_adapter_cache_keys(tiny_model, tmp_path):
    model = adapted(tiny_model, adapters=2)
    engine = Engine(model=model, tokenizer=tiny_model[1], cache_dir=str(tmp_path))
    prompt = [engine.chat("What is 1 + 1?")]
    first = [engine.generate(prompt, [0], 8, 0, adapters=[a])[0] for a in (None, 0, 1)]
    again = [engine.generate(prompt, [0], 8, 0, adapters=[a])[0] for a in (None, 0, 1)]
    assert [c.cached for c in first] == [False] * 3 and [c.cached for c in again] == [True] * 3
    assert [c.text for c in first] == [c.text for c in again]


def test_adapter_file_round_trip(tiny_model, tmp_path):
    model = adapted(tiny_model, adapters=2)
    path = tmp_path / "a1.pt"
    torch.save(lora.adapter_state(model, 1, "tiny"), path)
    assert path.stat().st_size < 200_000
    fresh = copy.deepcopy(tiny_model[0])
    # a model without LoRA holds no adapter
    assert lora.n_adapters(fresh) == 0
    k = lora.load_adapter(fresh, load_file(path, "adapter"))
    assert k == 0 and lora.n_adapters(fresh) == 1
    assert torch.equal(logits(fresh, IDS, 0), logits(model, IDS, 1))
    # the name in cache keys is the file's content, not its path or slot
    again = lora.load_adapter(fresh, load_file(path, "adapter"))
    assert fresh.lora["names"][again] == fresh.lora["names"][k]


def test_a_lower_rank_adapter_loads_into_a_higher_rank_model_exactly(tiny_model):
    """A team of mixed ranks in one engine: a rank-4 file padded into a model wrapped at rank 8 (and
    another alpha) gives its own logits, alone and in a batch beside a rank-8 adapter."""
    low = lora.adapter_state(adapted(tiny_model, adapters=1, seed=1), 0, "tiny")
    high = lora.adapter_state(adapted(tiny_model, adapters=1, rank=8, seed=2), 0, "tiny")
    own = copy.deepcopy(tiny_model[0])
    lora.load_adapter(own, low)
    wide = copy.deepcopy(tiny_model[0])
    lora.add_lora(wide, rank=8, alpha=4)
    h, k = lora.load_adapter(wide, high), lora.load_adapter(wide, low)
    assert wide.lora["rank"] == 8 and wide.lora["alpha"] == 4
    torch.testing.assert_close(logits(wide, IDS, k), logits(own, IDS, 0), rtol=1e-5, atol=1e-5)
    mixed = logits(wide, IDS, torch.tensor([k, h, k]))
    torch.testing.assert_close(mixed[[0, 2]], logits(own, IDS, 0)[[0, 2]], rtol=1e-5, atol=1e-5)
    # the padding rows and columns stay zero: the delta is the file's
    layer = next(iter(lora.lora_layers(wide).values()))
    assert not layer.lora_A[k][4:].any() and not layer.lora_B[k][:, 4:].any()
    assert not torch.allclose(mixed[1], logits(own, IDS, 0)[1], atol=1e-2)


def test_an_adapter_for_another_base_or_shape_is_refused(tiny_model, tmp_path):
    model = adapted(tiny_model, adapters=1)
    state = lora.adapter_state(model, 0, "tiny")
    other = copy.deepcopy(tiny_model[0])
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    with pytest.raises(lora.AdapterMismatch, match="another base model"):
        lora.load_adapter(other, state)
    narrower = lora.add_lora(copy.deepcopy(tiny_model[0]), rank=2, alpha=8)
    with pytest.raises(lora.AdapterMismatch, match=r"another rank \(4 there, 2 here"):
        lora.load_adapter(narrower, state)
    broken = copy.deepcopy(state)
    name = next(iter(broken["tensors"]))
    broken["tensors"][name] = broken["tensors"][name][:, :3]
    with pytest.raises(lora.AdapterMismatch, match="should be"):
        lora.load_adapter(copy.deepcopy(tiny_model[0]), broken)
    # another set of layers, a tensor missing
    some = lora.add_lora(copy.deepcopy(tiny_model[0]), rank=4, alpha=8, parts=("q_proj",))
    with pytest.raises(lora.AdapterMismatch) as refused:
        lora.load_adapter(some, state)
    assert str(refused.value) == (
        "an adapter for another targets (14 layers there, 2 layers here; the file was trained on "
        "'tiny')"
    )
    missing = dict(state, tensors=dict(state["tensors"]))
    del missing["tensors"][name]
    with pytest.raises(lora.AdapterMismatch) as refused:
        lora.load_adapter(copy.deepcopy(tiny_model[0]), missing)
    assert str(refused.value).endswith(", the file has nothing") and name in str(refused.value)
    with pytest.raises(lora.AdapterMismatch) as refused:
        lora.load_adapter(copy.deepcopy(tiny_model[0]), {"tensors": {}})
    assert str(refused.value) == "not an adapter file (the LLM-weight trainers write them)"
    # layers this model does not have: refused before anything is wrapped
    fresh = copy.deepcopy(tiny_model[0])
    with pytest.raises(lora.AdapterMismatch) as refused:
        lora.load_adapter(fresh, dict(state, targets=["nope"]))
    assert str(refused.value) == (
        "the file's layers do not fit this model: LlamaForCausalLM: no nn.Linear layers named "
        "with any of ['nope'] to adapt"
    )
    assert getattr(fresh, "lora", None) is None


def test_an_adapter_of_some_layers_wraps_only_those(tiny_model):
    """A file trained on a subset of the layers (--lora-targets) wraps exactly its layers in a
    fresh model and gives its own logits there."""
    model = lora.add_lora(copy.deepcopy(tiny_model[0]), 4, alpha=8, adapters=1, parts=("q_proj",))
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B[0].normal_(generator=torch.Generator().manual_seed(3))
    state = lora.adapter_state(model, 0, "tiny")
    fresh = copy.deepcopy(tiny_model[0])
    k = lora.load_adapter(fresh, state)
    assert fresh.lora["targets"] == state["targets"] == model.lora["targets"]
    assert all(name.endswith("q_proj") for name in lora.lora_layers(fresh))
    assert torch.equal(logits(fresh, IDS, k), logits(model, IDS, 0))


def test_adapter_runs_and_fingerprints():
    """adapter_runs: (first, last) of each run of rows with one adapter, one run for all when not
    split; an adapter's name is 16 hex digits of its tensors' hash."""
    assert lora.adapter_runs([0, 0, 1, 1, None, 0]) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert lora.adapter_runs([3]) == [(0, 1)]
    assert lora.adapter_runs([0, 1, 0], split=False) == [(0, 3)]
    name = lora.adapter_fingerprint({"tensors": {"x.A": torch.ones(2, 2)}})
    assert len(name) == 16 and int(name, 16) >= 0


def test_a_mixed_batch_under_autograd_and_the_stacked_cache(tiny_model):
    """Training a batch of rows with different adapters (autograd on) gives the rows the logits
    of the no-grad path, and each adapter's gradient only from its rows; without gradients the
    stacked A and B are built once and, when a parameter changes in place, refreshed in the same
    tensors (a CUDA graph reads them where they were)."""
    model = adapted(tiny_model, adapters=2)
    with lora.selecting(model, 1):
        one = model(input_ids=IDS).logits
    torch.testing.assert_close(one, logits(model, IDS, 1), rtol=1e-5, atol=1e-5)
    rows = torch.tensor([1, 0, 1])
    with lora.selecting(model, rows):
        out = model(input_ids=IDS).logits
    torch.testing.assert_close(out, logits(model, IDS, rows), rtol=1e-5, atol=1e-5)
    out[1].sum().backward()  # row 1 runs adapter 0 only
    layer = next(iter(lora.lora_layers(model).values()))
    assert layer.lora_A[0].grad.abs().sum() > 0 and not layer.lora_A[1].grad.any()
    with torch.no_grad():
        first = layer.stacked()
        assert layer.stacked()[0] is first[0]
        before = first[1].clone()
        layer.lora_B[1].add_(1.0)
        again = layer.stacked()
    assert again[1] is first[1] and torch.equal(again[1][:, 4:], before[:, 4:] + 1)
    assert torch.equal(again[1][:, :4], before[:, :4])


def test_base_fingerprint_is_the_same_in_bf16(tiny_model):
    model = tiny_model[0]
    assert lora.base_fingerprint(model) == lora.base_fingerprint(
        copy.deepcopy(model).to(torch.bfloat16)
    )


def test_base_fingerprint_hashes_each_weights_name_shape_and_sum():
    """Each base weight's name (as the unwrapped model names it), shape and bf16-rounded sum, in
    order: the same numbers under other names are other weights."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 3, bias=False))
    torch.nn.init.constant_(model[0].weight, 0.5)
    expected = hashlib.sha256(f"0.weight(3, 2){3.0:.10e}".encode()).hexdigest()[:16]
    assert lora.base_fingerprint(model) == expected
    renamed = torch.nn.Sequential(torch.nn.Identity(), model[0])
    assert lora.base_fingerprint(renamed) != expected


def test_gradient_reaches_only_the_selected_adapter(tiny_model):
    model = adapted(tiny_model, adapters=2)
    with lora.selecting(model, 1):
        model(input_ids=IDS).logits.sum().backward()
    grads = {k: [p.grad for p in lora.adapter_parameters(model, k)] for k in (0, 1)}
    assert all(g is None for g in grads[0])
    assert all(g is not None and g.abs().sum() > 0 for g in grads[1])


# --------------------------------------------------------------------------------------------------
# teams: --models, each agent's calls to its model and adapter


def team_game(cfg_models, agents=3, **extra):
    """eval.py's config for a tiny arith game with --models (or --model)."""
    import eval as E

    return E.Config(
        task="arith",
        agents=agents,
        rounds=1,
        max_new_tokens=8,
        cache_dir="",
        dtype="float32",
        **cfg_models,
        **extra,
    )


def play_debate(engine, cfg, n=3):
    import data
    import eval as E

    examples = data.load_task("arith", split="test", n=n, seed=0)
    return E.run_protocol(engine, examples, "debate", cfg)


def test_a_team_of_one_base_plays_the_homogeneous_game_bit_for_bit(tiny_model_dir):
    from llm.team import make_engine

    alone = play_debate(make_engine(team_game({"model": tiny_model_dir}), 3, 0), team_game({}))
    cfg = team_game({"models": ",".join([tiny_model_dir] * 3)})
    team = make_engine(cfg, 3, 0)
    assert len(team.engines()) == 1  # agents on one base share its engine
    assert play_debate(team, cfg) == alone


def test_a_team_routes_each_agent_to_its_model_and_adapter(tiny_model, tiny_model_dir, tmp_path):
    """Agent 0: the tiny model + adapter a0; agent 1: the tiny model as it is; agent 2: another
    model. Each agent's round-0 text is what its own model and adapter write alone."""
    import data
    import eval as E
    import solutions
    from llm.team import make_engine

    torch.save(lora.adapter_state(adapted(tiny_model, adapters=1), 0, "tiny"), tmp_path / "a0.pt")
    other = copy.deepcopy(tiny_model[0])
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    other.save_pretrained(tmp_path / "other")
    tiny_model[1].save_pretrained(tmp_path / "other")
    models = f"{tiny_model_dir}+{tmp_path / 'a0.pt'},{tiny_model_dir},{tmp_path / 'other'}"
    cfg = team_game({"models": models})
    team = make_engine(cfg, 3, 0)
    assert len(team.engines()) == 2 and [m.adapter for m in team.members] == [0, None, None]
    game = cfg
    examples = data.load_task("arith", split="test", n=2, seed=0)
    results = E.run_protocol(team, examples, "debate", game)
    alone = [  # (engine, adapter), each a fresh engine on its own
        (Engine(model=team.members[0].engine.model, tokenizer=tiny_model[1]), 0),
        (Engine(model=tiny_model[0], tokenizer=tiny_model[1]), None),
        (Engine(model=other, tokenizer=tiny_model[1]), None),
    ]
    for ex, result in zip(examples, results):
        for i, text in enumerate(result["rounds"][0]["texts"]):
            (_, prompt, seed, _) = solutions.solve_calls([ex], game)[i]
            engine, adapter = alone[i]
            want = engine.generate(
                [engine.chat(prompt)], [seed], 8, game.temperature, adapters=[adapter]
            )[0]
            assert text == want.text, (ex.id, i)
    texts = [result["rounds"][0]["texts"] for result in results]
    assert any(len(set(t)) == 3 for t in texts)  # the three agents write differently


def test_eval_models_refuses_an_adapter_for_another_base(tiny_model, tiny_model_dir, tmp_path):
    state = lora.adapter_state(adapted(tiny_model, adapters=1), 0, "tiny")
    state["base_fingerprint"] = "0123456789abcdef"
    torch.save(state, tmp_path / "elsewhere.pt")
    models = f"{tiny_model_dir},{tiny_model_dir}+{tmp_path / 'elsewhere.pt'}"
    done = run(
        [
            ROOT / "eval.py",
            "--models",
            models,
            "--agents",
            "2",
            "--n",
            "1",
            "--protocols",
            "vanilla",
            "--cache-dir",
            "",
        ],
        tmp_path,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert str(tmp_path / "elsewhere.pt") in line and "another base model" in line


def test_each_adapter_gets_the_gradient_of_its_own_objective(tiny_model):
    """--separate-agents on adapters: policy_step gives adapter e the gradient of agent e's loss
    over its own sequences, as whole separate models get (test_llm_losses), here summed on one
    model."""
    from handmade import magrpo_step

    import train_magrpo
    from llm.logprobs import completion_batch, completion_logprobs
    from llm_step import Sequence

    model = adapted(tiny_model, adapters=2)
    pad = tiny_model[1].pad_token_id
    g = torch.Generator().manual_seed(45)
    sequences = [
        Sequence(
            q,
            k,
            a,
            [5 + q, 6, 7 + a],
            torch.randint(10, 200, (1 + 2 * a + q + k,), generator=g).tolist(),
        )
        for q in range(2)
        for k in range(2)
        for a in range(2)
    ]
    advantages = torch.tensor([[0.02, -0.01], [-0.03, 0.01]])
    cfg = train_magrpo.Config(agents=2, separate_agents=True, micro_batch=3)
    learners = [lora.adapter_parameters(model, e) for e in (0, 1)]

    class Capture:  # the optimizer: keeps the clipped gradients
        def step(self):
            self.grads = [[p.grad.clone() for p in learner] for learner in learners]

        def zero_grad(self, set_to_none=True):
            model.zero_grad(set_to_none=set_to_none)

    optimizer = Capture()
    update = magrpo_step([model], optimizer, sequences, advantages, cfg, pad)
    assert update["grad_norm"] < 1.0  # no clipping: the comparison is exact
    for e in (0, 1):
        own = [s for s in sequences if s.agent == e]
        batch = completion_batch([(s.prompt_ids, s.completion_ids) for s in own], pad, "cpu")
        with lora.selecting(model, e):
            logp, mask = completion_logprobs(model, batch)
        A = advantages[[s.question for s in own], [s.sample for s in own]]
        loss = (-A * torch.where(mask.bool(), logp, 0).sum(-1)).sum() / len(own)  # MAGRPO's sum
        expected = torch.autograd.grad(loss, lora.adapter_parameters(model, e))
        for ours, want in zip(optimizer.grads[e], expected):
            torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-7)


def test_a_leader_with_an_adapter_leads_as_the_merged_model(tiny_model, tiny_model_dir, tmp_path):
    """eval.py's leader=BASE+ADAPTER: the leader's answers are those of the model with the adapter
    folded in (greedy), not the base's."""
    import eval as E

    model = adapted(tiny_model, adapters=1)
    torch.save(lora.adapter_state(model, 0, "tiny"), tmp_path / "lead.pt")
    lora.merged_copy(model, 0).save_pretrained(tmp_path / "merged")
    tiny_model[1].save_pretrained(tmp_path / "merged")
    specs = [f"{tiny_model_dir}+{tmp_path / 'lead.pt'}", str(tmp_path / "merged"), tiny_model_dir]
    cfg = E.Config(
        task="arith",
        n=3,
        agents=2,
        rounds=0,
        max_new_tokens=8,
        cache_dir="",
        dtype="float32",
        model=tiny_model_dir,
        protocols=",".join(f"leader={s}" for s in specs),
        out=str(tmp_path / "out.json"),
    )
    E.check(cfg)
    E.main(cfg)
    details = json.loads((tmp_path / "out.json").read_text())["details"]
    texts = [[r["texts"] for r in details[f"leader={s}"]] for s in specs]
    assert texts[0] == texts[1] and texts[0] != texts[2]


def test_gradient_checkpointing_gives_adapters_the_same_gradient(tiny_model):
    """--gradient-checkpointing recomputes activations; with the base frozen (no input needs a
    gradient) the adapters must still get their gradient, the same one."""
    from llm import training

    grads = []
    for checkpointing in (False, True):
        model = adapted(tiny_model, adapters=1).train()
        if checkpointing:
            model.activation_checkpointing_enable(training.GRADIENT_CHECKPOINTING)
        with lora.selecting(model, 0):
            model(input_ids=IDS).logits.logsumexp(-1).sum().backward()
        grads.append([p.grad for p in lora.adapter_parameters(model, 0)])
    assert all(g is not None for g in grads[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_sft_and_train_rl_train_a_policy_for_a_team_of_adapters(
    tiny_model, tiny_model_dir, tmp_path
):
    """Stage 1 and stage 2 with --models (the base alone, the base + an adapter): both run the
    team's games and record the team in their summaries."""
    torch.save(lora.adapter_state(adapted(tiny_model, adapters=1), 0, "tiny"), tmp_path / "a0.pt")
    models = f"{tiny_model_dir},{tiny_model_dir}+{tmp_path / 'a0.pt'}"
    game = [
        "--models",
        models,
        "--agents",
        "2",
        "--rounds",
        "1",
        "--questions",
        "4",
        "--val-n",
        "2",
        "--max-new-tokens",
        "6",
        "--epochs",
        "1",
        "--cache-dir",
        "",
    ]
    for script, extra in (("sft.py", []), ("train_rl.py", ["--init", "sft/policy.safetensors"])):
        out = script.removesuffix(".py").replace("train_", "")
        run([ROOT / script, *game, *extra, "--out-dir", out], tmp_path)
        assert json.loads((tmp_path / out / "summary.json").read_text())["team"] == models


def test_training_can_start_from_an_adapter_file(tiny_model, tiny_model_dir, tmp_path):
    """--init-adapter (train_magrpo.py, train_mlpo.py, train_solver.py): every trained adapter
    starts as a copy of the file's (not zero), trainable, the base frozen, named as unsaved weights
    (the copies will differ once trained); a file of another rank or alpha, or for another base, is
    refused in one line."""
    from types import SimpleNamespace

    import train_magrpo
    from common import FileRefused, UsageError
    from llm import training

    path = tmp_path / "a.pt"
    torch.save(lora.adapter_state(adapted(tiny_model, adapters=1), 0, "tiny"), path)
    saved = load_file(path, "adapter")["tensors"]
    cfg = SimpleNamespace(
        model=tiny_model_dir,
        engine_batch_size=8,
        lora_rank=4,
        lora_alpha=8.0,
        seed=0,
        train_dtype="float32",
        fsdp=False,
        init_adapter=str(path),
    )
    models, team = training.trained_team(cfg, 3, "cpu")
    model = models[0]
    assert lora.n_adapters(model) == 3 and model.lora["names"] == [
        "unsaved0",
        "unsaved1",
        "unsaved2",
    ]
    for k in range(3):
        state = lora.adapter_state(model, k, "tiny")["tensors"]
        assert state.keys() == saved.keys()
        assert all(torch.equal(state[name], saved[name]) for name in saved)
        assert all(p.requires_grad for p in lora.adapter_parameters(model, k))
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".lora_" not in n)
    # the copies are the file's adapter: the model with adapter k gives the file's logits
    reference = adapted(tiny_model, adapters=1)
    torch.testing.assert_close(logits(model, IDS, 1), logits(reference, IDS, 0))
    assert not torch.allclose(logits(model, IDS, 1), logits(tiny_model[0], IDS), atol=1e-2)
    # refused: another rank / alpha (before any model loads), another base (when it loads)
    config = train_magrpo.Config(init_adapter=str(path), lora_rank=8, lora_alpha=8.0)
    with pytest.raises(UsageError, match="--init-adapter .*rank 4, alpha 8 there, --lora-rank 8"):
        train_magrpo.check(config, 1)
    with pytest.raises(UsageError, match="--init-adapter: adapters train with"):
        train_magrpo.check(train_magrpo.Config(init_adapter=str(path), lora_rank=0), 1)
    other = copy.deepcopy(tiny_model[0])
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    foreign = tmp_path / "foreign.pt"
    torch.save(lora.adapter_state(lora.add_lora(other, 4, 8.0, adapters=1), 0, "x"), foreign)
    with pytest.raises(FileRefused, match="foreign.pt: an adapter for another base model"):
        training.trained_team(
            SimpleNamespace(**{**vars(cfg), "init_adapter": str(foreign)}), 3, "cpu"
        )


@pytest.fixture(scope="module")
def default_base(default_model_dir):
    from llm.backbone import load_model

    return load_model(default_model_dir)[0]


COMMITTED = Path(__file__).resolve().parents[2] / "results" / "agents"
# a team's run is a folder of agent<i> adapter folders
ADAPTERS = sorted(
    agent
    for entry in COMMITTED.iterdir()
    for agent in (
        [entry]
        if not entry.is_dir() or (entry / "adapter_config.json").exists()
        else entry.iterdir()
    )
)


@pytest.mark.parametrize(
    "path", ADAPTERS, ids=lambda path: str(path.relative_to(COMMITTED)).replace("/", ":")
)
def test_every_committed_adapter_loads(path, default_base):
    """Each adapter in results/agents/ (a PEFT folder, a team run's agent<i> folder, or an older
    .pt file) is read as plain data and fits the default backbone it was trained on; loaded, it
    changes the model's output (its B is not all zero). Each weight is committed once: no .pt
    beside a folder converted from it."""
    state = read_adapter(path)
    if path.is_dir():
        assert not path.with_suffix(".pt").exists()
    model = copy.deepcopy(default_base)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        plain = model(ids).logits
        k = lora.load_adapter(model, state)
        with lora.selecting(model, k):
            adapted_logits = model(ids).logits
    assert k == 0 and not torch.equal(plain, adapted_logits)


OLD_ADAPTER = Path(__file__).resolve().parents[1] / "fixtures" / "old-adapter.pt"


def test_an_old_adapter_file_converts_to_a_peft_folder_of_the_same_weights(tmp_path, capsys):
    """`python -m llm.lora OLD.pt FOLDER` on an adapter file of the project's older layout (the
    fixture: lora.adapter_state of a random 1-layer Llama, rank 2, saved with torch.save): the
    folder holds the same tensors and settings, and names the file it was converted from."""
    old = read_adapter(OLD_ADAPTER)
    lora.main([str(OLD_ADAPTER), str(tmp_path / "adapter")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "adapter")
    state = read_adapter(tmp_path / "adapter")
    assert old["tensors"].keys() == state["tensors"].keys() and len(old["tensors"]) == 14
    assert all(torch.equal(old["tensors"][k], t) for k, t in state["tensors"].items())
    same = ("rank", "alpha", "base_fingerprint")
    assert [old[k] for k in same] == [state[k] for k in same] == [2, 4.0, "66a3abd3a3b91232"]
    assert sorted(old["targets"]) == state["targets"]
    extras = json.loads((tmp_path / "adapter" / lora.EXTRAS).read_text())
    assert extras["converted_from"] == "old-adapter.pt"


def test_the_conversion_command_says_what_it_does_and_refuses_what_it_cannot_convert(
    tmp_path, capsys, monkeypatch
):
    """`python -m llm.lora`'s help; a file that is not an adapter (torch's plain data, or not a
    torch file) refused in one line with exit status 2; a file of the default backbone names it
    in PEFT's config by its hub name."""
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        lora.main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.split("\n")[2:10] == [
        "an adapter file of this project's older layout (a torch file read as data) as a PEFT "
        "LoRA folder",
        "",
        "positional arguments:",
        "  old         an adapter .pt file (the LLM-weight trainers' older output)",
        "  folder      the PEFT folder to write",
        "",
        "options:",
        "  -h, --help  show this help message and exit",
    ]
    torch.save({"tensors": {}}, tmp_path / "plain.pt")
    with pytest.raises(SystemExit) as done:
        lora.main([str(tmp_path / "plain.pt"), str(tmp_path / "out")])
    assert done.value.code == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'plain.pt'}: not an adapter file\n"
    (tmp_path / "text.pt").write_text("not torch")
    with pytest.raises(FileRefused) as refused:
        lora.main([str(tmp_path / "text.pt"), str(tmp_path / "out")])
    assert str(refused.value) == (
        f"{tmp_path / 'text.pt'}: not a plain-data adapter file (Unsupported operand 110); refused"
    )
    old = torch.load(OLD_ADAPTER, weights_only=True)
    torch.save({**old, "base": "default"}, tmp_path / "default.pt")
    lora.main([str(tmp_path / "default.pt"), str(tmp_path / "default")])
    config = json.loads((tmp_path / "default" / lora.PEFT_CONFIG).read_text())
    assert config["base_model_name_or_path"] == backbone.DEFAULT_NAME
    lora.main([str(OLD_ADAPTER), str(tmp_path / "tiny")])
    assert (
        json.loads((tmp_path / "tiny" / lora.PEFT_CONFIG).read_text())["base_model_name_or_path"]
        == "tiny"
    )


def test_add_lora_settings_names_and_initial_adapters(tiny_model):
    """add_lora: rank 1 is allowed and 0 refused in one line; the adapters are named unsaved<k>;
    a fresh A is drawn uniform in +-1/sqrt(in) in the base's dtype (seed 0 by default), B zero;
    the base's fingerprint (16 hex digits) ignores the LoRA wrapping and its adapters."""
    plain = copy.deepcopy(tiny_model[0])
    with pytest.raises(ValueError) as refused:
        lora.add_lora(copy.deepcopy(plain), 0, alpha=8)
    assert str(refused.value) == "LoRA rank must be at least 1, got 0"
    model = lora.add_lora(copy.deepcopy(plain), 1, alpha=8, adapters=2)
    assert model.lora["names"] == ["unsaved0", "unsaved1"] and model.lora["rank"] == 1
    seeded = lora.add_lora(copy.deepcopy(plain), 1, alpha=8, adapters=2, seed=0)
    for (name, layer), other in zip(
        lora.lora_layers(model).items(), lora.lora_layers(seeded).values()
    ):
        a, bound = layer.lora_A[0], 1 / layer.base.in_features**0.5
        assert torch.equal(a, other.lora_A[0]), name
        assert a.abs().max() <= bound and a.min() < -bound / 4 and a.max() > bound / 4, name
        assert not layer.lora_B[0].any()
    assert lora.base_fingerprint(model) == lora.base_fingerprint(plain)
    assert len(lora.base_fingerprint(plain)) == 16

    class NoLinear(torch.nn.Module):
        def get_output_embeddings(self):
            return None

    with pytest.raises(ValueError) as refused:
        lora.add_lora(NoLinear(), 1, alpha=8)
    assert str(refused.value) == "NoLinear: no nn.Linear layers to adapt"
    # a bfloat16 base gets bfloat16 adapters
    half = lora.add_lora(copy.deepcopy(plain).to(torch.bfloat16), 2, alpha=8, adapters=1)
    assert {p.dtype for p in lora.adapter_parameters(half, 0)} == {torch.bfloat16}


def test_the_stacked_cache_notices_a_replaced_parameter(tiny_model):
    """A parameter replaced by a new one (not changed in place) rebuilds the stacked A and B; while
    none changes, the kept ones are not written again (the decode steps read them as they are)."""
    model = lora.add_lora(copy.deepcopy(tiny_model[0]), 4, alpha=8, adapters=2)
    layer = next(iter(lora.lora_layers(model).values()))
    with torch.no_grad():
        assert not layer.stacked()[1].any()
        kept = layer.stacked()
        written = [t._version for t in kept]
        assert [t._version for t in layer.stacked()] == written
        layer.lora_B[0] = torch.nn.Parameter(torch.ones_like(layer.lora_B[0]))
        assert torch.equal(layer.stacked()[1][:, :4], torch.ones_like(layer.lora_B[0]))


def test_a_team_of_mixed_ranks_loads_the_highest_first_whatever_the_agents_order(
    tiny_model, tiny_model_dir, tmp_path
):
    """--models with the lower-rank adapter first: the engine is wrapped at the highest rank, and
    each agent's logits are its own adapter's alone. What is no adapter ranks 0."""
    from llm.team import adapter_rank, make_engine, read_adapter

    files = []
    for rank, seed in ((1, 2), (3, 4)):
        files.append(tmp_path / f"r{rank}.pt")
        torch.save(
            lora.adapter_state(adapted(tiny_model, 1, rank=rank, seed=seed), 0, "t"), files[-1]
        )
    team = make_engine(
        team_game({"models": ",".join(f"{tiny_model_dir}+{f}" for f in files)}, 2), 2, 0
    )
    model = team.first.model
    assert model.lora["rank"] == 3 and [m.adapter for m in team.members] == [1, 0]
    ids = torch.tensor([[3, 8, 1, 40, 7]])
    for member, path in zip(team.members, files):
        alone = copy.deepcopy(tiny_model[0])
        lora.load_adapter(alone, read_adapter(str(path)))
        with torch.no_grad(), lora.selecting(model, member.adapter), lora.selecting(alone, 0):
            assert torch.allclose(
                model(input_ids=ids).logits, alone(input_ids=ids).logits, atol=1e-6
            )
    assert [adapter_rank(s) for s in ({"rank": 8}, {"format": "x"}, [1, 2], None)] == [8, 0, 0, 0]
