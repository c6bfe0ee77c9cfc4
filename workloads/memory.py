"""Per-GPU memory of a training job: the arithmetic, stated once, torch-free.

`nvrx-eks plan` prints it, the manifest renderer refuses a job whose estimate exceeds the GPU's
memory (nvrx_eks/facts/instances.py), and the presets' defaults (activation checkpointing for 1b and
8b, workloads.config) follow from it. It models the trainer as built by workloads.model: FSDP2
over all ranks (one group for the embeddings, one per block, one for [norm, output], a root with
no parameters), AdamW, bf16 compute with fp32 master weights and fp32 gradient reduction on GPU
(fp32 throughout on CPU), the loss computed in recomputed chunks of tokens.

Notation: P parameters, W ranks, T = batch_size x seq_len tokens per rank, h = dim,
kv = n_kv_heads x head_dim, f = ffn_dim, V = vocab, a = n_heads, c = bytes per compute element
(2 in bf16, 4 in fp32), L = n_layers.

1. Sharded state, 16 P / W bytes: fp32 parameters (4), fp32 gradients (4; reduce_dtype=fp32),
   AdamW exp_avg and exp_avg_sq (4 + 4). FSDP2 pads each shard to a multiple of W: negligible.
2. Unsharded working set: while a group computes, its parameters are all-gathered in the compute
   dtype and FSDP2 prefetches the next group's, 2 c per parameter of the largest group; in its
   backward the full gradient exists in the compute dtype (c) and, when that differs from the
   reduce dtype, as the fp32 reduce-scatter input (4). The largest group of the 8b preset is the
   output projection (V h = 525 M parameters), not a block (218 M). Its weight gradient is summed
   over the loss chunks in fp32 (4, plus 4/8 for one vocabulary slice's product;
   workloads.model._ChunkedCrossEntropy) and handed over in the compute dtype (c) before FSDP2
   makes its reduce-scatter input: within the same 2 c + c + 4 at every moment.
3. Activations saved for backward, per token per block, counted from the ops in
   workloads.model.Block (bf16 on GPU):
     RMSNorm x2: input (h) and rstd (one fp32)          2 h c + 8 bytes
     q/k/v projections: normed input (shared)         counted in the norm's output: h c
     SDPA: q (h), k (kv), v (kv), out (h), logsumexp    (2 h + 2 kv) c + 4 a bytes
     wo: its input, the re-laid-out SDPA output         h c
     w1/w3: normed input                                h c
     SwiGLU: w1 out (silu input), silu out, w3 out      3 f c
     w2: its input, the product                         f c
     dropout (p > 0): two boolean masks                 2 h bytes
   = (7 h + 2 kv + 4 f) c + 8 + 4 a (+ 2 h) bytes. Llama-3-8B: 176 KB per token per block.
   RoPE saves nothing per token (the tables are the only saved operands of its products).
   With activation checkpointing on k of the L blocks (a checkpoint_wrapper around each of
   those), a checkpointed block keeps only its input (h c) and every other block keeps all of
   the above: k x h c + (L - k) x block. Outside the blocks: the final norm's input and output
   (2 h c). That is what autograd holds at the end of forward (saved_activation_bytes_per_token,
   checked against torch on CPU in the tests). Backward adds, per token, one block's activation
   gradients (~ one block), and when any block is checkpointed the recomputed block's
   activations (one more block). "auto" (model.activation_checkpointing) takes the fewest k
   whose total fits 90% of the GPU (checkpointed_blocks_to_fit): at 8b x 16 ranks on an H100
   about half the blocks keep their activations, which saves their recompute (~1/3 of a block's
   forward-plus-backward FLOPs each).
4. Loss: one chunk of C = min(loss_chunk_tokens, T) tokens at a time, per logit: the logits (c),
   their fp32 copy (4, none in fp32), log-probabilities (4), their gradient (4), the fp32 logits'
   gradient (4, none in fp32) and its cast back (c): 20 bytes per logit in bf16, 16 in fp32.
   Llama-3-8B at C = 2048: 2048 x 128256 x 20 = 4.9 GiB. The full logits of 2 x 8192 tokens
   without chunking would take 8x that.
5. Optimizer step, 4 P / W bytes: on GPU AdamW takes its foreach path (DTensor is registered as
   foreach-capable), whose `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)` allocates one fp32
   temporary per parameter shard, all at once (torch/optim/adam.py `_multi_tensor_adam`; every other
   foreach op there is in place). It exists only inside `optimizer.step()`, after backward has
   freed items 2-4, so it adds to the peak only by what it exceeds them: at W = 1 it is the peak
   (1b: 4.1 GiB against a 2-3 GiB backward working set); at 8b x 16 ranks it adds nothing.
6. Checkpoint staging: the NVRx backend copies the state into shared host memory (cpu_shm), so it
   costs host memory (12 P / W per rank: fp32 parameters and the two moments), not GPU memory. The
   node-local tier keeps its own host copy of the same state, on GPU in pinned buffers, one per
   tensor, which torch's pinned-memory cache rounds up to a power of two and keeps
   (ATen/core/CachingHostAllocator.h, c10::llvm::PowerOf2Ceil, in torch 2.11 and by default in
   2.13): `local_tier_copy`, +10% at 8b x 16 ranks, +32% at 1b.
7. Runtime overhead: the CUDA context, NCCL's buffers and the library workspaces, assumed 3 GiB per
   GPU, plus 5% of items 1-5 for allocator fragmentation (with expandable_segments). These are
   assumptions, not measurements. The context and NCCL's buffers are allocated outside torch's
   caching allocator, so `torch.cuda.max_memory_reserved` never counts them; the allocator does
   hold a fixed part of the 3 GiB whatever the model (`FIXED_RESERVED_BYTES`: cuBLAS workspaces,
   one segment per FSDP2 stream), stated as its own line. What max_memory_reserved measures is
   `MemoryEstimate.allocator_reserved` (items 1-5, fragmentation and that fixed part), which the
   GPU smoke script (nvrx_eks/ops/smoke_verdicts.py) compares it with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from workloads.config import TrainConfig
from workloads.presets import ModelShape

GIB = 1 << 30
#: Bytes of persistent state per parameter: fp32 parameter + fp32 gradient + two fp32 moments.
SHARDED_BYTES_PER_PARAM = 16
#: Bytes per parameter that a checkpoint holds: fp32 parameter and the two AdamW moments.
CHECKPOINT_BYTES_PER_PARAM = 12
#: Bytes per parameter of AdamW's foreach step temporary (item 5: the fp32 sqrt of exp_avg_sq).
OPTIMIZER_STEP_BYTES_PER_PARAM = 4
#: CUDA context, library workspaces and NCCL buffers per GPU (assumed, see the module docstring).
RUNTIME_OVERHEAD_BYTES = 3 * GIB
#: The part of it torch's caching allocator holds whatever the model, so max_memory_reserved counts
#: it (item 7): two cuBLAS workspaces, one for the forward thread's handle and one for autograd's
#: device thread's (32 MiB each: torch's default on sm90, not measured), and one segment per stream
#: for FSDP2's four streams beside the default one (20 MiB each, assumed). Fixed costs, so they
#: matter most for a small model's smoke.
FIXED_RESERVED_BYTES = 2 * (32 << 20) + 4 * (20 << 20)
#: Allocator fragmentation on top of everything else (assumed).
FRAGMENTATION = 0.05


def head_dim(shape: ModelShape) -> int:
    return shape.dim // shape.n_heads


def block_parameters(shape: ModelShape) -> int:
    attention = shape.dim * head_dim(shape) * (2 * shape.n_heads + 2 * shape.n_kv_heads)
    return attention + 3 * shape.dim * shape.ffn_dim + 2 * shape.dim


def parameter_count(shape: ModelShape) -> int:
    """Parameters of the decoder-only transformer the trainer builds (untied embeddings, GQA,
    SwiGLU, RMSNorm weights)."""
    embeddings = shape.vocab_size * shape.dim
    head = shape.vocab_size * shape.dim + shape.dim
    return embeddings + shape.n_layers * block_parameters(shape) + head


def parameter_shapes(shape: ModelShape) -> list[tuple[int, ...]]:
    """Each parameter tensor of the model, in the order workloads.model builds them."""
    h, hd, f = shape.dim, head_dim(shape), shape.ffn_dim
    block: list[tuple[int, ...]] = [(shape.n_heads * hd, h), (shape.n_kv_heads * hd, h), (shape.n_kv_heads * hd, h)]
    block += [(h, shape.n_heads * hd)]
    block += [(f, h), (f, h), (h, f), (h,), (h,)]
    return [(shape.vocab_size, h), *block * shape.n_layers, (h,), (shape.vocab_size, h)]


def local_tier_copy_bytes(shape: ModelShape, world_size: int, *, pinned: bool) -> int:
    """One rank's host copy of its shards of the fp32 parameters and the two AdamW moments (FSDP2
    shards dim 0: ceil(rows / W) rows each), as the node-local tier holds it (item 6): `pinned`
    (copied from a GPU), each tensor takes the next power of two."""
    total = 0
    for tensor in parameter_shapes(shape):
        rows = -(-tensor[0] // world_size)
        nbytes = 4 * rows * math.prod(tensor[1:])
        total += 3 * (1 << (nbytes - 1).bit_length() if pinned and nbytes > 1 else nbytes)
    return total


def largest_group_parameters(shape: ModelShape) -> int:
    """The largest FSDP group: the embeddings, one block, or [norm, output]."""
    return max(shape.vocab_size * shape.dim, block_parameters(shape), shape.vocab_size * shape.dim + shape.dim)


def block_activation_bytes_per_token(shape: ModelShape, compute_bytes: int, *, fused_norm: bool = True) -> int:
    """Saved activations of one Block per token without recomputation (item 3 above).

    fused_norm: CUDA runs RMSNorm as one fused kernel (saves input and rstd); on CPU torch runs
    it as composite ops, which also save the normalized input before the weight: + h per norm."""
    h, kv, f = shape.dim, shape.n_kv_heads * head_dim(shape), shape.ffn_dim
    saved = (7 * h + 2 * kv + 4 * f) * compute_bytes + 2 * 4 + 4 * shape.n_heads
    if not fused_norm:
        saved += 2 * h * compute_bytes
    if shape.dropout > 0:
        saved += 2 * h
    return saved


def saved_activation_bytes_per_token(
    shape: ModelShape, compute_bytes: int, *, checkpointed_blocks: int, fused_norm: bool = True
) -> int:
    """What autograd holds per token at the end of the forward pass (item 3 above), with
    `checkpointed_blocks` of the blocks recomputed in backward."""
    h = shape.dim
    kept = shape.n_layers - checkpointed_blocks
    block = block_activation_bytes_per_token(shape, compute_bytes, fused_norm=fused_norm)
    final_norm = 2 * h * compute_bytes + (0 if fused_norm else h * compute_bytes + 4)
    return checkpointed_blocks * h * compute_bytes + kept * block + final_norm


def _loss_bytes_per_logit(compute_bytes: int) -> int:
    upcast = 4 if compute_bytes != 4 else 0  # .float() is a no-op in fp32
    return compute_bytes + upcast + 4 + 4 + upcast + compute_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes by component; `total` is what must fit in the GPU's memory."""

    sharded_state: int
    unsharded_groups: int
    activations: int
    loss: int
    optimizer_step: int  # AdamW's foreach temporary, alive only inside optimizer.step()
    runtime_overhead: int  # the part of RUNTIME_OVERHEAD_BYTES outside the caching allocator
    fixed_reserved: int  # the part inside it: FIXED_RESERVED_BYTES
    host_staging: int  # host memory per rank, not GPU memory
    local_tier_copy: int  # host memory per rank of the node-local tier's copy (item 6)
    checkpointed_blocks: int  # the blocks recomputed in backward that `activations` assumes

    @property
    def backward_working_set(self) -> int:
        """Items 2-4: what forward and backward hold beside the sharded state."""
        return self.unsharded_groups + self.activations + self.loss

    @property
    def optimizer_step_excess(self) -> int:
        """What the optimizer step's temporary adds to the peak: the part of it that the memory
        freed by backward (items 2-4, cached by the allocator) does not cover."""
        return max(0, self.optimizer_step - self.backward_working_set)

    @property
    def gpu_subtotal(self) -> int:
        """The peak of tensors allocated: the sharded state plus the larger of backward's working
        set and the optimizer step's temporary (they never coexist)."""
        return self.sharded_state + self.backward_working_set + self.optimizer_step_excess

    @property
    def fragmentation(self) -> int:
        return int(self.gpu_subtotal * FRAGMENTATION)

    @property
    def allocator_reserved(self) -> int:
        """What torch.cuda.max_memory_reserved measures at its peak: the caching allocator's
        share of `total`, without the CUDA context and NCCL's buffers (item 7)."""
        return self.gpu_subtotal + self.fragmentation + self.fixed_reserved

    @property
    def total(self) -> int:
        return self.allocator_reserved + self.runtime_overhead

    def components(self) -> list[tuple[str, int]]:
        """The lines of `total` (they add up to it)."""
        return [
            ("sharded params + grads + AdamW (fp32)", self.sharded_state),
            ("unsharded FSDP groups (largest + prefetch)", self.unsharded_groups),
            ("activations", self.activations),
            ("loss chunk (logits)", self.loss),
            ("AdamW step temporary, beyond backward's", self.optimizer_step_excess),
            ("allocator fragmentation", self.fragmentation),
            ("cuBLAS workspaces, FSDP2 stream segments", self.fixed_reserved),
            ("CUDA context, NCCL", self.runtime_overhead),
        ]

    def describe(self) -> str:
        parts = ", ".join(f"{name} {nbytes / GIB:.1f}" for name, nbytes in self.components())
        return f"{self.total / GIB:.1f} GiB per GPU ({parts}; GiB)"


