"""Trained adapters in PEFT's LoRA layout (llm/lora.py write_peft, read_peft): what this project
writes, PEFT loads to the same logits as the engine; what PEFT writes, the engine loads to the same
logits as PEFT; a folder that does not fit is refused in one line, and nothing in one runs code."""

import hashlib
import json
import pickle
import shutil

import pytest
import safetensors.torch
import torch
from launch import run
from peft import LoraConfig, PeftModel, get_peft_model
from test_train_solver import sft_args
from transformers import AutoModelForCausalLM

from common import FileRefused
from llm import lora
from llm.engine import Engine
from llm.team import read_adapter

PROMPTS = torch.tensor([[1, 5, 9, 200, 31, 7], [4, 4, 100, 2, 17, 9], [8, 3, 3, 60, 5, 11]])


def base_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def engine_logits(engine, state):
    """The engine's logits on PROMPTS with the adapter `state` (read_adapter's), and without."""
    k = lora.load_adapter(engine.model, state)
    with torch.no_grad():
        plain = engine.model(input_ids=PROMPTS).logits
        with lora.selecting(engine.model, k):
            return engine.model(input_ids=PROMPTS).logits, plain


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """An adapter train_solver.py trained for two steps on the tiny Llama (rank 2, two kinds of
    layer), as it saved it."""
    tmp_path = tmp_path_factory.mktemp("peft")
    out = tmp_path / "solver"
    flags = ["--epochs", "2", "--lora-rank", "2", "--lora-targets", "q_proj,down_proj"]
    run(sft_args(tmp_path, tiny_model_dir, *flags, "--out-dir", str(out)), tmp_path)
    return out / "adapter"


@pytest.fixture(scope="module")
def written(tmp_path_factory, tiny_model_dir):
    """The same kind of folder written in process (rank 2 on q_proj and down_proj, B not zero):
    the refusals' material, without a training run."""
    model = Engine(model_path=tiny_model_dir).model
    lora.add_lora(model, 2, 32.0, 1, 0, ["q_proj", "down_proj"])
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.05)
    folder = tmp_path_factory.mktemp("written") / "adapter"
    return lora.write_peft(lora.adapter_state(model, 0, tiny_model_dir), folder, {"agent": None})


