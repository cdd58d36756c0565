"""The papers' setting planned from measured costs: memory per GPU and time per step of the
LLM-weight trainers (MAGRPO, MLPO: whole weights or LoRA adapters, DDP or FSDP2), and the time of
one deliberation round of MPDF's agents, for a model shape and a number of GPUs.

    python -m experiments.scale_plan                          # the docs/scale.md tables
    python -m experiments.scale_plan --model qwen2.5-3b --gpus 8
    python -m experiments.scale_plan --model path/to/config.json --gpus 4

How each figure is obtained (each row says which):
- Parameters: counted on a model built from the config on the meta device (no memory).
- Memory per GPU, bytes per parameter as the trainers hold them: whole weights train as fp32
  master weights (4 B) with fp32 gradients (4 B) and AdamW's two fp32 moments (8 B), 16 B a
  parameter on every GPU under DDP, 16 / N under FSDP2; the rollouts decode from a whole bf16 copy
  on every GPU (2 B; --train-dtype bfloat16); FSDP2 gathers one transformer block whole at a time
  (4 B a block parameter). LoRA: the frozen base as the trainers load it (fp32, 4 B) plus its bf16
  rollout copy (2 B), the adapters at 16 B a parameter. Activations and the KV cache come on top
  (the measured peaks below include them).
- Time: rollouts from the engine's measured decode throughput on an H200 (results/cuda/
  graphs-h200-4.json: the static step at 64 rows, bf16, a 1.17B Llama), scaled by 1.17B / P (decode
  reads every weight per token: its time goes with the parameters); the update (the loss's forward
  and backward over the sampled tokens, the optimizer step) from the measured MAGRPO step of that
  model on an H100 (results/cuda/scale-h100.json: step_s - rollout_s of step 2, per trained
  token), scaled by P / 1.17B; both divided by the GPUs (each takes its share of the questions).
- CPU: the measured split of a MAGRPO step of the default 135M backbone on 2 CPU cores
  (results/llm/magrpo-lora-lr5e-4-L1-seed0.metrics.jsonl), for comparison.
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

RESULTS = Path(__file__).resolve().parents[1] / "results"
# the shapes of the papers' models (their config.json fields; no download here)
SHAPES = {
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-3b": dict(
        model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        tie_word_embeddings=False,
    ),
}  # fmt: skip
# MAGRPO's preset step (experiments/llm_pieces.py): 4 questions x 8 rollouts x 3 agents of up to 96
# tokens; the H100 run's step sampled 6,144 tokens
STEP_TOKENS = 6144
# one deliberation round of MPDF's evaluation: every agent of 300 test questions REFINEs once,
# 3 agents, about 128 tokens each (the game's budget is 192)
ROUND_TOKENS = 300 * 3 * 128
LORA_RANK = 8
GB = 1e9


def config_of(model):
    """An HF config from a SHAPES name or a config.json path."""
    if model in SHAPES:
        shape = dict(SHAPES[model])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    return AutoConfig.from_pretrained(Path(model).parent if model.endswith(".json") else model)


def counts(config):
    """(parameters, parameters of one transformer block, LoRA rank-8 parameters on every linear
    layer but the LM head), counted on the meta device."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    blocks = set(model._no_split_modules or ())
    block = max(
        (
            sum(p.numel() for p in m.parameters())
            for m in model.modules()
            if type(m).__name__ in blocks
        ),
        default=0,
    )
    head = model.get_output_embeddings()
    lora = sum(
        LORA_RANK * (m.in_features + m.out_features)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m is not head
    )
    return total, block, lora


def measured():
    """The measured rates the plan scales: (the reference model's parameters, its decode tokens/s
    on one H200, its update seconds per trained token on one H100, the CPU step's split)."""
    h200 = json.loads((RESULTS / "cuda" / "graphs-h200-4.json").read_text())
    h100 = json.loads((RESULTS / "cuda" / "scale-h100.json").read_text())
    step = h100["train"]["steps"][1]
    cpu = [
        json.loads(line)
        for line in (RESULTS / "llm" / "magrpo-lora-lr5e-4-L1-seed0.metrics.jsonl").open()
        if '"step_s"' in line
    ]
    update_cpu = sum(r["step_s"] - r["rollout_s"] for r in cpu) / sum(r["tokens"] for r in cpu)
    rollout_cpu = sum(r["rollout_s"] for r in cpu) / sum(r["tokens"] for r in cpu)
    return {
        "reference": h200["parameters"],
        "decode_tokens_s": h200["bfloat16"]["engine static @64"]["tokens_per_s"],
        "update_s_per_token": (step["step_s"] - step["rollout_s"]) / step["tokens"],
        "cpu_update_s_per_token": update_cpu,
        "cpu_rollout_s_per_token": rollout_cpu,
    }


def plan(model, gpus):
    """The table's rows for one model on `gpus` GPUs: (setting, memory per GPU in GB, step s)."""
    total, block, lora = counts(config_of(model))
    rates = measured()
    scale = total / rates["reference"]
    rollout = STEP_TOKENS / (rates["decode_tokens_s"] / scale) / gpus
    update = STEP_TOKENS * rates["update_s_per_token"] * scale / gpus
    round_s = ROUND_TOKENS / (rates["decode_tokens_s"] / scale) / gpus
    # a LoRA backward computes no weight gradient of the frozen base: the forward (2 P a token)
    # and the input gradients (2 P), of whole weights' 6 P
    rows = [
        ("MAGRPO/MLPO, whole weights, DDP", (16 + 2) * total, rollout + update),
        (
            "MAGRPO/MLPO, whole weights, FSDP2",
            (16 / gpus + 2) * total + 4 * block,
            rollout + update,
        ),
        (
            "MAGRPO/MLPO, LoRA rank 8 (DDP-free)",
            (4 + 2) * total + 16 * lora,
            rollout + update * 2 / 3,
        ),
        ("MPDF deliberation (bf16 agents)", 2 * total, round_s),
    ]
    return total, rows


def table(models, gpus):
    """The plan as a markdown table: per model, each setting's memory per GPU and the time of its
    step (a training step of MAGRPO's preset, or one deliberation round) on `gpus` GPUs."""
    lines = [
        f"| model | parameters | setting | memory per GPU (GB) | fits an 80 GB GPU | time on "
        f"{gpus} GPUs (s): a training step, or one deliberation round |",
        "|---|---|---|---|---|---|",
    ]
    for model in models:
        total, rows = plan(model, gpus)
        for k, (setting, memory, seconds) in enumerate(rows):
            first = (model, f"{total / 1e9:.2f} B") if k == 0 else ("", "")
            fits = "yes" if memory / GB <= 80 else "no"
            lines.append(
                f"| {first[0]} | {first[1]} | {setting} | {memory / GB:.1f} | {fits} | "
                f"{seconds:.1f} |"
            )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="a SHAPES name or an HF config.json path")
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    models = [args.model] if args.model else list(SHAPES)
    print(table(models, args.gpus))
    rates = measured()
    print(
        f"\nrates: decode {rates['decode_tokens_s']:.0f} tokens/s at "
        f"{rates['reference'] / 1e9:.2f} B on one H200; update "
        f"{rates['update_s_per_token'] * 1e3:.3f} ms per trained token at that size on one H100; "
        f"the default 135M backbone on 2 CPU "
        f"cores: rollout {rates['cpu_rollout_s_per_token'] * 1e3:.1f} ms and update "
        f"{rates['cpu_update_s_per_token'] * 1e3:.1f} ms per token"
    )


if __name__ == "__main__":
    main()
