"""The deliberation game (docs/design.md §1-§4), read top to bottom:
1. Actions   - PERSIST, REFINE, CONCEDE(k): the one home of the action encoding
2. State     - an agent's observation o_t^i = (own features, one row per peer)
3. Policies  - the meta-policy network, the fixed policies, the gold-aware oracle, policy files
4. The game  - the corpus's settings, the critic pass, the REFINE calls, the shaped reward, and
               play(): observe -> decide -> execute the simultaneous moves, round by round
An agent's solution, the prompts, the vote, the game's settings (GameConfig) and round 0's LLM calls
are solutions.py's: what the LLM-weight trainers read of the game, without the game.
"""

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn as nn
from tqdm import tqdm

import common
import data
from common import UsageError, all_gather_list, call_seed
from llm.team import as_team
from solutions import (
    CONFIDENCE_SIGNALS,
    Call,
    majority_vote,
    per_question,
    refine_prompt,
    run_llm,
    same_answer,
    says_missing,
    solve_calls,
)

# --------------------------------------------------------------------------------------------------
# 1. Actions. For N agents there are K = 2 + (N - 1) actions: PERSIST, REFINE, then CONCEDE(k) to
# the k-th peer, the peers of agent i being the other agents in agent order (i itself left out).
# --------------------------------------------------------------------------------------------------
PERSIST, REFINE = 0, 1
ACTION_KINDS = ("persist", "refine", "concede")


def n_actions(agents):
    """K for a team of `agents`."""
    return 2 + (agents - 1)


def concede(k):
    """The action index of CONCEDE to the k-th peer."""
    return 2 + k


def peers_of(agent, agents):
    """The peers of `agent`, in the order their CONCEDE actions have."""
    return [j for j in range(agents) if j != agent]


def adopted_agent(agent, action, agents):
    """The agent whose solution `agent` adopts with a CONCEDE `action`."""
    return peers_of(agent, agents)[action - 2]


def action_kind(action):
    return ACTION_KINDS[min(action, 2)]


def action_counts(transcripts, round_index=None):
    """How often each kind of action was taken over every round of the transcripts (or in round
    `round_index` only: 1 = the first decision)."""
    kinds = [
        action_kind(a)
        for r in transcripts
        for t, record in enumerate(r["rounds"])
        if t > 0 and round_index in (None, t)
        for a in record["actions"]
    ]
    return {kind: kinds.count(kind) for kind in ACTION_KINDS}


def action_distribution(actions, n_actions):
    """Share of each kind of action in a tensor of action indices."""
    counts = torch.bincount(actions, minlength=n_actions).float()
    kinds = {"persist": counts[PERSIST], "refine": counts[REFINE], "concede": counts[2:].sum()}
    return {k: round(float(v / counts.sum()), 4) for k, v in kinds.items()}


# --------------------------------------------------------------------------------------------------
# 2. The meta-cognitive state: what the policy sees of one solution (never the raw answer value,
# only its relations to the others)
# --------------------------------------------------------------------------------------------------
PROFILE_FEATURES = (
    "parse_ok",  # the answer could be extracted
    "trailer_ok",  # the Steps / Confidence / Answer trailer was complete
    "steps",  # self-reported steps / 10, clipped to 1 (0 when missing)
    "self_confidence",  # self-reported confidence in [0, 1] (0.5 when missing)
    "critic",  # p(Correct) from the critic pass (0.5 when not measured)
    "mean_prob",  # generation confidence: geometric mean probability of the sampled tokens
    "min_prob",  # generation confidence: probability of the least likely sampled token
    # generation confidence: geometric mean probability of the last 8 tokens (the answer)
    "tail_prob",
    "length",  # completion tokens / 256, clipped to 1
    "operations",  # arithmetic operations shown / 10, clipped to 1
    "consistent",  # the answer equals the last computed result shown
)
OWN_FEATURES = PROFILE_FEATURES + (
    "peer_agreement",  # fraction of peers with the same (parsed) answer
    "is_majority",  # own answer is the current team vote
    "round",  # t / R
    "changed_last",  # own answer changed in the previous round
    "last_none",
    "last_persist",
    "last_refine",
    "last_concede",  # previous action, one-hot
)
PEER_FEATURES = PROFILE_FEATURES + (
    "same_as_me",  # this peer's answer equals mine
    "peer_is_majority",  # this peer's answer is the current team vote
    "peer_changed_last",
)
# What the texts tell that no rule reads, appended after the first policies were trained: a policy
# reads them only when its feature set does (TEXT_SETS), its first layer as wide as what it reads
# (state_widths), so a policy file of the older size loads and plays as trained.
OWN_FEATURES += (
    "view_missing",  # the agent's own prompt says a value is unknown (a split question's view)
    "says_missing",  # its own solution says a value is not known
    "steps_check",  # its own solution writes steps and every one is right
)
PEER_FEATURES += (
    "peer_says_missing",  # this peer's solution says a value is not known
    "peer_steps_check",  # this peer's solution writes steps and every one is right
)


