"""The rules that decide when to talk against the learned policies, on the accuracy-token frontier
(experiments/rule_pieces.py): per team, every rule's and every policy's accuracy and tokens per
question over the seeds, the rules' Pareto frontier (a PNG), and each policy's paired difference to
the rule nearest its token cost and to every rule that spends at least its tokens, pooled over the
seeds' questions."""

import math
from collections import Counter

from experiments import plots
from experiments.blind_slices import SLICE_HEAD, SLICES, slice_cells, slice_figures
from experiments.onpolicy_pieces import AGAIN, onpolicy_part
from experiments.split_pieces import plays
from experiments.tables import RESULTS, load, mean, missing, seeds_text, table_runs
from stats import format_paired, paired_difference, pooled, sample_std

SEEDS = (0, 1, 2)
# table name -> what the row says; the vote is round 0's, debate's 3 rounds the tables' own
RULE_ROWS = {
    "persist": "the vote (round 0)",
    "debate1": "debate, 1 round",
    "debate2": "debate, 2 rounds",
    "debate": "debate, 3 rounds",
    "freeze": "freeze: REFINE unless unanimous",
    "minority": "minority: REFINE off the vote",
    "gate": "gate: debate above a vote entropy",
    "trigger": "trigger: a logistic regression on round 0",
}


def pareto(points):
    """The names of `points` ({name: (tokens, accuracy)}) no other point dominates: none spends no
    more tokens and is at least as accurate, one of the two strictly."""
    return [
        name
        for name, (tokens, accuracy) in points.items()
        if not any(
            t <= tokens and a >= accuracy and (t, a) != (tokens, accuracy)
            for other, (t, a) in points.items()
            if other != name
        )
    ]


def point(runs):
    """(tokens per question, accuracy), each a mean over the seeds."""
    return (
        mean([s["tokens_per_question"] for s in runs.values()]),
        mean([s["accuracy"] for s in runs.values()]),
    )


def against(mine, theirs):
    """The paired difference of two protocols over the seeds both have, pooled by question."""
    seeds = sorted(set(mine) & set(theirs))
    return paired_difference(
        pooled({s: mine[s] for s in seeds}), pooled({s: theirs[s] for s in seeds})
    )


def accuracy_text(runs):
    """The mean accuracy over the seeds and their sample std (none from a single seed)."""
    accuracy = [s["accuracy"] for s in runs.values()]
    spread = f"± {sample_std(accuracy):.3f}" if len(accuracy) > 1 else "one seed"
    return f"{mean(accuracy):.3f} ({spread})"


def nearest(tokens, rules):
    """The rule whose tokens per question are nearest `tokens` on a log scale."""
    return min(rules, key=lambda name: abs(math.log(rules[name][0] / tokens)))


def learned(names):
    """The rows of the learned policies of these table names."""
    return {name: f"learned policy: {name}" for name in names}


