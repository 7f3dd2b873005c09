"""Performance tools beside the pipeline: libtpu's schedule of a kernel (`tpu_schedule`), the
static cost model built on it (`cost`, `svgen cost`), tiling search (`tune`, `svgen tune`) and
the GPU modules' compile check without a GPU (`gpu_aot`; the chips' descriptions are the
analysis's, svgen/analysis/gpu_specs/). Nothing in the pipeline imports them."""
