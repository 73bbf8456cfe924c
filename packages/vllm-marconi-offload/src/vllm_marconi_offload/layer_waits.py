"""Which attention layers a step's forward waits for one by one, and what each waits on.

vLLM calls the connector's `wait_for_layer_load(layer)` before each attention layer it runs
eagerly: every layer of a step run without CUDA graphs or as a piecewise graph, none of a
step replayed as one full graph. A same-step load may then land layer by layer, each
attention layer waiting only for its own layer, instead of the whole step waiting for the
whole load. That is safe only for layers the forward is known to wait for, so the order is
learned, never assumed: the first step whose forward calls the hook records the names in
the order called, and only groups whose every layer appeared in it load by layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

E = TypeVar("E")  # what a layer waits on (a CUDA event on the GPU)


class LayerWaits(Generic[E]):
    """Learns the forward's layer order and hands each layer the event it must wait for."""

    def __init__(self, groups: Mapping[int, Sequence[str]]) -> None:
        """`groups`: each KV-cache group's layer names, in the group's slot order."""
        self._groups = {group_id: tuple(names) for group_id, names in groups.items()}
        self._seen: list[str] = []
        self._order: dict[str, int] | None = None
        self._pending: dict[str, E] = {}

    @property
    def learned(self) -> bool:
        """True once a step's forward has called the hook."""
        return self._order is not None

    def called(self, name: str) -> E | None:
        """The forward reached layer `name`: the event it must wait for, if any."""
        if self._order is None and name not in self._seen:
            self._seen.append(name)
        return self._pending.pop(name, None)

    def end_step(self) -> list[E]:
        """Close the step that just ran: learn the order from its calls (the first step
        that made any) and return the events no layer waited for (none, unless the forward
        skipped a layer it called before)."""
        if self._order is None and self._seen:
            self._order = {name: position for position, name in enumerate(self._seen)}
            self._seen = []
        missed = list(self._pending.values())
        self._pending.clear()
        return missed

    def waiting_layers(self) -> tuple[int, int]:
        """(layers of all groups known to wait, layers of all groups)."""
        order = self._order or {}
        names = [name for group in self._groups.values() for name in group]
        return sum(name in order for name in names), len(names)

    def forward_order(self, group_id: int) -> list[int] | None:
        """The indices of the group's layers in the order the forward runs them, or None if
        not every layer of the group is known to wait (the load must then land whole)."""
        names = self._groups.get(group_id)
        if self._order is None or not names or any(n not in self._order for n in names):
            return None
        order = self._order
        return sorted(range(len(names)), key=lambda i: order[names[i]])

    def expect(self, group_id: int, order: Sequence[int], events: Sequence[E]) -> None:
        """Layer `order[k]` of the group waits for `events[k]` in this step's forward."""
        names = self._groups[group_id]
        for index, event in zip(order, events, strict=True):
            self._pending[names[index]] = event
