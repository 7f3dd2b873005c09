"""Token layouts: host-side positions (analysis) and run-time permutations (kernel) agree."""

import jax.numpy as jnp
import numpy as np
import pytest

from svgen.runtime import coords
from svgen.core.layout import TokenLayout


def _layouts():
    for text, first in ((0, False), (7, True), (5, False)):
        for frames, anchors in ((1, 0), (4, 0), (4, 1), (5, 2), (3, 3)):
            yield TokenLayout(
                frames, 3, 4, text, "first" if first else "last", "temporal_major", anchors
            )
        yield TokenLayout(4, 3, 4, text, "first" if first else "last", "frame_major", 0)


@pytest.mark.parametrize("layout", list(_layouts()), ids=str)
def test_permutation_round_trip_and_agreement(layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, layout.seq_len, 8)).astype(np.float32)
    y = layout.to_kernel(jnp.asarray(x), jnp)  # as the kernel's wrapper runs it
    np.testing.assert_array_equal(np.asarray(layout.from_kernel(y, jnp)), x)
    np.testing.assert_array_equal(layout.to_kernel(x), np.asarray(y))  # NumPy, host side
    # Kernel position i holds the user's token original_index(i).
    original = layout.original_index(np.arange(layout.seq_len))
    np.testing.assert_array_equal(np.asarray(y), x[..., original, :])
    np.testing.assert_array_equal(layout.kernel_position[original], np.arange(layout.seq_len))


@pytest.mark.parametrize("layout", list(_layouts()), ids=str)
def test_coordinates_in_kernel_order(layout):
    """Kernel coordinates are the user token's coordinates; nominal order as documented."""
    pos = np.arange(layout.seq_len)
    c = layout.coordinates(pos)
    original = layout.original_index(pos)
    video = original - layout.video_start
    is_text = (video < 0) | (video >= layout.video_tokens)
    s = layout.tokens_per_frame
    np.testing.assert_array_equal(c.is_text, is_text)
    np.testing.assert_array_equal(c.frame, np.where(is_text, 0, video // s))
    np.testing.assert_array_equal(c.row, np.where(is_text, 0, (video % s) // layout.width))
    np.testing.assert_array_equal(c.col, np.where(is_text, 0, video % layout.width))
    place = video % s
    expected_nominal = (
        layout.video_start + place * layout.frames + video // s
        if layout.is_temporal_major
        else original
    )
    np.testing.assert_array_equal(c.index, np.where(is_text, original, expected_nominal))
    # The kernel's TokenCoords decode the same coordinates from kernel positions.
    t = coords.TokenCoords(jnp.asarray(pos, jnp.int32), layout)
    # ... and so do the kernel's query coordinates, decoded in row form, read as columns.
    rows = coords.QueryCoords(jnp.asarray(pos, jnp.int32)[None, :], layout)
    expected = {name: getattr(c, name) for name in ("frame", "row", "col", "index", "is_text")}
    expected["place"] = np.where(is_text, 0, place)
    for name, want in expected.items():
        np.testing.assert_array_equal(np.asarray(getattr(t, name)), want, name)
        np.testing.assert_array_equal(np.asarray(getattr(rows, name))[:, 0], want, name)


def test_temporal_major_puts_anchor_frames_first_and_places_together():
    lay = TokenLayout(4, 1, 3, 0, "last", "temporal_major", 1)
    # frame 0 (anchors) first, then place-major over frames 1..3
    assert lay.original_index(np.arange(12)).tolist() == [0, 1, 2, 3, 6, 9, 4, 7, 10, 5, 8, 11]
