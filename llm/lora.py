"""Low-rank adapters (LoRA, arXiv 2106.09685) on any causal LM: several per model, chosen per row.

  add_lora          - wraps the model's Linear projections in LoRALinear (the base frozen)
  LoRALinear        - y = W x + (alpha / r) B_k A_k x, the adapter k chosen per batch row
  selecting         - which adapter each row runs with while the model runs (None: the base)
  adapter_runs      - the runs of rows with one adapter (the engine prefills each on its own)
  adapter_state     - one adapter as a dict of tensors and settings (what an adapter file holds)
  write_peft, read_peft - such a dict as a PEFT LoRA folder (adapter_config.json,
                      adapter_model.safetensors, PEFT's tensor names; what PEFT and vLLM read) and
                      back; `python -m llm.lora OLD.pt FOLDER` converts this project's older .pt
  load_adapter      - such a dict as one more adapter of a model (refused for another base)
  merged_copy       - a copy of the model with one adapter folded into its weights

B starts at zero, so an untrained adapter adds exactly 0.0: the base model's logits bit for bit.
Agents that share a base share one model and one engine; in a batch mixing agents every layer runs
all adapters' A on every row, keeps each row's own adapter's columns (a mask) and adds their B
product into the base output, so a team of adapters decodes in one forward (docs/design.md §8,
§10).
"""

import copy
import hashlib
import json
import re
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save_file as save_safetensors

FORMAT = "mpdf-lora-1"
# a PEFT LoRA folder: PEFT's two files, and this project's extras (the base's fingerprint, which
# agent, the training settings) in a third that PEFT ignores
PEFT_CONFIG, PEFT_WEIGHTS, EXTRAS = "adapter_config.json", "adapter_model.safetensors", "mpdf.json"
PEFT_KEY = re.compile(r"base_model\.model\.(.+)\.lora_([AB])\.weight")


class Selection:
    """The adapter of each row for the model's next forward passes, shared by its LoRA layers: None
    (the base), an int (every row), or a (rows,) long tensor (-1: the base for that row), with its
    mask: (rows, 1, adapters x rank), the scale alpha / r on the columns of the row's own adapter,
    0 elsewhere."""

    rows, mask = None, None


class LoRALinear(torch.nn.Module):
    def __init__(self, base, rank, alpha, selection):
        super().__init__()
        self.base, self.rank, self.scale, self.selection = base, rank, alpha / rank, selection
        self.lora_A, self.lora_B = torch.nn.ParameterList(), torch.nn.ParameterList()
        self._stacked, self._versions = None, None

    def add_adapter(self, generator=None):
        """A new adapter: A as nn.Linear's default init (kaiming uniform), B zero."""
        weight = self.base.weight
        a = torch.empty(self.rank, weight.shape[1], dtype=weight.dtype)
        bound = 1 / weight.shape[1] ** 0.5
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A.append(torch.nn.Parameter(a.to(weight.device)))
        self.lora_B.append(torch.nn.Parameter(weight.new_zeros(weight.shape[0], self.rank)))

    def stacked(self):
        """Every adapter's A (n r, in) and B (out, n r) side by side; kept between forward passes
        without gradients (the decode steps) until a parameter changes."""
        if torch.is_grad_enabled():
            return torch.cat(list(self.lora_A)), torch.cat(list(self.lora_B), dim=1)
        versions = [(id(p), p._version) for p in (*self.lora_A, *self.lora_B)]
        if versions != self._versions:
            fresh = torch.cat(list(self.lora_A)), torch.cat(list(self.lora_B), dim=1)
            kept = self._stacked
            if kept is None or [t.shape for t in kept] != [t.shape for t in fresh]:
                self._stacked = fresh
            else:
                # in place: a CUDA graph that read the old values reads the new ones
                # (llm/graphs.py)
                with torch.inference_mode():
                    for old, new in zip(kept, fresh):
                        old.copy_(new)
            self._versions = versions
        return self._stacked

    def forward(self, x):
        y, rows = self.base(x), self.selection.rows
        if rows is None or (isinstance(rows, int) and rows < 0):
            return y
        if isinstance(rows, int):
            a, b = self.lora_A[rows], self.lora_B[rows]
            low = F.linear(x, a) * self.scale
        else:
            # every adapter on every row, then each row keeps its own adapter's r columns (the
            # mask, times the scale): plain matmuls of n x r columns, faster on CPU than gathering
            # each row's A and B for a batched matmul
            a, b = self.stacked()
            low = F.linear(x, a) * self.selection.mask
        if torch.is_grad_enabled() or not y.is_contiguous():
            return y + F.linear(low, b)
        # y += low B^T in place: one pass over the output (a separate product and sum took 4x as
        # long on the engine's 128-row decode steps, memory-bound)
        y.view(-1, y.shape[-1]).addmm_(low.reshape(-1, low.shape[-1]), b.t())
        return y


