"""Protocols side by side (DESIGN §7): accuracy, token cost, LLM calls, action statistics.

    python eval.py --task arith --n 200 --seed 0 --agents 3 --rounds 3 \
        --protocols vanilla,cot,sc,debate,mpdf-persist,mpdf-random,mpdf-oracle --out results.json

`--path` for file tasks (gsm8k, mawps, svamp, mc, math), `--model` for any HF causal-LM directory,
`mpdf=PATH` for a trained policy checkpoint, `leader=PATH` for MLPO (the agents answer, the leader model at
PATH reads them and answers; `--rounds` more rounds let the agents revise after reading the leader's answer).
Generations are cached on disk (`--cache-dir`), so a second
identical evaluation makes no LLM call.
"""
import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

import backbone
import data
import deliberate


@dataclass
class Config:
    task: str = "arith"
    path: str = ""                 # data file for file-based tasks
    split: str = ""                # "" = test for arith, all for a file; train/test of a file: see data.split_of
    level: int = 0                 # arith difficulty 1..4 (0: the task's default, easy)
    n: int = 200                   # questions (a seeded random subset)
    seed: int = 0                  # question subset, every LLM call's seed and the random policy
    seeds: str = ""                # e.g. "0,1,2": one evaluation per seed, then accuracy mean ± std over seeds
    protocols: str = "vanilla,cot,sc,debate,mpdf-persist,mpdf-random,mpdf-oracle"
    agents: int = 3
    rounds: int = 3
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 192
    trailer: bool = False          # ask the agents for the Steps / Confidence / Answer trailer
    critic: bool = False           # run the critic pass for fixed policies too (to report its AUROC)
    model: str = ""                # HF checkpoint directory; empty: the embedded default backbone
    dtype: str = "float32"
    batch_size: int = 64
    cache_dir: str = "cache/generations"  # empty string disables the generation cache
    out: str = ""                  # JSON results file
    bench: str = ""                # "generate" or "debate": a speed benchmark instead of an evaluation
    bench_n: int = 0               # questions for a benchmark (0: 64 for generate, 32 for debate)


def parse_config(config_class, argv=None):
    """argparse flags built from a dataclass: --field-name, typed by the field's default."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    return config_class(**vars(parser.parse_args(argv)))


def summarize(results, wall_s):
    """The metrics of one protocol from its per-question results."""
    n = len(results)
    accuracy = sum(r["correct"] for r in results) / n
    summary = {"n": n, "accuracy": accuracy, "stderr": math.sqrt(accuracy * (1 - accuracy) / n),
               "tokens_per_question": sum(r["tokens"] for r in results) / n,
               "calls_per_question": sum(r["calls"] for r in results) / n,
               "unparseable": sum(r["pred"] is None for r in results) / n, "wall_s": wall_s,
               "wall_s_per_question": wall_s / n}
    if "leader_correct" in results[0]:  # MLPO: the peers' own vote, then the leader after each round
        summary["peer_vote_accuracy"] = sum(r["peer_vote_correct"] for r in results) / n
        summary["accuracy_per_round"] = [sum(r["leader_correct"][t] for r in results) / n
                                         for t in range(len(results[0]["leader_correct"]))]
    if "rounds" in results[0]:  # a game: action statistics, accuracy per round, trailer and critic quality
        counts = {kind: 0 for kind in deliberate.ACTION_KINDS}
        for r in results:
            for record in r["rounds"][1:]:
                for a in record["actions"]:
                    counts[deliberate.action_kind(a)] += 1
        total = sum(counts.values()) or 1
        summary["actions"] = {kind: c / total for kind, c in counts.items()}
        max_rounds = max(len(r["rounds"]) for r in results)
        # a question that stopped early keeps its last vote in the later rounds
        summary["accuracy_per_round"] = [
            sum(r["rounds"][min(t, len(r["rounds"]) - 1)]["correct"] for r in results) / n
            for t in range(max_rounds)]
        first = [(ok, trailer, critic) for r in results for ok, trailer, critic in zip(
            r["rounds"][0]["agent_correct"], r["rounds"][0]["trailer_ok"], r["rounds"][0]["critic"])]
        summary["trailer_compliance"] = sum(t for _, t, _ in first) / len(first)
        summary["agent_accuracy_round0"] = sum(ok for ok, _, _ in first) / len(first)
        scored = [(critic, ok) for ok, _, critic in first if critic is not None]
        if scored:
            summary["critic_auroc"] = auroc([c for c, _ in scored], [ok for _, ok in scored])
    return summary


def auroc(scores, labels):
    """P(score of a positive > score of a negative), ties counting half; None without both classes."""
    positives = [s for s, y in zip(scores, labels) if y]
    negatives = [s for s, y in zip(scores, labels) if not y]
    if not positives or not negatives:
        return None
    wins = sum((p > q) + 0.5 * (p == q) for p in positives for q in negatives)
    return wins / (len(positives) * len(negatives))


def print_table(summaries):
    width = max([28] + [len(name) + 2 for name in summaries])
    header = f"{'protocol':<{width}}{'accuracy':>16}{'tokens/q':>10}{'calls/q':>9}{'unparsed':>9}  actions p/r/c"
    print(header)
    print("-" * len(header))
    for name, s in summaries.items():
        actions = s.get("actions")
        actions = "/".join(f"{actions[k]:.2f}" for k in deliberate.ACTION_KINDS) if actions else "-"
        print(f"{name:<{width}}{s['accuracy']:>9.3f} ± {s['stderr']:.3f}{s['tokens_per_question']:>10.0f}"
              f"{s['calls_per_question']:>9.1f}{s['unparseable']:>9.3f}  {actions}")


def main(cfg):
    protocols = [p.strip() for p in cfg.protocols.split(",") if p.strip()]
    # a file may be a test set in itself, so it is taken whole unless a split is asked for
    cfg = dataclasses.replace(cfg, split=cfg.split or ("test" if cfg.task.startswith("arith") else "all"))
    kw = {"level": cfg.level} if cfg.level else {}
    examples = data.load_task(cfg.task, path=cfg.path or None, split=cfg.split, n=cfg.n, seed=cfg.seed, **kw)
    engine = deliberate.Engine(model_path=cfg.model or None, dtype=cfg.dtype, batch_size=cfg.batch_size,
                               cache_dir=cfg.cache_dir or None, progress=True)
    game = deliberate.GameConfig(agents=cfg.agents, rounds=cfg.rounds, temperature=cfg.temperature,
                                 top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                                 trailer=cfg.trailer, critic=cfg.critic)
    summaries, details = {}, {}
    for protocol in protocols:
        start = time.time()
        results = deliberate.run_protocol(engine, examples, protocol, game)
        summaries[protocol] = summarize(results, time.time() - start)
        details[protocol] = results
        print(f"[{protocol}] accuracy {summaries[protocol]['accuracy']:.3f} "
              f"({summaries[protocol]['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    print(f"\ntask {cfg.task} ({cfg.split}, n={len(examples)}), {cfg.agents} agents, {cfg.rounds} rounds, "
          f"seed {cfg.seed}, model {cfg.model or 'default'} ({cfg.dtype})")
    print_table(summaries)
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        with open(cfg.out, "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), "engine": engine.stats, **summaries,
                       "details": details}, f, indent=1)
    return summaries


# ----------------------------------------------------------------------------------------------------
# Benchmarks. Timing claims are ratios measured in one process: this machine is shared and noisy.
# ----------------------------------------------------------------------------------------------------
def matmul_peak_flops(dtype):
    """This machine's measured matmul FLOP/s in `dtype` (int8: a dynamically quantized Linear)."""
    import torch
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
        team = [deliberate.parse_solution(f"Let me compute step by step. The result is {int(ex.answer) + d}."
                                          f"\nSteps: 2\nConfidence: {7 + d}/10\nAnswer: {int(ex.answer) + d}",
                                          ex.task) for d in (0, 1, 2)]
        prompts.append(engine.chat(deliberate.refine_prompt(ex, team, k % 3)))
    return prompts


