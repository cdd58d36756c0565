"""Who decides (docs/design.md §3): the learned meta-policy network and the fixed policies.

Every policy maps a batch of observations (state.observe) to actions through `act`; `reads_critic`
says whether its state includes the critic's p(Correct) (then the game pays for the critic pass).
  PolicyNet, MetaPolicy  - the learned policy: permutation-equivariant over peers, any team size
  sample_actions         - inverse-CDF sampling with one given uniform per row (batch-independent)
  FixedPolicy, oracle_action - persist, random, refine (LLM-Debate) and the gold-aware oracle (the
                         SFT label)
  save_policy, load_policy, make_policy - checkpoints and the `mpdf=` protocol specs
"""

from pathlib import Path

import torch
import torch.nn as nn

from common import UsageError, load_file
from state import (
    CONFIDENCE_SIGNALS,
    OWN_FEATURES,
    PEER_FEATURES,
    PERSIST,
    REFINE,
    concede,
    n_actions,
    peers_of,
)

# Which state features a policy reads (issue 18's state lever); the others are zeroed before its
# first layer.
#   all        every feature of state.py
#   paper      the paper's: no generation confidence (the token log-probs' mean_prob, min_prob,
#              tail_prob)
#   confidence the generation confidence and the team's agreement, no self-report, critic or text
#              statistics
_SELF_REPORTED = (
    "trailer_ok",
    "steps",
    "self_confidence",
    "critic",
    "length",
    "operations",
    "consistent",
)
FEATURE_SETS = {"all": (), "paper": CONFIDENCE_SIGNALS, "confidence": _SELF_REPORTED}
# What a transcript keeps of the state behind a learned policy's decision (eval.py's details, shown
# by view.py): the agent's generation confidence and its agreement with the team.
EXPLAINED_FEATURES = CONFIDENCE_SIGNALS + ("peer_agreement", "is_majority")


def feature_mask(names, features):
    if features not in FEATURE_SETS:
        raise ValueError(
            f"unknown feature set {features!r}: choose one of {', '.join(FEATURE_SETS)}"
        )
    return torch.tensor([float(name not in FEATURE_SETS[features]) for name in names])


class PolicyNet(nn.Module):
    """Shared MLP embeddings of the own state and of each peer, cross-attention from self to peers,
    then PERSIST / REFINE logits from the own context and one CONCEDE logit per peer from that
    peer's embedding. Permutation-equivariant over peers; works for any number of agents >= 2."""

    def __init__(self, hidden=64, heads=4):
        super().__init__()
        self.embed_own = nn.Sequential(
            nn.Linear(len(OWN_FEATURES), hidden), nn.GELU(), nn.Linear(hidden, hidden)
        )
        self.embed_peer = nn.Sequential(
            nn.Linear(len(PEER_FEATURES), hidden), nn.GELU(), nn.Linear(hidden, hidden)
        )
        self.attend = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.self_head = nn.Sequential(
            nn.Linear(2 * hidden, hidden), nn.GELU(), nn.Linear(hidden, 2)
        )
        self.concede_head = nn.Sequential(
            nn.Linear(3 * hidden, hidden), nn.GELU(), nn.Linear(hidden, 1)
        )

    def forward(self, own, peers):
        """own (B, len(OWN_FEATURES)), peers (B, P, len(PEER_FEATURES)) -> logits (B, K =
        n_actions(1 + P)), in the action order of state.py: PERSIST, REFINE, CONCEDE(0..P-1)."""
        me = self.embed_own(own)
        them = self.embed_peer(peers)
        context, _ = self.attend(me[:, None], them, them, need_weights=False)
        context = context[:, 0]
        self_logits = self.self_head(torch.cat([me, context], -1))
        pair = torch.cat([them, me[:, None].expand_as(them), context[:, None].expand_as(them)], -1)
        return torch.cat([self_logits, self.concede_head(pair)[..., 0]], -1)


