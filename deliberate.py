"""The deliberation method shared by every script: prompts, state, policies and the game.

Read top to bottom (engine.py generates text, backbone.py loads the model):
  1. Prompts    - the solve / refine / critic prompts and the answer trailer (DESIGN §2).
  2. State      - the meta-cognitive state vector of an agent (every feature documented).
  3. Policy     - the meta-policy network and the fixed policies (DESIGN §3).
  4. Game       - simultaneous rounds of PERSIST / REFINE / CONCEDE(j), the vote and the reward (DESIGN §1, §4).
"""
import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn

import data
from engine import Engine  # the scripts build theirs as deliberate.Engine: one import for the whole method

# ----------------------------------------------------------------------------------------------------
# 1. Prompts. Short: the 135M default backbone loses accuracy on every extra instruction. Measured (48
#    arith questions x 3 samples, T = 0.7, fp32): "End with 'Answer: <number>'." 13.2% correct; the
#    Steps / Confidence / Answer trailer with a worked example 4.9% (trailer complete in 31%). So the
#    trailer is opt-in (`GameConfig.trailer`); the state falls back to defaults without it (DESIGN §2).
# ----------------------------------------------------------------------------------------------------
ANSWER_HINT = {"number": "a number", "mc": "the letter of the correct option", "math": "a LaTeX expression"}
WORKED_EXAMPLE = ("Problem: Ann has 3 bags with 4 apples in each bag. She eats 2 apples. "
                  "How many apples are left?\n3 * 4 = 12. 12 - 2 = 10.\nSteps: 2\nConfidence: 9/10\nAnswer: 10")
TRAILER = "Steps: <number of steps>\nConfidence: <0-10>/10\nAnswer: <{hint}>"


def hint(task):
    return ANSWER_HINT[data.answer_kind(task)]


def vanilla_prompt(example):
    return f"{example.render()}\nAnswer with {hint(example.task)}."


def cot_prompt(example):
    return f"{example.render()}\nThink step by step, then end with 'Answer: <{hint(example.task)}>'."


def answer_request(example, trailer):
    if trailer:
        return f"Show short steps, then end with three lines:\n{TRAILER.format(hint=hint(example.task))}"
    return f"End with 'Answer: <{hint(example.task)}>'."


def solve_prompt(example, trailer=False):
    """Round 0 of the game. With `trailer`, one worked example of the Steps / Confidence / Answer trailer."""
    if trailer:
        return (f"Solve the problem. {answer_request(example, True)}\n\nExample:\n{WORKED_EXAMPLE}\n\n"
                f"Problem: {example.render()}\n")
    return f"{example.render()}\n{answer_request(example, False)}"


def refine_prompt(example, solutions, agent, trailer=False):
    """REFINE: the LLM-Debate update from the agent's own solution and its peers' current solutions.

    The peers appear through their final answers only, and the own solution through its last 300
    characters: measured on 32 arith questions (T = 0.7), one refine round took agent accuracy from 14.6%
    to 9.4% this way, and to 5.2% with every solution's text in the prompt: the 135M backbone rambles on
    long prompts. (Refining hurts this backbone on average; a good meta-policy has to learn when not to.)"""
    others = ", ".join(f"Agent {j + 1}: {s.answer if s.answer is not None else 'no answer'}"
                       for j, s in enumerate(solutions) if j != agent)
    return (f"{example.render()}\n\nYour previous solution:\n{solutions[agent].text.strip()[-300:]}\n\n"
            f"Other agents' answers: {others}.\nCheck the solutions and solve the problem again. "
            f"{answer_request(example, trailer)}")


def leader_prompt(example, solutions, trailer=False):
    """MLPO's leader (DESIGN §8) reads every peer's solution (its last 300 characters, as in refine_prompt)
    and answers."""
    shown = "\n\n".join(f"Agent {j + 1}:\n{s.text.strip()[-300:]}" for j, s in enumerate(solutions))
    return (f"{example.render()}\n\nSolutions from {len(solutions)} agents:\n\n{shown}\n\n"
            f"Check these solutions and solve the problem. {answer_request(example, trailer)}")


