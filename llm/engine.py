"""The engine: batched text generation over any HF causal LM, with an on-disk cache of generations.

A short hand-written sampling loop with a KV cache and continuous batching, tested token for token
against HF `generate` (tests/engine/test_engine.py). Every script makes it through llm/team.py
(`make_engine`, from the script's flags); backbone.py loads the model itself. Read top to bottom:
  Completion, Sample  - one generated text (what generate returns), one sampled row (sample's)
  Engine              - generate (continuous batching) and teacher-forced log-probs
Beside it:
  sampling.py         - how the next token is drawn (pick_next_tokens: temperature / top-p, one
                        torch.Generator per row) and check_sampling
  prefill.py          - how Engine runs prompts (its base class Prefill): prefix sharing
                        (prefix_groups: a debate's agents prefill their shared prompt prefix once)
                        and padded chunks of rows of similar length (padded_chunks)
  cache.py            - the on-disk cache keyed by model, prompt, params, seed (GenerationCache, one
                        SQLite file) and weights_fingerprint
  kvcache.py          - what the engine puts under the model: its KV cache layer and, on CPU,
                        oneDNN linears
  graphs.py           - the decode step at static shapes, replayed as CUDA graphs on a GPU
                        (StaticDecoder; `decode`, check_decode)
  lora.py             - low-rank adapters: rows of one batch may each run with their own adapter
"""

import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
from tqdm import tqdm
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from common import UsageError
from llm import lora
from llm.backbone import default_model_path, load_model, resolve_dtype
from llm.cache import GenerationCache, weights_fingerprint
from llm.graphs import StaticDecoder
from llm.kvcache import OneDNNLinears, PreallocatedLayer
from llm.prefill import Prefill
from llm.sampling import check_sampling, pick_next_tokens


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish: str  # "eos", "stop" (a stop string) or "length"
    cached: bool = False
    # with generate(return_tokens=True): the sampled ids, the EOS included
    token_ids: list | None = None
    # log p of every generated token (the EOS included) under the model's own untempered
    # distribution: the generation's confidence, free with the text (docs/design.md §2)
    token_logprobs: list | None = None


class Sample(NamedTuple):
    """What Engine.sample returns per prompt."""

    tokens: list  # the sampled ids; they end before the EOS unless keep_eos
    finish: str
    n_generated: int  # tokens generated, the EOS included
    logprobs: list  # one per generated token, the EOS included


DECODES = ("auto", "eager", "static", "compiled")


def check_decode(decode, device):
    """The engine's decode step: "eager" (the HF forward over the live rows' window), "static"
    (llm/graphs.py: static shapes, replayed as CUDA graphs on a GPU), "compiled" (static, its
    kernels fused by torch.compile first); "auto": static on a GPU, eager on CPU, where matmuls
    rather than launches dominate and the static step's padding costs more than it saves."""
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {', '.join(DECODES)}, got {decode!r}")
    if decode == "auto":
        return "static" if torch.device(device).type == "cuda" else "eager"
    return decode


class ContextTooLong(UsageError):
    """A prompt and its token budget do not fit in the model's context (a user's setting, so a
    script ends on its one line as on any other usage error)."""


