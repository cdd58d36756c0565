"""A study beside train_rl.py (experiments/LOG.md, "Disagree bonus"): stage 2 with a REFINE's
reward earning a bonus where the team's answers before it are not unanimous. Below the reward's
steps it gives REFINE its ties there, as the rule freeze REFINEs while the team disagrees. The
change is the corpus, handed to train_rl.train; everything else is train_rl.py's.

    python -m experiments.rl_disagree_bonus --init runs/sft/policy.safetensors --refine-cost 0.1 \\
        --disagree-bonus 0.3 --out-dir runs/disagree-bonus

It lost: the policy played freeze game for game (experiments/LOG.md).
"""

from dataclasses import dataclass

import train_rl
from common import check_at_least, distributed, launch_world_size, parse_config, user_errors
from solutions import unanimous


@dataclass
class Config(train_rl.Config):
    # the study's own: the change from train_rl.py
    disagree_bonus: float = 0.3
    """a REFINE's reward earns this where the team's answers before it are not unanimous"""


# the study's change: stage 2's corpus (train_rl.scored_states with the bonus in REFINE's cost)
def disagree_bonus_states(engine, questions, behaviour, cfg, *, ranks, desc):
    """train_rl.scored_states' corpus, each REFINE's cost lowered by --disagree-bonus where the
    team's answers before it are not unanimous."""
    games = train_rl.corpus_games(engine, questions, behaviour, cfg, ranks=ranks, desc=desc)
    for g in games:
        for m in g.moves:
            if not unanimous(m.before):
                m.costs = [cost - cfg.disagree_bonus for cost in m.costs]
    return train_rl.scored_rows(games)


def check(cfg, world):
    train_rl.check(cfg, world)
    check_at_least(0, disagree_bonus=cfg.disagree_bonus)


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train_rl.train(config, ranks, corpus=disagree_bonus_states)
