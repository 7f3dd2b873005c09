"""What the KV-cache tests share (no test module imports another): the chunk tests'
tilings (test_kv_cache.py, test_rolling_cache.py) and the two-pattern chunked spec that
test_kv_cache.py's shard_map subprocess compiles too. Strings only: no JAX."""

# Tilings of a spec's `tiling:` (flow mappings): 256 x 256 tiles of 128 x 128 compute blocks,
# and 128 x 256 tiles of one block each.
TWO_LEVEL = "{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}"
ONE_LEVEL = "{block_q: 128, block_kv: 256}"

TWO_PATTERNS = """
svgen: 1
name: kv_two
geometry: {frames: 6, height: 5, width: 7}
attention: {heads: 3, head_dim: 64, dtype: float32}
patterns:
  spatial:
    any_of:
      - first_frame: {frames: 1}
      - spatial_window: {frames: 1, rows: 1, cols: 2}
  temporal:
    any_of:
      - temporal_stride: {rows: 0, cols: 0}
      - expr: "abs(i_q - i_k) < 40"
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: temporal}
  assign: runtime
tiling: {block_q: 128, block_kv: 128}
runtime: {kv_cache: {chunk_frames: 3}}
"""
