"""Speed benchmarks of the engine. Timing claims are ratios measured in one process: this machine is
shared and noisy.

    python -m experiments.bench --bench generate --out results/bench/generate.json

  bench_generate - HF `generate` vs the engine (fp32, bf16 where native, int8) on one fixed
                   batch of deliberation prompts
  bench_round    - one real deliberation round (round 0 + one REFINE of every agent), greedy: HF
                   `generate` in batches of 64 vs the engine's continuous batching, per dtype
  bench_debate   - one LLM-Debate through the engine vs one `generate` call per agent per question
                   per round
  bench_slots    - the engine against itself: tokens/s at --engine-batch-size slots and at half as
                   many
  bench_team     - round 0 of a team of LoRA adapters on one engine (each row its agent's adapter)
                   vs the plain homogeneous team and vs one engine per merged model
  bench_probe    - `--dtype auto`'s probe of fp32 against bf16 matmuls, repeated, at a few batch
                   sizes
"""

import copy
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import common
import data
import deliberate
import solutions
from common import call_seed, check_choice, machine, parse_config, user_errors, write_result
from experiments.bench_common import (
    deliberation_prompts,
    hf_generate,
    matmul_flops,
    matmul_peak_flops,
)
from llm import backbone, lora
from llm.engine import Engine
from solutions import parse_solution


@dataclass
class Config:
    bench: str = "generate"
    """generate | round | debate | slots | team | probe (this file's docstring)"""
    n: int = 0
    """questions (0: 64 generate, 200 round, 32 debate, 256 slots, 64 team)"""
    adapters: str = ""
    """team: the agents' adapter files, comma-separated (empty: random rank-4 adapters)"""
    model: str = ""
    """HF checkpoint directory; empty: the embedded default backbone"""
    dtype: str = "float32"
    """debate: the engine's dtype"""
    dtypes: str = ""
    """generate, round: the dtypes compared, comma-separated (empty: float32, and bfloat16 where
    `--dtype auto` chooses it)"""
    engine_batch_size: int = 128
    """engine slots (round, debate; slots: this and half as many)"""
    hf_batch_size: int = 64
    """round: HF generate's padded batches"""
    agents: int = 3
    """round, debate: agents in the team"""
    rounds: int = 3
    """debate: REFINE rounds after round 0"""
    temperature: float = 0.5
    """debate: the agents' sampling temperature"""
    top_p: float = 1.0
    """debate: nucleus sampling's probability mass"""
    max_new_tokens: int = 0
    """token budget of each call (0: 128 for generate, 192 for the others)"""
    seed: int = 0
    """the LLM calls' seeds"""
    out: str = ""
    """the JSON result file (empty: printed only)"""


def bench_dtypes(cfg):
    """The dtypes to benchmark: --dtypes, else float32 and, where `--dtype auto` chooses it at the
    engine's batch size (llm.backbone.resolve_dtype's probe), bfloat16 (where bf16 is emulated a
    bf16 matmul crawls: hours)."""
    if cfg.dtypes:
        dtypes = [d.strip() for d in cfg.dtypes.split(",") if d.strip()]
        for dtype in dtypes:
            check_choice("--dtypes", dtype, ("float32", "bfloat16"))
        return dtypes
    auto, _ = backbone.resolve_dtype("auto", "cpu", cfg.model or None, cfg.engine_batch_size)
    return ["float32"] + (["bfloat16"] if auto == "bfloat16" else [])


