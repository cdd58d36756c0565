"""Protocols side by side (docs/design.md §7): accuracy, token cost, LLM calls, action statistics.

    python eval.py --task arith --n 200 --seed 0 --agents 3 --rounds 3 \
        --protocols vanilla,cot,sc,debate,mpdf-persist,mpdf-random,mpdf-oracle --out results.json

`--path` for file tasks (gsm8k, mawps, svamp, mc, math), `--model` for any HF causal-LM directory,
`mpdf=PATH` for a trained policy, `leader=PATH` for MLPO (the agents answer, the leader model at
PATH reads them and answers; `leader=default`: the untrained backbone leads; `--rounds` more rounds
let the agents revise after reading the leader's answer). Generations are cached on disk
(`--cache-dir`/generations.db), so a second identical evaluation makes no LLM call.
"""

import dataclasses
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

import data
from common import (
    UsageError,
    call_seed,
    check_at_least,
    check_choice,
    machine,
    parse_config,
    user_errors,
)
from data import check_task
from deliberate import (
    ACTION_KINDS,
    FIXED_POLICIES,
    FixedPolicy,
    action_counts,
    check_own_game,
    check_team,
    load_policy,
    make_policy,
    play,
)
from llm.team import check_engine, check_models, make_engine, resolve_engine_dtype, team_name
from rules import load_rule
from solutions import (
    CONFIDENCE_SIGNALS,
    Call,
    GameConfig,
    check_game,
    cot_prompt,
    leader_prompt,
    majority_vote,
    per_question,
    refine_prompt,
    run_llm,
    solve_calls,
    solve_prompt,
    vanilla_prompt,
)
from stats import auroc, format_paired, paired_difference, pooled, sample_std


@dataclass
class Config:
    # the task
    task: str = "arith"
    """arith or split (built-in; split: its values dealt among the agents) or a file task: gsm8k,
    mawps, svamp, mc, math (with --path)"""
    path: str = ""
    """the data file of a file task"""
    level: int = 0
    """arith difficulty 1..4 (0: the task's default, easy)"""
    split_questions: float = 0.5
    """task split: the share of questions whose three values are dealt among the agents (the rest:
    every agent holds every value)"""
    values_held: int = 2
    """task split: how many of a split question's three values each agent holds (1 or 2)"""
    # the game
    seed: int = 0
    """seeds every LLM call (with the question id, agent and round), every sampled action, the
    questions, the data order and the initialization"""
    agents: int = 3
    """agents in the team"""
    rounds: int = 3
    """deliberation rounds after round 0"""
    temperature: float = 0.5
    """the agents' sampling temperature (the temperature study on validation questions)"""
    top_p: float = 1.0
    """nucleus sampling's probability mass"""
    max_new_tokens: int = 192
    """token budget of each LLM call"""
    trailer: bool = False
    """ask for the Steps / Confidence / Answer trailer (it costs the default backbone accuracy)"""
    critic: bool = False
    """run the critic pass: its p(Correct) in the state (always for a policy trained with it)"""
    vote: str = "mean_prob"
    """the vote's tie-break signal, the same for every protocol (solutions.VOTE_RULES)"""
    whole_solutions: bool = False
    """REFINE and the leader read every solution whole (default: REFINE sees peers' final answers
    and its own last 300 characters, the leader each solution's last 300)"""
    # the engine
    model: str = ""
    """HF checkpoint directory of the agents; empty: the embedded default backbone"""
    models: str = ""
    """one model per agent, comma-separated: an HF directory or `default`, + an adapter file
    (train_solver.py, train_magrpo.py) or not, e.g. default+a0.pt,default+a1.pt,default; agents on
    one base share its engine (empty: --model for every agent)"""
    dtype: str = "auto"
    """the backbone's dtype: float32 | bfloat16 | float16 | int8 | auto (bf16 where the CPU or GPU
    runs it natively, else fp32; docs/design.md §11)"""
    engine_batch_size: int = 128
    """engine slots (sequences decoded together; docs/design.md §11)"""
    cache_dir: str = "cache/generations"
    """the generation cache (empty: off); an identical run a second time makes no LLM call"""
    # the script's own
    split: str = ""
    """empty: test for arith, the whole file for a file task; train / test of a file
    (data.split_of); val: the first --n validation questions of the training pool
    (data.training_pool, --seed), which sft.py and train_rl.py runs of that seed hold out when
    their --val-n >= n"""
    n: int = 200
    """questions (a seeded random subset)"""
    seeds: str = ""
    """e.g. 0,1,2: one evaluation per seed, then accuracy mean ± sample std over the seeds"""
    protocols: str = "vanilla,cot,sc,debate,mpdf-persist,mpdf-random,mpdf-oracle"
    """comma-separated: vanilla, alone, cot, sc, debate, debate-1, debate-2 (debate of 1 or 2
    rounds), mpdf-persist, mpdf-random, mpdf-oracle, mpdf=POLICY.pt, the rules that decide when to
    talk (rules.py: freeze, minority, gate=RULES.json, trigger=RULES.json, fitted by python -m
    experiments.talk_rules), leader=MODEL_DIR, leader=default"""
    reference: str = ""
    """a protocol of the list: every other one's paired accuracy difference to it"""
    any_game: bool = False
    """play a policy (mpdf=PATH) in a game other than the one it was trained in (another --task,
    --agents or --rounds): a study of transfer; without it such a policy is refused"""
    out: str = ""
    """the JSON results file (empty: the table only)"""
    details: bool = True
    """the JSON keeps every transcript (--no-details: the summaries, with the per-question outcomes
    that paired statistics need)"""


