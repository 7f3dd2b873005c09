"""svgen: video-attention mask specs compiled to specialized Pallas TPU kernels."""

from svgen.runtime import libtpu_env as _libtpu_env

# libtpu reads its environment once, when JAX first starts a backend (even for CPU work: JAX
# probes every installed plugin). Any svgen import (a generated module's included) comes
# before that in a script that imports svgen first: where no TPU chip is attached, libtpu then
# prints none of its "could not determine TPU accelerator type" / "unexpected worker
# hostname" warnings. On a TPU VM it changes nothing (svgen.runtime.libtpu_env.quiet).
_libtpu_env.quiet()
