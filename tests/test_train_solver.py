"""train_solver.py (an agent's LLM weights by supervised learning on solutions): its training data
in process (worked solutions, REFINE examples), then the script as users run it (tests/launch.py,
on a tiny random model or the default backbone): the loss falls, plain python vs a 2-process
torchrun, and a run killed with SIGKILL and resumed (whole weights sharded on 2 processes, a rank
without rows at every step: tests/test_fsdp.py)."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from launch import metrics, run

import common
import data
import solutions
import train_solver
from common import Ranks, call_seed
from data.worked import WorkedSolutionMissing, worked_solution
from llm import backbone, lora
from llm.engine import Engine
from llm.team import read_adapter

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_rejection_sampling_on_the_default_backbone_keeps_only_strict_answers(tmp_path):
    """--solutions sampled keeps right solutions as the training reward reads them (one `Answer:`
    field, the last line) that ended by themselves: the untrained default backbone writes "The
    answer is 12." or runs to the budget, so of 4 samples none is kept, and the run refuses in
    one line, saying what to change (tests/method/test_reward_hacks.py: what is kept, and the
    training of those kept is the worked solutions' loop)."""
    args = [
        str(ROOT / "train_solver.py"),
        *("--solutions", "sampled", "--questions", "2", "--val-n", "2", "--samples", "2"),
        *("--max-new-tokens", "48", "--batch-size", "2", "--micro-batch", "1", "--epochs", "1"),
        *("--cache-dir", str(tmp_path / "cache"), "--out-dir", str(tmp_path / "llm")),
    ]
    proc = run(args, tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "kept 0 right solutions of 4 samples" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: only 0 training solutions for a --batch-size of 2: raise --questions (or "
        "--samples), or lower --batch-size"
    )


def test_worked_solutions_are_the_solve_prompt_and_the_solution_then_eos(tiny_model_dir):
    engine = Engine(model_path=tiny_model_dir)
    cfg = train_solver.Config(questions=3, val_n=2, seed=1)
    pairs = train_solver.worked_solutions(engine, cfg)
    questions, _ = data.training_questions(cfg)
    assert len(pairs) == 3
    for ex, (prompt, completion) in zip(questions, pairs):
        assert prompt == engine.encode(engine.chat(solutions.solve_prompt(ex)))
        assert completion[-1] == engine.tokenizer.eos_token_id
        solution = engine.tokenizer.decode(completion[:-1])
        assert solution.endswith(f"Answer: {ex.answer}") and " = " in solution


def test_worked_solutions_refuse_a_task_without_them_in_one_line(monkeypatch):
    """A task whose examples carry no worked solution: the flag named and the other way out."""

    def missing(example, agent=None):
        raise WorkedSolutionMissing("task 'mawps' carries no worked solution (arith and gsm8k do)")

    monkeypatch.setattr(train_solver, "worked_solution", missing)
    engine = SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=0), encode=len, chat=str)
    with pytest.raises(common.UsageError) as refused:
        train_solver.worked_solutions(engine, train_solver.Config(questions=1, val_n=1))
    assert str(refused.value) == (
        "--solutions worked: task 'mawps' carries no worked solution (arith and gsm8k do); "
        "use --solutions sampled"
    )


