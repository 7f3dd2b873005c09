"""svgen.estimate.paths reads a grid step's paths from the branches the kernel declares
(svgen.runtime.branch_tree.step), each by its name. On a schedule laid out from that
declaration, every branch a body of its own size, each path costs the bodies it runs; a
schedule that lacks a declared branch is refused, naming what was expected. No libtpu: the
schedules here are built, not compiled (test_cost.py reads compiled ones)."""

from __future__ import annotations

import dataclasses

import pytest

from svgen.core.straight import StraightWord
from svgen.estimate import paths
from svgen.estimate.tpu_schedule import DELAY_SLOTS, Bundle, Loop, Schedule
from svgen.estimate.tpu_schedule import Branch as Jump
from svgen.runtime.branch_tree import step
from svgen.runtime.variant import Branches

# The bundles of a branch instruction and its delay slots: run whether or not it is taken.
JUMP = 1 + DELAY_SLOTS
# The phases that do matmuls (the others are init, finalize: how read_paths finds the step).
_MATMUL = ("full", "mixed", "segment", "padded", "bounded", "online")
PADDING = ("plain", "padding")  # a masked body's twins on the padding column


def _schedule(declared, skip_bodies: frozenset[str] = frozenset()) -> tuple[Schedule, dict]:
    """A one-step schedule of the `declared` branches, inside the pipeline's per-step branch:
    each branch a jump, then its own body (own[path] bundles), then its children. Returns
    it and `own` by the branch's path of names; `skip_bodies`: names whose children are left
    out (a schedule that disagrees with the declaration)."""
    jumps, own, address = [], {}, 0

    def emit(branch, depth: int, path: tuple[str, ...]) -> None:
        nonlocal address
        start = address
        own[path] = 3 + 2 * len(own)  # every body of a size of its own
        address += JUMP + own[path]
        if branch.name not in skip_bodies:
            for child in branch.children:
                emit(child, depth + 1, path + (child.name,))
        matmul = {"vmatmul": 1} if depth >= 1 and branch.name.startswith(_MATMUL) else {}
        jumps.append(Jump(start, address, "p0", depth, matmul))

    pipeline = address
    address += JUMP
    for branch in declared:
        emit(branch, 1, (branch.name,))
    jumps.append(Jump(pipeline, address, "p1", 0, {}))
    bundles = tuple(Bundle(a, (), ()) for a in range(address))
    jumps.sort(key=lambda j: j.address)
    return Schedule(bundles, (Loop(0, address - 1, 8),), tuple(jumps)), own


WORD = StraightWord(word=0b01_01_10_01, avoid_padding_tile=False)
BRANCHES = Branches(
    patterns=2,
    compute_blocks=4,
    q_blocks_per_tile=2,
    segmented=False,
    padded_column=None,
    bounded=False,
    residuals=(0, 1),
    straight=((WORD,), ()),
    padding_column=1,
)


