"""Host (CPU) dispatch time of an eager training step, and where it is not hidden.

An eager PyTorch step is a Python program: each module and autograd function runs on the
host, goes through PyTorch's dispatcher and autograd recording, and ends in a
``cudaLaunchKernel`` (or an NCCL enqueue) that returns before the kernel runs. The host
therefore runs ahead of the GPU (the PyTorch paper, Paszke et al. NeurIPS 2019, sec. 5.2
and fig. 1: the host queues kernels on a CUDA stream and runs ahead of it), and a kernel
starts when both it has been launched and the kernel before it on the stream has ended.
While the kernels take longer than launching them the host's time is hidden; when they
are shorter (microsecond kernels: small hidden sizes, high tensor parallelism,
one-sequence micro-batches) the GPU waits for the host.

Model. A framework profile states the host seconds per kernel its step launches
(``host.kernel_launch_s``) and, beyond that launch, per collective it issues
(``host.collective_launch_s``; ``simulator.profiles.spec.Host``): :func:`host_seconds`.
A sequence of kernels, kernel ``i`` launched after ``h_i`` more host seconds and running
``g_i`` device seconds, with the host and the GPU both free at time 0, launches kernel
``k`` at ``H_k = h_1 + ... + h_k`` and ends it at ``e_k = max(H_k, e_{k-1}) + g_k``, so the
last one ends at::

    finish = max over k of (H_k + g_k + g_{k+1} + ... + g_n)

(unrolling the recursion). :class:`Dispatch` keeps ``(host, device, finish)`` of a
sequence, and sequences compose (:meth:`Dispatch.then`: the second's kernels launch after
the first's host time and start no earlier than the first's last kernel ends)::

    (a then b).finish = max(a.finish + b.device, a.host + b.finish)

so a block's sequence per phase is kept once (``simulator.stage_cost``: the kernels of its
ops in program order, a fused group one kernel, each collective one) and an action's
(its virtual stage's blocks in execution order, full recompute replaying a layer's
forward before its backward) is their composition (``simulator.stage_timing``). An action
takes ``finish``, i.e. ``finish - device`` (>= 0, :meth:`Dispatch.exposed`) more than its
kernels alone: 0 when every kernel is launched before the GPU reaches it; ``host -
device`` plus the first kernel when the host is the bound; more than ``max(host,
device)`` where long and short kernels alternate. Actions do not carry host slack to one
another: DeepSpeed's pipeline engine copies each micro-batch's inputs to the GPU with a
blocking ``.to(device)`` (microsoft/DeepSpeed 38327e07 ``deepspeed/runtime/pipe/engine.py``
``_exec_load_micro_batch``), which waits for the stream (PyTorch
``aten/src/ATen/native/cuda/Copy.cu``: ``cudaStreamSynchronize`` unless ``non_blocking``);
between a forward and its backward the host could run ahead, which this model does not
credit (an upper bound by at most one action's slack).

Units: seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from simulator.errors import SimulatorError


def host_seconds(profile: Any, launches: int, collectives: int = 0) -> float:
    """Host seconds to dispatch ``launches`` kernels and ``collectives`` collectives under
    ``profile`` (``simulator.profiles.spec.ProfileSpec``): ``launches x kernel_launch_s +
    collectives x (kernel_launch_s + collective_launch_s)``; 0 when the profile states no
    ``host`` section (or there is no profile). Raises ValueError for a negative count."""
    if launches < 0 or collectives < 0:
        raise SimulatorError(f"host_seconds: counts must be >= 0, got launches={launches}, "
                         f"collectives={collectives}")
    host = getattr(profile, "host", None)
    if host is None:
        return 0.0
    kernel = float(host.kernel_launch_s.value)
    extra = 0.0 if host.collective_launch_s is None else float(host.collective_launch_s.value)
    return launches * kernel + collectives * (kernel + extra)


@dataclass(frozen=True)
class Dispatch:
    """A kernel sequence dispatched by the host to one stream (module docstring), seconds.

    Attributes:
        host: host seconds to launch all of it.
        device: device seconds of its kernels, end to end.
        finish: when its last kernel ends, the host and the GPU both free at 0
            (``>= max(host, device)``).
    """

    host: float = 0.0
    device: float = 0.0
    finish: float = 0.0

    @classmethod
    def kernel(cls, host_s: float, device_s: float) -> Dispatch:
        """One kernel launched after ``host_s`` host seconds that runs ``device_s``. Raises
        ValueError for a negative time."""
        if host_s < 0 or device_s < 0:
            raise SimulatorError(f"Dispatch.kernel: times must be >= 0, got host {host_s}, "
                             f"device {device_s}")
        return cls(host_s, device_s, host_s + device_s)

    def then(self, other: Dispatch) -> Dispatch:
        """This sequence followed by ``other`` on the same stream (module docstring)."""
        return Dispatch(self.host + other.host, self.device + other.device,
                        max(self.finish + other.device, self.host + other.finish))

    @property
    def exposed(self) -> float:
        """Seconds the dispatch adds to the kernels: ``finish - device`` (never below 0)."""
        return max(0.0, self.finish - self.device)

    @classmethod
    def chain(cls, parts: Iterable[Dispatch]) -> Dispatch:
        """The sequences of ``parts`` one after another (empty: nothing)."""
        out = cls()
        for p in parts:
            out = out.then(p)
        return out


__all__ = ["Dispatch", "host_seconds"]
