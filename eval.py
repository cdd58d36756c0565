"""Protocols side by side (DESIGN §7): accuracy, token cost, LLM calls, action statistics.

    python eval.py --task arith --n 200 --seed 0 --agents 3 --rounds 3 \
        --protocols vanilla,cot,sc,debate,mpdf-persist,mpdf-random,mpdf-oracle --out results.json

`--path` for file tasks (gsm8k, mawps, svamp, mc, math), `--model` for any HF causal-LM directory,
`mpdf=PATH` for a trained policy checkpoint. Generations are cached on disk (`--cache-dir`), so a second
identical evaluation makes no LLM call.
"""
import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import data
import deliberate


@dataclass
class Config:
    task: str = "arith"
    path: str = ""                 # data file for file-based tasks
    split: str = "test"
    level: int = 0                 # arith difficulty 1..4 (0: the task's default, easy)
    n: int = 200                   # questions (a seeded random subset)
    seed: int = 0                  # question subset, every LLM call's seed and the random policy
    protocols: str = "vanilla,cot,sc,debate,mpdf-persist,mpdf-random,mpdf-oracle"
    agents: int = 3
    rounds: int = 3
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 192
    model: str = ""                # HF checkpoint directory; empty: the embedded default backbone
    dtype: str = "float32"
    batch_size: int = 64
    cache_dir: str = "cache/generations"  # empty string disables the generation cache
    out: str = ""                  # JSON results file


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
    header = f"{'protocol':<28}{'accuracy':>16}{'tokens/q':>10}{'calls/q':>9}{'unparsed':>9}  actions p/r/c"
    print(header)
    print("-" * len(header))
    for name, s in summaries.items():
        actions = s.get("actions")
        actions = "/".join(f"{actions[k]:.2f}" for k in deliberate.ACTION_KINDS) if actions else "-"
        print(f"{name:<28}{s['accuracy']:>9.3f} ± {s['stderr']:.3f}{s['tokens_per_question']:>10.0f}"
              f"{s['calls_per_question']:>9.1f}{s['unparseable']:>9.3f}  {actions}")


def main(cfg):
    protocols = [p.strip() for p in cfg.protocols.split(",") if p.strip()]
    kw = {"level": cfg.level} if cfg.level else {}
    examples = data.load_task(cfg.task, path=cfg.path or None, split=cfg.split, n=cfg.n, seed=cfg.seed, **kw)
    engine = deliberate.Engine(model_path=cfg.model or None, dtype=cfg.dtype, batch_size=cfg.batch_size,
                               cache_dir=cfg.cache_dir or None)
    game = deliberate.GameConfig(agents=cfg.agents, rounds=cfg.rounds, temperature=cfg.temperature,
                                 top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
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


if __name__ == "__main__":
    main(parse_config(Config))
