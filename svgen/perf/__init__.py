"""Performance tools beside the pipeline: libtpu's schedule of a kernel (`tpu_schedule`), the
static cost model built on it (`svgen cost`: `paths` reads a schedule into per-path costs,
`measure` compiles the kernels and caches those, `cost` models a call, `cost_text` prints
it), tiling search (`tune`, `svgen tune`) and the GPU modules' compile check without a GPU
(`gpu_aot`; the chips' descriptions are the analysis's, svgen/analysis/gpu_specs/). Nothing
in the pipeline imports them."""
