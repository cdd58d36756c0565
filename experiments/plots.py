"""The README's pictures, drawn by experiments/report.py from the numbers its tables read out of
results/.

Each function writes one PNG to `path` and returns True, or returns False where matplotlib is not
installed (report.py then writes the tables without their pictures and says how to get them)."""

from statistics import fmean as mean

from stats import sample_std


def pyplot():
    """matplotlib's pyplot on a file-only backend, or None where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def frontier(runs, title, path, line=()):
    """Accuracy against tokens per question, one point per protocol (mean over its seeds, ± sample
    std). runs: {protocol: {seed: eval.py summary}}; `line`: protocols joined by a dashed line in
    the order of their tokens (a Pareto frontier)."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    if line:
        joined = sorted(
            tuple(
                mean([s[k] for s in runs[p].values()]) for k in ("tokens_per_question", "accuracy")
            )
            for p in line
        )
        ax.plot(*zip(*joined), linestyle="--", color="gray", label="the rules' frontier")
        ax.legend(loc="lower right", fontsize=8)
    # points already labelled: a label next to a point at the same place goes below the others
    placed = []
    for part, by_seed in runs.items():
        accuracy = [s["accuracy"] for s in by_seed.values()]
        tokens = mean([s["tokens_per_question"] for s in by_seed.values()])
        ax.errorbar(tokens, mean(accuracy), yerr=sample_std(accuracy), marker="o", capsize=3)
        near = sum(abs(tokens / t - 1) < 0.1 and abs(mean(accuracy) - a) < 0.01 for t, a in placed)
        ax.annotate(
            part,
            (tokens, mean(accuracy)),
            textcoords="offset points",
            xytext=(5, 4 - 10 * near),
            fontsize=8,
        )
        placed.append((tokens, mean(accuracy)))
    ax.set(
        xscale="log",
        xlabel="tokens per question (log)",
        ylabel="accuracy (mean over seeds)",
        title=title,
    )
    return save(plt, fig, path)


def actions_by_round(runs, path):
    """The share of each action in each decision round, one panel per protocol of `runs` (mean over
    seeds)."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(
        1, len(runs), figsize=(2.6 * len(runs), 3.2), sharey=True, squeeze=False
    )
    for ax, (part, by_seed) in zip(axes[0], runs.items()):
        rounds = min(len(s["actions_by_round"]) for s in by_seed.values())
        bottom = [0.0] * rounds
        for kind in ("persist", "refine", "concede"):
            share = [
                mean([s["actions_by_round"][t][kind] for s in by_seed.values()])
                for t in range(rounds)
            ]
            ax.bar(range(1, rounds + 1), share, bottom=bottom, label=kind)
            bottom = [b + v for b, v in zip(bottom, share)]
        ax.set(title=part, xlabel="decision round", xticks=range(1, rounds + 1))
    axes[0][0].set(ylabel="share of the actions")
    axes[0][-1].legend(fontsize=8)
    return save(plt, fig, path)


def reward_scale(curves, algos, path):
    """Table c: one panel per algorithm of `algos`, one line per reward variant: {(algo, variant):
    [(step, validation accuracy)]}."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(
        1, len(algos), figsize=(5 * len(algos), 3.6), sharey=True, squeeze=False
    )
    for ax, algo in zip(axes[0], algos):
        for (name, variant), points in curves.items():
            if name == algo:
                ax.plot(*zip(*points), marker="o", label=variant)
        ax.set(title=algo, xlabel="optimizer step", ylabel="validation accuracy")
        ax.legend(title="rewards", fontsize=8)
    return save(plt, fig, path)


def training_curves(runs, path):
    """Held-out accuracy and mean training reward over steps, one line per run: {name: (validation
    points [(step, accuracy)], training records with "step" and "mean_reward")}."""
    plt = pyplot()
    if plt is None:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, (val, train) in runs.items():
        left.plot(*zip(*val), marker="o", label=name)
        right.plot([r["step"] for r in train], [r["mean_reward"] for r in train], label=name)
    left.set(xlabel="optimizer step", ylabel="held-out accuracy (greedy)", title="validation")
    right.set(xlabel="optimizer step", ylabel="mean reward of the rollouts", title="training")
    left.legend(fontsize=8)
    return save(plt, fig, path)
