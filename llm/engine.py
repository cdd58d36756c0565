"""The engine: batched text generation over any HF causal LM, and an on-disk cache of generations.

A short hand-written sampling loop with a KV cache and continuous batching, tested token for token against
HF `generate` (tests/test_engine.py). Every script reaches it through deliberate.py (`deliberate.Engine`);
backbone.py loads the model itself. Read top to bottom:
  Completion, GenerationCache   - one generated text, and the on-disk cache keyed by model, prompt, params, seed
  pick_next_tokens              - temperature / top-p sampling, one torch.Generator per row
  prefix_groups                 - rows that share a long prompt prefix (a debate's agents) prefill it once
  padded_chunks                 - prefill chunks of rows of similar length (little padding)
  Engine                        - generate (continuous batching), prefill, and teacher-forced log-probs
kvcache.py holds what the engine puts under the model: its KV cache layer and, on CPU, oneDNN linears.
"""

import hashlib
import json
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from llm.backbone import default_model_path, load_model
from llm.kvcache import OneDNNLinears, PreallocatedLayer


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish: str  # "eos", "stop" (a stop string) or "length"
    cached: bool = False
    token_ids: list | None = (
        None  # with generate(return_tokens=True): the sampled ids, the EOS included
    )
    # log p of every generated token (the EOS included) under the model's own untempered distribution:
    # the generation's confidence, free with the text (docs/design.md §2)
    token_logprobs: list | None = None


class Sample(NamedTuple):
    """What Engine.sample returns per prompt."""

    tokens: list  # the sampled ids; they end before the EOS unless keep_eos
    finish: str
    n_generated: int  # tokens generated, the EOS included
    logprobs: list  # one per generated token, the EOS included


class GenerationCache:
    """Append-only JSONL files of generations keyed by (model, prompt, sampling parameters, seed).

    Each process appends to its own file (no interleaved writes under torchrun) and reads every file in the
    folder. A line torn by a killed process is skipped, not fatal."""

    def __init__(self, folder, rank=0):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"gen-rank{rank}.jsonl"
        self.entries, self.skipped = {}, 0
        for path in sorted(self.folder.glob("gen-rank*.jsonl")):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        entry = json.loads(line)
                        self.entries[entry["key"]] = entry["value"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        self.skipped += 1
        self._file = None

    @staticmethod
    def key(*parts):
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, value):
        self.entries[key] = value
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
            if self._file.tell() > 0:  # start on a fresh line in case the last write was torn
                self._file.write("\n")
        self._file.write(json.dumps({"key": key, "value": value}) + "\n")
        self._file.flush()


