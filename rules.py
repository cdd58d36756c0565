"""The rules that decide when a team talks, with no learned policy: the baselines a learned
meta-policy has to beat on the accuracy-token frontier (docs/design.md §7).

    freeze    every agent REFINEs in a round unless the team's answers are unanimous; a unanimous
              round is all PERSIST, which ends the game (ConFreeze)
    minority  an agent REFINEs when its answer is not the team's vote, else it PERSISTs
    gate      debate (every agent REFINEs every round) only when the entropy of the round-0 answers
              exceeds a threshold chosen on validation questions, else the round-0 vote (a
              vote-entropy router, as Statistical Scouting's)
    trigger   debate only when a logistic regression on the round-0 state scores above a threshold
              (iMAD's learned trigger): trained on validation questions to predict that debate turns
              the vote right

A rule reads the team's answers (and, for the trigger, their generation confidence), never the gold
answer. deliberate.decide asks it for a team's actions through `team_actions`. The gate and the
trigger are fitted by experiments/talk_rules.py and saved as JSON, loaded as data (check_fitted).
"""

import json
import math
from collections import Counter

import numpy as np

from deliberate import PERSIST, REFINE
from solutions import majority_vote, unanimous

RULES = ("freeze", "minority", "gate", "trigger")
# the round-0 state the trigger reads: the answers' spread and the agents' generation confidence
TRIGGER_FEATURES = (
    "entropy",
    "vote_share",
    "unparsed_share",
    "mean_prob_mean",
    "mean_prob_min",
    "mean_prob_of_vote",
)


def answer_entropy(answers):
    """Entropy in bits of the team's answers; an unparsed answer (None) agrees with no one."""
    counts = Counter(a for a in answers if a is not None)
    counts.update({("unparsed", i): 1 for i, a in enumerate(answers) if a is None})
    n = len(answers)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def round0_features(answers, mean_probs, vote):
    """The trigger's features (TRIGGER_FEATURES) of one team's round-0 state: its answers, each
    agent's mean token probability, and the team's vote as the game counts it (majority_vote, whose
    ties go to the more confident answer), so that the vote's features are of the answer the team
    plays."""
    of_vote = [p for a, p in zip(answers, mean_probs) if a is not None and a == vote]
    return [
        answer_entropy(answers),
        len(of_vote) / len(answers),
        sum(a is None for a in answers) / len(answers),
        sum(mean_probs) / len(mean_probs),
        min(mean_probs),
        sum(of_vote) / len(of_vote) if of_vote else 0.0,
    ]


def trigger_score(features, trigger):
    """The logistic regression's probability that debate turns the vote right."""
    x = (np.asarray(features) - trigger["mean"]) / trigger["scale"]
    return float(1 / (1 + np.exp(-(x @ np.asarray(trigger["weights"]) + trigger["bias"]))))


class Rule:
    """One of RULES as a policy of the game: team_actions(solutions, t) gives every agent's action
    in round t from the team's current solutions (in round 1, the round-0 ones). `settings`: the
    fitted gate's or trigger's JSON (a threshold; the trigger's weights)."""

    reads_critic = False

    def __init__(self, name, settings=None):
        if name not in RULES:
            raise ValueError(f"unknown rule {name!r}; known: {', '.join(RULES)}")
        if name in ("gate", "trigger") and not settings:
            raise ValueError(f"the {name} rule needs its fitted settings (a JSON file)")
        self.name, self.settings = name, settings or {}

    def talks(self, solutions):
        """The gate's and the trigger's one decision, on the round-0 solutions: debate or not."""
        answers = [s.answer for s in solutions]
        if self.name == "gate":
            return answer_entropy(answers) > self.settings["threshold"]
        mean_probs = [s.signals["mean_prob"] for s in solutions]
        features = round0_features(answers, mean_probs, majority_vote(solutions)[0])
        return trigger_score(features, self.settings) > self.settings["threshold"]

    def team_actions(self, solutions, t):
        n = len(solutions)
        if self.name == "freeze":
            return [PERSIST if unanimous(solutions) else REFINE] * n
        if self.name == "minority":
            vote, _ = majority_vote(solutions)
            return [
                PERSIST if s.answer is not None and s.answer == vote else REFINE for s in solutions
            ]
        # a gate closed in round 1 ends the game (all PERSIST), so a later round is a debate's
        return [REFINE if t > 1 or self.talks(solutions) else PERSIST] * n


# what a fitted rule's JSON holds: a number, or one number per trigger feature
FITTED = {
    "gate": {"threshold": "number"},
    "trigger": {
        "threshold": "number",
        "bias": "number",
        "mean": "features",
        "scale": "features",
        "weights": "features",
    },
}


def load_rule(spec):
    """A rule from its protocol's spec: `freeze`, `minority`, `gate=PATH` or `trigger=PATH` (PATH:
    a JSON file of experiments/talk_rules.py, read as data and checked whole, so that a file that
    cannot be played is refused before any game starts)."""
    name, _, path = spec.partition("=")
    settings = None
    if path and name not in FITTED:
        raise ValueError(f"the {name} rule is fitted to nothing: it reads no file")
    if path:
        with open(path) as f:
            fitted = json.load(f)
        settings = fitted.get(name) if isinstance(fitted, dict) else None
        if not isinstance(settings, dict):
            raise ValueError(f"{path} holds no fitted {name} (a JSON object with a {name!r} key)")
        check_fitted(name, settings, path)
    return Rule(name, settings)


def check_fitted(name, settings, path):
    """Every value the rule reads, of its kind: a ValueError naming the first that is not."""

    def is_number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    n = len(TRIGGER_FEATURES)
    for key, kind in FITTED[name].items():
        value = settings.get(key)
        if kind == "number" and not is_number(value):
            raise ValueError(f"{path}: the {name}'s {key!r} must be a number, not {value!r}")
        if kind == "features" and not (
            isinstance(value, list) and len(value) == n and all(map(is_number, value))
        ):
            raise ValueError(
                f"{path}: the {name}'s {key!r} must be {n} numbers (one per feature: "
                f"{', '.join(TRIGGER_FEATURES)}), not {value!r}"
            )
