"""Whole-weight training sharded with FSDP2 on a GPU: two optimizer steps of each LLM-weight
trainer (train_magrpo.py, train_mlpo.py, train_solver.py, each with --lora-rank 0 --fsdp
--train-dtype bfloat16, under torchrun) on random models of two of the papers' shapes made on the
device (a Llama of Llama-3.2-1B's shapes, a Qwen2 of Qwen2.5-1.5B's), each run's peak CUDA memory
set against the plan's memory per GPU for that config (experiments/scale_plan.py).

One GPU holds one NCCL rank, so the shards here span a world of one: what this measures is the route
on CUDA (fully_shard over NCCL, the rollouts decoded from whole bf16 copies refreshed from the
shards, the whole model saved by rank 0) and the memory against the plan's one-GPU figure; the
halving at two ranks is measured on CPU (tests/test_fsdp.py). Both models take the default
tokenizer's vocabulary (49,152 rows; Qwen2.5's own has 151,936), so the plan is computed for the
config actually trained. The plan counts the trained weights' state and the bf16 rollout copy; the
measured peaks add activations, the KV cache and, for MLPO, the frozen peers.

    python -m experiments.fsdp_gpu --tokenizer DIR --out results/cuda/fsdp-h200.json
    python -m experiments.fsdp_gpu --tokenizer DIR --out /tmp/fsdp.json --size tiny --device cpu
    python -m experiments.fsdp_gpu --table results/cuda/fsdp-h200-*.json
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from common import machine
from experiments.scale_plan import GB, SHAPES, plan

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    # Llama-3.2-1B: 16 layers, hidden 2048, 32 heads over 8 KV heads, MLP 8192
    "llama-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
    ),
    "qwen2.5-1.5b": {k: v for k, v in SHAPES["qwen2.5-1.5b"].items() if k != "vocab_size"},
}  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)  # fmt: skip
# the steps each trainer runs: small groups of short rollouts, enough for a second (warm) step
COMMON = [
    *("--lora-rank", "0", "--fsdp", "--train-dtype", "bfloat16", "--agents", "3"),
    *("--max-new-tokens", "64", "--val-n", "2", "--eval-every", "0", "--lr", "1e-5"),
]  # fmt: skip
TRAINERS = {
    "magrpo": [
        "train_magrpo.py", "--group", "4", "--questions-per-step", "4", "--steps", "2",
        "--micro-batch", "12", "--beta", "0",
    ],
    "mlpo": [
        "train_mlpo.py", "--group", "4", "--questions-per-step", "4", "--steps", "2",
        "--micro-batch", "8", "--beta", "0", "--questions", "8", "--filter-easy", "0",
    ],
    "solver": [
        "train_solver.py", "--questions", "8", "--batch-size", "4", "--epochs", "1",
        "--micro-batch", "4",
    ],
}  # fmt: skip


def random_model(name, tokenizer, size, device, folder):
    """A random model of `name`'s shapes (seed 0) over the tokenizer, made on `device` in fp32 and
    saved with the tokenizer as an HF directory; returns its config.json's path."""
    shape = dict(MODELS[name], **(TINY if size == "tiny" else {}))
    config = AutoConfig.for_model(
        shape.pop("model_type"), vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=2048, **shape,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return Path(folder) / "config.json"


def train(trainer, model_dir, work, device, timeout):
    """One trainer's run under a one-process torchrun: its exit, each step's seconds, loss and
    peak memory from its metrics, and the models it saved whole (its folder then goes: whole
    checkpoints of a billion parameters fill a disk)."""
    script, *flags = TRAINERS[trainer]
    out = Path(work) / f"{Path(model_dir).name}-{trainer}"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    env = dict(os.environ, **({} if device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}))
    began = time.time()
    proc = subprocess.run(
        [*launcher, str(ROOT / script), "--model", str(model_dir), *COMMON, *flags,
         "--out-dir", str(out)],
        capture_output=True, text=True, cwd=work, timeout=timeout, env=env,
    )  # fmt: skip
    result = {"returncode": proc.returncode, "wall_s": round(time.time() - began, 1)}
    if proc.returncode:
        result["stderr_tail"] = proc.stderr[-3000:]
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x]
        keys = ("step", "loss", "grad_norm", "step_s", "rollout_s", "peak_memory_mb", "tokens")
        result["steps"] = [{k: r[k] for k in keys if k in r} for r in rows if "loss" in r]
    saved = [p.name for p in out.iterdir() if (p / "config.json").is_file()] if out.is_dir() else []
    result["saved_whole"] = sorted(saved)
    shutil.rmtree(out, ignore_errors=True)
    return result


