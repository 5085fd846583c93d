"""Device memory for routed experts: one slot pool per MoE layer, and one-use buffers.

A `SlotPool` preallocates `capacity` slots (B, or E for gpu_only) for one layer when the
executor starts; nothing else ever holds a resident expert on the device, so the budget
is enforced by construction: the pool cannot grow, and a load into a full pool raises.
A slot remembers the event of the copy that filled it (the compute stream waits on it
before the first GPU use) and, once freed, the compute-stream event after which its last
reader has run (the next copy into it waits on that).

`fetch_scratch` is Fiddler's (and Mixtral-Offload's overflow) one-use copy: a fresh
device buffer, never entered into a pool, dropped when the layer returns.
"""

from __future__ import annotations

from harness.hybrid.device import Event, Runtime
from harness.model.experts import ExpertWeights


class PoolFull(RuntimeError):
    """A plan asked for more resident experts than the layer's slots: an engine bug."""


class SlotPool:
    def __init__(self, runtime: Runtime, layer: int, capacity: int, like: ExpertWeights) -> None:
        self.runtime, self.layer, self.capacity = runtime, layer, capacity
        dtype = like.gate.dtype
        self.stacks = tuple(
            runtime.device_empty((capacity, *w.shape), dtype, "pool") for w in (like.gate, like.up, like.down)
        )
        self.slot_of: dict[int, int] = {}  # resident expert -> its slot
        self.free = list(range(capacity - 1, -1, -1))  # pop() hands out slot 0 first
        self.landing: dict[int, Event] = {}  # slot -> its copy's event, until a wait has covered it
        # freed slot -> event after its last reader; a fresh slot's memory came from the compute
        # stream's cache, where queued kernels may still use it: its first copy waits for them
        created = runtime.release()
        self.released: dict[int, Event] = dict.fromkeys(range(capacity), created)
        self.high_water = 0

    @property
    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.stacks)

    def holds(self) -> set[int]:
        return set(self.slot_of)

    def _view(self, slot: int) -> ExpertWeights:
        gate, up, down = (s[slot] for s in self.stacks)
        return ExpertWeights(gate, up, down)

    def load(self, expert: int, source: ExpertWeights, tag: str) -> Event:
        """Queue the copy of `expert` into a free slot; it is usable after the returned event."""
        if expert in self.slot_of:
            raise PoolFull(f"layer {self.layer}: expert {expert} is already resident")
        if not self.free:
            raise PoolFull(f"layer {self.layer}: all {self.capacity} slots are taken; cannot load expert {expert}")
        slot = self.free.pop()
        event = self.runtime.copy_in(
            self._view(slot), source, self.released.pop(slot, None), self.layer, expert, tag
        )
        self.landing[slot] = event
        self.slot_of[expert] = slot
        self.high_water = max(self.high_water, len(self.slot_of))
        return event

    def evict(self, expert: int) -> None:
        slot = self.slot_of.pop(expert)
        self.landing.pop(slot, None)  # a copy still in flight is ordered before the next one anyway
        self.released[slot] = self.runtime.release()
        self.free.append(slot)

    def weights(self, expert: int) -> ExpertWeights:
        """The resident expert's device weights, after making the compute stream wait for
        its copy if that has not been waited on yet."""
        slot = self.slot_of[expert]
        event = self.landing.pop(slot, None)
        if event is not None:
            self.runtime.wait(event, self.layer)
        return self._view(slot)

    def settled(self) -> None:
        """After a device-wide synchronize every copy has landed: nothing left to wait for."""
        self.landing.clear()
        self.released.clear()


def fetch_scratch(runtime: Runtime, layer: int, expert: int, source: ExpertWeights) -> tuple[ExpertWeights, Event]:
    """A one-use device copy of `expert` and the event after which it may be read."""
    buffers = ExpertWeights(*(runtime.device_empty(w.shape, w.dtype, "scratch") for w in source))
    # fresh memory from the compute stream's cache may still be read by kernels queued there:
    # the copy stream waits for them, as it does before refilling a slot
    return buffers, runtime.copy_in(buffers, source, runtime.release(), layer, expert, "scratch")
