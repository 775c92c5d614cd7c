"""The CUDA kernels of csrc/: their build, the decode's plan and launch, the pack and the layer kernels.

- loader.py: building and loading the extensions (`load` per head dim and register budget, `load_layers` once);
- plan.py: the decode's launch plan, `make_plan` -> a DecodePlan (builds, splits, the window's CTA, CTA order, the
  merge), and its cost model;
- decode.py: `decode_attention`, the decode; `launch`, the kernel's launch on prepared inputs and a DecodePlan;
  `launch_plan`, the plan `decode_attention` would launch;
- pack.py: `pack_kv`, the pack of K and V into codes;
- layers.py: the decode-time RMSNorm and RoPE on the layer extension (the GEMV's launcher:
  quant/kernels/fused_linear.py).

Everything is importable from here (`from quant.kernels import cuda; cuda.decode_attention(...)`); a test that replaces
a loader replaces it in quant.kernels.cuda.loader, where its callers look it up.
"""

from quant.kernels.common import DecodePlan, num_sms  # noqa: F401  (as the tests and benchmarks read them)
from quant.kernels.cuda.decode import (  # noqa: F401
    _COUNTERS,
    _NO_TRACE,
    _SYLVESTER_CHECKED,
    _aligned,
    _counters,
    _EmptyPerDevice,
    _is_sylvester,
    decode_attention,
    launch,
    launch_plan,
)
from quant.kernels.cuda.layers import (  # noqa: F401
    NORM_DTYPES,
    NORM_MAX_N,
    rms_norm,
    rms_norm_rows,
    rope,
    rope_takes,
)
from quant.kernels.cuda.loader import (  # noqa: F401
    _LAYER_KERNELS_ON,
    _LAYERS_FAILED,
    CSRC,
    LAYER_SOURCES,
    ROW_KERNEL_TOKENS,
    SOURCES,
    _csrc,
    _loaded,
    announce_build,
    build,
    build_flags,
    build_notice,
    cache_dir,
    is_built,
    layer_flags,
    layer_kernels_on,
    layers_name,
    layers_ready,
    load,
    load_extension,
    load_layers,
    specialization_name,
    target_arch,
)
from quant.kernels.cuda.pack import (  # noqa: F401
    pack_kv,
)
from quant.kernels.cuda.plan import (  # noqa: F401
    CTA_COST_TOKENS,
    FIRST_CTA_SHARE,
    NARROW,
    ONE_CTA_SM_SPEED,
    ORDER_ROWS,
    ORDER_SPECIAL_FIRST,
    ORDER_SPECIAL_LAST,
    TIE_MOST_SPLITS,
    WIDE,
    WIDE_LONG,
    WIDE_LONG_MAX_QUERY_ROWS,
    WIDE_LONG_ROW_TOKENS,
    WIDE_LONG_SPLIT_TOKENS,
    WIDE_MIN_TOKENS,
    WINDOW_TOKEN_WEIGHT,
    _best_plan,
    cta_costs,
    cta_order,
    decode_plan,
    long_rows,
    make_plan,
    merge_plan,
    paired_split_tokens,
    paired_splits,
    plan_launch,
    plan_splits,
    row_kernel,
    separate_window,
    slowest_sm,
    specialization,
    waves_cost,
    waves_with_window,
    wide_long,
    wide_plan,
)
