"""What SoftRankPO's advantages and objective do, printed (results/README.md, "SoftRankPO
advantages").

    python -m experiments.softrank_demo

First one group of K = 6 rewards with one lucky outlier: SoftRank advantages depend only on the
order of the rewards, GRPO's on their values. Then gradient descent on the two forms of the
objective: the expected advantage (softrank_loss) levels off at its optimum pi*, the literal form
(unweighted_softrank_loss) falls for ever.
"""

import torch

from softrank import (
    grpo_advantages,
    optimal_policy,
    softrank_advantages,
    softrank_loss,
    unweighted_softrank_loss,
)


def objective_demo(steps=3000, lr=5e-2, lam=0.01, seed=0):
    """Adam on 64 random states (the logits themselves are the parameters), SoftRank advantages of
    random rewards: the expected-advantage objective levels off at pi*, the literal form falls for
    ever. The six runs (3 betas x 2 objectives) share one optimizer: Adam is elementwise, so each
    run is as if alone."""
    g = torch.Generator().manual_seed(seed)
    start, ref = torch.randn(64, 4, generator=g), torch.randn(64, 4, generator=g)
    advantages = softrank_advantages(torch.randint(0, 4, (64, 4), generator=g).float())
    runs = [
        (beta, name, loss_fn)
        for beta in (0.05, 1.0, 10.0)
        for name, loss_fn in (("expected", softrank_loss), ("unweighted", unweighted_softrank_loss))
    ]
    x = start.repeat(len(runs), 1, 1).requires_grad_()
    optimizer = torch.optim.Adam([x], lr=lr)
    losses = []
    for _ in range(steps):
        per_run = [
            loss_fn(x[r], advantages, ref, beta, lam)[0]
            for r, (beta, _, loss_fn) in enumerate(runs)
        ]
        optimizer.zero_grad()
        torch.stack(per_run).sum().backward()
        optimizer.step()
        losses.append([loss.item() for loss in per_run])
    x = x.detach()
    print(
        f"\nAdam (lr {lr}) on 64 random states, K = 4, lam = {lam}: loss after 1000 / 2000 / 3000 "
        "steps, the largest |centered logit|, and for the expected advantage max |pi - pi*|."
    )
    for r, (beta, name, _) in enumerate(runs):
        gap = (
            (torch.softmax(x[r], -1) - optimal_policy(advantages, ref, beta, lam))
            .abs()
            .max()
            .item()
        )
        print(
            f"beta {beta:>5}  {name:<10}  "
            + " / ".join(f"{losses[k - 1][r]:8.3f}" for k in (1000, 2000, 3000))
            + f"   max |logit| {(x[r] - x[r].mean(-1, keepdim=True)).abs().max().item():6.1f}"
            + (f"   max |pi - pi*| {gap:.1e}" if name == "expected" else "")
        )


if __name__ == "__main__":
    r = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.5, 2.0], dtype=torch.float64)  # one lucky outlier
    columns = {"r": r}
    for name, x in [("r", r), ("10r", 10 * r), ("exp r", r.exp())]:
        columns[f"GRPO({name})"] = grpo_advantages(x)
        columns[f"SoftRank({name})"] = softrank_advantages(x)
    print("One group of K = 6 rewards; advantages per action (SoftRank tau = 0.5).")
    widths = [max(len(c) + 2, 8) for c in columns]
    print("action" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths)))
    for k in range(len(r)):
        print(
            f"{k:>6}" + "".join(f"{c[k].item():>+{w}.3f}" for c, w in zip(columns.values(), widths))
        )
    print(
        "SoftRank: identical for r, 10r and exp r (only the order counts). GRPO: same for 10r, "
        "not exp r."
    )
    objective_demo()
