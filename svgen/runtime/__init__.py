"""Hand-written code that runs: the Pallas kernels generated modules build, their calls and
run-time inputs (no dependency on spec/analysis; the NumPy format they share with the
compiler is svgen.core)."""
