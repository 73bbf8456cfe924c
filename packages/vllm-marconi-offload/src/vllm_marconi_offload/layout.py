"""Where each KV-cache group's bytes sit inside one offloaded slot.

A slot holds one block of one KV-cache group for one rank: the bytes of that block in
every layer of the group, layer after layer. The slot stride is the widest group's total,
so one pool serves every group of a hybrid model. Both sides compute the layout from the
`KVCacheConfig` alone (the scheduler never sees tensors), and the worker checks that the
tensors it is handed agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig


class LayoutError(RuntimeError):
    """The KV cache tensors do not have a layout this connector can copy."""


@dataclass(frozen=True)
class LayerSlice:
    """One layer's block bytes inside a slot."""

    name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GroupLayout:
    """The layers of one KV-cache group and the group's block size in tokens."""

    group_id: int
    block_size: int
    layers: tuple[LayerSlice, ...]
    is_attention: bool

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


@dataclass(frozen=True)
class SlotLayout:
    """Per-group slot layout and the slot stride (bytes per block per rank)."""

    groups: tuple[GroupLayout, ...]
    num_gpu_blocks: int

    @property
    def stride(self) -> int:
        return max((group.nbytes for group in self.groups), default=0)

    def digest_fields(self) -> tuple[object, ...]:
        """Everything about the layout that must match for stored bytes to be reusable."""
        return tuple(
            (g.group_id, g.block_size, g.is_attention, tuple((s.name, s.nbytes) for s in g.layers))
            for g in self.groups
        )

    @classmethod
    def from_kv_cache_config(cls, kv_cache_config: KVCacheConfig) -> SlotLayout:
        """Build the layout from vLLM's `KVCacheConfig` (duck-typed across versions)."""
        groups = []
        for group_id, group in enumerate(kv_cache_config.kv_cache_groups):
            spec = group.kv_cache_spec
            page = int(spec.page_size_bytes)
            offset = 0
            layers = []
            for name in group.layer_names:
                layers.append(LayerSlice(name=name, offset=offset, nbytes=page))
                offset += page
            groups.append(
                GroupLayout(
                    group_id=group_id,
                    block_size=int(spec.block_size),
                    layers=tuple(layers),
                    is_attention=hasattr(spec, "head_size"),
                )
            )
        return cls(groups=tuple(groups), num_gpu_blocks=int(kv_cache_config.num_blocks))
