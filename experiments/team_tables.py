"""The teams' tables: what one REFINE round does to the team's vote before and after the agents are
trained (results/after/), and which kind of action pays in each team's counterfactual corpus
(results/training/); report.py gives each team its table of protocols (tables.seeds_table)."""

from experiments.refine_value import gain_summary
from experiments.tables import (
    accuracy_over_seeds,
    by_seed,
    fmt,
    load,
    mean,
    mean_actions,
    missing,
    paired_over_seeds,
    pictures_of,
    pooled,
    seeds_text,
    summary_of,
)
from experiments.teams import team_members, team_rl_algos
from stats import format_paired, paired_difference, sample_std

PARALLEL_ADAPTERS = "magrpo-lora-lr5e-4-L1-seed{}"
DEBATE_ADAPTERS = "magrpo-debate-L1-seed{}"  # MAGRPO on debate from the base
# what each team of pieces.TEAMS is, for the README's headline
TEAM_LABELS = {
    "revisers": "three agents trained by MAGRPO on debate",
    "mixed": "member 0 the untrained backbone, 1 an agent trained on parallel answers, 2 on debate",
    "worked": "three copies of the adapter trained on easy arith's worked solutions",
    "varied": "member 0 the worked-solution adapter continued on REFINE examples, 1 the "
    "worked-solution adapter, 2 its rank-4 sibling",
    "revised": "team varied's agents after MAGRPO on debate with each agent's revision reward "
    "(lr 1e-4), REFINE reading whole solutions",
}
# (label, the after-training runs' name with {} for the seed, seeds, the agents training started
# from: the same seed's run of that name); the untrained team first. Each REFINE is compared with
# the REFINE of the agents its training started from: what training did to it.
REFINE_RUNS = (
    ("untrained agents", "untrained", (None,), None),
    (
        "MAGRPO on parallel answers, whole weights (token)",
        "magrpo-L1-seed{}",
        (0, 1, 2),
        "untrained",
    ),
    ("MAGRPO on parallel answers, adapters (lr 5e-4)", PARALLEL_ADAPTERS, (0, 1, 2), "untrained"),
    ("MAGRPO on debate, adapters (lr 5e-4)", DEBATE_ADAPTERS, (0, 1, 2), "untrained"),
    (
        "MAGRPO on parallel answers (adapters), then on debate",
        "magrpo-debate-warm-L1-seed{}",
        (0, 1, 2),
        PARALLEL_ADAPTERS,
    ),
)


def refine_effect(name):
    """Per question, the team's vote after one REFINE round minus its vote before (round 0 = the
    parallel vote: the same round-0 answers), in the form paired_difference reads; None while a
    file is missing."""
    before = summary_of(load(f"after/{name}-parallel.json"), "mpdf-persist")
    after = summary_of(load(f"after/{name}-debate.json"), "debate")
    if before is None or after is None:
        return None
    voted = dict(zip(before["question_ids"], before["correct"]))
    return {
        "question_ids": after["question_ids"],
        "correct": [
            float(ok) - float(voted[q]) for q, ok in zip(after["question_ids"], after["correct"])
        ],
        "before": before["accuracy"],
        "after": after["accuracy"],
        "round0_in_debate": after["accuracy_per_round"][0],
    }


def refine_table():
    """Each team's vote before and after one REFINE round on the same 300 test questions, the
    paired change, and that change minus the change of the agents training started from (a
    difference in differences, paired by question); the mean over seeds with its sample std."""
    lines = [
        "| agents (300 arith test questions, 3 agents) | seed | vote, round 0 | after one REFINE | "
        "REFINE's change [95% CI] (questions it moves) | change − the starting agents' [95% CI] "
        "(started from) |",
        "|---|---|---|---|---|---|",
    ]
    for label, name, seeds, start in REFINE_RUNS:
        changes = []
        for seed in seeds:
            effect = refine_effect(name.format(seed))
            if effect is None:
                continue
            none = {
                "question_ids": effect["question_ids"],
                "correct": [0.0] * len(effect["correct"]),
            }
            started = start and refine_effect(start.format(seed))
            relative = (
                f"{format_paired(paired_difference(effect, started))} ({start.format(seed)})"
                if started
                else ""
            )
            changes.append(effect["after"] - effect["before"])
            # the debate's own round 0 repeats the parallel vote (the same calls): say so if not
            check = (
                ""
                if abs(effect["round0_in_debate"] - effect["before"]) < 1e-9
                else (f" (debate's round 0: {effect['round0_in_debate']:.3f})")
            )
            lines.append(
                f"| {label} | {'' if seed is None else seed} | {effect['before']:.3f}{check} | "
                f"{effect['after']:.3f} | {format_paired(paired_difference(effect, none))} | "
                f"{relative} |"
            )
        if len(changes) > 1:
            lines.append(
                f"| {label} | mean of {len(changes)} | | | {mean(changes):+.3f} (sample std "
                f"{sample_std(changes):.3f}) | |"
            )
    if len(lines) == 2:
        return missing("after/untrained-parallel.json", "after/untrained-debate.json")
    return "\n".join(lines)


