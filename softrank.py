"""SoftRankPO: rank-based advantages and the policy losses that use them (docs/design.md §6).

Read top to bottom:
  1. Advantages - softrank_advantages (paper Eq. 2), and the baselines rank_advantages (GOPO),
                  grpo_advantages, mean_baseline_advantages (MAGRPO), rloo_advantages (C3);
                  group_advantages, the LLM trainers' choice of one.
  2. Losses over the whole action set - softrank_loss (paper Eq. 3: the expected advantage,
                  bounded, with its optimum optimal_policy), rank_matching_loss (paper Eq. 4), and
                  the unbounded literal form unweighted_softrank_loss, kept to show why it is not
                  used.
  3. Losses on sampled actions - ppo_clip_loss, kl_k3, and for LLMs the token-level
                  policy_gradient_loss, both through aggregate (DAPO / GRPO / Dr.GRPO / MAGRPO
                  weightings) with step_normalizer for exact gradient accumulation.
The LLM-weight trainers' optimizer step that uses section 3 is llm_step.policy_step. This file is
tensor math alone (torch only): it can be copied into another project as it is.
`python -m experiments.softrank_demo` shows SoftRank against GRPO advantages under reward
transforms, and the expected-advantage objective against the unbounded literal form under gradient
descent.

Conventions:
  - A group is the last dim (..., K): the K actions of one state, or the K rollouts of one prompt.
  - `mask` (bool, same shape, True = the action exists) lets groups of different sizes share one
    batch. Every group needs at least one existing action.
  - Advantages and reference log-probs are constants: the losses detach them.
  - Every *_loss returns (loss, stats); stats is a dict of python floats, for logging.
"""

import torch

# --------------------------------------------------------------------------------------------------
# 1. Advantages
# --------------------------------------------------------------------------------------------------


def _mask_like(x, mask):
    return torch.ones_like(x, dtype=torch.bool) if mask is None else mask.bool()


def _mean(x, m):
    """Mean over the last dim counting only the entries where m is True (keepdim). where, not x * m:
    a masked entry may hold inf or nan, and 0 * inf = nan."""
    return torch.where(m, x, 0).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)


def _std(x, m):
    """Population std (divide by n, not n - 1) over the entries where m is True (keepdim)."""
    return _mean((x - _mean(x, m)) ** 2, m).sqrt()


def flat_groups(rewards, mask=None):
    """(..., 1) True for groups whose existing rewards are all equal: nothing to prefer, so every
    advantage below is 0 exactly (z-scoring would divide rounding noise by a tiny std), and the
    group teaches the full-action-set losses nothing. The one test of "a flat group" (logged as
    frac_zero_std)."""
    m = _mask_like(rewards, mask)
    hi = rewards.masked_fill(~m, -torch.inf).amax(-1, keepdim=True)
    lo = rewards.masked_fill(~m, torch.inf).amin(-1, keepdim=True)
    return hi == lo


def _average_ranks(rewards, m):
    """(0-based ascending rank of each reward among the existing ones of its group, tied rewards
    sharing their average rank; K, the group's count of existing entries, keepdim)."""
    # pairwise comparison, O(K^2): K is the number of actions or rollouts, a handful
    r_k = rewards.unsqueeze(-1)  # (..., K, 1) the reward being ranked
    r_j = rewards.unsqueeze(-2)  # (..., 1, K) the rewards it is compared with
    m_j = m.unsqueeze(-2)
    below = ((r_j < r_k) & m_j).sum(-1).to(rewards.dtype)
    equal = ((r_j == r_k) & m_j).sum(-1).to(rewards.dtype)  # counts r_k itself
    # the average of the tied ranks below .. below + equal - 1
    return below + (equal - 1) / 2, m.sum(-1, keepdim=True).to(rewards.dtype)


