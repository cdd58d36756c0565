"""Mutation testing, one module of the method or of its plumbing at a time.

mutmut makes many small edits of a module's code (a mutant each: `<` for `<=`, `i` for `i + 1`, a
dropped argument), and runs the tests that reach the edited function against each one. A mutant the
tests still pass has *survived*: the code could mean something else and nothing would notice. Each
survivor gets a test that kills it, or is marked equivalent here (EQUIVALENT, with the reason: the
edit cannot change any result). A development tool, run outside `make test` and outside
requirements.txt:

    pip install mutmut==3.3.1
    python -m experiments.mutation deliberate  # -> results/mutation/deliberate.json
    python -m experiments.mutation --list      # the modules and the tests that cover each

Each run works in a fresh scratch copy of the repository, runs/mutation/<module>/ (`mutmut browse`
there shows every mutant), with one test process at a time (--max-children) next to other work.
mutmut 3 mutates the code inside functions and methods, never a decorated one (its trampolines
cannot wrap them) nor module-level constants: the JSON lists the functions left out.
"""

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from difflib import unified_diff
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VERSION = "3.3.1"
# module -> its file, the tests that cover it, and the tests left out (pytest -k words): those that
# load a model or run the scripts as subprocesses (minutes per mutant on two cores)
MODULES = {
    # the optimizer math and the LLM's learning step (policy_step over the library's micro-batches)
    "softrank": (
        "softrank.py",
        [
            "tests/test_softrank.py",
            "tests/test_llm_losses.py",
            "tests/test_llm_training.py",
            "tests/test_llm_training_plumbing.py",
        ],
        [],
    ),
    # the statistics of every reported number (eval.py's and the reports')
    "stats": (
        "stats.py",
        ["tests/test_eval_stats.py", "tests/test_experiments.py"],
        # eval.py's run in a subprocess imports the mutated module outside mutmut's runner
        ["runner_pieces", "every_piece", "eval_reference_in_table"],
    ),
    # the game: in-process tests only; tests/test_train.py runs the scripts as subprocesses, a model
    # load and a training run for each mutant its tests reach
    "deliberate": (
        "deliberate.py",
        [
            "tests/test_meaning.py",
            "tests/test_game.py",
            "tests/test_protocols.py",
            "tests/test_corpus.py",
            "tests/test_safe_loading.py",
            # the game's flags as the scripts check them, and the corpus's settings
            "tests/test_bad_input.py",
            "tests/test_common.py",
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
        ["tests/test_data.py", "tests/test_meaning.py", "tests/test_answers.py"],
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
        ],
        [
            "a_script_refuses",
            "every_flag_has",
            "corpus_is_reused",
            "without_validation",
            "refusal_is_one_line",
        ],
    ),
    # the teams of adapters: make_engine over the tiny model (the scripts' runs left out)
    "llm.team": (
        "llm/team.py",
        [
            "tests/test_common.py",
            "tests/test_protocols.py",
            "tests/test_lora.py",
            "tests/test_peft.py",
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
            "tests/test_llm_losses.py",
            "tests/test_train_mlpo.py",
        ],
        ["runs_"],
    ),
    # the LLM-weight trainers' data and peer pool, pinned in process (their runs left out as above)
    "train_solver": (
        "train_solver.py",
        ["tests/test_train_solver.py"],
        ["default_backbone", "sigkill", "lowers_the_loss"],
    ),
    "train_mlpo": ("train_mlpo.py", ["tests/test_train_mlpo.py"], ["runs_"]),
    # MAGRPO's rollouts and rewards against a scripted sampler (its loop: the subprocess runs)
    "train_magrpo": ("train_magrpo.py", ["tests/test_magrpo_rollouts.py"], []),
    # the lab's measurement of the revision skill (its main(): the pieces)
    "experiments.revision_skill": (
        "experiments/revision_skill.py",
        ["tests/test_revision_skill.py"],
        [],
    ),
    # the writers in subprocesses (two at once, one killed, torchrun, the benchmark) run the
    # original module, not the mutant: left out, as above
    "llm.cache": (
        "llm/cache.py",
        ["tests/test_cache.py", "tests/test_engine.py"],
        ["two_writers", "killed", "torchrun", "cache_bench"],
    ),
    "llm.sampling": ("llm/sampling.py", ["tests/test_engine.py"], []),
    "llm.prefill": ("llm/prefill.py", ["tests/test_engine.py"], []),
    "llm.logprobs": (
        "llm/logprobs.py",
        ["tests/test_logprobs.py", "tests/test_llm_training.py", "tests/test_llm_losses.py"],
        [],
    ),
    # the scripts run as subprocesses (eval.py, sft.py, train_rl.py) left out as above, and the
    # default backbone's checks of every committed adapter (minutes per mutant)
    "llm.lora": (
        "llm/lora.py",
        ["tests/test_lora.py", "tests/test_peft.py"],
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
            "tests/test_softrank.py",
            "tests/test_llm_losses.py",
            "tests/test_corpus.py",
            "tests/test_game.py",
            "tests/test_meaning.py",
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
    "sft": ("sft.py", ["tests/test_meaning.py", "tests/test_game.py"], ["tiny_model"]),
    "data": (
        "data/__init__.py",
        ["tests/test_data.py", "tests/test_common.py"],
        ["a_script_refuses", "every_flag_has"],
    ),
    "llm.kvcache": ("llm/kvcache.py", ["tests/test_engine.py"], []),
    # the static decode step, on CPU without capture (the CUDA graphs themselves: experiments/
    # cuda_scale.py on a GPU)
    "llm.graphs": ("llm/graphs.py", ["tests/test_graphs.py"], []),
    # the adapters' cache keys are pinned in tests/test_lora.py
    "llm.engine": (
        "llm/engine.py",
        ["tests/test_engine.py", "tests/test_lora.py"],
        ["eval_models_refuses", "sft_and_train_rl_train", "every_committed_adapter"],
    ),
    # the checks in fresh processes run the original module, as above; run it with MPDF_CACHE set
    # to a scratch copy of the converted backbone, so that no mutant writes the real one
    "llm.backbone": (
        "llm/backbone.py",
        ["tests/test_backbone.py"],
        ["in_a_fresh_process", "is_the_gguf_model"],
    ),
}
# the functions of a stage script that the in-process tests call: a module's run mutates only these
# unless --only names others (a script's loop and checks run as a subprocess, on the original code)
STAGE_FUNCTIONS = {
    "train_rl": (
        "scored_states",
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
    "train_solver": ("worked_solutions", "refine_examples"),
    "train_mlpo": ("peer_solutions", "peer_pool", "balanced", "check"),
    "train_magrpo": ("revision_reward", "joint_rollouts", "vote_rollouts", "check"),
    "experiments.revision_skill": ("state_class", "concede_pick", "first_decisions", "skill_table"),
}
# `mutmut run` under pytest 9: mutmut 3.3.1 records each test by `item._nodeid`, which pytest 9 no
# longer has (its public name is `nodeid`)
SHIM = """import sys
from _pytest.nodes import Node
if not hasattr(Node, "_nodeid"):
    Node._nodeid = property(lambda self: self.nodeid)
from mutmut.__main__ import cli
cli(sys.argv[1:])
"""
# mutants reviewed as equivalent: module -> {mutant name: why no test can tell it from the code}
ON_CPU = (
    "the tests run on the CPU, where every tensor is: a device of None, none or the default 'cpu' "
    "is the run's device there (the trainers' CUDA runs cover the others)"
)
AXIS = "the tensor is (batch, K) or (batch, features) wherever it is built: axis 1 is axis -1"
NEED_WEIGHTS = "need_weights only decides whether attention weights come back; forward drops them"
MASKED = (
    "the value at a masked action only meets pi = 0, A = 0 or log pi = 0 in a product, is left out "
    "of the masked means, or is overwritten with -inf: it never reaches a result"
)
FLAT = (
    "a group whose existing rewards are all equal gets A = 0 there from the formula itself (equal "
    "ranks or zero deviation over eps); with the padding counted a group is flat only if its "
    "existing rewards are, and ~m zeroes the padding: the guard's mask changes nothing"
)
NON_PERSISTENT = (
    "register_buffer tests `persistent` for truth: None keeps the buffer out of the state dict as "
    "False does"
)
COUNT = (
    "a count of a bool tensor stays int64; counts and half-counts are exact in any float dtype and "
    "the next division by a float tensor promotes to the rewards' dtype"
)
BT = (
    "(B, T) or (B,) by contract (token-level losses): axis 1 is axis -1, unsqueeze(1) unsqueeze(-1)"
)
SAME_TEXT = (
    'mutmut\'s upper- or lower-case copy of a string literal with no letter to change (r"[0-9]", '
    'r"\\1/\\2", "", ...): the mutant\'s code is the original\'s'
)
ONLY_MC = 'after this line `kind` is only compared with "mc": any other value reads numbers'
FALSY = '"" and None are both falsy: no match leaves `last` falsy and the result None either way'
NONZERO_NUM = "num is never 0 here (0 has denominator 1 and returned above): < 0, <= 0, < 1 agree"
NONEMPTY_MATCH = (
    'a match is never empty, so find("\\n", start) from start >= 1 returns -1 or >= 1, never 0'
)
BLANKS = (
    'blanks in a token only stand around "/" and Fraction() ignores blanks around a number: '
    "removing them or not gives the same value"
)
VERDICT_AXIS = "the critic's scores are (prompts, 2 verdicts): dim +1 is dim -1"
UNREAD_COST = (
    "a cost is read only for an agent that REFINEs (times a == REFINE), or with refine_all, after "
    "every agent's REFINE sample has overwritten it: the initial value never reaches a reward"
)
EQUIVALENT = {
    "softrank": {
        **{
            f"softrank.x_{name}": MASKED
            for name in (
                "_log_softmax__mutmut_19",
                "optimal_policy__mutmut_14",
                "rank_matching_loss__mutmut_24",
            )
        },
        **{
            f"softrank.x_{name}": FLAT
            for name in (
                "grpo_advantages__mutmut_27",
                "grpo_advantages__mutmut_29",
                "mean_baseline_advantages__mutmut_20",
                "mean_baseline_advantages__mutmut_22",
                "rloo_advantages__mutmut_44",
                "rloo_advantages__mutmut_46",
                "softrank_advantages__mutmut_40",
                "softrank_advantages__mutmut_42",
            )
        },
        **{
            f"softrank.x_{name}": COUNT
            for name in (
                "rloo_advantages__mutmut_7",
                "_average_ranks__mutmut_14",
                "_average_ranks__mutmut_21",
                "_average_ranks__mutmut_32",
            )
        },
        **{
            f"softrank.x_{name}": BT
            for name in (
                "aggregate__mutmut_28",
                "pg_normalizer__mutmut_2",
                "policy_gradient_loss__mutmut_13",
            )
        },
        "softrank.x_unweighted_softrank_loss__mutmut_7": "weighted=None is falsy, as False is",
        "softrank.x_policy_step__mutmut_37": ON_CPU,
        "softrank.x_policy_step__mutmut_35": (
            "an empty chunk's loss is multiplied by 0 (it runs for the all-reduce alone): a (2,) "
            "advantage broadcasts against the filler's (1, T) log-probs to the same zero loss and "
            "zero gradient"
        ),
        "softrank.x_policy_loss__mutmut_28": (
            "a model without LoRA ignores the selection, and outside a selecting block a LoRA "
            "model already runs its base (each block restores the selection on exit): the KL "
            "reference is the base either way where policy_step calls it"
        ),
    },
    "answers": {
        **{
            f"data.answers.x_{name}": SAME_TEXT
            for name in (
                "_delatex__mutmut_33",
                "_delatex__mutmut_34",
                "_delatex__mutmut_41",
                "_delatex__mutmut_42",
                "_letter_in__mutmut_8",
                "_letter_in__mutmut_9",
                "_math_key__mutmut_9",
                "_math_key__mutmut_12",
                "_math_key__mutmut_22",
                "_math_key__mutmut_33",
                "_math_key__mutmut_34",
                "_parse__mutmut_65",
                "_parse__mutmut_66",
                "last_boxed__mutmut_12",
                "last_boxed__mutmut_13",
            )
        },
        **{
            f"data.answers.x_{name}": ONLY_MC
            for name in (
                "extract_answer__mutmut_27",
                "extract_answer__mutmut_28",
                "extract_answer__mutmut_29",
            )
        },
        "data.answers.x_extract_answer__mutmut_57": FALSY,
        "data.answers.x_extract_answer__mutmut_68": FALSY,
        "data.answers.x__canon__mutmut_54": NONZERO_NUM,
        "data.answers.x__canon__mutmut_55": NONZERO_NUM,
        "data.answers.x__values_after__mutmut_25": NONEMPTY_MATCH,
        "data.answers.x__values_after__mutmut_26": NONEMPTY_MATCH,
        "data.answers.x__token_value__mutmut_19": BLANKS,
        "data.answers.x__token_value__mutmut_21": BLANKS,
        "data.answers.x__as_text__mutmut_12": "lower() comes first: no 'X' is left to strip",
        "data.answers.x__parse__mutmut_1": "every caller passes `units`: the default is never used",
        "data.answers.x_normalize_number__mutmut_5": "units=True is _parse's default",
    },
    "common": {
        "common.x_load_module__mutmut_10": "strict=None is falsy, as False is",
        **{
            f"common.x_save_tensors__mutmut_{n}": (
                "the settings JSON's indentation only: json.loads reads the same settings"
            )
            for n in (17, 19, 20)
        },
        **{
            f"common.x_batch_schedule__mutmut_{n}": (
                "call_seed is 15 hex digits, below 2**60: any modulus above that leaves it as it is"
            )
            for n in (20, 21)
        },
        **{
            f"common.x_set_rng_states__mutmut_{n}": (
                "numpy's set_state converts the key to uint32 itself, and the key's values (from "
                "a uint32 array) fit: the dtype asked for changes nothing"
            )
            for n in (9, 11)
        },
        **{
            f"common.x_load_file__mutmut_{n}": (
                "warnings.filterwarnings matches its message case-insensitively"
            )
            for n in (8, 9)
        },
        "common.x_load_file__mutmut_27": "mutmut wrote this mutant's code as the original's",
        "common.x_load_checkpoint__mutmut_41": (
            "a setting in `changed` differs from the checkpoint's (!=): >= and > agree on it"
        ),
    },
    "train_rl": {
        **{f"train_rl.x_best_action_kinds__mutmut_{n}": AXIS for n in (9, 11, 19, 24)},
        **{f"train_rl.x_corpus_statistics__mutmut_{n}": AXIS for n in (32, 40)},
        **{f"train_rl.x_rl_loss__mutmut_{n}": AXIS for n in (36, 38, 46, 63, 65, 71)},
    },
    "llm.backbone": {
        "llm.backbone.x_cpuinfo__mutmut_10": (
            'next()\'s default for a missing field: "XXXX".partition(":")[2] is "" as well'
        ),
        "llm.backbone.x_load_gguf__mutmut_28": "strict=None is falsy like strict=False",
        "llm.backbone.x_load_model__mutmut_47": "torch.qint8 is quantize_dynamic's default dtype",
        **{
            f"llm.backbone.x_probe_matmuls__mutmut_{n}": (
                "another constant in a timed operand: the products are thrown away, and a "
                "matmul's time does not depend on normal values"
            )
            for n in (60, 65)
        },
        "llm.backbone.x_probe_matmuls__mutmut_78": 'float("INF") is float("inf")',
        **{
            f"llm.backbone.x_resolve_dtype__mutmut_{n}": (
                'the device is read only by str(device).startswith("cuda"): another spelling '
                "of the CPU's default is still not a GPU"
            )
            for n in (1, 2)
        },
    },
    "llm.team": {
        **{
            f"llm.team.x_make_engine__mutmut_{n}": (
                '`models` is only tested for truth (`if cfg.models`): "" and None both end the '
                "recursion into one base's engine"
            )
            for n in (13,)
        },
        "llm.team.x_check_engine__mutmut_29": (
            '`models` is only tested for truth: "" and None (a config without --models) alike'
        ),
        "llm.team.x_make_engine__mutmut_20": (
            "the recursion builds one base's Engine, which reads no agent count (only a Team does)"
        ),
    },
    "llm.cache": {
        **{
            f"llm.cache.xǁGenerationCacheǁ{method}__mutmut_{n}": (
                "SQL's keywords, table and column names and pragma values are case-insensitive"
            )
            for method, numbers in (
                ("__init__", (19, 20, 23, 24, 26, 27, 30, 31, 35, 36)),
                ("_import_jsonl", (5, 6, 38, 39, 46, 47)),
                ("get_many", (19, 20)),
                ("save", (6, 7)),
            )
            for n in numbers
        },
        "llm.cache.xǁGenerationCacheǁ__init____mutmut_15": (
            "every statement that writes runs inside _transaction's own BEGIN IMMEDIATE ... "
            "COMMIT, and sqlite3's legacy mode opens no transaction of its own inside one: "
            "autocommit or not, the same statements reach the database"
        ),
        "llm.cache.xǁGenerationCacheǁget_many__mutmut_12": (
            "any chunk size below SQLite's limit of variables per statement returns the same rows "
            "(the count of queries per 500 keys is tested)"
        ),
        "llm.cache.xǁGenerationCacheǁput__mutmut_6": (
            "> or >= SAVE_EVERY_S on a monotonic clock's float: the two differ at one instant"
        ),
        "llm.cache.x_switch_to_wal__mutmut_14": (
            "> or >= the deadline on a monotonic clock's float: the two differ at one instant"
        ),
        **{
            f"llm.cache.xǁGenerationCacheǁ_import_jsonl__mutmut_{n}": (
                "codec names are case-insensitive, and Python's default encoding where the tests "
                "run is UTF-8: the encoding named explicitly is for other locales"
            )
            for n in (28, 30, 32)
        },
    },
    "llm.engine": {
        **{
            f"llm.engine.xǁEngineǁcontinuation_logprobs__mutmut_{n}": (
                "the tag only keeps these keys apart from generate's, which have another number "
                "of parts (model, prompt, params, seed): any tag, or none, keeps them apart"
            )
            for n in (11, 15, 18, 19)
        },
        "llm.engine.xǁEngineǁcontinuation_logprobs__mutmut_70": (
            "the log-probs row is (positions, vocabulary): gather over axis 1 is over axis -1"
        ),
    },
    "train_mlpo": {
        **{
            f"train_mlpo.x_check__mutmut_{n}": (
                "train_mlpo.py has no --rounds (the leader decides once): check_game's round "
                "minimum is never read"
            )
            for n in (4, 7, 9)
        },
        "train_mlpo.x_check__mutmut_11": (
            "train_mlpo.py has no --models (its team is --peers, checked by check_models): "
            "check_engine reads the agent count only to check --models against it"
        ),
        **{
            f"train_mlpo.x_peer_solutions__mutmut_{n}": (
                "the gathered items are (question index, solutions) with every index once: "
                "tuples sort by the index whatever the key, and never compare the solutions"
            )
            for n in (48, 50)
        },
    },
    "train_magrpo": {
        **{
            f"train_magrpo.x_vote_rollouts__mutmut_{n}": (
                'joint_rollouts reads --reward only as == "revision" (check refuses any other '
                "value): every other value, None included, is the vote's reward"
            )
            for n in (10, 13, 14)
        },
        "train_magrpo.x_check__mutmut_11": (
            "train_magrpo.py has no --models: check_engine reads the agent count only to check "
            "--models against it"
        ),
    },
    "experiments.revision_skill": {
        "experiments.revision_skill.x_state_class__mutmut_2": (
            "peers_of(None, n) is every agent, the own one included; its correctness joins the "
            "peers' only where it cannot change the class: all() when it is right, any() when wrong"
        )
    },
    "llm.training": {
        "llm.training.x_resumed__mutmut_42": (
            "transformers' activation_checkpointing_enable defaults to these very kwargs "
            "(use_reentrant False); they are named so that a frozen base's adapters keep their "
            "gradients whatever that default becomes"
        ),
        "llm.training.x_trained_team__mutmut_7": (
            "Engine's default dtype is float32: named because the trained weights are fp32 "
            "master weights whatever that default becomes"
        ),
        **{f"llm.training.x_trained_team__mutmut_{n}": ON_CPU for n in (8, 65)},
    },
    "llm.logprobs": {
        **{
            f"llm.logprobs.x_completion_batch__mutmut_{n}": (
                "torch.full infers torch.long from the int pad id: the dtype asked for is the one "
                "it gives"
            )
            for n in (9, 12)
        },
        "llm.logprobs.x_token_logprobs__mutmut_11": (
            "the attention mask is (batch, width): its cumsum over axis 1 is the one over axis -1"
        ),
    },
    "llm.lora": {
        **{
            f"llm.lora.x_add_lora__mutmut_{n}": (
                "no nn.Linear is named with .lora_ (a LoRALinear's adapters are ParameterLists, "
                "its one Linear is .base): the condition never decides"
            )
            for n in (14, 15)
        },
        **{
            f"llm.lora.xǁLoRALinearǁforward__mutmut_{n}": (
                "both branches compute y + low B^T; the condition only picks the in-place addmm_ "
                "(no autograd, contiguous y) for speed"
            )
            for n in (22, 23)
        },
        "llm.lora.xǁLoRALinearǁadd_adapter__mutmut_25": ON_CPU,
        "llm.lora.x_load_adapter__mutmut_48": (
            "a rank equal to the model's never reaches the comparison: the first test of the "
            "condition (state[key] != lora[key]) is already false"
        ),
    },
    "deliberate": {
        "deliberate.x_sample_actions__mutmut_3": AXIS,
        "deliberate.x_sample_actions__mutmut_8": AXIS,
        "deliberate.x_sample_actions__mutmut_11": AXIS,
        "deliberate.xǁPolicyNetǁforward__mutmut_23": AXIS,
        "deliberate.xǁPolicyNetǁforward__mutmut_40": AXIS,
        "deliberate.xǁPolicyNetǁforward__mutmut_9": NEED_WEIGHTS,
        "deliberate.xǁPolicyNetǁforward__mutmut_13": NEED_WEIGHTS,
        "deliberate.xǁPolicyNetǁforward__mutmut_14": NEED_WEIGHTS,
        "deliberate.xǁFixedPolicyǁact__mutmut_1": "FixedPolicy.act never reads `greedy`",
        "deliberate.x_run_critic__mutmut_21": VERDICT_AXIS,
        "deliberate.x_solve_prompt__mutmut_8": (
            "answer_request tests `trailer` for truth: None is False"
        ),
        "deliberate.xǁMetaPolicyǁ__init____mutmut_35": NON_PERSISTENT,
        "deliberate.xǁMetaPolicyǁ__init____mutmut_48": NON_PERSISTENT,
        "deliberate.x_play__mutmut_111": (
            "an agent's REFINE cost is read only where it REFINEs (the shaped reward multiplies "
            "it by a == REFINE) or beside its REFINE sample (counterfactual_rewards, under "
            "refine_all, which draws every agent's sample and sets every cost): the initial "
            "value is never read"
        ),
    },
}


def scratch_copy(module, path, tests, deselect):
    """runs/mutation/<module>/: the repository's files (tracked and new, not ignored) and a
    setup.cfg that tells mutmut what to mutate and which tests to run."""
    work = ROOT / "runs" / "mutation" / module
    if work.exists():
        shutil.rmtree(work)
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    write_setup(work, path, tests, deselect)
    return work


def write_setup(work, path, tests, deselect):
    """`work`/setup.cfg: what mutmut mutates, the tests it runs and what it copies beside them."""
    # mutmut copies these next to the mutated module: every top-level file and folder, the folders
    # that hold the module entry by entry (never the module itself: it would overwrite the mutants)
    siblings, folder = [], work
    for part in Path(path).parts:
        siblings += [str(p.relative_to(work)) for p in sorted(folder.iterdir()) if p.name != part]
        folder = folder / part
    addopts = "-p no:cacheprovider" + (f' -k "not ({" or ".join(deselect)})"' if deselect else "")
    lines = ["[mutmut]", f"paths_to_mutate = {path}", "tests_dir ="]
    lines += [f"    {t}" for t in tests] + ["also_copy ="] + [f"    {s}" for s in siblings]
    lines += ["", "[tool:pytest]", f"addopts = {addopts}", ""]
    (work / "setup.cfg").write_text("\n".join(lines))


def decorated_functions(path):
    """The functions and methods mutmut 3 leaves alone: those with a decorator."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found += [
                f"{node.name}.{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef) and f.decorator_list
            ]
    found += [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.decorator_list]
    return found


def read_results(work, path):
    """{mutant: (status, diff)} from mutmut's record of the run, in the scratch copy."""
    import libcst
    import mutmut
    import mutmut.__main__ as cli

    os.chdir(work)
    mutmut.config = cli.load_config()
    codes = json.loads((work / "mutants" / f"{path}.meta").read_text())["exit_code_by_key"]
    # parsed once: mutmut's get_diff_for_mutant parses the whole mutated file (every mutant of the
    # module, 1.9 MB for deliberate.py) on each call, minutes per diff on two busy cores
    module = cli.read_mutants_module(path)
    results = {}
    for name, code in sorted(codes.items()):
        status = cli.status_by_exit_code.get(code, f"exit {code}")
        diff = ""
        if status != "killed":
            original, mutant = (
                libcst.Module([read(module, name)]).code.strip().split("\n")
                for read in (cli.read_original_function, cli.read_mutant_function)
            )
            diff = "\n".join(unified_diff(original, mutant, path, path, lineterm=""))
        results[name] = (status, diff)
    os.chdir(ROOT)
    return results


def rerun_with_current_tests(work, path, tests, deselect):
    """Runs the survivors and the timeouts of the finished run in `work` again against the
    repository's current tests (copied in, the module's test files as MODULES lists them now),
    keeping every other mutant's result (a timeout on a loaded machine is no detection; a mutant
    that --only left out stays unchecked): tests added for the survivors can only kill more, as
    long as the module is
    unchanged and no test was taken away (the module and the test files' presence are checked).
    Which tests reach which function is recorded anew (a test changed to reach a survivor's
    function counts). mutmut rewrites its record for a run of named mutants, so the earlier
    results are put back around the new ones."""
    import mutmut.__main__ as cli

    meta = work / "mutants" / f"{path}.meta"
    if not meta.is_file():
        sys.exit(f"--rerun-survivors: no finished mutmut run in {work}")
    if (work / path).read_bytes() != (ROOT / path).read_bytes():
        sys.exit(f"--rerun-survivors: {path} changed since the run in {work}: run it whole")
    for old in (work / "tests").glob("*.py"):
        if not (ROOT / "tests" / old.name).is_file():
            sys.exit(f"--rerun-survivors: tests/{old.name} is gone since the run: run it whole")
    before = json.loads(meta.read_text())["exit_code_by_key"]
    again = [
        name
        for name, code in before.items()
        if cli.status_by_exit_code.get(code) not in ("killed", "not checked")
    ]
    if not again:
        # `mutmut run` without names would run every mutant
        sys.exit(f"--rerun-survivors: the run in {work} left no survivor nor timeout")
    for folder in (work / "tests", work / "mutants" / "tests"):
        shutil.copytree(ROOT / "tests", folder, dirs_exist_ok=True)
    write_setup(work, path, tests, deselect)
    (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    with open(work.parent / f"{work.name}-rerun.log", "w") as f:
        subprocess.run(
            [sys.executable, "-c", SHIM, "run", "--max-children", "1", *again],
            cwd=work, stdout=f, stderr=subprocess.STDOUT, env=env, check=True,
        )  # fmt: skip
    after = json.loads(meta.read_text())
    after["exit_code_by_key"] = before | {name: after["exit_code_by_key"][name] for name in again}
    meta.write_text(json.dumps(after))
    # what was rerun, for the summary (also of a later --summarize-only); a whole run starts over
    (work / "rerun.json").write_text(json.dumps(again))
    return again


def run(module, max_children, out, summarize_only=False, only=(), rerun_survivors=False):
    # imported here, not above: pieces.py reads MODULES without loading torch
    from common import machine

    try:
        import mutmut
    except ImportError:
        sys.exit(f"mutation testing needs mutmut: pip install mutmut=={VERSION}")
    if mutmut.__version__ != VERSION:
        print(f"note: mutmut {mutmut.__version__}, this script was written for {VERSION}")
    path, tests, deselect = MODULES[module]
    began = time.time()
    work = ROOT / "runs" / "mutation" / module
    if summarize_only:
        if not (work / "mutants" / f"{path}.meta").is_file():
            sys.exit(f"--summarize-only: no finished mutmut run in {work}")
    elif rerun_survivors:
        rerun_with_current_tests(work, path, tests, deselect)
    else:
        work = scratch_copy(module, path, tests, deselect)
        log = work.parent / f"{module}.log"
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        with open(log, "w") as f:
            proc = subprocess.run(
                [sys.executable, "-c", SHIM, "run", "--max-children", str(max_children), *only],
                cwd=work, stdout=f, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        if proc.returncode != 0:
            sys.exit(f"mutmut failed (exit {proc.returncode}): see {log}")
    results = read_results(work, path)
    if only:
        # the mutants of the functions named: the others were not run
        results = {n: r for n, r in results.items() if r[0] != "not checked"}
    equivalent = EQUIVALENT.get(module, {})
    statuses = Counter(status for status, _ in results.values())
    survivors = [
        {"mutant": n, "diff": d}
        for n, (s, d) in results.items()
        if s != "killed" and s != "timeout" and n not in equivalent
    ]
    reviewed = [
        {"mutant": n, "reason": equivalent[n], "status": results[n][0], "diff": results[n][1]}
        for n in equivalent
        if n in results
    ]
    # a mutant reviewed as equivalent counts on neither side, whatever its status (a timeout of
    # one on a loaded machine is no detection)
    detected = sum(
        status in ("killed", "timeout") and name not in equivalent
        for name, (status, _) in results.items()
    )
    considered = len(results) - len(reviewed)
    summary = {
        "module": module,
        "path": path,
        "tool": f"mutmut {mutmut.__version__}",
        "machine": machine(),
        "tests": tests,
        "tests_left_out": deselect,
        "only": list(only),
        "mutants": len(results),
        "killed": statuses["killed"],
        "survived": len(survivors),
        "timeouts": statuses["timeout"],
        "equivalent_by_review": len(reviewed),
        "statuses": dict(statuses),
        "score": round(detected / considered, 4) if considered else None,
        "score_definition": "(killed + timeouts) / (mutants - equivalent by review); a mutant no "
        "test reaches ('no tests') counts as survived",
        "not_mutated": {"decorated": decorated_functions(ROOT / path), "module_level": "constants"},
        "survivors": survivors,
        "equivalent": reviewed,
        "rerun_with_later_tests": (
            json.loads((work / "rerun.json").read_text()) if (work / "rerun.json").is_file() else []
        ),
        "wall_s": round(time.time() - began, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M"),
    }
    out = Path(out or ROOT / "results" / "mutation" / f"{module}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    print(
        f"{module}: {len(results)} mutants, {statuses['killed']} killed, {len(survivors)} "
        f"survived, {statuses['timeout']} timeouts, {len(reviewed)} equivalent; score "
        f"{summary['score']} -> {out}"
    )


def default_only(module):
    """mutmut's names of the mutants of a stage script's functions (none: the whole module)."""
    return tuple(f"{module}.x_{name}__mutmut_*" for name in STAGE_FUNCTIONS.get(module, ()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", nargs="?", choices=MODULES)
    parser.add_argument("--list", action="store_true", help="the modules and their tests")
    parser.add_argument("--max-children", type=int, default=1, help="test processes at once")
    parser.add_argument("--out", default="", help="default: results/mutation/<module>.json")
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="write the JSON from the last mutmut run in runs/mutation/<module>/ (after new "
        "equivalents are reviewed, or a run stopped while writing it); wall_s counts this only",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=(),
        help="mutmut's names of the mutants to run (globs, e.g. 'deliberate.x_play__mutmut_*'); "
        "a stage script's default: the functions in STAGE_FUNCTIONS",
    )
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="run the survivors and timeouts of the last run in runs/mutation/<module>/ again "
        "against the current tests (the module unchanged), keeping the other mutants' results",
    )
    args = parser.parse_args()
    if args.list or not args.module:
        for name, (path, tests, deselect) in MODULES.items():
            left_out = f" (not: {', '.join(deselect)})" if deselect else ""
            print(f"{name:11s} {path:16s} {' '.join(tests)}{left_out}")
        return
    run(
        args.module,
        args.max_children,
        args.out,
        args.summarize_only,
        tuple(args.only) or default_only(args.module),
        args.rerun_survivors,
    )


if __name__ == "__main__":
    main()
