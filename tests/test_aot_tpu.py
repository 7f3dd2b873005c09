"""Every shipped generated kernel, AOT-compiled for TPU v6e at its full geometry.

libtpu compiles for a v6e topology on this CPU-only host: Mosaic lowering, layouts, VMEM
use and the TPU backend all run, so a kernel Mosaic rejects fails here, not on a TPU.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import topologies

from helpers import REPO, SPECS, import_file
from tpu_helpers import compile_for_v6e, mosaic_kernels, v6e_device


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.stem)
def test_generated_kernels_and_gradients_compile_for_v6e(spec_path):
    """Every shipped module at full size, its forward call and (where `svgen compile` counts
    its programs) jax.grad through it: Mosaic and libtpu take the forward kernel (saving lse
    under the gradient) and the dk/dv walk that also accumulates dq (no dq kernel of its own).
    One compile of both, the one `svgen compile` counts a module's programs with (svgen.chip.program_size.kernel_bundles), cached by the
    module's files: the suite compiles each shipped module once, here or in test_cli's
    `compile --check` of the same files, and CI's `svgen compile specs/*.yaml` before it."""
    from svgen.analysis import analyze
    from svgen.cli.ownership import tables_loaded
    from svgen.chip import program_size
    from svgen.spec import load_spec

    module = REPO / "generated" / f"{spec_path.stem}.py"
    plan = analyze(load_spec(spec_path), target_name="v6e")
    if program_size.small_by_construction(plan):
        # `svgen compile` counts no program of tiles this small (far under the budget), so no
        # count is shared: the forward call alone at full size, its tables in SMEM as the chip
        # holds them (jax.grad's kernels at these tiles: test_separate_dq_kernel..., and the
        # scaled-down gradient tests).
        kernels = mosaic_kernels(compile_for_v6e(import_file(module)).as_text())
        _assert_svgen_forward(kernels)
        return
    files = {name: (module.parent / name).read_bytes() for name in tables_loaded(module)}
    files[module.name] = module.read_bytes()
    counts = program_size.kernel_bundles(files, plan)
    _assert_svgen_forward([name for name in counts if not program_size.is_backward(name)])
    assert "svgen_attention_dkv" in counts and "svgen_attention_dq" not in counts
    assert all(bundles > 0 for bundles in counts.values())


def _assert_svgen_forward(kernels: list[str]) -> None:
    """A forward call's Mosaic kernels: attention kernels (one per pattern where patterns run
    apart), and beside them only svgen's own permutes (a module whose kernel token order differs
    from the caller's runs svgen_permute_to_kernel / _from_kernel around them)."""
    attention = [name for name in kernels if name.startswith("svgen_attention")]
    permutes = {"svgen_permute_to_kernel", "svgen_permute_from_kernel"}
    assert attention and set(kernels) <= set(attention) | permutes, kernels


def test_the_static_call_of_a_module_with_run_time_inputs_compiles_for_v6e():
    """A module with run-time inputs compiles above with them (as `svgen compile` counts it);
    its call without them runs the static tables, other kernels: the forward call and jax.grad
    through it, in one program."""
    module = import_file(REPO / "generated" / "moc_480p_packed.py")
    assert module.attention.runtime.arguments()
    text = _compile_gradient(module, with_forward=True)
    assert {"svgen_attention", "svgen_attention_dkv"} <= set(mosaic_kernels(text))
    assert "svgen_attention_dq" not in text


def test_float32_and_batched_variants_compile(tmp_path):
    """The shipped spatial spec with float32 q, k, v, called batched ([2, heads, seq, d]), at
    its tiling over 3 frames: one program (float32 at other tilings and head dims: the
    head-dim cases below)."""
    from helpers import compile_spec_text

    text = (
        (REPO / "specs" / "wan21_720p_spatial.yaml")
        .read_text()
        .replace("dtype: bfloat16", "dtype: float32")
        .replace("frames: 21,", "frames: 3,")  # what differs is the dtype, not the length
    )
    assert "frames: 3," in text
    _, module32 = compile_spec_text(text, tmp_path)
    assert "tpu_custom_call" in compile_for_v6e(module32, batch=2).as_text()


