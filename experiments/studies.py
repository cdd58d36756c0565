"""The studies' tables: the temperature and lever studies, the LLM-level curves and the trained LLMs
against the untrained one; each from the committed files in results/."""

import re

from experiments import plots, tables, weights
from experiments.tables import (
    NO_PNG,
    fmt,
    load,
    mean,
    missing,
    protocol_cells,
    read_metrics,
    summary_of,
)
from stats import format_paired, paired_difference, sample_std


def temperature_table():
    """The study's first lever: the agents' sampling temperature, on validation questions."""
    greedy = load("study/temperature-greedy.json")
    runs = {t: load(f"study/temperature-T{t}.json") for t in ("0.3", "0.5", "0.7", "1.0")}
    done = {t: r["mpdf-persist"] for t, r in runs.items() if r}
    lines = [
        "| agents' temperature | one agent right (round 0) | the team's vote | some agent right | "
        "tokens/q | vote vs one greedy answer [95% CI] (disagree) |",
        "|---|---|---|---|---|---|",
    ]
    if greedy:
        v = greedy["vanilla"]
        lines.append(
            f"| one greedy answer (vanilla) | {fmt(v['accuracy'])} | – | – | "
            f"{v['tokens_per_question']:.0f} | |"
        )
    for t, r in done.items():
        paired = format_paired(paired_difference(r, greedy["vanilla"])) if greedy else ""
        lines.append(
            f"| {t} | {fmt(r['agent_accuracy_round0'])} | {fmt(r['accuracy'])} ± "
            f"{fmt(r['stderr'])} | {fmt(r.get('any_agent_right_round0'))} | "
            f"{r['tokens_per_question']:.0f} | {paired} |"
        )
    first = greedy or next(iter(runs.values()), None) or {}
    note = (
        f"\n\n{first['vanilla' if greedy else 'mpdf-persist']['n']} validation questions (arith, "
        f"`--split val`, seed 0), 3 agents; {first.get('machine', '')}"
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
    """The study's policy levers: every fixed protocol and every study policy on the same
    200 validation questions at T = 0.5, each paired against the strongest fixed protocol there."""
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
        "| protocol or policy (`study-<name>`) | accuracy ± s.e. | tokens/q | calls/q | "
        "vote after rounds | actions p/r/c | training states, all-equal rewards | "
        f"vs {best or 'the strongest fixed'} [95% CI] (disagree) |",
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


def llm_curves(prefix, title):
    """LLM-weight learning curves: the runs results/llm/<prefix>-seed*.metrics.jsonl, their held-out
    accuracy before and after, their reward, flat-group share, wall time and tokens, and a PNG of
    the curves."""
    paths = sorted((tables.RESULTS / "llm").glob(f"{prefix}*-seed*.metrics.jsonl"))
    if not paths:
        return missing(f"llm/{prefix}-seed0.metrics.jsonl")
    runs = {path.name.split(".")[0]: read_metrics(path) for path in paths}
    lines = [
        f"| {title} | held-out accuracy at steps | before → after | mean reward, first → last "
        "quarter of the steps | flat groups | wall time of the steps | tokens trained |",
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
    # the seeds of one setting are pooled, never runs of different settings (a sweep's)
    settings = {}
    for name, (val, _) in runs.items():
        settings.setdefault(re.sub(r"-seed\d+$", "", name), []).append(val)
    for setting, curves in settings.items():
        if len(curves) < 2:
            continue
        named = f" ({setting})" if len(settings) > 1 else ""
        gains = [val[-1][1] - val[0][1] for val in curves]
        lines.append(
            f"\nGain in held-out accuracy{named} over {len(curves)} seeds: "
            f"{sum(gains) / len(gains):+.3f} (sample std {sample_std(gains):.3f})."
        )
        by_step = {}
        for val in curves:
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
        + (
            f"![curves](results/{png})"
            if plots.training_curves(runs, tables.RESULTS / png)
            else NO_PNG
        )
    )


def after_table(seeds=(0, 1, 2)):
    """The LLM weights after training: each trained run against the untrained model on the same 300
    test questions (results/after/, experiments/run.py after-), the paired difference per seed and
    its mean over seeds."""
    untrained = {
        "parallel": load("after/untrained-parallel.json"),
        "debate": load("after/untrained-debate.json"),
        "leader": load("after/untrained-leader.json"),
    }
    # (label, file of the trained run, its protocol, the reference: (file, protocol) or peers)
    comparisons = []
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
        "| comparison (300 arith test questions) | seed | trained | untrained | "
        "trained − untrained [95% CI] (disagree) | tokens/q trained / untrained |",
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
                f"| {label} | {seed} | {mine['accuracy']:.3f} | {their_accuracy:.3f} | "
                f"{format_paired(v)} | {tokens} |"
            )
        if len(diffs) > 1:
            lines.append(
                f"| {label} | mean of {len(diffs)} | | | {sum(diffs) / len(diffs):+.3f} "
                f"(sample std {sample_std(diffs):.3f}) | |"
            )
    if len(lines) == 2:
        return missing("after/untrained-parallel.json", "after/magrpo-L1-seed0-parallel.json")
    return "\n".join(lines) + (
        "\n\nSettings: `experiments/llm_pieces.py` AFTER_GAME (3 agents, the agents at T = 0.5, "
        "96 new tokens, seed-0 test questions for every run); leaders and single answers "
        "greedy."
    )


