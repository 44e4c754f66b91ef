"""Sibling projections of one input as one matmul: q/k/v of each attention block, gate/up of each MLP, as vLLM's
Llama code fuses them.

A decode step's matmuls read the weights once whatever their grouping, but each separate call is a Python
module call, an OpenMP region and a pass over the input; SmolLM2's 211 linear calls a step become 121. The
model's code is left as it is: each sibling stays an nn.Linear whose weight is a view into the fused weight, so
LoRA, the model check and anything that reads `.weight` see what they saw. The first sibling's call computes
the whole fused product for its input; the others, called next with that same input tensor, return their
columns of it. A sibling called with another input (a model that orders its calls otherwise) computes its own
columns, so the result never depends on the order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonllm.engine.layers.native_linear import NativeLinear

SIBLINGS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


class _Fused:
    """The fused layer of a group of siblings, and the product of the last input until every sibling took its
    columns (then dropped, so a prefill's product is not held past its layer)."""

    def __init__(self, linears: list[torch.nn.Linear], native: bool) -> None:
        first = linears[0]
        biased = first.bias is not None
        kind = NativeLinear if native else torch.nn.Linear
        self.layer = kind(first.in_features, sum(m.out_features for m in linears), bias=biased, device="meta")
        with torch.no_grad():
            self.layer.weight = torch.nn.Parameter(torch.cat([m.weight for m in linears]), requires_grad=False)
            if biased:
                self.layer.bias = torch.nn.Parameter(torch.cat([m.bias for m in linears]), requires_grad=False)
        self.siblings = len(linears)
        self.input: torch.Tensor | None = None
        self.output: torch.Tensor | None = None
        self.waiting = 0

    def columns(self, index: int, start: int, stop: int, x: torch.Tensor) -> torch.Tensor | None:
        if index == 0:
            self.input, self.output, self.waiting = x, self.layer(x), self.siblings - 1
        elif x is not self.input:
            return None
        out = self.output[..., start:stop]
        if index:
            self.waiting -= 1
        if not self.waiting:
            self.input = self.output = None
        return out


class SiblingLinear(torch.nn.Linear):
    """One sibling: its weight (and bias) a view of the fused one's rows."""

    fused: _Fused
    index: int
    start: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fused.columns(self.index, self.start, self.start + self.out_features, x)
        return F.linear(x, self.weight, self.bias) if out is None else out


def fuse(model: torch.nn.Module, native: bool) -> int:
    """Fuses each decoder layer's float q/k/v and gate/up projections that share an input size and the presence
    of a bias, computed by the native kernel where `native`; returns how many groups were fused."""
    groups = 0
    for layer in getattr(getattr(model, "model", None), "layers", []):
        for parent_name, names in SIBLINGS:
            parent = getattr(layer, parent_name, None)
            linears = [getattr(parent, n, None) for n in names]
            if not all(isinstance(m, torch.nn.Linear) and m.weight.is_floating_point() for m in linears):
                continue
            if len({(m.in_features, m.bias is not None, m.weight.dtype) for m in linears}) != 1:
                continue
            fused = _Fused(linears, native)
            start = 0
            for index, linear in enumerate(linears):
                stop = start + linear.out_features
                linear.__class__ = SiblingLinear
                linear.weight = torch.nn.Parameter(fused.layer.weight[start:stop], requires_grad=False)
                if linear.bias is not None:
                    linear.bias = torch.nn.Parameter(fused.layer.bias[start:stop], requires_grad=False)
                linear.fused, linear.index, linear.start = fused, index, start
                start = stop
            groups += 1
    return groups
