"""Per-video frame numbering of packed segments (`runtime: {per_video_frames: true}`).

With it, a video segment's tokens see frame f - s, s being the segment's first frame (see
svgen.runtime.segments for how s is found per call); text tokens keep frame 0. Only pairs of
one segment are ever kept, so what changes is the mask *inside* a segment: the mask at start
s, M_s(q, k) = M(q shifted by s, k shifted by s).

A term is *shift-invariant* when M_s = M for every s on the pairs one segment can hold:
built-ins that read frames only as differences of two video frames (spatial and temporal
windows, causal_frames, cube windows one frame deep) and the ones that read no frame at all
(band, prefix, text: positions stay the packed sequence's). An `expr` is invariant when
shifting the video frames it reads leaves it unchanged in each of the three cases a pair can
be (video-video, text query, text key; a text token's frame stays 0), decided by sympy
substitution: its frames must cancel. Each node says which it is (its NodeFacts's
shift_invariant, svgen.ir). Two built-ins are *anchored* at frame 0 and get closed forms
instead: first_frame (keys of frames < s + n) and block_causal (chunks counted from s).
An `expr` lowering reads as one of them is one of them (`f_k < 2` without text tokens is
first_frame 2). Anything else anchored (an expr such as `f_q + f_k <= 3`, or `f_k < 2` with
text tokens, a cube window several frames deep, `not` around an anchored term) is refused at
compile time, with the term named.

What the compiler derives (`video_frame_plan`):
  * the *superset* M+ = the union of M_s over every start: each anchored leaf replaced by
    the union of its shifts (first_frame n: video keys up to n - 1 frames after a video
    query, any video key for a text query; block_causal n: video pairs with f_k <= f_q + n -
    1), which unions and intersections preserve. Its visits are the static maximum a call's
    tables are refined from;
  * the *frame tree*: the mask as unions / intersections of invariant *groups* (maximal
    invariant subterms, each classified at compile time, its kinds valid at every start) and
    anchored leaves (kinds in closed form per call). The kernels' tables then get, for a block
    inside one segment, the kind of M at that segment's start (svgen.runtime.segments).
"""

from __future__ import annotations

import dataclasses


from svgen import ir

__all__ = ["NotPerVideo", "FrameTree", "frame_tree", "superset"]


class NotPerVideo(ValueError):
    """A term whose meaning under per-video frame numbering svgen cannot analyze."""

    def __init__(self, node, why: str):
        super().__init__(f"{node.describe()}: {why}")
        self.node = node
        self.why = why


@dataclasses.dataclass(frozen=True)
class FrameTree:
    """The mask as a tree of ("any_of" | "all_of", children...), ("group", j),
    ("first_frame", n) and ("block_causal", n); `groups[j]` is group j's node."""

    tree: tuple
    groups: tuple


def frame_tree(node) -> FrameTree:
    """Split `node` into invariant groups and anchored leaves (NotPerVideo if it cannot)."""
    groups: list = []

    def group(n) -> tuple:
        groups.append(n)
        return ("group", len(groups) - 1)

    def walk(n) -> tuple:
        return group(n) if n.shift_invariant() else anchored(n)

    def anchored(n) -> tuple:
        """A term known not to be invariant: a leaf in closed form, or a combination."""
        if isinstance(n, ir.FirstFrame):
            return ("first_frame", n.frames)
        if isinstance(n, ir.BlockCausal):
            return ("block_causal", n.frames)
        if isinstance(n, (ir.AnyOf, ir.AllOf)):
            op = "any_of" if isinstance(n, ir.AnyOf) else "all_of"
            invariant = [c.shift_invariant() for c in n.children]
            fixed = [c for c, inv in zip(n.children, invariant) if inv]
            parts = []
            if fixed:  # the invariant members: one group, one table
                parts.append(group(fixed[0] if len(fixed) == 1 else type(n)(tuple(fixed))))
            parts += [anchored(c) for c, inv in zip(n.children, invariant) if not inv]
            return (op, *parts)
        raise NotPerVideo(n, _why_not(n))

    return FrameTree(walk(node), tuple(groups))


def _why_not(node) -> str:
    if isinstance(node, ir.Predicate):
        return (
            "reads absolute frame numbers (its f_q / f_k do not cancel when a video's frames "
            "are shifted, or a text token's frame 0 meets a video frame); per_video_frames "
            "takes expr terms whose frames appear as f_q - f_k of two video tokens, and the "
            "built-ins first_frame and block_causal"
        )
    if isinstance(node, ir.CubeWindow):
        return "cubes several frames deep are aligned to frame 0: use cube_frames: 1"
    if isinstance(node, ir.Not):
        return "`not` around a term anchored at frame 0 (first_frame, block_causal)"
    return "svgen does not know how this term reads frame numbers"


def superset(node, frames: int):
    """M+: the union of the mask over every segment start (see the module docstring)."""
    if node.shift_invariant():
        return node
    if isinstance(node, ir.FirstFrame):
        reach = ir.AnyOf((ir.CausalFrames(), ir.SpatialWindow(node.frames - 1, None, None)))
        # A text query of the segment attends its video's first frames: any video key.
        text_queries = ir.AllOf((ir.Text(), ir.FirstFrame(frames)))
        return ir.AnyOf((reach, text_queries))
    if isinstance(node, ir.BlockCausal):
        return ir.AnyOf((ir.CausalFrames(), ir.SpatialWindow(node.frames - 1, None, None)))
    if isinstance(node, (ir.AnyOf, ir.AllOf)):
        return type(node)(tuple(superset(c, frames) for c in node.children))
    raise NotPerVideo(node, _why_not(node))
