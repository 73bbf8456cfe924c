"""What one chaos scenario showed: its calls checked against the reference and the faults,
and the summary line the run prints.

The contract checked (`Outcome.problems`, empty when it holds):

* every call's tokens equal the no-offload reference reply;
* every call under faults ends within its no-fault latency (the same request's call in the
  last fault-free cycle) + one stall budget + the machine's noise (`MIN_TOLERANCE_S`);
* after each fault's recovery, a call that starts within `RECOVER_S` (plus the same noise
  allowance: a starved engine starts its next call late) is a hit (served at least the
  shared system prompt from the tier);
* no traceback in the engine logs.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_faults import Fault
from chaos_workload import HIT_TOKENS, Workload

MIN_TOLERANCE_S = 0.5
"""Least slack on each call's bound. The slack is the noise the same engine showed with no
fault (its last fault-free cycle's slowest call minus its median): this 2-core machine is
shared, and a fault-free call there varies by 0.1-2 s under load."""
RECOVER_S = 2.0


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The call records an engine wrote (`chaos_engine.py`); a torn last line (the engine
    was SIGKILLed while writing it) is left out."""
    calls = []
    for line in path.read_text().splitlines():
        try:
            calls.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return calls


@dataclass
class Outcome:
    """One scenario: the calls served before any fault (in cycles, the last one measures each
    request's no-fault latency) and under faults, the faults, the engines' logs."""

    name: str
    workload: Workload
    budget_s: float
    fault_free: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    faults: list[Fault]
    logs: dict[str, str]
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # found by the runner (exit codes, ...)
    no_fault: dict[int, float] = field(init=False)  # request index -> seconds
    tolerance_s: float = field(init=False)

    def __post_init__(self) -> None:
        last = max(c["cycle"] for c in self.fault_free)
        self.no_fault = {c["index"]: self.latency(c) for c in self.fault_free
                         if c["cycle"] == last}  # fmt: skip
        spread = max(self.no_fault.values()) - statistics.median(self.no_fault.values())
        self.tolerance_s = max(MIN_TOLERANCE_S, spread)

    @staticmethod
    def latency(call: dict[str, Any]) -> float:
        return float(call["t1"] - call["t0"])

    def bound(self, call: dict[str, Any]) -> float:
        return self.no_fault[call["index"]] + self.budget_s + self.tolerance_s

    def fault_of(self, call: dict[str, Any]) -> Fault | None:
        """The fault a call overlapped (or followed within a budget), if any."""
        for fault in self.faults:
            if call["t0"] <= fault.recovered + self.budget_s and call["t1"] >= fault.start:
                return fault
        return None

    def during(self, call: dict[str, Any]) -> str:
        fault = self.fault_of(call)
        return fault.label if fault else "no fault"

    def waits(self) -> list[int]:
        """Per fault: its calls that took most of a budget (80 %) beyond their no-fault
        latency (one stop should cost one such call)."""
        return [sum(1 for c in self.calls if self.fault_of(c) is fault
                    and self.latency(c) - self.no_fault[c["index"]] > 0.8 * self.budget_s)
                for fault in self.faults]  # fmt: skip

    def recoveries(self) -> list[tuple[Fault, float | None]]:
        """Per fault: seconds from its recovery to the start of the first call after it that
        was a hit (None: no hit before the run ended)."""
        found = []
        for fault in self.faults:
            hits = [c["t0"] for c in self.calls if c["t0"] >= fault.recovered
                    and c["cached"] >= HIT_TOKENS]  # fmt: skip
            found.append((fault, min(hits) - fault.recovered if hits else None))
        return found

    def identical(self) -> int:
        return sum(c["tokens"] == self.workload.replies[c["index"]] for c in self.calls)

    def problems(self) -> list[str]:
        found = list(self.failures)
        for c in self.fault_free + self.calls:
            if c["tokens"] != self.workload.replies[c["index"]]:
                found.append(f"{self.name}: request {c['index']} (cycle {c['cycle']}) "
                             f"tokens {c['tokens']} != reference "
                             f"{self.workload.replies[c['index']]}")  # fmt: skip
        for c in self.calls:
            if self.latency(c) > self.bound(c):
                found.append(f"{self.name}: request {c['index']} (cycle {c['cycle']}) took "
                             f"{self.latency(c):.2f} s > bound {self.bound(c):.2f} s "
                             f"(no-fault {self.no_fault[c['index']]:.2f} s); during "
                             f"{self.during(c)}")  # fmt: skip
        for fault, took in self.recoveries():
            if took is None or took > RECOVER_S + self.tolerance_s:
                seen = "no hit before the end" if took is None else f"{took:.2f} s"
                found.append(f"{self.name}: after {fault.label} (held "
                             f"{fault.recovered - fault.start:.1f} s): first hit {seen} after "
                             f"recovery (limit {RECOVER_S} s + {self.tolerance_s:.2f} s noise)")  # fmt: skip
        for name, log in self.logs.items():
            if "Traceback" in log:
                at = log.index("Traceback")
                found.append(f"{self.name}: traceback in {name}:\n{log[at : at + 3000]}")
        return found

    def summary(self) -> str:
        latencies = sorted(self.latency(c) for c in self.calls)
        worst = max(self.calls, key=self.latency)
        kinds = Counter(f.label for f in self.faults)
        took = [t for _, t in self.recoveries() if t is not None]
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        lines = [
            f"{self.name}: {len(self.faults)} faults ("
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")",
            f"  requests under faults {len(self.calls)}, identical {self.identical()} (and "
            f"{len(self.fault_free)} fault-free); call p50 {statistics.median(latencies):.2f} s, "
            f"p99 {p99:.2f} s, worst {self.latency(worst):.2f} s (its no-fault "
            f"{self.no_fault[worst['index']]:.2f} s, bound {self.bound(worst):.2f} s with "
            f"{self.tolerance_s:.2f} s noise, during {self.during(worst)})",
            f"  calls that waited about a budget: {sum(self.waits())} (at most "
            f"{max(self.waits(), default=0)} per fault)",
            "  recovery to the first hit: "
            + (f"median {statistics.median(took):.2f} s, worst {max(took):.2f} s"
               if took else "none measured"),
        ]  # fmt: skip
        return "\n".join(lines + [f"  {note}" for note in self.notes])