def lora_layers(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def base_fingerprint(model):
    """A short hash of the base weights (LoRA excluded), each rounded to bfloat16 first: the same in
    a float32 and a bfloat16 copy of one checkpoint, different for other weights."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" not in name:
                name = name.replace(".base.", ".")
                total = p.to(torch.bfloat16).double().sum().item()
                digest.update(f"{name}{tuple(p.shape)}{total:.10e}".encode())
    return digest.hexdigest()[:16]


def add_lora(model, rank, alpha, adapters=0, seed=0, parts=()):
    """Wraps every nn.Linear of the model but its LM head (the attention and MLP projections of the
    usual families), or those whose name contains one of `parts` (e.g. "q_proj", "self_attn"), in
    a LoRALinear and freezes the base; adds `adapters` fresh adapters. Returns the model;
    model.lora holds the settings an adapter file records."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, got {rank}")
    head = model.get_output_embeddings()
    targets = [
        name
        for name, m in model.named_modules()
        if type(m) is torch.nn.Linear
        and m is not head
        and ".lora_" not in name
        and (not parts or any(part in name for part in parts))
    ]
    if not targets:
        wanted = f" named with any of {list(parts)}" if parts else ""
        raise ValueError(f"{type(model).__name__}: no nn.Linear layers{wanted} to adapt")
    fingerprint = base_fingerprint(model)
    model.requires_grad_(False)
    selection = Selection()
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha, selection))
    model.lora = {
        "rank": rank,
        "alpha": alpha,
        "targets": targets,
        "base_fingerprint": fingerprint,
        "selection": selection,
        "names": [],  # each adapter's: its file's fingerprint, or unsaved<k> (part of cache keys)
    }
    generator = torch.Generator().manual_seed(seed)
    for _ in range(adapters):
        new_adapter(model, generator)
    return model


def new_adapter(model, generator=None, name=None):
    """One more adapter on every LoRA layer; returns its index."""
    for layer in lora_layers(model).values():
        layer.add_adapter(generator)
    model.lora["names"].append(name or f"unsaved{n_adapters(model) - 1}")
    return n_adapters(model) - 1


def model_id(base_id, model, adapter):
    """What names the weights a row runs with in a cache key: the base's id, + the adapter's."""
    return base_id if adapter is None else f"{base_id}+{model.lora['names'][adapter]}"


def n_adapters(model):
    layers = list(lora_layers(model).values())
    return len(layers[0].lora_A) if layers else 0


def adapter_parameters(model, k):
    return [p for layer in lora_layers(model).values() for p in (layer.lora_A[k], layer.lora_B[k])]


