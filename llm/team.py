"""A team of LLM agents that may differ: agent i's calls go to its model's engine, with its own LoRA
adapter (llm/lora.py). Agents that share a base model share one engine, and their calls of a round
run in one batch, each row with its agent's adapter; agents on different models run one engine
call per model (docs/design.md §10).

  Member    - an agent's engine and adapter (None: the engine's model as it is)
  Team      - generate() routes each prompt to its agent's member
  as_team   - an Engine as the team whose every agent is that engine
From a script's engine settings (EngineConfig's fields, checked by check_engine):
  team_name                         - what a run's files call its team
  resolve_engine_dtype, make_engine - the engine (or team) of one rank
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from common import FileRefused, UsageError, check_at_least, check_choice, load_file
from llm import backbone, lora
from llm.backbone import resolve_dtype
from llm.engine import Engine


@dataclass
class EngineConfig:
    """What make_engine builds an engine from. The scripts that play the game (sft.py, train_rl.py,
    eval.py) take every one of these as a flag of the same name and pass their flags themselves;
    the LLM-weight trainers build one for the engines they sample from."""

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


def check_engine(cfg, agents, max_new_tokens):
    """The engine settings `cfg` (an EngineConfig, or a script's flags of the same names), before
    anything is loaded: a mistake is one line (UsageError)."""
    check_choice("--dtype", cfg.dtype, ("auto", *backbone.DTYPES))
    check_at_least(1, engine_batch_size=cfg.engine_batch_size)
    if cfg.models and cfg.model:
        raise UsageError("--model and --models: pass one (--models names every agent's model)")
    check_model("--model", cfg.model, max_new_tokens)
    if cfg.models:
        check_models("--models", cfg.models, agents, max_new_tokens)


def check_model(flag_name, path, max_new_tokens):
    """An HF checkpoint directory (empty: the default backbone) whose context holds the token
    budget."""
    folder = Path(path or backbone.default_model_path())
    if not (folder / "config.json").is_file():
        raise UsageError(f"{flag_name} {path!r}: not an HF checkpoint directory (no config.json)")
    if not any(
        (folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")
    ):
        raise UsageError(
            f"{flag_name} {path!r}: no tokenizer files (tokenizer.json) in the directory"
        )
    settings = json.loads((folder / "config.json").read_text())
    refused = backbone.refusal(settings, f"{flag_name} {path!r}")
    if refused:
        raise UsageError(refused)
    context = settings.get("max_position_embeddings") or settings.get("n_positions")
    if context and max_new_tokens >= context:
        raise UsageError(
            f"--max-new-tokens {max_new_tokens}: the model's context holds {context} tokens, "
            "prompt included"
        )


def check_models(flag_name, models, agents, max_new_tokens):
    """A --models list (team_entries): one entry per agent, each base a model directory, each
    adapter an existing file (whether it fits its base is checked when it loads)."""
    for base, adapter in team_entries(models, agents, flag_name):
        check_model(flag_name, base, max_new_tokens)
        if adapter and not Path(adapter).exists():
            raise UsageError(f"{flag_name}: no adapter file or folder {adapter!r}")


def read_adapter(path):
    """An adapter as lora.adapter_state's dict, read as data: a PEFT LoRA folder (what the
    LLM-weight trainers write), or a .pt file of this project's older layout (common.load_file);
    FileRefused names the path and what is wrong in one line."""
    if Path(path).is_dir():
        try:
            return lora.read_peft(path)
        except lora.AdapterMismatch as e:
            raise FileRefused(str(e)) from None
    return load_file(path, "adapter")


def team_entries(models, agents, flag_name="--models"):
    """--models "A,B,C" -> one (base model directory, adapter file) per agent: an entry is a model
    directory or `default` (the embedded backbone), + an adapter (an LLM-weight trainer's folder,
    or an older .pt file) or not."""
    entries = [entry.strip() for entry in models.split(",")]
    if len(entries) != agents:
        raise UsageError(f"{flag_name}: {len(entries)} entries for {agents} agents (one per agent)")
    team = []
    for entry in entries:
        base, _, adapter = entry.partition("+")
        team.append(("" if base == "default" else base, adapter))
    return team


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


def team_name(cfg):
    """What a run's files and header call its team: the --models list, else the one model."""
    return cfg.models or cfg.model or "default"


def resolve_engine_dtype(cfg, device="cpu"):
    """(cfg with --dtype auto replaced by the dtype the engines run on `device`, why): the scripts
    record both in their files and print them with their results (a refused run prints only its
    error line). On a CPU, auto probes the model's shapes at --engine-batch-size rows (a team's:
    its first agent's base model)."""
    model = cfg.model
    if cfg.models:
        model = team_entries(cfg.models, len(cfg.models.split(",")))[0][0]
    dtype, why = resolve_dtype(cfg.dtype, device, model or None, cfg.engine_batch_size)
    return replace(cfg, dtype=dtype), why


def adapter_rank(state):
    """An adapter file's rank (0 for what is not one: load_adapter refuses it)."""
    return state.get("rank", 0) if isinstance(state, dict) else 0


def make_engine(cfg, agents, rank, device="cpu"):
    """The generation engine of one rank on its device, from the engine settings `cfg`: the cache
    file that every rank shares, a progress bar on rank 0. With --models, a Team of `agents`: one
    engine per distinct base model, each agent's adapter loaded into its base's engine (the file
    read as data: common.load_file), the engine wrapped at the highest rank among them."""
    if cfg.models:
        entries = team_entries(cfg.models, agents)
        engines, files, adapters = {}, {}, {}
        for base, adapter in entries:
            if base not in engines:
                alone = replace(cfg, model=base, models="")
                engines[base] = make_engine(alone, agents, rank, device)
            if adapter and (base, adapter) not in files:
                files[base, adapter] = read_adapter(adapter)
        # the highest rank first: the first adapter wraps its engine, lower ranks pad into it
        by_rank = sorted(files.items(), key=lambda item: -adapter_rank(item[1]))
        for (base, adapter), state in by_rank:
            try:
                adapters[base, adapter] = lora.load_adapter(engines[base].model, state)
            except lora.AdapterMismatch as e:
                raise FileRefused(f"{adapter}: {e}") from None
        return Team([Member(engines[b], adapters.get((b, adapter))) for b, adapter in entries])
    return Engine(
        model_path=cfg.model or None,
        dtype=cfg.dtype,
        device=str(device),
        batch_size=cfg.engine_batch_size,
        cache_dir=cfg.cache_dir or None,
        progress=rank == 0,
    )
