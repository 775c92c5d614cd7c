"""A padded batch on the fixed-shape path: its rows move into one layer of batch B.

The cache (quant.cache.QuantizedKVCache.set_padding) stores each sequence of a left-padded batch in a layer of its own
(quant/rows.py: RowsLayer). When the method's layers stack rows (quant.engine.protocol.StacksRows), the batch's layers
are `FixedStepRows`: the first fixed-shape decode step moves the rows into one layer of batch B (the method's
`stack_rows`: quant.engine.oscar.OScaRRows, quant.engine.bf16.BF16Rows) whose buffers hold each row's tokens at its
start with per-sequence lengths, which the kernels take: one launch per layer for the whole batch, and one CUDA graph
for every step. Each row still flushes at its own step, storing what it would store alone.
"""

from __future__ import annotations

import torch

from quant.engine.protocol import FixedStepLayer, StacksRows
from quant.rows import RowsLayer


class FixedStepRows(RowsLayer, FixedStepLayer):
    """A padded batch's layer whose rows stack for the fixed-shape steps; before they do (the prompt, eager steps) it
    answers the protocol for its rows, after it for the stacked layer."""

    def __init__(self, rows: list, pads: list[int], state=None):
        if not all(isinstance(row, StacksRows) for row in rows):
            raise TypeError("FixedStepRows holds rows of a layer class that stacks them (quant.engine.StacksRows)")
        super().__init__(rows, pads, state)

    def _stacks(self, key_states: torch.Tensor) -> bool:
        """A one-token step on the fixed-shape path moves the rows into one stacked layer."""
        return key_states.shape[-2] == 1 and self.state is not None and self.state.fast_decode

    def _stack_rows(self) -> FixedStepLayer:
        return type(self.rows[0]).stack_rows(self.rows, self.state)

    # -- the fixed-step protocol (quant.engine.protocol) -------------------------------------------------------
    def _steps(self) -> list:
        return self.rows if self.stacked is None else [self.stacked]

    def graph_ready(self) -> bool:
        return all(row.graph_ready() for row in self._steps())

    def graph_key(self) -> tuple:
        return tuple(row.graph_key() for row in self._steps())

    def graph_variant(self):
        return tuple(row.graph_variant() for row in self._steps())

    def advance_host(self) -> None:
        for row in self._steps():
            row.advance_host()
        self.seen += 1

    def host_state(self):
        return [row.host_state() for row in self._steps()], self.seen

    def set_host_state(self, state) -> None:
        rows, self.seen = state
        for row, s in zip(self._steps(), rows):
            row.set_host_state(s)
