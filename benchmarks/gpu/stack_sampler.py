"""Where an in-process engine's threads spend their time, without py-spy.

`StackSampler(path).start()` samples every thread's Python stack every few milliseconds
(`sys._current_frames`) and `stop()` writes the most frequent stacks (innermost frames
first, with the thread's name) and their share of samples to `path`.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any


def describe(frame: Any, depth: int) -> str:
    """The innermost `depth` calls of `frame`'s stack as `file:function:line`, joined by " < "."""
    calls = []
    while frame is not None and len(calls) < depth:
        calls.append(
            f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}:{frame.f_lineno}"
        )
        frame = frame.f_back
    return " < ".join(calls)


class StackSampler:
    def __init__(self, path: Path, interval_s: float = 0.005, depth: int = 8) -> None:
        self._path, self._interval, self._depth = path, interval_s, depth
        self._counts: Counter[str] = Counter()
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> StackSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        names = {}
        while not self._stop.wait(self._interval):
            names.update({t.ident: t.name for t in threading.enumerate()})
            for ident, frame in sys._current_frames().items():
                if ident == self._thread.ident:
                    continue
                stack = describe(frame, self._depth)
                self._counts[f"{names.get(ident, ident)} | {stack}"] += 1
            self._samples += 1

    def stop(self, top: int = 60) -> None:
        self._stop.set()
        self._thread.join()
        lines = [f"{self._samples} samples every {self._interval * 1e3:.0f} ms; share of samples"]
        for stack, n in self._counts.most_common(top):
            lines.append(f"{100 * n / max(1, self._samples):5.1f}%  {stack}")
        self._path.write_text("\n".join(lines) + "\n")