def profile(solution):
    """PROFILE_FEATURES of one solution, in that order."""
    s, signals = solution, solution.signals
    return [
        float(s.answer is not None),
        float(s.trailer_ok),
        min((s.steps or 0) / 10, 1.0),
        s.self_confidence if s.self_confidence is not None else 0.5,
        s.critic if s.critic is not None else 0.5,
        *(signals[k] for k in CONFIDENCE_SIGNALS),
        min(s.completion_tokens / 256, 1.0),
        min(s.n_operations / 10, 1.0),
        float(s.consistent),
    ]


def observe(solutions, agent, round_index, rounds, *, view, changed, last_actions):
    """Agent `agent`'s observation o_t^i = (own features, one feature row per peer) at round index
    `round_index` of `rounds`; `view`: the question as the agent's prompt shows it; `changed` and
    `last_actions`: every agent's previous round."""
    vote, _ = majority_vote(solutions)
    own = solutions[agent]
    peers = peers_of(agent, len(solutions))
    last = last_actions[agent]
    last_onehot = [float(last is None)] + [
        float(last is not None and action_kind(last) == k) for k in ACTION_KINDS
    ]
    own_features = (
        profile(own)
        + [
            sum(same_answer(own, solutions[j]) for j in peers) / len(peers),
            float(own.answer is not None and own.answer == vote),
            round_index / rounds,
            float(changed[agent]),
        ]
        + last_onehot
        + [float(says_missing(view)), float(own.missing_said), float(own.steps_checked)]
    )
    peer_features = [
        profile(solutions[j])
        + [
            float(same_answer(own, solutions[j])),
            float(solutions[j].answer is not None and solutions[j].answer == vote),
            float(changed[j]),
            float(solutions[j].missing_said),
            float(solutions[j].steps_checked),
        ]
        for j in peers
    ]
    return own_features, peer_features


# --------------------------------------------------------------------------------------------------
# 3. Policies (docs/design.md §3): every policy but the oracle maps a batch of observations to
# actions through `act`; `reads_critic` says whether its state includes the critic's p(Correct)
# (then the game pays for the critic pass).
# --------------------------------------------------------------------------------------------------
# Which state features a policy reads; the others are zeroed before its first layer.
#   all        every feature
#   paper      the paper's: no generation confidence (mean_prob, min_prob, tail_prob)
#   confidence the generation confidence and the team's agreement (no self-report, critic, text)
#   text       every feature and what the texts tell (the features appended last)
_SELF_REPORTED = tuple(f for f in PROFILE_FEATURES[1:] if f not in CONFIDENCE_SIGNALS)
FEATURE_SETS = {"all": (), "paper": CONFIDENCE_SIGNALS, "confidence": _SELF_REPORTED, "text": ()}
TEXT_SETS = ("text",)
# What a transcript keeps of the state behind a learned policy's decision (shown by view.py): the
# agent's generation confidence and its agreement with the team.
EXPLAINED_FEATURES = CONFIDENCE_SIGNALS + ("peer_agreement", "is_majority")


def state_widths(features):
    """How many of OWN_FEATURES and PEER_FEATURES a policy of feature set `features` reads: all of
    them in TEXT_SETS, else those before the text features."""
    if features in TEXT_SETS:
        return len(OWN_FEATURES), len(PEER_FEATURES)
    return OWN_FEATURES.index("view_missing"), PEER_FEATURES.index("peer_says_missing")


