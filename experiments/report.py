"""The README's result tables, written from the committed files in results/ (never typed by hand).

    python experiments/report.py            # print every table
    python experiments/report.py --write    # replace each <!-- report:NAME --> ... <!-- /report:NAME -->
                                            # block of README.md with its table

A table whose files are not all in results/ yet says which pieces are missing (experiments/run.py makes them).
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
sys.path.insert(0, str(ROOT))
import plots  # noqa: E402
from stats import format_paired, paired_difference, sample_std  # noqa: E402

NO_PNG = "(no PNG: `pip install matplotlib`, then rerun `python experiments/report.py --write`)"


def load(path):
    path = RESULTS / path
    return json.loads(path.read_text()) if path.exists() else None


def missing(*paths):
    return (
        "*(not computed yet: "
        + ", ".join(f"`results/{p}`" for p in paths)
        + "; run `python experiments/run.py`)*"
    )


def fmt(value, digits=3):
    return "–" if value is None else f"{value:.{digits}f}"


def auroc_table():
    found = {task: load(f"auroc/{task}.json") for task in ("arith", "mawps")}
    runs = {task: r for task, r in found.items() if r}
    if not runs:
        return missing(*(f"auroc/{t}.json" for t in found))
    signals = list(next(iter(runs.values()))["auroc"])
    columns = [
        f"{task} ({r['solutions']} solutions, {r['right']} right)" for task, r in runs.items()
    ]
    lines = ["| AUROC of | " + " | ".join(columns) + " |", "|---|" + "---|" * len(runs)]
    lines += [
        f"| {name} | " + " | ".join(fmt(r["auroc"][name]) for r in runs.values()) + " |"
        for name in signals
    ]
    lines.append(
        "| critic prompt tokens per solution | "
        + " | ".join(f"{r['critic_prompt_tokens_per_solution']:.0f}" for r in runs.values())
        + " |"
    )
    absent = [f"auroc/{t}.json" for t, r in found.items() if not r]
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def protocol_cells(s):
    """accuracy ± s.e. | tokens/q | calls/q | vote after rounds | actions p/r/c of one eval.py summary (the last
    two for the game's protocols only)."""
    actions = (
        "/".join(f"{s['actions'][k]:.2f}" for k in ("persist", "refine", "concede"))
        if "actions" in s
        else ""
    )
    rounds = "/".join(f"{a:.2f}" for a in s.get("accuracy_per_round", [])) if "actions" in s else ""
    return (
        f"{s['accuracy']:.3f} ± {s['stderr']:.3f} | {s['tokens_per_question']:.0f} | "
        f"{s['calls_per_question']:.1f} | {rounds} | {actions}"
    )


def protocol_table(name, parts, reference):
    """One row per protocol, each from its own file tables/<name>-<part>.json (eval.py's summary JSON), with
    its paired accuracy difference to the `reference` part on the same questions (stats.paired_difference)."""
    runs = {part: load(f"tables/{name}-{part}.json") for part in parts}
    done = {part: summary_of(run) for part, run in runs.items() if run}
    if not done:
        return missing(*(f"tables/{name}-{part}.json" for part in parts))
    header = (
        "| protocol | accuracy ± s.e. | tokens/q | calls/q | vote after rounds | actions p/r/c |"
    )
    header += f" vs {reference} [95% CI] (disagree) |" if reference in done else ""
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for part, s in done.items():
        row = f"| {part} | {protocol_cells(s)} |"
        if reference in done:
            v = paired_difference(s, done[reference])
            row += f" {format_paired(v)} |"
        lines.append(row)
    vote = next(iter(r for r in runs.values() if r))["config"].get("vote")
    absent = [f"tables/{name}-{part}.json" for part, run in runs.items() if not run]
    return (
        "\n".join(lines)
        + f"\n\nVote rule: majority, ties to the higher `{vote}`, then the lower agent index."
        + ("\n\n" + missing(*absent) if absent else "")
    )


def pooled(by_seed):
    """One protocol's per-seed summaries as one summary over every (seed, question) pair: the paired
    difference pooled over seeds."""
    return {
        "question_ids": [f"{seed}:{q}" for seed, s in by_seed.items() for q in s["question_ids"]],
        "correct": [ok for s in by_seed.values() for ok in s["correct"]],
    }


def mean(values):
    return sum(values) / len(values)


def seeds_table(name, parts, reference, seeds=(0, 1, 2), pictures=False):
    """Tables a and b: one row per protocol from tables/<name>-seed<k>-<part>.json: accuracy mean ± sample std
    over the seeds, cost, actions, and the paired difference to `reference`, pooled over the seeds both have.
    pictures: the cost/accuracy frontier and the action shares by round as PNGs."""
    runs = {
        part: {seed: summary_of(load(f"tables/{name}-seed{seed}-{part}.json")) for seed in seeds}
        for part in parts
    }
    runs = {part: {seed: s for seed, s in by_seed.items() if s} for part, by_seed in runs.items()}
    absent = [
        f"tables/{name}-seed{seed}-{part}.json"
        for part in parts
        for seed in seeds
        if seed not in runs[part]
    ]
    runs = {part: by_seed for part, by_seed in runs.items() if by_seed}
    if not runs:
        return missing(*absent)
    theirs = runs.get(reference, {})
    lines = [
        "| protocol | seeds | accuracy, mean ± sample std | tokens/q | calls/q | actions p/r/c | "
        f"vs {reference}, pooled over the seeds both have [95% CI] (disagree) |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, by_seed in runs.items():
        accuracy = [s["accuracy"] for s in by_seed.values()]
        actions = (
            "/".join(
                f"{mean([s['actions'][k] for s in by_seed.values()]):.2f}"
                for k in ("persist", "refine", "concede")
            )
            if "actions" in next(iter(by_seed.values()))
            else ""
        )
        shared = [seed for seed in by_seed if seed in theirs]
        paired = (
            format_paired(
                paired_difference(
                    pooled({k: by_seed[k] for k in shared}), pooled({k: theirs[k] for k in shared})
                )
            )
            if shared and part != reference
            else ""
        )
        spread = (
            f"{sample_std(accuracy):.3f}" if len(accuracy) > 1 else "–"
        )  # one seed has no spread
        lines.append(
            f"| {part} | {len(by_seed)} | {mean(accuracy):.3f} ± {spread} | "
            f"{mean([s['tokens_per_question'] for s in by_seed.values()]):.0f} | "
            f"{mean([s['calls_per_question'] for s in by_seed.values()]):.1f} | {actions} | {paired} |"
        )
    text = "\n".join(lines)
    if pictures:
        text += "\n\n" + pictures_of(name, runs)
    return text + ("\n\n" + missing(*absent) if absent else "")


def pictures_of(name, runs):
    """Tables a and b's PNGs: the cost/accuracy frontier, and the action shares by round of the game's protocols
    that decide (not the fixed persist and debate)."""
    frontier = RESULTS / "tables" / f"{name}-frontier.png"
    if not plots.frontier(runs, f"cost and accuracy: {name}", frontier):
        return NO_PNG
    text = f"![frontier](results/tables/{frontier.name})"
    deciding = {
        part: by_seed
        for part, by_seed in runs.items()
        if "actions_by_round" in next(iter(by_seed.values())) and part not in ("persist", "debate")
    }
    actions = RESULTS / "tables" / f"{name}-actions.png"
    if deciding and plots.actions_by_round(deciding, actions):
        text += f" ![actions by round](results/tables/{actions.name})"
    return text


def reward_scale_table(algos=("softrank", "grpo"), variants=("x0.1", "x1", "x10", "exp")):
    """Table c: validation accuracy over the steps of SoftRankPO and GRPO under scaled and transformed rewards
    (results/training/arith-seed0-<algo>-<variant>.metrics.jsonl), as numbers and a PNG."""
    curves = {}
    for algo in algos:
        for variant in variants:
            path = RESULTS / "training" / f"arith-seed0-{algo}-{variant}.metrics.jsonl"
            if path.exists():
                curves[algo, variant] = read_metrics(path)[0]
    absent = [
        f"training/arith-seed0-{a}-{v}.metrics.jsonl"
        for a in algos
        for v in variants
        if (a, v) not in curves
    ]
    if not curves:
        return missing(*absent)
    lines = [
        "| algorithm | rewards | validation accuracy at steps (evenly spaced tenth of the evaluations) | mean of the second half "
        "| last | final weights: max \\|Δw\\| vs × 1 |",
        "|---|---|---|---|---|---|",
    ]
    for (algo, variant), points in curves.items():
        shown = points[:: max(1, len(points) // 10)]  # the PNG has every evaluation
        shown += points[-1:] if shown[-1] != points[-1] else []
        half = [a for _, a in points[len(points) // 2 :]]
        lines.append(
            f"| {algo} | {variant} | "
            + ", ".join(f"{step}: {a:.2f}" for step, a in shown)
            + f" | {mean(half):.3f} | {points[-1][1]:.3f} | {weight_gap(algo, variant)} |"
        )
    if plots.reward_scale(curves, algos, RESULTS / "training" / "reward-scale.png"):
        lines.append("\n![reward scale](results/training/reward-scale.png)")
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def weight_gap(algo, variant):
    """Max |w - w_x1| between a reward variant's final policy and its algorithm's unscaled one: 0 means the
    variant did not change training at all (what a rank-based advantage promises for increasing maps)."""
    paths = [RESULTS / "policies" / f"arith-seed0-{algo}-{v}.pt" for v in (variant, "x1")]
    if not all(path.exists() for path in paths):
        return "–"
    import torch

    mine, reference = (
        torch.load(path, map_location="cpu", weights_only=False)["state_dict"] for path in paths
    )
    return f"{max((mine[k] - reference[k]).abs().max().item() for k in reference):.1e}"


def scaling_table(settings, protocols=("persist", "softrank", "debate")):
    """Table d: the team's vote, the seed-0 SoftRankPO policy and debate with each (agents, rounds) on the same
    300 questions (tables/scaling-a<agents>-r<rounds>-<protocol>.json), the policy paired with the vote."""
    lines = [
        "| agents | rounds | "
        + " | ".join(f"{p}: accuracy (tokens/q)" for p in protocols)
        + " | softrank vs persist [95% CI] (disagree) |",
        "|---|---|" + "---|" * (len(protocols) + 1),
    ]
    absent = []
    for agents, rounds in settings:
        found = {
            p: summary_of(load(f"tables/scaling-a{agents}-r{rounds}-{p}.json")) for p in protocols
        }
        # debate runs with 3 agents only (experiments/run.py scaling_protocols)
        absent += [
            f"tables/scaling-a{agents}-r{rounds}-{p}.json"
            for p, s in found.items()
            if not s and (p != "debate" or agents == 3)
        ]
        if not any(found.values()):
            continue
        cells = [
            f"{s['accuracy']:.3f} ({s['tokens_per_question']:.0f})" if s else "–"
            for s in found.values()
        ]
        paired = (
            format_paired(paired_difference(found["softrank"], found["persist"]))
            if found.get("softrank") and found.get("persist")
            else ""
        )
        lines.append(f"| {agents} | {rounds} | " + " | ".join(cells) + f" | {paired} |")
    if len(lines) == 2:
        return missing(*absent)
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def corpus_table(names):
    rows = {name: load(f"training/{name}.json") for name in names}
    if not all(rows.values()):
        return missing(*(f"training/{n}.json" for n, r in rows.items() if not r))
    lines = [
        "| run | states | all-equal rewards | ≥ 3 distinct rewards | policy actions on the corpus p/r/c | "
        "objective at the end / its minimum | validation accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, summary in rows.items():
        corpus = summary.get("corpus", {})
        actions = summary.get("policy_actions_on_corpus") or summary.get("policy_distribution", {})
        lines.append(
            f"| {name} | {corpus.get('states', summary.get('states'))} | {fmt(corpus.get('frac_zero_std'))} | "
            f"{fmt(corpus.get('frac_multi_valued'))} | "
            + "/".join(f"{actions.get(k, 0):.2f}" for k in ("persist", "refine", "concede"))
            + f" | {fmt(summary.get('objective_on_corpus'))} / {fmt(summary.get('objective_minimum'))}"
            + f" | {fmt(summary.get('val_accuracy'))} |"
        )
    curves = [loss_curve(name) for name in names if "objective_minimum" in rows[name]]
    return "\n".join(lines) + (
        "\n\nTraining loss, mean over each tenth of the steps:\n\n" + "\n".join(curves)
        if curves
        else ""
    )


def loss_curve(name, parts=10):
    """One line: the training loss averaged over each tenth of a run's steps (does it level off?)."""
    path = RESULTS / "training" / f"{name}.metrics.jsonl"
    losses = [
        row["loss"] for row in map(json.loads, path.read_text().splitlines()) if "loss" in row
    ]
    size = max(1, len(losses) // parts)
    means = [
        sum(losses[k : k + size]) / len(losses[k : k + size]) for k in range(0, size * parts, size)
    ]
    return f"- {name} ({len(losses)} steps): " + ", ".join(f"{m:+.3f}" for m in means)


def bench_table():
    """The engine against HF generate: --bench generate and --bench round, one row each; --bench slots in a note."""
    gen, rnd, slots = (
        load("bench/generate.json"),
        load("bench/round.json"),
        load("bench/slots.json"),
    )
    if not gen and not rnd:
        return missing("bench/generate.json", "bench/round.json")
    lines = [
        "| benchmark | HF generate tok/s | engine fp32 tok/s | ratio | outputs match | roofline (fp32) |",
        "|---|---|---|---|---|---|",
    ]
    if gen:
        lines.append(
            f"| generate: {gen['prompts']} fixed prompts, 128 tokens | {gen['hf_tok_s']:.1f} | "
            f"{gen['engine_float32_tok_s']:.1f} | {gen['ratio_fp32']:.2f} | {gen['outputs_match']} "
            f"({gen['rows_matching']}/{gen['prompts']}) | {gen['roofline_frac_fp32']:.2f} |"
        )
    if rnd:
        lines.append(
            f"| round: {rnd['questions']} questions × {rnd['agents']} agents, round 0 + REFINE "
            f"({rnd['generations']} generations; engine {rnd.get('engine_slots', 64)} slots, HF batches of "
            f"{rnd.get('hf_batch_size', 64)}) | {rnd['hf_tok_s']:.1f} | {rnd['engine_tok_s']:.1f} | "
            f"{rnd['ratio']:.2f} | {rnd['outputs_match']} ({rnd['rows_matching']}/{rnd['generations']}) | "
            f"{rnd['roofline_frac']:.2f} |"
        )
    notes = [
        f"`generate`: each side's fastest of {gen.get('repeats', 1)} alternating turns (all, tok/s: "
        + "; ".join(f"{side} {turns}" for side, turns in gen.get("all_tok_s", {}).items())
        + "). "
        f"int8 engine (lossy, not the default): {gen['engine_int8_tok_s']:.1f} tok/s; {gen['machine']}."
        if gen
        else "",
        f"The fp32 engine's fastest turn spent {gen['engine_float32_prefill_share']:.0%} of its time prefilling "
        f"the prompts ({gen['engine_float32_prompt_tokens_run']} prompt tokens run, {gen['generated_tokens']} "
        "generated)."
        if gen and "engine_float32_prefill_share" in gen
        else "",
        f"Round wall time: HF {rnd['hf_s']:.0f} s, engine {rnd['engine_s']:.0f} s." if rnd else "",
        "The engine's own batch size (`--bench slots`, {prompts} prompts, greedy): {sizes}; {ratio:.2f}x, "
        "outputs identical: {outputs_match}.".format(
            **slots,
            sizes=", ".join(
                f"{size} slots {tok_s:.1f} tok/s" for size, tok_s in slots["tok_s"].items()
            ),
        )
        if slots
        else "",
        missing(*(f"bench/{n}.json" for n, r in (("generate", gen), ("round", rnd)) if not r))
        if not (gen and rnd)
        else "",
    ]
    return "\n".join(lines) + "\n\n" + " ".join(n for n in notes if n)


def profile_table():
    """One decode step at batch 64 before (the static-batch engine) and after, by bucket."""
    run = load("bench/profile.json")
    if run is None:
        return missing("bench/profile.json")
    before, after = run["before"], run["after"]
    buckets = list(dict.fromkeys([*before["buckets_ms"], *after["buckets_ms"]]))
    lines = [
        f"| one decode step, {run['rows']} rows, T = {run['temperature']} | before (ms) | after (ms) |",
        "|---|---|---|",
    ]
    lines += [
        f"| {b} | {before['buckets_ms'].get(b, 0):.1f} | {after['buckets_ms'].get(b, 0):.1f} |"
        for b in buckets
    ]
    lines.append(
        f"| **whole step** | **{before['decode_step_ms']:.1f}** | **{after['decode_step_ms']:.1f}** |"
    )
    lines.append(f"| tokens/s | {before['tokens_per_s']:.0f} | {after['tokens_per_s']:.0f} |")
    lines.append(
        f"\nBefore: engine.py at `{run['before_rev']}`; each the fastest of {run['repeats']} alternating "
        f"turns (all: before {before['all_step_ms']} ms, after {after['all_step_ms']} ms); "
        f"{run['mean_prompt_tokens']:.0f} prompt tokens per row; {run['machine']}."
    )
    onednn = load("bench/profile-onednn.json")
    if (
        onednn
    ):  # the oneDNN Linear layers alone: the engine just before them against the engine with them
        b, a = onednn["before"], onednn["after"]
        lines.append(
            f"\nThe oneDNN Linear layers alone (`profile-onednn`, engine.py at `{onednn['before_rev']}` against "
            f"this one, the same way): whole step {b['decode_step_ms']:.1f} → {a['decode_step_ms']:.1f} ms "
            f"({onednn['speedup']:.2f}×; all turns {b['all_step_ms']} and {a['all_step_ms']} ms); LM head "
            f"{b['buckets_ms']['LM head']:.1f} → {a['buckets_ms']['LM head']:.1f} ms, the body's matmuls "
            f"{b['buckets_ms']['matmuls (transformer body)']:.1f} → "
            f"{a['buckets_ms']['matmuls (transformer body)']:.1f} ms (each bucket from one profiled turn: "
            "noisier than the whole step)."
        )
    return "\n".join(lines)


def temperature_table():
    """Issue 18's study: the agents' sampling temperature, on validation questions."""
    greedy = load("study/temperature-greedy.json")
    runs = {t: load(f"study/temperature-T{t}.json") for t in ("0.3", "0.5", "0.7", "1.0")}
    done = {t: r["mpdf-persist"] for t, r in runs.items() if r}
    lines = [
        "| agents' temperature | one agent right (round 0) | the team's vote | some agent right | tokens/q "
        "| vote vs one greedy answer [95% CI] (disagree) |",
        "|---|---|---|---|---|---|",
    ]
    if greedy:
        v = greedy["vanilla"]
        lines.append(
            f"| one greedy answer (vanilla) | {fmt(v['accuracy'])} | – | – | {v['tokens_per_question']:.0f} "
            "| |"
        )
    for t, r in done.items():
        paired = format_paired(paired_difference(r, greedy["vanilla"])) if greedy else ""
        lines.append(
            f"| {t} | {fmt(r['agent_accuracy_round0'])} | {fmt(r['accuracy'])} ± {fmt(r['stderr'])} | "
            f"{fmt(r.get('any_agent_right_round0'))} | {r['tokens_per_question']:.0f} | {paired} |"
        )
    first = greedy or next(iter(runs.values()), None) or {}
    note = (
        f"\n\n{first['vanilla' if greedy else 'mpdf-persist']['n']} validation questions (arith, `--split val`, "
        f"seed 0), 3 agents; {first.get('machine', '')}"
        if first
        else ""
    )
    absent = ([] if greedy else ["study/temperature-greedy.json"]) + [
        f"study/temperature-T{t}.json" for t, r in runs.items() if not r
    ]
    return "\n".join(lines) + note + ("\n\n" + missing(*absent) if absent else "")


STUDY_FIXED = {
    "one greedy answer (vanilla)": ("temperature-greedy", "vanilla"),
    "the team's vote (persist)": ("temperature-T0.5", "mpdf-persist"),
    "debate": ("baseline-debate", "debate"),
    "self-consistency (sc)": ("baseline-sc", "sc"),
}
STUDY_POLICIES = [
    "sft",
    "softrank",
    "grpo",
    "eq4",
    "tau0.2",
    "tau0.8",
    "beta0.01",
    "beta0.5",
    "lam0",
    "lam0.1",
    "cost0.5",
    "cost2",
    "q32",
    "q64",
    "iter3",
    "sft-paper",
    "softrank-paper",
    "sft-confidence",
    "softrank-confidence",
    "combo",
    "defaults",
]


def study_table():
    """Issue 18's study, the policy levers: every fixed protocol and every study policy on the same 200 validation
    questions at T = 0.5, each paired against the strongest fixed protocol there."""
    fixed = {
        label: summary_of(load(f"study/{name}.json"), protocol)
        for label, (name, protocol) in STUDY_FIXED.items()
    }
    fixed = {label: s for label, s in fixed.items() if s}
    learned = {name: summary_of(load(f"study/policy-{name}.json")) for name in STUDY_POLICIES}
    learned = {name: s for name, s in learned.items() if s}
    if not fixed and not learned:
        return missing("study/baseline-debate.json", "study/policy-softrank.json")
    best = max(fixed, key=lambda label: fixed[label]["accuracy"]) if fixed else None
    lines = [
        "| protocol or policy (`study-<name>`) | accuracy ± s.e. | tokens/q | calls/q | vote after rounds | "
        f"actions p/r/c | training states, all-equal rewards | vs {best or 'the strongest fixed'} [95% CI] "
        "(disagree) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, s in [*fixed.items(), *learned.items()]:
        corpus = (
            (load(f"training/study-{label}.json") or {}).get("corpus") if label in learned else None
        )
        states = f"{corpus['states']}, {fmt(corpus.get('frac_zero_std'), 2)}" if corpus else ""
        paired = format_paired(paired_difference(s, fixed[best])) if best and label != best else ""
        lines.append(f"| {label} | {protocol_cells(s)} | {states} | {paired} |")
    absent = [
        f"study/{name}.json" for label, (name, _) in STUDY_FIXED.items() if label not in fixed
    ] + [f"study/policy-{name}.json" for name in STUDY_POLICIES if name not in learned]
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def read_metrics(path):
    """(validation points [(step, accuracy)], training records) of one LLM run's metrics.jsonl."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return (
        [(r["step"], r["val_accuracy"]) for r in records if "val_accuracy" in r],
        [r for r in records if "mean_reward" in r],
    )


def llm_curves(prefix, title):
    """Issue 19: the runs results/llm/<prefix>-seed*.metrics.jsonl, their held-out accuracy before and after,
    their reward, flat-group share, wall time and tokens, and a PNG of the curves."""
    paths = sorted((RESULTS / "llm").glob(f"{prefix}-seed*.metrics.jsonl"))
    if not paths:
        return missing(f"llm/{prefix}-seed0.metrics.jsonl")
    runs = {path.name.split(".")[0]: read_metrics(path) for path in paths}
    lines = [
        f"| {title} | held-out accuracy at steps | before → after | mean reward, first → last quarter of "
        "the steps | flat groups | wall time of the steps | tokens trained |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (val, train) in runs.items():
        quarter = max(1, len(train) // 4)
        reward = [
            sum(r["mean_reward"] for r in part) / len(part)
            for part in (train[:quarter], train[-quarter:])
        ]
        flat = sum(r["frac_zero_std"] for r in train) / len(train)
        curve = ", ".join(f"{step}: {accuracy:.2f}" for step, accuracy in val)
        minutes, tokens = sum(r["step_s"] for r in train) / 60, sum(r["tokens"] for r in train)
        lines.append(
            f"| {name} | {curve} | {val[0][1]:.3f} → {val[-1][1]:.3f} | {reward[0]:.3f} → "
            f"{reward[1]:.3f} | {flat:.2f} | {minutes:.0f} min | {tokens:.0f} |"
        )
    if len(runs) > 1:
        gains = [val[-1][1] - val[0][1] for val, _ in runs.values()]
        lines.append(
            f"\nGain in held-out accuracy over {len(runs)} seeds: {sum(gains) / len(gains):+.3f} "
            f"(sample std {sample_std(gains):.3f})."
        )
        by_step = {}
        for val, _ in runs.values():
            for step, accuracy in val:
                by_step.setdefault(step, []).append(accuracy)
        lines.append(
            "Held-out accuracy, mean ± sample std over the seeds, by step: "
            + ", ".join(
                f"{step}: {sum(a) / len(a):.3f} ± {sample_std(a):.3f}"
                for step, a in by_step.items()
            )
            + "."
        )
    png = f"llm/{prefix}.png"
    return (
        "\n".join(lines)
        + "\n\n"
        + (f"![curves](results/{png})" if plots.training_curves(runs, RESULTS / png) else NO_PNG)
    )


def summary_of(run, protocol=None):
    """One protocol's summary in an eval.py JSON; protocol None: its first (a file of one protocol)."""
    if run is None:
        return None
    return (
        run.get(protocol)
        if protocol
        else next(s for s in run.values() if isinstance(s, dict) and "accuracy" in s)
    )


def after_table(seeds=(0, 1, 2)):
    """Issue 19 after training: each trained run against the untrained model on the same 300 test questions
    (results/after/, experiments/run.py after-), the paired difference per seed and its mean over seeds."""
    untrained = {
        "parallel": load("after/untrained-parallel.json"),
        "debate": load("after/untrained-debate.json"),
        "leader": load("after/untrained-leader.json"),
    }
    comparisons = []  # (label, file of the trained run, its protocol, the reference: (file, protocol) or peers)
    for part, protocol, label in (
        ("parallel", "vanilla", "MAGRPO: one greedy answer"),
        ("parallel", "mpdf-persist", "MAGRPO: the parallel vote of 3 agents"),
        ("debate", "debate", "MAGRPO: debate, round 0 + one REFINE"),
    ):
        comparisons.append(
            (label, "magrpo-L1-seed{}-" + part, protocol, (untrained[part], protocol))
        )
    leader = None  # the leader's protocol names its weights' path: the file's one summary
    comparisons += [
        (
            "MLPO: trained leader vs its untrained peers' vote",
            "mlpo-L1-seed{}-leader",
            leader,
            "peers",
        ),
        (
            "MLPO: trained leader vs the untrained leader",
            "mlpo-L1-seed{}-leader",
            leader,
            (untrained["leader"], "leader=default"),
        ),
        (
            "MLPO: trained leader alone vs the untrained model alone",
            "mlpo-L1-seed{}-alone",
            "vanilla",
            (untrained["parallel"], "vanilla"),
        ),
    ]
    lines = [
        "| comparison (300 arith test questions) | seed | trained | untrained | trained − untrained [95% CI] "
        "(disagree) | tokens/q trained / untrained |",
        "|---|---|---|---|---|---|",
    ]
    for label, name, protocol, reference in comparisons:
        diffs = []
        for seed in seeds:
            mine = summary_of(load(f"after/{name.format(seed)}.json"), protocol)
            if reference == "peers":
                theirs = (
                    None
                    if mine is None
                    else {
                        "question_ids": mine["question_ids"],
                        "correct": mine["peer_vote_correct"],
                    }
                )
            else:
                theirs = summary_of(*reference)
            if mine is None or theirs is None:
                continue
            v = paired_difference(mine, theirs)
            diffs.append(v["diff"])
            tokens = f"{mine['tokens_per_question']:.0f} / " + (
                "(the same peers)"
                if reference == "peers"
                else f"{theirs['tokens_per_question']:.0f}"
            )
            their_accuracy = sum(theirs["correct"]) / len(theirs["correct"])
            lines.append(
                f"| {label} | {seed} | {mine['accuracy']:.3f} | {their_accuracy:.3f} | {format_paired(v)} "
                f"| {tokens} |"
            )
        if len(diffs) > 1:
            lines.append(
                f"| {label} | mean of {len(diffs)} | | | {sum(diffs) / len(diffs):+.3f} "
                f"(sample std {sample_std(diffs):.3f}) | |"
            )
    if len(lines) == 2:
        return missing("after/untrained-parallel.json", "after/magrpo-L1-seed0-parallel.json")
    return "\n".join(lines) + (
        "\n\nSettings: `experiments/run.py` AFTER_GAME (3 agents, the agents at T = 0.5, "
        "96 new tokens, seed-0 test questions for every run); leaders and single answers "
        "greedy."
    )


TABLES = {
    "study-temperature": temperature_table,
    "study-levers": study_table,
    "bench": bench_table,
    "profile": profile_table,
    "auroc": auroc_table,
    "table-arith200-demo": lambda: protocol_table(
        "arith200-demo-seed0",
        ["vanilla", "sc", "debate", "persist", "sft", "grpo", "softrank"],
        "softrank",
    ),
    "table-a": lambda: seeds_table(
        "arith300",
        ["vanilla", "cot", "sc", "debate", "persist", "sft", "ppo", "grpo", "softrank"],
        "softrank",
        pictures=True,
    ),
    "table-b": lambda: seeds_table(
        "mawps300",
        ["vanilla", "persist", "debate", "softrank-arith", "softrank-mawps"],
        "softrank-mawps",
    ),
    "table-c": reward_scale_table,
    "table-d": lambda: scaling_table(
        [(agents, 3) for agents in (2, 3, 4, 5)] + [(3, rounds) for rounds in (1, 2, 4, 5)]
    ),
    "llm-magrpo": lambda: llm_curves("magrpo-L1", "MAGRPO run"),
    "llm-mlpo": lambda: llm_curves("mlpo-L1", "MLPO run"),
    "llm-after": after_table,
    "corpus-arith-demo": lambda: corpus_table(
        ["arith-demo-sft", "arith-demo-grpo", "arith-demo-softrank", "arith-demo-softrank-long"]
    ),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--write", action="store_true", help="rewrite the report blocks of README.md"
    )
    args = parser.parse_args()
    tables = {name: make() for name, make in TABLES.items()}
    if not args.write:
        for name, text in tables.items():
            print(f"<!-- report:{name} -->\n{text}\n<!-- /report:{name} -->\n")
        return
    readme = (ROOT / "README.md").read_text()
    for name, text in tables.items():
        block = re.compile(
            rf"<!-- report:{re.escape(name)} -->.*?<!-- /report:{re.escape(name)} -->", re.S
        )
        if not block.search(readme):
            print(f"README.md has no block for {name!r}", file=sys.stderr)
            continue
        readme = block.sub(
            lambda _: f"<!-- report:{name} -->\n{text}\n<!-- /report:{name} -->", readme
        )
    (ROOT / "README.md").write_text(readme)


if __name__ == "__main__":
    main()
