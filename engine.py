"""The engine: batched text generation over any HF causal LM, and an on-disk cache of generations.

A short hand-written sampling loop with a KV cache, tested token for token against HF `generate`
(tests/test_engine.py). Every script reaches it through deliberate.py (`deliberate.Engine`); backbone.py
loads the model itself. Read top to bottom:
  Completion, GenerationCache   - one generated text, and the on-disk cache keyed by model, prompt, params, seed
  pick_next_tokens              - temperature / top-p sampling, one torch.Generator per row
  prefix_groups                 - rows that share a long prompt prefix (a debate's agents) prefill it once
  Engine                        - sort, batch, prefill, decode; finished rows leave the batch
  PreallocatedLayer             - a KV cache layer that grows in place instead of concatenating every step
"""
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from backbone import default_model_path, load_model


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish: str  # "eos", "stop" (a stop string) or "length"
    cached: bool = False
    token_ids: list | None = None  # with generate(return_tokens=True): the sampled ids, the EOS included
    token_logprobs: list | None = None  # log p of each sampled token under the untempered model


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
    """Next token per row: argmax when temperature == 0, else temperature + top-p (nucleus) sampling.

    Each row draws one uniform from its own seeded generator and inverts the nucleus CDF, so the
    randomness of a row depends only on its own seed, never on which other rows share the batch. (Its
    logits can still differ in the last float32 bits between batch shapes, as CPU matmuls round
    differently for different row counts; in float64 a row's sample is exactly batch-independent.)"""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(-1)
    # keep a token while the mass strictly before it is < top_p (the top token is always kept)
    sorted_probs = sorted_probs.masked_fill(cumulative - sorted_probs >= top_p, 0.0)
    cdf = sorted_probs.cumsum(-1)
    u = torch.stack([torch.rand((), generator=g) for g in generators]).to(cdf) * cdf[:, -1]
    index = torch.searchsorted(cdf, u[:, None]).clamp_(max=cdf.shape[-1] - 1)
    return order.gather(-1, index).squeeze(-1)


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


