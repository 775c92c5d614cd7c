"""Triton split-KV decode attention over an OScaR packed cache in the "tl" code order (quant/packed.py): the launch
and its plan (a DecodePlan, quant/kernels/common.py). The kernels, one program per (split, batch * KV head) and a
combine program per query row, and how their loop is built: quant/kernels/triton_decode_kernels.py.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton

from quant.kernels.common import DecodePlan, _lens, choose_split, num_sms, padded_rows, prepare_decode
from quant.kernels.triton_decode_kernels import (  # noqa: F401  (the kernels, as benchmarks/triton_sass.py reads them)
    BLOCK_T,
    LOG2E,
    combine_kernel,
    decode_split_kernel,
)
from quant.packed import TL_BLOCK

_PROGRAMS: dict = {}  # compiled launch configuration -> resident programs per SM (programs_per_sm)


def programs_per_sm(kernel, device) -> int:
    """Programs of a compiled Triton kernel resident on one SM at once: the least of what its registers (allocated per
    warp in units of 256), its shared memory (+1 KB the hardware reserves per block) and its warps allow."""
    props = torch.cuda.get_device_properties(device)
    kernel._init_handles()  # loads the binary: n_regs is known from here on
    warps = kernel.metadata.num_warps
    per_warp = -(-max(kernel.n_regs, 1) * 32 // 256) * 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (per_warp * warps)
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // (kernel.metadata.shared + 1024)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def plan_splits(
    tokens: int, rows: int, block: int, sms: int, programs: int, waves: float | None = None, min_blocks: int = 4
) -> tuple[int, int]:
    """(split_tokens, splits) of the Triton decode. rows = B * Hkv; programs: resident programs per SM.

    waves=None: when at least 4 splits of each row fit one wave with the window's programs (rows * (splits + 1) <=
    sms * programs), exactly one wave of splits of >= min_blocks blocks: the 3-wave rule would leave a partial last
    wave that ends as late as a full one (docs/PERFORMANCE.md, The Triton decode); else rows * splits ~ 3 x sms
    (common.choose_split). A given `waves` always takes the latter rule."""
    one_wave = sms * programs // max(rows, 1) - 1
    if waves is not None or one_wave < 4 or tokens == 0:
        return choose_split(tokens, rows, block, sms, 3 if waves is None else waves)
    splits = max(1, min(one_wave, -(-tokens // (min_blocks * block))))
    split_tokens = -(-tokens // (splits * block)) * block
    return split_tokens, -(-tokens // split_tokens)


def _inline_ptx() -> bool:
    """Whether the kernel may use its inline PTX (_codes): not under the interpreter, which cannot run PTX, nor on
    ROCm (torch.version.hip), whose Triton has no PTX. The plain path gives the same values, slower."""
    return os.environ.get("TRITON_INTERPRET") != "1" and getattr(torch.version, "hip", None) is None


def decode_attention(
    query,
    kv,
    scaling: float,
    kv_lens=None,
    res_lens=None,
    split_tokens: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    waves: float | None = None,
    maxnreg: int | None = None,
    plan: DecodePlan | None = None,
):
    """OScaR decode attention with Triton. query [B, Hq, Lq, D] -> out [B, Hq, Lq, D] (query dtype).

    kv: quant.packed.PackedKV, codes best in the "tl" order (an OScaR cache on the Triton path keeps them so);
    another order is converted on every call (correct, slow), and a token count that is not a multiple of 128 is
    padded first. kv_lens / res_lens: valid quantized / residual tokens per sequence (default: all stored). Lq > 1
    (speculative tokens): the newest Lq tokens, causal among themselves; at least Lq - 1 of them must be in each
    sequence's window (the kernels mask inside the window only; host lengths are checked, quant.kernels.common).
    split_tokens: tokens per split, a multiple of 128 (default: plan_splits, with `waves` and the compiled kernel's
    programs per SM). The launch's tuning: num_warps, num_stages (Triton's software pipelining; None: its default),
    maxnreg (a register cap per thread; None: the compiler's choice). The defaults, 4 warps and the compiler's
    registers, are the fastest of the settings tried (docs/PERFORMANCE.md, The Triton decode). plan: a DecodePlan made
    for these inputs' shape (its splits; the window always has its own program), instead of split_tokens / waves.
    """
    if query.is_cuda and query.device.index != torch.cuda.current_device():  # Triton launches on the current device
        with torch.cuda.device(query.device):  # a layer of a model spread over GPUs (device_map)
            return decode_attention(
                query, kv, scaling, kv_lens, res_lens, split_tokens, num_warps, num_stages, waves, maxnreg, plan
            )
    kv, kv_lens = _whole_blocks(query, kv, kv_lens)
    x = prepare_decode(query, kv, kv_lens, res_lens, rotate_query=False, order="tl")  # the kernel rotates the query
    options = dict(
        HKV=x.kv_heads,
        GROUP=x.group,
        LQ=x.lq,
        M=padded_rows(x.group, x.lq),
        D=x.head_dim,
        BLOCK_T=BLOCK_T,
        BLOCK_R=32,
        ROTATE=kv.hadamard is not None,
        ASM=_inline_ptx(),
        num_warps=num_warps,
        **({} if num_stages is None else {"num_stages": num_stages}),
        **({} if maxnreg is None else {"maxnreg": maxnreg}),
    )
    plan = _plan(x, plan, split_tokens, waves, options)
    return _launch(x, plan, float(scaling) * LOG2E, options, kv.rotate_out, query)


def _whole_blocks(query, kv, kv_lens):
    """The cache padded to whole 128-token blocks (the tl order's), the padding masked by kv_lens."""
    if kv.k is None or kv.k.num_tokens % TL_BLOCK == 0:
        return kv, kv_lens
    t = kv.k.num_tokens
    kv_lens = _lens(kv_lens, t, query.shape[0], t, "kv_lens", query.device)
    norms = kv.norms
    if norms is not None:
        norms = torch.cat([norms, norms.new_ones(norms.shape[0], -(-t // TL_BLOCK) * TL_BLOCK - t)], 1)
    return dataclasses.replace(kv, k=kv.k.pad_tokens(TL_BLOCK), v=kv.v.pad_tokens(TL_BLOCK), norms=norms), kv_lens


def _split_args(x, splits: int, split_tokens: int, sl2: float, po, pml) -> tuple:
    """decode_split_kernel's arguments before its constexprs (its signature's order)."""
    return (
        x.q,
        x.hd,
        x.kc,
        x.ks,
        x.kz,
        x.vc,
        x.vs,
        x.vz,
        x.norms,
        x.k_res,
        x.v_res,
        x.kv_lens,
        x.res_lens,
        po,
        pml,
        x.tokens,
        x.residual,
        splits,
        split_tokens,
        sl2,
        x.k_res.stride(0),
        x.k_res.stride(1),
        x.k_res.stride(2),
        x.v_res.stride(0),
        x.v_res.stride(1),
        x.v_res.stride(2),
    )


def _plan(x, plan: DecodePlan | None, split_tokens: int | None, waves: float | None, options: dict) -> DecodePlan:
    """The launch's DecodePlan: the given one (checked against x's shape), the given split_tokens, or plan_splits'
    with the compiled kernel's programs per SM (read once per launch configuration)."""
    rows = x.batch * x.kv_heads
    if plan is not None:
        if (plan.tokens, plan.rows) != (x.tokens, rows):
            raise ValueError(
                f"the plan was made for {plan.rows} rows of {plan.tokens} tokens, the inputs hold {rows} of "
                f"{x.tokens}: plan again"
            )
        split_tokens = plan.split_tokens
    if split_tokens is not None and (split_tokens <= 0 or split_tokens % BLOCK_T):
        raise ValueError(
            f"split_tokens ({split_tokens}) must be a positive multiple of {BLOCK_T} (the tl order's block)"
        )
    if plan is not None:
        return plan
    dev = x.q.device
    if split_tokens is None:
        programs = 2  # the 4-warp build's programs per SM (docs/PERFORMANCE.md), where it cannot be read
        if dev.type == "cuda":
            key = (dev.index, x.q.dtype, x.k_res.dtype, tuple(sorted(options.items())))
            if key not in _PROGRAMS:  # compile without launching and read the binary's registers and shared memory
                scratch = torch.empty(1, dtype=torch.float32, device=dev)
                args = _split_args(x, 1, BLOCK_T, 1.0, scratch, scratch)
                _PROGRAMS[key] = programs_per_sm(decode_split_kernel.warmup(*args, grid=(1,), **options), dev)
            programs = _PROGRAMS[key]
        split_tokens, splits = plan_splits(x.tokens, rows, BLOCK_T, num_sms(dev), programs, waves)
    else:
        splits = -(-x.tokens // split_tokens)
    return DecodePlan(x.tokens, rows, splits, split_tokens, warps=options["num_warps"])


def _launch(x, plan: DecodePlan, sl2: float, options: dict, rotate_out: bool, query):
    """The split kernel over the plan's (splits + 1) x rows programs, then the combine per query row."""
    dev, m = x.q.device, options["M"]
    po = torch.empty(plan.rows, plan.splits + 1, m, x.head_dim, dtype=torch.float32, device=dev)
    pml = torch.empty(plan.rows, plan.splits + 1, 2, m, dtype=torch.float32, device=dev)
    args = _split_args(x, plan.splits, plan.split_tokens, sl2, po, pml)
    decode_split_kernel[(plan.splits + 1, plan.rows)](*args, **options)
    out = torch.empty(query.shape, dtype=query.dtype, device=dev)
    combine_kernel[(plan.rows * x.group * x.lq,)](
        po,
        pml,
        x.hd,
        out,
        plan.splits,
        HKV=x.kv_heads,
        GROUP=x.group,
        LQ=x.lq,
        M=m,
        D=x.head_dim,
        NS=min(64, triton.next_power_of_2(max(plan.splits, 1))),
        ROTATE_OUT=rotate_out,
        num_warps=4,
    )
    return out
