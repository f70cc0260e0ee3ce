"""What a benchmark run leaves in its output directory (results, machine facts, other processes'
CPU over time), read alike by bench/report.py and bench/streams-report.py."""

import json
from pathlib import Path


def load(out: Path):
    """The run's result rows, its machine facts, and the CPU log: (unix ms, cumulative ms of CPU
    used by processes outside the benchmark)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    machine = dict(
        line.split("=", 1) for line in (out / "machine.txt").read_text().splitlines() if "=" in line
    )
    cpu = []
    for line in (out / "cpu.log").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            cpu.append((int(parts[0]), int(parts[1])))
    return rows, machine, cpu


def foreign_cores_of(cpu):
    """A function of t0 and t1 (unix ms): the CPU cores other processes used on average between
    them, or None."""

    def foreign_cores(t0, t1):
        if len(cpu) < 2 or t1 <= t0:
            return None

        def at(t):
            before = [c for c in cpu if c[0] <= t]
            after = [c for c in cpu if c[0] >= t]
            if not before:
                return cpu[0][1]
            if not after:
                return cpu[-1][1]
            (ta, va), (tb, vb) = before[-1], after[0]
            return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)

        return (at(t1) - at(t0)) / (t1 - t0)

    return foreign_cores