def _compile_gradient(module, with_forward: bool = False) -> str:
    """The compiled HLO of jax.grad through the module's call at full size for v6e (and its
    forward call beside it in the same program, with_forward)."""
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    arg = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.dtype(module.DTYPE), sharding=sharding
    )
    head_pattern = jax.ShapeDtypeStruct((module.HEADS,), jnp.int32, sharding=sharding)

    def loss(q, k, v, hp):
        return jnp.sum(module.attention(q, k, v, head_pattern=hp).astype(jnp.float32))

    grad = jax.grad(loss, argnums=(0, 1, 2))

    def run(q, k, v, hp):
        if with_forward:
            return module.attention(q, k, v, head_pattern=hp), grad(q, k, v, hp)
        return grad(q, k, v, hp)

    return jax.jit(run).lower(arg, arg, arg, head_pattern).compile().as_text()


def test_separate_dq_kernel_compiles_for_v6e(monkeypatch, tmp_path):
    """The unfused alternative (dq in its own walk of the forward tables) compiles too: the
    mixed spec (two patterns, a temporal-major one) at a small size and two-level tiles."""
    from helpers import TWO_LEVEL, compile_spec_text, scaled_spec_text
    from svgen.runtime import backward

    monkeypatch.setattr(backward, "FUSED_DQ", False)
    mixed = REPO / "specs" / "wan21_720p_mixed.yaml"
    text = scaled_spec_text(mixed, tiling=TWO_LEVEL, dtype="bfloat16")
    _, module = compile_spec_text(text, tmp_path)
    text = _compile_gradient(module)
    assert "svgen_attention_dq" in text and text.count("tpu_custom_call") >= 3


def test_multi_tile_pieces_compile(tmp_path):
    """The kernel variant with a piece-length table (slots > 1) is accepted by Mosaic too: the
    band spec at 2,560 tokens and two-level tiles, its tables held to 800 bytes (2 slots)."""
    import re

    from helpers import compile_spec_text

    text = re.sub(
        r"^tiling:.*$",
        _tiling_line(128, 256, 128, 128),
        (REPO / "specs" / "wan21_720p_band.yaml").read_text(),
        flags=re.M,
    )
    text = text.replace("{frames: 21, height: 45, width: 80}", "{frames: 5, height: 16, width: 32}")
    plan, module = compile_spec_text(
        text.replace("tokens: 3600", "tokens: 300"), tmp_path, smem_budget=800
    )
    assert plan.tables.slots > 1
    assert "tpu_custom_call" in compile_for_v6e(module).as_text()


def test_profile_compiles_for_v6e():
    """Online profiling (plain XLA) runs inside jit on the TPU too, at full geometry: its
    head_pattern, traced, is what the attention takes traced (compiled so above)."""
    module = import_file(REPO / "generated" / "wan21_720p_mixed.py")
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    arg = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.bfloat16, sharding=sharding
    )
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding)
    lowered = jax.jit(lambda q, k, v, key: module.profile(q, k, v, key=key)).lower(
        arg, arg, arg, key
    )
    assert (lowered.out_info.shape, lowered.out_info.dtype) == ((module.HEADS,), jnp.int32)
    lowered.compile()


# Per target: tilings (block_q, block_kv, compute_q, compute_kv) from small to past the VMEM,
# one of each kind the VMEM model tells apart (one compute block a tile, several), each as near
# the limit as the compiler accepts (v6e's 2048 x 2048 block is its 3,328 x 2,816 one's kind).
BIG_TILINGS = {
    "v6e": [
        (3328, 2816, 3328, 2816),
        (2048, 4096, 1024, 512),
        (4096, 4096, 4096, 4096),
    ],
    "v5e": [(2048, 4096, 1024, 512), (4096, 4096, 4096, 4096), (8192, 8192, 8192, 8192)],
    "v7x": [(2048, 2048, 2048, 2048), (3328, 2816, 3328, 2816)],
}


@functools.lru_cache(maxsize=None)
def target_device(topology: str):
    return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]