@contextmanager
def selecting(model, rows, mixed=False):
    """Runs the model with `rows` as its adapters (see Selection); a tensor whose rows all name the
    same adapter takes the plain matmul path unless `mixed` (a CUDA graph serves any mix of
    adapters: its step never asks, which would wait for the GPU). A model without LoRA ignores
    it."""
    lora = getattr(model, "lora", None)
    if lora is None:
        yield
        return
    if torch.is_tensor(rows) and len(rows) and not mixed and bool((rows == rows[0]).all()):
        rows = int(rows[0])
    selection, mask = lora["selection"], None
    if torch.is_tensor(rows):  # a row of -1 (the base) keeps no column
        # adapter k owns columns k r .. (k + 1) r - 1
        columns = torch.arange(len(lora["names"]) * lora["rank"], device=rows.device)
        columns = columns // lora["rank"]
        dtype = next(model.parameters()).dtype
        scale = lora["alpha"] / lora["rank"]
        mask = ((rows[:, None] == columns[None]) * scale).to(dtype)[:, None, :]
    before = selection.rows, selection.mask
    selection.rows, selection.mask = rows, mask
    try:
        yield
    finally:
        selection.rows, selection.mask = before


def adapter_runs(adapters, split=True):
    """(first, last) of each run of consecutive rows with the same adapter; one run for all when not
    `split` (a model prefilled in one padded pass: a per-row adapter tensor)."""
    if not split:
        return [(0, len(adapters))]
    cuts = [k for k in range(1, len(adapters)) if adapters[k] != adapters[k - 1]]
    return list(zip([0, *cuts], [*cuts, len(adapters)]))


def adapter_state(model, k, base_name):
    """Adapter k as the dict an adapter file holds: its tensors and settings."""
    lora = model.lora
    tensors = {}
    for name, layer in lora_layers(model).items():
        tensors[f"{name}.A"] = layer.lora_A[k].detach().cpu().clone()
        tensors[f"{name}.B"] = layer.lora_B[k].detach().cpu().clone()
    settings = {key: lora[key] for key in ("rank", "alpha", "targets", "base_fingerprint")}
    return {"format": FORMAT, "base": base_name, **settings, "tensors": tensors}


def peft_targets(targets):
    """PEFT's target_modules for these module names: their last names (q_proj, ...) where each is
    adapted in every layer that has one (PEFT matches a module by its name's end), else the full
    names."""
    layers = {re.sub(r"\.\d+\.", ".#.", name) for name in targets}
    kinds = {name.rsplit(".", 1)[-1] for name in targets}
    numbered = {m for name in targets for m in re.findall(r"\.(\d+)\.", name)}
    whole = len(targets) == len(layers) * max(len(numbered), 1) and len(kinds) == len(layers)
    return sorted(kinds) if whole else sorted(targets)


