"""Straight-line BOUNDARY tiles (svgen.core.straight): a pattern's commonest blocks words
run as one straight-line body each, the rest through a branch per compute block.

The choice is checked against a count written from the definition, the kernel against
float64 attention in NaN-poisoned interpret mode (words with FULL and BOUNDARY blocks, words
that must leave the kv tile holding padding keys to the per-block branches, the bounded
softmax, aligned masks, residual masks), and the cost model's reading of a body.
"""

import numpy as np
import pytest

from svgen.analysis import residuals
from svgen.estimate.cost import PathCosts, model_cycles
from svgen.core import straight
from svgen.core.kinds import TileKind
from svgen.core.tables import KernelShape, PieceTables, as_runs

from helpers import aligned_user_keep, user_order_keep
from kernel_helpers import POISONED, mixed_inputs
from tpu_helpers import check_heads_on_keep

E, B, F = int(TileKind.EMPTY), int(TileKind.BOUNDARY), int(TileKind.FULL)

# A band with a prefix sink, as the blog spec at a small size: 600 tokens, so the last kv tile
# holds padding keys in its first block column; 2 x 4 compute blocks per tile.
BAND = """\
svgen: 1
name: straight_band
geometry: {{frames: 5, height: 8, width: 15}}
attention: {{heads: 2, head_dim: 128, dtype: {dtype}{softmax}}}
layout: frame_major
mask:
  any_of:
    - band: {{width: 150}}
    - prefix: {{tokens: 100}}
tiling: {{block_q: 256, block_kv: 512, compute_q: 128, compute_kv: 128{align}}}
"""