def estimate(
    shape: ModelShape,
    *,
    world_size: int,
    batch_size: int,
    seq_len: int,
    checkpointed_blocks: int,
    loss_chunk_tokens: int,
    bf16: bool = True,
) -> MemoryEstimate:
    """Per-GPU training memory (see the module docstring for every term)."""
    c = 2 if bf16 else 4
    tokens = batch_size * seq_len
    params = parameter_count(shape)
    largest = largest_group_parameters(shape)
    unsharded = largest * (2 * c + c + (4 if c != 4 else 0))
    block = block_activation_bytes_per_token(shape, c, fused_norm=bf16)
    saved = saved_activation_bytes_per_token(shape, c, checkpointed_blocks=checkpointed_blocks, fused_norm=bf16)
    backward = (2 if checkpointed_blocks else 1) * block
    activations = tokens * (saved + backward)
    loss = min(loss_chunk_tokens, tokens) * shape.vocab_size * _loss_bytes_per_logit(c)
    return MemoryEstimate(
        sharded_state=params * SHARDED_BYTES_PER_PARAM // world_size,
        unsharded_groups=unsharded,
        activations=activations,
        loss=loss,
        optimizer_step=params * OPTIMIZER_STEP_BYTES_PER_PARAM // world_size,
        runtime_overhead=RUNTIME_OVERHEAD_BYTES - FIXED_RESERVED_BYTES if bf16 else 0,
        fixed_reserved=FIXED_RESERVED_BYTES if bf16 else 0,
        host_staging=params * CHECKPOINT_BYTES_PER_PARAM // world_size,
        local_tier_copy=local_tier_copy_bytes(shape, world_size, pinned=bf16),
        checkpointed_blocks=checkpointed_blocks,
    )