def frontier_table(prefix, policies, extra=None):
    """One team's frontier (tables/<prefix>-seed<k>-<part>.json): a row per rule and per learned
    policy (`policies`: table name -> what the row says) and `extra` rows (the oracle), and a PNG
    of every point."""
    parts = {**RULE_ROWS, **policies, **(extra or {})}
    runs, absent = table_runs(prefix, parts, SEEDS, plays)
    present = [part for part in RULE_ROWS if part in runs]
    if not present:
        return missing(*absent)
    rules = {part: point(runs[part]) for part in present}
    # the frontier compares the rules on the seeds every one of them has, not on means over others
    shared = sorted(set.intersection(*(set(runs[part]) for part in present)))
    front = pareto({p: point({s: runs[p][s] for s in shared}) for p in present}) if shared else []
    on_seeds = ", ".join(map(str, shared)) or "none shared"
    lines = [
        "| protocol | seeds | accuracy (± sample std) | tokens per question | on the rules' "
        f"frontier (seeds {on_seeds}) | against the rule nearest its tokens, pooled [95% CI] "
        "(disagree) | against the least accurate rule at ≥ its tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, label in parts.items():
        if part not in runs:
            continue
        tokens, _ = point(runs[part])
        near = at_least = ""
        if part in policies:
            rule = nearest(tokens, rules)
            near = f"{rule}: {format_paired(against(runs[part], runs[rule]))}"
            costlier = [r for r, (t, _) in rules.items() if t >= tokens]
            if costlier:
                worst = min(costlier, key=lambda r: against(runs[part], runs[r])["diff"])
                at_least = f"{worst}: {format_paired(against(runs[part], runs[worst]))}"
        on = "yes" if part in front else ("" if part not in RULE_ROWS else "no")
        lines.append(
            f"| {label} (`{part}`) | {len(runs[part])} | {accuracy_text(runs[part])} | "
            f"{tokens:.0f} | {on} | {near} | {at_least} |"
        )
    png = RESULTS / "rules" / f"{prefix}-frontier.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    title = f"{prefix}: rules and learned policies ({seeds_text(len(SEEDS))})"
    if plots.frontier(runs, title, png, front):
        lines.append(f"\n![{prefix} frontier](results/rules/{png.name})")
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def refine_share(by_seed, part=None):
    """The REFINE share of a policy's decisions, averaged over the seeds: of all its questions, or
    of one part's (split, shared)."""
    return mean([(s["parts"][part] if part else s)["actions"]["refine"] for s in by_seed.values()])


def onpolicy_table(prefix, algo, again=AGAIN):
    """A policy by how often its corpus was collected again from its own games (tables/<prefix>-
    seed<k>-<algo>-onpolicy<n>.json; 0: the committed stage 2, one corpus of the SFT policy's
    games): accuracy, tokens, REFINE shares, each paired with the stage 2 it starts from and with
    debate."""
    parts = {algo: 0, **{onpolicy_part(algo, n): n for n in again}}
    runs, absent = table_runs(prefix, [*parts, "debate"], SEEDS, plays)
    if algo not in runs or "debate" not in runs:
        return missing(*absent)
    lines = [
        "| corpora collected again | seeds | accuracy (± sample std) | tokens per question | "
        "REFINE share: all / split / shared questions | against stage 2, pooled [95% CI] "
        "(disagree) | against debate |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, n in parts.items():
        if part not in runs:
            continue
        tokens, _ = point(runs[part])
        shares = " / ".join(f"{refine_share(runs[part], p):.2f}" for p in (None, "split", "shared"))
        stage2 = "" if n == 0 else format_paired(against(runs[part], runs[algo]))
        lines.append(
            f"| {n} (`{part}`) | {len(runs[part])} | {accuracy_text(runs[part])} | "
            f"{tokens:.0f} | {shares} | {stage2} | "
            f"{format_paired(against(runs[part], runs['debate']))} |"
        )
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def losses_table(prefix, algo, rule, seeds=SEEDS):
    """Where a learned policy and a rule part (rules/losses-<prefix>-seed<k>-<algo>-<rule>.json),
    pooled over `seeds`: per round-0 class, the questions, how often each alone is right, the
    round-1 actions of each where the rule alone is right, and where either alone is right, the
    first round the two act apart (pooled over the seeds whose files count it)."""
    names = [f"rules/losses-{prefix}-seed{seed}-{algo}-{rule}.json" for seed in seeds]
    found = [load(name) for name in names]
    absent = [name for name, f in zip(names, found) if f is None]
    if len(absent) == len(names):
        return missing(*absent)
    apart_seeds = [
        seed for seed, f in zip(seeds, found) if f and "rule_only_apart" in f["classes"][0]
    ]
    totals = {"questions": 0, "policy": 0, "rule": 0}
    counts = ("policy_actions", "rule_actions", "policy_apart", "rule_apart")
    pooled_classes = {}
    for seed, compared in zip(seeds, found):
        for row in compared["classes"] if compared else []:
            key = (row["split"], row["vote"], row["facts"])
            into = pooled_classes.setdefault(key, {**totals, **{c: Counter() for c in counts}})
            into["questions"] += row["questions"]
            into["policy"] += row["policy_only_right"]
            into["rule"] += row["rule_only_right"]
            for who in ("policy", "rule"):
                into[f"{who}_actions"] += Counter(row[f"{who}_actions_where_rule_only"])
                if seed in apart_seeds:
                    into[f"{who}_apart"] += Counter(row[f"{who}_only_apart"])
    seeds = ", ".join(map(str, apart_seeds)) or "none"
    lines = [
        f"| round-0 state: answers, vote, facts | questions | {algo} alone right | {rule} alone "
        f"right | round-1 actions where {rule} alone is right: {algo} / {rule} (p/r/c) | first "
        f"round they act apart, where {algo} / {rule} alone is right (seeds {seeds}) |",
        "|---|---|---|---|---|---|",
    ]
    order = sorted(pooled_classes.items(), key=lambda kv: kv[1]["policy"] - kv[1]["rule"])
    for key, row in order:
        actions = " / ".join(
            "/".join(str(row[f"{who}_actions"].get(k, 0)) for k in ("persist", "refine", "concede"))
            for who in ("policy", "rule")
        )
        rounds = sorted(set(row["policy_apart"]) | set(row["rule_apart"]))
        # first_apart's 0: the two acted alike in every round
        labels = {t: "never" if t == "0" else f"round {t}" for t in rounds}
        apart = ", ".join(
            f"{labels[t]}: {row['policy_apart'][t]}/{row['rule_apart'][t]}" for t in rounds
        )
        lines.append(
            f"| {', '.join(key)} | {row['questions']} | {row['policy']} | {row['rule']} | "
            f"{actions if row['rule'] else ''} | {apart} |"
        )
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def rules_target_table(prefix, policies, debate_budget=None):
    """The target against the rules, policy by policy, on the seeds every rule has: at least as
    accurate as every rule that spends no fewer tokens (the paired difference ≥ 0 against each);
    with `debate_budget`, also at least as accurate as debate on at most that share of its tokens,
    and the aim beyond: +0.03 over debate, the interval above 0."""
    runs, absent = table_runs(prefix, [*RULE_ROWS, *policies], SEEDS, plays)
    complete = [s for s in SEEDS if all(s in runs.get(part, {}) for part in RULE_ROWS)]
    if not complete:
        return missing(*absent)
    rules = {part: {s: runs[part][s] for s in complete} for part in RULE_ROWS}
    debate_tokens = point(rules["debate"])[0]
    on = ", ".join(map(str, complete))
    columns = [
        f"policy (seeds {on})",
        "tokens (share of debate's)",
        "the worst against a rule at ≥ its tokens",
    ]
    if debate_budget is not None:
        columns += [f"against debate (at ≤ {debate_budget:.0%} of its tokens)", "aim: ≥ +0.03, > 0"]
    columns.append("conditions")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name in policies:
        played = {s: runs.get(name, {}).get(s) for s in complete}
        if not all(played.values()):
            continue
        tokens = point(played)[0]
        costlier = [r for r in RULE_ROWS if point(rules[r])[0] >= tokens]
        diffs = {r: against(played, rules[r]) for r in costlier}
        worst = min(diffs, key=lambda r: diffs[r]["diff"]) if diffs else None
        held = {"rules": all(d["diff"] >= 0 for d in diffs.values())}
        cells = [
            f"`{name}`",
            f"{tokens:.0f} ({tokens / debate_tokens:.0%})",
            f"{worst}: {format_paired(diffs[worst])}" if worst else "no rule spends more",
        ]
        if debate_budget is not None:
            versus = diffs.get("debate") or against(played, rules["debate"])
            held["debate"] = versus["diff"] >= 0 and tokens <= debate_budget * debate_tokens
            held["aim"] = held["debate"] and versus["diff"] >= 0.03 and versus["ci95"][0] > 0
            cells += [format_paired(versus), "yes" if held["aim"] else "no"]
        held[f"{len(SEEDS)} seeds"] = len(complete) == len(SEEDS)
        verdict = ", ".join(f"{k} {'✓' if v else '✗'}" for k, v in held.items() if k != "aim")
        lines.append("| " + " | ".join([*cells, verdict]) + " |")
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def blind_table(prefix, policies, seeds=SEEDS):
    """Where a rule is blind (experiments/blind_slices.py), on the seeds with a slices file: every
    rule's, the oracle's and each policy's (`policies`: table name -> what the row says) accuracy
    and tokens per question on the questions whose round-0 answers are unanimous and wrong, and on
    those whose round-0 vote is a wrong majority short of unanimity; and each policy's share of
    the oracle's headroom above freeze (its mean accuracy minus freeze's, over the oracle's minus
    freeze's, on those seeds)."""
    named = {}
    for seed in seeds:
        found = load(f"slices/{prefix}-seed{seed}.json")
        if found:
            named[seed] = found | {"path": f"results/slices/{prefix}-seed{seed}.json"}
    if not named:
        return missing(*(f"slices/{prefix}-seed{seed}.json" for seed in seeds))
    parts = {**RULE_ROWS, "oracle": "the oracle (reads the gold answer)", **policies}
    runs, _ = table_runs(prefix, parts, list(named), plays)
    complete = {part: found for part, found in runs.items() if set(found) == set(named)}
    waiting = [part for part in parts if part not in complete]
    figures = slice_figures(
        [
            (named[seed], [(seed, {part: complete[part][seed] for part in complete})])
            for seed in named
        ]
    )
    accuracy = {
        part: mean([s["accuracy"] for s in found.values()]) for part, found in complete.items()
    }
    headroom = None
    if "freeze" in complete and "oracle" in complete:
        headroom = accuracy["oracle"] - accuracy["freeze"]
    on = ", ".join(map(str, named))
    lines = [
        f"| protocol (seeds {on}) | {SLICE_HEAD} | share of the oracle's headroom above freeze |",
        "|---|" + "---|" * (len(SLICES) + 1),
    ]
    for part, by_slice in figures.items():
        share = ""
        if part in policies and headroom:
            share = f"{(accuracy[part] - accuracy['freeze']) / headroom:+.0%}"
        lines.append(f"| {parts[part]} (`{part}`) | {slice_cells(by_slice)} | {share} |")
    if waiting:
        lines.append(
            f"\n*(not on every seed of the slices yet: {', '.join(waiting)}; "
            "`python -m experiments.run split`)*"
        )
    return "\n".join(lines)