def pick_next_tokens(logits, generators, temperature, top_p):
    """Next token per row: argmax when temperature == 0, else a draw from softmax(logits / T), cut to the
    top-p nucleus when top_p < 1.

    Each row draws one uniform from its own seeded generator and inverts its CDF, so the randomness of a
    row depends only on its own seed, never on which other rows share the batch. (Its logits can still
    differ in the last float32 bits between batch shapes, as CPU matmuls round differently for different row
    counts; in float64 a row's sample is exactly batch-independent.) The CDF runs in vocabulary order: only
    the nucleus needs the probabilities sorted (sorting 64 x 49152 of them took 40% of a sampled step)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep a token while the mass strictly before it is < top_p (the top token is always kept)
        sorted_probs = sorted_probs.masked_fill(
            sorted_probs.cumsum(-1) - sorted_probs >= top_p, 0.0
        )
        probs = probs.scatter(-1, order, sorted_probs)
    cdf = probs.double().cumsum(-1)  # float64: 49152 float32 terms would round the tail of the CDF
    u = (
        torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
        * cdf[:, -1]
    )
    # the first token whose CDF exceeds u: a token of probability 0 is never drawn
    return torch.searchsorted(cdf, u[:, None], right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def call_seed(*parts):
    """A reproducible 63-bit seed for one LLM call (or any other draw), from anything JSON-serializable."""
    return int(hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:15], 16)


def weights_fingerprint(model):
    """A short hash of the weights (every parameter's name, shape, dtype and sum): a model changed in
    memory (fine-tuned, re-initialised) gets new cache keys. Call again after changing the weights."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            digest.update(f"{name}{tuple(p.shape)}{p.dtype}{p.double().sum().item():.10e}".encode())
    return digest.hexdigest()[:16]


def prefix_groups(batch_ids, min_shared=16, keep=1):
    """Split consecutive rows into groups that share a token prefix: (start, stop, shared length).

    A row joins the group while the common prefix stays >= min_shared tokens and keeps at least half of
    the group's prefix (prompts of one question share more than the template; another question breaks
    the group rather than shrink the shared prefix to the template), unless it shares more with the row
    after it: then it starts a tighter group (a team's prompts). prefill() shares the template among the
    groups' prefixes in turn. Each row keeps its last `keep` tokens out of the prefix (their logits are
    wanted)."""
    groups, start = [], 0
    while start < len(batch_ids):
        stop, shared = start + 1, None
        while stop < len(batch_ids):
            longer = common_prefix_length([batch_ids[start], batch_ids[stop]])
            longer = longer if shared is None else min(shared, longer)
            if (
                longer < min_shared
                or (shared is not None and longer < shared // 2)
                or (
                    stop + 1 < len(batch_ids)
                    and common_prefix_length(batch_ids[stop : stop + 2]) > longer
                )
            ):
                break
            shared, stop = longer, stop + 1
        # a prefix is worth running once only when several rows use it
        shared = (
            min(shared, min(len(ids) for ids in batch_ids[start:stop]) - keep)
            if stop - start > 1
            else 0
        )
        shared = shared if shared >= min_shared else 0
        if (
            groups and not shared and not groups[-1][2]
        ):  # rows without a prefix still prefill together
            groups[-1] = (groups[-1][0], stop, 0)
        else:
            groups.append((start, stop, shared))
        start = stop
    return groups


def padded_chunks(lengths, budget, overhead=256):
    """Split rows sorted by length into consecutive chunks (start, stop), each padded to its longest row and
    within `budget` tokens (a longer row runs alone), with the fewest padded tokens plus `overhead` per chunk
    (smaller chunks make skinnier, less efficient matmuls; 128 to 1024 give the same split on the benchmark
    prompts). Filling each chunk up to the budget instead pads short rows to the length of the long ones that
    follow them: on the 64 prompts of `--bench generate` it ran 4391 tokens for 3681 real ones, this split
    3884. Dynamic programming over the cut points."""
    cost, cut = [0] + [float("inf")] * len(lengths), [0] * (len(lengths) + 1)
    for stop in range(1, len(lengths) + 1):
        for start in range(stop - 1, -1, -1):
            padded = (stop - start) * lengths[stop - 1]
            if padded > budget and stop - start > 1:
                break
            total = cost[start] + padded + overhead
            if total < cost[stop]:
                cost[stop], cut[stop] = total, start
    chunks, stop = [], len(lengths)
    while stop:
        chunks.append((cut[stop], stop))
        stop = cut[stop]
    return chunks[::-1]


def common_prefix_length(sequences):
    first, n = sequences[0], min(len(s) for s in sequences)
    for k in range(n):
        if any(s[k] != first[k] for s in sequences):
            return k
    return n


class Engine:
    """Batched text generation over any HF causal LM, with a hand-written KV-cache sampling loop.

    Continuous batching: up to batch_size rows decode together; a row stops on its own (EOS, a stop string
    or the token budget) and frees its slot, and the next prompts of the queue are prefilled into the free
    slots, so the batch stays full until the queue is empty. Results are cached on disk when `cache_dir`
    is given."""

    def __init__(
        self,
        model_path=None,
        dtype="float32",
        device="cpu",
        batch_size=128,
        cache_dir=None,
        rank=0,
        model=None,
        tokenizer=None,
        prefill_tokens=2048,
        share_prefix=True,
        progress=False,
    ):
        if model is None:
            model_path = model_path or default_model_path()
            model, tokenizer = load_model(model_path, dtype, device)
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.batch_size, self.prefill_tokens, self.share_prefix = (
            batch_size,
            prefill_tokens,
            share_prefix,
        )
        self.progress = progress  # a tqdm bar over the sequences of long generate() calls
        # what another engine on the same machine and cache needs (eval's leader=PATH)
        self.settings = {
            "dtype": dtype,
            "device": device,
            "batch_size": batch_size,
            "cache_dir": cache_dir,
            "rank": rank,
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
        # models whose KV cache is a plain one (not sliding-window, say) get the engine's own slot cache
        probe = DynamicCache(config=model.config)
        self.continuous = all(type(layer) is DynamicLayer for layer in probe.layers)
        self.n_layers = len(probe.layers)
        self.cache = GenerationCache(cache_dir, rank) if cache_dir else None
        # the fp32 CPU Linear layers run through oneDNN inside the engine's forward passes (faster than the
        # default MKL path for the engine's skinny matmuls: README, "The engine")
        self.linears = (
            OneDNNLinears(model) if torch.backends.mkldnn.is_available() else nullcontext()
        )
        self.stats = {
            "calls": 0,
            "cache_hits": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "prefill_tokens": 0,
            "prefill_s": 0.0,
        }  # prefill_s: seconds spent prefilling prompts

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
    ):
        """One Completion per prompt; `seeds[i]` makes prompt i's sample reproducible.
        return_tokens: also return the sampled token ids (for training on them); bypasses the cache."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        params = {
            "max_new_tokens": max_new_tokens,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "stop": list(stop),
        }
        if any(not prompt for prompt in prompts):
            raise ValueError(f"prompt {[bool(p) for p in prompts].index(False)} is empty")
        keys = [
            GenerationCache.key(self.model_id, prompt, params, int(seed))
            for prompt, seed in zip(prompts, seeds)
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
            self.sample(
                [ids for _, _, ids in todo],
                [seeds[i] for i, _, _ in todo],
                **params,
                keep_eos=return_tokens,
                on_finish=finished,
            )
        return results

    def continuation_logprobs(self, prompts, continuations):
        """Summed log p(continuation | prompt) of each continuation's whole token sequence, teacher-forced
        after each prompt: a (len(prompts), len(continuations)) float tensor. A continuation is a string
        (encoded on its own, as `encode` does) or a list of token ids. No sampling: one forward pass per
        chunk over the rows prompt + continuation, the prompt running once as their shared prefix. Cached
        per (prompt, continuations)."""
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
        for chunk in (todo[k : k + self.batch_size] for k in range(0, len(todo), self.batch_size)):
            # one row per distinct prompt + continuation[:-1]: one-token continuations share the prompt's row
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
        """Cached values (None where absent or not `fresh`) and the misses as (index, key, token ids),
        sorted by token order so that prompts sharing a prefix end up side by side."""
        hits = [self.cache.get(key) if self.cache and use_cache else None for key in keys]
        hits = [hit if hit is not None and fresh(hit) else None for hit in hits]
        self.stats["cache_hits"] += sum(hit is not None for hit in hits)
        todo = sorted(
            ((i, keys[i], self.encode(prompts[i])) for i, hit in enumerate(hits) if hit is None),
            key=lambda item: item[2],
        )
        return hits, todo

    def _left_pad(self, batch_ids):
        width = max(len(ids) for ids in batch_ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(batch_ids), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(batch_ids), width), dtype=torch.long)
        for row, ids in enumerate(batch_ids):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _forward(self, input_ids, attention_mask, cache, positions=None, logits_to_keep=1):
        if (
            positions is None
        ):  # positions count real tokens only, as in HF generate: padding never shifts a row
            positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        with self.linears:
            return self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            ).logits

    def prefill(self, batch_ids, keep=1, cache=None, mask=None, row=0, end=None):
        """Run the prompts; return the logits at each one's last `keep` positions, (rows, keep, vocab).

        With a slot `cache` (and its attention `mask`), prompt k's keys and values also go to slot row + k,
        right-aligned at column `end`. Two savings over one padded forward pass. Prefix sharing: consecutive
        prompts with a common token prefix (the chat template and instructions of every prompt; the question
        in the prompts of one team) form a group whose prefix runs once, and each row continues from its
        group's keys and values; positions count real tokens only, so a prefix has the same keys in every
        row. Chunking: the rows run in chunks of about `prefill_tokens` tokens, each padded only to its own
        width (long padded batches waste compute and build huge attention score tensors)."""
        if not self.continuous:  # e.g. sliding-window models: one padded pass into HF's own cache
            input_ids, attention_mask = self._left_pad(batch_ids)
            logits = self._forward(
                input_ids,
                attention_mask,
                DynamicCache(config=self.model.config) if cache is None else cache,
                logits_to_keep=keep,
            )
            if mask is not None:
                mask[row : row + len(batch_ids)] = 0
                mask[row : row + len(batch_ids), end - attention_mask.shape[1] : end] = (
                    attention_mask
                )
            return logits
        groups = (
            prefix_groups(batch_ids, keep=keep) if self.share_prefix else [(0, len(batch_ids), 0)]
        )
        prefixes = [batch_ids[start][:shared] for start, _, shared in groups if shared]
        suffixes = [ids[shared:] for start, stop, shared in groups for ids in batch_ids[start:stop]]
        self.stats["prefill_tokens"] += sum(
            map(len, suffixes)
        )  # tokens actually run (prefixes: below)
        past = None
        if prefixes:  # the groups' prefixes, sharing their own prefixes in turn, go to a slot cache of their own
            width = max(map(len, prefixes))
            store = Cache(
                layers=[PreallocatedLayer(len(prefixes) + 1, width) for _ in range(self.n_layers)]
            )
            store_mask = torch.zeros(
                (len(prefixes) + 1, width), dtype=torch.long, device=self.device
            )
            self.prefill(prefixes, 1, store, store_mask, 0, width)
            slot = [
                sum(1 for g in groups[:k] if g[2])
                if groups[k][2]
                else len(prefixes)  # the last slot: empty
                for k in range(len(groups))
            ]
            past = (
                store,
                store_mask,
                torch.tensor(
                    [
                        slot[k]
                        for k, (start, stop, _) in enumerate(groups)
                        for _ in range(start, stop)
                    ]
                ),
            )
        return self._run_rows(suffixes, keep, cache, mask, row, end, past)

    def _run_rows(self, rows_ids, keep, cache, mask, row, end, past=None):
        """Run token rows in padded chunks of rows of similar length (padded_chunks); row k continues from slot
        past_of[k] of a `past` slot cache (store, store mask, past_of). With a `cache`, row k's real columns
        go to slot row + k, right-aligned at column `end`."""
        order = sorted(range(len(rows_ids)), key=lambda k: len(rows_ids[k]))
        logits = [None] * len(rows_ids)
        for start, stop in padded_chunks([len(rows_ids[k]) for k in order], self.prefill_tokens):
            rows = torch.tensor(order[start:stop])
            chunk_ids, chunk_mask = self._left_pad([rows_ids[k] for k in order[start:stop]])
            chunk_cache = DynamicCache(config=self.model.config)
            if (
                past is not None
            ):  # the chunk's rows start from their prefixes (right-aligned in the store)
                store, store_mask, past_of = past
                index = past_of[rows]
                width = int(store_mask[index].sum(1).max())
                for layer, store_layer in zip(chunk_cache.layers, store.layers):
                    layer.update(
                        store_layer.key_buffer[index, :, store_layer.capacity - width :],
                        store_layer.value_buffer[index, :, store_layer.capacity - width :],
                    )
                chunk_mask = torch.cat(
                    [store_mask[index, store_mask.shape[1] - width :], chunk_mask], dim=1
                )
            for k, row_logits in zip(
                order[start:stop],
                self._forward(chunk_ids, chunk_mask, chunk_cache, logits_to_keep=keep),
            ):
                logits[k] = row_logits
            if cache is not None:
                width = int(chunk_mask.sum(1).max())
                # each row's real columns in order, right-aligned (a stable sort puts the padding first)
                columns = chunk_mask.argsort(dim=1, stable=True)[:, -width:]
                mask[row + rows] = 0
                mask[row + rows, end - width : end] = chunk_mask.gather(1, columns)
                for layer, chunk_layer in zip(cache.layers, chunk_cache.layers):
                    layer.write(row + rows, chunk_layer.keys, chunk_layer.values, columns, end)
        return torch.stack(logits)

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
    ):
        """The sampling loop, with continuous batching: one Sample per prompt, in order; on_finish(i, sample)
        is called as soon as prompt i is done. The ids end before the EOS unless keep_eos (training needs the
        very EOS id that was sampled). The prompts wait in a queue in token order (prompts that share a
        prefix are prefilled together). Up to batch_size rows, each in a slot of a preallocated KV cache,
        decode one token per step, all writing to column `end`, each with its own positions and attention
        mask. A finished row leaves, the last row moving into its slot; once `refill` slots are free (a few
        prompts at a time keep a team's prompts and their shared prefix together: 9% faster than one at a
        time), the next prompts are prefilled into them, right-aligned at `end`. Columns no live row uses
        leave the window; when the window reaches the end of the buffer it slides back to the left."""
        queue = deque(sorted(range(len(batch_ids)), key=lambda i: batch_ids[i]))
        longest, slots = max(map(len, batch_ids)), min(self.batch_size, len(batch_ids))
        capacity, refill = longest + 2 * max_new_tokens, max(1, slots // 8)
        mask = torch.zeros((slots, capacity), dtype=torch.long, device=self.device)
        positions = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        cache = Cache(layers=[PreallocatedLayer(slots, capacity) for _ in range(self.n_layers)])
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        rows, tokens, logprobs, results = (
            [],
            {},
            {},
            [None] * len(batch_ids),
        )  # rows: the prompt in each slot
        start, end = (
            0,
            longest,
        )  # the window of columns the live rows use; `end` takes the next token
        bar = tqdm(
            total=len(batch_ids),
            desc="generate",
            unit="seq",
            leave=False,
            disable=not self.progress or len(batch_ids) <= self.batch_size,
        )
        while queue or rows:
            if queue and slots - len(rows) >= (
                min(refill, len(queue)) if self.continuous else slots
            ):
                new = [queue.popleft() for _ in range(min(slots - len(rows), len(queue)))]
                if (
                    not self.continuous
                ):  # HF's own cache: a padded batch at a time, starting at column 0
                    cache, end = (
                        DynamicCache(config=self.model.config),
                        max(len(batch_ids[i]) for i in new),
                    )
                began = time.perf_counter()
                new_logits = self.prefill(
                    [batch_ids[i] for i in new], cache=cache, mask=mask, row=len(rows), end=end
                )[:, -1]
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
            chosen = (
                torch.log_softmax(logits.float(), -1)
                .gather(-1, next_tokens[:, None])
                .squeeze(-1)
                .tolist()
            )
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
            if len(alive) < len(
                rows
            ):  # finished rows leave: the last live rows move into their slots
                tail, kept = [s for s in alive if s >= len(alive)], set(alive)
                order = torch.tensor(
                    [s if s in kept else tail.pop() for s in range(len(alive))], dtype=torch.long
                )
                cache.batch_select_indices(order)
                mask[: len(order)], positions[: len(order)] = mask[order], positions[order]
                next_tokens, rows = next_tokens[order], [rows[s] for s in order.tolist()]
            if not rows:
                continue
            if (
                self.continuous and end == capacity
            ):  # slide the window back, leaving room for the longest prompt
                to = max(0, longest - (end - start))
                mask[: len(rows)] = torch.cat(
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
