"""Tasks for the deliberation game (docs/design.md §9): loading questions, reading and judging
answers.

    from data import load_task, extract_answer, is_correct
    examples = load_task("arith", split="test", n=64, seed=0, level=1)
    examples = load_task("gsm8k", path="/work/shared/data/gsm8k/train.jsonl")
    pred = extract_answer(completion, ex.task)          # "42", "B", "\\frac{3}{4}" or None
    pred = strict_answer(completion, ex.task)           # the training reward's reading
    reward = float(is_correct(pred, ex.answer, ex.task))

A script's task flags (--task, --path, --level) are checked by check_task. Modules: example.py
(Example, DataError), answers.py (extraction and comparison), arith.py (the built-in generator; its
templates in arith_templates.py), files.py (the file formats), worked.py (worked solutions).
"""

import random
from pathlib import Path
from types import SimpleNamespace

from . import arith
from . import split as split_task
from .answers import (
    ANSWER_TASKS,
    answer_kind,
    extract_answer,
    is_correct,
    last_boxed,
    lenient_only,
    normalize_number,
    strict_answer,
)
from .example import DataError, Example, split_of
from .files import FILE_TASKS, load_stats, read_records

TASKS = ("arith", "arith1", "arith2", "arith3", "arith4", "split") + tuple(FILE_TASKS)

__all__ = [
    "Example",
    "DataError",
    "TASKS",
    "ANSWER_TASKS",
    "load_task",
    "extract_answer",
    "strict_answer",
    "lenient_only",
    "is_correct",
    "normalize_number",
    "answer_kind",
    "last_boxed",
    "load_stats",
    "read_records",
    "split_of",
    "training_pool",
    "training_questions",
    "check_task",
    "task_options",
]


def check_task(cfg):
    """A script's task flags (--task, --path, --level), before anything is loaded: a mistake is one
    line (DataError)."""
    if cfg.task not in TASKS:
        raise DataError(f"unknown --task {cfg.task!r}: choose one of {', '.join(TASKS)}")
    if cfg.task in FILE_TASKS and not cfg.path:
        raise DataError(f"--task {cfg.task} reads a data file: pass it with --path")
    if cfg.path and not Path(cfg.path).is_file():
        raise DataError(f"--path {cfg.path!r}: no such file")
    if cfg.path and cfg.task not in FILE_TASKS:
        raise DataError(f"--path {cfg.path!r}: task {cfg.task} is generated and reads no file")
    if not 0 <= cfg.level <= 4:
        raise DataError(f"--level {cfg.level}: choose 1..4 (0: the task's default)")
    if cfg.task == "split":
        if not 0 <= cfg.split_questions <= 1:
            raise DataError(f"--split-questions {cfg.split_questions}: a share, in [0, 1]")
        if not 1 <= cfg.values_held < split_task.FACTS or cfg.agents * cfg.values_held < 3:
            raise DataError(
                f"--values-held {cfg.values_held} with --agents {cfg.agents}: each agent holds 1 "
                f"or 2 of a question's {split_task.FACTS} values, and together they hold all"
            )


def task_options(cfg):
    """What load_task takes from a script's flags beside the task: --level, and for task split the
    deal (--agents, --values-held, --split-questions)."""
    kw = {"level": cfg.level} if cfg.level else {}
    if cfg.task == "split":
        kw |= {"agents": cfg.agents, "held": cfg.values_held, "share": cfg.split_questions}
    return kw


