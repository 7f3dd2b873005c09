"""What a real chip or toolchain says, and the figures it gave: timing a generated module on an
attached TPU (`chip_bench`, the engine of `svgen bench`, its table `bench_table`, and
`measured_tune`, `svgen tune --measure`), the yardstick it is timed against (Splash given the
same mask, `splash_mask`, at its best, `splash_peer`), what its output is checked against
(`output_check`, `int8_error`), a fingerprint of what is timed (`fingerprint`; of every call a
module traces, `kernel_fingerprint`), where a timing ran (`provenance`), the program-size budget
counted by libtpu (`program_size`, and per kernel `kernel_size`), the GPU modules' compile by
XLA, Triton and ptxas (`gpu_aot`) and their bench (`gpu_bench`), and the results pages written
from the chip's JSON (`results_page`, `results_tables`, `svgen report`). The chip tools without
an `svgen` command of their own run as `python -m svgen.chip.NAME`: a kernel change timed before
and after (`kernel_ab`), a kernel's paths isolated by rewriting its tables (`path_isolation`),
the run-time features against what a user would run instead (`runtime_features`), and
`kernel_fingerprint`, `kernel_size` and `gpu_bench` above. Everything here runs something or
reads what a run wrote; nothing here predicts a time. A figure computed without a toolchain or a
chip belongs to svgen.estimate, which this package may use (the program-size count reads
libtpu's schedule with it) and which never imports this one; a study of a question, run once for
a finding, belongs to bench/. No stage of the pipeline imports either package."""
