"""What experiments/mutation.py mutates: each module's file, the tests that cover it and the
tests left out, and the functions of a stage script its in-process tests reach; and the hash of the
code a run mutated, which tells a score measured on older code."""

import ast
import hashlib
import re
from pathlib import Path

# module -> its file, the tests that cover it, and the tests left out (pytest -k words): those that
# load a model or run the scripts as subprocesses (minutes per mutant on two cores)
MODULES = {
    # the optimizer math (torch alone)
    "softrank": (
        "softrank.py",
        ["tests/method/test_softrank.py", "tests/method/test_llm_losses.py"],
        [],
    ),
    # the LLM-weight trainers' optimizer step, and MAGRPO's and MLPO's update from their rollouts
    "llm_step": (
        "llm_step.py",
        [
            "tests/method/test_llm_losses.py",
            "tests/method/test_reward_hacks.py",
            "tests/test_llm_training.py",
            "tests/test_llm_training_plumbing.py",
            "tests/engine/test_lora.py",
        ],
        ["eval_models_refuses", "sft_and_train_rl_train", "every_committed_adapter", "peft_loads"],
    ),
    # the statistics of every reported number (eval.py's and the reports')
    "stats": (
        "stats.py",
        ["tests/test_eval_stats.py", "tests/lab/test_experiments.py"],
        # eval.py's run in a subprocess imports the mutated module outside mutmut's runner
        ["runner_pieces", "every_piece", "eval_reference_in_table"],
    ),
    # an agent's solution: its prompts, its parse, the vote, the game's settings and the LLM calls;
    # in-process tests only, as for the game below
    "solutions": (
        "solutions.py",
        [
            "tests/method/test_vote_and_reward.py",
            "tests/method/test_meaning.py",
            "tests/method/test_reward_hacks.py",
            "tests/test_game.py",
            "tests/test_protocols.py",
            # the game's flags as the scripts check them
            "tests/test_bad_input.py",
            "tests/test_common.py",
            # each agent's own view of a split question in its prompts
            "tests/test_split.py",
            # the LLM-weight trainers' prompts, votes and peers' calls
            "tests/test_magrpo_rollouts.py",
            "tests/test_train_mlpo.py",
        ],
        # and the scripts run as subprocesses (the original module, minutes per mutant)
        [
            "tiny_model",
            "a_script_refuses",
            "corpus_is_reused",
            "without_validation",
            "refusal_is_one_line",
            "solvers_examples",
            "mlpo_runs",
        ],
    ),
    # the rules that decide when to talk: their actions, features, fit and threshold, and their
    # games through eval.py's protocols
    "rules": ("rules.py", ["tests/test_rules.py"], []),
    # the game: in-process tests only; tests/test_train.py runs the scripts as subprocesses, a model
    # load and a training run for each mutant its tests reach
    "deliberate": (
        "deliberate.py",
        [
            "tests/method/test_meaning.py",
            "tests/method/test_vote_and_reward.py",
            "tests/test_game.py",
            "tests/test_protocols.py",
            "tests/test_corpus.py",
            "tests/test_safe_loading.py",
            # a rule deciding for its team (rules.py) in decide()
            "tests/test_rules.py",
            # the game's flags as the scripts check them, and the corpus's settings
            "tests/test_bad_input.py",
            "tests/test_common.py",
            # each agent's own view of a split question in its prompts
            "tests/test_split.py",
        ],
        # and the scripts run as subprocesses (the original module, minutes per mutant)
        [
            "tiny_model",
            "a_script_refuses",
            "corpus_is_reused",
            "without_validation",
            "refusal_is_one_line",
        ],
    ),
    "answers": (
        "data/answers.py",
        [
            "tests/test_data.py",
            "tests/method/test_meaning.py",
            "tests/test_answers.py",
            "tests/method/test_reward_hacks.py",
        ],
        [],
    ),
    # the plumbing: what tests/test_common.py pins in process (the scripts' subprocess runs, resume
    # after SIGKILL and torchrun, left out as above)
    "common": (
        "common.py",
        [
            "tests/test_common.py",
            "tests/test_safe_loading.py",
            "tests/test_cli.py",
            "tests/test_bad_input.py",
            # FSDP2's sharding in process (over a process group of one)
            "tests/test_fsdp.py",
        ],
        [
            "a_script_refuses",
            "every_flag_has",
            "corpus_is_reused",
            "without_validation",
            "refusal_is_one_line",
            # the torchrun runs
            "each_trainer",
            "solver_under",
        ],
    ),
    # the teams of adapters: make_engine over the tiny model (the scripts' runs left out)
    "llm.team": (
        "llm/team.py",
        [
            "tests/test_common.py",
            "tests/test_protocols.py",
            "tests/engine/test_lora.py",
            "tests/engine/test_peft.py",
        ],
        [
            "eval_models_refuses",
            "sft_and_train_rl_train",
            "every_committed_adapter",
            "peft_loads_a_trained",
        ],
    ),
    "llm.training": (
        "llm/training.py",
        [
            "tests/test_llm_training.py",
            "tests/test_llm_training_plumbing.py",
            "tests/method/test_llm_losses.py",
            "tests/test_train_mlpo.py",
            "tests/test_fsdp.py",
        ],
        ["runs_", "each_trainer", "solver_under"],
    ),
    # the LLM-weight trainers' data and peer pool, pinned in process (their runs left out as above)
    "train_solver": (
        "train_solver.py",
        ["tests/test_train_solver.py", "tests/method/test_reward_hacks.py", "tests/test_split.py"],
        ["default_backbone", "sigkill", "lowers_the_loss"],
    ),
    "train_mlpo": (
        "train_mlpo.py",
        ["tests/test_train_mlpo.py", "tests/method/test_reward_hacks.py"],
        ["runs_"],
    ),
    # MAGRPO's rollouts and rewards against a scripted sampler (its loop: the subprocess runs)
    "train_magrpo": (
        "train_magrpo.py",
        ["tests/test_magrpo_rollouts.py", "tests/method/test_reward_hacks.py"],
        [],
    ),
    # the lab's measurement of the revision skill (its main(): the pieces)
    "experiments.revision_skill": (
        "experiments/revision_skill.py",
        ["tests/lab/test_revision_skill.py"],
        [],
    ),
    # the weight manifest: a weight that leaves the tree must come back with its bytes (the tests
    # of this repository's own manifest read its git, which a scratch copy does not have; the
    # others build a repository of their own)
    "experiments.weights": (
        "experiments/weights.py",
        ["tests/lab/test_weights.py"],
        ["tree_keeps_no_weight", "every_weight_that_left"],
    ),
    # the writers in subprocesses (two at once, one killed, torchrun, the benchmark) run the
    # original module, not the mutant: left out, as above
    "llm.cache": (
        "llm/cache.py",
        ["tests/engine/test_cache.py", "tests/engine/test_engine.py"],
        ["two_writers", "killed", "torchrun", "cache_bench"],
    ),
    "llm.sampling": ("llm/sampling.py", ["tests/engine/test_engine.py"], []),
    "llm.prefill": ("llm/prefill.py", ["tests/engine/test_engine.py"], []),
    "llm.logprobs": (
        "llm/logprobs.py",
        [
            "tests/engine/test_logprobs.py",
            "tests/test_llm_training.py",
            "tests/method/test_llm_losses.py",
        ],
        [],
    ),
    # the scripts run as subprocesses (eval.py, sft.py, train_rl.py) left out as above, and the
    # default backbone's checks of every committed adapter (minutes per mutant)
    "llm.lora": (
        "llm/lora.py",
        ["tests/engine/test_lora.py", "tests/engine/test_peft.py"],
        [
            "eval_models_refuses",
            "sft_and_train_rl_train",
            "every_committed_adapter",
            # its adapter comes from a train_solver.py run in a subprocess
            "peft_loads_a_trained",
        ],
    ),
    # the stages' own pieces of the game (the corpus and its rewards, the oracle labels): run with
    # --only on the functions the in-process tests call (each script's loop runs as a subprocess)
    "train_rl": (
        "train_rl.py",
        [
            "tests/method/test_softrank.py",
            "tests/method/test_llm_losses.py",
            "tests/test_corpus.py",
            "tests/test_game.py",
            "tests/method/test_meaning.py",
            "tests/test_protocols.py",
            "tests/test_train.py",
        ],
        [
            "tiny_model",
            "a_script_refuses",
            "torchrun_agree",
            "change_the_policy",
            "sigkill",
            "bad_input",
        ],
    ),
    "sft": ("sft.py", ["tests/method/test_meaning.py", "tests/test_game.py"], ["tiny_model"]),
    # eval.py's protocols over the game (the fixed ones, the rules, the policies) on scripted
    # engines in process, a split question's views among them
    "eval": (
        "eval.py",
        [
            "tests/test_protocols.py",
            "tests/test_rules.py",
            "tests/test_split.py",
            # the protocols' checks: a rule's file, a policy's team and game
            "tests/test_bad_input.py",
        ],
        ["solvers_examples", "refusal_is_one_line", "corpus_is_reused", "without_validation"],
    ),
    "data": (
        "data/__init__.py",
        [
            "tests/test_data.py",
            "tests/test_common.py",
            "tests/test_split.py",
            "tests/test_llm_training_plumbing.py",
        ],
        [
            "a_script_refuses",
            "every_flag_has",
            "solvers_examples",
            "runs_",
            "each_trainer",
            "solver_under",
        ],
    ),
    # the split-information task and the per-agent views of a question (Example.render)
    "data.split": ("data/split.py", ["tests/test_split.py"], ["solvers_examples"]),
    # an expression's steps: the arith and split tasks' worked solutions and the split task's gold
    "data.steps": (
        "data/steps.py",
        ["tests/test_worked.py", "tests/test_split.py"],
        ["solvers_examples"],
    ),
    "data.example": ("data/example.py", ["tests/test_split.py", "tests/test_data.py"], []),
    "llm.kvcache": ("llm/kvcache.py", ["tests/engine/test_engine.py"], []),
    # the static decode step, on CPU without capture (the CUDA graphs themselves: experiments/
    # cuda_scale.py on a GPU)
    "llm.graphs": ("llm/graphs.py", ["tests/engine/test_graphs.py"], []),
    # the adapters' cache keys are pinned in tests/engine/test_lora.py
    "llm.engine": (
        "llm/engine.py",
        ["tests/engine/test_engine.py", "tests/engine/test_lora.py"],
        ["eval_models_refuses", "sft_and_train_rl_train", "every_committed_adapter"],
    ),
    # the checks in fresh processes run the original module, as above (every run's mutants write
    # a scratch copy of the converted backbone: mutation.mutant_env); of the families' tests, the
    # refusal of a model the engine cannot run
    "llm.backbone": (
        "llm/backbone.py",
        ["tests/engine/test_backbone.py", "tests/engine/test_families.py"],
        [
            "in_a_fresh_process",
            "is_the_gguf_model",
            "equals_hf_on_each_family",
            "reads_back_in_peft",
        ],
    ),
}
# the functions of a stage script that the in-process tests call: a module's run mutates only these
# unless --only names others (a script's loop and checks run as a subprocess, on the original code)
STAGE_FUNCTIONS = {
    "train_rl": (
        "corpus_games",
        "scored_rows",
        "scored_states",
        "study_settings",
        "best_action_kinds",
        "corpus_statistics",
        "transform_rewards",
        "action_advantages",
        "full_action_set_loss",
        "rl_loss",
        "corpus_objective",
        "policy_logits",
        "frozen_copy",
        "validate",
    ),
    "sft": ("labelled_states",),
    "eval": (
        "independent_answers",
        "vanilla",
        "alone",
        "cot",
        "sc",
        "games",
        "debate",
        "fixed",
        "policy_file",
        "rule",
        "run_protocol",
        "check_protocol",
    ),
    "train_solver": ("worked_solutions", "refine_examples", "right_solutions"),
    "train_mlpo": (
        "peer_solutions",
        "starting_adapters",
        "peer_pool",
        "balanced",
        "leader_rollouts",
        "held_out_rollouts",
        "check",
    ),
    "train_magrpo": ("revision_reward", "joint_rollouts", "vote_rollouts", "check"),
    "experiments.revision_skill": ("state_class", "concede_pick", "first_decisions", "skill_table"),
}


def mutated_source(root, path, only=()):
    """sha256 of the code a run mutated: the module's file, or for a run of named functions (`only`:
    mutmut's globs `<module>.x_<function>__mutmut_*`) those functions' source, in order; None when
    the file is gone. The report compares it with today's: a score holds for the code it was
    measured on, and an edit since leaves it stale."""
    file = Path(root) / path
    if not file.is_file():
        return None
    text = file.read_text()
    names = [re.fullmatch(r"[\w.]+\.x_(\w+?)__mutmut_\*", glob) for glob in only]
    if only and all(names):
        defs = {
            node.name: ast.get_source_segment(text, node)
            for node in ast.parse(text).body
            if isinstance(node, ast.FunctionDef)
        }
        text = "\n".join(defs.get(name[1], f"(no function {name[1]})") for name in names)
    return hashlib.sha256(text.encode()).hexdigest()
