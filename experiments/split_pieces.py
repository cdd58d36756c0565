"""The pieces of the split-information task (data/split.py, docs/design.md §9), where the facts of
half the questions are dealt among the agents: its agents trained on worked solutions of it (the
first answer from the values an agent holds, then REFINE over the peers' whole solutions), their
revision skill per state class (the agents' own acceptance: alone, and after one REFINE), and the
team's table as every other claim is tested: the meta-policies, the fixed protocols, each member
alone, the MLPO leader and MAGRPO on debate, 300 test questions, 3 seeds. experiments/pieces.py
holds them with every other piece; new weights are committed in the ecosystem's formats (PEFT
folders, safetensors policies)."""

from experiments.llm_pieces import MAGRPO_LORA, PY, RUNS, WORKED_SFT, llm_run
from experiments.piece_kit import (
    RL_FLAGS,
    SFT_STATE,
    TABLE_GAME,
    TABLE_SEEDS,
    TABLE_TASKS,
    flags_once,
    merged,
    run_prefix,
    table,
    trained,
)
from experiments.teams import COMPETENT_RL_ALGOS, team_adapters, team_flags

# the task, its mix (half the questions split, 2 of 3 values each) and the game: REFINE reads whole
# solutions, which state the values an agent holds
SPLIT_TASK = ["--task", "split", "--level", "1", "--split-questions", "0.5", "--values-held", "2"]
SPLIT_GAME = ["--agents", "3", "--rounds", "3", "--whole-solutions"]
# the worked-solution preset on the split task: 512 training questions (3 views of each: 1,536
# first answers)
SPLIT_SFT = flags_once([*WORKED_SFT, *SPLIT_TASK, "--agents", "3", "--questions", "512"])


def agent_run(name, flags, needs=()):
    """An agent's adapter trained on the split task, committed as its PEFT folder."""
    training = llm_run(name, flags)
    training["copies"][RUNS / name / "adapter"] = f"results/agents/{name}"
    return {f"llm-{name}": {**training, "needs": list(needs)}}


def refine_run(rank, seed):
    """An agent continued from the worked-solution adapter of its rank on REFINE examples over
    its peers' whole solutions (the worked solution from every value as the target)."""
    first = f"results/agents/split-worked-L1-r{rank}-seed0"
    flags = [*SPLIT_SFT, "--lora-rank", str(rank), "--seed", str(seed + 1)]
    flags += ["--init-adapter", first, "--refine-contexts", first, "--whole-solutions"]
    # at the fresh adapter's 2e-3 the continued arith one lost its solo accuracy (results/)
    return agent_run(f"split-refine-L1-r{rank}-seed{seed}", [*flags, "--lr", "5e-4"], [first])