def test_peft_loads_a_trained_adapter_to_the_engines_logits(trained, tiny_model_dir):
    assert sorted(p.name for p in trained.iterdir()) == sorted(
        [lora.PEFT_CONFIG, lora.PEFT_WEIGHTS, lora.EXTRAS]
    )
    config = json.loads((trained / lora.PEFT_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (2, 32.0, "LORA")
    assert config["target_modules"] == ["down_proj", "q_proj"]
    assert config["base_model_name_or_path"] == tiny_model_dir
    extras = json.loads((trained / lora.EXTRAS).read_text())
    assert extras["agent"] is None and extras["training"]["lora_rank"] == 2
    keys = safetensors.torch.load_file(trained / lora.PEFT_WEIGHTS).keys()
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    assert len(keys) == 2 * 2 * 2  # two layers of the model, two targets each, A and B

    ours, plain = engine_logits(Engine(model_path=tiny_model_dir), read_adapter(trained))
    peft_model = PeftModel.from_pretrained(base_model(tiny_model_dir), str(trained)).eval()
    with torch.no_grad():
        theirs = peft_model(input_ids=PROMPTS).logits
    # trained: the adapter moves the logits, and PEFT moves them to the same place
    assert (ours - plain).abs().max() > 1e-3
    assert (ours - theirs).abs().max() <= 1e-5


def test_the_engine_loads_a_peft_made_adapter_to_peft_logits(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    # a random B (init_lora_weights=False): a zero B would be the base model, nothing to compare
    settings = LoraConfig(
        r=4, lora_alpha=8, target_modules=["v_proj", "up_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base_model(tiny_model_dir), settings).eval()
    peft_model.save_pretrained(tmp_path / "made")
    with torch.no_grad():
        theirs = peft_model(input_ids=PROMPTS).logits
    state = read_adapter(tmp_path / "made")
    assert state["base_fingerprint"] is None and state["rank"] == 4
    ours, plain = engine_logits(Engine(model_path=tiny_model_dir), state)
    assert (ours - plain).abs().max() > 1e-3
    assert (ours - theirs).abs().max() <= 1e-5
    # the engine's own folder of it loads to the same logits
    lora.write_peft(state, tmp_path / "rewritten")
    again, _ = engine_logits(
        Engine(model_path=tiny_model_dir), read_adapter(tmp_path / "rewritten")
    )
    assert torch.equal(again, ours)


def edited(folder, tmp_path, name, config=None, tensors=None):
    """A copy of the PEFT folder with its config and tensors changed by the functions given."""
    copy = tmp_path / name
    copy.mkdir()
    settings = json.loads((folder / lora.PEFT_CONFIG).read_text())
    weights = safetensors.torch.load_file(folder / lora.PEFT_WEIGHTS)
    (copy / lora.PEFT_CONFIG).write_text(json.dumps(config(settings) if config else settings))
    safetensors.torch.save_file(tensors(weights) if tensors else weights, copy / lora.PEFT_WEIGHTS)
    return copy


def refusal(folder, model_dir):
    """The one line that reading the folder, or loading it into an engine of model_dir, says."""
    with pytest.raises((FileRefused, lora.AdapterMismatch)) as refused:
        lora.load_adapter(Engine(model_path=model_dir).model, read_adapter(folder))
    said = str(refused.value)
    assert "\n" not in said
    return said


def test_a_folder_that_does_not_fit_is_refused_in_one_line(written, tiny_model_dir, tmp_path):
    without = {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"}
    a_layer = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    cases = {
        "rank": (dict(config=lambda c: {**c, "r": 3}), "not of rank 3 (its config's)"),
        "targets": (
            dict(config=lambda c: {**c, "target_modules": ["w_proj"]}),
            "its target_modules ['w_proj'] are 0 layers of this model, its tensors adapt 4",
        ),
        "extra": (
            dict(tensors=lambda t: {**t, "planted": torch.ones(1)}),
            "a tensor LoRA has not: planted",
        ),
        "unpaired": (
            dict(tensors=lambda t: {k: v for k, v in t.items() if k not in without}),
            "model.layers.0.self_attn.q_proj.B is missing (LoRA needs both A and B)",
        ),
        "layer": (
            dict(tensors=lambda t: {k: v for k, v in t.items() if not k.startswith(a_layer[:-15])}),
            "are 4 layers of this model, its tensors adapt 3 "
            "(model.layers.0.self_attn.q_proj in one, not the other)",
        ),
        "dora": (dict(config=lambda c: {**c, "use_dora": True}), "not a plain LoRA adapter"),
        "shape": (
            dict(tensors=lambda t: {**t, a_layer.format("A"): torch.ones(2, 5)}),
            "model.layers.0.self_attn.q_proj.A should be (2, 64), the file has (2, 5)",
        ),
    }
    for name, (edits, says) in cases.items():
        assert says in refusal(edited(written, tmp_path, name, **edits), tiny_model_dir), name
    (tmp_path / "empty").mkdir()
    assert "not a PEFT LoRA folder" in refusal(tmp_path / "empty", tiny_model_dir)


def test_a_folder_for_another_base_model_is_refused(written, tiny_model_dir, tmp_path):
    """By the fingerprint of the base's weights where the folder has this project's extras, by the
    base model's name in its config where it has not (a folder PEFT made)."""
    shutil.copytree(tiny_model_dir, tmp_path / "other-model")
    other = base_model(tiny_model_dir)
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    other.save_pretrained(tmp_path / "other-model")
    assert "an adapter for another base model" in refusal(written, tmp_path / "other-model")
    renamed = edited(
        written, tmp_path, "renamed", config=lambda c: {**c, "base_model_name_or_path": "gpt2"}
    )
    said = refusal(renamed, tiny_model_dir)
    assert f"an adapter for another base model ('gpt2' there, '{tiny_model_dir}' here)" in said


def test_nothing_in_a_crafted_folder_runs_code(written, tiny_model_dir, tmp_path):
    """The folder is read as JSON and safetensors: a pickle in place of the weights is refused, and
    what it would run does not run."""
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    crafted = edited(written, tmp_path, "crafted")
    (crafted / lora.PEFT_WEIGHTS).write_bytes(pickle.dumps({"x": Payload()}))
    assert "not a PEFT LoRA folder" in refusal(crafted, tiny_model_dir)
    assert not marker.exists()


def test_peft_targets_name_each_kind_of_layer_adapted_everywhere_else_every_module():
    """target_modules as PEFT reads them: the last names where each kind is adapted in every layer
    (a model without numbered layers has one of each), else the full names."""
    every = [f"model.layers.{i}.self_attn.{k}" for i in (0, 1) for k in ("v_proj", "q_proj")]
    assert lora.peft_targets(every) == ["q_proj", "v_proj"]
    assert lora.peft_targets(every[:3]) == sorted(every[:3])
    # two kinds of one last name in each layer: its last name alone would not tell them apart
    twice = [f"model.layers.{i}.{p}.q_proj" for i in (0, 1) for p in ("self_attn", "cross_attn")]
    assert lora.peft_targets(twice) == sorted(twice)
    assert lora.peft_targets(["lm_head"]) == ["lm_head"]
    assert lora.peft_targets(["transformer.head"]) == ["head"]
    assert lora.peft_targets(["model.head.proj", "model.tail.proj"]) == [
        "model.head.proj",
        "model.tail.proj",
    ]
    name = "model.layers.0.self_attn.q_proj"
    assert lora.peft_matches(name, r"model\.layers\.\d+\.self_attn\.(q|k)_proj")
    assert not lora.peft_matches(name, r"self_attn\.q_proj")
    assert lora.peft_matches(name, ["v_proj", "q_proj"]) and lora.peft_matches(name, [name])
    assert not lora.peft_matches(name, ["_proj", "attn.q"])


GOLDEN_CONFIG = "65049b5f8084e69994df900cd706fb929d7296e6c12693d5ae5c98aa818fb462"


def test_write_peft_writes_peft_s_own_config_and_tensor_names(written, tmp_path):
    """The folder as PEFT writes one: adapter_config.json's settings, the tensors under PEFT's
    names with safetensors' torch metadata, this project's extras beside them; into a new folder
    and over an old one."""
    state = read_adapter(written)
    folder = lora.write_peft(state, tmp_path / "new" / "adapter", {"agent": 1})
    again = lora.write_peft(state, folder)
    assert folder == again == tmp_path / "new" / "adapter"
    config = (folder / lora.PEFT_CONFIG).read_text()
    settings = json.loads(config)
    assert settings["target_modules"] == ["down_proj", "q_proj"] and settings["r"] == 2
    assert settings["base_model_name_or_path"] == state["base"] and settings["lora_alpha"] == 32.0
    # the whole file byte for byte, its base's path aside: PEFT's plain-LoRA settings (peft_type
    # LORA, task_type CAUSAL_LM, no dropout, bias none, fan_in_fan_out off, inference_mode on, no
    # rsLoRA, no DoRA, no modules_to_save), one per line as json.dumps(indent=1) writes them
    text = config.replace(json.dumps(state["base"]), '"BASE"')
    assert hashlib.sha256(text.encode()).hexdigest() == GOLDEN_CONFIG
    extras = {"format": lora.FORMAT, "base_fingerprint": state["base_fingerprint"]}
    assert (folder / lora.EXTRAS).read_text() == json.dumps(extras, indent=1) + "\n"
    lora.write_peft(state, folder, {"agent": 1})
    assert json.loads((folder / lora.EXTRAS).read_text()) == extras | {"agent": 1}
    with safetensors.safe_open(folder / lora.PEFT_WEIGHTS, "pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert sorted(f.keys()) == sorted(
            f"base_model.model.{key[:-2]}.lora_{key[-1]}.weight" for key in state["tensors"]
        )


def test_read_peft_takes_plain_lora_only_and_defaults_what_a_config_leaves_out(written, tmp_path):
    """A config that leaves out PEFT's defaults (type, bias, DoRA, rsLoRA, base) reads as plain
    LoRA of no named base; each other kind is refused naming the setting; a tensor of another rank
    names its size."""
    defaults = ("peft_type", "bias", "use_dora", "use_rslora", "base_model_name_or_path")
    bare = edited(
        written,
        tmp_path,
        "bare",
        config=lambda c: {k: v for k, v in c.items() if k not in defaults},
    )
    state = lora.read_peft(bare)
    assert state["base"] == "" and state["rank"] == 2 and state["alpha"] == 32.0
    assert state["target_modules"] == ["down_proj", "q_proj"]
    for key, value in (
        ("peft_type", "PREFIX_TUNING"),
        ("bias", "all"),
        ("use_dora", True),
        ("use_rslora", True),
        ("modules_to_save", ["lm_head"]),
    ):
        odd = edited(written, tmp_path, key, config=lambda c: {**c, key: value})
        with pytest.raises(lora.AdapterMismatch) as refused:
            lora.read_peft(odd)
        assert str(refused.value) == f"{odd}: not a plain LoRA adapter ({key}: {value})"
    rank3 = edited(written, tmp_path, "rank3", config=lambda c: {**c, "r": 3})
    with pytest.raises(lora.AdapterMismatch) as refused:
        lora.read_peft(rank3)
    first = sorted(safetensors.torch.load_file(rank3 / lora.PEFT_WEIGHTS))[0]
    assert str(refused.value).startswith(f"{rank3}: {first} is (")
    assert str(refused.value).endswith("), not of rank 3 (its config's)")


def test_a_regex_target_modules_names_the_layers_not_their_wrapped_base(written, tiny_model_dir):
    """A folder whose target_modules is a regex (PEFT's other form) that also matches what follows
    a layer's name loads: the engine's LoRA wrapper keeps the layer's weights in `<name>.base`,
    which no folder adapts."""
    engine = Engine(model_path=tiny_model_dir)
    state = dict(read_adapter(written), target_modules=r".*\.(q_proj|down_proj).*")
    lora.add_lora(engine.model, 2, 32.0, 1, 0, ["q_proj", "down_proj"])
    assert lora.load_adapter(engine.model, state) == 1
