"""The named model shapes (`model.preset`). No torch: the CLI, the planner and the renderer read them
too. The whole default jobs a profile names are in nvrx_eks.facts.job_presets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer (Llama-like: RMSNorm, RoPE, SwiGLU, GQA)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    dropout: float = 0.0
    norm_eps: float = 1e-5


MODEL_PRESETS: dict[str, ModelShape] = {
    # Tests and laptops: learns the synthetic stream in tens of steps. Dropout is on so that
    # resuming must restore the RNG to reproduce the uninterrupted run.
    "tiny": ModelShape(
        vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=256, dropout=0.1
    ),
    # ~34M parameters: big enough that checkpoint stalls are measurable on a CPU.
    "small": ModelShape(vocab_size=8192, dim=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=1408, max_seq_len=1024),
    # ~1.1B, TinyLlama-shaped.
    "1b": ModelShape(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632, max_seq_len=2048),
    # Llama-3-8B-shaped, for p5 nodes.
    "8b": ModelShape(
        vocab_size=128256,
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=14336,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}
