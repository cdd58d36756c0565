"""A team of LLM agents that may differ: agent i's calls go to its model's engine, with its own LoRA
adapter (llm/lora.py). Agents that share a base model share one engine, and their calls of a round
run in one batch, each row with its agent's adapter; agents on different models run one engine
call per model (docs/design.md §10).

  Member    - an agent's engine and adapter (None: the engine's model as it is)
  Team      - generate() routes each prompt to its agent's member
  as_team   - an Engine as the team whose every agent is that engine
"""

from typing import NamedTuple


class Member(NamedTuple):
    engine: object  # llm.engine.Engine
    adapter: int | None = None


class Team:
    """The engines of a team, one Member per agent (or one Member for every agent: a homogeneous
    team). The first member's engine also serves what is not an agent's call (the critic pass,
    lengths of prompts)."""

    def __init__(self, members):
        self.members = list(members)
        self.first = self.members[0].engine

    def member(self, agent):
        return self.members[0] if len(self.members) == 1 else self.members[agent]

    def engines(self):
        """The distinct engines, in the members' order."""
        seen = {}
        for m in self.members:
            seen.setdefault(id(m.engine), m.engine)
        return list(seen.values())

    def generate(self, prompts, seeds, agents, **params):
        """One Completion per (user prompt, seed, agent): each prompt in its agent's chat format
        through its agent's engine and adapter; one engine call per engine."""
        results = [None] * len(prompts)
        for engine in self.engines():
            mine = [k for k, a in enumerate(agents) if self.member(a).engine is engine]
            if not mine:
                continue
            completions = engine.generate(
                [engine.chat(prompts[k]) for k in mine],
                [seeds[k] for k in mine],
                adapters=[self.member(agents[k]).adapter for k in mine],
                **params,
            )
            for k, c in zip(mine, completions):
                results[k] = c
        return results

    @property
    def stats(self):
        """The engines' counters, summed."""
        total = {}
        for engine in self.engines():
            for key, value in engine.stats.items():
                total[key] = total.get(key, 0) + value
        return total


def as_team(engine):
    return engine if isinstance(engine, Team) else Team([Member(engine)])