def bench_generate(cfg, repeats=2):
    """HF generate vs the engine on one fixed batch of deliberation prompts, greedy, in each dtype
    of bench_dtypes (HF in the same dtype and HF fp32 the references) and the int8 engine. The
    machine is shared: the sides take turns `repeats` times and each reports its fastest (least
    disturbed) turn. The fp32 engine's tokens must be HF fp32's; across bf16 kernels exact identity
    is not expected, so the share of identical rows is reported."""
    n, dtypes, budget = cfg.n or 64, bench_dtypes(cfg), cfg.max_new_tokens
    examples = data.load_task("arith", split="test", n=n, seed=0)
    engines = {
        dtype: Engine(model_path=cfg.model or None, dtype=dtype, batch_size=n)
        for dtype in (*dtypes, "int8")
    }
    reference = engines["float32"]
    tokenizer = reference.tokenizer
    prompts = deliberation_prompts(reference, examples)
    ids = [reference.encode(p) for p in prompts]
    # HF runs the engines' own model objects (the engine's oneDNN patch is off outside its calls)
    hf_sides = {("hf" if d == "float32" else f"hf_{d}"): engines[d].model for d in dtypes}
    # warm up every path once (first-call allocations, kernel selection)
    with torch.inference_mode():
        for model in hf_sides.values():
            hf_generate(model, tokenizer, prompts[:2], 4, reference.eos_ids, n)
        for engine in engines.values():
            engine.sample(ids[:2], [0, 0], max_new_tokens=4, temperature=0)
    result = {"prompts": n, "prompt_tokens": sum(map(len, ids)), "repeats": repeats}
    turns = {side: [] for side in (*hf_sides, *engines)}  # tokens/s of each turn
    rows = {}  # each side's tokens, per prompt
    for _ in range(repeats):
        for side, model in hf_sides.items():
            with torch.inference_mode():
                start = time.time()
                rows[side] = hf_generate(model, tokenizer, prompts, budget, reference.eos_ids, n)
                turns[side].append(sum(map(len, rows[side])) / (time.time() - start))
        for dtype, engine in engines.items():
            start, prefilled, prefill_s = (
                time.time(),
                engine.stats["prefill_tokens"],
                engine.stats["prefill_s"],
            )
            out = engine.sample(ids, [0] * n, max_new_tokens=budget, temperature=0, keep_eos=True)
            seconds = time.time() - start
            generated = sum(s.n_generated for s in out)
            rows[dtype] = [s.tokens for s in out]
            # prompt tokens run (shared prefixes once)
            executed = engine.stats["prefill_tokens"] - prefilled
            # where the fastest turn's time went
            if not turns[dtype] or generated / seconds > max(turns[dtype]):
                result[f"engine_{dtype}_prefill_share"] = (
                    engine.stats["prefill_s"] - prefill_s
                ) / seconds
            turns[dtype].append(generated / seconds)
            # achieved FLOP/s counts the work actually done, not the work prefix sharing saved
            result[f"engine_{dtype}_flops"] = max(
                result.get(f"engine_{dtype}_flops", 0),
                matmul_flops(reference.model, executed, generated, n) / seconds,
            )
            result[f"engine_{dtype}_prompt_tokens_run"] = executed
            if dtype == "float32":  # the reference: lossless, its tokens are HF's
                result["generated_tokens"] = generated
                result["rows_matching"] = sum(a == b for a, b in zip(rows[dtype], rows["hf"]))
                result["outputs_match"] = result["rows_matching"] == n and result.get(
                    "outputs_match", True
                )
    result["hf_tok_s"] = max(turns["hf"])
    for side in engines:
        result[f"engine_{side}_tok_s"] = max(turns[side])
    result["all_tok_s"] = {side: [round(t, 1) for t in values] for side, values in turns.items()}
    fastest = max(engines, key=lambda d: result[f"engine_{d}_tok_s"])
    result.update(
        fastest=fastest,
        engine_tok_s=result[f"engine_{fastest}_tok_s"],
        ratio=result[f"engine_{fastest}_tok_s"] / result["hf_tok_s"],
        ratio_fp32=result["engine_float32_tok_s"] / result["hf_tok_s"],  # int8 is lossy here
        peak_flops=matmul_peak_flops(fastest),
        peak_flops_fp32=matmul_peak_flops("float32"),
    )
    result["roofline_frac"] = result[f"engine_{fastest}_flops"] / result["peak_flops"]
    result["roofline_frac_fp32"] = result["engine_float32_flops"] / result["peak_flops_fp32"]
    if "bfloat16" in dtypes:
        result["hf_bfloat16_tok_s"] = max(turns["hf_bfloat16"])
        result.update(
            # the engine against HF in its own dtype, and against HF fp32 (what a user runs today)
            ratio_bf16=result["engine_bfloat16_tok_s"] / result["hf_bfloat16_tok_s"],
            ratio_bf16_vs_hf_fp32=result["engine_bfloat16_tok_s"] / result["hf_tok_s"],
            rows_matching_bf16=sum(a == b for a, b in zip(rows["bfloat16"], rows["hf_bfloat16"])),
            rows_matching_bf16_vs_hf_fp32=sum(a == b for a, b in zip(rows["bfloat16"], rows["hf"])),
            peak_flops_bf16=matmul_peak_flops("bfloat16"),
        )
        result["roofline_frac_bf16"] = result["engine_bfloat16_flops"] / result["peak_flops_bf16"]
    return write_result({**result, "dtypes": dtypes, "machine": machine()}, cfg.out)