def softrank_advantages(rewards, tau=0.5, eps=1e-6, mask=None):
    """SoftRank advantages (paper Eq. 2), within each group of the last dim:

        rank_k = 0-based ascending rank of r_k; tied rewards share their average rank
        p_k    = ((rank_k + 0.5) / K) ** tau        in (0, 1), so the quantile below is finite
        A*_k   = Phi^-1(p_k)                        standard normal quantile (torch.special.ndtri)
        A_k    = (A*_k - mean A*) / (std A* + eps)  population std

    A depends on the rewards only through their order: any strictly increasing transform of the
    rewards (scale, shift, exp, cube, ...) leaves it unchanged, and an outlier reward cannot swamp
    the group. Tied rewards share a rank, hence p, hence A. tau = 1 spaces the quantiles
    symmetrically; tau < 1 pushes every p toward 1 and skews them. A group whose rewards are all
    equal gets zeros.
    rewards: float (..., K); mask: optional bool (..., K), K is then the count of existing actions.
    """
    m = _mask_like(rewards, mask)
    rank, K = _average_ranks(rewards, m)
    p = ((rank + 0.5) / K) ** tau
    a_star = torch.special.ndtri(p)
    A = (a_star - _mean(a_star, m)) / (_std(a_star, m) + eps)
    return torch.where(flat_groups(rewards, m) | ~m, 0, A)


def rank_advantages(rewards, mask=None):
    """GOPO's plain ranks (arXiv 2602.03876): evenly spaced from -2 (the worst) to +2 (the best),

        A_k = -2 + 4 rank_k / (K - 1)          rank_k as in softrank_advantages (ties averaged)

    Like SoftRank it sees the rewards' order only; unlike SoftRank's normal quantiles, the gaps
    between neighbours are equal, so the extremes weigh no more than the middle. The mean is 0.
    All-equal groups, and groups of one, get zeros."""
    m = _mask_like(rewards, mask)
    rank, K = _average_ranks(rewards, m)
    A = -2 + 4 * rank / (K - 1).clamp(min=1)
    return torch.where(flat_groups(rewards, m) | ~m, 0, A)


def grpo_advantages(rewards, eps=1e-6, mask=None):
    """GRPO advantages: the z-score within the group,  A_k = (r_k - mean r) / (std r + eps),
    population std. Invariant to r -> a r + b (a > 0) but not to other increasing transforms.
    All-equal groups get zeros."""
    m = _mask_like(rewards, mask)
    A = (rewards - _mean(rewards, m)) / (_std(rewards, m) + eps)
    return torch.where(flat_groups(rewards, m) | ~m, 0, A)


def mean_baseline_advantages(rewards, mask=None):
    """MAGRPO advantages: the reward minus the group mean,  A_k = r_k - mean r.
    All-equal groups get zeros."""
    m = _mask_like(rewards, mask)
    A = rewards - _mean(rewards, m)
    return torch.where(flat_groups(rewards, m) | ~m, 0, A)


def rloo_advantages(rewards, mask=None):
    """REINFORCE leave-one-out:  A_k = r_k - mean_{j != k} r_j = K / (K - 1) * (r_k - mean r).
    The baseline excludes r_k, so it is independent of the sample it corrects (unbiased). Over a
    state's counterfactual action rewards it is C3's credit (arXiv 2603.06859): each alternative
    replayed in the same context, against the mean of the others.
    All-equal groups, and groups of one, get zeros."""
    m = _mask_like(rewards, mask)
    K = m.sum(-1, keepdim=True).to(rewards.dtype)
    total = torch.where(m, rewards, 0).sum(-1, keepdim=True)
    A = rewards - (total - rewards) / (K - 1)
    return torch.where(flat_groups(rewards, m) | ~m, 0, A)


# the LLM trainers' --algo: the advantage every sequence of a rollout shares
GROUP_ADVANTAGES = ("magrpo", "grpo", "softrank")


def group_advantages(rewards, algo, tau=0.5, mask=None):
    """(questions, G) rewards -> each rollout's advantage by `algo` (GROUP_ADVANTAGES): magrpo
    (reward - group mean, the paper's), grpo (z-score) or softrank (at temperature tau). `mask`
    (False: a rollout left out) keeps a rollout out of its group's statistics; its advantage is 0.
    """
    if algo == "softrank":
        return softrank_advantages(rewards, tau, mask=mask)
    return {"magrpo": mean_baseline_advantages, "grpo": grpo_advantages}[algo](rewards, mask=mask)


