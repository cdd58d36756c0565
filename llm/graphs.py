"""The engine's decode step at static shapes, replayed as CUDA graphs: the default on a GPU.

On a GPU a decode step of a small model is bound by kernel launches, not by arithmetic: hundreds of
small kernels, each launched from Python. A CUDA graph records a step's kernels once and replays
them with one launch, which needs every tensor the step touches at a fixed address and of a fixed
shape. So here:
  - the slot cache (llm/kvcache.py) and the step's inputs (tokens, positions, attention mask,
    each row's adapter, the column written) live in buffers kept from one engine call to the next;
    the engine refills them in place between steps (continuous batching is unchanged);
  - live rows are padded to a row bucket (1, 2, 4, ... up to the slots) and attention runs over the
    first `width` columns of the cache, a multiple of WIDTH_STEP: one graph per (rows, width)
    bucket, captured the first time it is needed and replayed from then on;
  - each row's LoRA adapter is chosen by tensor indexing inside the step (lora.selecting with a
    tensor), so a graph serves any mix of adapters.
Rows of a bucket beyond the live ones compute garbage nobody reads; they attend over zeros or over
a departed row's finite keys (the mask adds the dtype's minimum, never -inf, so even a row whose
mask is all zeros stays finite, and no NaN can reach a key that a later row reads). Prefill and
sampling stay eager.

On CPU the same step runs without capture (mode "static"), reading the same buffers, so tests check
here what a graph replays there: the step's tokens against the eager step's.

  StaticDecoder   - the kept buffers, the buckets, capture and replay
  row_buckets     - the row buckets for a number of slots
  fold_attention  - SDPA for one query token per row, the query heads folded onto their KV head
"""

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

from llm import lora
from llm.kvcache import PreallocatedLayer

# attention widths are multiples of this many columns (fewer graphs against less wasted attention)
WIDTH_STEP = 128
# the kept slot cache grows in steps of this many columns (a new size drops every graph); a
# multiple of WIDTH_STEP, so that a width never passes the capacity
CAPACITY_STEP = 256


def row_buckets(slots):
    """1, 2, 4, ... below `slots`, then `slots` itself."""
    buckets = [1]
    while buckets[-1] * 2 < slots:
        buckets.append(buckets[-1] * 2)
    return buckets + [slots] if slots > 1 else buckets