def bench_round(cfg):
    """One real deliberation round, the way eval.py plays it: round 0 of cfg.agents agents on cfg.n
    (200) arith test questions, then one REFINE of every agent (the game's prompts, seeds and token
    budget; greedy, no cache), in each dtype of bench_dtypes. Per round, HF generate (the prompts in
    the game's order, left-padded batches of cfg.hf_batch_size) and then the engine's continuous
    batching in cfg.engine_batch_size slots (solutions.run_llm's call, eval.py's default slots);
    each side builds its refine prompts from its own round-0 texts. The top-level keys are fp32's;
    a bf16 run adds its own under "bfloat16"."""
    n, dtypes = cfg.n or 200, bench_dtypes(cfg)
    examples = data.load_task("arith", split="test", n=n, seed=0)
    game = solutions.GameConfig(
        agents=cfg.agents,
        rounds=1,
        temperature=0.0,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
    )
    calls = solutions.solve_calls(examples, game)
    per_dtype, outputs = {}, {}
    for dtype in dtypes:
        engine = Engine(model_path=cfg.model or None, dtype=dtype, batch_size=cfg.engine_batch_size)
        model, tokenizer = engine.model, engine.tokenizer
        with torch.inference_mode():  # warm up both paths
            hf_generate(model, tokenizer, [engine.chat("Hi"), engine.chat("Hello there")], 4,
                        engine.eos_ids, 2)  # fmt: skip
            engine.generate([engine.chat("Hi"), engine.chat("Hello there")], [0, 0],
                            max_new_tokens=4, temperature=0)  # fmt: skip
        requests = {"hf": calls, "engine": calls}
        round_s = {"hf": [], "engine": []}
        rows_of = {"hf": [], "engine": []}
        start_stats = dict(engine.stats)
        for t in (0, 1):
            for side in ("hf", "engine"):
                prompts = [engine.chat(prompt) for _, prompt, _, _ in requests[side]]
                seeds = [seed for _, _, seed, _ in requests[side]]
                start = time.time()
                if side == "hf":
                    with torch.inference_mode():
                        rows = hf_generate(model, tokenizer, prompts, game.max_new_tokens,
                                           engine.eos_ids, cfg.hf_batch_size)  # fmt: skip
                else:
                    rows = [c.token_ids for c in engine.generate(
                        prompts, seeds, max_new_tokens=game.max_new_tokens, temperature=0.0,
                        top_p=game.top_p, return_tokens=True)]  # fmt: skip
                round_s[side].append(time.time() - start)
                rows_of[side] += rows
                if t == 0:  # REFINE: each agent sees its own round-0 solution, its peers' answers
                    teams = solutions.per_question(
                        [
                            parse_solution(tokenizer.decode(r, skip_special_tokens=True), ex.task)
                            for (ex, *_), r in zip(calls, rows)
                        ],
                        game.agents,
                    )
                    requests[side] = [
                        (
                            ex,
                            solutions.refine_prompt(ex, team, i),
                            call_seed(cfg.seed, ex.id, i, 1, "refine"),
                            i,
                        )
                        for ex, team in zip(examples, teams)
                        for i in range(game.agents)
                    ]
                print(f"{dtype} round {t} {side}: {round_s[side][-1]:.0f} s", file=sys.stderr,
                      flush=True)  # fmt: skip
        seconds = {side: sum(times) for side, times in round_s.items()}
        generated = {side: sum(map(len, rows)) for side, rows in rows_of.items()}
        executed = engine.stats["prefill_tokens"] - start_stats["prefill_tokens"]
        result = {
            "hf_s": seconds["hf"],
            "engine_s": seconds["engine"],
            "hf_round_s": round_s["hf"],
            "engine_round_s": round_s["engine"],  # round 0, then the REFINE round
            "hf_tok_s": generated["hf"] / seconds["hf"],
            "engine_tok_s": generated["engine"] / seconds["engine"],
            "prompt_tokens": engine.stats["prompt_tokens"] - start_stats["prompt_tokens"],
            "engine_prompt_tokens_run": executed,
            "generated_tokens": generated["engine"],
            "rows_matching": sum(a == b for a, b in zip(rows_of["hf"], rows_of["engine"])),
        }
        result["outputs_match"] = result["rows_matching"] == len(rows_of["engine"])
        result["ratio"] = result["engine_tok_s"] / result["hf_tok_s"]
        flops = matmul_flops(model, executed, generated["engine"], len(rows_of["engine"]))
        result["engine_flops"] = flops / seconds["engine"]
        result["peak_flops"] = matmul_peak_flops(dtype)
        result["roofline_frac"] = result["engine_flops"] / result["peak_flops"]
        per_dtype[dtype], outputs[dtype] = result, rows_of
    summary = {
        "questions": n,
        "agents": game.agents,
        "generations": len(calls) * 2,
        "engine_slots": cfg.engine_batch_size,
        "hf_batch_size": cfg.hf_batch_size,
        "max_new_tokens": game.max_new_tokens,
        **per_dtype["float32"],
        "dtypes": dtypes,
    }
    if "bfloat16" in per_dtype:
        bf16 = per_dtype["bfloat16"]
        bf16["ratio_vs_hf_fp32"] = bf16["engine_tok_s"] / summary["hf_tok_s"]
        bf16["rows_matching_hf_fp32"] = sum(
            a == b for a, b in zip(outputs["bfloat16"]["engine"], outputs["float32"]["hf"])
        )
        summary["bfloat16"] = bf16
    return write_result({**summary, "machine": machine()}, cfg.out)