# --------------------------------------------------------------------------------------------------
# The protocols (docs/design.md §7)
# --------------------------------------------------------------------------------------------------
def lead(engine, leader, examples, game):
    """MLPO's protocol (arXiv 2507.08960): game.agents peers (`engine`) answer, then the `leader`
    engine reads their solutions and answers (greedy). Each of game.rounds further rounds lets every
    peer revise after reading the leader's answer (REFINE with the leader as one more peer), and the
    leader answers again. The prediction is the leader's last answer; `peer_vote_correct` is the
    peers' round-0 majority vote."""
    n = game.agents
    outputs = per_question(run_llm(engine, solve_calls(examples, game), game), n)
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
            **{k: [] for k in ("peer_answers", "peer_correct", "leader_answers", "leader_correct")},
            "texts": [],
        }
        for ex, team, solutions in zip(examples, outputs, peers)
    ]
    led = []  # the leader's (solution, tokens) of the previous round
    for t in range(game.rounds + 1):
        if t:
            rows = [(q, i) for q in range(len(examples)) for i in range(n)]
            teams = [peers[q] + [led[q][0]] for q in range(len(examples))]
            calls = [
                Call(
                    examples[q],
                    refine_prompt(examples[q], teams[q], i, game.trailer, game.whole_solutions),
                    call_seed(game.seed, examples[q].id, i, t, "revise"),
                    i,
                )
                for q, i in rows
            ]
            revised = run_llm(engine, calls, game)
            for (q, i), (s, k) in zip(rows, revised):
                peers[q][i] = s
                results[q]["tokens"] += k
                results[q]["calls"] += 1
        prompts = [
            leader_prompt(ex, team, game.trailer, game.whole_solutions)
            for ex, team in zip(examples, peers)
        ]
        calls = [
            Call(ex, prompt, call_seed(game.seed, ex.id, t, "lead"), 0)
            for ex, prompt in zip(examples, prompts)
        ]
        led = run_llm(leader, calls, game, temperature=0.0)
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


def independent_answers(engine, examples, game, prompt, samples, temperature, name):
    """Answers asked independently and their vote: `samples` calls per question (call k by agent k
    mod agents: a team's models take turns), each seeded by the protocol's `name`."""
    calls = [
        Call(ex, prompt(ex, k % game.agents), call_seed(game.seed, ex.id, k, name), k % game.agents)
        for ex in examples
        for k in range(samples)
    ]
    outputs = run_llm(engine, calls, game, temperature=temperature)
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
                "answer_correct": [data.is_correct(s.answer, ex.answer, ex.task) for s, _ in mine],
            }
        )
    return results


def vanilla(engine, examples, game, arg):
    """One greedy answer of agent 0 to the bare question."""
    return independent_answers(engine, examples, game, vanilla_prompt, 1, 0.0, "vanilla")


def alone(engine, examples, game, arg):
    """One greedy answer of agent 0, asked as the game's round 0 asks it (solutions.solve_prompt):
    an agent trained on the game's prompt answers alone in the words it learned, so that its
    accuracy measures the agent and not a wording it never saw."""

    def prompt(example, agent):
        return solve_prompt(example, game.trailer, agent)

    return independent_answers(engine, examples, game, prompt, 1, 0.0, "alone")


