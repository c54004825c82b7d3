"""Host values onto the device without making the host wait for the device.

torch's default copy to a GPU (``non_blocking=False``) synchronizes the stream after it: the host
waits until every kernel enqueued before it has run. In the step loop that is the decode step in
flight, so a prefill whose inputs were copied that way was launched only once the device had gone
idle, and the device then waited for the host to launch it, layer by layer. Every copy of the
engine's host values goes through ``to_device``, which never waits. A non-blocking copy from
ordinary (pageable) memory is not enough: CUDA documents that the driver may synchronize with the
stream to stage it (run 64's prefills still spanned twice their kernels), so on a GPU the values
are first put in page-locked memory from torch's caching host allocator, which keeps the block
until the copy that reads it has run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_NUMPY = {
    torch.long: np.int64,
    torch.int32: np.int32,
    torch.bool: np.bool_,
    torch.float32: np.float32,
}


def to_device(
    values: Sequence[int] | Sequence[float] | Sequence[bool] | np.ndarray,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """``values`` as a ``dtype`` tensor on ``device``, copied without a wait."""
    array: np.ndarray = np.asarray(values, dtype=_NUMPY[dtype])
    return _staged(array, device).to(device, non_blocking=True)


def copy_into(target: torch.Tensor, values: np.ndarray) -> None:
    """``values`` (as many as ``target`` holds, of its dtype) into ``target``, without a wait."""
    target.copy_(_staged(values, target.device), non_blocking=True)


def _staged(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a host tensor to copy to ``device`` from: page-locked for a GPU."""
    host = torch.from_numpy(array)
    return host.pin_memory() if device.type == "cuda" else host
