"""A Llama-like decoder-only transformer in plain PyTorch, sharded with FSDP2 `fully_shard`.

Initialization is deterministic and independent of the shard layout: every parameter's full value
is generated from a generator seeded by (seed, parameter name) and each rank keeps its own slice.
A 1-rank and an 8-rank run of the same seed therefore start from the same weights, and a restarted
run rebuilds exactly the module it had before loading the checkpoint over it.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from workloads.config import ModelShape
from workloads.device import Runtime


def _rope_tables(shape: ModelShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = shape.dim // shape.n_heads
    inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, head_dim, 2, device=device).float()
                                            / head_dim))
    positions = torch.arange(shape.max_seq_len, device=device).float()
    angles = torch.outer(positions, inv_freq)
    return angles.cos(), angles.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, seq, head_dim]; rotate pairs (even, odd) by the position angle.
    seq = x.shape[-2]
    cos, sin = cos[:seq].to(x.dtype), sin[:seq].to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.n_heads, self.n_kv_heads = shape.n_heads, shape.n_kv_heads
        self.head_dim = shape.dim // shape.n_heads
        self.wq = nn.Linear(shape.dim, shape.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(shape.dim, shape.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(shape.dim, shape.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(shape.n_heads * self.head_dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.w1 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)
        self.w3 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)
        self.w2 = nn.Linear(shape.ffn_dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.dim, eps=shape.norm_eps)
        self.attention = Attention(shape)
        self.ffn_norm = nn.RMSNorm(shape.dim, eps=shape.norm_eps)
        self.feed_forward = FeedForward(shape)
        self.dropout = shape.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.attention(self.attention_norm(x), cos, sin)
        x = x + F.dropout(h, self.dropout, self.training)
        h = self.feed_forward(self.ffn_norm(x))
        return x + F.dropout(h, self.dropout, self.training)


class Transformer(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab_size, shape.dim)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.n_layers))
        self.norm = nn.RMSNorm(shape.dim, eps=shape.norm_eps)
        self.output = nn.Linear(shape.dim, shape.vocab_size, bias=False)
        # Derived, not state: recomputed after materialization, never checkpointed.
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        return self.output(self.norm(x))

    @torch.no_grad()
    def init_weights(self, seed: int, device: torch.device) -> None:
        """Deterministic, shard-layout-independent initialization (see module docstring)."""
        self.rope_cos, self.rope_sin = _rope_tables(self.shape, device)
        residual_std = 0.02 / math.sqrt(2 * self.shape.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                full = torch.ones(param.shape, device=device)
            else:
                std = residual_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
                digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
                generator = torch.Generator(device=device).manual_seed(
                    int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF)
                full = torch.empty(param.shape, device=device)
                full.normal_(0.0, std, generator=generator)
            if isinstance(param, DTensor):
                # src_data_rank=None: every rank holds the same full value; keep the local slice
                # without any communication.
                local = distribute_tensor(full, param.device_mesh, param.placements,
                                          src_data_rank=None).to_local()
                param.to_local().copy_(local)
            else:
                param.copy_(full)


def build_model(shape: ModelShape, runtime: Runtime, mesh: DeviceMesh, seed: int) -> Transformer:
    """Build on the meta device, shard each block and the root with FSDP2, materialize on the
    runtime device, then initialize. Nothing full-size is ever allocated, which is what lets the
    8B preset start on a GPU that only holds its shard."""
    with torch.device("meta"):
        model = Transformer(shape)
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if runtime.bf16 else MixedPrecisionPolicy())
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=runtime.device)
    model.init_weights(seed, runtime.device)
    return model