# --------------------------------------------------------------------------------------------------
# 2. Losses over the whole action set (every action's reward is known: no sampling)
# --------------------------------------------------------------------------------------------------


def _log_softmax(logits, m):
    """log pi over the existing actions. A masked action gets pi = 0, but its log pi is returned as
    0, not -inf: then pi * log pi = 0 and A * log pi = 0 instead of nan, and no nan reaches the
    gradient."""
    logp = torch.log_softmax(logits.masked_fill(~m, -torch.inf), dim=-1)
    return logp.masked_fill(~m, 0.0)


def softrank_loss(logits, advantages, ref_logits, beta, lam, *, mask=None):
    """The SoftRankPO objective (paper Eq. 3, read as docs/design.md §6 does), exact over the K
    actions, averaged over states: the KL-regularized expected advantage, as a loss to minimize

        L = -sum_k pi_k A_k + beta * KL(pi(.|s) || pi_ref(.|s)) - lam * H(pi(.|s))
        KL = sum_k pi_k (log pi_k - log pi_ref_k),   H = -sum_k pi_k log pi_k

    This is the exact-over-K form of the paper's trajectory objective E_{a~pi}[A log pi] (the same
    gradient: sum_k pi_k A_k grad log pi_k). It is bounded below (every term is), and its unique
    minimum is

        pi* ∝ exp((A + beta log pi_ref) / (beta + lam)),    i.e. pi_ref exp(A / beta) when lam = 0,

    the solution Eq. 4 (rank_matching_loss) regresses onto: beta is a real trust region, and the
    result does not depend on how long one trains. (The literal -sum_k A_k log pi_k has no minimum:
    see unweighted_softrank_loss.)
    logits, advantages, ref_logits, mask: (..., K). Masked actions (mask False) do not exist: they
    get pi = 0, add nothing to any term and receive exactly zero gradient.
    stats: pg (the mean of -sum_k pi_k A_k), kl, entropy (means over states).
    """
    return _full_set_loss(logits, advantages, ref_logits, beta, lam, mask=mask, weighted=True)


def unweighted_softrank_loss(logits, advantages, ref_logits, beta, lam, *, mask=None):
    """The literal unweighted form, L = -sum_k A_k log pi_k + beta KL - lam H: kept for comparison
    only (train_rl.py --objective unweighted). It is UNBOUNDED below: SoftRank and GRPO advantages
    sum to zero over the K actions, so the gradient on logit k is -A_k whatever pi is; the logits of
    negative-advantage actions fall at a constant rate, the loss decreases linearly forever, and
    beta cannot hold it (the KL term's gradient vanishes as those actions' probabilities go to 0).
    What it learns depends on lr x steps.
    """
    return _full_set_loss(logits, advantages, ref_logits, beta, lam, mask=mask, weighted=False)


def _full_set_loss(logits, advantages, ref_logits, beta, lam, *, mask, weighted):
    m = _mask_like(logits, mask)
    logp = _log_softmax(logits, m)
    ref_logp = _log_softmax(ref_logits.detach(), m)
    pi = logp.exp() * m  # exp(0) = 1 at masked actions: zero it
    A = advantages.detach().masked_fill(~m, 0.0)

    pg = -(pi * A).sum(-1) if weighted else -(A * logp).sum(-1)
    kl = (pi * (logp - ref_logp)).sum(-1)
    entropy = -(pi * logp).sum(-1)
    loss = (pg + beta * kl - lam * entropy).mean()

    stats = {"pg": pg.mean().item(), "kl": kl.mean().item(), "entropy": entropy.mean().item()}
    return loss, stats


def optimal_policy(advantages, ref_logits, beta, lam, mask=None):
    """pi* of softrank_loss: softmax((A + beta log pi_ref) / (beta + lam)) over the existing
    actions."""
    m = _mask_like(advantages, mask)
    z = (advantages.masked_fill(~m, 0.0) + beta * _log_softmax(ref_logits, m)) / (beta + lam)
    return torch.softmax(z.masked_fill(~m, -torch.inf), -1)


