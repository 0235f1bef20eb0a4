"""Counting, on the CPU, the host syncs a CUDA run would make: a torch function mode with device taint.

On the CPU every tensor is on the host, so "is this a sync on CUDA" needs to know which tensors would be on
the GPU. `SyncCounter` tracks that ("device" tensors): the model's parameters and buffers, whatever a
factory makes with an explicit `device=`, whatever `.to(device)` moves, and every result of an operation
that reads a device tensor. It then counts what would make the host wait for the GPU:

* reading a device tensor on the host: `.item()`, `.tolist()`, `bool()`, `int()`, `float()`, `.cpu()`,
  `.numpy()`, and operations whose output size depends on a device tensor's values (`nonzero`,
  `unique`, `masked_select`, boolean-mask indexing);
* a blocking host-to-device copy (it waits for every kernel queued before it): `.to(device)` or `.cuda()` of
  a host tensor without `non_blocking=True`, `torch.tensor(...)` / `torch.as_tensor(...)` with a `device=`,
  `copy_` of a host tensor into a device tensor without `non_blocking=True`, and indexing a device tensor
  with a host index tensor (the index is copied over first).

Where a tensor lives is read from how kvbench names it: its host bookkeeping (counts, plans) is made with
the literal `device="cpu"` (the host, whatever the model's device), its device tensors with the model's or a
group's `torch.device`. So `device="cpu"` (the string) makes a host tensor, and `.to("cpu")` of a device
tensor is a read. `counter.events` lists (kind, function name) for each, to say where a sync comes from.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_ATTR = "_kvbench_on_device"
READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero", "unique",
         "unique_consecutive", "masked_select", "argwhere"}
FACTORIES_FROM_DATA = {"tensor", "as_tensor"}


def mark(*tensors) -> None:
    for t in tensors:
        setattr(t, _ATTR, True)


def on_device(x) -> bool:
    return isinstance(x, torch.Tensor) and getattr(x, _ATTR, False)


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


class SyncCounter(TorchFunctionMode):
    def __init__(self, model=None):
        super().__init__()
        self.events: list[tuple[str, str]] = []
        if model is not None:
            mark(*model.parameters(), *model.buffers())

    @property
    def count(self) -> int:
        return len(self.events)

    def reset(self) -> None:
        self.events = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        flat, _ = tree_flatten((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        dev_in = any(on_device(x) for x in tensors)
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in READS and self_t is not None and on_device(self_t):
            self.events.append(("read", name))
        elif name in ("__getitem__", "__setitem__", "index_put_", "index_put") and self_t is not None:
            idx = [x for x in tree_flatten(args[1:2])[0] if isinstance(x, torch.Tensor)]
            if any(x.dtype == torch.bool and on_device(x) for x in idx):
                self.events.append(("read", name + "[bool mask]"))  # the output size depends on the mask
            elif on_device(self_t) and any(not on_device(x) and x.dim() > 0 for x in idx):
                self.events.append(("h2d", name + "[host index]"))
        elif name in ("to", "cuda") and self_t is not None and _moves(args, kwargs):
            if on_device(self_t) and _target(args, kwargs) == "cpu":
                self.events.append(("read", name + "(cpu)"))
            elif not on_device(self_t) and _target(args, kwargs) != "cpu" and not kwargs.get("non_blocking", False) \
                    and not (len(args) > 2 and args[2] is True):
                self.events.append(("h2d", name))
        elif name in FACTORIES_FROM_DATA and "device" in kwargs and kwargs["device"] != "cpu":
            self.events.append(("h2d", name))
        elif name == "copy_" and self_t is not None and on_device(self_t) and len(args) > 1 and not on_device(args[1]):
            if not kwargs.get("non_blocking", False) and not (len(args) > 2 and args[2] is True):
                self.events.append(("h2d", name))
        out = func(*args, **kwargs)
        if name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy"):
            return out
        if name in ("to", "cuda") and _moves(args, kwargs):
            makes_device = _target(args, kwargs) != "cpu"
            if makes_device and out is self_t and not on_device(self_t):  # a no-op on the CPU: on CUDA a new tensor
                out = out.view(out.shape)  # so the host tensor itself stays a host tensor
        else:
            makes_device = dev_in or ("device" in kwargs and kwargs["device"] != "cpu")
        if makes_device:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    try:
                        setattr(t, _ATTR, True)
                    except (AttributeError, RuntimeError):
                        pass
        return out


def _moves(args, kwargs) -> bool:
    """Whether a `.to(...)` call names a device (not only a dtype)."""
    if "device" in kwargs:
        return True
    return any(isinstance(a, (torch.device, str)) or (isinstance(a, int) and not isinstance(a, bool))
               for a in args[1:2])


def _target(args, kwargs):
    """The device a `.to(...)` call names, as given ("cpu" the string: the host)."""
    return kwargs["device"] if "device" in kwargs else args[1] if len(args) > 1 else None
