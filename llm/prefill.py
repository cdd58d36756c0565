"""How the engine runs prompts into its KV cache (Engine inherits Prefill): prefix sharing and
padded chunks.

  Prefill               - prefill (prefix sharing, chunking), the padded forward pass under it
  prefix_groups         - rows that share a long prompt prefix (a debate's agents) prefill it once
  padded_chunks         - prefill chunks of rows of similar length (little padding)
  common_prefix_length  - the length of the token prefix that sequences share
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from llm import lora
from llm.kvcache import PreallocatedLayer


class Prefill:
    """The prefill half of Engine (llm/engine.py), which sets what these methods read: model,
    tokenizer, device, linears, continuous, share_prefix, prefill_tokens, n_layers and stats."""

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
        # positions count real tokens only, as in HF generate: padding never shifts a row
        if positions is None:
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

    def prefill_slots(self, batch_ids, slot_adapters, cache, mask, row, end):
        """Prefill new rows into slots row, row + 1, ... of the engine's slot cache; returns their
        next-token logits. Each run of rows with one adapter (slot_adapters) prefills on its own:
        a prefix is shared only under the same adapter."""
        adapters = slot_adapters[row : row + len(batch_ids)].tolist()
        logits = []
        for first, last in lora.adapter_runs(adapters, split=self.continuous):
            with lora.selecting(self.model, slot_adapters[row + first : row + last]):
                run = self.prefill(
                    batch_ids[first:last], cache=cache, mask=mask, row=row + first, end=end
                )
            logits.append(run[:, -1])
        return torch.cat(logits)

    def prefill(self, batch_ids, keep=1, cache=None, mask=None, row=0, end=None):
        """Run the prompts; return the logits at each one's last `keep` positions, (rows, keep,
        vocab).

        With a slot `cache` (and its attention `mask`), prompt k's keys and values also go to slot
        row + k, right-aligned at column `end`. Two savings over one padded forward pass. Prefix
        sharing: consecutive prompts with a common token prefix (the chat template and instructions
        of every prompt; the question in the prompts of one team) form a group whose prefix runs
        once, and each row continues from its group's keys and values; positions count real tokens
        only, so a prefix has the same keys in every row. Chunking: the rows run in chunks of about
        `prefill_tokens` tokens, each padded only to its own width (long padded batches waste
        compute and build huge attention score tensors)."""
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
                width = attention_mask.shape[1]
                mask[row : row + len(batch_ids), end - width : end] = attention_mask
            return logits
        groups = (
            prefix_groups(batch_ids, keep=keep) if self.share_prefix else [(0, len(batch_ids), 0)]
        )
        prefixes = [batch_ids[start][:shared] for start, _, shared in groups if shared]
        suffixes = [ids[shared:] for start, stop, shared in groups for ids in batch_ids[start:stop]]
        # tokens actually run (prefixes: below)
        self.stats["prefill_tokens"] += sum(map(len, suffixes))
        past = None
        # the groups' prefixes, sharing their own prefixes in turn, go to a slot cache of their own
        if prefixes:
            width = max(map(len, prefixes))
            store = Cache(
                layers=[PreallocatedLayer(len(prefixes) + 1, width) for _ in range(self.n_layers)]
            )
            store_mask = torch.zeros(
                (len(prefixes) + 1, width), dtype=torch.long, device=self.device
            )
            self.prefill(prefixes, 1, store, store_mask, 0, width)
            # each group's slot in the store; a group without a prefix gets the last slot: empty
            slot = [
                sum(1 for g in groups[:k] if g[2]) if groups[k][2] else len(prefixes)
                for k in range(len(groups))
            ]
            past_of = [
                slot[k] for k, (start, stop, _) in enumerate(groups) for _ in range(start, stop)
            ]
            past = (store, store_mask, torch.tensor(past_of))
        return self._run_rows(suffixes, keep, cache, mask, row, end, past)

    def _run_rows(self, rows_ids, keep, cache, mask, row, end, past=None):
        """Run token rows in padded chunks of rows of similar length (padded_chunks); row k
        continues from slot past_of[k] of a `past` slot cache (store, store mask, past_of). With a
        `cache`, row k's real columns go to slot row + k, right-aligned at column `end`."""
        order = sorted(range(len(rows_ids)), key=lambda k: len(rows_ids[k]))
        logits = [None] * len(rows_ids)
        for start, stop in padded_chunks([len(rows_ids[k]) for k in order], self.prefill_tokens):
            rows = torch.tensor(order[start:stop])
            chunk_ids, chunk_mask = self._left_pad([rows_ids[k] for k in order[start:stop]])
            chunk_cache = DynamicCache(config=self.model.config)
            # the chunk's rows start from their prefixes (right-aligned in the store)
            if past is not None:
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
                # each row's real columns in order, right-aligned
                # (a stable sort puts the padding first)
                columns = chunk_mask.argsort(dim=1, stable=True)[:, -width:]
                mask[row + rows] = 0
                mask[row + rows, end - width : end] = chunk_mask.gather(1, columns)
                for layer, chunk_layer in zip(cache.layers, chunk_cache.layers):
                    layer.write(row + rows, chunk_layer.keys, chunk_layer.values, columns, end)
        return torch.stack(logits)


def prefix_groups(batch_ids, min_shared=16, keep=1):
    """Split consecutive rows into groups that share a token prefix: (start, stop, shared length).

    A row joins the group while the common prefix stays >= min_shared tokens and keeps at least half
    of the group's prefix (prompts of one question share more than the template; another question
    breaks the group rather than shrink the shared prefix to the template), unless it shares more
    with the row after it: then it starts a tighter group (a team's prompts). prefill() shares the
    template among the groups' prefixes in turn. Each row keeps its last `keep` tokens out of the
    prefix (their logits are wanted)."""
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
        # rows without a prefix still prefill together
        if groups and not shared and not groups[-1][2]:
            groups[-1] = (groups[-1][0], stop, 0)
        else:
            groups.append((start, stop, shared))
        start = stop
    return groups


def padded_chunks(lengths, budget, overhead=256):
    """Split rows sorted by length into consecutive chunks (start, stop), each padded to its longest
    row and within `budget` tokens (a longer row runs alone), with the fewest padded tokens plus
    `overhead` per chunk (smaller chunks make skinnier, less efficient matmuls; 128 to 1024 give the
    same split on the benchmark prompts). Filling each chunk up to the budget instead pads short
    rows to the length of the long ones that follow them: on the 64 prompts of `--bench generate` it
    ran 4391 tokens for 3681 real ones, this split
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
