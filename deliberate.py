"""The deliberation game (docs/design.md §1, §4, §7): the round loop, the shaped reward, the
protocols.

Read top to bottom (prompts.py holds the prompts, re-exported here; state.py the solutions, actions,
vote and state; policy.py the policies; llm/engine.py generates text):
  1. LLM calls  - one engine call for many prompts, parsed into Solutions; the critic pass.
  2. Reward     - the shaped reward (docs/design.md §4) and the counterfactual reward vectors
                  (docs/design.md §6).
  3. The game   - play(): observe -> decide -> execute the simultaneous moves -> reward, round
                  by round.
  4. Protocols  - MLPO's leader (lead) and every protocol of the evaluation (run_protocol).
"""

from dataclasses import dataclass, field, fields, replace

import torch

import data
from llm.engine import Engine, call_seed  # noqa: F401 (Engine: the scripts reach it from here)
from llm.team import as_team
from policy import FixedPolicy, MetaPolicy, make_policy
from prompts import (  # noqa: F401 (re-exported: every prompt name stays importable from here)
    ANSWER_HINT,
    TRAILER,
    VERDICTS,
    WORKED_EXAMPLE,
    answer_request,
    cot_prompt,
    critic_prompt,
    hint,
    leader_prompt,
    refine_prompt,
    solve_prompt,
    vanilla_prompt,
)
from state import (
    ACTION_KINDS,
    PERSIST,
    REFINE,
    action_kind,
    adopted_agent,
    majority_vote,
    n_actions,
    observe,
    parse_solution,
)


# --------------------------------------------------------------------------------------------------
# 1. LLM calls
# --------------------------------------------------------------------------------------------------
@dataclass
class GameConfig:
    agents: int = 3
    rounds: int = 3
    # sampling temperature of every agent's LLM call (README: the temperature study)
    temperature: float = 0.5
    top_p: float = 1.0
    max_new_tokens: int = 192
    seed: int = 0  # seeds every LLM call (with the question id, agent and round) and the policy
    # ask for the Steps / Confidence / Answer trailer (costs accuracy: prompts.py)
    trailer: bool = False
    # argmax actions from a learned policy; False samples them (data collection)
    greedy_policy: bool = True
    critic: bool = False  # run the critic pass (always for a policy trained with it: reads_critic)
    # the vote's tie-break signal, the same for every protocol (state.VOTE_RULES)
    vote: str = "mean_prob"
    # the reward of a REFINE pays this per 1000 tokens its call spent (0: off)
    refine_cost: float = 0.0


def game_config(cfg, **overrides):
    """The game a script's config describes: each GameConfig field that the config has, then
    `overrides`."""
    settings = {f.name: getattr(cfg, f.name) for f in fields(GameConfig) if hasattr(cfg, f.name)}
    return GameConfig(**{**settings, **overrides})


def run_llm(engine, requests, cfg, temperature=None):
    """requests: (example, prompt, seed, agent) -> [(Solution, prompt + completion tokens)], in one
    call per engine: `engine` is an Engine, or a llm.team.Team whose agents differ."""
    if not requests:
        return []
    completions = as_team(engine).generate(
        [prompt for _, prompt, _, _ in requests],
        [seed for _, _, seed, _ in requests],
        [agent for _, _, _, agent in requests],
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature if temperature is None else temperature,
        top_p=cfg.top_p,
    )
    return [
        (
            parse_solution(c.text, ex.task, c.completion_tokens, c.token_logprobs, cfg.vote),
            c.prompt_tokens + c.completion_tokens,
        )
        for (ex, _, _, _), c in zip(requests, completions)
    ]