@pytest.mark.parametrize("target", sorted(BIG_TILINGS))
def test_every_tiling_the_compiler_accepts_compiles_for_its_target(target, tmp_path):
    """`svgen compile --target T` accepts a tiling only if libtpu compiles it for T (at the
    VMEM limit the generated module asks for); the rest are refused with the VMEM error."""
    import re

    from helpers import compile_spec_text
    from svgen.spec.errors import SpecError
    from svgen.analysis.targets import TARGETS

    # The blog spec at 3 of its 21 frames (10,800 tokens, past the largest tile): VMEM is a
    # function of the tiles, not of the length, and a short video keeps the kernels' programs
    # small (at 21 frames the 2048 x 4096 kernel's straight-line words took 8 minutes of CPU).
    base = (
        (REPO / "specs" / "wan21_720p_band.yaml").read_text().replace("frames: 21,", "frames: 3,")
    )
    assert "frames: 3," in base
    outcomes = []
    for n, (bq, bkv, cq, ckv) in enumerate(BIG_TILINGS[target]):
        text = re.sub(
            r"^tiling:.*$",
            f"tiling: {{block_q: {bq}, block_kv: {bkv}, compute_q: {cq}, compute_kv: {ckv}}}",
            base,
            flags=re.M,
        )
        try:
            _, module = compile_spec_text(text, tmp_path / str(n), target_name=target)
        except SpecError as err:
            assert "of VMEM" in str(err) and f"on {target}" in str(err)
            outcomes.append("refused")
            continue
        assert module.TARGET == target
        device = target_device(TARGETS[target].topology)
        sharding = jax.sharding.SingleDeviceSharding(device)
        arg = jax.ShapeDtypeStruct(
            (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.bfloat16, sharding=sharding
        )
        compiled = jax.jit(lambda q, k, v: module.attention(q, k, v)).lower(arg, arg, arg).compile()
        assert "tpu_custom_call" in compiled.as_text()
        outcomes.append("compiled")
    assert outcomes[0] == "compiled" and outcomes[-1] == "refused"  # the list spans the limit


# Tilings `svgen compile` accepts, across head dims and dtypes: (id, heads, head_dim, dtype,
# frames x height x width, tiling). Sequences are short (VMEM depends on the tiles, not the
# length) and, but for the 512 tokens, end inside a compute block (the padding-key variant:
# more stack). The
# figures are libtpu's scoped VMEM need against the limit the module asked for before the
# VMEM model counted lane padding and the stack of the cross-lane row sum.
# (d64 bf16 at 2048 x 2048 tiles of 1024 x 512 blocks with the padding variant, 16.33 MiB needed
# where 15 were asked for: test_cogvideox_retiled_compiles, with text and two patterns.)
HEAD_DIM_TILINGS = [
    ("d64_bf16_2048x4096_1024x1024", 4, 64, "bfloat16", (3, 32, 95), (2048, 4096, 1024, 1024)),
    # ^ 29.62 of 19 MiB
    ("d64_f32_512_tokens_1024x2048_512x512", 1, 64, "float32", (1, 16, 32), (1024, 2048, 512, 512)),
    # ^ 14.94 of 11 MiB
    ("d64_bf16_one_2048x2048_block", 1, 64, "bfloat16", (3, 32, 47), (2048, 2048, 2048, 2048)),
    # ^ the most stack per tile element measured (3.43 bytes)
    ("d128_f32_2048x2048_1024x512", 1, 128, "float32", (3, 32, 47), (2048, 2048, 1024, 512)),
    # ^ 20.87 of 24 MiB: f32's operand splits, within the margin before, counted now
    ("d256_bf16_2048x2048_1024x512", 1, 256, "bfloat16", (3, 32, 47), (2048, 2048, 1024, 512)),
    # ^ 24.95 of 24 MiB
    ("d256_f32_1024x1024_512x512", 1, 256, "float32", (3, 32, 47), (1024, 1024, 512, 512)),
    # ^ 19.85 of 19 MiB
]


def _tiling_line(bq: int, bkv: int, cq: int, ckv: int) -> str:
    return f"tiling: {{block_q: {bq}, block_kv: {bkv}, compute_q: {cq}, compute_kv: {ckv}}}"


@pytest.mark.parametrize(
    "heads,head_dim,dtype,geometry,tiling",
    [case[1:] for case in HEAD_DIM_TILINGS],
    ids=[case[0] for case in HEAD_DIM_TILINGS],
)
def test_accepted_tilings_compile_at_every_head_dim(
    heads, head_dim, dtype, geometry, tiling, tmp_path
):
    """Every tiling the compiler accepts compiles for v6e at the VMEM limit the generated
    module asks for, at head dims 64, 128 and 256 in bf16 and f32 (a [block, 64] buffer takes
    128 lanes in VMEM, and with the row sum across lanes the compiler's stack grows with the
    tile: svgen.core.vmem)."""
    from helpers import compile_spec_text

    frames, height, width = geometry
    text = f"""svgen: 1
name: head_dim_{head_dim}
geometry: {{frames: {frames}, height: {height}, width: {width}, text_tokens: 0}}
attention: {{heads: {heads}, head_dim: {head_dim}, dtype: {dtype}}}
mask:
  any_of:
    - first_frame: {{frames: 1}}
    - spatial_window: {{frames: 1}}
{_tiling_line(*tiling)}
"""
    _, module = compile_spec_text(text, tmp_path)
    assert "tpu_custom_call" in compile_for_v6e(module).as_text()


def test_cogvideox_retiled_compiles(tmp_path):
    """The shipped head_dim 64 spec at 2048 x 2048 tiles of 1024 x 512 blocks (21.33 MiB
    needed, 17 asked for before), text first and two patterns, at 3 of its 11 frames (VMEM is
    a function of the tiles and the masks' query values, not of the length): its 12,466 tokens
    end inside a compute block (the padding-key variant: more stack), as its 45,106 do. The
    head-dim cases' d64 bf16 case at this tiling (16.33 MiB needed, 15 asked for before) is
    this one with fewer query values."""
    import re

    from helpers import compile_spec_text

    base = (
        (REPO / "specs" / "cogvideox_mixed.yaml").read_text().replace("frames: 11,", "frames: 3,")
    )
    assert "frames: 3," in base
    text = re.sub(r"^tiling:.*$", _tiling_line(2048, 2048, 1024, 512), base, flags=re.M)
    _, module = compile_spec_text(text, tmp_path)
    assert module.HEAD_DIM == 64 and module.SEQ_LEN % 512 == 178
    assert "tpu_custom_call" in compile_for_v6e(module).as_text()


# A process that loads libtpu the way a training job does (no sharing variable), so it takes
# libtpu's multi-process lock, and keeps it until killed. If a process outside the test holds
# the lock already, this one cannot load, and that process serves as the holder instead.
HOLDER = """
import time
from jax.experimental import topologies
try:
    topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2")
    print("holding", flush=True)
except Exception as error:
    if "lockfile" not in str(error):
        raise
    print("held elsewhere", flush=True)
time.sleep(600)
"""

# AOT-compiles a tiny Pallas kernel for v6e in a fresh process, after svgen's preparation
# (as the svgen command and the tests do) unless told to skip it.
COMPILE_TINY_KERNEL = """
import sys
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl, topologies
from svgen.runtime import libtpu_env
if sys.argv[1] == "prepare":
    assert libtpu_env.prepare(), "libtpu loaded before prepare()"
device = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2").devices[0]
arg = jax.ShapeDtypeStruct((8, 128), jnp.float32,
                           sharding=jax.sharding.SingleDeviceSharding(device))

def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

def fn(x):
    return pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)

print("compiled", "tpu_custom_call" in jax.jit(fn).lower(arg).compile().as_text())
"""

LIBTPU_NOISE = (
    "lockfile",
    "host bounds",
    "accelerator type",
    "worker hostname",
    "E0000",
    "WARNING",
)


def test_aot_compile_while_another_process_holds_libtpu():
    """libtpu is shared, not fought over: with svgen's environment a compile succeeds beside a
    process holding libtpu's lock, and prints nothing; without it, the same compile fails."""
    import subprocess
    import sys

    from helpers import unprepared_environment

    bare = unprepared_environment()  # as in a user's shell: none of svgen's variables
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        env=bare,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() in ("holding", "held elsewhere")

        def compile_tiny(mode):
            return subprocess.run(
                [sys.executable, "-c", COMPILE_TINY_KERNEL, mode],
                env=bare,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )

        shared = compile_tiny("prepare")
        unprepared = compile_tiny("bare")
    finally:
        holder.kill()
        holder.wait()
    assert shared.returncode == 0, shared.stderr[-3000:]
    assert shared.stdout.split() == ["compiled", "True"]
    assert not [noise for noise in LIBTPU_NOISE if noise in shared.stderr], shared.stderr
    # The control: the lock was really held, so the test above is not vacuous.
    assert unprepared.returncode != 0 and "lockfile" in unprepared.stderr


@pytest.mark.parametrize(
    "spec_name", ["hunyuan_720p_text", "wan21_720p_mixed", "hunyuan_720p_text+per_video"]
)
def test_run_time_segments_compile_for_v6e(spec_name, tmp_path):
    """A module with a `runtime:` section at full size: the forward kernel that reads the
    call's tables and segment ids (batched, and under jax.vmap), and for the text specs the
    gradient (both walks' run-time tables), pass Mosaic and libtpu; "+per_video": with
    per-video frame numbering (ids and frame shifts in [2, tile] blocks, shifted masks)."""
    from helpers import compile_spec_text

    spec_name, _, per_video = spec_name.partition("+")
    text = (REPO / "specs" / f"{spec_name}.yaml").read_text()
    has_text = "text_tokens" in text
    text += "runtime: {segments: true%s%s}\n" % (
        ", text_lengths: true" if has_text else "",
        ", per_video_frames: true" if per_video else "",
    )
    plan, module = compile_spec_text(text, tmp_path)
    assert bool(plan.video_frames) == bool(per_video)
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    arg = jax.ShapeDtypeStruct(
        (2, module.HEADS, module.SEQ_LEN, module.HEAD_DIM),
        jnp.dtype(module.DTYPE),
        sharding=sharding,
    )
    ids = jax.ShapeDtypeStruct((2, module.SEQ_LEN), jnp.int32, sharding=sharding)
    lengths = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=sharding)
    hp = jax.ShapeDtypeStruct((module.HEADS,), jnp.int32, sharding=sharding)

    def call(q, k, v, hp, s, t):
        extra = {"text_lengths": t} if has_text else {}
        return module.attention(q, k, v, head_pattern=hp, segment_ids=s, **extra)

    compiled = jax.jit(call).lower(arg, arg, arg, hp, ids, lengths).compile()
    assert "tpu_custom_call" in compiled.as_text()
    if has_text:
        one = jax.ShapeDtypeStruct(arg.shape[1:], arg.dtype, sharding=sharding)
        mapped = jax.vmap(call, in_axes=(0, 0, 0, None, 0, 0))
        mapped_text = (
            jax.jit(mapped)
            .lower(
                *(jax.ShapeDtypeStruct((2,) + one.shape, one.dtype, sharding=sharding),) * 3,
                hp,
                ids,
                lengths,
            )
            .compile()
            .as_text()
        )
        assert "tpu_custom_call" in mapped_text

        def loss(q, k, v, hp, s, t):
            return jnp.sum(call(q, k, v, hp, s, t).astype(jnp.float32))

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        text = grad.lower(arg, arg, arg, hp, ids, lengths).compile().as_text()
        assert "svgen_attention_dkv" in text
        assert {"svgen_attention", "svgen_attention_dkv"} <= set(mosaic_kernels(text))


