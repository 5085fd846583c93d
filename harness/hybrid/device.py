"""Where the hybrid executor's device work runs: a CUDA GPU, or a CPU stand-in for tests.

Both expose the same small surface, so harness/hybrid/executor.py is one code path:
- memory: `host_empty` (pinned on CUDA when asked, so copies can be asynchronous DMA),
  `device_empty` (the GPU; `purpose` says whether it is a slot pool or a one-use buffer),
  `device_memory` (free and total device bytes) and `host_available` (host bytes that can
  still be pinned), which size the placement (harness/hybrid/attach.py, wiring.py);
- copies: `copy_in` queues host->device copies on the copy stream after an optional
  event and returns the event that marks them landed; `to_device` queues a small host
  tensor (row indices, CPU rows) on the compute stream without a host wait; `wait` makes the compute stream
  wait for such an event; `release` records an event on the compute stream (everything
  queued so far that reads a slot) so a later copy into that slot waits for it;
- timing: `mark` records a timing event on the compute stream, `elapsed` reads two of
  them once `synchronize` has run;
- memory statistics: `reset_peak`, `peak_bytes`.

The stand-in's "device" is the CPU. Its copies are queued and land only when an event at
or after them is waited on (or at `synchronize`), in issue order like a CUDA stream, so an
executor that forgets a wait computes with stale slot contents and the lossless tests
fail. It logs every operation as an `Op`, which the tests read to check the order of
copies, waits, GPU and CPU work.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch

Event = Any  # torch.cuda.Event on CUDA, an int id on the stand-in


class Op(NamedTuple):
    """One logged operation of the stand-in. kind: copy | wait | sync | wait_compute |
    plan | gpu | cpu_start | cpu_done | join | combine; tag: a copy's kind (initial, sync,
    scratch, async, prefetch)."""

    kind: str
    layer: int
    experts: tuple[int, ...] = ()
    event: int | None = None
    tag: str = ""


class Runtime(Protocol):
    device: torch.device  # where resident experts, non-expert modules and the KV cache live
    host: torch.device  # where host experts live and CPU experts run
    dtype: torch.dtype | None  # the device dtype (bf16 on CUDA); None keeps the model's

    def host_empty(self, shape: Sequence[int], dtype: torch.dtype, pinned: bool = True) -> torch.Tensor: ...
    def device_empty(self, shape: Sequence[int], dtype: torch.dtype, purpose: str) -> torch.Tensor: ...
    def device_memory(self) -> tuple[int, int] | None: ...
    def host_available(self) -> int | None: ...
    def copy_in(self, dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor], after: Event | None,
                layer: int, expert: int, tag: str) -> Event: ...
    def wait(self, event: Event, layer: int) -> None: ...
    def to_device(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def release(self) -> Event: ...
    def wait_compute(self, layer: int) -> None: ...
    def synchronize(self) -> None: ...
    def mark(self) -> Event: ...
    def elapsed(self, start: Event, end: Event) -> float: ...
    def note(self, kind: str, layer: int, experts: tuple[int, ...] = ()) -> None: ...
    def reset_peak(self) -> None: ...
    def peak_bytes(self) -> int: ...


class CudaRuntime:
    """The real thing: compute on the current stream, copies on a stream of their own."""

    def __init__(self, device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16) -> None:
        device = torch.device(device)
        self.device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        self.host = torch.device("cpu")
        self.dtype = dtype
        # the decoding loop's thread launches all GPU work; its current stream is the compute stream
        self.compute = torch.cuda.current_stream(self.device)
        self.copies = torch.cuda.Stream(self.device)

    def host_empty(self, shape: Sequence[int], dtype: torch.dtype, pinned: bool = True) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=pinned)

    def device_empty(self, shape: Sequence[int], dtype: torch.dtype, purpose: str) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def device_memory(self) -> tuple[int, int] | None:
        free, total = torch.cuda.mem_get_info(self.device)
        # memory torch has cached but not handed out is free for our next allocations too
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + cached), int(total)

    def host_available(self) -> int | None:
        return host_memory_available()

    def copy_in(self, dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor], after: Event | None,
                layer: int, expert: int, tag: str) -> Event:
        with torch.cuda.stream(self.copies):
            if after is not None:  # the slot's previous expert may still be read by queued kernels
                self.copies.wait_event(after)
            for d, s in zip(dst, src, strict=True):
                d.copy_(s, non_blocking=True)
                # allocated on the compute stream, written here: the caching allocator must not
                # hand this memory out again before the copy has run
                d.record_stream(self.copies)
            done = torch.cuda.Event()
            done.record(self.copies)
        return done

    def wait(self, event: Event, layer: int) -> None:
        self.compute.wait_event(event)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A small host tensor on the device, queued on the compute stream without making the
        host wait for it (a pageable source would: torch synchronizes after such a copy)."""
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def release(self) -> Event:
        event = torch.cuda.Event()
        event.record(self.compute)
        return event

    def wait_compute(self, layer: int) -> None:
        self.compute.synchronize()  # not the copy stream: in-flight prefetches keep going

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def mark(self) -> Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.compute)
        return event

    def elapsed(self, start: Event, end: Event) -> float:
        return start.elapsed_time(end) / 1e3  # milliseconds -> seconds

    def note(self, kind: str, layer: int, experts: tuple[int, ...] = ()) -> None:
        pass  # nothing is logged on the real device: it would cost time on the hot path

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))