#: The share of the GPU's memory "auto" may plan to fill. This estimate has not yet met a GPU (its
#: fragmentation and context lines are allowances, not measurements), so the choice keeps a
#: tenth free rather than trading the last GiB for recompute; check_fits still accepts a config
#: up to the whole GPU. Measure the peak (nvrx-eks gpu-smoke, run_end's gpu_peak_reserved_bytes)
#: before raising it.
AUTO_FILL_SHARE = 0.9


def checkpointed_blocks_to_fit(
    n_layers: int, gpu_memory_bytes: int, estimate_with: Callable[[int], MemoryEstimate]
) -> int:
    """The fewest checkpointed blocks whose estimate (`estimate_with(blocks)`) fits
    AUTO_FILL_SHARE of `gpu_memory_bytes`; all of them when even that does not fit (check_fits
    then says so when the whole GPU is too small)."""
    for blocks in range(n_layers + 1):
        if estimate_with(blocks).total <= AUTO_FILL_SHARE * gpu_memory_bytes:
            return blocks
    return n_layers


def estimate_for(
    train: TrainConfig,
    world_size: int,
    *,
    bf16: bool = True,
    ranks_per_node: int | None = None,
    gpu_memory_bytes: int | None = None,
) -> MemoryEstimate:
    """The estimate for a TrainConfig's model, batch and switches at `world_size` ranks. With
    distributed.shard=hybrid the state is sharded over one node's ranks only (`ranks_per_node`),
    so item 1 divides by that instead of the world size. model.activation_checkpointing=auto is
    resolved for `gpu_memory_bytes`; without a GPU (None) there is no memory to fit and no block
    is recomputed, as the trainer does on CPU."""
    shard_group = world_size
    if train.distributed.shard == "hybrid" and ranks_per_node:
        shard_group = min(world_size, ranks_per_node)
    shape = train.model.shape

    def with_blocks(checkpointed_blocks: int) -> MemoryEstimate:
        return estimate(
            shape,
            world_size=shard_group,
            batch_size=train.data.batch_size,
            seq_len=train.data.seq_len,
            checkpointed_blocks=checkpointed_blocks,
            loss_chunk_tokens=train.model.loss_chunk_tokens,
            bf16=bf16,
        )

    blocks = train.model.checkpointed_blocks
    if blocks == "auto":
        blocks = (
            0 if gpu_memory_bytes is None else checkpointed_blocks_to_fit(shape.n_layers, gpu_memory_bytes, with_blocks)
        )
    return with_blocks(blocks)


