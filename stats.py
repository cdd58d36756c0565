"""The statistics every reported number goes through: eval.py's table and the reports of
experiments/ share them.

  paired_difference  - accuracy of one protocol minus another on the same questions, with its 95%
                       bootstrap interval and the questions on which they disagree
  pooled             - per-seed summaries as one summary over every (seed, question) pair
  format_paired      - a paired difference as the tables print it
  sample_std         - the spread over seeds (n - 1)
  auroc              - how well a confidence score separates right answers from wrong ones
"""

import statistics

import numpy as np


def paired_difference(summary, reference, resamples=10_000, seed=0):
    """Accuracy of `summary` minus `reference` on the same questions (matched by id): the mean
    difference, its 95% percentile bootstrap interval (questions resampled with replacement) and the
    number of questions on which the two disagree (only those move the difference)."""
    theirs = dict(zip(reference["question_ids"], reference["correct"]))
    if set(theirs) != set(summary["question_ids"]):
        raise ValueError("a paired difference needs both protocols on the same questions")
    d = np.array(
        [float(ok) - float(theirs[q]) for q, ok in zip(summary["question_ids"], summary["correct"])]
    )
    means = d[np.random.default_rng(seed).integers(0, len(d), (resamples, len(d)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "diff": float(d.mean()),
        "ci95": [float(low), float(high)],
        "disagree": int((d != 0).sum()),
    }


def pooled(by_seed):
    """One protocol's per-seed summaries ({seed: summary}) as one summary over every (seed,
    question) pair: a paired difference of two such summaries is pooled over the seeds."""
    return {
        "question_ids": [f"{seed}:{q}" for seed, s in by_seed.items() for q in s["question_ids"]],
        "correct": [ok for s in by_seed.values() for ok in s["correct"]],
    }


def format_paired(v):
    """A paired_difference as the tables print it: +0.050 [-0.025, +0.120] (54 disagree)."""
    return f"{v['diff']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}] ({v['disagree']})"


def sample_std(values):
    """The sample standard deviation (n - 1): with 2-3 seeds the population std understates the
    spread."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def auroc(scores, labels):
    """P(score of a positive > score of a negative), ties half; None without both classes."""
    positives = [s for s, y in zip(scores, labels) if y]
    negatives = [s for s, y in zip(scores, labels) if not y]
    if not positives or not negatives:
        return None
    wins = sum((p > q) + 0.5 * (p == q) for p in positives for q in negatives)
    return wins / (len(positives) * len(negatives))
