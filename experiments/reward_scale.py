"""Reward-scale study (issue 4): SoftRankPO vs GRPO when the rewards are scaled by 0.1, 1, 10 or passed
through exp, on the same corpus; validation accuracy over training steps, as a PNG plot and as JSON.

    python experiments/reward_scale.py --init runs/exp/sft/policy.pt --out-dir runs/scale [train_rl flags]

Every run is train_rl.py with --eval-every; their corpora hold the same games (the generations are cached),
so the runs differ only in how the rewards reach the loss. Needs matplotlib for the PNG (pip install
matplotlib); without it the numbers are still written.
"""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import policy  # noqa: E402
import train_rl  # noqa: E402
from training import parse_config  # noqa: E402

VARIANTS = {"x0.1": (0.1, "none"), "x1": (1.0, "none"), "x10": (10.0, "none"), "exp": (1.0, "exp")}


def curves(out_dir):
    curves = {}
    for run_dir in sorted(Path(out_dir).iterdir()):
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        curves[run_dir.name] = [(r["step"], r["val_accuracy"]) for r in lines if "val_accuracy" in r]
    return curves


def weight_gaps(runs_dir):
    """Max |w - w_x1| of each run's final policy against its algorithm's unscaled run: 0 means the reward
    variant did not change training at all (what a rank-based advantage promises for increasing maps)."""
    def weights(name):
        return policy.load_policy(runs_dir / name / "policy.pt").state_dict()
    gaps = {}
    for algo in ("softrank", "grpo"):
        reference = weights(f"{algo}-x1")
        for name in VARIANTS:
            other = weights(f"{algo}-{name}")
            gaps[f"{algo}-{name}"] = max((other[k] - reference[k]).abs().max().item() for k in reference)
    return gaps


def plot(curves, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, algo in zip(axes, ("softrank", "grpo")):
        for name, points in curves.items():
            if name.startswith(algo + "-"):
                ax.plot(*zip(*points), marker="o", label=name[len(algo) + 1:])
        ax.set(title=algo, xlabel="optimizer step", ylabel="validation accuracy")
        ax.legend(title="rewards")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    base = parse_config(train_rl.Config)
    if not base.eval_every:
        base = dataclasses.replace(base, eval_every=10)
    root = Path(base.out_dir)
    for algo in ("softrank", "grpo"):
        for name, (scale, transform) in VARIANTS.items():
            train_rl.main(dataclasses.replace(base, algo=algo, reward_scale=scale, reward_transform=transform,
                                              out_dir=str(root / "runs" / f"{algo}-{name}")))
    result, gaps = curves(root / "runs"), weight_gaps(root / "runs")
    (root / "curves.json").write_text(json.dumps({"val_accuracy": result, "max_abs_dw_vs_x1": gaps}, indent=1))
    for name, points in result.items():
        print(f"{name:<16}" + " ".join(f"{step}:{acc:.3f}" for step, acc in points)
              + f"   max|dw| vs x1: {gaps[name]:.1e}")
    plot(result, root / "reward_scale.png")