def write_peft(state, folder, extras=None):
    """An adapter_state dict as a PEFT LoRA folder: adapter_config.json, adapter_model.safetensors
    (PEFT's tensor names, base_model.model.<module>.lora_A.weight: (rank, in), lora_B: (out, rank))
    and EXTRAS, this project's own (the base's fingerprint, `extras`). Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, tensor in state["tensors"].items():
        name, part = key.rsplit(".", 1)
        tensors[f"base_model.model.{name}.lora_{part}.weight"] = tensor.contiguous()
    save_safetensors(tensors, folder / PEFT_WEIGHTS, metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": state["base"],
        "r": state["rank"],
        "lora_alpha": state["alpha"],
        "target_modules": peft_targets(state["targets"]),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    (folder / PEFT_CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    own = {"format": FORMAT, "base_fingerprint": state["base_fingerprint"], **(extras or {})}
    (folder / EXTRAS).write_text(json.dumps(own, indent=1) + "\n")
    return folder


def read_peft(folder):
    """A PEFT LoRA folder (write_peft's, or PEFT's own save_pretrained) as an adapter_state dict,
    read as data (JSON and safetensors: nothing in it can run). Refused with AdapterMismatch, in one
    line: another kind of adapter (DoRA, rsLoRA, trained biases or modules), a tensor of another
    name or rank than its config says, a layer with A or B missing. A folder without EXTRAS has no
    base fingerprint: load_adapter then checks the base's name instead."""
    folder = Path(folder)
    try:
        config = json.loads((folder / PEFT_CONFIG).read_text())
        tensors = load_safetensors(folder / PEFT_WEIGHTS)
        extras = json.loads((folder / EXTRAS).read_text()) if (folder / EXTRAS).exists() else {}
    except (OSError, ValueError, SafetensorError) as error:
        raise AdapterMismatch(f"{folder}: not a PEFT LoRA folder ({error})") from None
    plain = dict(peft_type="LORA", bias="none", use_dora=False, use_rslora=False)
    odd = [key for key, value in plain.items() if config.get(key, value) != value]
    odd += ["modules_to_save"] if config.get("modules_to_save") else []
    if odd:
        raise AdapterMismatch(f"{folder}: not a plain LoRA adapter ({odd[0]}: {config[odd[0]]})")
    rank, pairs = config["r"], {}
    for key, tensor in tensors.items():
        match = PEFT_KEY.fullmatch(key)
        if match is None:
            raise AdapterMismatch(f"{folder}: a tensor LoRA has not: {key}")
        name, part = match.groups()
        if tensor.shape[0 if part == "A" else 1] != rank:
            size = tuple(tensor.shape)
            raise AdapterMismatch(f"{folder}: {key} is {size}, not of rank {rank} (its config's)")
        pairs[f"{name}.{part}"] = tensor
    targets = sorted({key.rsplit(".", 1)[0] for key in pairs})
    unpaired = [f"{t}.{p}" for t in targets for p in "AB" if f"{t}.{p}" not in pairs]
    if unpaired:
        raise AdapterMismatch(f"{folder}: {unpaired[0]} is missing (LoRA needs both A and B)")
    return {
        "format": FORMAT,
        "base": config.get("base_model_name_or_path") or "",
        "rank": rank,
        "alpha": config["lora_alpha"],
        "targets": targets,
        "base_fingerprint": extras.get("base_fingerprint"),
        "target_modules": config.get("target_modules") or [],
        "tensors": pairs,
    }