def test_each_path_costs_the_bodies_its_declared_branches_run():
    assert [b.name for b in step(BRANCHES)[1:-1]] == list(BRANCHES.phases())
    schedule, own = _schedule(step(BRANCHES))
    read = paths.read_paths(schedule, BRANCHES)
    top = ("init", "full", "mixed[0]", "mixed[1]", "finalize")
    bookkeeping = JUMP + JUMP * len(top)  # the pipeline's jump, each phase's
    assert read.bookkeeping == bookkeeping and read.pipeline == JUMP
    assert read.full == bookkeeping + own[("full",)]
    assert read.init == (own[("init",)],) * 2 and read.finalize == own[("finalize",)]
    assert read.program == len(schedule.bundles)

    # mixed[0]: its straight word's body, then the per-block branches in one (`blocks`)
    tile = ("mixed[0]",)
    entered = bookkeeping + own[tile] + 2 * JUMP  # straight[0]'s jump and blocks'
    assert read.straight == (((WORD.word, False, entered + own[tile + ("straight[0]",)]),), ())
    blocks = tile + ("blocks",)
    assert read.mixed[0] == entered + own[blocks] + 4 * 2 * JUMP  # full@i, boundary@i
    for index, (full, plain, padding) in enumerate(read.block[0]):
        assert full == own[blocks + (f"full@{index}",)]
        boundary = blocks + (f"boundary@{index}",)
        if index % 2 == 1:  # the padding column: the masked body's twins
            assert plain == own[boundary] + 2 * JUMP + own[boundary + ("plain",)]
            assert padding == own[boundary] + 2 * JUMP + own[boundary + ("padding",)]
        else:
            assert plain == padding == own[boundary]

    # mixed[1]: no words; each BOUNDARY block picks its residual variant, the whole mask first
    tile = ("mixed[1]",)
    assert read.mixed[1] == bookkeeping + own[tile] + 4 * 2 * JUMP
    for index, (full, whole, _) in enumerate(read.block[1]):
        boundary = tile + (f"boundary@{index}",)
        variant = boundary + ("variant[0]",)
        twins = 2 * JUMP + own[variant + ("plain",)] if index % 2 == 1 else 0
        assert full == own[tile + (f"full@{index}",)]
        assert whole == own[boundary] + 2 * JUMP + own[variant] + twins
        ((residual, residual_padding),) = read.residual_block[1][index]
        variant = boundary + ("variant[1]",)
        twins = [2 * JUMP + own[variant + (t,)] if index % 2 == 1 else 0 for t in PADDING]
        assert residual == own[boundary] + 2 * JUMP + own[variant] + twins[0]
        assert residual_padding == own[boundary] + 2 * JUMP + own[variant] + twins[1]


def test_a_bounded_kernel_reads_its_online_set_as_the_fallback():
    branches = dataclasses.replace(BRANCHES, bounded=True)
    names = [b.name for b in step(branches)]
    assert names == ["init", "bounded", "online", "finalize"]
    schedule, own = _schedule(step(branches))
    read = paths.read_paths(schedule, branches)
    # the online twin runs no straight bodies; each set's paths skip the other set
    assert read.straight and read.fallback.straight == ()
    assert read.fallback.full - read.fallback.bookkeeping == own[("online", "full")]
    assert read.full - read.bookkeeping == own[("bounded", "full")]


def test_a_schedule_without_a_declared_branch_is_refused():
    schedule, _ = _schedule(step(BRANCHES), skip_bodies=frozenset({"boundary@1"}))
    with pytest.raises(RuntimeError, match=r"expected 2 branches \(plain, padding\), found 0"):
        paths.read_paths(schedule, BRANCHES)


def test_one_block_tiles_read_their_twin_phases_by_name():
    """Tiles of one compute block across segments: each pattern's SEGMENT_BOUNDARY twin is a
    phase of its own; a selection's tile holding padding keys, the padded phase."""
    segments = dataclasses.replace(
        BRANCHES, compute_blocks=1, q_blocks_per_tile=1, segmented=True, padding_column=0
    )
    assert segments.phases() == ("full", "mixed[0]", "segment[0]", "mixed[1]", "segment[1]")
    schedule, own = _schedule(step(segments))
    read = paths.read_paths(schedule, segments)
    for p in range(2):
        twin = (f"segment[{p}]",)
        plain, padding = read.segment_block[p][0]
        assert plain == own[twin] + 2 * JUMP + own[twin + ("plain",)]
        assert padding == own[twin] + 2 * JUMP + own[twin + ("padding",)]
    selection = dataclasses.replace(
        BRANCHES, compute_blocks=1, q_blocks_per_tile=1, padded_column=0, padding_column=0
    )
    assert selection.phases()[-1] == "padded"
    read = paths.read_paths(_schedule(step(selection))[0], selection)
    assert len(read.padded_block) == 1 and read.mixed == (read.bookkeeping,) * 2
