"""A study beside train_rl.py (experiments/LOG.md, "REFINE that pays"): stage 2 with a negative
REFINE cost, so that a REFINE earns what it spends and its ties with PERSIST and CONCEDE go its
way, as freeze's REFINE does where the free policy lost to freeze. The change is train_rl.py's
check, which refuses a cost below 0: the corpus is train_rl's own.

    python -m experiments.rl_refine_pays --init runs/sft/policy.safetensors --refine-cost -0.1 \\
        --out-dir runs/refine-pays

It lost: the policy played debate game for game (experiments/LOG.md).
"""

from dataclasses import dataclass, replace

import train_rl
from common import distributed, launch_world_size, parse_config, user_errors


@dataclass
class Config(train_rl.Config):
    # the study's own: the change from train_rl.py
    refine_cost: float = -0.1
    """a REFINE's reward pays this per 1000 tokens it spends; below 0 it earns it"""


def check(cfg, world):
    # train_rl.py's checks of everything but the cost, which this study takes below 0
    train_rl.check(replace(cfg, refine_cost=0.0), world)


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train_rl.train(config, ranks)