def feature_mask(names, features):
    if features not in FEATURE_SETS:
        names = ", ".join(FEATURE_SETS)
        raise ValueError(f"unknown feature set {features!r}: choose one of {names}")
    return torch.tensor([float(name not in FEATURE_SETS[features]) for name in names])


def mlp(n_in, hidden, n_out):
    return nn.Sequential(nn.Linear(n_in, hidden), nn.GELU(), nn.Linear(hidden, n_out))


class PolicyNet(nn.Module):
    """Shared MLP embeddings of the own state and of each peer, cross-attention from self to peers,
    then PERSIST / REFINE logits from the own context and one CONCEDE logit per peer from that
    peer's embedding. Permutation-equivariant over peers; works for any number of agents >= 2."""

    def __init__(self, hidden=64, heads=4, features="all"):
        super().__init__()
        n_own, n_peer = state_widths(features)
        self.embed_own = mlp(n_own, hidden, hidden)
        self.embed_peer = mlp(n_peer, hidden, hidden)
        self.attend = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.self_head = mlp(2 * hidden, hidden, 2)
        self.concede_head = mlp(3 * hidden, hidden, 1)

    def forward(self, own, peers):
        """own (B, n_own), peers (B, P, n_peer): the first features of OWN_FEATURES and
        PEER_FEATURES (state_widths) -> logits (B, K = n_actions(1 + P)), in the action order:
        PERSIST, REFINE, CONCEDE(0..P-1)."""
        me = self.embed_own(own)
        them = self.embed_peer(peers)
        context, _ = self.attend(me[:, None], them, them, need_weights=False)
        context = context[:, 0]
        self_logits = self.self_head(torch.cat([me, context], -1))
        pair = torch.cat([them, me[:, None].expand_as(them), context[:, None].expand_as(them)], -1)
        return torch.cat([self_logits, self.concede_head(pair)[..., 0]], -1)


class MetaPolicy(nn.Module):
    """The learned meta-policy: one PolicyNet shared by all agents, or one copy per agent
    (`separate`). critic: its states carry the critic's p(Correct) (the game runs the critic)."""

    def __init__(
        self, agents=3, hidden=64, heads=4, *, separate=False, critic=False, features="all"
    ):
        super().__init__()
        self.config = dict(agents=agents, hidden=hidden, heads=heads, separate=separate)
        self.config.update(critic=critic, features=features)
        self.nets = nn.ModuleList(
            PolicyNet(hidden, heads, features) for _ in range(agents if separate else 1)
        )
        n_own, n_peer = state_widths(features)
        own_mask, peer_mask = (
            feature_mask(OWN_FEATURES[:n_own], features),
            feature_mask(PEER_FEATURES[:n_peer], features),
        )
        self.register_buffer("own_mask", own_mask, persistent=False)
        self.register_buffer("peer_mask", peer_mask, persistent=False)

    @property
    def reads_critic(self):
        return self.config["critic"]

    def forward(self, own, peers, agent_index):
        """Logits for a batch of observations (the features this policy reads: state_widths);
        `agent_index` (B,) picks each row's copy when separate."""
        own = own[:, : len(self.own_mask)] * self.own_mask
        peers = peers[..., : len(self.peer_mask)] * self.peer_mask
        if len(self.nets) == 1:
            return self.nets[0](own, peers)
        logits = own.new_zeros(own.shape[0], n_actions(1 + peers.shape[1]))
        for a, net in enumerate(self.nets):
            rows = agent_index == a
            if rows.any():
                logits[rows] = net(own[rows], peers[rows])
        return logits

    @torch.no_grad()
    def act(self, own, peers, agent_index, uniforms, greedy=True):
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
    of the batch (sharding questions over ranks, or batching them otherwise, samples the same)."""
    cdf = probs.cumsum(-1)
    return (cdf <= uniforms[:, None]).sum(-1).clamp(max=probs.shape[-1] - 1).tolist()


FIXED_POLICIES = ("persist", "random", "refine", "oracle")


class FixedPolicy:
    """persist: always PERSIST. random: uniform over the K actions. refine: REFINE (Debate)."""

    reads_critic = False

    def __init__(self, name):
        if name not in FIXED_POLICIES[:3]:
            raise ValueError(f"unknown fixed policy {name!r}")
        self.name = name

    def act(self, own, peers, agent_index, uniforms, greedy=True):
        if self.name == "persist":
            return [PERSIST] * len(own)
        if self.name == "refine":
            return [REFINE] * len(own)
        k = n_actions(1 + peers.shape[1])
        return sample_actions(torch.full((len(own), k), 1 / k), uniforms)


class Oracle:
    """The one policy that reads the gold answer (oracle_action, in decide): the upper bound of
    these actions, and stage 1's label."""

    reads_critic = False
    name = "oracle"


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
    common.save_tensors(policy.state_dict(), {"config": policy.config, **extra}, path)