class StandInRuntime:
    """The CPU playing the device (see the module docstring)."""

    def __init__(self, dtype: torch.dtype | None = None, device_bytes: int | None = None,
                 host_bytes: int | None = None) -> None:
        self.device = self.host = torch.device("cpu")
        self.dtype = dtype
        # the memory this pretend device and host have (None: no limit), for placement tests
        self.device_bytes, self.host_bytes = device_bytes, host_bytes
        self.pinned_bytes = 0  # what `host_empty(pinned=True)` handed out
        self.ops: list[Op] = []
        self._pending: deque[tuple[int, Sequence[torch.Tensor], Sequence[torch.Tensor]]] = deque()
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the CPU worker logs from its own thread
        self.live_bytes: dict[str, int] = defaultdict(int)  # per purpose: pool | scratch
        self.peak: dict[str, int] = defaultdict(int)
        self._peak_total = 0

    def host_empty(self, shape: Sequence[int], dtype: torch.dtype, pinned: bool = True) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype)
        if pinned:
            self.pinned_bytes += tensor.numel() * tensor.element_size()
        return tensor

    def device_memory(self) -> tuple[int, int] | None:
        if self.device_bytes is None:
            return None
        with self._lock:
            return self.device_bytes - sum(self.live_bytes.values()), self.device_bytes

    def host_available(self) -> int | None:
        return self.host_bytes

    def device_empty(self, shape: Sequence[int], dtype: torch.dtype, purpose: str) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype)
        size = tensor.numel() * tensor.element_size()
        with self._lock:
            self.live_bytes[purpose] += size
            self.peak[purpose] = max(self.peak[purpose], self.live_bytes[purpose])
            self._peak_total = max(self._peak_total, sum(self.live_bytes.values()))
        weakref.finalize(tensor, self._freed, purpose, size)  # device memory is held as long as the tensor
        return tensor

    def _freed(self, purpose: str, size: int) -> None:
        with self._lock:
            self.live_bytes[purpose] -= size

    def _log(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def copy_in(self, dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor], after: Event | None,
                layer: int, expert: int, tag: str) -> Event:
        event = next(self._ids)
        self._pending.append((event, dst, src))  # lands later: see `_land`
        self._log(Op("copy", layer, (expert,), event, tag))
        return event

    def _land(self, upto: int | None) -> None:
        """Run queued copies in issue order, up to and including event `upto` (all: None)."""
        while self._pending and (upto is None or self._pending[0][0] <= upto):
            _, dst, src = self._pending.popleft()
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)

    def wait(self, event: Event, layer: int) -> None:
        self._log(Op("wait", layer, (), event))
        self._land(event)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor  # the stand-in's device is the host

    def release(self) -> Event:
        return next(self._ids)  # compute is synchronous here: a slot is free once released

    def wait_compute(self, layer: int) -> None:
        self._log(Op("wait_compute", layer))

    def synchronize(self) -> None:
        self._log(Op("sync", -1))
        self._land(None)

    def mark(self) -> Event:
        return time.perf_counter()

    def elapsed(self, start: Event, end: Event) -> float:
        return float(end - start)

    def note(self, kind: str, layer: int, experts: tuple[int, ...] = ()) -> None:
        self._log(Op(kind, layer, experts))

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = defaultdict(int, self.live_bytes)
            self._peak_total = sum(self.live_bytes.values())

    def peak_bytes(self) -> int:
        return self._peak_total


def host_memory_available() -> int | None:
    """Bytes of host memory the kernel says can still be used (MemAvailable), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
