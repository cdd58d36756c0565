"""The prompts of the deliberation game (docs/design.md §2): solve / refine / leader / critic, and
the answer trailer. deliberate.py plays the game with them (and re-exports every name here).

Short: the 135M default backbone loses accuracy on every extra instruction. Measured (48 arith
questions x 3 samples, T = 0.7, fp32): "End with 'Answer: <number>'." 13.2% correct; the Steps /
Confidence / Answer trailer with a worked example 4.9% (trailer complete in 31%). So the trailer is
opt-in (`GameConfig.trailer`); the state falls back to defaults without it (docs/design.md §2).
"""

import data

ANSWER_HINT = {
    "number": "a number",
    "mc": "the letter of the correct option",
    "math": "a LaTeX expression",
}
WORKED_EXAMPLE = (
    "Problem: Ann has 3 bags with 4 apples in each bag. She eats 2 apples. "
    "How many apples are left?\n3 * 4 = 12. 12 - 2 = 10.\nSteps: 2\nConfidence: 9/10\nAnswer: 10"
)
TRAILER = "Steps: <number of steps>\nConfidence: <0-10>/10\nAnswer: <{hint}>"


def hint(task):
    return ANSWER_HINT[data.answer_kind(task)]


def vanilla_prompt(example):
    return f"{example.render()}\nAnswer with {hint(example.task)}."


def cot_prompt(example):
    return (
        f"{example.render()}\nThink step by step, then end with 'Answer: <{hint(example.task)}>'."
    )


def answer_request(example, trailer):
    if trailer:
        return (
            "Show short steps, then end with three lines:\n"
            f"{TRAILER.format(hint=hint(example.task))}"
        )
    return f"End with 'Answer: <{hint(example.task)}>'."


def solve_prompt(example, trailer=False):
    """Round 0 of the game. With `trailer`, one worked example of the Steps / Confidence / Answer
    trailer."""
    if trailer:
        return (
            f"Solve the problem. {answer_request(example, True)}\n\nExample:\n{WORKED_EXAMPLE}\n\n"
            f"Problem: {example.render()}\n"
        )
    return f"{example.render()}\n{answer_request(example, False)}"


def refine_prompt(example, solutions, agent, trailer=False):
    """REFINE: the LLM-Debate update from the agent's own solution and its peers' current solutions.

    The peers appear through their final answers only, and the own solution through its last 300
    characters: measured on 32 arith questions (T = 0.7), one refine round took agent accuracy from
    14.6% to 9.4% this way, and to 5.2% with every solution's text in the prompt: the 135M backbone
    rambles on long prompts. (Refining hurts this backbone on average; a good meta-policy has to
    learn when not to.)"""
    others = ", ".join(
        f"Agent {j + 1}: {s.answer if s.answer is not None else 'no answer'}"
        for j, s in enumerate(solutions)
        if j != agent
    )
    return (
        f"{example.render()}\n\nYour previous solution:\n{solutions[agent].text.strip()[-300:]}\n\n"
        f"Other agents' answers: {others}.\nCheck the solutions and solve the problem again. "
        f"{answer_request(example, trailer)}"
    )


def leader_prompt(example, solutions, trailer=False):
    """MLPO's leader (docs/design.md §8) reads every peer's solution (its last 300 characters, as in
    refine_prompt) and answers."""
    shown = "\n\n".join(f"Agent {j + 1}:\n{s.text.strip()[-300:]}" for j, s in enumerate(solutions))
    return (
        f"{example.render()}\n\nSolutions from {len(solutions)} agents:\n\n{shown}\n\n"
        f"Check these solutions and solve the problem. {answer_request(example, trailer)}"
    )


def critic_prompt(example, solution):
    return (
        f"Problem: {example.render()}\n\nProposed solution:\n{solution.text.strip()}\n\n"
        "Is the proposed solution correct? Reply with one word: Correct or Incorrect."
    )


VERDICTS = ("Correct", "Incorrect")
