"""Running a generated kernel on a TPU slice, through JAX's own SPMD (no communication layer
of svgen's own).

Heads are independent, so the plain recipe shards heads: inside `jax.shard_map` with q, k, v
and head_pattern sharded over the same mesh axis on the heads dimension, each device calls the
generated `attention` on its heads (pass the shard's `head_pattern`).

Use `jax.shard_map(..., check_vma=False)`: the kernel indexes its scalar-prefetch tables with
grid indices, which carry no varying-mesh-axis annotation (JAX rejects mixing the two when
the check is on).

Activations of a video DiT are usually sharded over the *sequence* instead. `ulysses` wraps
the kernel for that case (the DeepSpeed-Ulysses scheme the TPU port of Sparse VideoGen uses):
an all-to-all turns [heads, seq/n, d] shards into [heads/n, seq, d] (every device gets all
tokens of its heads), attention runs per head, and a second all-to-all turns the output back.
Each all-to-all moves (n-1)/n of a q/k/v/o shard over the interconnect; heads must be
divisible by the axis size.
"""

from __future__ import annotations

from jax import lax


def ulysses(attention, q, k, v, *, axis_name: str, head_pattern=None, **kwargs):
    """Call inside shard_map: q, k, v are this device's [..., heads, seq/n, d] sequence shards,
    head_pattern (optional) the patterns of *all* heads. Returns o's sequence shard."""
    heads_axis, seq_axis = q.ndim - 3, q.ndim - 2

    def to_heads(x):  # [..., H, L/n, d] -> [..., H/n, L, d]
        return lax.all_to_all(x, axis_name, split_axis=heads_axis, concat_axis=seq_axis, tiled=True)

    def to_sequence(x):  # [..., H/n, L, d] -> [..., H, L/n, d]
        return lax.all_to_all(x, axis_name, split_axis=seq_axis, concat_axis=heads_axis, tiled=True)

    if head_pattern is not None:
        local_heads = q.shape[heads_axis] // lax.psum(1, axis_name)
        start = lax.axis_index(axis_name) * local_heads
        head_pattern = lax.dynamic_slice_in_dim(head_pattern, start, local_heads)
    out = attention(to_heads(q), to_heads(k), to_heads(v), head_pattern=head_pattern, **kwargs)
    return to_sequence(out)
