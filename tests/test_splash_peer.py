"""Splash at its best as `svgen bench`'s peer (svgen.chip.splash_peer), on a CPU: each call's
mask (as data and as computed in the kernel) is the spec's mask of that call's pattern in
kernel order with padding never kept, the timed call holds the Splash kernels alone, the
search keeps the faster form and blocks, the winner is cached and re-timed, a stale winner is
searched again, and a whole bench in Pallas's interpreter checks Splash's output."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from helpers import dense_keep
from spec_corpus import TEMPORAL, any_of, spec_text
from svgen.chip import bench_table, chip_bench, splash_mask, splash_peer
from svgen.spec import parse_spec

# Two patterns of different layouts chosen at run time (heads 0, 2: band; head 1: the same
# place in every frame, temporal-major), and a sequence that Splash's blocks must pad.
MIXED = spec_text(
    "tiny_two_orders",
    (4, 8, 12, 40),
    3,
    dtype="bfloat16",
    layout="frame_major",
    patterns={
        "band": any_of("{band: {width: 100}}", "{prefix: {tokens: 20}}"),
        "temporal": TEMPORAL,
    },
    layouts={"temporal": "temporal_major"},
)


def _peer(compile_text, padded_blocks=(128, 128, 128)):
    plan, module = compile_text(MIXED)
    assignment = splash_mask.head_patterns(module)
    qkv = chip_bench.draw_inputs(module, seed=3)
    peer = splash_peer.Peer(module, plan, assignment, qkv, interpret=True)
    padded = splash_mask.padded_length(int(module.SEQ_LEN), *padded_blocks)
    peer.prepare(padded)
    return plan, module, peer, padded


def test_heads_are_grouped_by_pattern_one_call_each():
    assert splash_peer.head_groups((0, 1, 0, 2, 1)) == ((0, (0, 2)), (1, (1, 4)), (2, (3,)))
    assert splash_peer.head_groups((1, 1)) == ((1, (0, 1)),)


def test_each_calls_mask_is_its_patterns_mask_as_data_and_as_computed(compile_text):
    plan, module, peer, padded = _peer(compile_text)
    seq = int(module.SEQ_LEN)
    assert padded > seq  # padding present: it must keep nothing
    assert peer.describe() == [["band", 2], ["temporal", 1]]
    q = np.arange(padded, dtype=np.int32).reshape(-1, 1)
    k = np.arange(padded, dtype=np.int32).reshape(1, -1)
    for p, _ in peer.groups:
        want = np.zeros((padded, padded), bool)
        want[:seq, :seq] = dense_keep(plan.patterns[p].mask, plan.patterns[p].layout)
        data = peer.mask(p, "data")
        np.testing.assert_array_equal(data[:, :], want)
        computed = peer.mask(p, "computed")
        # what Splash's kernel computes on each partial block, here on every pair at once
        in_kernel = np.asarray(computed.mask_function(*np.broadcast_arrays(q, k)))
        np.testing.assert_array_equal(in_kernel[:seq], want[:seq])
        assert not in_kernel[:, seq:].any()  # padding keys never kept (padding rows dropped)
        np.testing.assert_array_equal(computed[128:256, 13:300], want[128:256, 13:300])
        assert computed == computed and computed != peer.mask(p, "computed")


def test_the_timed_call_is_the_splash_kernels_alone(compile_text):
    """No scaling, padding, slicing or gathering inside the timed function: those passes
    happen once, before timing (the harness a Splash user would write)."""
    _, _, peer, _ = _peer(compile_text)
    fn, args = peer.call(splash_peer.Config("data", (128, 128, 128)), backward=False)
    jaxpr = jax.make_jaxpr(fn)(*args)
    (inner,) = [e for e in jaxpr.eqns if e.primitive.name in ("pjit", "jit")]
    top = {e.primitive.name for e in inner.params["jaxpr"].jaxpr.eqns}
    for extra in ("pad", "mul", "slice", "gather", "concatenate", "dynamic_slice"):
        assert extra not in top, top
    assert len(args) == 3 * len(peer.groups)


class _Clock:
    """Fake timings: time_config(config) -> (Timing, output) from a table; configs not in the
    table fail as a compile error would."""

    def __init__(self, ms: dict):
        self.ms, self.calls = ms, []

    def __call__(self, config):
        self.calls.append(config.label())
        key = (config.mask, config.blocks, config.backward_blocks, config.fused)
        if key not in self.ms:
            raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space smem")
        t = self.ms[key] / 1e3
        return chip_bench.Timing(1.0, t, t, 3), f"output of {config.label()}"


FWD = splash_peer.FORWARD_BLOCKS


def test_the_search_keeps_the_faster_form_then_the_faster_blocks(tmp_path):
    ms = {
        ("computed", FWD[0], None, None): 9.0,
        ("data", FWD[0], None, None): 10.0,
        ("computed", FWD[1], None, None): 12.0,
        ("computed", FWD[2], None, None): 8.0,  # the winner
        ("data", FWD[2], None, None): 1.0,  # never tried: data lost at the first blocks
    }
    clock = _Clock(ms)
    cache = splash_peer.PeerCache(tmp_path)
    found = splash_peer.best(clock, "forward", "k", cache, None, lambda line: None)
    assert found["config"] == splash_peer.Config("computed", FWD[2])
    assert found["output"] == "output of computed 1024/1024/1024"
    assert not found["cached"]
    tried = {t["label"]: t for t in found["tried"]}
    assert len(tried) == 2 + len(FWD) - 1  # both forms at the first blocks, then one form
    assert "smem" in tried["computed 2048/1024/1024"]["error"]
    assert "data 1024/1024/1024" not in tried
    # a later run re-times the winner alone
    again = _Clock(ms)
    found = splash_peer.best(again, "forward", "k", splash_peer.PeerCache(tmp_path), None, print)
    assert again.calls == ["computed 1024/1024/1024"] and found["cached"]
    assert found["timing"].median_s == pytest.approx(8e-3)


def test_a_cached_winner_that_fails_now_is_searched_again(tmp_path):
    cache = splash_peer.PeerCache(tmp_path)
    cache.put("k", splash_peer.Config("computed", FWD[3]))
    clock = _Clock({("data", FWD[0], None, None): 5.0})
    found = splash_peer.best(clock, "forward", "k", cache, None, lambda line: None)
    assert found["config"] == splash_peer.Config("data", FWD[0]) and not found["cached"]
    assert found["tried"][0]["cached"] and "error" in found["tried"][0]
    assert splash_peer.PeerCache(tmp_path).get("k") == found["config"]


def test_the_backward_searches_fused_and_two_kernel_at_the_forwards_blocks_first():
    forward = splash_peer.Config("data", (512, 512, 512))
    configs = splash_peer.backward_candidates(forward)
    assert [(c.backward_blocks, c.fused) for c in configs[:2]] == [
        ((512, 512, 512), True),
        ((512, 512, 512), False),
    ]
    assert all(c.blocks == forward.blocks and c.mask == "data" for c in configs)
    assert len({(c.backward_blocks, c.fused) for c in configs}) == len(configs)
    ms = {
        ("data", (512, 512, 512), c.backward_blocks, c.fused): 20.0 + i
        for i, c in enumerate(configs)
    }
    ms[("data", (512, 512, 512), (1024, 1024, 512), False)] = 3.0
    found = splash_peer.best(
        _Clock(ms), "backward", "b", splash_peer.PeerCache(None), forward, print
    )
    assert found["config"].label() == "data 512/512/512, two-kernel bwd 1024/1024/512"


@pytest.mark.parametrize("text", ["", "[]", "null", '{"k": 3}', '{"k": {"mask": "x"}}', "{"])
def test_a_bad_cache_is_a_miss_not_a_crash(tmp_path, text):
    (tmp_path / "splash_peer.json").write_text(text)
    cache = splash_peer.PeerCache(tmp_path)
    assert cache.get("k") is None
    cache.put("k", splash_peer.Config("data", (128, 128, 128)))
    assert splash_peer.PeerCache(tmp_path).get("k") == splash_peer.Config("data", (128, 128, 128))


def test_a_cache_that_is_not_a_regular_file_is_a_miss(tmp_path):
    import os

    (tmp_path / "splash_peer.json").mkdir()
    assert splash_peer.PeerCache(tmp_path).get("k") is None
    other = tmp_path / "other"
    other.mkdir()
    os.mkfifo(other / "splash_peer.json")
    assert splash_peer.PeerCache(other).get("k") is None  # returns, never blocks on the FIFO


def test_bench_finds_splash_at_its_best_in_the_interpreter(monkeypatch):
    """The whole search in Pallas's interpreter (blocks scaled down): every form and block
    size runs, the winner is recorded with the calls Splash made, and its output is checked
    against the float32 reference."""
    monkeypatch.setattr(splash_peer, "FORWARD_BLOCKS", ((128, 128, 128), (256, 256, 128)))
    monkeypatch.setattr(splash_peer, "BACKWARD_BLOCKS", ((128, 128, 128),))
    spec = parse_spec(MIXED, source="tiny.yaml")
    options = chip_bench.Options(
        warmup=0,
        iters=1,
        interpret=True,
        check_rows=32,
        backward=True,
        dense_blocks=((128, 128, 128),),
    )
    result = chip_bench.bench_spec(spec, "v5e", options)
    forward, backward = result["splash_mask_forward"], result["splash_mask_backward"]
    assert forward["ok"] is True and forward["max_error"] < 2e-2
    assert forward["calls"] == [["band", 2], ["temporal", 1]]
    labels = [t["label"] for t in forward["tried"]]
    assert labels[:2] == ["computed 128/128/128", "data 128/128/128"]
    assert len(labels) == 3 and all("error" not in t for t in forward["tried"])
    assert backward["config"]["blocks"] == forward["config"]["blocks"]
    assert len(backward["tried"]) == 4 - 2 * (forward["blocks"] == [128, 128, 128])
    assert "speedup_vs_splash_mask_backward" in result
    table = bench_table.format_table([result], "cpu")
    assert f"({forward['label']})" in table[2] and f"({backward['label']})" in table[3]
