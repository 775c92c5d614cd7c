"""The decode engine: fixed-shape one-token decode steps and their CUDA-graph replay, above the methods.

A method (quant/methods/) holds its config, reference math and storage. The engine adds, for the methods that have
them, decode steps whose device work is the same every time (OScaR's kernel path, BF16's preallocated buffers) and
replays them as CUDA graphs inside `generate`:

- quant.engine.protocol: the fixed-step protocol, declared once (`FixedStepLayer`, `StacksRows`, `StepKV`);
- quant.engine.oscar, quant.engine.bf16: the methods' layers that implement it (single sequences and a padded
  batch's stacked rows);
- quant.engine.rows: a padded batch's layer whose rows stack for those steps;
- quant.engine.graphs: `decode_graphs(model, cache)`, the CUDA-graph decoder.

`make_layer(method, ctx)` is the layer a cache holds for `method`: the engine's fixed-step layer when the method has
fixed-shape decode steps (`method.fixed_shape_decode`), else the method's own.
"""

from __future__ import annotations

from quant.engine.bf16 import BF16Rows, BF16StepLayer
from quant.engine.graphs import GraphDecoder, decode_graphs, graphs_enabled
from quant.engine.oscar import OScaRRows, OScaRStepLayer
from quant.engine.protocol import FixedStepLayer, StacksRows, StepKV
from quant.engine.rows import FixedStepRows
from quant.methods.base import LayerContext, MethodConfig
from quant.methods.bf16 import BF16Config
from quant.methods.oscar import OScaRConfig

# The engine's fixed-step layer of each method config that has fixed-shape decode steps.
STEP_LAYERS: dict[type[MethodConfig], type[StacksRows]] = {OScaRConfig: OScaRStepLayer, BF16Config: BF16StepLayer}


def make_layer(method: MethodConfig, ctx: LayerContext):
    """The cache layer for `method`: the engine's fixed-step layer (STEP_LAYERS) when the config has fixed-shape decode
    steps, else the method's own (`method.make_layer`)."""
    cls = STEP_LAYERS.get(type(method))
    if cls is not None and method.fixed_shape_decode:
        return cls(method, ctx)
    return method.make_layer(ctx)


def rows_layer(rows: list, pads: list[int], state):
    """A padded batch's layer over `rows` (one layer per sequence): FixedStepRows when they stack for the fixed-shape
    steps, else the reference RowsLayer."""
    from quant.rows import RowsLayer

    if all(isinstance(row, StacksRows) for row in rows):
        return FixedStepRows(rows, pads, state)
    return RowsLayer(rows, pads, state)


__all__ = [
    "BF16Rows",
    "BF16StepLayer",
    "FixedStepLayer",
    "FixedStepRows",
    "GraphDecoder",
    "OScaRRows",
    "OScaRStepLayer",
    "STEP_LAYERS",
    "StacksRows",
    "StepKV",
    "decode_graphs",
    "graphs_enabled",
    "make_layer",
    "rows_layer",
]
