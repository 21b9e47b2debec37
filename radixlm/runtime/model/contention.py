"""ContentionGuard: one-token decode steps drop to one thread while another process holds a core.

Runs inside the scheduler process (ModelRunner.forward). With N OpenMP threads on N cores, a CPU-bound
process beside us leaves one of our threads waiting for a core at every parallel region's closing
barrier, and a batch-1 step has ~120 of them (one a matmul): on the 2-core development VM, decode fell from
~60 to 1-5 tok/s while another process ran (docs/benchmarks.md, sessions 26 and 27). One thread has no
barriers, so it keeps ~3/4 of the two-thread speed whatever else runs.

The guard watches how long one-token steps take at each thread count and runs them at the faster one.
Two steps in a row at more than SLOW times the usual all-threads step switch to one thread at once; while
on one thread, a probe step at all threads every `probe_every` steps (doubling, up to PROBE_MAX, while the
probes lose) switches back once it is faster again; while on all threads, a probe on one thread every
PROBE_SINGLE steps catches contention that was there from the start (no usual time to compare with).
Only one-token steps through the model's decode stack are switched: their results have the same bits at
any thread count (the tiled GEMV's sums do not depend on how the rows are split, and the rest of the step
runs on one thread), so the guard never changes an output. The SLOW factor sits well above this VM's
memory-rate swings (~1.5x between processes), which are not contention.
"""

from __future__ import annotations

SLOW = 3.0  # a step this many times the usual all-threads step: a core is taken
SLOW_STEPS = 2  # consecutive slow steps before switching (one can be a page fault, a GC pause)
PROBE_FIRST = 32  # one-thread steps before the first probe at all threads
PROBE_MAX = 1024
PROBE_SINGLE = 256  # all-threads steps between probes on one thread (~0.1% of the time when quiet)
WEIGHT = 0.1  # of a new step in a running time (it drifts with the context)


class ContentionGuard:
    def __init__(self, full: int):
        self.full = full
        self.usual: dict[int, float] = {}  # threads -> running seconds of a one-token step
        self.single = False  # one-token steps run on one thread
        self.slow_streak = 0
        self.probe_every = PROBE_FIRST
        self.since_probe = 0
        self.switches = 0  # how often it changed its mind

    def threads(self) -> int:
        """Threads for the next one-token step."""
        if self.single:
            return self.full if self.since_probe >= self.probe_every else 1
        return 1 if self.since_probe >= PROBE_SINGLE else self.full

    def record(self, threads: int, seconds: float) -> None:
        """The step just run with `threads` (what threads() said) took `seconds` (wall clock)."""
        probe = (threads == 1) != self.single
        if probe:
            self.since_probe = 0
            if seconds < self.usual.get(1 if self.single else self.full, float("inf")):
                self.single = not self.single
                self.switches += 1
                self.probe_every, self.slow_streak = PROBE_FIRST, 0
                self.usual[threads] = seconds
            elif self.single:
                self.probe_every = min(2 * self.probe_every, PROBE_MAX)
            return
        self.since_probe += 1
        usual = self.usual.get(threads)
        if threads == self.full and usual is not None and seconds > SLOW * usual:
            self.slow_streak += 1
            if self.slow_streak >= SLOW_STEPS:
                self.single, self.slow_streak, self.since_probe = True, 0, 0
                self.switches += 1
            return
        self.slow_streak = 0
        self.usual[threads] = seconds if usual is None else (1 - WEIGHT) * usual + WEIGHT * seconds
