"""The simulated card's eyes (harness.running.devmem.SimulatedCard): a ``TorchDispatchMode`` that sees
every operator torch dispatches, checks a factory's size before it allocates and counts each new
storage an operator returns until it is freed."""
from __future__ import annotations

import math
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Operators that allocate a tensor of a size their arguments give: checked before they run.
_SIZED = {"empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "new_empty",
          "new_empty_strided", "new_zeros", "new_ones", "new_full"}
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like"}


def _factory_bytes(func, args, kwargs) -> int:
    """Bytes a factory is about to allocate, 0 for any other operator."""
    name = func.overloadpacket.__name__
    if name in _LIKE and args and isinstance(args[0], torch.Tensor):
        dtype = kwargs.get("dtype") or args[0].dtype
        return args[0].numel() * dtype.itemsize
    if name not in _SIZED:
        return 0
    sized = args[1:] if name.startswith("new_") else args
    shape = sized[0] if sized else kwargs.get("size")
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
        return 0
    dtype = kwargs.get("dtype") or (args[0].dtype if name.startswith("new_") else torch.get_default_dtype())
    return math.prod(shape) * dtype.itemsize


def _storage(t: torch.Tensor):
    try:
        st = t.untyped_storage()
        return st if st.nbytes() else None
    except (RuntimeError, NotImplementedError):  # sparse, nested or meta tensors hold no plain storage
        return None


class Tracker(TorchDispatchMode):
    """Counts into ``card`` (a SimulatedCard)."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        # torch.compile runs its compiled code eagerly under any other mode: the simulation must
        # not change what a kernel runs.
        return True

    def __init__(self, card):
        super().__init__()
        self.card = card

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        asked = _factory_bytes(func, args, kwargs)
        if asked:
            self.card.admit(asked)
        out = func(*args, **kwargs)
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if tensors:
            self._count(tensors, args, kwargs)
        return out

    def _count(self, tensors, args, kwargs) -> None:
        inputs = None
        for t in tensors:
            st = _storage(t)
            if st is None:
                continue
            ptr = st.data_ptr()
            entry = self.card.live.get(ptr)
            if entry is not None:
                if not entry[1].expired():
                    continue  # a view, or an operator that wrote in place
                self.card.release(ptr)  # freed, and its address given to this new storage
            if inputs is None:
                inputs = {s.data_ptr() for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)
                          and (s := _storage(a)) is not None}
            if ptr in inputs:
                continue  # written in place into memory allocated before the count began
            self.card.admit(st.nbytes())
            self.card.add(ptr, st.nbytes(), StorageWeakRef(st))
            weakref.finalize(t, self.card.release, ptr)