class MetaPolicy(nn.Module):
    """The learned meta-policy: one PolicyNet shared by all agents, or one copy per agent
    (`separate`). critic: trained on states that carry the critic's p(Correct), so the game must run
    the critic for it."""

    def __init__(self, agents=3, hidden=64, heads=4, separate=False, critic=False, features="all"):
        super().__init__()
        self.config = {
            "agents": agents,
            "hidden": hidden,
            "heads": heads,
            "separate": separate,
            "critic": critic,
            "features": features,
        }
        self.nets = nn.ModuleList(
            PolicyNet(hidden, heads) for _ in range(agents if separate else 1)
        )
        self.register_buffer("own_mask", feature_mask(OWN_FEATURES, features), persistent=False)
        self.register_buffer("peer_mask", feature_mask(PEER_FEATURES, features), persistent=False)

    @property
    def reads_critic(self):
        return self.config["critic"]

    def forward(self, own, peers, agent_index):
        """Logits for a batch of observations; `agent_index` (B,) picks each row's copy when
        separate."""
        own, peers = own * self.own_mask, peers * self.peer_mask
        if len(self.nets) == 1:
            return self.nets[0](own, peers)
        logits = own.new_zeros(own.shape[0], n_actions(1 + peers.shape[1]))
        for a, net in enumerate(self.nets):
            rows = agent_index == a
            if rows.any():
                logits[rows] = net(own[rows], peers[rows])
        return logits

    @torch.no_grad()
    def act(self, own, peers, agent_index, info, uniforms, greedy=True):
        logits = self(own, peers, agent_index)
        if greedy:
            return logits.argmax(-1).tolist()
        return sample_actions(torch.softmax(logits, -1), uniforms)

    @torch.no_grad()
    def explain(self, own, peers, agent_index):
        """Per row, what a transcript shows of a decision: the action probabilities and the
        EXPLAINED_FEATURES this policy reads (its feature set's), rounded to 4 digits."""
        probs = torch.softmax(self(own, peers, agent_index), -1).tolist()
        read = [(k, name) for k, name in enumerate(OWN_FEATURES) if name in EXPLAINED_FEATURES]
        read = [(k, name) for k, name in read if self.own_mask[k]]
        return [
            {
                "probs": [round(p, 4) for p in row],
                "state": {name: round(float(features[k]), 4) for k, name in read},
            }
            for row, features in zip(probs, own)
        ]


def sample_actions(probs, uniforms):
    """Inverse-CDF sampling, one given uniform per row: a row's action does not depend on the rest
    of the batch, so sharding questions over ranks, or batching them differently, samples the same
    actions."""
    cdf = probs.cumsum(-1)
    return (cdf <= uniforms[:, None]).sum(-1).clamp(max=probs.shape[-1] - 1).tolist()


class FixedPolicy:
    """persist: always PERSIST. random: uniform over the K actions. refine: always REFINE
    (LLM-Debate). oracle: reads the gold answer (own correct -> PERSIST; else a correct peer ->
    CONCEDE to the most confident correct peer; else REFINE). It is the upper bound of these actions
    and the SFT label."""

    reads_critic = False
    NAMES = ("persist", "random", "refine", "oracle")

    def __init__(self, name):
        if name not in self.NAMES:
            raise ValueError(f"unknown fixed policy {name!r}")
        self.name = name

    def act(self, own, peers, agent_index, info, uniforms, greedy=True):
        if self.name == "persist":
            return [PERSIST] * len(info)
        if self.name == "refine":
            return [REFINE] * len(info)
        if self.name == "random":
            k = n_actions(1 + peers.shape[1])
            return sample_actions(torch.full((len(info), k), 1 / k), uniforms)
        return [oracle_action(x["agent"], x["agent_correct"], x["confidence"]) for x in info]


def oracle_action(agent, agent_correct, confidence):
    """docs/design.md §5's label for `agent`, from the team's correctness and confidences in the
    state it decides in: own answer right -> PERSIST; else a right peer -> CONCEDE to the most
    confident right peer (the lower peer index on ties); else REFINE."""
    if agent_correct[agent]:
        return PERSIST
    peers = peers_of(agent, len(agent_correct))
    right = [k for k, j in enumerate(peers) if agent_correct[j]]
    if right:
        return concede(max(right, key=lambda k: (confidence[peers[k]], -k)))
    return REFINE


def save_policy(policy, path, **extra):
    torch.save({"config": policy.config, "state_dict": policy.state_dict(), **extra}, path)


def load_policy(path):
    """A policy file, shared or not, read as tensors and plain data (common.load_file): loading it
    runs no code of its own."""
    checkpoint = load_file(path, "policy")
    policy = MetaPolicy(**dict(checkpoint["config"]))
    policy.load_state_dict(checkpoint["state_dict"])
    return policy.eval()


def check_team(policy, agents, source):
    """A policy shared by all agents is permutation-equivariant over peers and plays a team of any
    size; one with a copy per agent (--separate) plays only the team it was trained for."""
    trained = policy.config["agents"]
    if policy.config["separate"] and trained != agents:
        raise UsageError(
            f"{source}: a policy with one copy per agent for {trained} agents cannot play "
            f"{agents} agents: pass --agents {trained}, or train a shared policy"
        )


def make_policy(spec):
    """'persist' | 'random' | 'refine' | 'oracle' | a path to a policy checkpoint."""
    if spec in FixedPolicy.NAMES:
        return FixedPolicy(spec)
    if not Path(spec).is_file():
        raise UsageError(
            f"policy {spec!r} is neither a fixed policy ({', '.join(FixedPolicy.NAMES)}) nor a "
            "policy file"
        )
    return load_policy(spec)
