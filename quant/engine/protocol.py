"""The fixed-step protocol, declared once: what the decode engine (quant/engine/graphs.py) asks of a cache layer whose
one-token decode steps are the same device work every time, so that a CUDA graph captured at one step replays the
next ones.

A layer declares it by subclassing `FixedStepLayer` (isinstance is the only test the engine makes); a single-sequence
layer whose padded batch's rows move into one layer for those steps subclasses `StacksRows` (quant/engine/rows.py).
On the fixed-step path a layer's `update` returns a `StepKV` in place of (K, V): the attention function
(quant.kernels.hf_decode.packed_attention) takes the step from the key slot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Hashable, NamedTuple


class StepKV(NamedTuple):
    """What a fixed-step layer's `update` returns instead of (K, V): transformers unpacks it as (key, value) and hands
    both to the attention function, which reads the step (quant.kernels.hf_decode.PackedStep or DenseStep) from the
    key slot; the value slot is None."""

    step: Any
    value: None = None


class FixedStepLayer(ABC):
    """A cache layer with fixed-shape one-token decode steps (see the module docstring)."""

    @abstractmethod
    def graph_ready(self) -> bool:
        """Whether the next decode step is the same device work as the last one (else it runs eagerly)."""

    @abstractmethod
    def graph_key(self) -> tuple:
        """What a captured step's device work is bound to besides its inputs: the addresses and shapes of the buffers
        it reads and writes (quant.methods.base.addresses). A new key makes the next step capture a new graph."""

    def graph_variant(self) -> Hashable:
        """Which of several device works the next step is (a graph is kept for each); None: always the same one."""
        return None

    @abstractmethod
    def advance_host(self) -> None:
        """The host's share of a step whose device work ran or was replayed (counters, views)."""

    @abstractmethod
    def host_state(self) -> Any:
        """The host-side state a step changes, to restore after a capture that failed (`set_host_state`)."""

    @abstractmethod
    def set_host_state(self, state: Any) -> None:
        """Restore what `host_state` returned."""


class StacksRows(FixedStepLayer):
    """A single-sequence fixed-step layer whose method stacks a padded batch's rows (each a layer of this class, batch
    1) into one layer of batch B for the fixed-shape steps (quant/engine/rows.py)."""

    @classmethod
    @abstractmethod
    def stack_rows(cls, rows: list, state) -> FixedStepLayer:
        """One layer holding `rows` (after their prompts; `state`: the batch's quant.methods.base.CacheState)."""