def critic_prompt(example, solution):
    return (f"Problem: {example.render()}\n\nProposed solution:\n{solution.text.strip()}\n\n"
            "Is the proposed solution correct? Reply with one word: Correct or Incorrect.")


def verdict_token_ids(tokenizer):
    """Token ids that tell `Correct` from `Incorrect` at the verdict position. `Incorrect` is often two
    tokens (`In` + `correct`), so compare the first tokens where the two spellings differ, after their
    common prefix (returned too: the prompt must end with it)."""
    good, bad = (tokenizer(w, add_special_tokens=False)["input_ids"] for w in ("Correct", "Incorrect"))
    k = 0
    while k < min(len(good), len(bad)) - 1 and good[k] == bad[k]:
        k += 1
    if good[k] == bad[k]:
        raise ValueError("the tokenizer cannot tell 'Correct' from 'Incorrect'")
    return good[k], bad[k], tokenizer.decode(good[:k])


# ----------------------------------------------------------------------------------------------------
# 2. Meta-cognitive state
# ----------------------------------------------------------------------------------------------------
PERSIST, REFINE = 0, 1  # CONCEDE to the k-th peer (peers in agent order, without oneself) is action 2 + k
ACTION_KINDS = ("persist", "refine", "concede")


def action_kind(action):
    return ACTION_KINDS[min(action, 2)]


@dataclass
class Solution:
    text: str
    answer: str | None          # canonical answer string from data.extract_answer; None = unparseable
    steps: int | None           # self-reported `Steps:`
    self_confidence: float | None  # self-reported `Confidence: c/10`, as c/10
    trailer_ok: bool            # all three trailer lines were found
    completion_tokens: int
    n_operations: int           # arithmetic operations written out (`3 * 4`)
    consistent: bool            # the answer equals the last computed result shown (`... = 10`)
    critic: float | None = None  # introspective confidence p(Correct) from the critic pass

    @property
    def confidence(self):
        """Introspective confidence when measured, else the self-report, else 0.5."""
        if self.critic is not None:
            return self.critic
        return self.self_confidence if self.self_confidence is not None else 0.5


_STEPS_RE = re.compile(r"steps?\s*:\s*\**\s*(\d{1,3})", re.IGNORECASE)
_CONFIDENCE_RE = re.compile(r"confidence\s*:\s*\**\s*(\d{1,2}(?:\.\d)?)\s*(/\s*10)?", re.IGNORECASE)
_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*\S", re.IGNORECASE)
_OPERATION_RE = re.compile(r"\d\s*[-+*/×x÷]\s*\(?\$?\d")
_RESULT_RE = re.compile(r"=\s*\$?\s*(-?[\d,]*\.?\d+)")


def parse_solution(text, task, completion_tokens=0):
    """A Solution from a completion. A garbled or missing trailer gives defaults and trailer_ok=False."""
    answer = data.extract_answer(text, task)
    steps = [int(m) for m in _STEPS_RE.findall(text)]
    confidences = [float(c) for c, _ in _CONFIDENCE_RE.findall(text)]
    confidence = min(confidences[-1], 10.0) / 10 if confidences else None
    results = _RESULT_RE.findall(text)
    consistent = bool(results) and answer is not None and data.is_correct(answer, results[-1], task)
    return Solution(text=text, answer=answer, steps=steps[-1] if steps else None, self_confidence=confidence,
                    trailer_ok=bool(steps and confidences and _ANSWER_LINE_RE.search(text)),
                    completion_tokens=completion_tokens,
                    n_operations=len(_OPERATION_RE.findall(_CONFIDENCE_RE.sub("", text))),  # not `9/10`
                    consistent=consistent)


# What the policy sees of one solution (never the raw answer value, only relations to the others).
PROFILE_FEATURES = (
    "parse_ok",         # the answer could be extracted
    "trailer_ok",       # the Steps / Confidence / Answer trailer was complete
    "steps",            # self-reported steps / 10, clipped to 1 (0 when missing)
    "self_confidence",  # self-reported confidence in [0, 1] (0.5 when missing)
    "critic",           # p(Correct) from the critic pass (0.5 when not measured)
    "length",           # completion tokens / 256, clipped to 1
    "operations",       # arithmetic operations shown / 10, clipped to 1
    "consistent",       # the answer equals the last computed result shown
)
OWN_FEATURES = PROFILE_FEATURES + (
    "peer_agreement",   # fraction of peers with the same (parsed) answer
    "is_majority",      # own answer is the current team vote
    "round",            # t / R
    "changed_last",     # own answer changed in the previous round
    "last_none", "last_persist", "last_refine", "last_concede",  # previous action, one-hot
)
PEER_FEATURES = PROFILE_FEATURES + (
    "same_as_me",       # this peer's answer equals mine
    "peer_is_majority", # this peer's answer is the current team vote
    "peer_changed_last",
)