def load_policy(path):
    """A policy file (NAME.safetensors and NAME.json, or an older .pt), shared or not, read as
    tensors and plain data (common.load_module): loading it runs no code of its own. It carries
    the game it was trained in (`trained_game`)."""
    policy, settings = common.load_module(path, "policy", lambda s: MetaPolicy(**dict(s["config"])))
    policy.trained_game = trained_game(settings)
    return policy.eval()


# the settings that make a policy's game: the task its peers' answers come from, the team's size,
# and the number of rounds (the state's round feature is t / rounds)
GAME_SETTINGS = ("task", "agents", "rounds")


def trained_game(settings):
    """{task, agents, rounds} of the stage that saved a policy file (its settings' train_config),
    or None for a file that does not record them."""
    config = settings.get("train_config") or {}
    if not all(k in config for k in GAME_SETTINGS):
        return None
    return {k: config[k] for k in GAME_SETTINGS}


def check_team(policy, agents, source):
    """A policy shared by all agents is permutation-equivariant over peers and plays a team of any
    size; one with a copy per agent (--separate) plays only the team it was trained for."""
    trained = policy.config["agents"]
    if policy.config["separate"] and trained != agents:
        raise UsageError(
            f"{source}: a policy with one copy per agent for {trained} agents cannot play "
            f"{agents} agents: pass --agents {trained}, or train a shared policy"
        )


def check_own_game(policy, cfg, source):
    """A learned policy plays the game it was trained in: in another it reads states it never saw
    (round features t / rounds at other values, peers of another task or number), and nothing else
    would say so. UsageError naming the settings that differ."""
    trained = policy.trained_game
    if trained is None:
        return
    differ = [k for k in GAME_SETTINGS if trained[k] != getattr(cfg, k)]
    if differ:
        theirs = ", ".join(f"--{k} {trained[k]}" for k in differ)
        ours = ", ".join(f"--{k} {getattr(cfg, k)}" for k in differ)
        raise UsageError(
            f"{source}: trained in another game ({theirs}; here {ours}): pass {theirs}, or "
            "--any-game to play it here anyway"
        )


def make_policy(spec):
    """'persist' | 'random' | 'refine' | 'oracle' | a path to a policy checkpoint."""
    if spec == "oracle":
        return Oracle()
    if spec in FIXED_POLICIES:
        return FixedPolicy(spec)
    if not Path(spec).is_file():
        raise UsageError(
            f"policy {spec!r} is neither a fixed policy ({', '.join(FIXED_POLICIES)}) nor a "
            "policy file"
        )
    return load_policy(spec)


# --------------------------------------------------------------------------------------------------
# 4. The game
# --------------------------------------------------------------------------------------------------
def corpus_settings(cfg, game, **script):
    """What decides a corpus of games: the task (cfg's --task, --path, --level), the game's
    settings, the agents' models and their dtype (cfg's --model, --models, --dtype), and the
    script's own settings that shape it (its questions, its behaviour policy...)."""
    task = {"task": cfg.task, "path": cfg.path, "level": cfg.level}
    engine = {"model": cfg.model, "models": cfg.models, "dtype": cfg.dtype}
    return task | asdict(game) | engine | script


# The critic pass (docs/design.md §2): the backbone judges a solution, and its p(Correct) joins the
# state; no trainer of the LLM weights asks it, so it stays with the game.
VERDICTS = ("Correct", "Incorrect")


def critic_prompt(example, solution):
    return (
        f"Problem: {example.render()}\n\nProposed solution:\n{solution.text.strip()}\n\n"
        "Is the proposed solution correct? Reply with one word: Correct or Incorrect."
    )