class Engine(Prefill):
    """Batched text generation over any HF causal LM, with a hand-written KV-cache sampling loop.

    Continuous batching: up to batch_size rows decode together; a row stops on its own (EOS, a stop
    string or the token budget) and frees its slot, and the next prompts of the queue are prefilled
    into the free slots, so the batch stays full until the queue is empty. Results are cached on
    disk when `cache_dir` is given (`cache_dir`/generations.db, one file that every process and
    torchrun rank shares). `decode` chooses the decode step (check_decode): on a GPU by default the
    static one of llm/graphs.py, replayed as CUDA graphs."""

    def __init__(
        self,
        model_path=None,
        dtype="float32",
        device="cpu",
        batch_size=128,
        cache_dir=None,
        model=None,
        tokenizer=None,
        prefill_tokens=2048,
        share_prefix=True,
        progress=False,
        decode="auto",
    ):
        if model is None:
            model_path = model_path or default_model_path()
            # auto: bf16 where it is clearly faster at this batch (resolve_dtype says why)
            dtype, self.dtype_reason = resolve_dtype(dtype, device, model_path, batch_size)
            model, tokenizer = load_model(model_path, dtype, device)
            self.dtype = dtype
        else:
            self.dtype = str(model.dtype).removeprefix("torch.")
            self.dtype_reason = "the model object's own dtype"
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.batch_size, self.prefill_tokens = batch_size, prefill_tokens
        self.share_prefix = share_prefix
        self.progress = progress  # a tqdm bar over the sequences of long generate() calls
        # what another engine on the same machine and cache needs (eval's leader=PATH)
        self.settings = {
            "dtype": dtype,
            "device": device,
            "batch_size": batch_size,
            "cache_dir": cache_dir,
            "progress": progress,
        }
        # the cache key names the weights and the dtype: both change the text
        self.model_id = (
            f"{model_path or model.name_or_path}:{dtype if model_path else model.dtype}:"
            f"{weights_fingerprint(model)}"
        )
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {t for t in eos + [tokenizer.eos_token_id] if t is not None}
        # models whose KV cache is a plain one (not
        # sliding-window, say) get the engine's own slot cache
        probe = DynamicCache(config=model.config)
        self.continuous = all(type(layer) is DynamicLayer for layer in probe.layers)
        self.n_layers = len(probe.layers)
        self.decode = check_decode(decode, device)
        # the decode step at static shapes (llm/graphs.py): kept buffers, CUDA graphs on a GPU
        self.static = (
            StaticDecoder(
                model,
                device,
                self.n_layers,
                capture=torch.device(device).type == "cuda",
                compiled=self.decode == "compiled",
            )
            if self.decode != "eager" and self.continuous
            else None
        )
        self.cache = GenerationCache(cache_dir) if cache_dir else None
        # the fp32 CPU Linear layers run through oneDNN inside the engine's forward passes (faster
        # than the default MKL path for the engine's skinny matmuls: README, "The engine")
        self.linears = (
            OneDNNLinears(model) if torch.backends.mkldnn.is_available() else nullcontext()
        )
        # prefill_s: seconds spent prefilling prompts
        self.stats = {
            "calls": 0,
            "cache_hits": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "prefill_tokens": 0,
            "prefill_s": 0.0,
        }

    def chat(self, user, system=None):
        """A prompt string in the model's chat format (plain text for models without a template)."""
        if not self.tokenizer.chat_template:
            return (system + "\n\n" if system else "") + user + "\n"
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def encode(self, prompt):
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def generate(
        self,
        prompts,
        seeds,
        max_new_tokens=256,
        temperature=0.7,
        top_p=1.0,
        stop=(),
        return_tokens=False,
        adapters=None,
    ):
        """One Completion per prompt; `seeds[i]` makes prompt i's sample reproducible.
        return_tokens: also return the sampled token ids (for training on them); bypasses the
        cache. adapters: the LoRA adapter of each prompt (None: the base model), all in one
        batch."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        adapters = adapters or [None] * len(prompts)
        check_sampling(max_new_tokens, temperature, top_p)
        params = {
            "max_new_tokens": max_new_tokens,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "stop": list(stop),
        }
        if any(not prompt for prompt in prompts):
            raise ValueError(f"prompt {[bool(p) for p in prompts].index(False)} is empty")
        keys = [
            GenerationCache.key(
                lora.model_id(self.model_id, self.model, a), prompt, params, int(seed)
            )
            for prompt, seed, a in zip(prompts, seeds, adapters)
        ]
        # entries written before the engine kept log-probs are misses
        hits, todo = self._lookup(
            keys, prompts, not return_tokens, fresh=lambda value: "token_logprobs" in value
        )
        results = [None if hit is None else Completion(**hit, cached=True) for hit in hits]

        def finished(k, out):  # store each completion as soon as it ends
            i, key, ids = todo[k]
            text = self.tokenizer.decode(out.tokens, skip_special_tokens=True)
            for s in stop:  # the text ends before the stop string
                text = text.split(s)[0] if s in text else text
            results[i] = Completion(
                text,
                len(ids),
                out.n_generated,
                out.finish,
                token_ids=out.tokens if return_tokens else None,
                token_logprobs=out.logprobs,
            )
            if self.cache and not return_tokens:
                self.cache.put(
                    key,
                    {
                        "text": text,
                        "prompt_tokens": len(ids),
                        "completion_tokens": out.n_generated,
                        "finish": out.finish,
                        "token_logprobs": out.logprobs,
                    },
                )
            self.stats["calls"] += 1
            self.stats["prompt_tokens"] += len(ids)
            self.stats["completion_tokens"] += out.n_generated

        if todo:
            with self._saving():
                self.sample(
                    [ids for _, _, ids in todo],
                    [seeds[i] for i, _, _ in todo],
                    **params,
                    keep_eos=return_tokens,
                    on_finish=finished,
                    adapters=[adapters[i] for i, _, _ in todo],
                )
        return results

    def continuation_logprobs(self, prompts, continuations):
        """Summed log p(continuation | prompt) of each continuation's whole token sequence,
        teacher-forced after each prompt: a (len(prompts), len(continuations)) float tensor. A
        continuation is a string (encoded on its own, as `encode` does) or a list of token ids. No
        sampling: one forward pass per chunk over the rows prompt + continuation, the prompt running
        once as their shared prefix. Cached per (prompt, continuations)."""
        conts = [
            self.encode(c) if isinstance(c, str) else [int(t) for t in c] for c in continuations
        ]
        if not all(conts):
            raise ValueError("an empty continuation has no log-probability to score")
        keys = [
            GenerationCache.key(self.model_id, "continuation_logprobs", prompt, conts)
            for prompt in prompts
        ]
        results, todo = self._lookup(keys, prompts)
        keep = max(map(len, conts))  # the logits of each row's last `keep` positions are needed
        with self._saving():
            for start in range(0, len(todo), self.batch_size):
                chunk = todo[start : start + self.batch_size]
                # one row per distinct prompt + continuation[:-1]:
                # one-token continuations share the prompt's row
                rows = sorted({tuple(ids + c[:-1]) for _, _, ids in chunk for c in conts})
                with torch.inference_mode():
                    logprobs = torch.log_softmax(
                        self.prefill([list(r) for r in rows], keep=keep).float(), -1
                    )
                row_of = {r: k for k, r in enumerate(rows)}
                for i, key, ids in chunk:
                    # the logits at a row's last len(c) positions predict the tokens of c
                    results[i] = [
                        logprobs[row_of[tuple(ids + c[:-1])], keep - len(c) :]
                        .gather(-1, torch.tensor(c)[:, None])
                        .sum()
                        .item()
                        for c in conts
                    ]
                    if self.cache:
                        self.cache.put(key, results[i])
                    self.stats["calls"] += 1
                    self.stats["prompt_tokens"] += len(ids)
        return torch.tensor(results)

    def next_token_logprobs(self, prompts, token_ids):
        """log p(token | prompt) at the position after each prompt, for each id in `token_ids`: a
        (len(prompts), len(token_ids)) float tensor (one-token continuations)."""
        return self.continuation_logprobs(prompts, [[t] for t in token_ids])

    def _lookup(self, keys, prompts, use_cache=True, fresh=lambda value: True):
        """Cached values (None where absent or not `fresh`) and the misses as (index, key, token
        ids), sorted by token order so that prompts sharing a prefix end up side by side."""
        hits = self.cache.get_many(keys) if self.cache and use_cache else [None] * len(keys)
        hits = [hit if hit is not None and fresh(hit) else None for hit in hits]
        self.stats["cache_hits"] += sum(hit is not None for hit in hits)
        todo = sorted(
            ((i, keys[i], self.encode(prompts[i])) for i, hit in enumerate(hits) if hit is None),
            key=lambda item: item[2],
        )
        return hits, todo

    def _saving(self):
        """with self._saving(): ... -- the block's cache entries written together (one transaction
        per engine call)."""
        return self.cache.batch() if self.cache else nullcontext()

    @torch.inference_mode()
    def sample(
        self,
        batch_ids,
        seeds,
        max_new_tokens=256,
        temperature=0.7,
        top_p=1.0,
        stop=(),
        keep_eos=False,
        on_finish=None,
        adapters=None,
    ):
        """The sampling loop, with continuous batching: one Sample per prompt, in order;
        on_finish(i, sample) is called as soon as prompt i is done. The ids end before the EOS
        unless keep_eos (training needs the very EOS id that was sampled). The prompts wait in a
        queue in token order (prompts that share a prefix are prefilled together). Up to batch_size
        rows, each in a slot of a preallocated KV cache, decode one token per step, all writing to
        column `end`, each with its own positions and attention mask. A finished row leaves, the
        last row moving into its slot; once `refill` slots are free (a few prompts at a time keep a
        team's prompts and their shared prefix together: 9% faster than one at a time), the next
        prompts are prefilled into them, right-aligned at `end`. Columns no live row uses leave the
        window; when the window reaches the end of the buffer it slides back to the left. Rows
        with `adapters` (LoRA, one per prompt, None: the base) queue by adapter and prefill in runs
        of one adapter (a prefix is shared only under the same adapter); each decode step runs
        every row with its own adapter."""
        check_sampling(max_new_tokens, temperature, top_p)
        adapter_of = [-1 if a is None else a for a in adapters or [None] * len(batch_ids)]
        queue = deque(sorted(range(len(batch_ids)), key=lambda i: (adapter_of[i], batch_ids[i])))
        longest, slots = max(map(len, batch_ids)), min(self.batch_size, len(batch_ids))
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context and longest + max_new_tokens > context:
            raise ContextTooLong(
                f"a prompt of {longest} tokens + --max-new-tokens {max_new_tokens} exceeds the "
                f"model's context of {context} tokens: lower --max-new-tokens"
            )
        capacity, refill = longest + 2 * max_new_tokens, max(1, slots // 8)
        if self.static:  # buffers kept from call to call, which its graphs read
            cache, mask, positions, slot_adapters = self.static.begin(slots, capacity)
        else:
            mask = torch.zeros((slots, capacity), dtype=torch.long, device=self.device)
            positions = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
            slot_adapters = torch.full((slots,), -1, dtype=torch.long, device=self.device)
            cache = Cache(layers=[PreallocatedLayer(slots, capacity) for _ in range(self.n_layers)])
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        # rows: the prompt in each slot
        rows, tokens, logprobs, results = [], {}, {}, [None] * len(batch_ids)
        # the window of columns the live rows use; `end` takes the next token
        start, end = 0, longest
        bar = tqdm(
            total=len(batch_ids),
            desc="generate",
            unit="seq",
            leave=False,
            disable=not self.progress or len(batch_ids) <= self.batch_size,
        )
        logits = None  # the next-token logits of the live rows (set by the first prefill)
        while queue or rows:
            if queue and slots - len(rows) >= (
                min(refill, len(queue)) if self.continuous else slots
            ):
                new = [queue.popleft() for _ in range(min(slots - len(rows), len(queue)))]
                # HF's own cache: a padded batch at a time, starting at column 0
                if not self.continuous:
                    cache = DynamicCache(config=self.model.config)
                    end = max(len(batch_ids[i]) for i in new)
                began = time.perf_counter()
                slot_adapters[len(rows) : len(rows) + len(new)] = torch.tensor(
                    [adapter_of[i] for i in new]
                )
                new_logits = self.prefill_slots(
                    [batch_ids[i] for i in new], slot_adapters, cache, mask, len(rows), end
                )
                self.stats["prefill_s"] += time.perf_counter() - began
                positions[len(rows) : len(rows) + len(new), 0] = torch.tensor(
                    [len(batch_ids[i]) for i in new]
                )
                logits = torch.cat([logits, new_logits]) if rows else new_logits
                rows += new
                for i in new:
                    tokens[i], logprobs[i] = [], []
            if self.continuous:  # the window: from the first column a live row uses to `end`
                start = int(mask[: len(rows)].any(0).nonzero()[0])
                for layer in cache.layers:
                    layer.window(len(rows), start, end)
            next_tokens = pick_next_tokens(
                logits, [generators[i] for i in rows], temperature, top_p
            )
            # log-probs under the untempered distribution, whatever the sampling temperature
            logp = torch.log_softmax(logits.float(), -1)
            chosen = logp.gather(-1, next_tokens[:, None]).squeeze(-1).tolist()
            alive = []
            for slot, (i, token, logprob) in enumerate(zip(rows, next_tokens.tolist(), chosen)):
                logprobs[i].append(logprob)
                finish = None
                if token in self.eos_ids:
                    finish = "eos"
                    if keep_eos:
                        tokens[i].append(token)
                else:
                    tokens[i].append(token)
                    if stop and any(s in self.tokenizer.decode(tokens[i][-16:]) for s in stop):
                        finish = "stop"
                    elif len(tokens[i]) >= max_new_tokens:
                        finish = "length"
                if finish is None:
                    alive.append(slot)
                    continue
                results[i] = Sample(tokens.pop(i), finish, len(logprobs[i]), logprobs.pop(i))
                bar.update(1)
                if on_finish:
                    on_finish(i, results[i])
            # finished rows leave: the last live rows move into their slots
            if len(alive) < len(rows):
                tail, kept = [s for s in alive if s >= len(alive)], set(alive)
                order = torch.tensor(
                    [s if s in kept else tail.pop() for s in range(len(alive))], dtype=torch.long
                )
                cache.batch_select_indices(order)
                mask[: len(order)], positions[: len(order)] = mask[order], positions[order]
                slot_adapters[: len(order)] = slot_adapters[order]
                next_tokens, rows = next_tokens[order], [rows[s] for s in order.tolist()]
            if not rows:
                continue
            # slide the window back, leaving room for the longest prompt
            if self.continuous and end == capacity:
                to = max(0, longest - (end - start))
                mask[: len(rows), :capacity] = torch.cat(
                    [
                        mask.new_zeros(len(rows), to),
                        mask[: len(rows), start:end],
                        mask.new_zeros(len(rows), capacity - to - end + start),
                    ],
                    dim=1,
                )
                for layer in cache.layers:
                    layer.slide(to)
                start, end = to, to + end - start
            mask[: len(rows), end] = 1
            if self.static:
                logits = self.static.step(next_tokens, end)
            else:
                with lora.selecting(self.model, slot_adapters[: len(rows)]):
                    logits = self._forward(
                        next_tokens[:, None],
                        mask[: len(rows), start : end + 1],
                        cache,
                        positions[: len(rows)],
                    )[:, -1]
            positions[: len(rows)] += 1
            end += 1
        bar.close()
        return results