def test_chunked_calls_compile_for_v6e():
    """The shipped KV-cache module's chunked call at full size (Self-Forcing's geometry):
    batched with a traced offset and head_pattern, under jax.vmap with an offset per
    element, and its gradient (the fused dk/dv walk), pass Mosaic and libtpu."""
    module = import_file(REPO / "generated" / "self_forcing_chunks.py")
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    rows, dtype = module.attention.kv_cache.rows, jnp.dtype(module.DTYPE)

    def struct(shape, dtype=dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    lead = (2, module.HEADS)
    chunk, cache = (
        struct(lead + (rows, module.HEAD_DIM)),
        struct(lead + (module.SEQ_LEN, module.HEAD_DIM)),
    )
    hp, offset = struct((module.HEADS,), jnp.int32), struct((), jnp.int32)

    def call(q, k, v, hp, f):
        return module.attention(q, k, v, head_pattern=hp, q_frame_offset=f)

    text = jax.jit(call).lower(chunk, cache, cache, hp, offset).compile().as_text()
    assert "tpu_custom_call" in text
    mapped = jax.vmap(call, in_axes=(0, 0, 0, None, 0))
    mapped_text = jax.jit(mapped).lower(chunk, cache, cache, hp, struct((2,), jnp.int32))
    assert "tpu_custom_call" in mapped_text.compile().as_text()

    def loss(q, k, v, hp, f):
        return jnp.sum(call(q, k, v, hp, f).astype(jnp.float32))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    text = grad.lower(chunk, cache, cache, hp, offset).compile().as_text()
    assert "svgen_attention_dkv" in text
    assert {"svgen_attention", "svgen_attention_dkv"} <= set(mosaic_kernels(text))


def test_rolling_cache_calls_compile_for_v6e():
    """The shipped rolling-cache module at full size: the chunked call against the ring
    (the slot-to-frame map's SMEM scalars read in BOUNDARY blocks), with a traced offset,
    under jax.vmap with an offset per element, and its gradient (the fused dk/dv walk),
    passes Mosaic and libtpu."""
    module = import_file(REPO / "generated" / "self_forcing_rolling.py")
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    cache = module.attention.kv_cache
    dtype = jnp.dtype(module.DTYPE)

    def struct(shape, dtype=dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    lead = (2, module.HEADS)
    chunk = struct(lead + (cache.rows, module.HEAD_DIM))
    ring = struct(lead + (cache.cache_tokens, module.HEAD_DIM))

    def call(q, k, v, f):
        return module.attention(q, k, v, q_frame_offset=f)

    text = jax.jit(call).lower(chunk, ring, ring, struct((), jnp.int32)).compile().as_text()
    assert "tpu_custom_call" in text
    mapped = jax.vmap(call, in_axes=(0, 0, 0, 0))
    text = jax.jit(mapped).lower(chunk, ring, ring, struct((2,), jnp.int32)).compile().as_text()
    assert "tpu_custom_call" in text

    def loss(q, k, v, f):
        return jnp.sum(call(q, k, v, f).astype(jnp.float32))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    text = grad.lower(chunk, ring, ring, struct((), jnp.int32)).compile().as_text()
    assert "svgen_attention_dkv" in text
    assert {"svgen_attention", "svgen_attention_dkv"} <= set(mosaic_kernels(text))


def test_bounded_softmax_compiles_for_v6e(tmp_path):
    """attention.softmax: bounded on the blog spec at full size: the tile's mode (a vector
    max stored to SMEM in init), the key-bound input and both twins of every path lower."""
    from helpers import compile_spec_text

    text = (REPO / "specs" / "wan21_720p_band.yaml").read_text()
    text = text.replace("dtype: bfloat16}", "dtype: bfloat16, softmax: bounded}")
    _, module = compile_spec_text(text, tmp_path)
    assert module.SHAPE.bounded_softmax
    assert "tpu_custom_call" in compile_for_v6e(module).as_text()


def test_bounded_softmax_gradient_compiles_for_v6e(tmp_path):
    from helpers import compile_spec_text

    text = (REPO / "specs" / "wan21_720p_band.yaml").read_text()
    text = text.replace("dtype: bfloat16}", "dtype: bfloat16, softmax: bounded}")
    text = text.replace("{frames: 21, height: 45, width: 80}", "{frames: 5, height: 16, width: 32}")
    text = text.replace("prefix: {tokens: 3600}", "prefix: {tokens: 512}")
    _, module = compile_spec_text(text, tmp_path)
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    arg = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.bfloat16, sharding=sharding
    )

    def loss(q, k, v):
        return jnp.sum(module.attention(q, k, v).astype(jnp.float32))

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(arg, arg, arg).compile()
    assert compiled.as_text().count("tpu_custom_call") >= 2