def prefix_groups(batch_ids, min_shared=16):
    """Split consecutive rows into groups that share a token prefix: (start, stop, shared length).

    A row joins the group while the common prefix stays >= min_shared tokens and keeps at least half of
    the group's prefix (prompts of one question share more than the template; another question breaks
    the group rather than shrink the shared prefix to the template)."""
    groups, start = [], 0
    while start < len(batch_ids):
        stop, shared = start + 1, None
        while stop < len(batch_ids):
            longer = common_prefix_length([batch_ids[start], batch_ids[stop]])
            longer = longer if shared is None else min(shared, longer)
            if longer < min_shared or (shared is not None and longer < shared // 2):
                break
            shared, stop = longer, stop + 1
        # a prefix is worth running once only when several rows use it; each row keeps >= 1 own token
        shared = min(shared, min(len(ids) for ids in batch_ids[start:stop]) - 1) if stop - start > 1 else 0
        shared = shared if shared >= min_shared else 0
        if groups and not shared and not groups[-1][2]:  # rows without a prefix still prefill together
            groups[-1] = (groups[-1][0], stop, 0)
        else:
            groups.append((start, stop, shared))
        start = stop
    return groups


def common_prefix_length(sequences):
    first, n = sequences[0], min(len(s) for s in sequences)
    for k in range(n):
        if any(s[k] != first[k] for s in sequences):
            return k
    return n


class Engine:
    """Batched text generation over any HF causal LM, with a hand-written KV-cache sampling loop.

    Prompts are sorted by token order and cut into batches (prompts that share a prefix end up side by
    side, and similar prompts need less padding); within a batch every row
    stops on its own (EOS, a stop string or the token budget) and finished rows leave the batch, so no
    compute is spent on rows that are done. Results are cached on disk when `cache_dir` is given."""

    def __init__(self, model_path=None, dtype="float32", device="cpu", batch_size=64, cache_dir=None,
                 rank=0, model=None, tokenizer=None, prefill_tokens=2048, share_prefix=True,
                 progress=False):
        if model is None:
            model_path = model_path or default_model_path()
            model, tokenizer = load_model(model_path, dtype, device)
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.batch_size, self.prefill_tokens, self.share_prefix = batch_size, prefill_tokens, share_prefix
        self.progress = progress  # a tqdm bar over the sequences of long generate() calls
        # what another engine on the same machine and cache needs (eval's leader=PATH)
        self.settings = {"dtype": dtype, "device": device, "batch_size": batch_size, "cache_dir": cache_dir,
                         "rank": rank, "progress": progress}
        # the cache key names the weights and the dtype: both change the text
        self.model_id = f"{model_path or model.name_or_path}:{dtype if model_path else model.dtype}:" \
                        f"{weights_fingerprint(model)}"
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {t for t in eos + [tokenizer.eos_token_id] if t is not None}
        self.cache = GenerationCache(cache_dir, rank) if cache_dir else None
        self.stats = {"calls": 0, "cache_hits": 0, "prompt_tokens": 0, "completion_tokens": 0,
                      "prefill_tokens": 0}

    def chat(self, user, system=None):
        """A prompt string in the model's chat format (plain text for models without a template)."""
        if not self.tokenizer.chat_template:
            return (system + "\n\n" if system else "") + user + "\n"
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, prompt):
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def generate(self, prompts, seeds, max_new_tokens=256, temperature=0.7, top_p=1.0, stop=(),
                 return_tokens=False):
        """One Completion per prompt; `seeds[i]` makes prompt i's sample reproducible.
        return_tokens: also return the sampled token ids (for training on them); bypasses the cache."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        params = {"max_new_tokens": max_new_tokens, "temperature": float(temperature),
                  "top_p": float(top_p), "stop": list(stop)}
        if any(not prompt for prompt in prompts):
            raise ValueError(f"prompt {[bool(p) for p in prompts].index(False)} is empty")
        keys = [GenerationCache.key(self.model_id, prompt, params, int(seed))
                for prompt, seed in zip(prompts, seeds)]
        hits, batches = self._lookup(keys, prompts, use_cache=not return_tokens)
        results = [None if hit is None else Completion(**hit, cached=True) for hit in hits]
        bar = tqdm(total=sum(map(len, batches)), desc="generate", unit="seq", leave=False,
                   disable=not self.progress or len(batches) < 2)
        for chunk in batches:
            outputs = self.sample([ids for _, _, ids in chunk], [seeds[i] for i, _, _ in chunk], **params,
                                  keep_eos=return_tokens)
            for (i, key, ids), (tokens, finish, n_generated) in zip(chunk, outputs):
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                for s in stop:  # the text ends before the stop string
                    text = text.split(s)[0] if s in text else text
                results[i] = Completion(text, len(ids), n_generated, finish,
                                        token_ids=tokens if return_tokens else None)
                if self.cache and not return_tokens:
                    self.cache.put(key, {"text": text, "prompt_tokens": len(ids),
                                         "completion_tokens": n_generated, "finish": finish})
                self.stats["calls"] += 1
                self.stats["prompt_tokens"] += len(ids)
                self.stats["completion_tokens"] += n_generated
            bar.update(len(chunk))
        bar.close()
        return results

    def next_token_logprobs(self, prompts, token_ids):
        """log p(token | prompt) at the position after each prompt, for each id in `token_ids`: one forward
        pass, no sampling. Returns a (len(prompts), len(token_ids)) float tensor (cached per prompt)."""
        keys = [GenerationCache.key(self.model_id, "next_token_logprobs", prompt, list(token_ids))
                for prompt in prompts]
        results, batches = self._lookup(keys, prompts)
        with torch.inference_mode():
            for chunk in batches:
                ids = [item[2] for item in chunk]
                logits, _, _ = self.prefill(ids, capacity=max(len(x) for x in ids))
                logprobs = torch.log_softmax(logits.float(), -1)[:, token_ids].tolist()
                for (i, key, prompt_ids), row in zip(chunk, logprobs):
                    results[i] = row
                    if self.cache:
                        self.cache.put(key, row)
                    self.stats["calls"] += 1
                    self.stats["prompt_tokens"] += len(prompt_ids)
        return torch.tensor(results)

    def _lookup(self, keys, prompts, use_cache=True):
        """Cached values (None where absent) and the misses as batches of (index, key, token ids),
        sorted by token order so that prompts sharing a prefix land in the same batch."""
        hits = [self.cache.get(key) if self.cache and use_cache else None for key in keys]
        self.stats["cache_hits"] += sum(hit is not None for hit in hits)
        todo = sorted(((i, keys[i], self.encode(prompts[i])) for i, hit in enumerate(hits) if hit is None),
                      key=lambda item: item[2])
        return hits, [todo[k:k + self.batch_size] for k in range(0, len(todo), self.batch_size)]

    def _left_pad(self, batch_ids):
        width = max(len(ids) for ids in batch_ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(batch_ids), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(batch_ids), width), dtype=torch.long)
        for row, ids in enumerate(batch_ids):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention_mask[row, width - len(ids):] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _forward(self, input_ids, attention_mask, cache, positions=None, logits_to_keep=1):
        if positions is None:  # positions count real tokens only, as in HF generate: padding never shifts a row
            positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1]:]
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                          past_key_values=cache, use_cache=True, logits_to_keep=logits_to_keep).logits

    def prefill(self, batch_ids, capacity):
        """Run the prompts and return (last-position logits, KV cache, attention mask).

        Two savings over one padded forward pass. Prefix sharing: consecutive prompts with a common token
        prefix (the chat template and instructions of every prompt; the question in the prompts of one
        team) form a group whose prefix runs once, its keys and
        values copied to every row of the group; positions count real tokens only, so a prefix has the
        same keys in every row. Chunking: the rest runs in chunks of about `prefill_tokens` tokens, each
        padded only to its own width (long padded batches waste compute and build huge attention score
        tensors). Row layout in the cache: [prefix | padding | suffix], right-aligned."""
        probe = DynamicCache(config=self.model.config)
        if not all(type(layer) is DynamicLayer for layer in probe.layers):  # e.g. sliding-window models
            input_ids, attention_mask = self._left_pad(batch_ids)
            return self._forward(input_ids, attention_mask, probe)[:, -1], probe, attention_mask
        width = max(len(ids) for ids in batch_ids)
        cache = Cache(layers=[PreallocatedLayer(capacity) for _ in probe.layers])
        logits = []
        groups = prefix_groups(batch_ids) if self.share_prefix else [(0, len(batch_ids), 0)]
        attention_mask = torch.zeros((len(batch_ids), width), dtype=torch.long, device=self.device)
        for group_start, group_stop, shared in groups:
            prefix_cache = DynamicCache(config=self.model.config)
            if shared:
                prefix = torch.tensor([batch_ids[group_start][:shared]], device=self.device)
                self._forward(prefix, torch.ones_like(prefix), prefix_cache)
            suffixes = [ids[shared:] for ids in batch_ids[group_start:group_stop]]
            self.stats["prefill_tokens"] += shared + sum(map(len, suffixes))  # tokens actually run
            start = 0
            while start < len(suffixes):
                stop = start + 1  # grow the chunk while it stays within the token budget
                while stop < len(suffixes) and (stop + 1 - start) * max(
                        len(s) for s in suffixes[start:stop + 1]) <= self.prefill_tokens:
                    stop += 1
                chunk_ids, chunk_mask = self._left_pad(suffixes[start:stop])
                rows = stop - start
                chunk_cache = DynamicCache(config=self.model.config)
                if shared:  # every row of the chunk starts from the group's prefix
                    for layer, prefix_layer in zip(chunk_cache.layers, prefix_cache.layers):
                        layer.update(prefix_layer.keys.expand(rows, -1, -1, -1),
                                     prefix_layer.values.expand(rows, -1, -1, -1))
                    chunk_mask = torch.cat([chunk_mask.new_ones(rows, shared), chunk_mask], dim=1)
                logits.append(self._forward(chunk_ids, chunk_mask, chunk_cache)[:, -1])
                for layer, chunk_layer in zip(cache.layers, chunk_cache.layers):
                    layer.write(group_start + start, group_start + stop, width, shared, chunk_layer.keys,
                                chunk_layer.values, len(batch_ids))
                start = stop
            attention_mask[group_start:group_stop, :shared] = 1
            for row, suffix in enumerate(suffixes, start=group_start):
                attention_mask[row, width - len(suffix):] = 1
        return torch.cat(logits), cache, attention_mask

    @torch.inference_mode()
    def sample(self, batch_ids, seeds, max_new_tokens=256, temperature=0.7, top_p=1.0, stop=(), keep_eos=False):
        """The sampling loop. Returns (completion token ids, finish reason, tokens generated); the ids end
        before the EOS token unless keep_eos (training needs the very EOS id that was sampled)."""
        width = max(len(ids) for ids in batch_ids)
        logits, cache, attention_mask = self.prefill(batch_ids, capacity=width + max_new_tokens)
        next_position = torch.tensor([[len(ids)] for ids in batch_ids], device=self.device)
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        active = list(range(len(batch_ids)))  # the original row of each row still in the batch
        tokens_out = [[] for _ in batch_ids]
        finish = [None] * len(batch_ids)
        for _ in range(max_new_tokens):
            next_tokens = pick_next_tokens(logits, [generators[r] for r in active], temperature, top_p)
            keep = []
            for i, (row, token) in enumerate(zip(active, next_tokens.tolist())):
                if token in self.eos_ids:
                    finish[row] = "eos"
                    if keep_eos:
                        tokens_out[row].append(token)
                    continue
                tokens_out[row].append(token)
                if stop and any(s in self.tokenizer.decode(tokens_out[row][-16:]) for s in stop):
                    finish[row] = "stop"
                elif len(tokens_out[row]) >= max_new_tokens:
                    finish[row] = "length"
                else:
                    keep.append(i)
            if not keep:
                break
            if len(keep) < len(active):  # finished rows leave the batch and its KV cache
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                attention_mask, next_position = attention_mask[index], next_position[index]
                next_tokens = next_tokens[index]
                active = [active[i] for i in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(active), 1)], dim=1)
            logits = self._forward(next_tokens[:, None], attention_mask, cache, next_position)[:, -1]
            next_position = next_position + 1
        return [(tokens_out[r], finish[r] or "length", len(tokens_out[r]) + (finish[r] == "eos" and not keep_eos))
                for r in range(len(batch_ids))]


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer that writes new keys/values into a buffer allocated once.

    HF's DynamicLayer concatenates on every token, copying the whole cache each step (for 64 rows of
    500 tokens that is about 1 GB of copies per step on this model); here a step writes one column."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def write(self, start, stop, width, shared, keys, values, batch):
        """Rows start:stop get `shared` prefix columns on the left, the rest right-aligned at `width`."""
        if not self.is_initialized:
            shape = (batch, keys.shape[1], self.capacity, keys.shape[3])
            self.key_buffer, self.value_buffer = keys.new_zeros(shape), values.new_zeros(shape)
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        rest = keys.shape[2] - shared
        for buffer, states in ((self.key_buffer, keys), (self.value_buffer, values)):
            buffer[start:stop, :, :shared] = states[:, :, :shared]
            buffer[start:stop, :, width - rest:width] = states[:, :, shared:]
        self.length = width
        self._views()

    def _views(self):
        self.keys = self.key_buffer[:, :, :self.length]
        self.values = self.value_buffer[:, :, :self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[2]
        if self.length + new > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded")
        self.key_buffer[:, :, self.length:self.length + new] = key_states
        self.value_buffer[:, :, self.length:self.length + new] = value_states
        self.length += new
        self._views()
        return self.keys, self.values

    def get_seq_length(self):
        return self.length

    def batch_select_indices(self, indices):
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self._views()