def run_critic(engine, items):
    """Sets `critic` = p(Correct) on each (example, solution): the softmax over the two verdicts,
    each scored by the log-probability of its whole token sequence (`Incorrect` is `In` + `correct`
    on the default tokenizer, and `In` starts any reply). Returns each pass's prompt tokens. A
    team's critic is its first agent's base model."""
    if not items:
        return []
    engine = as_team(engine).first
    prompts = [engine.chat(critic_prompt(ex, s)) for ex, s in items]
    scores = engine.continuation_logprobs(prompts, list(VERDICTS))
    p_correct = torch.softmax(scores, -1)[:, 0].tolist()
    for (_, solution), p in zip(items, p_correct):
        solution.critic = p
    return [len(engine.encode(p)) for p in prompts]


def refine_calls(games, refine, t, cfg):
    """Round t's REFINE calls: agent i of games[k] for each (k, i) in `refine`."""
    calls = []
    for k, i in refine:
        ex = games[k].example
        prompt = refine_prompt(ex, games[k].solutions, i, cfg.trailer, cfg.whole_solutions)
        calls.append(Call(ex, prompt, call_seed(cfg.seed, ex.id, i, t, "refine"), i))
    return calls


def shaped_reward(before, after, agent, gold, task):
    """docs/design.md §4: (1[i correct after] - 1[i correct before]) + (1[vote of all correct] -
    1[vote without i correct]), all on the same round's post-action answers."""

    def correct(answer):
        return float(data.is_correct(answer, gold, task))

    own = correct(after[agent].answer) - correct(before[agent].answer)
    return own + correct(majority_vote(after)[0]) - correct(majority_vote(after, exclude=agent)[0])


def outcome(before, agent, action, refined):
    """Agent `agent`'s solution after `action`. Every action reads the round's solutions `before`
    (simultaneous moves); refined[agent] is the agent's REFINE sample."""
    if action == PERSIST:
        return before[agent]
    if action == REFINE:
        return refined[agent]
    # CONCEDE: adopt the peer's text, answer, profile and confidence
    return replace(before[adopted_agent(agent, action, len(before))])


def action_reward(move, agent, action, gold, task):
    """Agent `agent`'s shaped reward in `move` (a Move) had it taken `action`, its peers held at
    what they did. PERSIST and CONCEDE cost nothing; REFINE uses the sample the agent drew or
    would have drawn (move.refined[agent]: same prompt, same seed) and pays move.costs[agent]: the
    one place a REFINE pays its cost."""
    before, after = move.before, move.after
    team = after[:agent] + [outcome(before, agent, action, move.refined)] + after[agent + 1 :]
    reward = shaped_reward(before, team, agent, gold, task)
    return reward - move.costs[agent] if action == REFINE else reward


def counterfactual_rewards(move, gold, task):
    """Every agent's reward vector in `move`: its action_reward for each of its K actions, the
    peers held at what they actually did (docs/design.md §6: train_rl.py's corpus)."""
    agents = len(move.before)
    return [
        [action_reward(move, i, a, gold, task) for a in range(n_actions(agents))]
        for i in range(agents)
    ]


@dataclass
class Move:
    """One decision round of a game: each agent's observation and action, the solutions before and
    after, the REFINE samples drawn (agent -> Solution) and what a REFINE costs each reward."""

    round: int
    observations: list
    actions: list
    before: list
    after: list
    refined: dict
    costs: list


@dataclass
class Game:
    """One question's game: the team's current solutions, its history and its LLM cost."""

    example: data.Example
    solutions: list = field(default_factory=list)
    changed: list = field(default_factory=list)  # each agent's answer changed in the previous round
    # each agent's previous action (None before round 1)
    last_actions: list = field(default_factory=list)
    rounds: list = field(default_factory=list)  # the transcript: one record per round
    moves: list = field(default_factory=list)  # one Move per decision round
    tokens: int = 0  # prompt + completion tokens of every LLM call
    calls: int = 0

    def vote_summary(self, solutions):
        """The answers, each agent's correctness and confidence, the vote and its correctness."""
        ex = self.example
        vote, _ = majority_vote(solutions)
        return {
            "answers": [s.answer for s in solutions],
            "agent_correct": [data.is_correct(s.answer, ex.answer, ex.task) for s in solutions],
            "confidence": [s.confidence for s in solutions],
            "vote": vote,
            "correct": data.is_correct(vote, ex.answer, ex.task),
        }

    @property
    def stopped(self):
        return self.rounds[-1].get("stopped", False)

    def transcript(self):
        ex, final = self.example, self.rounds[-1]
        record = {
            "id": ex.id,
            "question": ex.question,
            "gold": ex.answer,
            "rounds": self.rounds,
            "pred": final["vote"],
            "correct": final["correct"],
            "tokens": self.tokens,
            "calls": self.calls,
        }
        if "views" in ex.meta:
            # a question whose values are dealt: what each agent was told
            record["views"] = [ex.render(i) for i in range(len(ex.meta["views"]))]
        return record