def cot(engine, examples, game, arg):
    """One greedy chain-of-thought answer of agent 0."""
    return independent_answers(engine, examples, game, cot_prompt, 1, 0.0, "cot")


def sc(engine, examples, game, arg):
    """Self-consistency at debate's budget: as many sampled chain-of-thought answers as debate
    makes generations, and their vote."""
    samples = game.agents * (game.rounds + 1)
    return independent_answers(engine, examples, game, cot_prompt, samples, game.temperature, "sc")


def games(engine, examples, policy, game):
    return [g.transcript() for g in play(engine, examples, policy, game)]


def debate(engine, examples, game, arg, rounds=None):
    """Every agent REFINEs every round: of --rounds rounds, or stopped after `rounds` (the same
    calls as debate's first rounds)."""
    short = game if rounds is None else dataclasses.replace(game, rounds=rounds)
    return games(engine, examples, FixedPolicy("refine"), short)


def policy_file(engine, examples, game, spec):
    """The game under a trained meta-policy (mpdf=PATH; mpdf=NAME plays the fixed policy NAME)."""
    return games(engine, examples, make_policy(spec), game)


def fixed(engine, examples, game, arg, name):
    """The game under a fixed policy (mpdf-persist: the team's round-0 vote; mpdf-oracle)."""
    return policy_file(engine, examples, game, name)


def rule(engine, examples, game, path, name):
    """The game under a rule that decides when to talk (rules.py; gate and trigger read their
    fitted JSON at PATH)."""
    return games(engine, examples, load_rule(f"{name}={path}" if path else name), game)


# every protocol: its name (NAME=ARG: its argument, a file or the leader's model) -> how it plays,
# a function (engine, examples, game, arg) -> one result dict per example: at least pred, correct,
# tokens, calls (and rounds for a game)
PLAYS = {
    "vanilla": vanilla,
    "alone": alone,
    "cot": cot,
    "sc": sc,
    "debate": debate,
    "debate-1": partial(debate, rounds=1),
    "debate-2": partial(debate, rounds=2),
    # mpdf-refine would be debate
    **{f"mpdf-{name}": partial(fixed, name=name) for name in FIXED_POLICIES if name != "refine"},
    "freeze": partial(rule, name="freeze"),
    "minority": partial(rule, name="minority"),
    "gate=": partial(rule, name="gate"),
    "trigger=": partial(rule, name="trigger"),
    "mpdf=": policy_file,
    "leader=": lambda engine, examples, game, leader: lead(engine, leader, examples, game),
}
# the names as --help and the refusals list them
PROTOCOLS = tuple(name + ("PATH" if name.endswith("=") else "") for name in PLAYS)
PROTOCOLS += ("leader=default",)


def run_protocol(engine, examples, protocol, game, leader=None):
    """One result dict per example (PLAYS). leader=SPEC needs the `leader`'s engine (or team:
    eval.py makes it from SPEC, a model directory or default, + an adapter file or not)."""
    name, equals, arg = protocol.partition("=")
    play_it = PLAYS.get(name + equals)
    if play_it is None:
        raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    if name == "leader":
        if leader is None:
            raise ValueError(f"protocol {protocol!r} needs its leader's engine")
        arg = leader
    return play_it(engine, examples, game, arg)


def describe_vote(rule):
    return (
        "majority; ties to the lower agent index"
        if rule == "index"
        else f"majority; ties to the higher {rule} (generation confidence), then the lower agent "
        "index"
    )