def load_task(
    name: str, path=None, split: str | None = None, n: int | None = None, seed: int = 0, **kw
) -> list[Example]:
    """The examples of a task, all of them (n=None) or a seeded random subset of n.

    name:  "arith" (built-in; level=1..4, or 0/"mix"; default 1), "arith1".."arith4" (a fixed
           level), "split" (built-in, its values dealt among agents: level, agents=3, held=2,
           share=0.5; data/split.py), or a file task: "gsm8k", "mawps", "svamp", "mc", "math",
           which need path.
    split: "train" (the default) or "test" for arith. For a file task: "all" (the default) is the
           whole file; "train" / "test" divide it by a hash of each question's text (about 1 in 6
           to test, data.split_of), so a policy trained on a file's train split is evaluated on
           questions it never saw.
    n, seed: random.Random(seed).sample(all_examples, n); n larger than the task is an error.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    if name.startswith("arith"):
        if path is not None:
            raise ValueError(f"task {name!r} is generated, it takes no path (got path={path!r})")
        level = kw.pop("level", None)
        if name != "arith":  # "arith3" is arith at level 3
            if level is not None and level != int(name[-1]):
                raise ValueError(f"task {name!r} is level {name[-1]}; got level={level!r}")
            level = int(name[-1])
        elif level is None:
            level = 1  # the embedded default task: easy
        if kw:
            raise ValueError(
                f"unexpected option(s) for task {name!r}: {', '.join(sorted(kw))} (known: level)"
            )
        examples = arith.load(split or "train", level)
    elif name == "split":
        if path is not None:
            raise ValueError(f"task {name!r} is generated, it takes no path (got path={path!r})")
        deal = {"agents": 3, "held": 2, "share": 0.5} | kw
        level = deal.pop("level", 1)
        if set(deal) != {"agents", "held", "share"}:
            raise ValueError(
                f"unexpected option(s) for task {name!r}: "
                f"{', '.join(sorted(set(deal) - {'agents', 'held', 'share'}))}"
            )
        examples = split_task.deal(split_task.load(split or "train", level), **deal)
    else:
        if path is None:
            raise ValueError(
                f"task {name!r} reads a file: pass path=... (e.g. a .jsonl/.json/.csv file)"
            )
        if kw:
            raise ValueError(f"unexpected option(s) for task {name!r}: {', '.join(sorted(kw))}")
        split = split or "all"
        if split not in ("all", "train", "test"):
            raise ValueError(f"a file task has splits all, train and test, not {split!r}")
        examples = [
            ex for ex in FILE_TASKS[name](path) if split == "all" or split_of(ex.question) == split
        ]
        for ex in examples:
            ex.meta["split"] = split

    if n is None:
        return examples
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int or None, got {n!r}")
    if n > len(examples):
        raise ValueError(
            f"asked for n={n} examples but task {name!r} ({split}) has only {len(examples)}"
        )
    return random.Random(seed).sample(examples, n)


def training_pool(cfg):
    """The training split of a script's task (of a file: the ~5/6 that split_of puts in train) in a
    seeded shuffle (cfg: task, path, level, seed, and what task_options reads); the first `val_n`
    are the validation questions."""
    pool = load_task(cfg.task, path=cfg.path or None, split="train", **task_options(cfg))
    random.Random(cfg.seed).shuffle(pool)
    return pool


def training_questions(cfg, iteration=0):
    """(training questions of `iteration`, validation questions): disjoint slices of training_pool.
    The validation slice comes first, so it stays the same as the questions or iterations grow."""
    pool = training_pool(cfg)
    start = cfg.val_n + iteration * cfg.questions
    if start + cfg.questions > len(pool):
        raise DataError(
            f"task {cfg.task!r} has {len(pool)} training questions: not enough for "
            f"val_n={cfg.val_n} + questions={cfg.questions} per iteration over {iteration + 1} "
            "iteration(s)"
        )
    return pool[start : start + cfg.questions], pool[: cfg.val_n]


def trained_questions(trainings):
    """The question texts the recorded training runs drew (`trainings`: each a run's settings as a
    dict, as training_questions reads them: task, path, level, seed, val_n, questions, the task's
    options). A run whose settings do not say which questions it drew is refused."""
    seen = set()
    for settings in trainings:
        if not {"task", "seed", "val_n", "questions"} <= settings.keys():
            raise DataError(
                f"a training run of {settings.get('out_dir') or 'unknown origin'} does not record "
                "which questions it drew (task, seed, val_n, questions)"
            )
        run = SimpleNamespace(**{"path": "", "level": 0, **settings})
        seen |= {example.question for example in training_questions(run)[0]}
    return seen