def describe_checkpointing(train: TrainConfig, est: MemoryEstimate) -> str:
    """Which blocks the estimate recomputes, as the plan and the job summary print it."""
    n_layers = train.model.shape.n_layers
    chosen = " (auto: the fewest that fit)" if train.model.checkpointed_blocks == "auto" else ""
    if est.checkpointed_blocks == 0 and not chosen:
        return "activation checkpointing off"
    return f"activation checkpointing on {est.checkpointed_blocks} of {n_layers} blocks{chosen}"


def check_fits(
    train: TrainConfig, world_size: int, gpu_memory_gib: float, gpu_model: str, ranks_per_node: int | None = None
) -> str | None:
    """None if the job fits one GPU, else a message with the numbers and the fix."""
    est = estimate_for(train, world_size, ranks_per_node=ranks_per_node, gpu_memory_bytes=int(gpu_memory_gib * GIB))
    if est.total <= gpu_memory_gib * GIB:
        return None
    n_layers = train.model.shape.n_layers
    fixes = []
    if est.checkpointed_blocks == 0:
        fixes.append("model.activation_checkpointing=true (or auto: the fewest recomputed blocks that fit)")
    elif est.checkpointed_blocks < n_layers:
        fixes.append(
            f"more recomputed blocks, model.checkpoint_blocks up to {n_layers} (now {est.checkpointed_blocks}), "
            "or model.activation_checkpointing=auto"
        )
    fixes += [
        f"a smaller data.batch_size (now {train.data.batch_size})",
        f"a shorter data.seq_len (now {train.data.seq_len})",
        "more nodes (the sharded state divides by the world size; not with distributed.shard=hybrid)",
    ]
    return (
        f"model {train.model.name}: the estimated memory per GPU, {est.describe()}, exceeds "
        f"the {gpu_memory_gib:.1f} GiB of one {gpu_model}; use " + ", or ".join(fixes)
    )
