"""Host values onto the training device without making the host wait for the device."""

import torch


def to_device(values, device, dtype=None):
    """`values` (a list, a numpy array or a CPU tensor) as a tensor on `device`. On a GPU the copy goes
    through pinned memory and is queued (non_blocking): a plain copy from pageable memory first waits
    for all the work queued on the device, a host sync per call. Elsewhere a plain conversion (`.to`)."""
    tensor = torch.as_tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
