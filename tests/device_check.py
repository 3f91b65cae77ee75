"""A stand-in accelerator for machines without one: tensors on "the device" are tracked, not moved.

On CUDA, an op that mixes a tensor on the GPU with a CPU tensor of one or more dimensions raises
`Expected all tensors to be on the same device`. On a CPU-only machine both are CPU tensors and
nothing fails, so device bugs hide until the first GPU run. `OnFakeDevice` marks every tensor that
would live on the accelerator (placed with an explicit `device=`, moved with `.to(device)`, or
computed from such a tensor) and raises where an op meets a marked tensor and an unmarked
(host) tensor that CUDA would refuse, as CUDA does. Tensors made without a device (`torch.ones(n)`,
`torch.from_numpy`) are host tensors, as they would be on a GPU machine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

MARK = "_on_fake_device"

# Ops whose result lives wherever their `device=` says (host when none is given).
FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.arange, torch.rand, torch.randn,
    torch.randint, torch.eye, torch.linspace, torch.as_tensor, torch.randperm,
}
LIKE = {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like}
# Ops that may take tensors of two devices: copies, and indices (CUDA accepts CPU index tensors).
# Tensor methods reach the mode as torch._C.TensorBase's, so they are known by name.
CROSS_DEVICE = {"copy_", "to", "cpu", "cuda", "numpy", "tolist", "item", "_has_compatible_shallow_copy_type", "__set__"}


def on_device(t: torch.Tensor) -> bool:
    return bool(getattr(t, MARK, False))


def mark(*tensors: torch.Tensor) -> None:
    for t in tensors:
        setattr(t, MARK, True)


def _is_device_arg(value: Any) -> bool:
    return isinstance(value, (torch.device, str)) and str(value).split(":")[0] in ("cpu", "cuda", "meta")


class DeviceMismatch(RuntimeError):
    pass


class OnFakeDevice(TorchFunctionMode):
    """Within this mode, tensors marked with `mark` (and everything computed from them) are 'on the device'."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("__getitem__", "__setitem__"):
            checked = [args[0]] + ([args[2]] if name == "__setitem__" and len(args) > 2 else [])
            checked = [t for t in checked if isinstance(t, torch.Tensor)]
        else:
            checked = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        device = [t for t in checked if on_device(t)]
        host = [t for t in checked if not on_device(t) and t.dim() > 0]
        if device and host and name not in CROSS_DEVICE:
            shapes = ", ".join(str(tuple(t.shape)) for t in host)
            raise DeviceMismatch(
                f"{getattr(func, '__qualname__', func)} mixes tensors on the device with host tensor(s) of shape {shapes}: "
                "Expected all tensors to be on the same device"
            )
        out = func(*args, **kwargs)
        if func in FACTORIES:
            placed = kwargs.get("device") is not None
        elif func in LIKE:
            placed = kwargs.get("device") is not None or on_device(args[0])
        elif name == "to" and isinstance(args[0], torch.Tensor):
            targets = [a for a in (*args[1:], kwargs.get("device")) if a is not None]
            moved = [a for a in targets if _is_device_arg(a) or isinstance(a, torch.Tensor)]
            placed = any(on_device(a) if isinstance(a, torch.Tensor) else True for a in moved) if moved else on_device(args[0])
        elif name in ("cpu", "from_numpy"):
            placed = False
        else:
            placed = bool(device)
        if name in ("to", "cpu") and out is args[0] and placed != on_device(out):
            out = out.clone()  # a real move makes a new tensor and leaves the original where it was
        if placed:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    mark(t)
        return out
