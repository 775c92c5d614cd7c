"""quant: model-agnostic KV-cache quantization (OScaR and the baselines) as a transformers cache."""

from quant import fold
from quant.cache import QuantizedKVCache, make_cache
from quant.methods import PRESETS, get_method, list_methods, parse_overrides
from quant.methods.base import MethodConfig
from quant.prepare import PreparedModel, prepare_model

__all__ = [
    "fold",
    "QuantizedKVCache",
    "make_cache",
    "get_method",
    "list_methods",
    "parse_overrides",
    "PRESETS",
    "MethodConfig",
    "PreparedModel",
    "prepare_model",
]
