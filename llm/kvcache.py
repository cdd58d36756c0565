"""What the engine slips under an HF causal LM while it runs it: a KV cache of preallocated slots
and, on CPU, oneDNN for the fp32 Linear layers. Neither changes what the model computes, only where
and how fast.
  PreallocatedLayer   - a KV cache layer of fixed slots that grows in place instead of concatenating
  OneDNNLinears       - the model's fp32 Linear layers through oneDNN while the engine runs it (CPU)
"""

import torch
from transformers.cache_utils import DynamicLayer


class OneDNNLinears:
    """A reusable context: inside it, every fp32 `nn.Linear` of `model` computes through oneDNN's
    matmul (`torch.ops.mkldnn._linear_pointwise`) instead of torch's default MKL sgemm. Measured on
    this machine (README, "The engine"): faster for the engine's 64-128-row decode matmuls, the LM
    head above all. The engine only, and only under no_grad (the op has no backward), so training's
    forward passes through the same model object keep the default path; the same products, summed in
    another order."""

    def __init__(self, model):
        # int8 (quantized modules), bf16 and CUDA layers keep their own path
        self.layers = [
            m
            for m in model.modules()
            if type(m) is torch.nn.Linear
            and m.weight.dtype == torch.float32
            and m.weight.device.type == "cpu"
        ]

    @staticmethod
    def forward(layer, x):
        return torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "none", [], "")

    def __enter__(self):
        if not torch.is_grad_enabled():
            for layer in self.layers:
                layer.forward = self.forward.__get__(layer)
        return self

    def __exit__(self, *exc):
        for layer in self.layers:
            layer.__dict__.pop("forward", None)


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer over buffers allocated once, (slots, heads, capacity, head_dim); the model
    sees the window of rows [0, rows) and columns [start, end). HF's DynamicLayer concatenates on
    every token, copying the whole cache each step (about 1 GB per step for 64 rows of 500 tokens on
    this model); here a step writes one column, and a row that leaves costs a copy of the one row
    moved into its slot."""

    def __init__(self, slots, capacity):
        super().__init__()
        self.slots, self.capacity = slots, capacity
        self.rows, self.start, self.end = 0, 0, 0

    def write(self, slots, keys, values, columns, end):
        """Rows `slots` get the columns `columns` (a row of indices per row) of keys and values,
        ending at `end`."""
        if not self.is_initialized:
            shape = (self.slots, keys.shape[1], self.capacity, keys.shape[3])
            self.key_buffer, self.value_buffer = keys.new_zeros(shape), values.new_zeros(shape)
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        index = columns[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        self.key_buffer[slots, :, end - columns.shape[1] : end] = keys.gather(2, index)
        self.value_buffer[slots, :, end - columns.shape[1] : end] = values.gather(2, index)

    def window(self, rows, start, end):
        self.rows, self.start, self.end = rows, start, end
        self.keys = self.key_buffer[:rows, :, start:end]
        self.values = self.value_buffer[:rows, :, start:end]

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[2]
        self.key_buffer[: self.rows, :, self.end : self.end + new] = key_states
        self.value_buffer[: self.rows, :, self.end : self.end + new] = value_states
        self.window(self.rows, self.start, self.end + new)
        return self.keys, self.values

    def batch_select_indices(self, indices):
        """Slot s takes the row in slot indices[s]; only the rows that change slot are copied."""
        moved = (indices != torch.arange(len(indices))).nonzero().flatten()
        for buffer in (self.key_buffer, self.value_buffer):
            buffer[moved, :, self.start : self.end] = buffer[
                indices[moved], :, self.start : self.end
            ]
        self.window(len(indices), self.start, self.end)

    def slide(self, to):
        """Move the window's columns to start at column `to`."""
        width = self.end - self.start
        for buffer in (self.key_buffer, self.value_buffer):
            buffer[: self.rows, :, to : to + width] = buffer[
                : self.rows, :, self.start : self.end
            ].clone()
        self.window(self.rows, to, to + width)
