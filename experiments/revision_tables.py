"""The revision skill's table: how often a REFINE ends right from each state class, against
PERSIST and CONCEDE, before and after the revision turn is trained (results/revision/,
experiments/revision_skill.py)."""

from experiments.revision_skill import STATE_CLASSES
from experiments.tables import load, missing
from stats import format_paired, paired_difference


def revision_skill_table(prefix, seeds=(0, 1, 2), before=None):
    """The revision skill of a team's agents (results/revision/, experiments/revision_skill.py):
    per view of the REFINE prompt and state class at the first decision, pooled over the seeds
    computed, the share of states where REFINE, PERSIST and the policy's CONCEDE end right, REFINE
    minus each (paired over the same states, 95% interval, states that differ) and the REFINE
    call's tokens. `prefix`: the files' name before the seed (arith300-team-varied, or the trained
    team's arith300-trained-varied); `before`: the files of the agents a trained team started from,
    for the change training made (revision_change)."""
    lines = list(HEADER)
    absent, agents = [], []
    for view, label in (("answers", "peers' answers"), ("whole", "whole solutions")):
        rows, done, missed = seed_rows(f"revision/{prefix}-seed{{seed}}-{view}.json", seeds)
        absent += missed
        if rows:
            agents.append(f"{label} (seeds {','.join(done)}): {by_agent(rows)}")
        lines += class_lines(f"{label} (seeds {','.join(done)})", rows)
    if len(lines) == 2:
        return missing(f"revision/{prefix}-seed<k>-<view>.json")
    text = "\n".join(lines) + "\n\nEach agent's own answer right → its REFINE right, over all its "
    text += "states:\n" + "\n".join(f"- {line}" for line in agents)
    if before:
        text += "\n\n" + revision_change(before, prefix, seeds)
    return text + ("\n\n" + missing(*absent) if absent else "")


def seed_rows(pattern, seeds):
    """The rows of each seed's revision file (`pattern` with {seed}) pooled, a row's id made
    "<seed>:<id>"; the seeds found (as text) and the files not there yet."""
    rows, done, absent = [], [], []
    for seed in seeds:
        path = pattern.format(seed=seed)
        result = load(path)
        if result is None:
            absent.append(path)
            continue
        done.append(str(seed))
        rows += [r | {"id": f"{seed}:{r['id']}"} for r in result["rows"]]
    return rows, done, absent


HEADER = [
    "| REFINE reads | state class | states | REFINE right | PERSIST right | CONCEDE right | "
    "REFINE − PERSIST | REFINE − CONCEDE | REFINE tokens |",
    "|---|---|---|---|---|---|---|---|---|",
]


def class_lines(label, rows):
    """The table's lines of one group of rows (a view's, or a part's of the split task): per state
    class and over all states, the share where REFINE, PERSIST and CONCEDE end right, REFINE minus
    each paired over the same states, and the REFINE call's tokens."""
    lines = []
    for name in (*STATE_CLASSES, "all states"):
        mine = [r for r in rows if name in (r["class"], "all states")]
        if not mine:
            continue

        def of(outcome):
            return {"question_ids": [r["id"] for r in mine], "correct": [r[outcome] for r in mine]}

        rate = {o: sum(r[o] for r in mine) / len(mine) for o in ("refine", "persist", "concede")}
        tokens = sum(r["refine_tokens"] for r in mine) / len(mine)
        lines.append(
            f"| {label} | {name} | {len(mine)} | "
            f"{rate['refine']:.3f} | {rate['persist']:.3f} | {rate['concede']:.3f} | "
            f"{format_paired(paired_difference(of('refine'), of('persist')))} | "
            f"{format_paired(paired_difference(of('refine'), of('concede')))} | {tokens:.0f} |"
        )
    return lines


def by_agent(rows):
    """Per agent (a row's id ends with :<agent>), the share of its states where its own answer
    (PERSIST) and its REFINE end right, as "agent i p → r"."""
    of = {}
    for r in rows:
        of.setdefault(int(r["id"].rsplit(":", 1)[1]), []).append(r)
    return ", ".join(
        f"agent {agent} {sum(r['persist'] for r in mine) / len(mine):.3f} → "
        f"{sum(r['refine'] for r in mine) / len(mine):.3f}"
        for agent, mine in sorted(of.items())
    )


def revision_change(before, after, seeds=(0, 1, 2), view="whole"):
    """The trained agents (`after`'s files) against those they started from (`before`'s) on the
    same test questions and view: REFINE, PERSIST (the agent's first answer) and the policy's
    CONCEDE ending right, after minus before, pooled over the seeds with both files. Paired by
    question, a question's agents averaged: its agents share its difficulty, so the interval
    resamples questions, not (question, agent) pairs."""
    pairs = {}
    for seed in seeds:
        files = [load(f"revision/{prefix}-seed{seed}-{view}.json") for prefix in (before, after)]
        if None not in files:
            pairs[seed] = [f["rows"] for f in files]
    if not pairs:
        return missing(f"revision/{after}-seed<k>-{view}.json")
    cells = []
    for outcome in ("refine", "persist", "concede"):
        then, now = (
            per_question({seed: rows[k] for seed, rows in pairs.items()}, outcome) for k in (0, 1)
        )
        cells.append(f"{outcome.upper()} {format_paired(paired_difference(now, then))}")
    return (
        f"After − before training ({view} view), paired over the same "
        f"{len(now['question_ids'])} questions (seeds {','.join(map(str, pairs))}; each "
        "question's agents averaged): " + ", ".join(cells) + "."
    )


def per_question(rows_by_seed, outcome):
    """A summary whose `correct` is, per seed and question, the share of its agents' rows where
    `outcome` ended right (a row's id is <question>:<agent>)."""
    of = {}
    for seed, rows in rows_by_seed.items():
        for r in rows:
            of.setdefault(f"{seed}:{r['id'].rsplit(':', 1)[0]}", []).append(r[outcome])
    return {
        "question_ids": list(of),
        "correct": [sum(values) / len(values) for values in of.values()],
    }
