"""What the speed scripts share (bench.py, profile_decode.py, cuda_check.py, cuda_scale.py): the
fixed batch of deliberation prompts they time, HF `generate` as the reference they are timed
against, the matmul FLOP counts that turn a time into a share of this machine's peak, and randomly
initialized Llamas over the default tokenizer (no weights need to travel to a GPU machine)."""

import math
import time
import warnings

import torch

import solutions
from llm import backbone
from solutions import parse_solution


def matmul_peak_flops(dtype):
    """This machine's measured matmul FLOP/s in `dtype` (int8: a dynamically quantized Linear);
    fp32: the faster of torch's default matmul and oneDNN's (the engine's Linear layers). The
    fastest of 3 turns, on 2048 x 2048 matrices; where one such matmul would take more than a
    second (bf16 emulated on a CPU without it runs about a hundred times slower), on 512 x 512
    ones, whose rate it already measures, so that the measurement stays seconds long."""
    size = 2048 if _matmul_seconds(dtype, 512) * 64 <= 1.0 else 512
    x = torch.randn(size, size)
    if dtype == "int8":
        layer = torch.nn.Linear(size, size, bias=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer = torch.ao.quantization.quantize_dynamic(
                layer, {torch.nn.Linear}, dtype=torch.qint8
            )
        runs = [lambda: layer(x)]
    else:
        w = torch.randn(size, size, dtype=backbone.DTYPES[dtype])
        x = x.to(w.dtype)
        runs = [lambda: x @ w]
        if dtype == "float32" and torch.backends.mkldnn.is_available():
            runs.append(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
    best = 0.0
    for run in runs:
        start = time.time()
        run()
        # each turn long enough (a quarter second) for the clock, however fast the machine
        repeats = max(1, math.ceil(0.25 / (time.time() - start)))
        for _ in range(3):
            start = time.time()
            for _ in range(repeats):
                run()
            best = max(best, 2 * size**3 * repeats / (time.time() - start))
    return best


def _matmul_seconds(dtype, size):
    """Seconds of one size x size matmul in `dtype` (int8: timed as fp32), after one warm-up."""
    w = torch.randn(size, size, dtype=torch.float32 if dtype == "int8" else backbone.DTYPES[dtype])
    x = torch.randn(size, size, dtype=w.dtype)
    x @ w
    start = time.time()
    x @ w
    return time.time() - start


def matmul_flops(model, prompt_tokens, generated, rows):
    """Matmul FLOPs of running `prompt_tokens` prompt tokens and `generated` new tokens through the
    model: the transformer body for every token, the LM head for every generated token and each
    row's last prompt token."""
    body = sum(
        p.numel() for name, p in model.named_parameters() if ".layers." in name and p.dim() == 2
    )
    head = model.config.vocab_size * model.config.hidden_size
    return 2 * body * (prompt_tokens + generated) + 2 * head * (generated + rows)


def hf_generate(model, tokenizer, prompts, max_new_tokens, eos_ids, batch_size, **options):
    """HF generate, greedy, left-padded batches in the given order: per row the new tokens up to and
    including the first EOS (the useful tokens). `options` go to generate (cache_implementation,
    say)."""
    tokenizer.padding_side = "left"
    rows = []
    for k in range(0, len(prompts), batch_size):
        batch = tokenizer(
            prompts[k : k + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
        ).to(model.device)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, **options)
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            cut = next((k + 1 for k, t in enumerate(row) if t in eos_ids), len(row))
            rows.append(row[:cut])
    return rows


def deliberation_prompts(engine, examples):
    """A fixed set of deliberation prompts: round-0 solve prompts for half of the rows and the
    refine prompts of 3-agent teams (canned solutions) for the rest, as in a debate round; no
    generation needed."""
    half = len(examples) // 2
    prompts = [engine.chat(solutions.solve_prompt(ex)) for ex in examples[:half]]
    for k in range(len(examples) - half):
        ex = examples[half + k // 3]
        team = [
            parse_solution(
                f"Let me compute step by step. The result is {int(ex.answer) + d}."
                f"\nSteps: 2\nConfidence: {7 + d}/10\nAnswer: {int(ex.answer) + d}",
                ex.task,
            )
            for d in (0, 1, 2)
        ]
        prompts.append(engine.chat(solutions.refine_prompt(ex, team, k % 3)))
    return prompts


def random_llama_dir(tokenizer_dir, out, dtype=torch.float32, **shape):
    """A randomly initialized Llama over the tokenizer in `tokenizer_dir` (seed 0), saved as an HF
    directory in `dtype`; `shape`: LlamaConfig's sizes (hidden_size, num_hidden_layers, ...)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=1024, tie_word_embeddings=False, **shape,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)
