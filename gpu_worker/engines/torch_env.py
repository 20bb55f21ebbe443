"""What a process's environment must say before torch and transformers load, for the CPU engines: no model hub, and
OpenMP threads that spin briefly between two kernels.

- No hub at run time: a missing file must fail, not start a download.
- Brief spinning: torch's CPU kernels run in an OpenMP team of the thread that calls them, and libgomp reads how the
  team's threads wait, once, when torch is imported. By default a thread with nothing to do spins 300,000 times before
  it sleeps, but only 100 times as soon as the process holds more OpenMP threads than CPUs, which it does once two
  threads have used torch: the engines load on one thread of asyncio's pool and decode on whichever is free. A
  decoding step runs hundreds of short kernels, and a thread that sleeps between two of them is woken for the next:
  with 100 spins a step of one row took 44 ms on two cores, with 300,000 (a single team) 23 ms. But a team that
  spins so starves other processes: three test processes on two cores (``make test``'s), each engine loading and
  decoding on one thread of its own, ran the CPU-engine tests in 186 s, against 83 s with the engine as it was. A
  thousand spins, a few microseconds, keep a step of one row at 26 to 28 ms whatever the teams
  (``OMP_WAIT_POLICY=ACTIVE`` makes the count hold when threads outnumber CPUs too), and those tests took 56 to 64 s.
  docs/worker-bounds.md has the runs; ``make bench-cpu-engine`` measures the step.

Defaults only: a value the deployment sets is kept. Too late once torch is imported (a test module importing it first,
say); ``tests/conftest.py`` calls ``before_torch`` before any test module is imported.
"""

from __future__ import annotations

import os

DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_WAIT_POLICY": "ACTIVE",
    "GOMP_SPINCOUNT": "1000",
}


def before_torch() -> None:
    """Set the defaults this module describes, where the environment does not set them already."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