def rank_matching_loss(logits, ref_logits, advantages, beta, mask=None):
    """The rank-matching form (paper Eq. 4): regress the centered log-ratio on the centered
    advantages,

        d_k = beta * log(pi_k / pi_ref_k)
        L = mean_{s,k} ((d_k - mean_j d_j) - (A_k - mean_j A_j))^2

    means over the existing actions, then over states. Why it matches the KL-regularized objective
    max_pi sum_k pi_k A_k - beta KL(pi || pi_ref): its optimum is pi ∝ pi_ref exp(A / beta), i.e.
    beta log(pi / pi_ref) = A + const(s). Centering removes const(s) (log Z included), so L = 0
    exactly there, and L measures the distance to it: the same policy softrank_loss reaches when
    lam = 0.
    stats: mse and abs_log_ratio, the mean |log(pi / pi_ref)|.
    """
    m = _mask_like(logits, mask)
    # 0 at masked actions
    log_ratio = _log_softmax(logits, m) - _log_softmax(ref_logits.detach(), m)
    d = beta * log_ratio
    A = advantages.detach().masked_fill(~m, 0.0)
    err = (d - _mean(d, m)) - (A - _mean(A, m))
    loss = _mean(err**2, m).mean()
    stats = {"mse": loss.item(), "abs_log_ratio": _mean(log_ratio.abs(), m).mean().item()}
    return loss, stats


# --------------------------------------------------------------------------------------------------
# 3. Losses on sampled actions
# --------------------------------------------------------------------------------------------------


def ppo_clip_loss(logp, old_logp, advantages, clip=0.2):
    """PPO clipped surrogate, on sampled actions (any shape; the three arguments broadcast):

        ratio = pi(a|s) / pi_old(a|s) = exp(logp - old_logp)
        L = -mean( min(ratio * A, clip(ratio, 1 - c, 1 + c) * A) )

    The min is pessimistic: once the ratio has moved past 1 +- c in the direction A rewards, the
    clipped term wins and the gradient is 0, so one batch cannot drag the policy far from pi_old.
    stats: clip_frac (fraction of samples with |ratio - 1| > c) and the mean ratio.
    """
    A = advantages.detach()
    ratio = torch.exp(logp - old_logp.detach())
    surrogate = torch.minimum(ratio * A, ratio.clamp(1 - clip, 1 + clip) * A)
    loss = -surrogate.mean()
    stats = {
        "clip_frac": ((ratio - 1).abs() > clip).float().mean().item(),
        "ratio": ratio.mean().item(),
    }
    return loss, stats


def kl_k3(logp, ref_logp):
    """The KL penalty per sampled token (a ~ pi): the k3 estimate of KL(pi || pi_ref), with the
    gradient of that same KL.

        k3   = r - 1 - log r,   r = pi_ref / pi = exp(ref_logp - logp)
        term = k3 * pi / sg(pi) = k3 * exp(logp - sg(logp))      (sg: stop-gradient, detach)

    Value: the factor is 1, so the term is k3: non-negative (e^x >= 1 + x) and unbiased, since
    E_pi[r] = sum_a pi_ref(a) = 1 gives E[k3] = E[logp - ref_logp] = KL(pi || pi_ref); lower
    variance than the plain log-ratio. The logged KL is this value.
    Gradient: why the factor. k3 alone, differentiated as a loss, gives (1 - r) grad logp, whose
    expectation over a ~ pi is -sum_a pi_ref(a) grad log pi(a) = grad KL(pi_ref || pi): the other
    KL, in which the samples' own distribution does not appear. The importance ratio pi / sg(pi)
    adds k3 grad logp, the score-function term of sampling from pi, so the expectation becomes
    grad E_pi[k3] = grad KL(pi || pi_ref) exactly (TRL's use_bias_correction_kl, after
    DeepSeek-V3.2). k2 = (log r)^2 / 2 has that expected gradient too, but its value is a biased
    estimate of the KL; this term keeps k3's value. On-policy: pi_old = sg(pi). ref_logp is a
    constant.
    """
    log_ratio = ref_logp.detach() - logp
    return (torch.exp(log_ratio) - log_ratio - 1) * torch.exp(logp - logp.detach())