MEMBERS = ("split-refine-L1-r8-seed0", "split-refine-L1-r8-seed1", "split-refine-L1-r4-seed0")
TEAM = ",".join(f"default+results/agents/{m}" for m in MEMBERS)
ADAPTERS = [f"results/agents/{m}" for m in MEMBERS]
PREFIX = "split300-team-split"
# the meta-policies of a competent team's table: SFT, then SoftRankPO (and with REFINE free of its
# cost), GRPO, plain ranks and leave-one-out from it
POLICIES = ("sft", *COMPETENT_RL_ALGOS)
# SoftRankPO at REFINE costs between its default (0.5 per 1000 tokens) and free: at the default it
# keeps REFINE to split questions but REFINEs less than debate there; free, it REFINEs on shared
# questions too. Each cost is a policy of its own, on the same questions as the others (SoftRankPO
# ranks a state's rewards, so a cost that changes no order trains the default's policy). Below
# free, REFINE earns what it spends: its ties with PERSIST and CONCEDE go its way, as freeze's
# REFINE does where the free policy loses to freeze (it PERSISTed or CONCEDEd there).
REFINE_COSTS = ("-0.1", "0.1", "0.25")
SWEEP_FLAGS = {
    f"softrank-cost{c}": ["--algo", "softrank", "--refine-cost", c] for c in REFINE_COSTS
}
SWEEP = tuple(SWEEP_FLAGS)
# SoftRankPO with REFINE's ties given to it while the team disagrees, freeze's rule where the
# rewards cannot tell the actions apart (a REFINE below free gives it every tie): with REFINE free
# elsewhere, then paying elsewhere, so that its ties in a unanimous team go to PERSIST
TIES_FLAGS = {
    "softrank-cost0-disagree0.1": [*RL_FLAGS["softrank-cost0"], "--disagree-bonus", "0.1"],
    "softrank-cost0.1-disagree0.3": ["--algo", "softrank", "--refine-cost", "0.1"]
    + ["--disagree-bonus", "0.3"],
}
# SoftRankPO with REFINE free and each action taken crediting half the vote's gain to the game's
# end: the tie-breaks above hand REFINE's ties to a rule, this one to what followed in the corpus
# (half: below the brackets' step, it decides the ties only); then with the tied action not taken
# played on to the end as well, so that both sides of a tie learn of their own later rounds
LATER = [*RL_FLAGS["softrank-cost0"], "--later-weight", "0.5"]
LATER_FLAGS = {
    "softrank-cost0-later0.5": LATER,
    "softrank-cost0-later0.5-rollouts": [*LATER, "--rollouts"],
}
# SoftRankPO with REFINE free and each agent's values read from the round's outcomes under every
# joint action (experiments/joint_credit.py): COMA's marginal, lenient, Shapley over REFINE
# coalitions; the per-agent counterfactual prices a REFINE that pays only with a peer's at nothing
JOINT_FLAGS = {
    f"softrank-cost0-joint-{credit}": [*RL_FLAGS["softrank-cost0"], "--credit", credit]
    for credit in ("marginal", "lenient", "shapley")
}
# the state with what the texts say is missing (an agent's own view of a split question lacks a
# value, a solution says "Not known"), which no rule reads: the SFT policy of feature set `view`,
# then SoftRankPO with REFINE free from it. It lost (experiments/LOG.md) and its code left the
# spine: its pieces run at VIEW_CODE_AT, the last commit that holds it
VIEW_SFT = {"sft-view": ["--features", "view"]}
VIEW_FLAGS = {"softrank-cost0-view": RL_FLAGS["softrank-cost0"]}
VIEW_CODE_AT = "bc7a7e2"
# SoftRankPO on debate games, each state's rewards the team's vote to the game's end: stopping
# there, or going on until the policy stops (experiments/stop_credit.py); a REFINE paying 0.1 per
# 1000 tokens, so that where going on gains nothing the team stops, and free, so that a REFINE
# that ties PERSIST is not ranked below it. 128 training questions (half the others'): its corpus
# is debate's, every agent REFINEing every round; free on 256 questions too (the others' count), as
# the states where going on turns a 2-1 vote are few
STOP_FLAGS = {
    f"softrank-cost{cost}-stop": ["--algo", "softrank", "--refine-cost", cost, "--questions", "128"]
    for cost in ("0.1", "0")
} | {"softrank-cost0-stop-q256": ["--algo", "softrank", "--refine-cost", "0", "--questions", "256"]}
# the state with what the texts tell that no rule reads: a value missing (as `view`) and whether a
# solution's written steps check (each `a op b = c` recomputed; the team's wrong REFINEs on split
# questions are slips of arithmetic): the SFT policy of feature set `text`, then SoftRankPO with
# REFINE free from it
TEXT_SFT = {"sft-text": ["--features", "text"]}
TEXT_FLAGS = {"softrank-cost0-text": RL_FLAGS["softrank-cost0"]}
# every meta-policy a seed trains and plays, each SFT policy's flags (beside the seed's), each RL
# policy's flags and the SFT policy it starts from
TRAINED = (
    *POLICIES,
    *SWEEP,
    *TIES_FLAGS,
    *LATER_FLAGS,
    *JOINT_FLAGS,
    *VIEW_SFT,
    *VIEW_FLAGS,
    *STOP_FLAGS,
    *TEXT_SFT,
    *TEXT_FLAGS,
)
SFT_FLAGS = {"sft": SFT_STATE, **VIEW_SFT, **TEXT_SFT}
TRAIN_FLAGS = {
    **RL_FLAGS,
    **SWEEP_FLAGS,
    **TIES_FLAGS,
    **LATER_FLAGS,
    **JOINT_FLAGS,
    **VIEW_FLAGS,
    **STOP_FLAGS,
    **TEXT_FLAGS,
}
INIT = {name: "sft-view" for name in VIEW_FLAGS} | {name: "sft-text" for name in TEXT_FLAGS}
# the policies a study of the lab trains (its change handed to train_rl.train), else train_rl.py
STUDY_SCRIPTS = {
    "softrank-cost-0.1": "experiments.rl_refine_pays",
    **{name: "experiments.rl_disagree_bonus" for name in TIES_FLAGS},
    **{name: "experiments.rl_later_credit" for name in LATER_FLAGS},
    **{name: "experiments.joint_credit" for name in JOINT_FLAGS},
    **{name: "experiments.stop_credit" for name in STOP_FLAGS},
}
# variants whose seed 0 answered their question, so that their other seeds would say nothing new:
# handed REFINE every tie, or every tie while the team disagrees, SoftRankPO played debate game for
# game; crediting the action taken alone lost to the policy without it (the rollouts credit both)
SEED0_ONLY = ("softrank-cost-0.1", "softrank-cost0-disagree0.1", "softrank-cost0-later0.5")


