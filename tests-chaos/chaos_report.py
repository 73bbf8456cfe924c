"""What one chaos scenario showed: its calls checked against the reference and the faults,
and the summary line the run prints.

The contract checked (`Outcome.problems`, empty when it holds):

* every call's tokens equal the no-offload reference reply;
* every call under faults ends within its no-fault time (the same request's call in the
  last fault-free cycle) + one stall budget + the machine's noise (`MIN_TOLERANCE_S`). A
  call's time is its latency where there is a budget: a call that waits on a member spins
  in vLLM's engine loop meanwhile, so its waits for a CPU cannot be told from the stall.
  A scenario whose calls touch no network member has no budget (`budget_s` 0), and its
  call's time is the latency less `cpu_wait_s`: the time the calling thread was runnable
  but waited for a CPU held by other processes (the kernel's run delay);
* after each fault's recovery the first hit (a call served at least the shared system
  prompt from the tier) starts within `RECOVER_S` plus the same noise allowance. It is
  counted from the recovery (SIGCONT sent, the restarted process serving), except after a
  restart, or a stop outlasting what the backend keeps a silent member for, that came back
  empty: no hit on the blocks it held is possible until they are
  stored again, which the first call that starts after the restart does as it ends, so it
  is counted from that call's end (or from the recovery when that call already hit). A
  measurement the next fault cuts short before its limit is reported as interrupted, not
  checked;
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


@dataclass(frozen=True)
class Recovery:
    """How one fault's recovery went: seconds to the first hit (None: no hit), and whether
    the next fault (or the run's end) came before the limit without one."""

    fault: Fault
    since: float  # monotonic: what the time to the first hit counts from
    took: float | None
    interrupted: bool


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
        self.no_fault = {c["index"]: self.own(c) for c in self.fault_free
                         if c["cycle"] == last}  # fmt: skip
        spread = max(self.no_fault.values()) - statistics.median(self.no_fault.values())
        self.tolerance_s = max(MIN_TOLERANCE_S, spread)

    @staticmethod
    def latency(call: dict[str, Any]) -> float:
        return float(call["t1"] - call["t0"])

    def own(self, call: dict[str, Any]) -> float:
        """The call's time the bound applies to (see the module docstring)."""
        waited = 0.0 if self.budget_s else float(call.get("cpu_wait_s", 0.0))
        return self.latency(call) - waited

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
        time (one stop should cost one such call); none without a budget."""
        return [sum(1 for c in self.calls if self.fault_of(c) is fault and self.budget_s
                    and self.own(c) - self.no_fault[c["index"]] > 0.8 * self.budget_s)
                for fault in self.faults]  # fmt: skip

    def limit_s(self) -> float:
        return RECOVER_S + self.tolerance_s

    def recoveries(self) -> list[Recovery]:
        """Per fault: the time from its recovery (after an empty restart: from the end of
        the first call after it) to the start of the first hit before the next fault."""
        end = max((c["t1"] for c in self.calls), default=0.0)
        found = []
        for fault in self.faults:
            after = sorted((c for c in self.calls if c["t0"] >= fault.recovered),
                           key=lambda c: float(c["t0"]))  # fmt: skip
            since = after[0]["t1"] if fault.empty and after else fault.recovered
            cutoff = min((f.start for f in self.faults if f.start > fault.recovered),
                         default=end)  # fmt: skip
            hits = [c["t0"] for c in after if c["cached"] >= HIT_TOKENS and c["t0"] <= cutoff]
            if hits:
                took = hits[0] - (since if hits[0] >= since else fault.recovered)
                found.append(Recovery(fault, since, took, False))
            else:
                interrupted = cutoff < since + self.limit_s()
                found.append(Recovery(fault, since, None, interrupted))
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
            if self.own(c) > self.bound(c):
                found.append(f"{self.name}: request {c['index']} (cycle {c['cycle']}) took "
                             f"{self.own(c):.2f} s > bound {self.bound(c):.2f} s (no-fault "
                             f"{self.no_fault[c['index']]:.2f} s; latency {self.latency(c):.2f} "
                             f"s: on a CPU {c.get('cpu_s', 0.0):.2f} s, waiting for one "
                             f"{c.get('cpu_wait_s', 0.0):.2f} s); during {self.during(c)}")  # fmt: skip
        for r in self.recoveries():
            if r.interrupted or (r.took is not None and r.took <= self.limit_s()):
                continue
            seen = "no hit before the next fault" if r.took is None else f"{r.took:.2f} s"
            since = "recovery" if r.since == r.fault.recovered else "the first call's end"
            found.append(f"{self.name}: after {r.fault.label} (held "
                         f"{r.fault.recovered - r.fault.start:.1f} s): first hit {seen} after "
                         f"{since} (limit {RECOVER_S} s + {self.tolerance_s:.2f} s noise)")  # fmt: skip
        for name, log in self.logs.items():
            if "Traceback" in log:
                at = log.index("Traceback")
                found.append(f"{self.name}: traceback in {name}:\n{log[at : at + 3000]}")
        return found

    def summary(self) -> str:
        latencies = sorted(self.latency(c) for c in self.calls)
        worst = max(self.calls, key=self.latency)
        mine = max(self.calls, key=self.own)
        kinds = Counter(f.label for f in self.faults)
        recoveries = self.recoveries()
        took = [r.took for r in recoveries if r.took is not None]
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        checked = "latency" if self.budget_s else "latency less that wait"
        waits_s = sum(c.get("cpu_wait_s", 0.0) for c in self.calls)
        per_fault = self.waits()
        waited = ("no stall budget (no network member)" if not self.budget_s else
                  f"{sum(per_fault)} (at most {max(per_fault, default=0)} per fault)")  # fmt: skip
        lines = [
            f"{self.name}: {len(self.faults)} faults ("
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")",
            f"  requests under faults {len(self.calls)}, identical {self.identical()} (and "
            f"{len(self.fault_free)} fault-free); call p50 {statistics.median(latencies):.2f} s, "
            f"p99 {p99:.2f} s, worst {self.latency(worst):.2f} s (on a CPU "
            f"{worst.get('cpu_s', 0.0):.2f} s, waiting for one {worst.get('cpu_wait_s', 0.0):.2f}"
            f" s, steal {worst.get('steal_s', 0.0):.2f} s, during {self.during(worst)})",
            f"  waiting for a CPU held by other processes: {waits_s:.1f} s in all, at most "
            f"{max(c.get('cpu_wait_s', 0.0) for c in self.calls):.2f} s in one call; worst "
            f"checked time ({checked}) {self.own(mine):.2f} s (its no-fault "
            f"{self.no_fault[mine['index']]:.2f} s, bound {self.bound(mine):.2f} s with "
            f"{self.tolerance_s:.2f} s noise, during {self.during(mine)})",
            f"  calls that waited about a budget: {waited}",
            "  recovery to the first hit: "
            + (f"median {statistics.median(took):.2f} s, worst {max(took):.2f} s"
               if took else "none measured")
            + f" ({sum(r.interrupted for r in recoveries)} cut short by the next fault)",
        ]  # fmt: skip
        return "\n".join(lines + [f"  {note}" for note in self.notes])
