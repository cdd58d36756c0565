"""The engine and train_llm.py at the scale users run, on one GPU (issue 56): a randomly initialised
Llama of about 1.1B parameters (TinyLlama-1.1B's shapes over the default tokenizer), in bf16. No
weights travel: the model is drawn on the device and saved to a temporary directory.

    python experiments/cuda_scale.py --tokenizer DIR --out results/cuda/scale-h100.json
    python experiments/cuda_scale.py --size tiny --device cpu --out /tmp/scale.json  # a try on CPU

  1. engine-vs-hf  the 64 fixed deliberation prompts of `experiments/bench.py --bench generate`,
                   128 new tokens, greedy, bf16, all in one batch: tokens/s of HF generate and of
                   the engine (each its fastest of 2 alternating turns, after a warm-up), the rows
                   identical to HF's and, for the others, the first position where they differ (a
                   random model's logits are close to ties, which bf16 kernels break differently)
  2. train_llm     two `train_llm.py --target agents` steps (debate, 2 agents, 1 round, one LoRA
                   adapter per agent, bf16 rollouts, a KL term so that every sequence trains):
                   each step's time, its rollouts' time and the peak GPU memory
                   (torch.cuda.max_memory_allocated, from metrics.jsonl)

--tokenizer: a directory with the default backbone's tokenizer files (tokenizer.json,
tokenizer_config.json, chat_template.jinja from the converted model, ~/.cache/mpdf/
smollm2-135m-instruct); default: that directory, where it exists. On a GPU machine that reaches no
network, copy those files into an ignored folder of the checkout and carry it.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from bench_common import deliberation_prompts, hf_generate  # noqa: E402

import data  # noqa: E402
from common import machine  # noqa: E402
from llm.backbone import CACHE_ROOT  # noqa: E402
from llm.engine import Engine  # noqa: E402

SIZES = {
    # TinyLlama-1.1B's shapes: 22 layers, hidden 2048, 32 query and 4 KV heads
    "1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, intermediate_size=5632),
    # tests/conftest.py's tiny Llama
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128),
}  # fmt: skip


def random_llama(size, tokenizer_dir, device, out):
    """A random LlamaForCausalLM of `size` over the tokenizer's vocabulary, drawn on `device` and
    saved in bf16 with the tokenizer as an HF directory; returns its parameter count."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=2048, tie_word_embeddings=False, **SIZES[size],
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def first_difference(a, b):
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def engine_vs_hf(model_dir, device, rows, new_tokens, repeats=2):
    engine = Engine(model_path=model_dir, dtype="bfloat16", device=device, batch_size=rows)
    examples = data.load_task("arith", split="test", n=rows, seed=0)
    prompts = deliberation_prompts(engine, examples)
    ids = [engine.encode(p) for p in prompts]
    sides = {
        "hf": lambda n: hf_generate(engine.model, engine.tokenizer, prompts[:n], new_tokens,
                                    engine.eos_ids, rows),
        "engine": lambda n: [s.tokens for s in engine.sample(ids[:n], [0] * n, new_tokens, 0,
                                                              keep_eos=True)],
    }  # fmt: skip
    with torch.inference_mode():
        for run in sides.values():  # warm-up: first-call allocations and kernel choices
            run(2)
    turns, tokens = {side: [] for side in sides}, {}
    for _ in range(repeats):
        for side, run in sides.items():
            start = time.perf_counter()
            with torch.inference_mode():
                tokens[side] = run(rows)
            turns[side].append(sum(map(len, tokens[side])) / (time.perf_counter() - start))
    differing = [first_difference(a, b) for a, b in zip(tokens["engine"], tokens["hf"]) if a != b]
    result = {
        "rows": rows,
        "new_tokens": new_tokens,
        "prompt_tokens": sum(map(len, ids)),
        "generated_tokens": sum(map(len, tokens["engine"])),
        "tok_s": {side: max(t) for side, t in turns.items()},
        "all_tok_s": {side: [round(x, 1) for x in t] for side, t in turns.items()},
        "identical_rows": rows - len(differing),
        "first_difference_at": sorted(differing),
    }
    result["ratio"] = result["tok_s"]["engine"] / result["tok_s"]["hf"]
    return result


def train_steps(model_dir, work, new_tokens):
    """Two train_llm.py --target agents steps in a process of their own: its metrics.jsonl. A KL
    term (--beta) makes every sequence train: a random model's rewards are all 0, and a flat group's
    sequences are otherwise skipped."""
    out = Path(work) / "agents"
    args = ["--target", "agents", "--model", model_dir, "--dtype", "bfloat16", "--protocol",
            "debate", "--agents", "2", "--rounds", "1", "--separate-agents", "--questions-per-step",
            "2", "--group", "2", "--max-new-tokens", str(new_tokens), "--micro-batch", "4",
            "--val-n", "4", "--steps", "2", "--beta", "0.04",
            "--cache-dir", str(Path(work) / "cache"),
            "--out-dir", str(out)]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "train_llm.py"), *args], cwd=work,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    result = {"returncode": proc.returncode, "seconds": time.perf_counter() - start}
    if proc.returncode:
        result["stderr_tail"] = proc.stderr[-2000:]
        return result
    lines = (out / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, filter(None, lines)) if "step_s" in r]
    keys = ("step", "step_s", "rollout_s", "peak_memory_mb", "tokens", "trained_sequences", "loss")
    result["steps"] = [{k: r.get(k) for k in keys} for r in steps]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="1b", choices=SIZES)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tokenizer", default="", help="the default tokenizer's directory")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--train-tokens", type=int, default=64, help="train_llm's token budget")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("cuda_scale.py: no CUDA device here (--device cpu tries it on the CPU)")
    tokenizer = Path(args.tokenizer or CACHE_ROOT / "smollm2-135m-instruct")
    if not (tokenizer / "tokenizer.json").is_file():
        sys.exit(f"cuda_scale.py: no tokenizer.json in {tokenizer}: pass --tokenizer DIR")
    import transformers

    report = {"machine": machine(), "torch": torch.__version__,
              "transformers": transformers.__version__, "size": args.size}  # fmt: skip
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        model_dir = str(Path(work) / "model")
        report["parameters"] = random_llama(args.size, tokenizer, args.device, model_dir)
        report["model_config"] = SIZES[args.size]
        print("model", report["parameters"], "parameters", flush=True)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        report["engine_vs_hf"] = engine_vs_hf(model_dir, args.device, args.rows, args.new_tokens)
        if args.device == "cuda":
            report["engine_vs_hf"]["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
        print("engine_vs_hf", json.dumps(report["engine_vs_hf"]), flush=True)
        # the training process gets the GPU's memory to itself
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        report["train_llm_agents"] = train_steps(model_dir, work, args.train_tokens)
        print("train_llm_agents", json.dumps(report["train_llm_agents"]), flush=True)
    report["seconds"] = time.perf_counter() - began
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
