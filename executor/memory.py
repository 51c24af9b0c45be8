"""Live tensor bytes of one rank, counted per storage (views share their base's bytes).

On CPU this is what the executor reports as a rank's peak memory: the bytes of every
tensor the rank holds at once (parameters, optimizer state, micro-batch activations kept
for backward, gradient accumulators, in-flight buffers), which is what the simulator's
memory model predicts. On GPU the CUDA caching allocator's peak is reported instead.
"""

from __future__ import annotations

import torch


class MemTracker:
    """Reference-counted storage bytes; ``peak`` is the maximum of ``live`` so far."""

    def __init__(self) -> None:
        self._refs: dict[int, list[int]] = {}
        self.live = 0
        self.peak = 0

    def add(self, t: torch.Tensor | None) -> None:
        if t is None:
            return
        st = t.untyped_storage()
        key, n = st.data_ptr(), st.nbytes()
        if n == 0:
            return
        ref = self._refs.get(key)
        if ref is None:
            self._refs[key] = [n, 1]
            self.live += n
            self.peak = max(self.peak, self.live)
        else:
            ref[1] += 1

    def remove(self, t: torch.Tensor | None) -> None:
        if t is None:
            return
        st = t.untyped_storage()
        key = st.data_ptr()
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[1] -= 1
        if ref[1] == 0:
            self.live -= ref[0]
            del self._refs[key]

    def reset_peak(self) -> None:
        self.peak = self.live
