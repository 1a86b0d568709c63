"""The torch models of ``bench_models.py`` and their export to Relax.

Each model is built in fp32 with seeded random weights; torch runs it in fp16, and the Relax
side is exported in fp32 and converted with ``ToMixedPrecision(out_dtype="float32")`` (fp16
compute, fp32 accumulation in matmuls and convolutions, as torch's fp16 GEMMs do). Exporting in
fp16 directly fails for LayerNorm in TVM 0.27's frontend (its gamma dtype check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """Two GEMMs with bias and GELU, weights [out, in] as nn.Linear stores them."""

    def __init__(self, d, ff):
        super().__init__()
        self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class GatedMLP(nn.Module):
    """LLaMA's FFN: down(silu(gate(x)) * up(x)), no bias."""

    def __init__(self, d, ff):
        super().__init__()
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Multi-head attention written as matmul + softmax + matmul (optionally causal)."""

    def __init__(self, d, heads, causal, seq):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        if causal:
            # a parameter, not a buffer: exported as an input of the Relax function (a buffer would
            # become a constant only the binary metadata holds)
            self.mask = nn.Parameter(torch.full((seq, seq), -1e4).triu(1), requires_grad=False)

    def forward(self, x):
        b, s, d = x.shape
        h, hd = self.heads, d // self.heads
        q, k, v = self.qkv(x).reshape(b, s, 3, h, hd).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(hd))
        if self.causal:
            scores = scores + self.mask
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        return self.o(out)


class GPT2Block(nn.Module):
    """GPT-2 small's block as torch users write it: LayerNorms, a fused QKV projection with bias,
    causal attention either through ``scaled_dot_product_attention(is_causal=True)`` ("sdpa") or
    spelled out with ``masked_fill(~tril, -inf)`` and a softmax ("masked"), GELU (tanh) MLP."""

    def __init__(self, d, heads, seq, form):
        super().__init__()
        self.heads, self.form = heads, form
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        if form == "masked":
            self.register_buffer("tril", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)

    def attend(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.form == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // self.heads))
            scores = scores.masked_fill(~self.tril[:s, :s], float("-inf"))
            out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, d))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, ff, seq, llama):
        super().__init__()
        norm = (lambda: RMSNorm(d)) if llama else (lambda: nn.LayerNorm(d))
        self.norm1, self.norm2 = norm(), norm()
        self.attn = Attention(d, heads, causal=llama, seq=seq)
        self.ffn = GatedMLP(d, ff) if llama else MLP(d, ff)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        widths, blocks, cin = (64, 128, 256, 512), [], 64
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    make: object  # () -> nn.Module
    input_shape: tuple[int, ...]
    layout: str = ""  # "NHWC": convolutions converted with ConvertLayout(NHWC, OHWI)


def specs() -> dict[str, ModelSpec]:
    all_specs = [
        ModelSpec("mlp_gelu", "MLP 2048 tokens, 4096 -> 11008 -> 4096, bias, GELU",
                  lambda: MLP(4096, 11008), (2048, 4096)),
        ModelSpec("mlp_silu", "gated MLP 2048 tokens, 4096 -> 2x11008 -> 4096, SiLU",
                  lambda: GatedMLP(4096, 11008), (2048, 4096)),
        # one token: every weight read once for one row, a step at the bandwidth limit
        ModelSpec("decode_mlp_gelu", "decode MLP, 1 token, 4096 -> 11008 -> 4096, bias, GELU",
                  lambda: MLP(4096, 11008), (1, 4096)),
        ModelSpec("decode_mlp_silu", "decode gated MLP, 1 token, 4096 -> 2x11008 -> 4096, SiLU",
                  lambda: GatedMLP(4096, 11008), (1, 4096)),
        ModelSpec("decoder_ln", "decoder layer b4 s512 d2048 16 heads ff5632, LayerNorm, GELU, no mask",
                  lambda: DecoderLayer(2048, 16, 5632, 512, llama=False), (4, 512, 2048)),
        ModelSpec("llama_b1_s512", "LLaMA layer b1 s512 d2048 16 heads ff5632, RMSNorm, causal, SiLU",
                  lambda: DecoderLayer(2048, 16, 5632, 512, llama=True), (1, 512, 2048)),
        ModelSpec("llama_b4_s512", "LLaMA layer b4 s512 d2048 16 heads ff5632, RMSNorm, causal, SiLU",
                  lambda: DecoderLayer(2048, 16, 5632, 512, llama=True), (4, 512, 2048)),
        # attention-bound: the causal attention at T 2048 and 4096 is most of the layer's work
        ModelSpec("llama_b1_s2048", "LLaMA layer b1 s2048 d2048 16 heads ff5632, RMSNorm, causal, SiLU",
                  lambda: DecoderLayer(2048, 16, 5632, 2048, llama=True), (1, 2048, 2048)),
        ModelSpec("llama_b1_s4096", "LLaMA layer b1 s4096 d2048 16 heads ff5632, RMSNorm, causal, SiLU",
                  lambda: DecoderLayer(2048, 16, 5632, 4096, llama=True), (1, 4096, 2048)),
        ModelSpec("gpt2_block_sdpa", "GPT-2 small block b8 s1024, SDPA is_causal",
                  lambda: GPT2Block(768, 12, 1024, "sdpa"), (8, 1024, 768)),
        ModelSpec("gpt2_block_masked", "GPT-2 small block b8 s1024, masked_fill(~tril, -inf) + softmax",
                  lambda: GPT2Block(768, 12, 1024, "masked"), (8, 1024, 768)),
        # K not a multiple of 8: fp16 rows of 2002 bytes, which TMA cannot address unpadded
        ModelSpec("linear_k1001", "Linear 3000 tokens, 1001 -> 5120, bias (K not a multiple of 8)",
                  lambda: nn.Linear(1001, 5120), (3000, 1001)),
        ModelSpec("linear_k4095", "Linear 2048 tokens, 4095 -> 4096, bias (K not a multiple of 8)",
                  lambda: nn.Linear(4095, 4096), (2048, 4095)),
        # N not a multiple of 8: output rows (and the bound [K, N] weight's) TMA cannot address
        ModelSpec("linear_n4095", "Linear 2048 tokens, 4096 -> 4095, bias (N not a multiple of 8)",
                  lambda: nn.Linear(4096, 4095), (2048, 4096)),
        ModelSpec("lm_head_gpt2", "GPT-2's LM head: 2048 tokens, 768 -> 50257, no bias",
                  lambda: nn.Linear(768, 50257, bias=False), (2048, 768)),
        ModelSpec("resnet18_nhwc_b16", "ResNet-18 batch 16, 224x224, NHWC/OHWI via ConvertLayout",
                  ResNet18, (16, 3, 224, 224), "NHWC"),
        ModelSpec("resnet18_nchw_b16", "ResNet-18 batch 16, 224x224, NCHW model (for_inference: NHWC inside)",
                  ResNet18, (16, 3, 224, 224)),
        ModelSpec("resnet18_nhwc_b1", "ResNet-18 batch 1, 224x224, NHWC/OHWI via ConvertLayout",
                  ResNet18, (1, 3, 224, 224), "NHWC"),
    ]
    return {s.name: s for s in all_specs}


def build(spec: ModelSpec, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = spec.make().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, as a trained model has
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def export_relax(spec: ModelSpec, model: nn.Module):
    """(Relax module with the weights as parameters, their values): fp32, as exported."""
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    example = (torch.randn(spec.input_shape),)
    with torch.no_grad():
        program = torch.export.export(model, example)
    mod = from_exported_program(program, keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    return mod, params["main"]