def lora_table():
    """MAGRPO with LoRA adapters against full fine-tuning (the sum runs) on the same 300
    test questions, paired, each adapter run against the full run of its seed where that one is
    evaluated, else seed 0's (results/after/); the mean over the seeds of each learning rate with
    its sample std; the bytes of each committed adapter (results/agents/); round 0 of a team of 3
    adapters in one engine (results/bench/team.json)."""
    untrained = summary_of(load("after/untrained-parallel.json"), "mpdf-persist")
    lines = [
        "| run (300 arith test questions, the parallel vote of 3 agents) | vote | − untrained "
        "[95% CI] | − full fine-tuning (sum) [95% CI] | tokens/q | adapter bytes |",
        "|---|---|---|---|---|---|",
    ]
    full = {}
    for path in sorted((tables.RESULTS / "after").glob("magrpo-sum-L1-seed*-parallel.json")):
        seed = int(re.search(r"seed(\d+)", path.name).group(1))
        full[seed] = summary_of(load(f"after/{path.name}"), "mpdf-persist")
        if full[seed]:
            cell = format_paired(paired_difference(full[seed], untrained)) if untrained else ""
            lines.append(f"| full fine-tuning (sum), seed {seed} | {full[seed]['accuracy']:.3f} | "
                         f"{cell} | | {full[seed]['tokens_per_question']:.0f} | |")  # fmt: skip
    votes = [f["accuracy"] for f in full.values() if f]
    if len(votes) > 1:
        lines.append(f"| full fine-tuning (sum), mean of {len(votes)} seeds | {mean(votes):.3f} "
                     f"(sample std {sample_std(votes):.3f}) | | | | |")  # fmt: skip
    by_lr, below_full = {}, {}
    for path in sorted((tables.RESULTS / "after").glob("magrpo-lora-lr*-parallel.json")):
        name = path.name.removesuffix("-parallel.json")
        lr, seed = re.search(r"lr([^-]+(?:-\d+)?)-L1-seed(\d+)", name).groups()
        seed = int(seed)
        mine = summary_of(load(f"after/{path.name}"), "mpdf-persist")
        if mine is None:
            continue
        size = weights.recorded(tables.RESULTS / "agents" / f"{name}.pt", "bytes")
        size = f"{size:,}" if size else ""
        reference_seed = seed if full.get(seed) else 0
        reference = full.get(reference_seed)
        cells = [
            format_paired(paired_difference(mine, other)) if other else ""
            for other in (untrained, reference)
        ]
        if reference and reference_seed != seed:
            cells[1] += f" (seed {reference_seed}'s)"
        elif reference:
            below_full.setdefault(lr, {})[seed] = mine, reference
        by_lr.setdefault(lr, []).append(mine["accuracy"])
        lines.append(
            f"| {name} | {mine['accuracy']:.3f} | {cells[0]} | {cells[1]} | "
            f"{mine['tokens_per_question']:.0f} | {size} |"
        )
    for lr, votes in by_lr.items():
        if len(votes) > 1:
            pairs = below_full.get(lr, {})
            gaps = [mine["accuracy"] - full["accuracy"] for mine, full in pairs.values()]
            both = [tables.pooled({k: v[j] for k, v in pairs.items()}) for j in (0, 1)]
            gap = (f"{mean(gaps):+.3f} (sample std {sample_std(gaps):.3f}, {len(gaps)} seeds "
                   f"paired with their own; pooled: {format_paired(paired_difference(*both))})"
                   if len(gaps) > 1 else "")  # fmt: skip
            lines.append(f"| lr {lr}, mean of {len(votes)} seeds | {mean(votes):.3f} "
                         f"(sample std {sample_std(votes):.3f}) | | {gap} | | |")  # fmt: skip
    if len(lines) == 2:  # no run evaluated yet
        lines = []
    costs = {}
    for kind in ("full", "lora"):
        path = tables.RESULTS / "llm" / f"cost-{kind}-L1.metrics.jsonl"
        if path.exists():
            train = read_metrics(path)[1][1:]  # the first step warms up
            costs[kind] = [sum(r[k] for r in train) / len(train) for k in ("step_s", "rollout_s")]
            costs[kind].append(max(r["peak_memory_mb"] for r in train))
    if costs:
        lines.append("\n| MAGRPO preset, steps 2-3 | s/step | rollouts s/step | update s/step | "
                     "peak memory MB |\n|---|---|---|---|---|")  # fmt: skip
        for kind, (step, rollout, memory) in costs.items():
            label = {"full": "full fine-tuning", "lora": "LoRA rank 4"}[kind]
            lines.append(f"| {label} | {step:.0f} | {rollout:.0f} | {step - rollout:.0f} | "
                         f"{memory:.0f} |")  # fmt: skip
    team = load("bench/team.json")
    if team:
        lines.append(
            f"\nRound 0 of {team['questions']} questions × {team['agents']} agents, each its own "
            f"adapter ({team['adapters']}), greedy, {team['max_new_tokens']} new tokens, on "
            f"{team['machine']}: one engine with per-row adapters {team['tok_s']['adapters']:.0f} "
            f"tokens/s, the plain homogeneous team {team['tok_s']['homogeneous']:.0f} (ratio "
            f"{team['ratio_adapters']:.2f}), one engine per merged model "
            f"{team['tok_s']['merged']:.0f} (ratio {team['ratio_merged']:.2f}); each side's "
            f"fastest of {len(team['all_tok_s']['adapters'])} alternating turns (all turns: "
            + "; ".join(f"{k} {v}" for k, v in team["all_tok_s"].items())
            + ")."
        )
    if not lines and not team:
        return missing("after/magrpo-lora-lr1e-4-L1-seed0-parallel.json", "bench/team.json")
    return "\n".join(lines).strip("\n")
