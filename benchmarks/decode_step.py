"""A LLaMA-style decode step (one new token per sequence against a KV cache), as torch modules:
:class:`DecodeStep`, what fastdlight compiles (exported with ``torch.export`` at each cache
length), and :class:`StaticCacheStep`, the same math as torch users serve it (a preallocated
cache written in place, ``scaled_dot_product_attention`` over its filled part).

DecodeStep's attention runs over the cache and the new token joined (``torch.cat``, as Hugging
Face's dynamic cache does); fastdlight's rewrite reads the two without joining them. It returns
the new key and value for the caller to append. GQA: ``heads`` query heads share
each of ``kv_heads`` key/value heads, as groups of ``heads // kv_heads`` rows of one matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DecodeShape:
    dim: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


#: LLaMA-3-8B's layer
LLAMA3_8B = DecodeShape()
#: the layers ``bench_decode_step --model`` names: LLaMA-3-8B's; Phi-3-mini's (head dim 96, no
#: GQA); a LLaMA-3-8B layer with one K/V head (multi-query attention: 32 query rows a K/V head)
SHAPES = {"llama3_8b": LLAMA3_8B, "phi3_mini": DecodeShape(dim=3072, heads=32, kv_heads=32, ffn=8192),
          "mqa": DecodeShape(kv_heads=1)}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate(x, cos, sin):
    """RoPE on the last dim (halves rotated, as LLaMA's ``rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Projections(nn.Module):
    """The weights both forms share: fused QKV, output, gated MLP."""

    def __init__(self, s: DecodeShape):
        super().__init__()
        self.s = s
        self.norm1, self.norm2 = RMSNorm(s.dim, s.eps), RMSNorm(s.dim, s.eps)
        self.qkv = nn.Linear(s.dim, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=False)
        self.o = nn.Linear(s.heads * s.head_dim, s.dim, bias=False)
        self.gate_up = nn.Linear(s.dim, 2 * s.ffn, bias=False)
        self.down = nn.Linear(s.ffn, s.dim, bias=False)

    def qkv_heads(self, x, cos, sin):
        """q ``[B, G, H/G, D]``, k and v ``[B, G, 1, D]`` of the new token, q and k rotated."""
        s, b = self.s, x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).split([s.heads * s.head_dim, s.kv_heads * s.head_dim,
                                                 s.kv_heads * s.head_dim], dim=-1)
        q = rotate(q.view(b, s.kv_heads, s.heads // s.kv_heads, s.head_dim), cos, sin)
        k = rotate(k.view(b, s.kv_heads, 1, s.head_dim), cos, sin)
        return q, k, v.view(b, s.kv_heads, 1, s.head_dim)

    def finish(self, x, attn):
        """Output projection, residual, gated MLP, residual; ``attn`` ``[B, G, H/G, D]``."""
        out = x + self.o(attn.reshape(x.shape[0], 1, self.s.heads * self.s.head_dim))  # sizes given: no -1 to infer
        gate, up = self.gate_up(self.norm2(out)).chunk(2, dim=-1)
        return out + self.down(F.silu(gate) * up)


class DecodeStep(Projections):
    """``(x [B, 1, dim], k_cache, v_cache [B, G, L, D], cos, sin [1, 1, D]) -> (y, k, v)``: the
    hidden state after the layer, and the new token's key and value (to append)."""

    def forward(self, x, k_cache, v_cache, cos, sin):
        q, k, v = self.qkv_heads(x, cos, sin)
        # attention over the cache and the new token, joined as Hugging Face's dynamic cache
        # joins them (fastdlight reads both without the copy)
        keys, values = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * (1.0 / math.sqrt(self.s.head_dim))
        attn = torch.matmul(scores.float().softmax(dim=-1).to(q.dtype), values)  # [B, G, H/G, D]
        return self.finish(x, attn), k, v


class StaticCacheStep(Projections):
    """The same layer as torch serving code runs it: the new key and value written into a
    preallocated ``[B, G, max_len, D]`` cache at ``pos``, then SDPA over the first ``pos + 1``."""

    def forward(self, x, k_cache, v_cache, cos, sin, pos: int):
        q, k, v = self.qkv_heads(x, cos, sin)
        k_cache[:, :, pos:pos + 1] = k
        v_cache[:, :, pos:pos + 1] = v
        b, s = x.shape[0], self.s
        attn = F.scaled_dot_product_attention(q.reshape(b, s.heads, 1, s.head_dim), k_cache[:, :, :pos + 1],
                                              v_cache[:, :, :pos + 1], enable_gqa=True)
        return self.finish(x, attn.reshape(b, s.kv_heads, s.heads // s.kv_heads, s.head_dim))


def inputs(s: DecodeShape, batch: int, length: int, seed: int = 0, dtype=torch.float32):
    """``(x, k_cache, v_cache, cos, sin)`` for a step at position ``length`` (caches of ``length``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, s.dim, generator=g, dtype=dtype)
    k = torch.randn(batch, s.kv_heads, length, s.head_dim, generator=g, dtype=dtype)
    v = torch.randn(batch, s.kv_heads, length, s.head_dim, generator=g, dtype=dtype)
    inv = 1.0 / (10000 ** (torch.arange(0, s.head_dim, 2, dtype=torch.float64) / s.head_dim))
    angles = torch.cat([length * inv, length * inv]).view(1, 1, s.head_dim)
    return x, k, v, angles.cos().to(dtype), angles.sin().to(dtype)


def build(s: DecodeShape, cls=DecodeStep, seed: int = 0) -> nn.Module:
    """``cls`` with random weights scaled as a trained layer's (outputs of unit size)."""
    torch.manual_seed(seed)
    model = cls(s).eval()
    with torch.no_grad():
        for lin in (model.qkv, model.o, model.gate_up, model.down):
            lin.weight.normal_(0.0, 1.0 / math.sqrt(lin.in_features))
    return model