def plays(part, seed):
    """Whether a seed's table plays `part` (a protocol or a policy)."""
    return seed == 0 or part not in SEED0_ONLY


# REFINE's value by state class, for the table's policies and the costs that a rule's tie-break
# does not decide (a policy that plays a rule game for game has the rule's)
VALUED = (*POLICIES, "softrank-cost0.1", "softrank-cost0.25")


def seed_pieces(seed):
    """One seed of the team's table: the revision skill at the first decision, the SFT policy and
    each RL policy from it, then every protocol on the seed's 300 test questions."""
    base = [*SPLIT_TASK, *SPLIT_GAME, "--models", TEAM, "--seed", str(seed)]
    test = ["--split", "test", "--n", "300", "--seed", str(seed)]
    name = f"{PREFIX}-seed{seed}"
    policy = {algo: f"results/policies/{name}-{algo}.safetensors" for algo in TRAINED}
    pieces = {
        f"revision-{name}": {
            "command": [PY, "-m", "experiments.revision_skill", *base, "--n", "300"]
            + ["--policy", "persist", "--out", f"results/revision/{name}.json"],
            "outputs": [f"results/revision/{name}.json"],
            "needs": ADAPTERS,
        }
    }
    for sft, sft_flags in SFT_FLAGS.items():
        pieces[f"train-{name}-{sft}"] = {
            **trained(f"{name}-{sft}", "sft.py", [*base, *sft_flags], policy[sft]),
            "needs": ADAPTERS,
        }
    played = [algo for algo in TRAINED if plays(algo, seed)]
    for algo in [a for a in played if a not in SFT_FLAGS]:
        init = policy[INIT.get(algo, "sft")]
        flags = [*base, *TRAIN_FLAGS[algo], "--init", init]
        pieces[f"train-{name}-{algo}"] = {
            **trained(
                f"{name}-{algo}", STUDY_SCRIPTS.get(algo, "train_rl.py"), flags, policy[algo]
            ),
            "needs": [init, *ADAPTERS],
        }
    protocols = {
        "persist": "mpdf-persist",
        **{algo: f"mpdf={policy[algo]}" for algo in played},
        "sc": "sc",
        "debate": "debate",
    }
    for short, protocol in protocols.items():
        needs = [protocol[5:]] if protocol.startswith("mpdf=") else []
        pieces[f"table-{name}-{short}"] = {
            **table(f"{name}-{short}", [*base, *test, "--protocols", protocol]),
            "needs": needs + ADAPTERS,
        }
    # the questions where a rule is blind, named by the team's round 0 (its vote, mpdf-persist, in
    # the tables' float32), for experiments/blind_slices.py to read from every table of the seed
    slices = f"results/slices/{name}.json"
    eval_flags = [*base, *test, "--dtype", "float32"]
    pieces[f"slices-{name}"] = {
        "command": [PY, "-m", "experiments.blind_slices", "round0", "--out", slices, "--"]
        + eval_flags,
        "outputs": [slices],
        "needs": ADAPTERS,
    }
    # what each policy's REFINEs and CONCEDEs gain over PERSIST in its test games, split and
    # shared questions apart
    for algo in VALUED:
        out = f"results/refine/{name}-{algo}.json"
        pieces[f"refine-value-{name}-{algo}"] = {
            "command": [PY, "-m", "experiments.refine_value", *base, "--n", "300"]
            + ["--policy", policy[algo], "--out", out],
            "outputs": [out],
            "needs": [policy[algo], *ADAPTERS],
        }
    # each member alone (a team of three copies of it, so that agent 0's view is the game's): its
    # greedy answer asked as the game's round 0 asks (alone, the words it was trained on), and
    # member 0 asked in vanilla's words, the single answer of every other table
    for j, member in enumerate(MEMBERS):
        copies = ",".join([f"default+results/agents/{member}"] * 3)
        for protocol in ["alone"] + (["vanilla"] if j == 0 else []):
            short = f"{name}-{protocol}-m{j}"
            flags = [*SPLIT_TASK, *SPLIT_GAME, "--models", copies, *test, "--protocols", protocol]
            pieces[f"table-{short}"] = {**table(short, flags), "needs": ADAPTERS}
    return pieces


