"""The split-information task's tables (experiments/split_pieces.py, docs/design.md §9), written by
experiments/report.py: its agents against their own targets, the team's table with the split and
the shared questions apart, and the learned policies against the target of a task where reading
the peers carries information.

Every paired difference is pooled over the seeds both protocols have, on the same questions (a
question of seed k is "k:id"); a part (split or shared) pairs the same questions of that part.
"""

from experiments import tables, weights
from experiments.refine_value import gain_summary
from experiments.revision_tables import HEADER, by_agent, class_lines, seed_rows
from experiments.split_pieces import MEMBERS, PREFIX, TRAINED, VALUED, plays
from experiments.tables import accuracy_over_seeds, fmt, load, mean, missing, seeds_text
from experiments.team_tables import gain_text, verdict
from stats import format_paired, paired_difference

SEEDS = (0, 1, 2)
# the fixed protocols: the team's vote after round 0, self-consistency, debate, vanilla (member 0
# in the single answer's words) and each member alone (asked as the game's round 0 asks)
ALONE = tuple(f"alone-m{j}" for j in range(len(MEMBERS)))
FIXED = ("persist", "sc", "debate", "vanilla-m0", *ALONE)
LEARNED = (*TRAINED, "leader", "magrpo-debate")
BY_ROUND = "refine_at_every_decision_by_round"
# SoftRankPO from REFINE paid for to its default cost, each cost a policy of its own, cheapest first
COSTED = (
    *sorted(
        (p for p in VALUED if p.startswith("softrank-cost")),
        key=lambda p: float(p.removeprefix("softrank-cost")),
    ),
    "softrank",
)
NAMES = {
    "persist": "the team's vote after round 0",
    "sc": "self-consistency",
    "debate": "debate (every agent REFINEs every round)",
    "leader": "MLPO leader (reads every solution)",
    "magrpo-debate": "debate, agents trained by MAGRPO",
    "vanilla-m0": "vanilla (member 0, in the single answer's words)",
    **{f"alone-m{j}": f"member {j} alone (the game's first prompt)" for j in range(len(MEMBERS))},
}
PARTS = ("split", "shared")


def part_of(summary, part, seed):
    """One seed's summary restricted to the questions of `part` (None: every question), with ids
    made unique over the seeds, for paired_difference."""
    keep = [
        part is None or dealt == (part == "split")
        for dealt in summary.get("question_dealt", [False] * summary["n"])
    ]
    ids = [f"{seed}:{q}" for q, k in zip(summary["question_ids"], keep) if k]
    return {"question_ids": ids, "correct": [ok for ok, k in zip(summary["correct"], keep) if k]}


def paired(mine, theirs, part=None):
    """mine - theirs ({seed: summary} each) pooled over the seeds both have, on `part`'s questions
    (None if they share no seed)."""
    seeds = [seed for seed in mine if seed in theirs]
    if not seeds:
        return None

    def pool(runs):
        pieces = [part_of(runs[seed], part, seed) for seed in seeds]
        return {key: [x for p in pieces for x in p[key]] for key in ("question_ids", "correct")}

    return paired_difference(pool(mine), pool(theirs))


def by_part(mine, theirs):
    """mine - theirs on every question, then on the split and the shared ones apart, as one
    sentence's clauses."""
    clauses = [format_paired(paired(mine, theirs))]
    clauses += [f"{part} questions {format_paired(paired(mine, theirs, part))}" for part in PARTS]
    return "; ".join(clauses)


def part_mean(runs, part, key):
    """A part's `key` (accuracy, tokens_per_question) averaged over the seeds."""
    return mean([s["parts"][part][key] for s in runs.values()])


def part_actions(runs, part):
    """persist/refine/concede shares on a part's questions, averaged over the seeds."""
    if "actions" not in next(iter(runs.values()))["parts"][part]:
        return ""
    return "/".join(
        f"{mean([s['parts'][part]['actions'][k] for s in runs.values()]):.2f}"
        for k in ("persist", "refine", "concede")
    )