def summarize(results, wall_s):
    """The metrics of one protocol from its per-question results."""
    n = len(results)
    accuracy = sum(r["correct"] for r in results) / n
    summary = {
        "n": n,
        "accuracy": accuracy,
        "stderr": math.sqrt(accuracy * (1 - accuracy) / n),
        "tokens_per_question": sum(r["tokens"] for r in results) / n,
        "calls_per_question": sum(r["calls"] for r in results) / n,
        "unparseable": sum(r["pred"] is None for r in results) / n,
        "wall_s": wall_s,
        "wall_s_per_question": wall_s / n,
        # per question, for paired comparisons on the same questions (also across seeds)
        "question_ids": [r["id"] for r in results],
        "correct": [bool(r["correct"]) for r in results],
        # and each question's tokens, for reports over a part of the questions (task split:
        # the questions dealt among the agents, or shared)
        "question_tokens": [r["tokens"] for r in results],
    }
    # MLPO: the peers' own vote (paired with `correct`), then the leader after each round
    if "leader_correct" in results[0]:
        summary["peer_vote_accuracy"] = sum(r["peer_vote_correct"] for r in results) / n
        summary["peer_vote_correct"] = [bool(r["peer_vote_correct"]) for r in results]
        summary["accuracy_per_round"] = [
            sum(r["leader_correct"][t] for r in results) / n
            for t in range(len(results[0]["leader_correct"]))
        ]
    # a game: action statistics, accuracy per round, trailer and critic quality
    if "rounds" in results[0]:
        counts = action_counts(results)
        total = sum(counts.values()) or 1
        summary["actions"] = {kind: c / total for kind, c in counts.items()}
        summary["question_actions"] = [action_counts([r]) for r in results]
        max_rounds = max(len(r["rounds"]) for r in results)
        # the shares of each decision round (games that stopped early have no later decisions)
        summary["actions_by_round"] = [
            {kind: c / (sum(counts.values()) or 1) for kind, c in counts.items()}
            for counts in (action_counts(results, t) for t in range(1, max_rounds))
        ]
        # a question that stopped early keeps its last vote in the later rounds
        summary["accuracy_per_round"] = [
            sum(r["rounds"][min(t, len(r["rounds"]) - 1)]["correct"] for r in results) / n
            for t in range(max_rounds)
        ]
        first = [
            (ok, trailer, critic, signals)
            for r in results
            for ok, trailer, critic, signals in zip(
                r["rounds"][0]["agent_correct"],
                r["rounds"][0]["trailer_ok"],
                r["rounds"][0]["critic"],
                r["rounds"][0]["signals"],
            )
        ]
        summary["trailer_compliance"] = sum(t for _, t, _, _ in first) / len(first)
        summary["agent_accuracy_round0"] = sum(ok for ok, _, _, _ in first) / len(first)
        # a perfect selector's bound before any REFINE: some agent of the team was right in round 0
        summary["any_agent_right_round0"] = (
            sum(any(r["rounds"][0]["agent_correct"]) for r in results) / n
        )
        # how well each confidence signal tells a right round-0 solution from a wrong one
        labels = [ok for ok, _, _, _ in first]
        summary["confidence_auroc"] = {
            name: auroc([signals[name] for _, _, _, signals in first], labels)
            for name in CONFIDENCE_SIGNALS
        }
        if all(critic is not None for _, _, critic, _ in first):
            summary["confidence_auroc"]["critic"] = auroc(
                [critic for _, _, critic, _ in first], labels
            )
    return summary


def add_paired(summaries, reference):
    """summaries[p]["vs_reference"] for every protocol p (the reference's own: 0, [0, 0], 0)."""
    for summary in summaries.values():
        summary["vs_reference"] = {
            "reference": reference,
            **paired_difference(summary, summaries[reference]),
        }


def by_part(summary, examples):
    """Task split: the summary with each question's part (`question_dealt`: its values dealt among
    the agents) and accuracy, tokens and actions over the split and the shared questions apart;
    other tasks: the summary as it is."""
    if not examples or "dealt" not in examples[0].meta:
        return summary
    dealt = {ex.id: ex.meta["dealt"] for ex in examples}
    marks = [dealt[q] for q in summary["question_ids"]]
    parts = {}
    for part, wanted in (("split", True), ("shared", False)):
        rows = [k for k, mark in enumerate(marks) if mark == wanted]
        if not rows:
            continue
        parts[part] = {
            "n": len(rows),
            "accuracy": sum(summary["correct"][k] for k in rows) / len(rows),
            "tokens_per_question": sum(summary["question_tokens"][k] for k in rows) / len(rows),
        }
        if "question_actions" in summary:
            counts = {
                kind: sum(summary["question_actions"][k][kind] for k in rows)
                for kind in ACTION_KINDS
            }
            parts[part]["actions"] = {k: c / (sum(counts.values()) or 1) for k, c in counts.items()}
    return {**summary, "question_dealt": marks, "parts": parts}