def bench_generate(cfg):
    """HF generate (fp32) vs the engine on one fixed batch of deliberation prompts, greedy."""
    import torch
    n = cfg.bench_n or 64
    examples = data.load_task("arith", split="test", n=n, seed=0)
    engines = {dtype: deliberate.Engine(model_path=cfg.model or None, dtype=dtype, batch_size=n)
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
    import torch
    n = cfg.bench_n or 32
    examples = data.load_task("arith", split="test", n=n, seed=0)
    engine = deliberate.Engine(model_path=cfg.model or None, dtype=cfg.dtype, batch_size=cfg.batch_size,
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
                return deliberate.parse_solution(text, ex.task)
            team = [solve(deliberate.solve_prompt(ex)) for _ in range(game.agents)]
            for _ in range(game.rounds):
                team = [solve(deliberate.refine_prompt(ex, team, i)) for i in range(game.agents)]
    usual_s = time.time() - start
    result = {"questions": n, "agents": game.agents, "rounds": game.rounds, "engine_s": engine_s,
              "usual_s": usual_s, "ratio": usual_s / engine_s}
    print(json.dumps(result))
    return result


def over_seeds(cfg):
    """One evaluation per seed (its own question subset and LLM seeds), then mean ± std over the seeds."""
    seeds = [int(x) for x in cfg.seeds.split(",") if x.strip()]
    runs = []
    for seed in seeds:
        out = str(Path(cfg.out).with_name(f"{Path(cfg.out).stem}-seed{seed}.json")) if cfg.out else ""
        runs.append(main(dataclasses.replace(cfg, seed=seed, seeds="", out=out)))
    table = {}
    for protocol in runs[0]:
        values = {k: [r[protocol][k] for r in runs] for k in ("accuracy", "tokens_per_question", "wall_s_per_question")}
        table[protocol] = {f"{k}_{stat}": fn(v) for k, v in values.items()
                           for stat, fn in (("mean", statistics.mean), ("std", pstdev))}
        table[protocol]["accuracy_per_seed"] = values["accuracy"]
        if "actions" in runs[0][protocol]:
            table[protocol]["actions"] = {a: statistics.mean(r[protocol]["actions"][a] for r in runs)
                                          for a in runs[0][protocol]["actions"]}
    print(f"\nover seeds {seeds}: accuracy mean ± std (population std over seeds), tokens per question")
    for protocol, row in table.items():
        print(f"{protocol:<40}{row['accuracy_mean']:>8.3f} ± {row['accuracy_std']:.3f}"
              f"{row['tokens_per_question_mean']:>10.0f}")
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), **table}, f, indent=1)
    return table


def pstdev(values):
    return statistics.pstdev(values) if len(values) > 1 else 0.0


if __name__ == "__main__":
    config = parse_config(Config)
    if config.seeds:
        over_seeds(config)
    elif config.bench == "generate":
        bench_generate(config)
    elif config.bench == "debate":
        bench_debate(config)
    elif config.bench:
        sys.exit(f"unknown --bench {config.bench!r}: choose generate or debate")
    else:
        main(config)