def table(files):
    """The measured runs against the plan, as a markdown table: each model's and trainer's run
    from the last file where it ran to the end (a later call reran what an earlier one failed)."""
    runs, sizes, plans = {}, {}, {}
    for path in files:
        result = json.loads(Path(path).read_text())
        for name, entry in result["models"].items():
            if "runs" not in entry:
                continue
            sizes[name] = entry["parameters"]
            plans[name] = entry["plan_gb_per_gpu"]["MAGRPO/MLPO, whole weights, FSDP2"]
            for trainer, run in entry["runs"].items():
                if run.get("returncode") == 0:
                    runs[name, trainer] = (run, Path(path).name, result["gpu"])
    lines = [
        "| model | parameters | trainer | plan: FSDP2 on 1 GPU (GB) | measured peak (GB) | "
        "measured / plan | step 2 (s) | file |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {key: k for k, key in enumerate((m, t) for m in MODELS for t in TRAINERS)}
    for (name, trainer), (run, file, gpu) in sorted(runs.items(), key=lambda x: order[x[0]]):
        last = run["steps"][-1]
        peak = max(step["peak_memory_mb"] for step in run["steps"]) * 2**20 / GB
        lines.append(
            f"| {name} | {sizes[name] / 1e9:.2f} B | {trainer} | {plans[name]:.1f} | {peak:.1f} | "
            f"{peak / plans[name]:.2f} | {last['step_s']:.1f} | {file} ({gpu}) |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="", help="the result's JSON file (a run)")
    parser.add_argument("--tokenizer", default="", help="the default tokenizer's directory")
    parser.add_argument("--table", nargs="+", default=[], help="print the table of these results")
    parser.add_argument("--size", default="full", choices=("full", "tiny"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--timeout-s", type=float, default=150, help="one trainer run's limit")
    parser.add_argument("--trainers", default=",".join(TRAINERS), help="comma-separated")
    parser.add_argument("--budget-s", type=float, default=480, help="no run starts after it")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if not (args.out and args.tokenizer):
        parser.error("a run needs --out and --tokenizer")
    trainers = args.trainers.split(",")
    if not set(trainers) <= set(TRAINERS):
        parser.error(f"--trainers: each one of {', '.join(TRAINERS)}; got {args.trainers}")
    began = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else ""
    result = {
        "machine": machine(),
        "gpu": gpu,
        "torch": torch.__version__,
        "size": args.size,
        "settings": {"common": COMMON, "trainers": TRAINERS},
        "models": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for name in MODELS:
            if time.time() - began > args.budget_s:
                result["models"][name] = {"skipped": "past --budget-s"}
                continue
            folder = Path(work) / name
            config = random_model(name, tokenizer, args.size, args.device, folder)
            total, rows = plan(str(config), 1)
            entry = {
                "parameters": total,
                "plan_gb_per_gpu": {setting: round(memory / GB, 2) for setting, memory, _ in rows},
                "runs": {},
            }
            result["models"][name] = entry
            for trainer in trainers:
                if time.time() - began > args.budget_s:
                    entry["runs"][trainer] = {"skipped": "past --budget-s"}
                    continue
                try:
                    entry["runs"][trainer] = train(
                        trainer, folder, work, args.device, args.timeout_s
                    )
                except subprocess.TimeoutExpired:
                    entry["runs"][trainer] = {"timed_out_s": args.timeout_s}
                out.write_text(json.dumps(result, indent=1) + "\n")
                print(name, trainer, json.dumps(entry["runs"][trainer])[:600], flush=True)
    result["wall_s"] = round(time.time() - began, 1)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