def peft_matches(name, target_modules):
    """PEFT's rule: a string is a regex the whole name matches; a list names modules whose name is
    an entry or ends with "." + one."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    return any(name == t or name.endswith("." + t) for t in target_modules)


def check_peft_targets(model, state):
    """A PEFT folder's target_modules name exactly the layers its tensors adapt, in this model: a
    layer whose tensors are missing, or a target the model lacks, is refused."""
    spec = state["target_modules"]
    named = {
        name
        for name, m in model.named_modules()
        if isinstance(m, (torch.nn.Linear, LoRALinear))
        and not name.endswith(".base")
        and peft_matches(name, spec)
    }
    if named != set(state["targets"]):
        odd = sorted(named ^ set(state["targets"]))[0]
        raise AdapterMismatch(
            f"its target_modules {spec} are {len(named)} layers of this model, its tensors adapt "
            f"{len(state['targets'])} ({odd} in one, not the other)"
        )


def adapter_fingerprint(state):
    digest = hashlib.sha256()
    for name in sorted(state["tensors"]):
        digest.update(name.encode() + state["tensors"][name].float().numpy().tobytes())
    return digest.hexdigest()[:16]


class AdapterMismatch(ValueError):
    """An adapter that does not fit the model: another base, a higher rank, other layers."""


def load_adapter(model, state):
    """Adds an adapter (adapter_state's dict, e.g. loaded with common.load_file) to the model,
    wrapping the model first (at the file's rank) if it has no LoRA yet; returns its index (its
    name: the file's fingerprint). An adapter of a lower rank than the model's fits exactly: its A
    and B padded with zero rows and columns, B rescaled to the model's alpha / rank, so that one
    engine holds a team of mixed ranks (wrap at the highest). A dict that is not an adapter, or one
    for another base or set of layers or of a higher rank, raises AdapterMismatch saying why in one
    line."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise AdapterMismatch("not an adapter file (the LLM-weight trainers write them)")
    if state.get("target_modules") is not None:
        check_peft_targets(model, state)
    if getattr(model, "lora", None) is None:
        # the file's own layers (exact names: a mismatch is caught below)
        try:
            add_lora(model, state["rank"], state["alpha"], parts=state["targets"])
        except (ValueError, TypeError) as e:
            raise AdapterMismatch(f"the file's layers do not fit this model: {e}") from None
    lora = model.lora
    mine = dict(lora, targets=sorted(lora["targets"]))
    theirs = dict(state, targets=sorted(state["targets"]))
    # a PEFT folder made elsewhere names its base but has no fingerprint: the names must agree
    if theirs["base_fingerprint"] is None:
        theirs["base_fingerprint"] = mine["base_fingerprint"]
        named = [Path(str(n)).name.casefold() for n in (state["base"], model.name_or_path)]
        if all(named) and named[0] != named[1]:
            raise AdapterMismatch(
                f"an adapter for another base model ({state['base']!r} there, "
                f"{model.name_or_path!r} here)"
            )
    for key in ("base_fingerprint", "rank", "targets"):
        if theirs[key] != mine[key] and not (key == "rank" and theirs[key] < mine[key]):
            what = "base model" if key == "base_fingerprint" else key
            here, there = mine[key], theirs[key]
            if key == "targets":
                here, there = f"{len(here)} layers", f"{len(there)} layers"
            raise AdapterMismatch(
                f"an adapter for another {what} ({there} there, {here} here; the file "
                f"was trained on {state['base']!r})"
            )
    rank = state["rank"]
    layers = lora_layers(model)
    for name, layer in layers.items():
        for part in ("A", "B"):
            tensor = state["tensors"].get(f"{name}.{part}")
            shape = (rank, layer.base.in_features) if part == "A" else None
            shape = shape or (layer.base.out_features, rank)
            if tensor is None or tuple(tensor.shape) != shape:
                got = "nothing" if tensor is None else tuple(tensor.shape)
                raise AdapterMismatch(f"{name}.{part} should be {shape}, the file has {got}")
    # the file's delta (alpha / r) B A under the model's scale: B times the ratio of the scales
    rescale = (state["alpha"] / rank) / (lora["alpha"] / lora["rank"])
    k = new_adapter(model, name=adapter_fingerprint(state))
    with torch.no_grad():
        for name, layer in layers.items():
            layer.lora_A[k].zero_()[:rank].copy_(state["tensors"][f"{name}.A"])
            layer.lora_B[k].zero_()[:, :rank].copy_(state["tensors"][f"{name}.B"] * rescale)
    return k


def merged_copy(model, k):
    """A plain copy of the model with adapter k folded in: W + (alpha / r) B_k A_k per layer."""
    merged = copy.deepcopy(model)
    for name, layer in lora_layers(merged).items():
        parent_name, _, child = name.rpartition(".")
        with torch.no_grad():
            layer.base.weight += layer.scale * layer.lora_B[k] @ layer.lora_A[k]
        setattr(merged.get_submodule(parent_name), child, layer.base)
    del merged.lora
    return merged


def main(argv=None):
    """python -m llm.lora OLD.pt FOLDER, as its description says."""
    import argparse

    from common import load_file
    from llm import backbone

    parser = argparse.ArgumentParser(
        description="an adapter file of this project's older layout (a torch file read as data) "
        "as a PEFT LoRA folder"
    )
    parser.add_argument("old", help="an adapter .pt file (the LLM-weight trainers' older output)")
    parser.add_argument("folder", help="the PEFT folder to write")
    args = parser.parse_args(argv)
    state = load_file(args.old, "adapter")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        parser.exit(2, f"error: {args.old}: not an adapter file\n")
    if state["base"] == "default":
        state = {**state, "base": backbone.DEFAULT_NAME}
    print(write_peft(state, args.folder, {"converted_from": Path(args.old).name}))


if __name__ == "__main__":
    main()