def ask(engine, games, calls, cfg, critic):
    """The Calls, call k for games[k] -> [(Solution, tokens)], in one engine call; each call's
    tokens and those of its critic pass go to its game."""
    outputs = run_llm(engine, calls, cfg)
    solutions = [s for s, _ in outputs]
    items = [(c.example, s) for c, s in zip(calls, solutions)]
    critic_tokens = run_critic(engine, items) if critic else [0] * len(calls)
    answered = []
    for game, (solution, n_tokens), n_critic in zip(games, outputs, critic_tokens):
        game.tokens += n_tokens + n_critic
        game.calls += 1 + critic
        answered.append((solution, n_tokens + n_critic))
    return answered


def decide(policy, games, t, cfg, greedy):
    """Every agent of every game observes the round-t state and picks its action; all decide before
    any action executes. Returns (observations, actions, explained), one list per game; explained:
    a learned policy's probabilities and state features behind each action (MetaPolicy.explain),
    None for a fixed policy."""
    rows = [(g, i) for g in games for i in range(cfg.agents)]
    observations = [
        observe(
            g.solutions,
            i,
            t - 1,
            cfg.rounds,
            view=g.example.render(i),
            changed=g.changed,
            last_actions=g.last_actions,
        )  # fmt: skip
        for g, i in rows
    ]
    explained = [None] * len(games)
    if hasattr(policy, "team_actions"):
        # a rule (rules.py) decides for the whole team from its answers
        actions = [a for g in games for a in policy.team_actions(g.solutions, t)]
    elif isinstance(policy, Oracle):
        # the one policy that reads the gold answer: each team's correctness, not the observations
        teams = {id(g): g.vote_summary(g.solutions) for g in games}
        actions = [
            oracle_action(i, teams[id(g)]["agent_correct"], teams[id(g)]["confidence"])
            for g, i in rows
        ]
    else:
        own = torch.tensor([o for o, _ in observations], dtype=torch.float32)
        peers = torch.tensor([p for _, p in observations], dtype=torch.float32)
        # one uniform per (question, agent, round): actions do not depend on the batch
        uniforms = torch.tensor(
            [call_seed(cfg.seed, g.example.id, i, t, "act") / 2**60 for g, i in rows],
            dtype=torch.float64,
        )
        agent_index = torch.tensor([i for _, i in rows])
        actions = policy.act(own, peers, agent_index, uniforms, greedy=greedy)
        if isinstance(policy, MetaPolicy):
            explained = per_question(policy.explain(own, peers, agent_index), cfg.agents)
    return per_question(observations, cfg.agents), per_question(actions, cfg.agents), explained


