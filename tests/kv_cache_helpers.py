"""What the KV-cache tests share (no test module imports another): the chunk tests'
tilings and their one-pattern spec (test_kv_cache.py, test_rolling_cache.py), and the
two-pattern chunked spec that test_kv_cache.py's shard_map subprocess compiles too. Strings
only: no JAX."""

from spec_corpus import ANCHOR, any_of, spec_text

# Tilings of a spec's `tiling:` (flow mappings): 256 x 256 tiles of 128 x 128 compute blocks,
# and 128 x 256 tiles of one block each.
TWO_LEVEL = "{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}"
ONE_LEVEL = "{block_q: 128, block_kv: 256}"


def chunk_spec(name: str, frames: int, window_frames: int, cache: str) -> str:
    """The chunk tests' spec as a template of %(dtype)s and %(tiling)s: frames of 160 tokens
    (8 x 20), the first frame and a window of ``window_frames`` frames and 3 rows, in the
    chunks ``cache`` says (the kv_cache section)."""
    return spec_text(
        name,
        (frames, 8, 20),
        2,
        head_dim=64,
        dtype="%(dtype)s",
        layout="frame_major",
        mask=any_of(ANCHOR, f"{{spatial_window: {{frames: {window_frames}, rows: 3}}}}"),
        tiling="%(tiling)s",
        runtime=f"{{kv_cache: {cache}}}",
    )


TWO_PATTERNS = spec_text(
    "kv_two",
    (6, 5, 7),
    3,
    head_dim=64,
    patterns={
        "spatial": any_of(ANCHOR, "{spatial_window: {frames: 1, rows: 1, cols: 2}}"),
        "temporal": any_of(
            "{temporal_stride: {rows: 0, cols: 0}}", '{expr: "abs(i_q - i_k) < 40"}'
        ),
    },
    runtime="{kv_cache: {chunk_frames: 3}}",
)