def test_refine_examples_show_sampled_peers_and_teach_the_worked_solution(tmp_path, tiny_model_dir):
    """A REFINE example per question: the refine prompt over the solutions sampled from the
    adapter the flag names (the agent's own, its peers' answers), the worked solution as target."""
    model, _ = backbone.load_model(tiny_model_dir)
    lora.add_lora(model, 2, 8.0, adapters=1)
    path = tmp_path / "contexts.pt"
    torch.save(lora.adapter_state(model, 0, "tiny"), path)
    cfg = train_solver.Config(
        questions=3,
        val_n=2,
        seed=1,
        agents=3,
        refine_contexts=str(path),
        max_new_tokens=8,
        temperature=0.9,
    )
    engine = Engine(model_path=tiny_model_dir)
    generated = []
    generate = engine.generate

    def spy(prompts, seeds, **kwargs):
        generated.append((prompts, seeds, kwargs))
        return generate(prompts, seeds, **kwargs)

    engine.generate = spy
    pairs = train_solver.refine_examples(engine, cfg, Ranks(0, 1, "cpu"))
    questions, _ = data.training_questions(cfg)
    assert len(pairs) == 3
    for ex, (prompt, target) in zip(questions, pairs):
        text = engine.tokenizer.decode(prompt)
        assert ex.question in text and "Your previous solution:" in text
        assert "Agent 2:" in text and "Agent 3:" in text and "Agent 1:" not in text
        assert target[-1] == engine.tokenizer.eos_token_id
        assert engine.tokenizer.decode(target[:-1]) == worked_solution(ex)
    # every agent's solution sampled once, under its own seed, with the adapter of the file, at
    # the flags' budget and temperature
    [(prompts, seeds, kwargs)] = generated
    assert prompts == [
        engine.chat(solutions.solve_prompt(ex)) for ex in questions for _ in range(3)
    ]
    assert seeds == [call_seed(1, ex.id, i, "refine-context") for ex in questions for i in range(3)]
    assert kwargs == {"max_new_tokens": 8, "temperature": 0.9, "adapters": [0] * 9}
    # a file that is not an adapter is refused by name, as an adapter file
    torch.save({"x": torch.zeros(1)}, tmp_path / "bad.pt")
    bad = dataclasses.replace(cfg, refine_contexts=str(tmp_path / "bad.pt"))
    with pytest.raises(common.FileRefused, match="bad.pt"):
        train_solver.refine_examples(Engine(model_path=tiny_model_dir), bad, Ranks(0, 1, "cpu"))
    (tmp_path / "text.pt").write_text("not a torch file")
    text = dataclasses.replace(cfg, refine_contexts=str(tmp_path / "text.pt"))
    with pytest.raises(common.FileRefused, match="text.pt: not a plain-data adapter file"):
        train_solver.refine_examples(Engine(model_path=tiny_model_dir), text, Ranks(0, 1, "cpu"))


def sft_args(tmp_path, model_dir, *extra):
    """train_solver.py on 8 worked arith solutions, every step the same 8."""
    return [
        str(ROOT / "train_solver.py"),
        "--model",
        model_dir,
        "--questions",
        "8",
        "--val-n",
        "2",
        "--batch-size",
        "8",
        "--micro-batch",
        "4",
        "--epochs",
        "4",
        "--lr",
        "1e-2",
        "--save-every",
        "1",
        *extra,
    ]


@pytest.mark.parametrize("torchrun", [False, True])
def test_worked_sft_lowers_the_loss_on_its_solutions(tmp_path, tiny_model_dir, torchrun):
    """Four steps on the same 8 worked solutions lower their loss; the result is an adapter on the
    layers asked for, which a team of the base model plays."""
    out = tmp_path / "sft"
    args = sft_args(
        tmp_path,
        tiny_model_dir,
        "--lora-rank",
        "2",
        "--lora-targets",
        "q_proj,v_proj",
        "--out-dir",
        str(out),
    )
    run(args, tmp_path, torchrun)
    losses = [r["loss"] for r in metrics(out) if "loss" in r]
    assert len(losses) == 4 and all(b < a for a, b in zip(losses, losses[1:]))
    assert losses[-1] < losses[0] - 0.1
    state = read_adapter(out / "adapter")
    assert state["rank"] == 2 and state["targets"]
    assert all(name.endswith(("q_proj", "v_proj")) for name in state["targets"])
    engine = Engine(model_path=tiny_model_dir)
    k = lora.load_adapter(engine.model, state)
    assert sorted(lora.lora_layers(engine.model)) == sorted(state["targets"])
    completion = engine.generate([engine.chat("Hi")], [0], max_new_tokens=4, adapters=[k])[0]
    assert completion.completion_tokens > 0