def bench_debate(cfg):
    """One LLM-Debate run through the engine vs the usual way: one `generate` call per agent per
    question per round. Both sample at the same temperature; the usual way is not cached either."""
    n = cfg.n or 32
    examples = data.load_task("arith", split="test", n=n, seed=0)
    engine = Engine(
        model_path=cfg.model or None,
        dtype=cfg.dtype,
        batch_size=cfg.engine_batch_size,
        progress=True,
    )
    game = solutions.GameConfig(
        agents=cfg.agents,
        rounds=cfg.rounds,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
    )
    start = time.time()
    # debate: every agent REFINEs every round
    deliberate.play(engine, examples, deliberate.FixedPolicy("refine"), game)
    engine_s = time.time() - start
    print(f"engine: {engine_s:.0f} s; now the usual way", file=sys.stderr)
    model, tokenizer = engine.model, engine.tokenizer
    start = time.time()
    torch.manual_seed(cfg.seed)
    with torch.inference_mode():
        for ex in tqdm(examples, desc="usual way", unit="q"):

            def solve(prompt):
                batch = tokenizer(
                    engine.chat(prompt), return_tensors="pt", add_special_tokens=False
                )
                out = model.generate(
                    **batch,
                    max_new_tokens=game.max_new_tokens,
                    do_sample=True,
                    temperature=game.temperature,
                    top_p=game.top_p,
                    top_k=0,
                )
                text = tokenizer.decode(
                    out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True
                )
                return parse_solution(text, ex.task)

            team = [solve(solutions.solve_prompt(ex)) for _ in range(game.agents)]
            for _ in range(game.rounds):
                team = [solve(solutions.refine_prompt(ex, team, i)) for i in range(game.agents)]
    usual_s = time.time() - start
    result = {
        "questions": n,
        "agents": game.agents,
        "rounds": game.rounds,
        "engine_s": engine_s,
        "usual_s": usual_s,
        "ratio": usual_s / engine_s,
    }
    return write_result({**result, "machine": machine()}, cfg.out)