def run_critic(engine, items):
    """Sets `critic` = p(Correct) on each (example, solution): each verdict scored by the
    log-probability of its whole token sequence after the critic prompt (one teacher-forced pass, no
    sampling), then a softmax over the two. (`Incorrect` is `In` + `correct` on the default
    tokenizer: comparing first tokens scored `Correct` against `In`, the start of any reply "In
    ...", and ranked right solutions below wrong ones.) Returns the prompt tokens of each pass. A
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


def solve_calls(examples, cfg):
    """Round 0 of the game, (example, prompt, seed, agent) per call: every agent solves every
    example."""
    return [
        (ex, solve_prompt(ex, cfg.trailer), call_seed(cfg.seed, ex.id, i, 0, "solve"), i)
        for ex in examples
        for i in range(cfg.agents)
    ]


def per_question(flat, n):
    """A flat list of n items per question (question-major, as solve_calls makes them) -> one list
    per question."""
    return [flat[k : k + n] for k in range(0, len(flat), n)]


# --------------------------------------------------------------------------------------------------
# 2. Reward
# --------------------------------------------------------------------------------------------------
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


def counterfactual_rewards(before, after, refined, gold, task, refine_costs=None):
    """docs/design.md §6: every agent's shaped reward for each of its K actions, the peers held at
    what they actually did (`after`). PERSIST and CONCEDE cost nothing; REFINE uses the sample the
    agent drew or would have drawn (refined[i]: same prompt, same seed) and pays refine_costs[i]
    (GameConfig.refine_cost)."""
    vectors = []
    for i in range(len(before)):

        def team_if(action):
            return after[:i] + [outcome(before, i, action, refined)] + after[i + 1 :]

        vector = [
            shaped_reward(before, team_if(a), i, gold, task) for a in range(n_actions(len(before)))
        ]
        vector[REFINE] -= refine_costs[i] if refine_costs else 0.0
        vectors.append(vector)
    return vectors


# --------------------------------------------------------------------------------------------------
# 3. The game
# --------------------------------------------------------------------------------------------------
@dataclass
class Game:
    """One question's game in progress: the team's current solutions, its history and its LLM
    cost."""

    example: data.Example
    solutions: list = field(default_factory=list)
    changed: list = field(default_factory=list)  # each agent's answer changed in the previous round
    # each agent's previous action (None before round 1)
    last_actions: list = field(default_factory=list)
    rounds: list = field(default_factory=list)  # the transcript: one record per round
    tokens: int = 0  # prompt + completion tokens of every LLM call
    calls: int = 0

    def vote_summary(self, solutions):
        """The answers, each agent's correctness and confidence, the team's vote and its
        correctness."""
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
        return {
            "id": ex.id,
            "question": ex.question,
            "gold": ex.answer,
            "rounds": self.rounds,
            "pred": final["vote"],
            "correct": final["correct"],
            "tokens": self.tokens,
            "calls": self.calls,
        }


def ask(engine, requests, cfg, critic):
    """requests: (game, prompt, seed, agent) -> [(Solution, tokens)], in one engine call. Each
    call's tokens, and those of its critic pass (part of the state, and of the cost), go to its
    game."""
    outputs = run_llm(engine, [(g.example, *call) for g, *call in requests], cfg)
    solutions = [s for s, _ in outputs]
    critic_tokens = (
        run_critic(engine, [(g.example, s) for (g, *_), s in zip(requests, solutions)])
        if critic
        else [0] * len(requests)
    )
    answered = []
    for (game, *_), (solution, n_tokens), n_critic in zip(requests, outputs, critic_tokens):
        game.tokens += n_tokens + n_critic
        game.calls += 1 + critic
        answered.append((solution, n_tokens + n_critic))
    return answered


def decide(policy, games, t, cfg):
    """Every agent of every game observes the round-t state and picks its action; all decide before
    any action executes. Returns (observations, actions, explained), one list per game; explained:
    a learned policy's probabilities and state features behind each action (MetaPolicy.explain),
    None for a fixed policy."""
    rows = [(g, i) for g in games for i in range(cfg.agents)]
    observations = [
        observe(g.solutions, i, t - 1, cfg.rounds, g.changed, g.last_actions) for g, i in rows
    ]
    own = torch.tensor([o for o, _ in observations], dtype=torch.float32)
    peers = torch.tensor([p for _, p in observations], dtype=torch.float32)

    # only the oracle reads these: the team's correctness (from the gold answer) and confidences
    teams = {id(g): g.vote_summary(g.solutions) for g in games}
    info = [
        {
            "agent": i,
            "agent_correct": teams[id(g)]["agent_correct"],
            "confidence": teams[id(g)]["confidence"],
        }
        for g, i in rows
    ]
    # one uniform per (question, agent, round): a
    # question's actions do not depend on its batch-mates
    uniforms = torch.tensor(
        [call_seed(cfg.seed, g.example.id, i, t, "act") / 2**60 for g, i in rows],
        dtype=torch.float64,
    )
    agent_index = torch.tensor([i for _, i in rows])
    actions = policy.act(own, peers, agent_index, info, uniforms, greedy=cfg.greedy_policy)
    explained = (
        per_question(policy.explain(own, peers, agent_index), cfg.agents)
        if isinstance(policy, MetaPolicy)
        else [None] * len(games)
    )
    return per_question(observations, cfg.agents), per_question(actions, cfg.agents), explained


def play(engine, examples, policy, cfg, record_states=False, counterfactual=False, progress=None):
    """Plays the deliberation game on every example at once; returns one transcript dict per
    example.

    All LLM calls of a round, for every question and agent, go through the engine together.
    record_states: each round record keeps every agent's observation (`own`, `peers`).
    counterfactual (docs/design.md §6, the training corpus): each round record also gets
    `reward_vectors`, every agent's shaped reward for each of its K actions
    (counterfactual_rewards). REFINE needs a sample from every agent that did not REFINE; these
    samples count in `tokens` and `calls`."""
    if cfg.agents < 2:
        raise ValueError("the game needs at least 2 agents")
    critic = cfg.critic or policy.reads_critic
    games = [
        Game(ex, changed=[False] * cfg.agents, last_actions=[None] * cfg.agents) for ex in examples
    ]
    # round 0: every agent solves the question on its own
    requests = [
        (g, *call)
        for g, calls in zip(games, per_question(solve_calls(examples, cfg), cfg.agents))
        for _, *call in calls
    ]
    for g, answered in zip(games, per_question(ask(engine, requests, cfg, critic), cfg.agents)):
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
        observations, actions, explained = decide(policy, active, t, cfg)
        # execute: the REFINE calls first (of every agent,
        # for the counterfactual rewards), then the moves
        refine = [
            (k, i)
            for k, acts in enumerate(actions)
            for i, a in enumerate(acts)
            if a == REFINE or counterfactual
        ]
        requests = [
            (
                active[k],
                refine_prompt(active[k].example, active[k].solutions, i, cfg.trailer),
                call_seed(cfg.seed, active[k].example.id, i, t, "refine"),
                i,
            )
            for k, i in refine
        ]
        samples = ask(engine, requests, cfg, critic)
        refined = [{} for _ in active]  # per game: agent -> its REFINE sample
        # per game: what a REFINE costs each agent's reward
        costs = [[0.0] * cfg.agents for _ in active]
        for (k, i), (sample, n_tokens) in zip(refine, samples):
            refined[k][i], costs[k][i] = sample, cfg.refine_cost * n_tokens / 1000
        for g, acts, seen, why, mine, cost in zip(
            active, actions, observations, explained, refined, costs
        ):
            before = g.solutions
            after = [outcome(before, i, a, mine) for i, a in enumerate(acts)]
            ex = g.example
            record = {
                "round": t,
                "actions": acts,
                "rewards": [
                    shaped_reward(before, after, i, ex.answer, ex.task) - cost[i] * (a == REFINE)
                    for i, a in enumerate(acts)
                ],
                "texts": [s.text for s in after],
                **g.vote_summary(after),
                "stopped": all(a == PERSIST for a in acts),
            }
            if why is not None:
                record["policy"] = why
            if counterfactual:
                record["reward_vectors"] = counterfactual_rewards(
                    before, after, mine, ex.answer, ex.task, cost
                )
            if record_states:
                record["own"], record["peers"] = [o for o, _ in seen], [p for _, p in seen]
            g.rounds.append(record)
            g.changed = [a.answer != b.answer for a, b in zip(after, before)]
            g.last_actions, g.solutions = list(acts), after
        if progress is not None:
            progress.update(1)
    return [g.transcript() for g in games]


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


# --------------------------------------------------------------------------------------------------
# 4. Protocols
# --------------------------------------------------------------------------------------------------
def lead(engine, leader, examples, cfg):
    """MLPO's protocol (arXiv 2507.08960): cfg.agents peers (`engine`) answer, then the `leader`
    engine reads their solutions and answers (greedy). Each of cfg.rounds further rounds lets every
    peer revise after reading the leader's answer (REFINE with the leader as one more peer), and the
    leader answers again. The prediction is the leader's last answer; `peer_vote_correct` is the
    peers' round-0 majority vote."""
    n = cfg.agents
    outputs = per_question(run_llm(engine, solve_calls(examples, cfg), cfg), n)
    peers = [[s for s, _ in team] for team in outputs]
    results = [
        {
            "id": ex.id,
            "question": ex.question,
            "gold": ex.answer,
            "tokens": sum(k for _, k in team),
            "calls": n,
            "peer_vote_correct": data.is_correct(majority_vote(solutions)[0], ex.answer, ex.task),
            # per round: the peers' answers the leader read, then the leader's answer
            "peer_answers": [],
            "peer_correct": [],
            "leader_answers": [],
            "leader_correct": [],
            "texts": [],
        }
        for ex, team, solutions in zip(examples, outputs, peers)
    ]
    led = []  # the leader's (solution, tokens) of the previous round
    for t in range(cfg.rounds + 1):
        if t:
            calls = [(q, i) for q in range(len(examples)) for i in range(n)]
            requests = [
                (
                    examples[q],
                    refine_prompt(examples[q], peers[q] + [led[q][0]], i, cfg.trailer),
                    call_seed(cfg.seed, examples[q].id, i, t, "revise"),
                    i,
                )
                for q, i in calls
            ]
            revised = run_llm(engine, requests, cfg)
            for (q, i), (s, k) in zip(calls, revised):
                peers[q][i] = s
                results[q]["tokens"] += k
                results[q]["calls"] += 1
        requests = [
            (ex, leader_prompt(ex, peers[q], cfg.trailer), call_seed(cfg.seed, ex.id, t, "lead"), 0)
            for q, ex in enumerate(examples)
        ]
        led = run_llm(leader, requests, cfg, temperature=0.0)
        for q, (s, k) in enumerate(led):
            ex, r = examples[q], results[q]
            r["tokens"] += k
            r["calls"] += 1
            r["texts"].append(s.text)
            r["peer_answers"].append([p.answer for p in peers[q]])
            r["peer_correct"].append(
                [data.is_correct(p.answer, ex.answer, ex.task) for p in peers[q]]
            )
            r["leader_answers"].append(s.answer)
            r["leader_correct"].append(data.is_correct(s.answer, ex.answer, ex.task))
    for r, (s, _) in zip(results, led):
        r.update(pred=s.answer, correct=r["leader_correct"][-1])
    return results