def test_worked_sft_resumes_exactly_after_sigkill(tmp_path, tiny_model_dir):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run(sft_args(tmp_path, tiny_model_dir, "--out-dir", str(whole)), tmp_path)
    killed = run(
        sft_args(tmp_path, tiny_model_dir, "--out-dir", str(resumed), "--crash-at-step", "2"),
        tmp_path,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    run(sft_args(tmp_path, tiny_model_dir, "--out-dir", str(resumed)), tmp_path)
    assert [r["step"] for r in metrics(resumed)] == [1, 2, 3, 4]
    assert [r["loss"] for r in metrics(resumed)] == [r["loss"] for r in metrics(whole)]
    a, b = (read_adapter(d / "adapter")["tensors"] for d in (whole, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("trailer", [False, True])
def test_rejection_sampling_asks_agent_0s_view_and_keeps_right_answers_that_ended(
    monkeypatch, capsys, trailer
):
    """right_solutions, scripted: cfg.samples prompts per training question (agent 0's view of a
    split question; the trailer's prompt with --trailer), each sample's own seed, the budget and
    temperature passed on; kept: right by the strict reader, ended by the EOS and, with --trailer,
    well-formatted; the count said on stderr."""
    split = data.load_task("split", split="train", n=1, agents=3, held=2, share=1.0)[0]
    arith = data.Example(question="What is 2 + 3?", answer="5", task="arith", id="t/0")
    cfg = train_solver.Config(
        solutions="sampled", samples=2, questions=2, trailer=trailer, max_new_tokens=40,
        temperature=0.7, seed=3,
    )  # fmt: skip
    asked = {}
    monkeypatch.setattr(
        train_solver, "training_questions", lambda c: ([split, arith], []) if c is cfg else None
    )
    trailed = "Steps: 2 + 3 = 5\nConfidence: 0.9\nAnswer: 5"
    texts = {
        (arith.id, 0): (trailed, "eos"),
        (arith.id, 1): ("2 + 3 = 5\nAnswer: 5", "eos"),
        (split.id, 0): (f"Answer: {split.answer}", "length"),
        (split.id, 1): ("Answer: 1", "eos"),
    }

    class Engine:
        tokenizer = SimpleNamespace(eos_token_id=0)

        def chat(self, prompt):
            return f"<{prompt}>"

        def encode(self, text):
            return [len(text), text.count("\n")]

        def generate(self, prompts, seeds, **kw):
            asked.update(prompts=prompts, seeds=seeds, **kw)
            keys = [(ex.id, k) for ex in (split, arith) for k in range(2)]
            return [SimpleNamespace(text=texts[key][0], finish=texts[key][1]) for key in keys]

    kept = train_solver.right_solutions(Engine(), cfg, Ranks(0, 1, torch.device("cpu")))
    wanted = [ex for ex in (split, arith) for _ in range(2)]
    assert asked["prompts"] == [f"<{solutions.solve_prompt(ex, trailer, 0)}>" for ex in wanted]
    assert solutions.solve_prompt(split, trailer, 0) != solutions.solve_prompt(split, trailer)
    seeds = [call_seed(3, ex.id, k, "sft-llm") for ex in (split, arith) for k in (0, 1)]
    assert asked["seeds"] == seeds
    assert (asked["max_new_tokens"], asked["temperature"]) == (40, 0.7)
    prompt = Engine().encode(f"<{solutions.solve_prompt(arith, trailer, 0)}>")
    right = [trailed] if trailer else [trailed, "2 + 3 = 5\nAnswer: 5"]
    assert kept == sorted((prompt, Engine().encode(text) + [0]) for text in right)
    kind = " well-formatted" if trailer else ""
    assert capsys.readouterr().err == f"kept {len(right)} right{kind} solutions of 4 samples\n"