def bench_slots(cfg, repeats=2):
    """The engine's tokens/s with cfg.engine_batch_size slots against half as many, on 4 x 64 fixed
    deliberation prompts (the mix of bench_generate), greedy fp32, cfg.max_new_tokens: the two sizes
    take turns `repeats` times and each reports its fastest turn (the least disturbed on a shared
    machine). Greedy fp32 output must not depend on the batch size."""
    n, sizes = cfg.n or 256, (cfg.engine_batch_size // 2, cfg.engine_batch_size)
    engine = Engine(model_path=cfg.model or None, dtype="float32")
    ids = [
        engine.encode(p)
        for p in deliberation_prompts(engine, data.load_task("arith", split="test", n=n, seed=0))
    ]
    engine.sample(ids[:2], [0, 0], max_new_tokens=4, temperature=0)  # warm-up
    turns, outputs = {size: [] for size in sizes}, {}
    for _ in range(repeats):
        for size in sizes:
            engine.batch_size, start = size, time.time()
            out = engine.sample(
                ids, list(range(n)), max_new_tokens=cfg.max_new_tokens, temperature=0
            )
            turns[size].append(sum(s.n_generated for s in out) / (time.time() - start))
            outputs[size] = [s.tokens for s in out]
            print(f"batch {size}: {turns[size][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    result = {
        "prompts": n,
        "max_new_tokens": cfg.max_new_tokens,
        "tok_s": {size: max(t) for size, t in turns.items()},
        "all_tok_s": {size: [round(x, 1) for x in t] for size, t in turns.items()},
        "outputs_match": outputs[sizes[0]] == outputs[sizes[1]],
    }
    result["ratio"] = result["tok_s"][sizes[1]] / result["tok_s"][sizes[0]]
    return write_result({**result, "machine": machine()}, cfg.out)


def bench_team(cfg, repeats=2):
    """Round 0 of n questions for a team of LoRA adapters (--adapters, else random rank-4 ones)
    through one engine, each row with its agent's adapter, against the plain homogeneous team (no
    LoRA layers) and against one engine per merged model (its agent's calls alone). Greedy fp32;
    each side's fastest of `repeats` turns in tokens/s (the texts differ between sides)."""
    n = cfg.n or 64
    plain = Engine(model_path=cfg.model or None, dtype="float32", batch_size=cfg.engine_batch_size)
    model = copy.deepcopy(plain.model)
    if cfg.adapters:
        for path in cfg.adapters.split(","):
            lora.load_adapter(model, common.load_file(path, "adapter"))
    else:  # B random instead of 0: a non-zero update, whatever its values
        lora.add_lora(model, 4, 32.0, adapters=cfg.agents, seed=cfg.seed)
        torch.nn.utils.vector_to_parameters(
            torch.randn(sum(p.numel() for p in model.parameters() if p.requires_grad)) * 1e-3,
            [p for p in model.parameters() if p.requires_grad],
        )
    adapted = Engine(model=model, tokenizer=plain.tokenizer, batch_size=cfg.engine_batch_size)
    merged = [Engine(model=lora.merged_copy(model, k), tokenizer=plain.tokenizer,
                     batch_size=cfg.engine_batch_size) for k in range(cfg.agents)]  # fmt: skip
    examples = data.load_task("arith", split="test", n=n, seed=0)
    game = solutions.GameConfig(agents=cfg.agents, seed=cfg.seed)
    calls = solutions.solve_calls(examples, game)
    prompts, seeds, agents = zip(*((plain.chat(p), seed, i) for _, p, seed, i in calls))
    budget = {"max_new_tokens": cfg.max_new_tokens, "temperature": 0.0}

    def one_per_merged_model():  # solve_calls is question-major: agent i's calls are i::agents
        return [c for i in range(cfg.agents)
                for c in merged[i].generate(prompts[i :: cfg.agents], seeds[i :: cfg.agents],
                                            **budget)]  # fmt: skip

    sides = {
        "homogeneous": lambda: plain.generate(prompts, seeds, **budget),
        "adapters": lambda: adapted.generate(prompts, seeds, adapters=agents, **budget),
        "merged": one_per_merged_model,
    }
    turns = {side: [] for side in sides}
    for _ in range(repeats):
        for side, run in sides.items():
            start = time.time()
            tokens = sum(c.completion_tokens for c in run())
            turns[side].append(tokens / (time.time() - start))
            print(f"{side}: {turns[side][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    tok_s = {side: max(t) for side, t in turns.items()}
    result = {
        "questions": n, "agents": cfg.agents, "calls": len(calls),
        "max_new_tokens": cfg.max_new_tokens, "adapters": cfg.adapters or "random rank 4",
        "adapter_bytes": [Path(p).stat().st_size for p in cfg.adapters.split(",") if p],
        "tok_s": tok_s, "all_tok_s": {k: [round(x, 1) for x in t] for k, t in turns.items()},
        "ratio_adapters": tok_s["adapters"] / tok_s["homogeneous"],
        "ratio_merged": tok_s["merged"] / tok_s["homogeneous"],
    }  # fmt: skip
    return write_result({**result, "machine": machine()}, cfg.out)


def bench_probe(cfg, repeats=3):
    """`--dtype auto`'s probe (llm.backbone.probe_matmuls) on the model's decode matmuls at 16, 64
    and --engine-batch-size rows, `repeats` times each, uncached: its figures, the bf16 / fp32 speed
    ratio and the dtype it chooses, and how long it took."""
    from transformers import AutoConfig

    shapes = backbone.decode_matmuls(
        AutoConfig.from_pretrained(cfg.model or backbone.default_model_path())
    )
    runs = {}
    for rows in (16, 64, cfg.engine_batch_size):
        runs[rows] = []
        for _ in range(repeats):
            figures = backbone.probe_matmuls(shapes, rows)
            speedup = figures["float32_ms"] / figures["bfloat16_ms"]
            choice = "bfloat16" if speedup >= backbone.BF16_MIN_SPEEDUP else "float32"
            runs[rows].append({**figures, "speedup": speedup, "choice": choice})
    result = {"shapes": shapes, "min_speedup": backbone.BF16_MIN_SPEEDUP, "runs": runs}
    return write_result({**result, "torch": torch.__version__, "machine": machine()}, cfg.out)


BENCHMARKS = {
    "generate": bench_generate,
    "round": bench_round,
    "debate": bench_debate,
    "slots": bench_slots,
    "team": bench_team,
    "probe": bench_probe,
}

if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors():
        check_choice("--bench", config.bench, BENCHMARKS)
        budget = config.max_new_tokens or (128 if config.bench == "generate" else 192)
        BENCHMARKS[config.bench](dataclasses.replace(config, max_new_tokens=budget))