def profile(solution):
    s = solution
    return [float(s.answer is not None), float(s.trailer_ok), min((s.steps or 0) / 10, 1.0),
            s.self_confidence if s.self_confidence is not None else 0.5,
            s.critic if s.critic is not None else 0.5, min(s.completion_tokens / 256, 1.0),
            min(s.n_operations / 10, 1.0), float(s.consistent)]


def same_answer(a, b):
    return a.answer is not None and a.answer == b.answer


def observe(solutions, agent, round_index, rounds, changed, last_actions, task):
    """Agent `agent`'s observation o_t^i = (own features, one feature row per peer)."""
    vote, _ = majority_vote(solutions)
    own = solutions[agent]
    peers = [j for j in range(len(solutions)) if j != agent]
    last = last_actions[agent]
    last_onehot = [float(last is None)] + [float(last is not None and action_kind(last) == k)
                                           for k in ACTION_KINDS]
    own_features = profile(own) + [
        sum(same_answer(own, solutions[j]) for j in peers) / len(peers),
        float(own.answer is not None and own.answer == vote), round_index / rounds,
        float(changed[agent])] + last_onehot
    peer_features = [profile(solutions[j]) + [float(same_answer(own, solutions[j])),
                                              float(solutions[j].answer is not None and solutions[j].answer == vote),
                                              float(changed[j])] for j in peers]
    return own_features, peer_features


def majority_vote(solutions, exclude=None):
    """(answer, agent) of the team vote. Unparseable answers never win; ties go to the higher
    confidence, then to the lower agent index. (None, None) when no answer parses."""
    groups = {}
    for i, s in enumerate(solutions):
        if i != exclude and s.answer is not None:
            groups.setdefault(s.answer, []).append(i)
    if not groups:
        return None, None
    answer = max(groups, key=lambda a: (len(groups[a]), max(solutions[i].confidence for i in groups[a]),
                                        -min(groups[a])))
    return answer, min(groups[answer], key=lambda i: (-solutions[i].confidence, i))


def shaped_reward(before, after, agent, gold, task):
    """DESIGN §4: (1[i correct after] - 1[i correct before]) + (1[vote of all correct] - 1[vote without i
    correct]), all on the same round's post-action answers."""
    def correct(answer):
        return float(data.is_correct(answer, gold, task))
    own = correct(after[agent].answer) - correct(before[agent].answer)
    return own + correct(majority_vote(after)[0]) - correct(majority_vote(after, exclude=agent)[0])