def runs_of(parts, seeds=SEEDS):
    """{part: {seed: summary}} of the team's table files found, and the files not there yet."""
    return tables.table_runs(PREFIX, parts, seeds, plays)


def split_agents_table(seeds=SEEDS):
    """The agents' own targets, per member over the seeds: alone (asked as the game's round 0 asks,
    greedy) on split questions (at most 0.15: no view holds every value), alone on shared ones (at
    least 0.60), and REFINE over the peers' whole solutions at the first decision on split questions
    (at least 0.70: the values pooled; results/revision/, every state of the member)."""
    alone, absent = runs_of(ALONE, seeds)
    revisions = {seed: load(f"revision/{PREFIX}-seed{seed}.json") for seed in seeds}
    absent += [f"revision/{PREFIX}-seed{s}.json" for s, r in revisions.items() if r is None]
    revisions = {seed: r for seed, r in revisions.items() if r}
    if not alone and not revisions:
        return missing(*absent)
    lines = [
        "| member | alone, split questions (≤ 0.15) | alone, shared questions (≥ 0.60) | "
        "one REFINE over the peers, split questions (≥ 0.70) | seeds |",
        "|---|---|---|---|---|",
    ]
    for j, member in enumerate(MEMBERS):
        runs = alone.get(f"alone-m{j}", {})
        refined = [
            r["refine"]
            for revision in revisions.values()
            for r in revision["rows"]
            if r["id"].endswith(f":{j}") and r["dealt"]
        ]
        cells = [fmt(part_mean(runs, part, "accuracy")) if runs else "–" for part in PARTS]
        after = fmt(mean(refined)) if refined else "–"
        lines.append(
            f"| {j} (`{member}`) | {' | '.join(cells)} | {after} | {len(runs)} alone, "
            f"{len(revisions)} REFINE |"
        )
    if absent:
        lines.append("\n" + missing(*absent))
    return "\n".join(lines)


def split_revision_table(seeds=SEEDS):
    """The revision skill per state class at the first decision (results/revision/), the split and
    the shared questions apart, pooled over the seeds computed: where REFINE over the peers' whole
    solutions ends right against PERSIST and CONCEDE. On a split question every first answer lacks
    a value, so its states are all wrong and only REFINE can end right."""
    rows, done, absent = seed_rows(f"revision/{PREFIX}-seed{{seed}}.json", seeds)
    if not rows:
        return missing(*absent)
    done = ",".join(done)
    lines = [HEADER[0].replace("REFINE reads", "questions"), HEADER[1]]
    agents = []
    for part in PARTS:
        mine = [r for r in rows if r["dealt"] == (part == "split")]
        lines += class_lines(f"{part} (seeds {done})", mine)
        agents.append(f"{part} questions: {by_agent(mine)}")
    text = "\n".join(lines) + "\n\nEach agent's own answer right → its REFINE right:\n"
    text += "\n".join(f"- {line}" for line in agents)
    text += "\n\n" + misses_text([r for r in rows if r["dealt"]])
    return text + ("\n\n" + missing(*absent) if absent else "")


# why a REFINE on a split question ended wrong, in the order the causes are told apart
MISSES = {
    "a value it lacked stated by no peer's first solution": lambda r: not r["peers_state_lacked"],
    "given by a peer, not stated in its REFINE": lambda r: not r["refine_states_all"],
    "every value stated, a step's arithmetic wrong": lambda r: not r["refine_steps_right"],
    "every value stated and every step right (a wrong expression or answer line)": lambda r: True,
}