PG_KINDS = ("token", "seq", "const", "sum")


def step_normalizer(kind, sequences, tokens, max_len):
    """What aggregate divides by, from the counts of a whole optimizer step (sequences, completion
    tokens, and the fixed generation budget max_len):

        token: tokens     seq: sequences     const: sequences * max_len     sum: sequences

    Compute it ONCE over the optimizer step's full batch and pass it to every micro-batch: the
    summed micro-batch gradients then equal the full-batch gradient exactly (a per micro-batch
    `token` mean would weigh a token by its micro-batch's size). Under DDP, which averages gradients
    over ranks, pass the counts summed over all ranks and divide the result by the world size.
    """
    normalizers = dict(token=tokens, seq=sequences, const=sequences * max_len, sum=sequences)
    if kind not in normalizers:
        raise ValueError(f"kind must be one of {PG_KINDS}, got {kind!r}")
    return float(normalizers[kind])


def pg_normalizer(mask, kind, max_len=None):
    """step_normalizer of one batch: mask (B, T), 1 on completion tokens; max_len defaults to T, the
    padded length."""
    max_len = mask.shape[-1] if max_len is None else max_len
    return step_normalizer(kind, mask.shape[0], int(mask.sum()), max_len)


def aggregate(per_token, mask, kind, normalizer=None):
    """One loss from per-token terms x_bt of B completions, over completion tokens only (mask_bt =
    1). Every term of an LLM loss goes through it (the policy gradient, x = -A_b logp_bt, and the KL
    penalty), so they weigh each token alike, as TRL does by aggregating their per-token sum:

        token (TRL dapo, DAPO):       L = sum_{b,t} x_bt / sum_{b,t} mask_bt
        seq   (TRL grpo, GRPO):       L = sum_b (sum_t x_bt / |o_b|) / B
        const (TRL dr_grpo, Dr.GRPO): L = sum_{b,t} x_bt / (B * max_len)
        sum   (MAGRPO, CoMLRL):       L = sum_{b,t} x_bt / B

    What one token weighs, and the bias that follows:
        token: 1 / N_tokens, the same for every token: a long sequence counts more in total, and the
               step size varies with 1 / (mean length) from batch to batch.
        seq:   1 / (B |o_b|): tokens of short sequences weigh more (length bias: long wrong answers
               are penalised less per token, so they drift longer).
        const: 1 / (B max_len), a constant: the sequence-level REINFORCE gradient (sum over tokens),
               scaled by a constant, so no length bias.
        sum:   1 / B: that REINFORCE gradient itself, per completion, averaged over completions
               (what CoMLRL's MAGRPO computes): const times max_len, so no length bias either. Its
               size grows with the completions' length, so the learning rate goes with the budget.
    per_token, mask: (B, T). normalizer: from step_normalizer over the step's full batch (default:
    this batch's own, pg_normalizer).
    """
    if kind not in PG_KINDS:
        raise ValueError(f"kind must be one of {PG_KINDS}, got {kind!r}")
    m = mask.bool()
    if normalizer is None:
        normalizer = pg_normalizer(m, kind)
    # where, not * mask: a pad position may hold -inf or nan, and 0 * inf = nan.
    term = torch.where(m, per_token, 0)
    if kind == "seq":
        # each sequence's mean over its own tokens
        term = term / m.sum(-1, keepdim=True).clamp(min=1)
    return term.sum() / normalizer


def policy_gradient_loss(logp, advantages, mask, kind, normalizer=None):
    """Token-level policy gradient for LLM completions (MAGRPO, MLPO): the aggregate of
    x_bt = -A_b logp_bt (see aggregate for the kinds and their biases). logp: (B, T) log-probs of
    the sampled tokens; advantages: (B,) per sequence, a constant; mask: (B, T)."""
    loss = aggregate(-advantages.detach().unsqueeze(-1) * logp, mask, kind, normalizer)
    return loss, {"tokens": float(mask.sum())}
