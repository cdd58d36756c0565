"""Speed benchmarks of the engine (`python eval.py --bench generate | debate`). Timing claims are ratios
measured in one process: this machine is shared and noisy.

  bench_generate - HF `generate` (fp32) vs the engine (fp32, int8) on one fixed batch of deliberation prompts
  bench_debate   - one LLM-Debate through the engine vs one `generate` call per agent per question per round
"""
import json
import sys
import time
import warnings

import torch
from tqdm import tqdm

import backbone
import data
import deliberate
from engine import Engine
from state import parse_solution


def matmul_peak_flops(dtype):
    """This machine's measured matmul FLOP/s in `dtype` (int8: a dynamically quantized Linear)."""
    x = torch.randn(2048, 2048)
    if dtype == "int8":
        layer = torch.nn.Linear(2048, 2048, bias=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer = torch.ao.quantization.quantize_dynamic(layer, {torch.nn.Linear}, dtype=torch.qint8)
        run = lambda: layer(x)  # noqa: E731
    else:
        w = torch.randn(2048, 2048, dtype=backbone.DTYPES[dtype])
        x = x.to(w.dtype)
        run = lambda: x @ w  # noqa: E731
    run()
    start, repeats = time.time(), 5
    for _ in range(repeats):
        run()
    return 2 * 2048 ** 3 * repeats / (time.time() - start)


def deliberation_prompts(engine, examples):
    """A fixed set of deliberation prompts: round-0 solve prompts for half of the rows and the refine
    prompts of 3-agent teams (canned solutions) for the rest, as in a debate round; no generation needed."""
    half = len(examples) // 2
    prompts = [engine.chat(deliberate.solve_prompt(ex)) for ex in examples[:half]]
    for k in range(len(examples) - half):
        ex = examples[half + k // 3]
        team = [parse_solution(f"Let me compute step by step. The result is {int(ex.answer) + d}."
                                          f"\nSteps: 2\nConfidence: {7 + d}/10\nAnswer: {int(ex.answer) + d}",
                                          ex.task) for d in (0, 1, 2)]
        prompts.append(engine.chat(deliberate.refine_prompt(ex, team, k % 3)))
    return prompts


def bench_generate(cfg):
    """HF generate (fp32) vs the engine on one fixed batch of deliberation prompts, greedy."""
    n = cfg.bench_n or 64
    examples = data.load_task("arith", split="test", n=n, seed=0)
    engines = {dtype: Engine(model_path=cfg.model or None, dtype=dtype, batch_size=n)
               for dtype in ("float32", "int8")}
    reference = engines["float32"]
    model, tokenizer = reference.model, reference.tokenizer
    body_params = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name and p.dim() == 2)
    prompts = deliberation_prompts(reference, examples)
    ids = [reference.encode(p) for p in prompts]
    prompt_tokens = sum(map(len, ids))
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():  # warm up every path once (first-call allocations, kernel selection)
        model.generate(**tokenizer(prompts[:2], return_tensors="pt", padding=True, add_special_tokens=False),
                       max_new_tokens=4, do_sample=False)
        for engine in engines.values():
            engine.sample(ids[:2], [0, 0], max_new_tokens=4, temperature=0)
        start = time.time()
        hf_out = model.generate(**batch, max_new_tokens=128, do_sample=False)
        hf_s = time.time() - start
    hf_rows = []
    for row in hf_out[:, batch["input_ids"].shape[1]:].tolist():
        cut = next((k for k, t in enumerate(row) if t in reference.eos_ids), None)
        hf_rows.append((row[:cut], cut is not None))
    hf_tokens = sum(len(r) + eos for r, eos in hf_rows)  # useful tokens: up to and including EOS
    result = {"prompts": n, "prompt_tokens": prompt_tokens, "hf_tok_s": hf_tokens / hf_s}
    for dtype, engine in engines.items():
        start, prefilled = time.time(), engine.stats["prefill_tokens"]
        out = engine.sample(ids, [0] * n, max_new_tokens=128, temperature=0)
        seconds = time.time() - start
        generated = sum(k for _, _, k in out)
        executed = engine.stats["prefill_tokens"] - prefilled  # prompt tokens run (shared prefixes once)
        result[f"engine_{dtype}_tok_s"] = generated / seconds
        result[f"engine_{dtype}_prompt_tokens_run"] = executed
        # achieved FLOP/s counts the work actually done, not the work prefix sharing saved
        result[f"engine_{dtype}_flops"] = (2 * body_params * (executed + generated)
                                           + 2 * model.config.vocab_size * model.config.hidden_size
                                           * (generated + n)) / seconds
        if dtype == "float32":
            result["outputs_match"] = all(tokens == hf[0] for (tokens, _, _), hf in zip(out, hf_rows))
            result["rows_matching"] = sum(tokens == hf[0] for (tokens, _, _), hf in zip(out, hf_rows))
    fastest = max(engines, key=lambda d: result[f"engine_{d}_tok_s"])
    result.update(fastest=fastest, engine_tok_s=result[f"engine_{fastest}_tok_s"],
                  ratio=result[f"engine_{fastest}_tok_s"] / result["hf_tok_s"],
                  ratio_fp32=result["engine_float32_tok_s"] / result["hf_tok_s"],  # int8 is lossy here
                  peak_flops=matmul_peak_flops(fastest))
    result["roofline_frac"] = result[f"engine_{fastest}_flops"] / result["peak_flops"]
    print(json.dumps(result))
    return result


def bench_debate(cfg):
    """One LLM-Debate run through the engine vs the usual way: one `generate` call per agent per question
    per round. Both sample at the same temperature; the usual way is not cached either."""
    n = cfg.bench_n or 32
    examples = data.load_task("arith", split="test", n=n, seed=0)
    engine = Engine(model_path=cfg.model or None, dtype=cfg.dtype, batch_size=cfg.batch_size,
                               progress=True)
    game = deliberate.GameConfig(agents=cfg.agents, rounds=cfg.rounds, temperature=cfg.temperature,
                                 top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    start = time.time()
    deliberate.run_protocol(engine, examples, "debate", game)
    engine_s = time.time() - start
    print(f"engine: {engine_s:.0f} s; now the usual way", file=sys.stderr)
    model, tokenizer = engine.model, engine.tokenizer
    start = time.time()
    torch.manual_seed(cfg.seed)
    with torch.inference_mode():
        for ex in tqdm(examples, desc="usual way", unit="q"):
            def solve(prompt):
                batch = tokenizer(engine.chat(prompt), return_tensors="pt", add_special_tokens=False)
                out = model.generate(**batch, max_new_tokens=game.max_new_tokens, do_sample=True,
                                     temperature=game.temperature, top_p=game.top_p, top_k=0)
                text = tokenizer.decode(out[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)
                return parse_solution(text, ex.task)
            team = [solve(deliberate.solve_prompt(ex)) for _ in range(game.agents)]
            for _ in range(game.rounds):
                team = [solve(deliberate.refine_prompt(ex, team, i)) for i in range(game.agents)]
    usual_s = time.time() - start
    result = {"questions": n, "agents": game.agents, "rounds": game.rounds, "engine_s": engine_s,
              "usual_s": usual_s, "ratio": usual_s / engine_s}
    print(json.dumps(result))
    return result


BENCHMARKS = {"generate": bench_generate, "debate": bench_debate}
