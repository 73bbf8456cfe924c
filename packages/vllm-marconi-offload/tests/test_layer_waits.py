"""A same-step load lands layer by layer only for layers the forward was seen to wait for,
in the order it runs them, and each layer gets exactly its own event."""

from __future__ import annotations

from vllm_marconi_offload.layer_waits import LayerWaits

# Slot order of the group is not the forward's order (vLLM sorts names as strings).
GROUPS = {0: ["layers.10.attn", "layers.2.attn", "layers.1.attn"], 1: ["layers.3.attn"]}


def forward(waits: LayerWaits[str], names: list[str]) -> list[str | None]:
    """One step's forward: the hook before each attention layer; what each waited for."""
    return [waits.called(name) for name in names]


def test_nothing_loads_by_layer_before_a_forward_has_waited() -> None:
    waits: LayerWaits[str] = LayerWaits(GROUPS)
    assert waits.forward_order(0) is None
    waits.end_step()  # a step replayed as one full CUDA graph: no calls
    assert not waits.learned
    assert waits.forward_order(0) is None


def test_the_first_step_that_waits_teaches_the_order() -> None:
    waits: LayerWaits[str] = LayerWaits(GROUPS)
    forward(waits, ["layers.1.attn", "layers.2.attn", "layers.3.attn", "layers.10.attn"])
    assert waits.forward_order(0) is None, "learned only once the step has ended"
    assert waits.end_step() == []
    assert waits.forward_order(0) == [2, 1, 0]
    assert waits.forward_order(1) == [0]
    assert waits.waiting_layers() == (4, 4)
    # Later steps never change it.
    forward(waits, ["layers.10.attn", "layers.1.attn"])
    waits.end_step()
    assert waits.forward_order(0) == [2, 1, 0]


def test_a_group_with_a_layer_that_never_waits_loads_whole() -> None:
    waits: LayerWaits[str] = LayerWaits(GROUPS)
    forward(waits, ["layers.1.attn", "layers.2.attn", "layers.3.attn"])
    waits.end_step()
    assert waits.forward_order(0) is None
    assert waits.forward_order(1) == [0]
    assert waits.waiting_layers() == (3, 4)


def test_each_layer_waits_for_its_own_event_once() -> None:
    waits: LayerWaits[str] = LayerWaits(GROUPS)
    forward(waits, ["layers.1.attn", "layers.2.attn", "layers.10.attn", "layers.3.attn"])
    waits.end_step()
    order = waits.forward_order(0)
    assert order is not None
    waits.expect(0, order, ["e-layer1", "e-layer2", "e-layer10"])
    seen = forward(waits, ["layers.1.attn", "layers.2.attn", "layers.10.attn", "layers.3.attn"])
    assert seen == ["e-layer1", "e-layer2", "e-layer10", None]
    assert waits.end_step() == []
    assert forward(waits, ["layers.1.attn"]) == [None], "an event is waited for in its step only"


def test_layers_the_forward_skipped_are_handed_back_at_the_step_end() -> None:
    waits: LayerWaits[str] = LayerWaits(GROUPS)
    forward(waits, ["layers.1.attn", "layers.2.attn", "layers.10.attn"])
    waits.end_step()
    order = waits.forward_order(0)
    assert order is not None
    waits.expect(0, order, ["a", "b", "c"])
    forward(waits, ["layers.1.attn"])
    assert sorted(waits.end_step()) == ["b", "c"]
    assert waits.end_step() == []