def print_table(summaries):
    width = max([28] + [len(name) + 2 for name in summaries])
    first = next(iter(summaries.values()))
    header = (
        f"{'protocol':<{width}}{'accuracy':>16}{'tokens/q':>10}{'calls/q':>9}{'unparsed':>9}"
        f"  {'actions p/r/c':<15}"
    )
    if "vs_reference" in first:
        header += f"  vs {first['vs_reference']['reference']} [95% CI] (disagree)"
    print(header)
    print("-" * len(header))
    for name, s in summaries.items():
        actions = s.get("actions")
        actions = "/".join(f"{actions[k]:.2f}" for k in ACTION_KINDS) if actions else "-"
        row = (
            f"{name:<{width}}{s['accuracy']:>9.3f} ± {s['stderr']:.3f}"
            f"{s['tokens_per_question']:>10.0f}{s['calls_per_question']:>9.1f}"
            f"{s['unparseable']:>9.3f}  {actions:<15}"
        )
        if "vs_reference" in s:
            row += "  " + format_paired(s["vs_reference"])
        print(row.rstrip())
        for part, p in s.get("parts", {}).items():
            actions = (
                "/".join(f"{p['actions'][k]:.2f}" for k in ACTION_KINDS) if "actions" in p else "-"
            )
            label = f"  {part} questions ({p['n']})"
            cells = f"{p['accuracy']:>9.3f}{'':8}{p['tokens_per_question']:>10.0f}{'':18}"
            print(f"{label:<{width}}{cells}  {actions}")


def print_reading(summaries, reference):
    """The table in words: each protocol against the reference, on the same questions."""
    ref = summaries[reference]
    print(
        f"\nIn words (paired on the same {ref['n']} questions; a 95% interval that excludes 0 is a "
        "difference these questions can show):"
    )
    for name, s in summaries.items():
        if name == reference:
            continue
        low, high = s["vs_reference"]["ci95"]
        verdict = "above" if low > 0 else "below" if high < 0 else "not separable from"
        print(
            f"  {name}: {s['accuracy']:.3f} at {s['tokens_per_question']:.0f} tokens/q, {verdict} "
            f"{reference} ({ref['accuracy']:.3f} at {ref['tokens_per_question']:.0f} tokens/q): "
            f"{format_paired(s['vs_reference'])}"
        )


def load_examples(cfg):
    """The questions of cfg.split; "val" is the validation slice of the training pool (the levers
    are studied on it, never on the test questions)."""
    if cfg.split == "val":
        return data.training_pool(cfg)[: cfg.n]
    return data.load_task(
        cfg.task,
        path=cfg.path or None,
        split=cfg.split,
        n=cfg.n,
        seed=cfg.seed,
        **data.task_options(cfg),
    )


def protocol_list(cfg):
    return [p.strip() for p in cfg.protocols.split(",") if p.strip()]


def check(cfg):
    """The whole configuration, before any model is loaded or any protocol has spent compute (a
    mistake: common.UsageError). Every protocol of the list is checked, its files loaded."""
    # rounds 0: round 0 only (the team's vote of independent answers; MLPO's leader decides once)
    check_task(cfg)
    check_game(GameConfig.of(cfg), min_rounds=0)
    check_engine(cfg, cfg.agents, cfg.max_new_tokens)
    check_at_least(1, n=cfg.n)
    check_choice("--split", cfg.split, ("", "train", "test", "all", "val"))
    if cfg.seeds and not all(x.strip().isdigit() for x in cfg.seeds.split(",")):
        raise UsageError(f"--seeds {cfg.seeds!r}: comma-separated integers, e.g. 0,1,2")
    protocols = protocol_list(cfg)
    if not protocols:
        raise UsageError("--protocols is empty")
    for protocol in protocols:
        check_protocol(protocol, cfg)
    if cfg.reference:
        check_choice("--reference", cfg.reference, protocols)


def check_protocol(protocol, cfg):
    """A protocol of --protocols: a name of PLAYS, with its argument where it takes one: a fitted
    rule's file checked whole, a policy file that loads and can play this game, or a leader's
    model."""
    name, equals, arg = protocol.partition("=")
    if name + equals not in PLAYS:
        raise UsageError(
            f"--protocols: unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}"
        )
    source = f"--protocols {protocol}"
    if name in ("gate", "trigger"):
        if not Path(arg).is_file():
            raise UsageError(f"{source}: no file {arg!r} of fitted rules")
        try:
            load_rule(protocol)
        except ValueError as error:
            raise UsageError(f"{source}: {error}") from None
    elif name == "mpdf":
        if not Path(arg).is_file():
            raise UsageError(f"{source}: no policy file {arg!r}")
        policy = load_policy(arg)
        check_team(policy, cfg.agents, source)
        if not cfg.any_game:
            check_own_game(policy, cfg, source)
    elif name == "leader" and arg != "default":
        check_models(f"{source}:", arg, 1, cfg.max_new_tokens)