PROTOCOLS = (
    "vanilla", "cot", "sc", "debate", "mpdf-persist", "mpdf-random", "mpdf-oracle",
    "mpdf=PATH", "leader=PATH", "leader=default",
)  # fmt: skip


def run_protocol(engine, examples, protocol, cfg, leader=None):
    """One result dict per example: at least pred, correct, tokens, calls (and rounds for the
    game). leader=SPEC needs the `leader`'s engine (or team: eval.py makes it from SPEC, a model
    directory or default, + an adapter file or not)."""
    if protocol in ("vanilla", "cot", "sc"):
        prompt = vanilla_prompt if protocol == "vanilla" else cot_prompt
        # self-consistency gets as many samples as debate makes generations, sample k from agent
        # k mod agents (a team's models take turns); single answers are greedy, agent 0's
        samples = cfg.agents * (cfg.rounds + 1) if protocol == "sc" else 1
        requests = [
            (ex, prompt(ex), call_seed(cfg.seed, ex.id, k, protocol), k % cfg.agents)
            for ex in examples
            for k in range(samples)
        ]
        outputs = run_llm(
            engine, requests, cfg, temperature=cfg.temperature if protocol == "sc" else 0.0
        )
        results = []
        for ex, mine in zip(examples, per_question(outputs, samples)):
            pred, _ = majority_vote([s for s, _ in mine])
            results.append(
                {
                    "id": ex.id,
                    "question": ex.question,
                    "gold": ex.answer,
                    "pred": pred,
                    "correct": data.is_correct(pred, ex.answer, ex.task),
                    "tokens": sum(n for _, n in mine),
                    "calls": samples,
                    "texts": [s.text for s, _ in mine],
                    "answers": [s.answer for s, _ in mine],
                    "answer_correct": [
                        data.is_correct(s.answer, ex.answer, ex.task) for s, _ in mine
                    ],
                }
            )
        return results
    if protocol == "debate":
        return play(engine, examples, FixedPolicy("refine"), cfg)
    if protocol.startswith("mpdf-"):
        return play(engine, examples, make_policy(protocol[len("mpdf-") :]), cfg)
    if protocol.startswith("mpdf="):
        return play(engine, examples, make_policy(protocol[len("mpdf=") :]), cfg)
    if protocol.startswith("leader=") and leader is not None:
        return lead(engine, leader, examples, cfg)
    raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
