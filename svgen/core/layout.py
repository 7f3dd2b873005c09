"""Token layouts: where each token sits in the kernel's sequence. The one layout type of svgen:
the spec's geometry, the compiler's analysis, the generated modules and the kernel all use it.

NumPy only, and no import of the compiler: reading a spec loads this module and nothing of JAX;
the permutations take the array module (`xp`) they run in.

Users pass tokens in the *original* order: video frame-major (f*S + h*W + w, S = H*W), text
before (`text_position: first`) or after (`last`) the video. `order` fixes the order the
kernel sees (the *kernel order*) and the *nominal order* that `band`, `prefix` and `i_q/i_k`
refer to:

  frame_major     kernel = nominal = original order.
  temporal_major  nominal video order is p*T + f (p = h*W + w, T = frames): the same place in
                  consecutive frames is adjacent, so a temporal head becomes a narrow band.
                  The kernel order keeps the first `anchor_frames` frames first, in
                  frame-major order, then the other frames temporal-major
                  (p*(T - anchor) + f - anchor): a first-frame anchor is then one contiguous
                  block of keys instead of a stride-T comb across every tile.
  tiled           Sliding Tile Attention's cube-major order, for a cube of a x b x c
                  (cube_frames x cube_rows x cube_cols): the video is cut into cubes of a
                  frames, b rows and c columns, the cubes follow each other in
                  (frame group, row group, column group) order and the tokens inside a cube
                  in (f, h, w) order, so that each cube is a contiguous run of the kernel's
                  sequence. When a size does not divide the geometry the last group of that
                  axis is smaller (partial cubes): frame group gf holds fa = min(a, F - gf*a)
                  frames, row group gh hb = min(b, H - gh*b) rows, column group gw
                  wc = min(c, W - gw*c) columns, and video token (f, h, w) sits at
                      gf*a*H*W + fa*(gh*b*W + hb*gw*c) + ((f % a)*hb + h % b)*wc + w % c
                  (gf = f // a, gh = h // b, gw = w // c): the frame groups before it, the
                  row groups of its frame group before it (fa*b*W tokens each), the cubes of
                  its row group before it (fa*hb*c tokens each), then its place in the cube.
                  The nominal order is the kernel order itself (the layout's own order, as
                  for temporal_major; there are no anchor frames), so a band is a band of
                  cubes.
  curve           frame_major with each frame's places along a space-filling curve
                  (`layout: {curve: hilbert}` or `morton`, svgen.core.curves): frames in
                  order, place curve_places[j] at position j of its frame. The nominal order
                  is the kernel order (a band is a band along the curve). The kernel decodes
                  a position's frame as frame_major does, never its row or column: a mask of
                  a curve layout may not read them (svgen.analysis refuses it), which leaves
                  frames, positions, text and block masks given as data. With
                  `over: video` the curve runs through the whole video in three dimensions
                  (video_curve_order): the kernel decodes no frame either, and a mask may
                  read positions, text and block masks given as data only.
Text tokens keep their place (first or last) in all orders.

  transposed      frame_major or temporal_major of the video's frames transposed: the kernel
                  sees each frame as `height` rows of `width` places where the video has
                  `width` rows of `height` (the layout's height and width are the kernel's,
                  the video's width and height). Kernel (row r, column c) is video (row c,
                  column r), so frame_major transposed walks places column by column
                  ([f, w, h]: f*S + w*H + h in the video's sizes) and temporal_major
                  transposed walks places column-first, frames innermost ([w, h, f]).
                  Everything past the user's order (the analysis, the mask the kernel runs,
                  its coordinates) sees the transposed frame: a spec's mask is transposed to
                  match (svgen.ir's Node.transposed), and only `original_index`, `to_kernel`
                  and `from_kernel` know the video's own sizes.

The field names are the spec's keys (`geometry:` and `layout:`), so a layout reads the same in
a spec, in a generated module and in a test.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import numpy as np

from svgen.core.curves import CURVE_SCOPES, CURVES, FRAME, VIDEO, curve_places, video_curve_order

FRAME_MAJOR = "frame_major"
TEMPORAL_MAJOR = "temporal_major"
TILED = "tiled"
ORDERS = (FRAME_MAJOR, TEMPORAL_MAJOR, TILED)
TEXT_POSITIONS = ("first", "last")


class ComputeBlocks:
    """Compute blocks inside a tile, for a class with block_q, block_kv, compute_q and
    compute_kv (None: the whole tile): the spec's `Tiling` and the kernel's `KernelShape` say
    it once, here (the spec may not import the runtime's table format, and both may import
    this module)."""

    block_q: int
    block_kv: int
    compute_q: int | None
    compute_kv: int | None

    @property
    def cq(self) -> int:
        return self.compute_q or self.block_q

    @property
    def ckv(self) -> int:
        return self.compute_kv or self.block_kv

    @property
    def q_blocks_per_tile(self) -> int:
        return self.block_q // self.cq

    @property
    def kv_blocks_per_tile(self) -> int:
        return self.block_kv // self.ckv

    @property
    def compute_blocks(self) -> int:
        return self.q_blocks_per_tile * self.kv_blocks_per_tile


@dataclasses.dataclass(frozen=True)
class Tiled:
    """A spec's `layout: {tiled: {frames: a, rows: b, cols: c}}`: the tiled order and its
    cube (what `TokenLayout.with_order` takes besides the names of ORDERS)."""

    frames: int
    rows: int
    cols: int


AXES = ("f", "h", "w")


@dataclasses.dataclass(frozen=True)
class AxisOrder:
    """A spec's `layout: {order: [a, b, c]}`: the video's tokens in lexicographic order of
    these axes (f: frame, h: row, w: column), the first outermost. Each of the six is one of
    the orders above (`TokenLayout.with_order`):

        [f, h, w] frame_major          [h, w, f] temporal_major
        [f, w, h] frame_major, transposed    [w, h, f] temporal_major, transposed
        [h, f, w] tiled, cubes of every frame x 1 row x every column
        [w, f, h] tiled, cubes of every frame x every row x 1 column
    """

    axes: tuple[str, str, str]

    def __post_init__(self):
        if sorted(self.axes) != sorted(AXES):
            raise ValueError(f"an axis order is a permutation of f, h, w; got {self.axes}")

    def words(self) -> str:
        return "[" + ", ".join(self.axes) + "]"


@dataclasses.dataclass(frozen=True)
class Curve:
    """A spec's `layout: {curve: hilbert}`: frame_major with each frame's places along the
    curve (svgen.core.curves)."""

    kind: str
    over: str = FRAME  # one of CURVE_SCOPES: each frame's places, or the whole video

    def __post_init__(self):
        if self.kind not in CURVES:
            raise ValueError(f"unknown curve {self.kind!r}; known: {', '.join(CURVES)}")
        if self.over not in CURVE_SCOPES:
            raise ValueError(f"a curve runs over one of {CURVE_SCOPES}, got {self.over!r}")

    def words(self) -> str:
        where = "each frame" if self.over == FRAME else "the whole video"
        return f"{self.kind} curve over {where}"


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    frames: int
    height: int
    width: int
    text_tokens: int = 0
    text_position: str = "last"  # one of TEXT_POSITIONS
    order: str = FRAME_MAJOR  # one of ORDERS
    anchor_frames: int = 0  # temporal_major only: frames kept first, in frame-major order
    # tiled only: the cube's frames, rows and columns (0 in the other orders)
    cube_frames: int = 0
    cube_rows: int = 0
    cube_cols: int = 0
    # frame_major / temporal_major of the transposed frame: height and width are the
    # kernel's (the video's width and height; see the module docstring)
    transposed: bool = False
    # frame_major only: each frame's places (curve_over "frame") or the whole video's tokens
    # ("video") along this curve (svgen.core.curves; "" none)
    curve: str = ""
    curve_over: str = FRAME

    def __post_init__(self):
        if self.curve and (self.order != FRAME_MAJOR or self.transposed):
            raise ValueError("a curve layout is frame_major, not transposed")
        if self.curve:
            Curve(self.curve, self.curve_over)  # checks both
        if self.order == TILED and min(self.cube) < 1:
            raise ValueError(f"a tiled layout needs positive cube sizes, got {self.cube}")
        if self.transposed and self.order == TILED:
            raise ValueError("a tiled layout is not transposed (its cubes give the orders)")

    def with_order(
        self, order: "str | Tiled | AxisOrder | Curve", anchor_frames: int = 0
    ) -> "TokenLayout":
        """The same tokens (a layout of the video's own frame) in another kernel order: a name
        of ORDERS, a Tiled cube, an AxisOrder or a Curve (anchor frames only for
        temporal_major)."""
        if isinstance(order, AxisOrder):
            return self._with_axes(order, anchor_frames)
        if isinstance(order, Curve):
            plain = self.with_order(FRAME_MAJOR)
            return dataclasses.replace(plain, curve=order.kind, curve_over=order.over)
        anchors = anchor_frames if order == TEMPORAL_MAJOR else 0
        cube = (order.frames, order.rows, order.cols) if isinstance(order, Tiled) else (0, 0, 0)
        return dataclasses.replace(
            self,
            order=TILED if isinstance(order, Tiled) else order,
            curve="",
            curve_over=FRAME,
            anchor_frames=anchors,
            cube_frames=cube[0],
            cube_rows=cube[1],
            cube_cols=cube[2],
        )

    def _with_axes(self, order: AxisOrder, anchor_frames: int) -> "TokenLayout":
        axes = order.axes
        if axes in (("h", "f", "w"), ("w", "f", "h")):  # one cube per row or per column
            one_row = axes[0] == "h"
            cube = Tiled(self.frames, 1 if one_row else self.height, self.width if one_row else 1)
            return self.with_order(cube)
        base = TEMPORAL_MAJOR if axes[2] == "f" else FRAME_MAJOR
        plain = self.with_order(base, anchor_frames)
        if axes not in (("f", "w", "h"), ("w", "h", "f")):
            return plain
        return dataclasses.replace(plain, height=self.width, width=self.height, transposed=True)

    # -- sizes -----------------------------------------------------------------------------

    @property
    def tokens_per_frame(self) -> int:
        return self.height * self.width

    @property
    def video_tokens(self) -> int:
        return self.frames * self.tokens_per_frame

    @property
    def seq_len(self) -> int:
        return self.video_tokens + self.text_tokens

    @property
    def text_first(self) -> bool:
        return self.text_position == "first"

    @property
    def video_start(self) -> int:
        """First video position, in every order."""
        return self.text_tokens if self.text_first else 0

    @property
    def text_start(self) -> int:
        return 0 if self.text_first else self.video_tokens

    @property
    def is_temporal_major(self) -> bool:
        return self.order == TEMPORAL_MAJOR

    @property
    def is_tiled(self) -> bool:
        return self.order == TILED

    @property
    def curve_over_video(self) -> bool:
        """A curve through the whole video: frames are not runs of positions."""
        return bool(self.curve) and self.curve_over == VIDEO

    @property
    def curve_order(self) -> np.ndarray:
        """curve: the place (row * width + col) at each position of a frame, or over the whole
        video the video index (frame * H * W + place) at each video position."""
        if self.curve_over_video:
            return video_curve_order(self.curve, self.frames, self.height, self.width)
        return curve_places(self.curve, self.height, self.width)

    @property
    def curve_digest(self) -> str:
        """curve: sha256 of `curve_order` (int32 little-endian), what a generated module pins
        and checks on import (svgen.core.tables.check_curve)."""
        return hashlib.sha256(self.curve_order.astype("<i4").tobytes()).hexdigest()

    @property
    def cube(self) -> tuple[int, int, int]:
        """tiled: (cube_frames, cube_rows, cube_cols)."""
        return self.cube_frames, self.cube_rows, self.cube_cols

    @property
    def main_frames(self) -> int:
        """temporal_major: frames after the anchor block (T')."""
        return self.frames - self.anchor_frames

    @property
    def main_start(self) -> int:
        """temporal_major: first kernel position of the temporal-major block."""
        return self.video_start + self.anchor_frames * self.tokens_per_frame

    # -- coordinates of kernel positions (host side) ---------------------------------------

    def video_frame_place(self, video: np.ndarray):
        """(frame, place p = h*W + w) of kernel video offsets (position - video_start)."""
        s = self.tokens_per_frame
        if self.is_tiled:
            frame, row, col = self.tiled_coordinates(video)
            return frame, row * self.width + col
        if self.curve_over_video:
            return np.divmod(self.curve_order[video], s)
        if self.curve:
            return video // s, self.curve_order[video % s]
        if not self.is_temporal_major:
            return video // s, video % s
        anchor = video < self.anchor_frames * s
        main = np.maximum(video - self.anchor_frames * s, 0)
        t = max(self.main_frames, 1)
        frame = np.where(anchor, video // s, self.anchor_frames + main % t)
        place = np.where(anchor, video % s, main // t)
        return frame, place

    def tiled_coordinates(self, video: np.ndarray):
        """tiled: (frame, row, col) of kernel video offsets, peeling the levels of the order
        (frame group, row group, cube, frame of the cube, row of the cube) one by one: each
        level's units have one size except the last, partial one, which comes last."""
        a, b, c = self.cube
        big_h, big_w = self.height, self.width
        v = np.asarray(video, dtype=np.int64)
        gf = v // (a * big_h * big_w)
        v = v - gf * (a * big_h * big_w)
        fa = np.minimum(a, self.frames - gf * a)
        gh = v // (fa * b * big_w)
        v = v - gh * (fa * b * big_w)
        hb = np.minimum(b, big_h - gh * b)
        gw = v // (fa * hb * c)
        v = v - gw * (fa * hb * c)
        wc = np.minimum(c, big_w - gw * c)
        df, v = v // (hb * wc), v % (hb * wc)
        return gf * a + df, gh * b + v // wc, gw * c + v % wc

    def tiled_offset(self, frame, row, col):
        """tiled: the kernel video offset of video token (frame, row, col) (the formula of
        the module docstring; NumPy arrays or ints)."""
        a, b, c = self.cube
        gf, gh, gw = frame // a, row // b, col // c
        fa = np.minimum(a, self.frames - gf * a)
        hb = np.minimum(b, self.height - gh * b)
        wc = np.minimum(c, self.width - gw * c)
        return (
            gf * (a * self.tokens_per_frame)
            + fa * (gh * b * self.width + hb * gw * c)
            + ((frame - gf * a) * hb + row - gh * b) * wc
            + col
            - gw * c
        )

    def coordinates(self, positions: np.ndarray) -> "Coordinates":
        """Coordinates of kernel positions; text tokens have frame = row = col = 0."""
        pos = np.asarray(positions, dtype=np.int64)
        video = pos - self.video_start
        is_text = (video < 0) | (video >= self.video_tokens)
        frame, place = self.video_frame_place(np.where(is_text, 0, video))
        frame, place = np.where(is_text, 0, frame), np.where(is_text, 0, place)
        nominal = pos
        if self.is_temporal_major:
            nominal = np.where(is_text, pos, self.video_start + place * self.frames + frame)
        return Coordinates(
            frame=frame,
            row=place // self.width,
            col=place % self.width,
            index=nominal,
            is_text=is_text,
            position=pos,
        )

    def original_index(self, positions: np.ndarray) -> np.ndarray:
        """The user's token index of each kernel position (the permutation into kernel order)."""
        pos = np.asarray(positions, dtype=np.int64)
        video = pos - self.video_start
        is_text = (video < 0) | (video >= self.video_tokens)
        frame, place = self.video_frame_place(np.where(is_text, 0, video))
        if self.transposed:  # kernel (row, col) is the video's (col, row); its width: height
            place = (place % self.width) * self.height + place // self.width
        return np.where(is_text, pos, self.video_start + frame * self.tokens_per_frame + place)

    @functools.cached_property
    def kernel_position(self) -> np.ndarray:
        """int32 [seq_len]: the kernel position of each user token index."""
        out = np.empty(self.seq_len, np.int32)
        out[self.original_index(np.arange(self.seq_len))] = np.arange(self.seq_len, dtype=np.int32)
        return out

    # -- permutations of [..., seq_len, d] arrays (the wrapper's HBM cost) -----------------

    @property
    def is_identity(self) -> bool:
        """Kernel order equals the user's order (no permutation)."""
        if self.transposed and min(self.height, self.width) > 1:
            return False
        if self.curve:
            return bool(np.array_equal(self.curve_order, np.arange(len(self.curve_order))))
        if self.is_tiled:
            return self._tiled_is_frame_major
        return not self.is_temporal_major or self.main_frames <= 1

    @property
    def _tiled_is_frame_major(self) -> bool:
        """A cube order walks tokens frame-major unless an axis split into several groups is
        walked before a finer axis of the cube that has more than one value: several column
        groups with cubes of several rows or frames, or several row groups with cubes of
        several frames."""
        a, b, c = (
            min(n, size) for n, size in zip(self.cube, (self.frames, self.height, self.width))
        )
        split_cols = c < self.width and (a > 1 or b > 1)
        split_rows = b < self.height and a > 1
        return not (split_cols or split_rows)

    @property
    def moves_by_reshape(self) -> bool:
        """Whether to_kernel / from_kernel are reshapes and transposes of whole cubes alone (a
        tiled order whose cubes divide the video), with no slicing, joining or gather."""
        return self.is_tiled and self._tiled_divides

    @property
    def _tiled_divides(self) -> bool:
        a, b, c = self.cube
        return self.frames % a == 0 and self.height % b == 0 and self.width % c == 0

    @functools.cached_property
    def _user_index(self) -> np.ndarray:
        """int32 [seq_len]: original_index of every kernel position (the gather into kernel
        order)."""
        return self.original_index(np.arange(self.seq_len)).astype(np.int32)

    def to_kernel(self, x, xp=np):
        """x [..., seq_len, d] in the user's order -> kernel order (reshape + transpose; a
        gather for a tiled order with partial cubes)."""
        if self.is_identity:
            return x
        if self.curve:  # places in no pattern a reshape follows: one gather
            return xp.take(x, self._user_index, axis=-2)
        if self.is_tiled:
            return self._tiled_to_kernel(x, xp)
        if self.transposed:
            return self._untransposed.to_kernel(self._transpose_frames(x, xp, True), xp)
        text, video = self._split(x)
        lead, d = video.shape[:-2], video.shape[-1]
        frames = video.reshape(lead + (self.frames, self.tokens_per_frame, d))
        anchor = frames[..., : self.anchor_frames, :, :].reshape(lead + (-1, d))
        main = xp.swapaxes(frames[..., self.anchor_frames :, :, :], -3, -2).reshape(lead + (-1, d))
        return self._join(text, xp.concatenate([anchor, main], axis=-2), xp)

    def from_kernel(self, y, xp=np):
        """The inverse of to_kernel."""
        if self.is_identity:
            return y
        if self.curve:
            return xp.take(y, self.kernel_position, axis=-2)
        if self.is_tiled:
            return self._tiled_from_kernel(y, xp)
        if self.transposed:
            return self._transpose_frames(self._untransposed.from_kernel(y, xp), xp, False)
        text, video = self._split(y)
        lead, d = video.shape[:-2], video.shape[-1]
        split = self.anchor_frames * self.tokens_per_frame
        anchor = video[..., :split, :].reshape(
            lead + (self.anchor_frames, self.tokens_per_frame, d)
        )
        main = xp.swapaxes(
            video[..., split:, :].reshape(lead + (self.tokens_per_frame, self.main_frames, d)),
            -3,
            -2,
        )
        frames = xp.concatenate([anchor, main], axis=-3).reshape(lead + (-1, d))
        return self._join(text, frames, xp)

    def _tiled_to_kernel(self, x, xp):
        if not self._tiled_divides:
            return xp.take(x, self._user_index, axis=-2)
        text, video = self._split(x)
        lead, d = video.shape[:-2], video.shape[-1]
        (a, b, c), n = self.cube, len(lead)
        grid = (self.frames // a, a, self.height // b, b, self.width // c, c)
        video = video.reshape(lead + grid + (d,))
        # (groups f, a, groups h, b, groups w, c) -> (groups f, groups h, groups w, a, b, c)
        axes = tuple(range(n)) + tuple(n + i for i in (0, 2, 4, 1, 3, 5, 6))
        return self._join(text, xp.transpose(video, axes).reshape(lead + (-1, d)), xp)

    def _tiled_from_kernel(self, y, xp):
        if not self._tiled_divides:
            return xp.take(y, self.kernel_position, axis=-2)
        text, video = self._split(y)
        lead, d = video.shape[:-2], video.shape[-1]
        (a, b, c), n = self.cube, len(lead)
        cubes = (self.frames // a, self.height // b, self.width // c, a, b, c)
        video = video.reshape(lead + cubes + (d,))
        axes = tuple(range(n)) + tuple(n + i for i in (0, 3, 1, 4, 2, 5, 6))
        return self._join(text, xp.transpose(video, axes).reshape(lead + (-1, d)), xp)

    @property
    def _untransposed(self) -> "TokenLayout":
        """The same kernel order over frames already transposed (frame-major [W, H] frames)."""
        return dataclasses.replace(self, transposed=False)

    def _transpose_frames(self, x, xp, to_kernel: bool):
        """Each video frame of x [..., seq_len, d] transposed: the video's [H, W] places to
        the kernel's [W, H] (`to_kernel`), or back."""
        text, video = self._split(x)
        lead, d = video.shape[:-2], video.shape[-1]
        rows, cols = (self.width, self.height) if to_kernel else (self.height, self.width)
        frames = video.reshape(lead + (self.frames, rows, cols, d))
        return self._join(text, xp.swapaxes(frames, -3, -2).reshape(lead + (-1, d)), xp)

    def _split(self, x):
        v0, n = self.video_start, self.video_tokens
        text = x[..., :v0, :] if self.text_first else x[..., n:, :]
        return text, x[..., v0 : v0 + n, :]

    def _join(self, text, video, xp):
        if self.text_tokens == 0:
            return video
        parts = [text, video] if self.text_first else [video, text]
        return xp.concatenate(parts, axis=-2)


@dataclasses.dataclass(frozen=True)
class Coordinates:
    """Coordinates of a set of positions; text tokens have frame = row = col = 0."""

    frame: np.ndarray
    row: np.ndarray
    col: np.ndarray
    index: np.ndarray  # position in the layout's nominal order
    is_text: np.ndarray
    # The kernel position itself (what a block mask given as data is indexed by); None for
    # coordinates made up by the analysis, which no such mask reads.
    position: np.ndarray | None = None

    def reshape(self, *shape: int) -> "Coordinates":
        return Coordinates(
            *(
                None if getattr(self, f.name) is None else getattr(self, f.name).reshape(shape)
                for f in dataclasses.fields(self)
            )
        )
