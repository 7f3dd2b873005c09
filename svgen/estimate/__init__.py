"""The static estimate: what a kernel should cost on a TPU, worked out on this host without
a chip. libtpu's schedule of a kernel (`tpu_schedule`) read into per-path costs (`paths`),
the kernels compiled for a target and those costs cached (`measure`), the model of a call
over the tables (`cycle_model`), `svgen cost` (`cost`, its report `cost_report` and text
`cost_text`) and `svgen tune`'s search over tilings ranked by that model (`tune`, with
`tune_rows`, `path_estimate`, `tiling_rewrite` and `tune_text`). Nothing here times a
kernel, runs one on a chip, or reads a chip's results: that is svgen.chip, which may import
this package, never the other way round. No stage of the pipeline imports either."""
