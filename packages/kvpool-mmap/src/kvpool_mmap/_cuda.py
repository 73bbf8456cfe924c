"""Optional torch/CUDA glue, imported lazily so that torch stays an optional dependency."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger("kvpool_mmap")

_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("torch views need torch: pip install 'kvpool-mmap[torch]'") from exc
    return torch


def torch_from_numpy(array: np.ndarray) -> Any:
    """Zero-copy torch tensor over a numpy array."""
    return _torch().from_numpy(array)


def cuda_available() -> bool:
    """True if torch imports and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def host_register(ptr: int, nbytes: int) -> bool:
    """cudaHostRegister the range; False without torch/CUDA or if the driver refuses."""
    if not cuda_available():
        return False
    import torch

    rc = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, _HOST_REGISTER_PORTABLE)
    code = int(getattr(rc, "value", rc))
    if code != 0:
        log.warning(
            "cudaHostRegister(%#x, %d) failed with error %d; L1 stays pageable (slow DMA). "
            "Only tmpfs/shmem-backed L1 files (e.g. under /dev/shm) can be registered",
            ptr,
            nbytes,
            code,
        )
        return False
    return True


def host_unregister(ptr: int) -> None:
    """cudaHostUnregister a range registered by host_register."""
    if not cuda_available():
        return
    import torch

    torch.cuda.cudart().cudaHostUnregister(ptr)
