"""Split-information arithmetic (docs/design.md §9): the task where reading the peers carries
information. Each question is a short problem over three named values, one per fact ("Tom has 12
apples."), whose answer needs all three. On a *split* question the facts are dealt among the agents
so that no agent holds every value and together they hold them all; an agent reads the others as
unknown ("Anna has some apples (you do not know how many)."). On a *shared* question every agent
holds every value, and the question reads as one text.

Pools: as arith's. Each level has one fixed random stream (random.Random(_SEED + level), integer
draws only), and a question goes to the test split when the sha256 of its full text says so
(data.split_of), so a question in a test pool is never in a train pool; 10,000 train and 2,000 test
questions a level. Level 1 adds or takes away small values; 2 the same with larger ones and
comparisons; 3 and 4 multiply (packs, weeks) before taking away.

The deal (deal): which questions are split (a share of them) and which values each agent holds,
drawn from a stream seeded by the question's id and the deal's settings alone: the same on every
machine and in every run, whatever subset of the pool is loaded. Agent i holds `held` of the three
facts, starting at a drawn offset and i * held after it (cyclically), so with agents x held >= 3 the
agents together hold every value and, with held < 3, none holds all.
"""

import functools
import random
from dataclasses import replace

from .arith import LEVELS, POOL_SIZE
from .arith_templates import ITEMS, NAMES
from .example import Example, split_of
from .steps import expression_steps

FACTS = 3
_SEED = 4721


def _names(r):
    """Three different people (name, subject pronoun)."""
    picked = []
    while len(picked) < FACTS:
        name, he, *_ = NAMES[r.randrange(len(NAMES))]
        if name not in [n for n, _ in picked]:
            picked.append((name, he))
    return picked


def together(r, level):
    """Three people's items, counted together."""
    (a, _), (b, _), (c, _) = _names(r)
    item = ITEMS[r.randrange(len(ITEMS))]
    hi = (0, 30, 200, 500, 2000)[level]
    v = [r.randint(2, hi) for _ in range(FACTS)]
    facts = [
        (f"{who} has {x} {item}.", f"{who} has some {item} (you do not know how many).")
        for who, x in zip((a, b, c), v)
    ]
    query = f"How many {item} do {a}, {b} and {c} have together?"
    return facts, query, v, "{0} + {1} + {2}"


def left(r, level):
    """A stock that two people take from."""
    (a, _), (b, _), _ = _names(r)
    item = ITEMS[r.randrange(len(ITEMS))]
    hi = (0, 30, 200, 500, 2000)[level]
    taken = [r.randint(2, hi), r.randint(2, hi)]
    v = [sum(taken) + r.randint(1, hi), *taken]
    facts = [
        (f"A box holds {v[0]} {item}.", f"A box holds some {item} (you do not know how many)."),
        (f"{a} takes {v[1]} of them.", f"{a} takes some of them (you do not know how many)."),
        (f"{b} takes {v[2]} of them.", f"{b} takes some of them (you do not know how many)."),
    ]
    return facts, f"How many {item} are left in the box?", v, "{0} - {1} - {2}"


def packs(r, level):
    """Packs of items bought, then some given away."""
    (a, he), _, _ = _names(r)
    item = ITEMS[r.randrange(len(ITEMS))]
    k, m = r.randint(2, 3 * level), r.randint(3, (0, 10, 20, 40, 100)[level])
    v = [k, m, r.randint(1, k * m - 1)]
    He = he.capitalize()
    facts = [
        (f"{a} buys {k} packs of {item}.", f"{a} buys some packs of {item} (you do not know "
         "how many)."),
        (f"Each pack holds {m} {item}.", f"Each pack holds some {item} (you do not know how "
         "many)."),
        (f"{He} gives away {v[2]} {item}.", f"{He} gives away some {item} (you do not know how "
         "many)."),
    ]  # fmt: skip
    return facts, f"How many {item} does {he} have left?", v, "{0} * {1} - {2}"