def debate_training_sentence(seeds=(0, 1, 2)):
    """README's sentence on MAGRPO trained on debate from the base: one REFINE round's
    change in the team's vote, mean and sample std over the seeds, against the untrained agents'
    change and paired with it question by question; None until every seed's files exist."""
    untrained = refine_effect("untrained")
    effects = [refine_effect(DEBATE_ADAPTERS.format(seed)) for seed in seeds]
    if untrained is None or None in effects:
        return None
    changes = [e["after"] - e["before"] for e in effects]
    relative = [paired_difference(e, untrained)["diff"] for e in effects]
    return (
        "**MAGRPO on debate** (adapters; the joint reward is the team's vote after one REFINE "
        f"round; {len(seeds)} seeds): one REFINE round changes the trained agents' vote by "
        f"{mean(changes):+.3f} (sample std {sample_std(changes):.3f}) against the untrained "
        f"agents' {untrained['after'] - untrained['before']:+.3f} on 300 test questions, "
        f"{mean(relative):+.3f} (sample std {sample_std(relative):.3f}) paired with the untrained "
        "agents' change."
    )


def action_value_table(teams, seeds=(0, 1, 2)):
    """Per team and seed, the counterfactual corpus SoftRankPO trained on
    (results/training/<prefix>-seed<k>-softrank.json, corpus.best_kind; `teams`: {team: prefix},
    arith-team-<team> for the arith teams): the share of states where PERSIST, REFINE or CONCEDE
    alone pays most, where kinds tie, REFINE's mean reward minus PERSIST's, and the trained
    policy's actions on that corpus."""
    lines = [
        "| team | seed | states | best: persist / refine / concede / tied | REFINE − PERSIST, mean "
        "reward | policy's actions on the corpus p/r/c |",
        "|---|---|---|---|---|---|",
    ]
    absent = []
    for team, prefix in teams.items():
        for seed in seeds:
            path = f"training/{prefix}-seed{seed}-softrank.json"
            summary = load(path)
            if summary is None:
                absent.append(path)
                continue
            corpus, actions = summary["corpus"], summary["policy_actions_on_corpus"]
            best = " / ".join(
                f"{corpus['best_kind'][k]:.2f}" for k in ("persist", "refine", "concede", "tied")
            )
            lines.append(
                f"| {team} | {seed} | {corpus['states']} | {best} | "
                f"{corpus['refine_minus_persist']:+.3f} | "
                + "/".join(f"{actions[k]:.2f}" for k in ("persist", "refine", "concede"))
                + " |"
            )
    if len(lines) == 2:
        return missing(*absent)
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