# ----------------------------------------------------------------------------------------------------
# 3. Policies. Every policy maps a batch of observations to actions; `needs_state` says whether it reads
#    the state vector (only then does the game pay for the critic pass).
# ----------------------------------------------------------------------------------------------------
class PolicyNet(nn.Module):
    """Shared MLP embeddings of the own state and of each peer, cross-attention from self to peers, then
    PERSIST / REFINE logits from the own context and one CONCEDE logit per peer from that peer's
    embedding. Permutation-equivariant over peers; works for any number of agents >= 2."""

    def __init__(self, hidden=64, heads=4):
        super().__init__()
        self.embed_own = nn.Sequential(nn.Linear(len(OWN_FEATURES), hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.embed_peer = nn.Sequential(nn.Linear(len(PEER_FEATURES), hidden), nn.GELU(),
                                        nn.Linear(hidden, hidden))
        self.attend = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.self_head = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.GELU(), nn.Linear(hidden, 2))
        self.concede_head = nn.Sequential(nn.Linear(3 * hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, own, peers):
        """own (B, len(OWN_FEATURES)), peers (B, P, len(PEER_FEATURES)) -> logits (B, 2 + P)."""
        me = self.embed_own(own)
        them = self.embed_peer(peers)
        context, _ = self.attend(me[:, None], them, them, need_weights=False)
        context = context[:, 0]
        self_logits = self.self_head(torch.cat([me, context], -1))
        pair = torch.cat([them, me[:, None].expand_as(them), context[:, None].expand_as(them)], -1)
        return torch.cat([self_logits, self.concede_head(pair)[..., 0]], -1)


class MetaPolicy(nn.Module):
    """The learned meta-policy: one PolicyNet shared by all agents, or one copy per agent (`separate`)."""
    needs_state = True

    def __init__(self, agents=3, hidden=64, heads=4, separate=False):
        super().__init__()
        self.config = {"agents": agents, "hidden": hidden, "heads": heads, "separate": separate}
        self.nets = nn.ModuleList(PolicyNet(hidden, heads) for _ in range(agents if separate else 1))

    def forward(self, own, peers, agent_index):
        """Logits for a batch of observations; `agent_index` (B,) picks each row's copy when separate."""
        if len(self.nets) == 1:
            return self.nets[0](own, peers)
        logits = own.new_zeros(own.shape[0], 2 + peers.shape[1])
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


def sample_actions(probs, uniforms):
    """Inverse-CDF sampling, one given uniform per row: a row's action does not depend on the rest of the
    batch, so sharding questions over ranks, or batching them differently, samples the same actions."""
    cdf = probs.cumsum(-1)
    return (cdf <= uniforms[:, None]).sum(-1).clamp(max=probs.shape[-1] - 1).tolist()


def save_policy(policy, path, **extra):
    torch.save({"config": policy.config, "state_dict": policy.state_dict(), **extra}, path)


def load_policy(path):
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    config = dict(checkpoint["config"])
    policy = MetaPolicy(**config)
    policy.load_state_dict(checkpoint["state_dict"])
    return policy.eval()


class FixedPolicy:
    """persist: always PERSIST. random: uniform over the K actions. refine: always REFINE (LLM-Debate).
    oracle: reads the gold answer (own correct -> PERSIST; else a correct peer -> CONCEDE to the most
    confident correct peer; else REFINE). It is the upper bound of these actions and the SFT label."""
    needs_state = False

    def __init__(self, name):
        if name not in ("persist", "random", "refine", "oracle"):
            raise ValueError(f"unknown fixed policy {name!r}")
        self.name = name

    def act(self, own, peers, agent_index, info, uniforms, greedy=True):
        if self.name == "persist":
            return [PERSIST] * len(info)
        if self.name == "refine":
            return [REFINE] * len(info)
        if self.name == "random":
            return sample_actions(torch.full((len(info), 2 + peers.shape[1]), 1 / (2 + peers.shape[1])), uniforms)
        return [oracle_action(x["own_correct"], x["peer_correct"], x["peer_confidence"]) for x in info]


def oracle_action(own_correct, peer_correct, peer_confidence):
    if own_correct:
        return PERSIST
    correct_peers = [k for k, ok in enumerate(peer_correct) if ok]
    if correct_peers:
        return 2 + max(correct_peers, key=lambda k: (peer_confidence[k], -k))
    return REFINE


def make_policy(spec):
    """'persist' | 'random' | 'refine' | 'oracle' | a path to a policy checkpoint."""
    if spec in ("persist", "random", "refine", "oracle"):
        return FixedPolicy(spec)
    if not Path(spec).is_file():
        raise FileNotFoundError(f"policy {spec!r} is neither a fixed policy "
                                "(persist, random, refine, oracle) nor a checkpoint file")
    return load_policy(spec)


# ----------------------------------------------------------------------------------------------------
# 4. The game (DESIGN §1, §4) and the protocols of the evaluation (DESIGN §7)
# ----------------------------------------------------------------------------------------------------
@dataclass
class GameConfig:
    agents: int = 3
    rounds: int = 3
    temperature: float = 0.7     # sampling temperature of every agent's LLM call
    top_p: float = 1.0
    max_new_tokens: int = 192
    seed: int = 0                # seeds every LLM call (with the question id, agent and round) and the policy
    trailer: bool = False        # ask for the Steps / Confidence / Answer trailer (costs accuracy, see §3)
    greedy_policy: bool = True   # argmax actions from a learned policy; False samples them (data collection)
    critic: bool = False         # run the critic pass even for policies that do not read the state


def call_seed(*parts):
    """A reproducible 63-bit seed for one LLM call, from anything JSON-serializable."""
    return int(hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:15], 16)


def run_llm(engine, requests, cfg, temperature=None):
    """requests: (example, prompt, seed) -> [(Solution, prompt + completion tokens)], in one engine call."""
    if not requests:
        return []
    completions = engine.generate([engine.chat(prompt) for _, prompt, _ in requests],
                                  [seed for _, _, seed in requests], max_new_tokens=cfg.max_new_tokens,
                                  temperature=cfg.temperature if temperature is None else temperature,
                                  top_p=cfg.top_p)
    return [(parse_solution(c.text, ex.task, c.completion_tokens), c.prompt_tokens + c.completion_tokens)
            for (ex, _, _), c in zip(requests, completions)]


def run_critic(engine, items):
    """Sets `critic` = p(Correct) on each (example, solution); returns the prompt tokens of each pass."""
    if not items:
        return []
    good, bad, prefix = verdict_token_ids(engine.tokenizer)
    prompts = [engine.chat(critic_prompt(ex, s)) + prefix for ex, s in items]
    p_correct = torch.softmax(engine.next_token_logprobs(prompts, [good, bad]), -1)[:, 0].tolist()
    for (_, solution), p in zip(items, p_correct):
        solution.critic = p
    return [len(engine.encode(p)) for p in prompts]


def play(engine, examples, policy, cfg, record_states=False, counterfactual=False, progress=None):
    """Plays the deliberation game on every example at once; returns one transcript dict per example.

    All LLM calls of a round, for every question and agent, go through the engine together.
    record_states: each round record keeps every agent's observation (`own`, `peers`).
    counterfactual (DESIGN §6, the training corpus): each round record also gets `reward_vectors`, every
    agent's shaped reward for each of its K actions, the peers' actions held at what they did. PERSIST and
    CONCEDE cost nothing; REFINE needs a sample from every agent that did not REFINE (it is the sample it
    would have drawn: same prompt, same seed), and these samples count in `tokens` and `calls`."""
    n_agents, task_rounds = cfg.agents, cfg.rounds
    if n_agents < 2:
        raise ValueError("the game needs at least 2 agents")
    usage = [{"tokens": 0, "calls": 0} for _ in examples]

    def llm(requests):  # requests: (question index, agent, prompt, seed) -> Solutions, usage counted
        outputs = run_llm(engine, [(examples[q], prompt, seed) for q, _, prompt, seed in requests], cfg)
        if policy.needs_state or cfg.critic:  # the critic pass is part of the state and of the cost
            critic_items = [(examples[q], s) for (q, _, _, _), (s, _) in zip(requests, outputs)]
            for (q, _, _, _), n_tokens in zip(requests, run_critic(engine, critic_items)):
                usage[q]["tokens"] += n_tokens
                usage[q]["calls"] += 1
        for (q, _, _, _), (_, n_tokens) in zip(requests, outputs):
            usage[q]["tokens"] += n_tokens
            usage[q]["calls"] += 1
        return [s for s, _ in outputs]

    def correct(q, solution):
        return data.is_correct(solution.answer, examples[q].answer, examples[q].task)

    def snapshot(q, solutions):
        vote, _ = majority_vote(solutions)
        return {"answers": [s.answer for s in solutions], "agent_correct": [correct(q, s) for s in solutions],
                "confidence": [s.confidence for s in solutions], "vote": vote,
                "correct": data.is_correct(vote, examples[q].answer, examples[q].task)}

    requests = [(k // n_agents, k % n_agents, prompt, seed)
                for k, (_, prompt, seed) in enumerate(solve_calls(examples, cfg))]
    flat = llm(requests)
    solutions = [flat[q * n_agents:(q + 1) * n_agents] for q in range(len(examples))]
    transcripts = [{"id": ex.id, "question": ex.question, "gold": ex.answer, "rounds": [
        {"round": 0, "texts": [s.text for s in solutions[q]],
         "trailer_ok": [s.trailer_ok for s in solutions[q]],
         "critic": [s.critic for s in solutions[q]], **snapshot(q, solutions[q])}]}
        for q, ex in enumerate(examples)]
    changed = [[False] * n_agents for _ in examples]
    last_actions = [[None] * n_agents for _ in examples]
    active = list(range(len(examples)))
    for t in range(1, task_rounds + 1):
        if not active:
            break
        rows = [(q, i) for q in active for i in range(n_agents)]
        observations = [observe(solutions[q], i, t - 1, task_rounds, changed[q], last_actions[q],
                                examples[q].task) for q, i in rows]
        own = torch.tensor([o for o, _ in observations], dtype=torch.float32)
        peers = torch.tensor([p for _, p in observations], dtype=torch.float32)
        info = []
        for q, i in rows:
            others = [j for j in range(n_agents) if j != i]
            info.append({"own_correct": correct(q, solutions[q][i]),
                         "peer_correct": [correct(q, solutions[q][j]) for j in others],
                         "peer_confidence": [solutions[q][j].confidence for j in others]})
        uniforms = torch.tensor([call_seed(cfg.seed, examples[q].id, i, t, "act") / 2 ** 60 for q, i in rows],
                                dtype=torch.float64)
        flat_actions = policy.act(own, peers, torch.tensor([i for _, i in rows]), info, uniforms,
                                  greedy=cfg.greedy_policy)
        actions = {q: flat_actions[k * n_agents:(k + 1) * n_agents] for k, q in enumerate(active)}
        # simultaneous moves: every action reads the round-t solutions, then all execute
        refine = [(q, i, refine_prompt(examples[q], solutions[q], i, cfg.trailer),
                   call_seed(cfg.seed, examples[q].id, i, t, "refine"))
                  for q in active for i in range(n_agents) if actions[q][i] == REFINE or counterfactual]
        refined = dict(zip([(q, i) for q, i, _, _ in refine], llm(refine)))
        for k, q in enumerate(active):
            before = solutions[q]

            def outcome(i, a):
                if a == PERSIST:
                    return before[i]
                if a == REFINE:
                    return refined[(q, i)]
                # CONCEDE: adopt the peer's text, answer, profile and confidence
                return replace(before[[j for j in range(n_agents) if j != i][a - 2]])

            after = [outcome(i, a) for i, a in enumerate(actions[q])]
            rewards = [shaped_reward(before, after, i, examples[q].answer, examples[q].task)
                       for i in range(n_agents)]
            record = {"round": t, "actions": actions[q], "rewards": rewards, "texts": [s.text for s in after],
                      **snapshot(q, after),
                      "stopped": all(a == PERSIST for a in actions[q])}
            if counterfactual:
                record["reward_vectors"] = [
                    [shaped_reward(before, after[:i] + [outcome(i, a)] + after[i + 1:], i, examples[q].answer,
                                   examples[q].task) for a in range(1 + n_agents)] for i in range(n_agents)]
            if record_states:
                record["own"] = [observations[k * n_agents + i][0] for i in range(n_agents)]
                record["peers"] = [observations[k * n_agents + i][1] for i in range(n_agents)]
            transcripts[q]["rounds"].append(record)
            changed[q] = [a.answer != b.answer for a, b in zip(after, before)]
            last_actions[q] = list(actions[q])
            solutions[q] = after
        # early stop: a round in which every agent PERSISTs ends that question's game
        active = [q for q in active if not transcripts[q]["rounds"][-1]["stopped"]]
        if progress is not None:
            progress.update(1)
    for q, transcript in enumerate(transcripts):
        final = transcript["rounds"][-1]
        transcript.update(pred=final["vote"], correct=final["correct"], **usage[q])
    return transcripts


def solve_calls(examples, cfg):
    """Round 0 of the game, the same calls (prompt and seed) as play's: every agent solves every example."""
    return [(ex, solve_prompt(ex, cfg.trailer), call_seed(cfg.seed, ex.id, i, 0, "solve"))
            for ex in examples for i in range(cfg.agents)]


def lead(engine, leader, examples, cfg):
    """MLPO's protocol (arXiv 2507.08960): cfg.agents peers (`engine`) answer, then the `leader` engine reads
    their solutions and answers (greedy). Each of cfg.rounds further rounds lets every peer revise after
    reading the leader's answer (REFINE with the leader as one more peer), and the leader answers again.
    The prediction is the leader's last answer; `peer_vote_correct` is the peers' round-0 majority vote."""
    n = cfg.agents
    outputs = run_llm(engine, solve_calls(examples, cfg), cfg)
    peers = [[s for s, _ in outputs[q * n:(q + 1) * n]] for q in range(len(examples))]
    results = [{"id": ex.id, "gold": ex.answer, "tokens": sum(k for _, k in outputs[q * n:(q + 1) * n]),
                "calls": n, "peer_vote_correct": data.is_correct(majority_vote(peers[q])[0], ex.answer, ex.task),
                "leader_correct": [], "texts": []} for q, ex in enumerate(examples)]
    for t in range(cfg.rounds + 1):
        if t:  # `led`: the leader's solutions of round t - 1
            calls = [(q, i) for q in range(len(examples)) for i in range(n)]
            revised = run_llm(engine, [(examples[q], refine_prompt(examples[q], peers[q] + [led[q][0]], i,
                                                                   cfg.trailer),
                                        call_seed(cfg.seed, examples[q].id, i, t, "revise")) for q, i in calls], cfg)
            for (q, i), (s, k) in zip(calls, revised):
                peers[q][i] = s
                results[q]["tokens"] += k
                results[q]["calls"] += 1
        led = run_llm(leader, [(ex, leader_prompt(ex, peers[q], cfg.trailer), call_seed(cfg.seed, ex.id, t, "lead"))
                               for q, ex in enumerate(examples)], cfg, temperature=0.0)
        for q, (s, k) in enumerate(led):
            results[q]["tokens"] += k
            results[q]["calls"] += 1
            results[q]["texts"].append(s.text)
            results[q]["leader_correct"].append(data.is_correct(s.answer, examples[q].answer, examples[q].task))
    for r, (s, _) in zip(results, led):
        r.update(pred=s.answer, correct=r["leader_correct"][-1])
    return results


PROTOCOLS = ("vanilla", "cot", "sc", "debate", "mpdf-persist", "mpdf-random", "mpdf-oracle", "mpdf=PATH",
             "leader=PATH")


def run_protocol(engine, examples, protocol, cfg):
    """One result dict per example: at least pred, correct, tokens, calls (and rounds for the game)."""
    if protocol in ("vanilla", "cot", "sc"):
        prompt = vanilla_prompt if protocol == "vanilla" else cot_prompt
        # self-consistency gets as many samples as debate makes generations; single answers are greedy
        samples = cfg.agents * (cfg.rounds + 1) if protocol == "sc" else 1
        requests = [(ex, prompt(ex), call_seed(cfg.seed, ex.id, k, protocol))
                    for ex in examples for k in range(samples)]
        outputs = run_llm(engine, requests, cfg, temperature=cfg.temperature if protocol == "sc" else 0.0)
        results = []
        for q, ex in enumerate(examples):
            mine = outputs[q * samples:(q + 1) * samples]
            pred, _ = majority_vote([s for s, _ in mine])
            results.append({"id": ex.id, "gold": ex.answer, "pred": pred,
                            "correct": data.is_correct(pred, ex.answer, ex.task),
                            "tokens": sum(n for _, n in mine), "calls": samples,
                            "texts": [s.text for s, _ in mine]})
        return results
    if protocol == "debate":
        return play(engine, examples, FixedPolicy("refine"), cfg)
    if protocol.startswith("mpdf-"):
        return play(engine, examples, make_policy(protocol[len("mpdf-"):]), cfg)
    if protocol.startswith("mpdf="):
        return play(engine, examples, make_policy(protocol[len("mpdf="):]), cfg)
    if protocol.startswith("leader="):
        path = protocol[len("leader="):]
        if not Path(path, "config.json").is_file():
            raise ValueError(f"{protocol!r}: {path!r} is not an HF checkpoint directory (train_rl.py --target leader)")
        return lead(engine, Engine(model_path=path, **engine.settings), examples, cfg)
    raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