TEMPLATES = {1: (together, left), 2: (together, left), 3: (together, left, packs), 4: (packs,)}


@functools.lru_cache(maxsize=None)
def _pools(level):
    """Both pools of one level as tuples of (question, answer, facts, query, template, form,
    values): `form` the answer's expression over the values' places ("{0} + {1} + {2}")."""
    r = random.Random(_SEED + level)
    pools, seen = {"train": [], "test": []}, set()
    for _ in range(50 * sum(POOL_SIZE.values())):
        if all(len(pools[s]) >= POOL_SIZE[s] for s in pools):
            return {s: tuple(p) for s, p in pools.items()}
        templates = TEMPLATES[level]
        template = templates[r.randrange(len(templates))]
        facts, query, values, form = template(r, level)
        question = " ".join([*(known for known, _ in facts), query])
        if question in seen:
            continue
        seen.add(question)
        split = split_of(question)
        if len(pools[split]) < POOL_SIZE[split]:
            answer = expression_steps(form.format(*values))[1]
            item = (question, answer, tuple(facts), query, template.__name__, form, tuple(values))
            pools[split].append(item)
    raise RuntimeError(f"split level {level}: templates too narrow to fill the pools")


def load(split="train", level=1):
    """The full pool of a split (level 1-4, or 0 / "mix": all four one after the other), every
    question shared (every agent holds every value) until `deal` deals them."""
    if split not in POOL_SIZE:
        raise ValueError(f"split has splits {sorted(POOL_SIZE)}, not {split!r}")
    levels = LEVELS if level in (0, "mix") else (level,)
    if not set(levels) <= set(LEVELS):
        raise ValueError(f"split level must be 1, 2, 3, 4, or 0/'mix' for all; got {level!r}")
    return [
        Example(
            question=question,
            answer=str(answer),
            task="split",
            id=f"split/{split}/L{lv}/{i}",
            meta={
                "level": lv,
                "template": template,
                "expr": form.format(*values),
                "form": form,
                "values": list(values),
                "split": split,
                "facts": [list(f) for f in facts],
                "query": query,
            },
        )
        for lv in levels
        for i, (question, answer, facts, query, template, form, values) in enumerate(
            _pools(lv)[split]
        )
    ]


def deal(examples, agents, held, share):
    """The examples with their facts dealt (meta["views"]: the facts each of `agents` agents holds,
    meta["dealt"]: whether the question is split): a `share` of them split, each agent holding
    `held` of a split question's values; the others shared. Seeded by each question's id and the
    three settings alone."""
    if not 1 <= held < FACTS or agents * held < FACTS:
        raise ValueError(
            f"{agents} agents holding {held} of {FACTS} values each: the agents must together hold "
            "every value and none all of them"
        )
    dealt = []
    for ex in examples:
        r = random.Random(f"{ex.id}|{agents}|{held}|{share}")
        split = r.random() < share
        offset = r.randrange(FACTS)
        views = [
            sorted({(offset + i * held + j) % FACTS for j in range(held)})
            if split
            else list(range(FACTS))
            for i in range(agents)
        ]
        dealt.append(replace(ex, meta={**ex.meta, "views": views, "dealt": split}))
    return dealt


def worked(example, agent=None):
    """A worked solution of a split-task question from what `agent` holds (None: every value, as
    after reading the peers): the facts it holds, stated as the question states them, each value it
    lacks said so and counted as 0, then the steps and `Answer: n` (right when it holds every
    value)."""
    views = example.meta.get("views")
    held = set(views[agent]) if views and agent is not None else set(range(FACTS))
    lines, values = [], []
    for k, ((known, unknown), value) in enumerate(
        zip(example.meta["facts"], example.meta["values"])
    ):
        if k in held:
            lines.append(known)
            values.append(value)
        else:
            lines.append(f"Not known: {unknown.split(' (you do not know')[0]}. I count it as 0.")
            values.append(0)
    steps, value = expression_steps(example.meta["form"].format(*values))
    return "\n".join([*lines, *steps, f"Answer: {value}"])
