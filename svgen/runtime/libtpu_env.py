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

Values already in the environment always win. Nothing here imports JAX: commands that never
start it (`svgen compile`, `svgen inspect`) call ``prepare()`` too.
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


#: Where Linux lists PCI devices, one directory each with `vendor` and `device` files.
PCI_DEVICES = "/sys/bus/pci/devices"
GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips are Google PCI devices
#: Google PCI devices that are not TPUs (gVNIC, the network card of Google Cloud VMs; its
#: NVMe disks): every other Google device counts as a chip, so that a TPU generation newer
#: than this list still counts.
GOOGLE_NON_TPU_DEVICES = frozenset({"0x0042", "0x001f"})


def _tpu_chips_attached(devices: str = PCI_DEVICES) -> bool:
    """Whether this host has TPU chips: a Google PCI device that is not a known non-TPU one
    (the same sysfs files JAX's own probe reads; read here so that commands which never start
    JAX need not import it, 2 s on a loaded machine). Unreadable counts as yes, so that a TPU
    VM never gets the one-host defaults: the worst case elsewhere is libtpu's noise."""
    try:
        entries = list(os.scandir(devices))
    except FileNotFoundError:  # no PCI bus in sysfs (not Linux): libtpu finds no chip either
        return False
    except OSError:
        return True
    for entry in entries:
        try:
            with open(os.path.join(entry.path, "vendor")) as fh:
                if fh.read().strip() != GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(entry.path, "device")) as fh:
                if fh.read().strip() not in GOOGLE_NON_TPU_DEVICES:
                    return True
        except FileNotFoundError:  # not a device directory
            continue
        except OSError:
            return True
    return False


def prepare() -> bool:
    """Set the variables above (unless already set); False when libtpu had already loaded,
    so that they come too late to take effect in this process. For processes that compile
    (svgen's commands, tests, benches): sharing libtpu is safe only where no process drives
    chips through it, which a compile never does."""
    wanted = dict(SHARING)
    if not _tpu_chips_attached():
        wanted.update(NO_CHIP)
    return _set_defaults(wanted)


def quiet() -> bool:
    """Only the no-chip variables, only where no TPU chip is attached (what a generated
    module sets when it is imported): libtpu stays quiet on a host without TPUs, and on a
    TPU VM nothing changes, so its lock still keeps two processes off the same chips.
    Returns as prepare() does."""
    return _set_defaults({} if _tpu_chips_attached() else dict(NO_CHIP))


def _set_defaults(wanted: dict[str, str]) -> bool:
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    return not libtpu_loaded()