# the MLPO leader over the team's whole solutions (it reads every value): MLPO's leader preset on
# the split task, from the REFINE-trained adapter (it takes values from solutions), at the rate that
# held for the aggregator (its preset's 5e-4 broke the aggregator in its first update); it and
# MAGRPO train on questions no member was trained on (the members solve those by heart)
LEADER = flags_once(
    [
        *"train_mlpo.py --algo magrpo --agents 3 --group 8 --questions-per-step 8".split(),
        *"--rollout-temperature 0.7 --max-new-tokens 96 --steps 24 --eval-every 6".split(),
        *"--val-n 100 --save-every 6 --lora-rank 8 --lr 1e-4 --truncated zero".split(),
        *SPLIT_TASK,
        *("--whole-solutions", "--questions", "256", "--peers", TEAM, "--unseen-questions"),
        *("--init-adapter", "results/agents/split-refine-L1-r8-seed0"),
    ]
)
# MAGRPO on debate from the team (one adapter per agent, each from its member), the joint reward
DEBATE = [
    *flags_once([*MAGRPO_LORA, *SPLIT_TASK]),
    *("--protocol", "debate", "--rounds", "1", "--separate-agents", "--whole-solutions"),
    "--unseen-questions",
    *(
        "--lora-rank",
        "8",
        "--lr",
        "1e-4",
        "--truncated",
        "zero",
        "--init-adapter",
        ",".join(ADAPTERS),
    ),
]


def trained_pieces(seed):
    """The seed's MLPO leader and MAGRPO team, each then on the seed's 300 test questions."""
    name, test = f"{PREFIX}-seed{seed}", ["--split", "test", "--n", "300", "--seed", str(seed)]
    leader, team = f"mlpo-split-seed{seed}", f"magrpo-debate-split-seed{seed}"
    pieces = {
        **agent_run(leader, [*LEADER, "--seed", str(seed)], ADAPTERS),
        **{f"llm-{team}": {**llm_run(team, [*DEBATE, "--seed", str(seed)], agents=3)}},
    }
    pieces[f"llm-{team}"]["needs"] = ADAPTERS
    adapter = f"results/agents/{leader}"
    lead = [*SPLIT_TASK, "--agents", "3", "--rounds", "0", "--whole-solutions", "--models", TEAM]
    pieces[f"table-{name}-leader"] = {
        **table(f"{name}-leader", [*lead, *test, "--protocols", f"leader=default+{adapter}"]),
        "needs": [adapter, *ADAPTERS],
    }
    debated = ",".join(f"default+results/agents/{team}/agent{i}" for i in range(3))
    flags = [*SPLIT_TASK, *SPLIT_GAME, "--models", debated, *test, "--protocols", "debate"]
    pieces[f"table-{name}-magrpo-debate"] = {
        **table(f"{name}-magrpo-debate", flags),
        "needs": [f"results/agents/{team}/agent{i}" for i in range(3)],
    }
    return pieces


