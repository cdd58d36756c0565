"""Built-in arithmetic word problems: the embedded default task (docs/design.md §9).

Ten templates (arith_templates.py), four levels. Level 1 is one operation on small numbers ("Tom has
12 apples and buys 30 more. How many apples does he have now?"); each level adds a step and widens
the numbers, up to level 4 with three to five operations on numbers in the hundreds or thousands.
Every answer is a non-negative integer by construction (divisions are built from their quotient),
and every template also returns its solution as a Python expression over the numbers printed in the
question (meta["expr"]), so a test can re-derive it.

Pools. Each level has one fixed random stream (random.Random(_SEED + level), integer draws only, no
float, no hash(), no set order), so the pools are identical on every machine. Each new question goes
to the test split when the sha256 of its text says so (about 1 in 6), else to train, until train
holds 10000 and test 2000 unique questions. Because the split is a function of the text alone, a
question that is in any test pool is never in any train pool, whatever the level. load_task's n/seed
then subsample a pool.
"""

import functools
import random

from .arith_templates import (  # noqa: F401 (re-exported: data.arith keeps every public name)
    BAKERS,
    FOODS,
    GOODS,
    ITEMS,
    NAMES,
    RELATIVES,
    TEMPLATES,
    VEHICLES,
    WISHES,
    ages,
    bakery,
    buy_more,
    compare,
    percent,
    rate_time,
    savings,
    share,
    shopping,
    spending,
)
from .example import Example, split_of

LEVELS = (1, 2, 3, 4)
POOL_SIZE = {"train": 10000, "test": 2000}
_SEED = 9173  # changing it changes every pool (and the golden hash in tests/test_data.py)
_TEMPLATE_LIST = tuple(TEMPLATES.items())  # fixed order: the stream picks templates by index


@functools.lru_cache(maxsize=None)
def _pools(level: int) -> dict:
    """Both pools of one level as tuples of (question, answer, template, expr). Cached: ~0.1 s per
    level."""
    r = random.Random(_SEED + level)
    pools = {"train": [], "test": []}
    seen = set()  # membership only; its order is never used
    for _ in range(50 * sum(POOL_SIZE.values())):
        if all(len(pools[s]) >= POOL_SIZE[s] for s in pools):
            return {s: tuple(p) for s, p in pools.items()}
        tname, template = _TEMPLATE_LIST[r.randrange(len(_TEMPLATE_LIST))]
        question, answer, expr = template(r, level)
        if question in seen:
            continue
        seen.add(question)
        split = split_of(question)
        if len(pools[split]) < POOL_SIZE[split]:
            pools[split].append((question, answer, tname, expr))
    raise RuntimeError(f"arith level {level}: templates too narrow to fill the pools")


def load(split: str = "train", level=1) -> list[Example]:
    """The full pool of a split: level 1-4, or 0 / "mix" for all four levels one after the other."""
    if split not in POOL_SIZE:
        raise ValueError(f"arith has splits {sorted(POOL_SIZE)}, not {split!r}")
    if level in (0, "mix"):
        levels = LEVELS
    elif isinstance(level, int) and not isinstance(level, bool) and level in LEVELS:
        levels = (level,)
    else:
        raise ValueError(f"arith level must be 1, 2, 3, 4, or 0/'mix' for all; got {level!r}")
    out = []
    for lv in levels:
        for i, (question, answer, tname, expr) in enumerate(_pools(lv)[split]):
            out.append(
                Example(
                    question=question,
                    answer=str(answer),
                    task="arith",
                    id=f"arith/{split}/L{lv}/{i}",
                    meta={"level": lv, "template": tname, "expr": expr, "split": split},
                )
            )
    return out
