"""Environment for libtpu in a process that compiles for TPUs (svgen's commands, tests, example).

libtpu loads when JAX first starts its backends (even for CPU work: JAX probes every
installed plugin) and for every AOT compile for a TPU topology. It reads these variables once,
when it loads, so ``prepare()`` must run before that:

* ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``: libtpu locks ``/tmp/libtpu_lockfile`` so that two
  processes never drive the same chips; a second process fails with "ABORTED: Internal error
  when accessing libtpu multi-process lockfile". With this variable it loads beside the
  holder (and takes no lock itself). Compiling for a named topology touches no chip, so
  sharing is safe. The lock file belongs to the process holding it: never delete it.
* ``TPU_HOST_BOUNDS=1,1,1`` and ``TPU_WORKER_HOSTNAMES=localhost``, only where no TPU chip is
  attached: libtpu then cannot learn its slice from the TPU VM's metadata and prints warnings
  that read like a crash ("Failed to find host bounds for accelerator type", "E0000 ...
  unexpected worker hostname"). Declaring a one-host slice on this host silences them;
  compiles are unaffected (the AOT topology is named explicitly; `svgen cost` reads the same
  bundles with and without them). On a TPU VM libtpu learns
  the real values, so they are left alone there.

Values already in the environment always win. Nothing here imports JAX's backends.
"""

from __future__ import annotations

import os

SHARING = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
"""Set in every process that prepares: libtpu loads beside other processes holding it."""
NO_CHIP = {"TPU_HOST_BOUNDS": "1,1,1", "TPU_WORKER_HOSTNAMES": "localhost"}
"""Set where no TPU chip is attached: a one-host slice on this host, so libtpu stays quiet."""


def libtpu_loaded() -> bool:
    """Whether libtpu is mapped into this process (Linux; elsewhere assume not)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libtpu" in line for line in maps)
    except OSError:
        return False


def _tpu_chips_attached() -> bool:
    """Whether this host has TPU chips (JAX's own PCI probe). Unknown counts as yes, so that
    a TPU VM never gets the one-host defaults: the worst case elsewhere is libtpu's noise."""
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # a private JAX module: moved or changed in another jax version
        return True


def prepare() -> bool:
    """Set the variables above (unless already set); False when libtpu had already loaded,
    so that they come too late to take effect in this process."""
    wanted = dict(SHARING)
    if not _tpu_chips_attached():
        wanted.update(NO_CHIP)
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    return not libtpu_loaded()