def play(
    engine,
    examples,
    policy,
    cfg,
    *,
    greedy=True,
    refine_all=False,
    refine_cost=0.0,
    forced=None,
    progress=None,
):
    """Plays the game on every example at once (a round's LLM calls in one engine call); returns one
    Game per example: its transcript() is what eval.py writes, its moves what training reads.
    greedy: a learned policy's argmax actions, else sampled. refine_all: every agent draws its
    REFINE sample, taken or not (train_rl.py's counterfactual rewards); they count in the cost.
    refine_cost: what a REFINE's reward pays per 1000 tokens of its call. forced, a study's hook:
    per example, None or a (round, agent, action) that the agent takes in that round whatever the
    policy says (a rollout of an action its game did not take)."""
    if cfg.agents < 2:
        raise ValueError("the game needs at least 2 agents")
    critic = cfg.critic or policy.reads_critic
    games = [
        Game(ex, changed=[False] * cfg.agents, last_actions=[None] * cfg.agents) for ex in examples
    ]
    forced = dict(zip(map(id, games), forced or [None] * len(examples), strict=True))
    # round 0: every agent solves the question on its own (solve_calls: question-major)
    asking = [g for g in games for _ in range(cfg.agents)]
    answers = ask(engine, asking, solve_calls(examples, cfg), cfg, critic)
    for g, answered in zip(games, per_question(answers, cfg.agents)):
        team = g.solutions = [s for s, _ in answered]
        g.rounds.append(
            {
                "round": 0,
                "texts": [s.text for s in team],
                "trailer_ok": [s.trailer_ok for s in team],
                "critic": [s.critic for s in team],
                "signals": [s.signals for s in team],
                **g.vote_summary(team),
            }
        )
    for t in range(1, cfg.rounds + 1):
        # early stop: a round of all PERSIST ends a game
        active = [g for g in games if not g.stopped]
        if not active:
            break
        observations, actions, explained = decide(policy, active, t, cfg, greedy)
        for g, acts in zip(active, actions):
            if forced[id(g)] is not None and forced[id(g)][0] == t:
                _, agent, action = forced[id(g)]
                acts[agent] = action
        # execute: the REFINE calls first, then the moves
        pairs = [(k, i) for k, acts in enumerate(actions) for i in range(len(acts))]
        refine = [(k, i) for k, i in pairs if actions[k][i] == REFINE or refine_all]
        calls = refine_calls(active, refine, t, cfg)
        samples = ask(engine, [active[k] for k, _ in refine], calls, cfg, critic)
        refined = [{} for _ in active]
        costs = [[0.0] * cfg.agents for _ in active]
        for (k, i), (sample, n_tokens) in zip(refine, samples):
            refined[k][i], costs[k][i] = sample, refine_cost * n_tokens / 1000
        for g, acts, seen, why, mine, cost in zip(
            active, actions, observations, explained, refined, costs
        ):
            before = g.solutions
            after = [outcome(before, i, a, mine) for i, a in enumerate(acts)]
            move = Move(t, seen, list(acts), before, after, mine, cost)
            ex = g.example
            record = {
                "round": t,
                "actions": acts,
                "rewards": [
                    action_reward(move, i, a, ex.answer, ex.task) for i, a in enumerate(acts)
                ],
                "texts": [s.text for s in after],
                **g.vote_summary(after),
                "stopped": all(a == PERSIST for a in acts),
            }
            if why is not None:
                record["policy"] = why
            g.rounds.append(record)
            g.moves.append(move)
            g.changed = [a.answer != b.answer for a, b in zip(after, before)]
            g.last_actions, g.solutions = list(acts), after
        if progress is not None:
            progress.update(1)
    return games


def play_shard(engine, examples, policy, cfg, *, ranks, desc="", refine_all=False, refine_cost=0.0):
    """This rank's games of `examples` (its shard, examples[rank::world]), actions sampled;
    refine_all and refine_cost as play's (train_rl.py's corpus draws every REFINE)."""
    bar = tqdm(total=cfg.rounds, desc=desc or "collect", disable=ranks.rank != 0, leave=False)
    shard = examples[ranks.rank :: ranks.world]
    games = play(
        engine,
        shard,
        policy,
        cfg,
        greedy=False,
        refine_all=refine_all,
        refine_cost=refine_cost,
        progress=bar,
    )
    bar.close()
    return games


def state_rows(games, more):
    """Every rank's (agent, round) states of its games, gathered in a canonical order (independent
    of the number of ranks): the observation, the action taken, and the fields more(game, move)
    gives each agent."""
    rows = [
        {"key": (g.example.id, m.round, i), "own": own, "peers": peers, "agent": i}
        | {"action": m.actions[i], **fields}
        for g in games
        for m in g.moves
        for i, ((own, peers), fields) in enumerate(zip(m.observations, more(g, m)))
    ]
    rows = sorted(all_gather_list(rows), key=lambda r: r["key"])
    if not rows:
        raise ValueError("the games visited no state after round 0 (did every game stop at once?)")
    return rows


def collect_states(engine, examples, policy, cfg, more, *, ranks, desc=""):
    """The states of `policy`'s games (play_shard: this rank's shard, actions sampled), with
    more(game, move)'s fields (state_rows)."""
    return state_rows(play_shard(engine, examples, policy, cfg, ranks=ranks, desc=desc), more)