def refine_value_table(teams, seeds=(0, 1, 2)):
    """Per team, seed and learned policy (results/refine/, experiments/refine_value.py): in its own
    test games, how often it REFINEs and CONCEDEs and what those decisions gain over PERSIST in the
    counterfactual rewards (mean [95% CI] (decisions)), and what REFINE would have gained at every
    decision."""

    def gain(v):
        if not v["decisions"]:
            return "– (0)"
        return (
            f"{v['mean_gain']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}] ({v['decisions']})"
        )

    lines = [
        "| team | seed | policy | accuracy | REFINE share | its REFINEs − PERSIST | CONCEDE "
        "share | its CONCEDEs − PERSIST | REFINE at every decision − PERSIST |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    absent = []
    for team in teams:
        for seed in seeds:
            for algo in ("sft", *team_rl_algos(team)):
                path = f"refine/arith300-team-{team}-seed{seed}-{algo}.json"
                result = load(path)
                if result is None:
                    absent.append(path)
                    continue
                taken = result["taken_vs_persist"]
                lines.append(
                    f"| {team} | {seed} | {algo} | {result['accuracy']:.3f} | "
                    f"{result['shares']['refine']:.2f} | {gain(taken['refine'])} | "
                    f"{result['shares']['concede']:.2f} | {gain(taken['concede'])} | "
                    f"{gain(result['refine_at_every_decision_vs_persist'])} |"
                )
    if len(lines) == 2:
        return missing("refine/arith300-team-<team>-seed<k>-<policy>.json")
    return "\n".join(lines) + ("\n\n" + missing(*absent) if absent else "")


FIXED_NAMES = {"sc": "self-consistency", "debate": "debate", "persist": "the team's vote"}


def fixed_name(part):
    """What the reader calls a team table's fixed protocol."""
    if part.startswith("vanilla-m"):
        return f"member {part[len('vanilla-m') :]}'s greedy answer alone"
    return FIXED_NAMES[part]


def team_fixed_protocols(team):
    """A team's fixed protocols (pieces.team_pieces): one greedy answer of each distinct member
    (vanilla-m<j>), self-consistency, debate and the team's vote."""
    members = len(team_members(team))
    return [f"vanilla-m{j}" for j in range(members)] + ["sc", "debate", "persist"]


def team_sentence(team):
    """README's sentence on a trained team, over the seeds with every file: SoftRankPO against
    the team's strongest fixed protocol (the highest mean accuracy; paired, pooled over the seeds),
    its REFINE share, and what the REFINEs of the policy trained with REFINE free of its token cost
    gain over PERSIST in the test games' counterfactual rewards. None before a seed is complete."""
    fixed = team_fixed_protocols(team)
    runs = {p: by_seed(f"arith300-team-{team}", p) for p in (*fixed, "softrank", "softrank-cost0")}
    values = {
        seed: load(f"refine/arith300-team-{team}-seed{seed}-softrank-cost0.json")
        for seed in (0, 1, 2)
    }
    seeds = [s for s in (0, 1, 2) if values[s] and all(s in r for r in runs.values())]
    if not seeds:
        return None
    runs = {part: {s: r[s] for s in seeds} for part, r in runs.items()}
    accuracy = {part: mean([r[s]["accuracy"] for s in seeds]) for part, r in runs.items()}
    strongest = max(fixed, key=accuracy.get)
    gap, free_gap = (
        format_paired(paired_difference(pooled(runs[policy]), pooled(runs[strongest])))
        for policy in ("softrank", "softrank-cost0")
    )
    refine_share = mean([runs["softrank"][s]["actions"]["refine"] for s in seeds])
    free_share = mean([values[s]["shares"]["refine"] for s in seeds])
    gains = [values[s]["taken_vs_persist"]["refine"] for s in seeds]
    if len(seeds) == 1:
        gain = (
            f"{gains[0]['mean_gain']:+.3f} [{gains[0]['ci95'][0]:+.3f}, {gains[0]['ci95'][1]:+.3f}]"
        )
    else:
        means = [g["mean_gain"] for g in gains if g["decisions"]]
        gain = f"{mean(means):+.3f} (sample std {sample_std(means):.3f} over the seeds)"
    vote = mean([runs["persist"][s]["accuracy"] for s in seeds])
    oracle = mean([runs["persist"][s]["any_agent_right_round0"] for s in seeds])
    closed = (
        f"closing {(accuracy['softrank'] - vote) / (oracle - vote):+.0%} of the gap from the "
        f"team's vote ({vote:.3f}) to the oracle (any member right in round 0, {oracle:.3f}), "
        if oracle > vote
        else ""
    )
    return (
        f"**Team `{team}`** ({TEAM_LABELS[team]}; 300 test questions × "
        f"{seeds_text(len(seeds))}): SoftRankPO {accuracy['softrank']:.3f} against the "
        f"team's strongest fixed protocol ({fixed_name(strongest)}, {accuracy[strongest]:.3f}): "
        f"{gap}, {closed}REFINE on {refine_share:.0%} of its decisions; trained with REFINE free "
        f"of its token cost, it plays {accuracy['softrank-cost0']:.3f} ({free_gap} against the "
        f"same), REFINEs on {free_share:.0%} of its decisions and each REFINE gains {gain} over "
        "PERSIST in the test games' counterfactual rewards."
    )


# the aggregator leaders a team's table shows beside its MLPO leader (the preset's rate, whose
# one seed lost its answer line, stays in the target table's line against the vote)
TEAM_AGGREGATORS = {"varied": ["aggregator-lr1e-4"]}


def competent_team_table(team, seeds=(0, 1, 2)):
    """A competent team's table: each member alone, the team's vote, self-consistency,
    debate, the oracle (any member right in round 0: the ceiling of selection) and every learned
    policy, over the seeds. Per protocol: accuracy (mean ± sample std), tokens per question, actions
    p/r/c, the paired difference to the team's strongest fixed protocol (highest mean accuracy;
    pooled over the seeds both have), the share of the gap from the vote to the oracle it closes
    ((accuracy - vote) / (oracle - vote), pooled) and its accuracy on the questions where the
    vote is wrong."""
    fixed = team_fixed_protocols(team)
    learned = ["sft", *team_rl_algos(team), "leader", *TEAM_AGGREGATORS.get(team, [])]
    name = f"arith300-team-{team}"
    runs = {part: by_seed(name, part, seeds) for part in (*fixed, *learned)}
    absent = [
        f"tables/{name}-seed{seed}-{part}.json"
        for part, found in runs.items()
        for seed in seeds
        if seed not in found
    ]
    runs = {part: found for part, found in runs.items() if found}
    votes = runs.get("persist", {})
    if not votes or not any(part in runs for part in fixed if part != "persist"):
        return missing(*absent)
    accuracy = {part: mean([s["accuracy"] for s in found.values()]) for part, found in runs.items()}
    strongest = max((part for part in fixed if part in runs), key=accuracy.get)
    oracle = {seed: s["any_agent_right_round0"] for seed, s in votes.items()}
    lines = [
        f"| protocol | seeds | accuracy, mean ± sample std | tokens/q | actions p/r/c | vs "
        f"{fixed_name(strongest)} [95% CI] (disagree) | gap vote → oracle closed | accuracy where "
        "the vote is wrong |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for part, found in runs.items():
        shared = [seed for seed in found if seed in votes]
        vote_acc = mean([votes[seed]["accuracy"] for seed in shared])
        gap = mean([oracle[seed] for seed in shared]) - vote_acc
        own = mean([found[seed]["accuracy"] for seed in shared])
        closed = f"{(own - vote_acc) / gap:+.2f}" if gap > 0 and part != "persist" else ""
        wrong = [
            ok
            for seed in shared
            for ok, voted in zip(*aligned(found[seed], votes[seed]))
            if not voted
        ]
        where_wrong = (
            f"{fmt(mean(wrong) if wrong else None)} ({len(wrong)})" if part != "persist" else ""
        )
        paired = paired_over_seeds(found, runs[strongest]) if part != strongest else ""
        lines.append(
            f"| {fixed_name(part) if part in fixed else part} | {len(found)} | "
            f"{accuracy_over_seeds(found)} | "
            f"{mean([s['tokens_per_question'] for s in found.values()]):.0f} | "
            f"{mean_actions(found)} | {paired} | {closed} | {where_wrong} |"
        )
    ceiling = list(oracle.values())
    spread = f"{sample_std(ceiling):.3f}" if len(ceiling) > 1 else "–"
    lines.append(
        f"| oracle: any member right in round 0 | {len(ceiling)} | {mean(ceiling):.3f} ± "
        f"{spread} | | | | +1.00 | |"
    )
    text = "\n".join(lines) + "\n\n" + pictures_of(name, runs)
    return text + ("\n\n" + missing(*absent) if absent else "")


def team_change(before, after, seeds=(0, 1, 2)):
    """What training the agents did to a team's protocols: each protocol both teams played, team
    `after` against team `before` on the same questions (paired, pooled over the seeds both have),
    and the oracle (any member right in round 0) of each."""
    fixed, learned = team_fixed_protocols(after), ["sft", *team_rl_algos(after), "leader"]
    lines = [
        f"| protocol | seeds | team {before} | team {after} | {after} − {before} [95% CI] "
        "(disagree) |",
        "|---|---|---|---|---|",
    ]
    oracle = {}
    for part in (*fixed, *learned):
        mine = by_seed(f"arith300-team-{after}", part, seeds)
        theirs = by_seed(f"arith300-team-{before}", part, seeds)
        shared = [seed for seed in mine if seed in theirs]
        if not shared:
            continue
        if part == "persist":
            oracle = {
                team: mean([runs[seed]["any_agent_right_round0"] for seed in shared])
                for team, runs in ((before, theirs), (after, mine))
            }
        lines.append(
            f"| {fixed_name(part) if part in fixed else part} | {len(shared)} | "
            f"{mean([theirs[seed]['accuracy'] for seed in shared]):.3f} | "
            f"{mean([mine[seed]['accuracy'] for seed in shared]):.3f} | "
            f"{paired_over_seeds(mine, theirs)} |"
        )
    if len(lines) == 2:
        return missing(f"tables/arith300-team-{after}-seed<k>-<protocol>.json")
    if oracle:
        lines.append(
            f"| oracle: any member right in round 0 | | {oracle[before]:.3f} | "
            f"{oracle[after]:.3f} | |"
        )
    return "\n".join(lines)


# what the target table compares with the team's vote besides the policies: table part -> label
AGAINST_THE_VOTE = {
    "leader": "the MLPO leader",
    "aggregator": "the aggregator leader at learning rate 5e-4",
    "aggregator-lr1e-4": "the aggregator leader at learning rate 1e-4",
    "debate": "debate",
}


def gain_text(gain):
    """A pooled gain_summary as the target tables print it: +0.250 [+0.100, +0.400] (12)."""
    if not gain["decisions"]:
        return "no REFINE"
    low, high = gain["ci95"]
    return f"{gain['mean_gain']:+.3f} [{low:+.3f}, {high:+.3f}] ({gain['decisions']})"


def verdict(held):
    """A target's conditions ({name: held}) in a cell: met, or the ones not met."""
    failed = [what for what, ok in held.items() if not ok]
    return "met" if not failed else "not met: " + ", ".join(failed)


def target_table(team, seeds=(0, 1, 2)):
    """The three conditions asked of a competent team's policies, policy by policy, over the seeds
    whose files are all there: REFINE on at least 10% of its decisions, its REFINEs gaining over
    PERSIST in the test games' counterfactual rewards (pooled over the seeds' REFINEs: the 95%
    interval above 0), and at least 3 points above the team's strongest fixed protocol (the paired
    interval over the seeds' questions above 0); below it, the MLPO leader, the aggregator leader
    and debate against the team's vote."""
    fixed = team_fixed_protocols(team)
    name = f"arith300-team-{team}"
    runs = {part: by_seed(name, part, seeds) for part in (*fixed, *AGAINST_THE_VOTE)}
    complete = [seed for seed in seeds if all(seed in runs[part] for part in fixed)]
    if not complete:
        return missing(
            *(
                f"tables/{name}-seed{seed}-{part}.json"
                for seed in seeds
                for part in fixed
                if seed not in runs[part]
            )
        )
    accuracy = {part: mean([runs[part][seed]["accuracy"] for seed in complete]) for part in fixed}
    strongest = max(fixed, key=accuracy.get)
    lines = [
        f"| policy ({len(complete)} seed{'s' if len(complete) > 1 else ''}) | REFINE share of "
        "its decisions (≥ 10%) | each REFINE − PERSIST, pooled [95% CI] (REFINEs; > 0) | vs "
        f"{fixed_name(strongest)} [95% CI] (disagree; ≥ +0.030, > 0) | conditions |",
        "|---|---|---|---|---|",
    ]
    waiting = []
    for policy in ("sft", *team_rl_algos(team)):
        values = [load(f"refine/{name}-seed{seed}-{policy}.json") for seed in complete]
        played = by_seed(name, policy, complete)
        refines = [v and v["taken_vs_persist"]["refine"] for v in values]
        # a file written before the per-decision gains were kept counts as missing
        if len(played) < len(complete) or not all(
            r and (not r["decisions"] or "gains" in r) for r in refines
        ):
            waiting.append(policy)
            continue
        decisions = sum(v["decisions"] for v in values)
        share = sum(r["decisions"] for r in refines) / decisions
        gain = gain_summary([g for r in refines for g in r.get("gains", [])])
        versus = paired_difference(pooled(played), pooled({k: runs[strongest][k] for k in played}))
        held = {
            "REFINE share": share >= 0.10,
            "REFINE gain": bool(gain["decisions"]) and gain["ci95"][0] > 0,
            "margin": versus["diff"] >= 0.03 and versus["ci95"][0] > 0,
            "3 seeds": len(complete) == 3,
        }
        lines.append(
            f"| {policy} | {share:.1%} | {gain_text(gain)} | {format_paired(versus)} | "
            f"{verdict(held)} |"
        )
    if waiting:
        lines.append(
            f"\n*(waiting for the table and refine-value pieces of {', '.join(waiting)} at seeds "
            f"{', '.join(map(str, complete))}: `python -m experiments.run`)*"
        )
    votes = runs["persist"]
    for part, label in AGAINST_THE_VOTE.items():
        shared = {seed: runs[part][seed] for seed in complete if seed in runs[part]}
        if shared:
            versus = paired_difference(pooled(shared), pooled({k: votes[k] for k in shared}))
            lines.append(
                f"\n{label[0].upper()}{label[1:]} against the team's vote "
                f"({seeds_text(len(shared))}, paired): {format_paired(versus)}."
            )
    return "\n".join(lines)


def aligned(summary, reference):
    """(correct, reference's correct) of the same questions, in summary's order."""
    theirs = dict(zip(reference["question_ids"], reference["correct"]))
    return summary["correct"], [theirs[q] for q in summary["question_ids"]]