def main(cfg):
    protocols = protocol_list(cfg)
    # one process: the engines on the first GPU where there is one (the policies stay on the CPU)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg, dtype_reason = resolve_engine_dtype(cfg, device)
    # a file may be a test set in itself, so it is taken whole unless a split is asked for
    generated = cfg.task.startswith("arith") or cfg.task == "split"
    cfg = dataclasses.replace(cfg, split=cfg.split or ("test" if generated else "all"))
    examples = load_examples(cfg)
    engine = make_engine(cfg, cfg.agents, 0, device)
    summaries, details = {}, {}
    for protocol in protocols:
        start = time.time()
        # leader=SPEC: a model directory or default, + an adapter file or not
        leader = None
        if protocol.startswith("leader="):
            spec = dataclasses.replace(cfg, model="", models=protocol[len("leader=") :])
            leader = make_engine(spec, 1, 0, device)
        results = run_protocol(engine, examples, protocol, GameConfig.of(cfg), leader)
        summaries[protocol] = by_part(summarize(results, time.time() - start), examples)
        details[protocol] = results
        print(
            f"[{protocol}] accuracy {summaries[protocol]['accuracy']:.3f} "
            f"({summaries[protocol]['wall_s']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    if cfg.reference:
        add_paired(summaries, cfg.reference)
    print(
        f"\ntask {cfg.task} ({cfg.split}, n={len(examples)}), {cfg.agents} agents, "
        f"{cfg.rounds} rounds, seed {cfg.seed}, "
        f"model {team_name(cfg)} ({cfg.dtype}; {dtype_reason})\n"
        f"vote: {describe_vote(cfg.vote)}"
    )
    print_table(summaries)
    if cfg.reference:
        print_reading(summaries, cfg.reference)
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        with open(cfg.out, "w") as f:
            json.dump(
                {
                    "config": dataclasses.asdict(cfg),
                    "machine": machine(),
                    "dtype_reason": dtype_reason,
                    "engine": engine.stats,
                    **summaries,
                    **({"details": details} if cfg.details else {}),
                },
                f,
                indent=1,
            )
    return summaries


def over_seeds(cfg):
    """One evaluation per seed (its own question subset and LLM seeds), then mean ± std over the
    seeds."""
    seeds = [int(x) for x in cfg.seeds.split(",") if x.strip()]
    runs = []
    for seed in seeds:
        out = (
            str(Path(cfg.out).with_name(f"{Path(cfg.out).stem}-seed{seed}.json")) if cfg.out else ""
        )
        runs.append(main(dataclasses.replace(cfg, seed=seed, seeds="", out=out)))
    table = {}
    for protocol in runs[0]:
        values = {
            k: [r[protocol][k] for r in runs]
            for k in ("accuracy", "tokens_per_question", "wall_s_per_question")
        }
        table[protocol] = {
            f"{k}_{stat}": fn(v)
            for k, v in values.items()
            for stat, fn in (("mean", statistics.mean), ("std", sample_std))
        }
        table[protocol]["accuracy_per_seed"] = values["accuracy"]
        if "actions" in runs[0][protocol]:
            table[protocol]["actions"] = {
                a: statistics.mean(r[protocol]["actions"][a] for r in runs)
                for a in runs[0][protocol]["actions"]
            }
        if cfg.reference:
            both = [
                pooled({s: r[p] for s, r in zip(seeds, runs)}) for p in (protocol, cfg.reference)
            ]
            paired_to = {"reference": cfg.reference, **paired_difference(*both)}
            table[protocol]["vs_reference"] = paired_to
    paired = f", paired difference to {cfg.reference} pooled over seeds [95% CI] (disagree)"
    header = "accuracy mean ± sample std (n - 1) over seeds, tokens per question"
    print(f"\nover seeds {seeds}: {header}" + (paired if cfg.reference else ""))
    for protocol, row in table.items():
        line = (
            f"{protocol:<40}{row['accuracy_mean']:>8.3f} ± {row['accuracy_std']:.3f}"
            f"{row['tokens_per_question_mean']:>10.0f}"
        )
        print(line + ("  " + format_paired(row["vs_reference"]) if cfg.reference else ""))
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), **table}, f, indent=1)
    return table


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors():
        check(config)
        over_seeds(config) if config.seeds else main(config)
