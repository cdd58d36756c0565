"""The full-size tables (a-d), the protocol and corpus tables, and the helpers every table uses:
each written from the committed files in results/ (experiments/report.py puts them in the
documents).

A table whose files are not all in results/ yet says which pieces are missing (experiments/run.py
makes them).
"""

import json
from pathlib import Path

from experiments import plots
from experiments.mutation_modules import mutated_source
from stats import format_paired, paired_difference, sample_std

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"

NO_PNG = "(no PNG: `pip install matplotlib`, then rerun `python -m experiments.report --write`)"


def load(path):
    path = RESULTS / path
    return json.loads(path.read_text()) if path.exists() else None


def missing(*paths):
    return (
        "*(not computed yet: "
        + ", ".join(f"`results/{p}`" for p in paths)
        + "; run `python -m experiments.run`)*"
    )


def seeds_text(n):
    """'1 seed', '3 seeds'."""
    return f"{n} seed{'s' if n != 1 else ''}"


def fmt(value, digits=3):
    return "–" if value is None else f"{value:.{digits}f}"


def mutation_table():
    """Every mutation run's counts and score (results/mutation/*.json, experiments/mutation.py),
    and whether the code it mutated is today's (a score measured on older code is stale)."""
    runs = sorted((RESULTS / "mutation").glob("*.json"))
    if not runs:
        return missing("mutation/MODULE.json")
    lines = [
        "| file | module | mutants | killed | timeouts | reviewed equivalent | survivors | score "
        "| finished | the code it mutated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in runs:
        r = json.loads(path.read_text())
        only = " (the functions named)" if r.get("only") else ""
        lines.append(
            f"| `{path.name}` | `{r['path']}`{only} | {r['mutants']} | {r['killed']} | "
            f"{r['timeouts']} | {r['equivalent_by_review']} | {r['survived']} | "
            f"{fmt(r['score'], 4)} | {r['finished']} | {code_since(r)} |"
        )
    return "\n".join(lines)


def code_since(run):
    """Whether a mutation run's code is today's: the hash it recorded against today's."""
    today = mutated_source(ROOT, run["path"], run.get("only") or ())
    recorded = run.get("mutated_source_sha256")
    if today is None:
        return "its file is gone"
    if not recorded:
        return "not recorded"
    return "today's" if recorded == today else "changed since"


def auroc_table():
    """Each confidence signal's AUROC on the untrained backbone's round-0 solutions (arith, mawps)
    and on the competent teams' (arith-team-worked, arith-team-varied: agents trained on worked
    solutions)."""
    tasks = ("arith", "mawps", "arith-team-worked", "arith-team-varied")
    found = {task: load(f"auroc/{task}.json") for task in tasks}
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
    """accuracy ± s.e. | tokens/q | calls/q | vote after rounds | actions p/r/c of one eval.py
    summary (the last two for the game's protocols only)."""
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
    """One row per protocol, each from its own file tables/<name>-<part>.json (eval.py's summary
    JSON), with its paired accuracy difference to the `reference` part on the same questions
    (stats.paired_difference)."""
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
    """Tables a and b: one row per protocol from tables/<name>-seed<k>-<part>.json: accuracy mean ±
    sample std over the seeds, cost, actions, and the paired difference to `reference`, pooled over
    the seeds both have. pictures: the cost/accuracy frontier and the action shares by round as
    PNGs."""
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
        paired = paired_over_seeds(by_seed, theirs) if part != reference else ""
        lines.append(
            f"| {part} | {len(by_seed)} | {accuracy_over_seeds(by_seed)} | "
            f"{mean([s['tokens_per_question'] for s in by_seed.values()]):.0f} | "
            f"{mean([s['calls_per_question'] for s in by_seed.values()]):.1f} | "
            f"{mean_actions(by_seed)} | {paired} |"
        )
    text = "\n".join(lines)
    if pictures:
        text += "\n\n" + pictures_of(name, runs)
    return text + ("\n\n" + missing(*absent) if absent else "")


def accuracy_over_seeds(by_seed):
    """A protocol's accuracy over its seeds: mean ± sample std (one seed has no spread: –)."""
    values = [s["accuracy"] for s in by_seed.values()]
    spread = f"{sample_std(values):.3f}" if len(values) > 1 else "–"
    return f"{mean(values):.3f} ± {spread}"


def mean_actions(by_seed):
    """persist/refine/concede shares, averaged over the seeds ("" for a protocol that never
    decides)."""
    if "actions" not in next(iter(by_seed.values())):
        return ""
    return "/".join(
        f"{mean([s['actions'][k] for s in by_seed.values()]):.2f}"
        for k in ("persist", "refine", "concede")
    )


def paired_over_seeds(mine, theirs):
    """The paired difference of two protocols pooled over the seeds both have ("" if none)."""
    shared = [seed for seed in mine if seed in theirs]
    if not shared:
        return ""
    return format_paired(
        paired_difference(
            pooled({k: mine[k] for k in shared}), pooled({k: theirs[k] for k in shared})
        )
    )


def pictures_of(name, runs):
    """Tables a and b's PNGs: the cost/accuracy frontier, and the action shares by round of the
    game's protocols that decide (not the fixed persist and debate)."""
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


REWARD_SCALE_ALGOS = ("softrank", "grpo")
REWARD_SCALE_VARIANTS = ("x0.1", "x1", "x10", "exp")


def reward_scale_policy(algo, variant):
    """A reward variant's final policy, under results/: the table reads its tensors."""
    return f"policies/arith-seed0-{algo}-{variant}.pt"


REWARD_SCALE_POLICIES = tuple(
    f"results/{reward_scale_policy(algo, variant)}"
    for algo in REWARD_SCALE_ALGOS
    for variant in REWARD_SCALE_VARIANTS
)


def reward_scale_table(algos=REWARD_SCALE_ALGOS, variants=REWARD_SCALE_VARIANTS):
    """Table c: validation accuracy over the steps of SoftRankPO and GRPO under scaled and
    transformed rewards (results/training/arith-seed0-<algo>-<variant>.metrics.jsonl), as numbers
    and a PNG."""
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
        "| algorithm | rewards | validation accuracy at steps (evenly spaced tenth of the "
        "evaluations) | mean of the second half | last | final weights: max \\|Δw\\| vs × 1 |",
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
    """Max |w - w_x1| between a reward variant's final policy and its algorithm's unscaled one: 0
    means the variant did not change training at all (what a rank-based advantage promises for
    increasing maps)."""
    paths = [RESULTS / reward_scale_policy(algo, v) for v in (variant, "x1")]
    if not all(path.exists() for path in paths):
        return "–"
    from common import load_file  # a policy file is read as plain data, never as code

    mine, reference = (load_file(path, "policy")["state_dict"] for path in paths)
    return f"{max((mine[k] - reference[k]).abs().max().item() for k in reference):.1e}"


def scaling_file(agents, rounds, protocol):
    return f"tables/scaling-a{agents}-r{rounds}-{protocol}.json"


def scaling_table(settings, protocols=("persist", "softrank", "debate"), file=scaling_file):
    """Table d: the team's vote, the seed-0 SoftRankPO policy and debate with each (agents, rounds)
    on the same 300 questions (file(agents, rounds, protocol): tables/scaling-a<agents>-r<rounds>-
    <protocol>.json), the policy paired with the vote."""
    lines = [
        "| agents | rounds | "
        + " | ".join(f"{p}: accuracy (tokens/q)" for p in protocols)
        + " | softrank vs persist [95% CI] (disagree) |",
        "|---|---|" + "---|" * (len(protocols) + 1),
    ]
    absent = []
    for agents, rounds in settings:
        found = {p: summary_of(load(file(agents, rounds, p))) for p in protocols}
        # debate runs with 3 agents only (experiments/run.py scaling_protocols)
        absent += [
            file(agents, rounds, p)
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
        "| run | states | all-equal rewards | ≥ 3 distinct rewards | "
        "policy actions on the corpus p/r/c | objective at the end / its minimum | "
        "validation accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, summary in rows.items():
        corpus = summary.get("corpus", {})
        actions = summary.get("policy_actions_on_corpus") or summary.get("policy_distribution", {})
        lines.append(
            f"| {name} | {corpus.get('states', summary.get('states'))} | "
            f"{fmt(corpus.get('frac_zero_std'))} | {fmt(corpus.get('frac_multi_valued'))} | "
            + "/".join(f"{actions.get(k, 0):.2f}" for k in ("persist", "refine", "concede"))
            + f" | {fmt(summary.get('objective_on_corpus'))} / "
            f"{fmt(summary.get('objective_minimum'))}" + f" | {fmt(summary.get('val_accuracy'))} |"
        )
    curves = [loss_curve(name) for name in names if "objective_minimum" in rows[name]]
    return "\n".join(lines) + (
        "\n\nTraining loss, mean over each tenth of the steps:\n\n" + "\n".join(curves)
        if curves
        else ""
    )


def loss_curve(name, parts=10):
    """One line: the training loss averaged over each tenth of a run's steps (does it level
    off?)."""
    path = RESULTS / "training" / f"{name}.metrics.jsonl"
    losses = [
        row["loss"] for row in map(json.loads, path.read_text().splitlines()) if "loss" in row
    ]
    size = max(1, len(losses) // parts)
    means = [
        sum(losses[k : k + size]) / len(losses[k : k + size]) for k in range(0, size * parts, size)
    ]
    return f"- {name} ({len(losses)} steps): " + ", ".join(f"{m:+.3f}" for m in means)


def by_seed(name, part, seeds=(0, 1, 2)):
    """{seed: summary} of one protocol of a full-size table (tables/<name>-seed<k>-<part>.json)."""
    found = {seed: summary_of(load(f"tables/{name}-seed{seed}-{part}.json")) for seed in seeds}
    return {seed: s for seed, s in found.items() if s}


def table_runs(prefix, parts, seeds=(0, 1, 2), plays=None):
    """{part: {seed: summary}} of the table files found (tables/<prefix>-seed<k>-<part>.json), the
    parts with none left out, and the files not there yet that a piece plays (plays(part, seed);
    None: every part on every seed)."""
    runs = {part: by_seed(prefix, part, seeds) for part in parts}
    absent = [
        f"tables/{prefix}-seed{seed}-{part}.json"
        for part in parts
        for seed in seeds
        if seed not in runs[part] and (plays is None or plays(part, seed))
    ]
    return {part: found for part, found in runs.items() if found}, absent


def summary_of(run, protocol=None):
    """One protocol's summary in an eval.py JSON; protocol None: its first (a file of one
    protocol)."""
    if run is None:
        return None
    return (
        run.get(protocol)
        if protocol
        else next(s for s in run.values() if isinstance(s, dict) and "accuracy" in s)
    )


def read_metrics(path):
    """(validation points [(step, accuracy)], training records) of one LLM run's metrics.jsonl."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return (
        [(r["step"], r["val_accuracy"]) for r in records if "val_accuracy" in r],
        [r for r in records if "mean_reward" in r],
    )
