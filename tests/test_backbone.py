"""Tests of backbone.py: the embedded GGUF file, its conversion, and model loading.

The converted checkpoint must be the GGUF model itself (same weights, same tokenizer, same greedy
text); the default backbone must load with the hub offline; paths and dtypes behave as documented.
Run: python -m pytest -q tests/test_backbone.py  (about 30 s, most of it load_gguf parsing the GGUF
file in a subprocess that runs while the other tests do).
"""

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

from llm import backbone
from llm.backbone import default_gguf_path, default_model_path, load_model
from llm.engine import Engine

ROOT = Path(__file__).resolve().parents[1]


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


# --------------------------------------------------------------------------------------------------
# load_model


def test_load_model_rejects_an_unknown_dtype(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"unknown dtype 'float128'.*float32"):
        load_model(tiny_model_dir, dtype="float128")
    # checked before anything is read: a missing directory still gets the dtype error
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(str(tmp_path / "nothing-here"), dtype="bogus")


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

# the GGUF side of test_converted_checkpoint_is_the_gguf_model: the prompt string comes in argv[1]
GGUF_SCRIPT = """
import hashlib, json, sys, torch
from llm import backbone
model, tokenizer = backbone.load_gguf(backbone.default_gguf_path())
ids = tokenizer(sys.argv[1], add_special_tokens=False)["input_ids"]
with torch.inference_mode():
    attention_mask = torch.ones(1, len(ids), dtype=torch.long)
    out = model.generate(torch.tensor([ids]), attention_mask=attention_mask, do_sample=False,
                         max_new_tokens=20, pad_token_id=tokenizer.eos_token_id)
tokens = out[0, len(ids):].tolist()
sha = {k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()
       for k, v in model.state_dict().items()}
print("RESULT:" + json.dumps({"dtype": str(model.dtype), "prompt_ids": ids,
                              "eos": tokenizer.eos_token_id, "tokens": tokens,
                              "text": tokenizer.decode(tokens, skip_special_tokens=True),
                              "sha256": sha}))
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
    from transformers import AutoTokenizer

    here = Path(__file__).resolve()
    selected = {
        item.name for item in request.session.items if Path(str(item.path)).resolve() == here
    }
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    scripts = {
        "test_default_backbone_loads_offline_in_a_fresh_process": [OFFLINE_SCRIPT],
        "test_converted_checkpoint_is_the_gguf_model": [
            GGUF_SCRIPT,
            gguf_prompt(AutoTokenizer.from_pretrained(default_model_dir)),
        ],
    }
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


@pytest.mark.slow
def test_converted_checkpoint_is_the_gguf_model(background, default_engine):
    """The converted checkpoint has the GGUF file's tensors bit for bit, tokenizes like the GGUF
    tokenizer and gives the same 20-token greedy completion (HF generate on both) as
    load_gguf(default_gguf_path())."""
    converted, tokenizer = default_engine.model, default_engine.tokenizer
    prompt = gguf_prompt(tokenizer)
    assert default_engine.chat(GGUF_QUESTION) == prompt
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = converted.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=20,
            pad_token_id=tokenizer.eos_token_id,
        )
    tokens = out[0, len(ids) :].tolist()
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    sha = {
        k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()
        for k, v in converted.state_dict().items()
    }

    gguf = json.loads(collect(background["test_converted_checkpoint_is_the_gguf_model"], "RESULT:"))
    assert gguf["dtype"] == str(converted.dtype) == "torch.float32"
    assert gguf["sha256"].keys() == sha.keys()
    different = [k for k in sha if sha[k] != gguf["sha256"][k]]
    assert not different, f"tensors differ from the GGUF file: {different[:5]}"
    assert gguf["prompt_ids"] == ids
    assert gguf["eos"] == tokenizer.eos_token_id
    assert gguf["tokens"] == tokens
    assert gguf["text"] == text and text.strip()


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
def probed_model_dir(tiny_model_dir, tmp_path, monkeypatch):
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
    monkeypatch.setattr(backbone, "cpuinfo", lambda field: f"another CPU's {field}")
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


def test_the_probe_takes_under_a_second_on_the_default_model(default_model_dir):
    from transformers import AutoConfig

    shapes = backbone.decode_matmuls(AutoConfig.from_pretrained(default_model_dir))
    assert [576, 49152, 1] in shapes and sum(calls for *_, calls in shapes) == 7 * 30 + 1
    threads = torch.get_num_threads()
    figures = backbone.probe_matmuls(shapes, 128)
    # CPU time: wall time also counts whatever else a shared machine runs
    assert figures["cpu_seconds"] < 1.0 and figures["shapes_measured"] == len(shapes)
    assert figures["float32_ms"] > 0 and figures["bfloat16_ms"] > 0
    assert torch.get_num_threads() == threads


def test_machine_names_the_cpu_flags_matmul_speed_depends_on(monkeypatch):
    import common

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(backbone, "cpu_flags", lambda: {"avx2", "avx512_bf16", "sse4_2"})
    assert common.machine().endswith("(avx2 avx512_bf16)")
    monkeypatch.setattr(backbone, "cpu_flags", lambda: set())
    assert common.machine().endswith("(no avx2)")
