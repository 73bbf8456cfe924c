"""Ask Linux for AMX tile permission before vLLM's CPU kernels run.

vLLM's CPU attention uses AMX for bf16; a fresh process whose first forward pass is tiny
(for example, right after a connector loaded most of the prompt) executes AMX before
anything requested permission and dies with SIGILL. arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA) grants it. Spawned vLLM workers inherit this file via PYTHONPATH.
"""

import contextlib
import ctypes
import platform

_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

if platform.machine() == "x86_64":
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).syscall(
            _SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA
        )