def fold_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Attention of one query token per row: the query heads that share a KV head are folded into
    the query axis, (rows, kv heads, group, dim), so SDPA reads each key once and no key is copied
    per query head (repeat_kv would copy the whole cache every step). Registered with transformers
    as "fold_decode" and used by the static step when the model runs SDPA."""
    rows, heads, _, dim = query.shape
    folded = query.reshape(rows, key.shape[1], heads // key.shape[1], dim)
    out = F.scaled_dot_product_attention(
        folded, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


class StaticLayer(DynamicLayer):
    """A slot cache layer seen by one bucket: the first `rows` slots and `width` columns of its
    buffers; the step writes its keys and values into column `column` (a one-element tensor) and
    attends over all `width` columns."""

    is_compileable = True

    def __init__(self, layer, rows, width, column):
        super().__init__()
        self.keys = layer.key_buffer[:rows, :, :width]
        self.values = layer.value_buffer[:rows, :, :width]
        self.column, self.is_initialized = column, True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values


class StaticDecoder:
    """The engine's decode state kept between calls, and its step at static shapes.

    begin() hands the engine its slot cache and input buffers for one call (growing them, and
    dropping every graph, when the call needs more slots or columns than they have); the engine
    writes rows into them as before; step() runs the live rows' forward pass, as a CUDA graph
    replay when `capture` (on a GPU)."""

    def __init__(self, model, device, n_layers, capture, compiled=False):
        self.model, self.device, self.n_layers = model, torch.device(device), n_layers
        self.capture = capture
        # compiled: the step's kernels fused by torch.compile (one compile for every bucket)
        self.forward = torch.compile(self._forward, dynamic=True) if compiled else self._forward
        self.slots, self.capacity, self.weights = 0, 0, None
        self.drop_graphs()
        # transformers' attention registry, imported here: it loads its modeling code, which a
        # script that only checks its flags does not need
        from transformers import AttentionInterface

        AttentionInterface.register("fold_decode", fold_attention)

    def begin(self, slots, capacity):
        """(cache, mask, positions, slot adapters) for an engine call of up to `slots` rows and
        `capacity` columns (the engine rewrites a row's whole mask when it prefills one)."""
        if slots > self.slots or capacity > self.capacity:
            self.slots = max(slots, self.slots)
            step = CAPACITY_STEP
            self.capacity = max(self.capacity, -(-capacity // step) * step)
            self.cache = Cache(
                layers=[PreallocatedLayer(self.slots, self.capacity) for _ in range(self.n_layers)]
            )
            new = dict(dtype=torch.long, device=self.device)
            self.mask = torch.zeros((self.slots, self.capacity), **new)
            self.positions = torch.zeros((self.slots, 1), **new)
            self.adapters = torch.full((self.slots,), -1, **new)
            self.tokens = torch.zeros(self.slots, **new)
            self.column = torch.zeros(1, **new)
            self.drop_graphs()
        # a graph reads the weights where they were at capture: new tensors (another dtype, a
        # loaded state dict, one more adapter) make every graph stale
        weights = [(p.data_ptr(), p.shape, p.dtype) for p in self.model.parameters()]
        if weights != self.weights:
            self.drop_graphs()
            self.weights = weights
        # adapters trained since the last call: their stacked copies refreshed in place
        for layer in lora.lora_layers(self.model).values():
            layer.stacked()
        return self.cache, self.mask, self.positions, self.adapters

    def drop_graphs(self):
        """No graph kept; the next captures go to a fresh memory pool."""
        self.graphs = {}
        # a pool whose graphs are all gone takes no new capture while tensors it handed out (a
        # dropped graph's logits) live on: CUDA's allocator refuses it, so each set of graphs
        # gets its own pool, and the old one is freed with its last tensor
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None

    def step(self, tokens, end):
        """The next-token logits of the live rows 0 .. len(tokens) - 1, whose new tokens
        `tokens` go to column `end` (their mask already holds it)."""
        live = len(tokens)
        rows = next(b for b in row_buckets(self.slots) if b >= live)
        # within the capacity, a multiple of WIDTH_STEP past `end`
        width = -(-(end + 1) // WIDTH_STEP) * WIDTH_STEP
        self.tokens[:live] = tokens
        self.column.fill_(end)
        run = self.graphs.get((rows, width)) or self._prepare(rows, width)
        return run()[:live]

    def _prepare(self, rows, width):
        """The step of one bucket: a function of the kept buffers alone, captured as a CUDA graph
        when `capture` (after one warm-up run, which triggers lazy initializations and compiles)."""
        args = (
            self.tokens[:rows, None],
            self.mask[:rows, :width],
            self.positions[:rows],
            [StaticLayer(layer, rows, width, self.column) for layer in self.cache.layers],
        )

        adapters, config = self.adapters[:rows], self.model.config
        # one query token per row: SDPA over the KV heads (fold_attention)
        folded = "fold_decode" if config._attn_implementation == "sdpa" else None

        def run():
            implementation = config._attn_implementation
            config._attn_implementation = folded or implementation
            try:
                # the mask of each row's adapter, from the kept buffer (no Python per row)
                with lora.selecting(self.model, adapters, mixed=True):
                    return self.forward(*args)
            finally:
                config._attn_implementation = implementation

        if self.capture:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = run()

            def replay():
                graph.replay()
                return logits

            run = replay
        self.graphs[(rows, width)] = run
        return run

    def _forward(self, tokens, mask, positions, layers):
        dtype = self.model.get_input_embeddings().weight.dtype
        # additive: 0 where a row attends, the dtype's minimum elsewhere (finite: see the top)
        bias = ((1 - mask).to(dtype) * torch.finfo(dtype).min)[:, None, None, :]
        return self.model(
            input_ids=tokens,
            attention_mask=bias,
            position_ids=positions,
            past_key_values=Cache(layers=layers),
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