def checked_pieces(seed):
    """Checked stop on the seed's 300 test questions (experiments/checked_steps.py): seed 0 reads
    debate's games, with the signal's counts; the other seeds play the rule as a game of its own.
    Then the text policy's own games, answered also by the checked vote."""
    name = f"{PREFIX}-seed{seed}"
    flags = [*SPLIT_TASK, *SPLIT_GAME, "--models", TEAM, "--split", "test", "--n", "300"]
    flags += ["--seed", str(seed)]
    policy = f"results/policies/{name}-sft-text.safetensors"
    return {
        **checked_piece(name, flags, ADAPTERS, "live" if seed else "debate"),
        **checked_piece(name, flags, [policy, *ADAPTERS], "sft-text"),
    }


def checked_piece(name, eval_flags, needs, how):
    """experiments/checked_steps.py on the seed `name` (its tables' name): `how` is "debate"
    (debate's games read), "live" (checked stop played as a game of its own) or a policy's name
    (its own games, answered also by the checked vote)."""
    rule = how in ("debate", "live")
    key = name if rule else f"{name}-{how}"
    out = f"results/study/checked-steps/{key}.json"
    command = [PY, "-m", "experiments.checked_steps"]
    command += {"debate": [], "live": ["--live"]}.get(how, ["--policy", how])
    command += [
        "--tables",
        f"results/tables/{name}",
        "--games",
        f"runs/study/checked/{how}-{name}.json",
    ]
    command += ["--out", out, "--", *eval_flags, "--dtype", "float32"]
    return {f"checked-{key}": {"command": command, "outputs": [out], "needs": needs}}


def arith_text_pieces(seed):
    """Where every agent sees the whole question (arith, the varied team of worked agents): the SFT
    policy of feature set `text` and checked stop, each on the seed's 300 test questions, beside
    that team's committed table of the rules and the other policies."""
    team, name = "varied", f"arith300-team-varied-seed{seed}"
    prefix = run_prefix("arith", seed, team)
    policy = f"results/policies/{prefix}-sft-text.safetensors"
    base = [*TABLE_TASKS["arith"], *TABLE_GAME, *team_flags(team)]
    test = ["--split", "test", "--n", "300", "--seed", str(seed)]
    needs = team_adapters(team)
    train = trained(
        f"{prefix}-sft-text", "sft.py", [*base, "--seed", str(seed), *TEXT_SFT["sft-text"]], policy
    )
    return {
        f"train-{prefix}-sft-text": {**train, "needs": needs},
        f"table-{name}-sft-text": {
            **table(f"{name}-sft-text", [*base, *test, "--protocols", f"mpdf={policy}"]),
            "needs": [policy, *needs],
        },
        **checked_piece(name, [*base, *test], needs, "live"),
    }


def view_at_its_commit(pieces):
    """The view study's pieces marked with the commit that holds its code (experiments/run.py runs
    such a piece only from a worktree there)."""
    view = tuple(f"-{algo}" for algo in (*VIEW_SFT, *VIEW_FLAGS))
    return {
        name: {**piece, "code_at": VIEW_CODE_AT} if name.endswith(view) else piece
        for name, piece in pieces.items()
    }


SPLIT_PIECES = {
    # the agents: worked solutions of the first answer (ranks 8 and 4), then REFINE over whole
    # solutions (rank 8 twice, rank 4)
    **agent_run("split-worked-L1-r8-seed0", [*SPLIT_SFT, "--lora-rank", "8", "--seed", "0"]),
    **agent_run("split-worked-L1-r4-seed0", [*SPLIT_SFT, "--lora-rank", "4", "--seed", "0"]),
    **refine_run(8, 0),
    **refine_run(8, 1),
    **refine_run(4, 0),
    # the team's revision skill and table, seed by seed, then its trained leader and debaters
    **view_at_its_commit(merged(seed_pieces(seed) for seed in TABLE_SEEDS)),
    **merged(trained_pieces(seed) for seed in TABLE_SEEDS),
    # checked stop, the rule that reads whether the written steps check, on split and on arith
    **merged(checked_pieces(seed) for seed in TABLE_SEEDS),
    **merged(arith_text_pieces(seed) for seed in TABLE_SEEDS),
}