def misses_text(rows):
    """The split questions' REFINEs that ended wrong, by cause (revision_skill.pooling), first
    cause first; rows of a revision file written before the causes were kept are left out, said
    so."""
    known = [r for r in rows if "peers_state_lacked" in r]
    if not known:
        return "(The causes of the wrong REFINEs: not in these revision files; compute them again.)"
    wrong = [r for r in known if not r["refine"]]
    counts = dict.fromkeys(MISSES, 0)
    for r in wrong:
        counts[next(cause for cause, test in MISSES.items() if test(r))] += 1
    causes = "; ".join(f"{cause}: {n}" for cause, n in counts.items())
    text = f"Split questions, the REFINEs that ended wrong ({len(wrong)} of {len(known)} states"
    text += f"), by cause: {causes}." if wrong else "): none."
    if len(known) < len(rows):
        text += f" ({len(rows) - len(known)} states of revision files without the causes left out.)"
    return text


def split_team_table(seeds=SEEDS):
    """Every protocol on the split task over the seeds: accuracy (mean ± sample std), on the split
    and the shared questions apart, tokens per question, the actions on each part, and the paired
    difference to the team's vote on every question and on the split ones."""
    runs, absent = runs_of((*FIXED, *LEARNED), seeds)
    votes = runs.get("persist")
    if not votes:
        return missing(*absent)
    lines = [
        "| protocol | seeds | accuracy | split q. | shared q. | tokens/q | actions p/r/c, split | "
        "actions p/r/c, shared | vs the vote [95% CI] (disagree) | vs the vote, split q. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for part, found in runs.items():
        against = [paired(found, votes, p) for p in (None, "split")] if part != "persist" else []
        lines.append(
            f"| {NAMES.get(part, part)} | {len(found)} | {accuracy_over_seeds(found)} | "
            f"{fmt(part_mean(found, 'split', 'accuracy'))} | "
            f"{fmt(part_mean(found, 'shared', 'accuracy'))} | "
            f"{mean([s['tokens_per_question'] for s in found.values()]):.0f} | "
            f"{part_actions(found, 'split')} | {part_actions(found, 'shared')} | "
            + " | ".join(format_paired(v) if v else "" for v in against or [None, None])
            + " |"
        )
    if absent:
        lines.append("\n" + missing(*absent))
    return "\n".join(lines)


def split_target_table(seeds=SEEDS):
    """The target on the split task, policy by policy over the seeds whose fixed protocols are all
    there: at least +0.10 over the vote (the paired interval above 0), at least the accuracy of the
    strongest fixed protocol at no more than 60% of its tokens, its REFINEs gaining over PERSIST
    on split questions (pooled over the seeds, the 95% interval above 0), and REFINE at least three
    times as often on split questions as on shared ones; below it, the MLPO leader against its
    peers' vote and the strongest fixed protocol, and MAGRPO's debate against the vote and the
    team's own debate."""
    runs, absent = runs_of((*FIXED, *LEARNED), seeds)
    complete = [seed for seed in seeds if all(seed in runs.get(part, {}) for part in FIXED)]
    if not complete:
        return missing(*absent)
    fixed = {part: {seed: runs[part][seed] for seed in complete} for part in FIXED}
    strongest = max(FIXED, key=lambda part: mean([s["accuracy"] for s in fixed[part].values()]))
    strongest_tokens = mean([s["tokens_per_question"] for s in fixed[strongest].values()])
    lines = [
        f"| policy ({len(complete)} seeds) | vs the vote [95% CI] (≥ +0.10, > 0) | vs "
        f"{NAMES[strongest]} (≥ 0) | tokens, share of its (≤ 60%) | REFINE − PERSIST, split "
        "q., pooled [95% CI] (> 0) | REFINE share split / shared (≥ 3) | conditions |",
        "|---|---|---|---|---|---|---|",
    ]
    waiting = []
    for policy in VALUED:
        played = {seed: runs[policy][seed] for seed in complete if seed in runs.get(policy, {})}
        values = [load(f"refine/{PREFIX}-seed{seed}-{policy}.json") for seed in complete]
        if len(played) < len(complete) or not all(values):
            waiting.append(policy)
            continue
        vote = paired(played, fixed["persist"])
        versus = paired(played, fixed[strongest])
        tokens = mean([s["tokens_per_question"] for s in played.values()]) / strongest_tokens
        gain = gain_summary(
            [
                g
                for v in values
                for g in v["parts"]["split"]["taken_vs_persist"]["refine"].get("gains", [])
            ]
        )
        shares = {
            part: mean([v["parts"][part]["shares"]["refine"] for v in values]) for part in PARTS
        }
        ratio = shares["split"] / shares["shared"] if shares["shared"] else float("inf")
        held = {
            "vote": vote["diff"] >= 0.10 and vote["ci95"][0] > 0,
            "strongest": versus["diff"] >= 0,
            "tokens": tokens <= 0.60,
            "REFINE gain": bool(gain["decisions"]) and gain["ci95"][0] > 0,
            "REFINE where split": ratio >= 3,
            "3 seeds": len(complete) == 3,
        }
        lines.append(
            f"| {policy} | {format_paired(vote)} | {format_paired(versus)} | {tokens:.0%} | "
            f"{gain_text(gain)} | {shares['split']:.2f} / {shares['shared']:.2f} | "
            f"{verdict(held)} |"
        )
    if waiting:
        lines.append(
            f"\n*(waiting for the table and refine-value pieces of {', '.join(waiting)}: "
            "`python -m experiments.run split`)*"
        )
    leaders = runs.get("leader", {})
    if leaders:
        own_vote = {seed: {**s, "correct": s["peer_vote_correct"]} for seed, s in leaders.items()}
        lines.append(
            f"\nThe MLPO leader against its peers' vote ({seeds_text(len(leaders))}, paired): "
            f"{by_part(leaders, own_vote)}."
        )
        # the natural aggregator of split facts against the protocol the policies must match
        tokens = mean([s["tokens_per_question"] for s in leaders.values()]) / strongest_tokens
        lines.append(
            f"\nThe MLPO leader against {NAMES[strongest]} ({seeds_text(len(leaders))}, paired): "
            f"{by_part(leaders, fixed[strongest])}; at {tokens:.0%} of its tokens."
        )
    debated = {seed: s for seed, s in runs.get("magrpo-debate", {}).items() if seed in complete}
    # the trained agents against the vote, and against the same protocol played by their starting
    # team: what MAGRPO's training adds to debate
    against = {"the team's vote": "persist", "the team's own debate": "debate"} if debated else {}
    for name, part in against.items():
        lines.append(
            f"\nDebate by the MAGRPO-trained agents against {name} ({seeds_text(len(debated))}, "
            f"paired): {by_part(debated, fixed[part])}."
        )
    if debated:
        lines.append(
            f"\nRound by round, the team's own debate → the MAGRPO-trained agents' (mean over "
            f"{seeds_text(len(debated))}): {round_by_round(debated, fixed['debate'])}."
        )
    return "\n".join(lines)


def round_by_round(mine, theirs):
    """theirs → mine, averaged over the seeds both have: the members' own first answers, then the
    team's answer after each round, to say in which round two debates part."""
    seeds = [seed for seed in mine if seed in theirs]

    def both(value):
        return " → ".join(f"{mean([value(runs[s]) for s in seeds]):.3f}" for runs in (theirs, mine))

    rounds = range(len(mine[seeds[0]]["accuracy_per_round"]))
    after = ", ".join(
        f"after round {t} {both(lambda s: s['accuracy_per_round'][t])}" for t in rounds
    )
    return (
        f"members' own first answers right {both(lambda s: s['agent_accuracy_round0'])}; "
        f"the team's answer {after}"
    )


def pooled_refine(values, part, rounds=lambda t: True):
    """What REFINE would have gained over PERSIST at every decision of `part`'s questions in the
    rounds t (1-based) where rounds(t) holds, pooled over the refine-value files `values`."""
    gains = [
        g
        for v in values
        for t, round_gains in enumerate(v["parts"][part][BY_ROUND], 1)
        if rounds(t)
        for g in round_gains.get("gains", [])
    ]
    return gain_text(gain_summary(gains))


def cost_of(policy, seeds):
    """The REFINE cost a policy was trained at, as its committed settings say (one per seed)."""
    settings = [load(f"policies/{PREFIX}-seed{s}-{policy}.json") or {} for s in seeds]
    costs = {of.get("train_config", {}).get("refine_cost") for of in settings}
    return ", ".join("?" if c is None else f"{c:g}" for c in sorted(costs, key=str))


def same_weights(policy, seeds, like="softrank"):
    """The seeds whose committed `policy` file holds the very bytes of `like`'s: SoftRankPO
    ranks the rewards, so a cost that only breaks ties between them trains the same policy."""

    def digest(name, seed):
        # a policy that left the tree is compared by the sha256 its manifest row keeps
        return weights.recorded(
            tables.RESULTS / "policies" / f"{PREFIX}-seed{seed}-{name}.safetensors", "sha256"
        )

    return [s for s in seeds if (mine := digest(policy, s)) and mine == digest(like, s)]


def split_cost_table(seeds=SEEDS):
    """SoftRankPO by REFINE's token cost in its reward, over the seeds each cost has: accuracy on
    the split and shared questions, tokens, REFINE's share on each part, debate's accuracy on the
    same questions, and what REFINE would have gained over PERSIST at every decision of its own
    test games: on split questions in round 1 (the values pooled) and later (the answer polished),
    and on shared questions; and the seeds where its weights are the default cost's, byte for byte.
    A cost that keeps REFINE off shared questions but REFINEs on split ones as long as debate does
    exists only if the later split REFINEs gain more than the shared ones."""
    runs, _ = runs_of((*COSTED, "debate"), seeds)
    debate = runs.get("debate", {})
    lines = [
        "| SoftRankPO, REFINE's cost per 1000 tokens | seeds | accuracy | split q. | shared q. | "
        "tokens/q | REFINE share split / shared | vs debate, same questions [95% CI] | REFINE − "
        "PERSIST at every decision, split q., round 1 | split q., rounds 2+ | shared q. | "
        "seeds whose weights are the default cost's |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    absent, stale = [], []
    for policy in COSTED:
        played = runs.get(policy, {})
        values = {seed: load(f"refine/{PREFIX}-seed{seed}-{policy}.json") for seed in played}
        by_round = [v for v in values.values() if v and BY_ROUND in v["parts"]["split"]]
        absent += [f"tables/{PREFIX}-seed{s}-{policy}.json" for s in seeds if s not in played]
        absent += [f"refine/{PREFIX}-seed{s}-{policy}.json" for s, v in values.items() if not v]
        stale += [
            f"`results/refine/{PREFIX}-seed{s}-{policy}.json`"
            for s, v in values.items()
            if v and BY_ROUND not in v["parts"]["split"]
        ]
        if not played or len(by_round) < len(played):
            continue
        shares = [mean([v["parts"][p]["shares"]["refine"] for v in by_round]) for p in PARTS]
        versus = paired(played, debate)
        lines.append(
            f"| {cost_of(policy, played)} (`{policy}`) | {len(played)} | "
            f"{accuracy_over_seeds(played)} | "
            f"{fmt(part_mean(played, 'split', 'accuracy'))} | "
            f"{fmt(part_mean(played, 'shared', 'accuracy'))} | "
            f"{mean([s['tokens_per_question'] for s in played.values()]):.0f} | "
            f"{shares[0]:.2f} / {shares[1]:.2f} | {format_paired(versus) if versus else ''} | "
            f"{pooled_refine(by_round, 'split', lambda t: t == 1)} | "
            f"{pooled_refine(by_round, 'split', lambda t: t > 1)} | "
            f"{pooled_refine(by_round, 'shared')} | "
            f"{','.join(map(str, same_weights(policy, played))) or 'none'} |"
        )
    if absent:
        lines.append("\n" + missing(*absent))
    if stale:
        lines.append(
            f"\n*(computed before the gains by round, to compute again: {', '.join(stale)})*"
        )
    return "\n".join(lines)