def _shape(q_blocks=2, kv_blocks=4, seq_len=4096) -> KernelShape:
    return KernelShape(
        seq_len=seq_len,
        padded_seq_len=-(-seq_len // (128 * kv_blocks)) * 128 * kv_blocks,
        block_q=128 * q_blocks,
        block_kv=128 * kv_blocks,
        compute_q=128,
        compute_kv=128,
        head_dim=128,
        heads=1,
    )


def _word(*kinds: int) -> int:
    return sum(kind << (2 * index) for index, kind in enumerate(kinds))


# -- the choice -------------------------------------------------------------------------


def _joined_by_definition(word: int, q_blocks: int, kv_blocks: int) -> int:
    """Per row of compute blocks, every non-empty block after the row's first one."""
    joined = 0
    for qi in range(q_blocks):
        busy = [(word >> (2 * (qi * kv_blocks + ki))) & 3 != E for ki in range(kv_blocks)]
        joined += max(sum(busy) - 1, 0)
    return joined


@pytest.mark.parametrize("seed", range(6))
def test_words_are_chosen_by_the_blocks_they_join(seed):
    rng = np.random.default_rng(seed)
    shape = _shape()
    words = [_word(*rng.choice([E, B, F], size=8, p=[0.4, 0.3, 0.3])) for _ in range(12)]
    runs = np.array(
        [[q, 0, int(rng.integers(1, 9)), B, words[q % len(words)]] for q in range(40)]
        + [[40, 0, 3, F, 0]]
    )
    chosen = straight.straight_words(runs, shape, whole_mask=True)
    steps: dict[int, int] = {}
    busy = 0
    for q, _, length, kind, word in runs.tolist():
        if kind == B:
            steps[word] = steps.get(word, 0) + length
            busy += length * sum((word >> (2 * i)) & 3 != E for i in range(8))
    score = {w: n * _joined_by_definition(w, 2, 4) for w, n in steps.items()}
    want = sorted((w for w in score if score[w]), key=lambda w: (-score[w], w))
    want = [w for w in want[: straight.MAX_WORDS] if score[w] >= straight.MIN_JOINED_SHARE * busy]
    assert [c.word for c in chosen] == want
    for c in chosen:
        assert straight.joined_blocks(c.word, shape) == _joined_by_definition(c.word, 2, 4)


def test_words_with_boundary_blocks_only_for_whole_masks():
    shape = _shape()
    mixed_word, aligned_word = _word(F, F, F, B, F, F, F, B), _word(F, F, E, E, E, F, F, E)
    runs = np.array([[0, 0, 9, B, mixed_word], [1, 0, 5, B, aligned_word]])
    whole = straight.straight_words(runs, shape, whole_mask=True)
    assert [c.word for c in whole] == [mixed_word, aligned_word]
    residual = straight.straight_words(runs, shape, whole_mask=False)
    assert [c.word for c in residual] == [aligned_word]


def test_a_boundary_block_in_the_padding_column_avoids_the_padding_tile():
    shape = _shape(seq_len=4096 + 300)  # the padding keys sit in block column 2 of kv tile 8
    assert (shape.padding_kv_tile, shape.padding_block_column) == (8, 2)
    in_column, elsewhere = _word(F, F, B, E, F, F, F, E), _word(F, F, F, B, F, B, E, E)
    runs = np.array([[0, 0, 9, B, in_column], [1, 0, 9, B, elsewhere]])
    chosen = {c.word: c.avoid_padding_tile for c in straight.straight_words(runs, shape, True)}
    assert chosen == {in_column: True, elsewhere: False}
    filled = _shape(seq_len=4096)  # no padding keys: nothing to avoid
    assert not any(c.avoid_padding_tile for c in straight.straight_words(runs, filled, True))


def test_no_words_without_several_blocks_or_boundary_tiles():
    assert straight.straight_words(np.array([[0, 0, 4, B, 0]]), _shape(1, 1), True) == ()
    full_only = np.array([[0, 0, 4, F, 0]])
    assert straight.straight_words(full_only, _shape(), True) == ()
    lone_blocks = np.array([[0, 0, 4, B, _word(B, E, E, E, F, E, E, E)]])  # one per row
    assert straight.straight_words(lone_blocks, _shape(), True) == ()


# -- the kernel ---------------------------------------------------------------------------


def _check(plan, module, dtype, aligned=False):
    q, k, v = mixed_inputs(plan, dtype, seed=11, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    pattern = plan.patterns[0]
    keep = aligned_user_keep(pattern) if aligned else user_order_keep(pattern)
    check_heads_on_keep(out, q, k, v, keep, dtype)


def _straight_steps(module) -> dict[int, int]:
    """Steps of each straight word in the module's tables (on the padding tile: negative)."""
    code = module.attention.codes[0]
    shape = module.SHAPE
    counts = {w.word: 0 for w in code.straight_words}
    for _, kv, length, kind, word in as_runs(module._PATTERNS[0].runs).tolist():
        for w in code.straight_words:
            if kind == B and word == w.word:
                on_padding = kv <= (shape.padding_kv_tile or -1) < kv + length
                counts[w.word] += length - on_padding
    return counts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("softmax", ["", ", softmax: bounded"])
def test_band_with_boundary_blocks_in_straight_words(dtype, softmax, compile_text):
    plan, module = compile_text(BAND.format(dtype=dtype, softmax=softmax, align=""))
    words = module.attention.codes[0].straight_words
    kinds = {k for w in words for k in w.kinds(8)}
    assert B in kinds and F in kinds  # bodies mixing masked and unmasked blocks
    assert any(w.avoid_padding_tile for w in words)
    assert all(_straight_steps(module).values())  # every body runs somewhere
    _check(plan, module, dtype)


@pytest.mark.parametrize("softmax", ["", ", softmax: bounded"])
def test_aligned_band(softmax, compile_text):
    plan, module = compile_text(
        BAND.format(dtype="float32", softmax=softmax, align=", align: balanced")
    )
    words = module.attention.codes[0].straight_words
    assert words and all(B not in w.kinds(8) for w in words)
    assert all(_straight_steps(module).values())
    _check(plan, module, "float32", aligned=True)


def test_sixteen_blocks_a_tile(compile_text):
    """4 x 4 compute blocks: a word whose last block is not EMPTY fills the int32's sign bit."""
    text = BAND.format(dtype="float32", softmax="", align="").replace(
        "block_q: 256, block_kv: 512", "block_q: 512, block_kv: 512"
    )
    plan, module = compile_text(text)
    words = module.attention.codes[0].straight_words
    assert any(w.word >= 1 << 31 for w in words)
    assert all(_straight_steps(module).values())
    _check(plan, module, "float32")


def test_a_wrong_body_is_caught(compile_text, monkeypatch):
    """Planted bug: straight bodies that run every block unmasked; the kernel's output then
    differs from the reference (so the kernel tests above can fail)."""

    def every_block_full(self, compute_blocks):
        return tuple(F if k != E else E for k in straight.block_kinds(self.word, compute_blocks))

    monkeypatch.setattr(straight.StraightWord, "kinds", every_block_full)
    plan, module = compile_text(BAND.format(dtype="float32", softmax="", align=""))
    assert module.attention.codes[0].straight_words
    with pytest.raises(AssertionError, match="head 0"):
        _check(plan, module, "float32")


def test_residual_masks_keep_their_per_block_choice(compile_text, monkeypatch):
    """A pattern with residual masks: only words without BOUNDARY blocks run straight."""
    monkeypatch.setattr(residuals, "MIN_SAVED_OPS", 1)  # variants for a small case
    monkeypatch.setattr(residuals, "MIN_SAVED_SHARE", 0.0)
    text = """\
svgen: 1
name: straight_residual
geometry: {frames: 8, height: 4, width: 32}
attention: {heads: 2, head_dim: 128, dtype: float32}
mask: {expr: "abs(f_q - f_k) <= 1 or f_k == 7 and h_q == h_k"}
tiling: {block_q: 256, block_kv: 512, compute_q: 128, compute_kv: 128}
"""
    plan, module = compile_text(text)
    code = module.attention.codes[0]
    assert code.residual_masks and code.straight_words
    assert all(B not in w.kinds(8) for w in code.straight_words)
    assert all(_straight_steps(module).values())
    _check(plan, module, "float32")


# -- the model ----------------------------------------------------------------------------


def test_the_model_charges_a_straight_word_its_body():
    shape_word, other_word = _word(F, F, B, E), _word(F, B, E, E)
    paths = PathCosts(
        bookkeeping=10,
        full=100,
        mixed=(20,),
        block=(((30, 50, 60), (31, 51, 61), (32, 52, 62), (33, 53, 63)),),
        init=(5,),
        finalize=7,
        pipeline=3,
        straight=(((shape_word, True, 90),),),
    )
    runs = np.array([[0, 0, 3, B, shape_word], [1, 0, 1, B, other_word]])
    tables = PieceTables.from_runs([runs], 1, compute_blocks=4)
    _, steps, by_path = model_cycles(paths, tables, [0])
    assert steps["mixed"] == 4
    assert by_path["mixed"] == 3 * 90 + (20 + 30 + 51)
    # On the kv tile holding padding keys the word takes the per-block branches.
    _, _, by_path = model_cycles(paths, tables, [0], padding_tile=1)
    assert by_path["mixed"] == 2 * 90 + (20 + 30 + 31 + 62) + (20 + 30 + 51)
    assert PathCosts.from_json(paths.to_json()) == paths


def test_the_module_names_the_words_its_kernel_runs_straight(compile_text):
    """The docstring (and `svgen inspect`, which prints the same lines) names exactly the
    words the imported kernel chose, with their steps."""
    plan, module = compile_text(BAND.format(dtype="float32", softmax="", align=""))
    words = module.attention.codes[0].straight_words
    line = next(x for x in module.__doc__.splitlines() if "Straight-line BOUNDARY tiles" in x)
    steps = _straight_steps(module)
    cells = line.split(": ", 2)[2].split(", ")
    # The docstring counts every step of a word, the padding tile's too.
    assert [c.split(" ")[0] for c in cells] == [straight.word_glyphs(w.word, 2, 4) for w in words]
    assert all(int(c.split(" ")[1]) >= steps[w.word] for c, w in zip(cells, words))
