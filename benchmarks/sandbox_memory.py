"""How far a sample trying to take 4 GB moves host free memory, with the sandbox's run-wide memory cap.

    python -m benchmarks.sandbox_memory [--cap-mib 1024]

The sample forks 6 children that each touch 700 MiB (under the 1 GiB ``RLIMIT_AS`` of one
process) and fills ``/dev/shm``, ``/tmp`` and its working directory: 4.3 GB in all if nothing
stopped it. A thread samples ``MemAvailable`` (``/proc/meminfo``) every 5 ms; the drop is the
baseline minus the lowest sample. Two runs: the cgroup cap (``validators.verifiers.cgroup``) and,
as a non-root grader without a cgroup would, the process-group watch alone.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from unittest import mock

from validators.verifiers import cgroup
from validators.verifiers.sandbox import Limits, run_python

MIB = 1 << 20
HOG = """
import os, time
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        b = bytearray(700 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
for path in ("/dev/shm/fill", "/tmp/fill", "fill"):
    try:
        with open(path, "wb") as f:
            for _ in range(100):
                f.write(bytes(1 << 20))
    except OSError:
        pass
for k in kids:
    os.waitpid(k, 0)
"""


def host_available() -> int:
    """Host ``MemAvailable`` in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def measure(limits: Limits) -> tuple[str, float, int | None, float]:
    """Run the hog once: (status, worst drop of host available memory in MiB, cgroup peak, seconds)."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(host_available())
            time.sleep(0.005)

    base = min(host_available() for _ in range(20))
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    res = run_python({"hog.py": HOG}, "hog.py", limits=limits)
    seconds = time.monotonic() - t0
    done.set()
    watcher.join()
    return res.status, (base - min(samples)) / MIB, res.memory_peak_bytes, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap-mib", type=int, default=1024)
    args = ap.parse_args()
    limits = Limits(timeout_s=30, total_memory_bytes=args.cap_mib * MIB)
    print(f"cap {args.cap_mib} MiB (all processes + tmpfs pages); the sample tries ~4300 MiB")
    print(f"{'mode':<22}{'status':<15}{'host drop MiB':>14}{'cgroup peak MiB':>17}{'seconds':>9}")
    runs = [("cgroup", None), ("process-group watch", mock.patch.object(cgroup, "create", lambda _: None))]
    for name, patch in runs:
        if patch is None and not cgroup.available():
            print(f"{name:<22}(no memory cgroup can be made here)")
            continue
        with patch or contextlib.nullcontext():
            status, drop, peak, seconds = measure(limits)
        peak_mib = f"{peak / MIB:.0f}" if peak else "-"
        print(f"{name:<22}{status:<15}{drop:>14.0f}{peak_mib:>17}{seconds:>9.1f}")


if __name__ == "__main__":
    main()
