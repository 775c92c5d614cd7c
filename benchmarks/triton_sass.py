"""The Triton decode's machine code without a GPU: compile `triton_decode.decode_split_kernel` for sm_90, read its
registers, spills and shared memory, and count the instructions of each loop of its SASS by opcode.

    python3 -m benchmarks.triton_sass --num-warps 4
    python3 -m benchmarks.triton_sass --head-dim 64 --maxnreg 168 --top 30 --out sass.json

Triton compiles for a GPU target on any machine (its wheel carries ptxas and cuobjdump). The compile gets the
divisibility hints a real launch specializes on (16-byte aligned tensors, T and split_tokens multiples of 128, the
window's strides multiples of D): without them the tl order's scale loads cannot be shown aligned and are neither
vectorized nor cp.async-staged (1182 instructions per block instead of 771 under Triton 3.6). The counts showed
where the natural-order loop spent its instructions and guided the design of the tl order (docs/KERNELS.md). They
are a guide to what the GPU will do, not a time: smaller cuts have given less than they promised (the timings:
docs/PERFORMANCE.md, The Triton decode).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Argument types of decode_split_kernel (pointers by name; the other runtime arguments are i32, scale_log2 fp32).
_POINTERS = {
    "HD": "*fp32",
    "KC": "*i32",
    "KS": "*fp16",
    "KZ": "*fp16",
    "VC": "*i32",
    "VS": "*fp16",
    "VZ": "*fp16",
    "NORM": "*fp32",
    "KV_LEN": "*i32",
    "RES_LEN": "*i32",
    "PO": "*fp32",
    "PML": "*fp32",
}


def _tool(name: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{name} is not in this Triton wheel ({path}); it ships with triton's NVIDIA backend")
    return str(path)


# Arguments a real launch specializes as divisible by 16 (Triton's rule for integers and 16-byte aligned pointers).
_DIV16 = {
    "Q",
    "HD",
    "KC",
    "KS",
    "KZ",
    "VC",
    "VS",
    "VZ",
    "NORM",
    "KR",
    "VR",
    "KV_LEN",
    "RES_LEN",
    "PO",
    "PML",
    "T",
    "split_tokens",
    "stride_rb",
    "stride_rh",
    "stride_rt",
    "stride_vb",
    "stride_vh",
    "stride_vt",
}


def compile_decode(
    head_dim: int = 128,
    group: int = 4,
    kv_heads: int = 8,
    num_warps: int = 4,
    num_stages: int | None = None,
    maxnreg: int | None = None,
    dtype: str = "bf16",
    arch: int = 90,
):
    """The compiled decode_split_kernel (a triton CompiledKernel) for one launch configuration, as the launcher would
    build it for a [B, group * kv_heads, 1, head_dim] query in `dtype` over a rotated cache."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: the interpreter does not compile; unset it for this tool")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from quant.kernels import triton_decode
    from quant.kernels.common import padded_rows

    fn = triton_decode.decode_split_kernel
    const = dict(
        HKV=kv_heads,
        GROUP=group,
        LQ=1,
        M=padded_rows(group, 1),
        D=head_dim,
        BLOCK_T=triton_decode.BLOCK_T,
        BLOCK_R=32,
        ROTATE=True,
        ASM=True,
    )
    types = {**_POINTERS, "Q": f"*{dtype}", "KR": f"*{dtype}", "VR": f"*{dtype}"}
    sig = {n: "constexpr" if n in const else types.get(n, "fp32" if n == "scale_log2" else "i32") for n in fn.arg_names}
    options = {
        "num_warps": num_warps,
        **({} if num_stages is None else {"num_stages": num_stages}),
        **({} if maxnreg is None else {"maxnreg": maxnreg}),
    }
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in _DIV16}
    return triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options=options,
    )


def resources(cubin: bytes) -> dict:
    """Registers, stack (spills) and shared memory of the cubin's kernel, from cuobjdump's resource usage."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out)}
    return {
        "registers": found.get("REG"),
        "stack_bytes": found.get("STACK"),
        "static_shared_bytes": found.get("SHARED"),
    }


def sass_loops(cubin: bytes) -> list[dict]:
    """Each loop of the SASS (a backward branch): its address range, instruction count and opcode counts."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ins = [
        (int(m.group(1), 16), m.group(2).strip())
        for m in (re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in text.splitlines())
        if m
    ]
    index = {addr: i for i, (addr, _) in enumerate(ins)}
    loops = []
    for i, (addr, op) in enumerate(ins):
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", op)
        if target and int(target.group(1), 16) < addr and int(target.group(1), 16) in index:
            body = ins[index[int(target.group(1), 16)] : i + 1]
            ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", o).split()[0].split(".")[0] for _, o in body)
            loops.append(
                {
                    "start": hex(body[0][0]),
                    "end": hex(addr),
                    "instructions": len(body),
                    "opcodes": dict(ops.most_common()),
                }
            )
    return loops


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dim", type=int, default=128, choices=[64, 128])
    p.add_argument("--group", type=int, default=4, help="query heads per KV head")
    p.add_argument("--num-warps", type=int, default=4)
    p.add_argument("--num-stages", type=int, default=None)
    p.add_argument("--maxnreg", type=int, default=None)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--top", type=int, default=20, help="opcodes listed per loop")
    p.add_argument("--out", default=None, help="JSON path")
    a = p.parse_args(argv)
    k = compile_decode(a.head_dim, a.group, 8, a.num_warps, a.num_stages, a.maxnreg, a.dtype)
    res = {**resources(k.asm["cubin"]), "dynamic_shared_bytes": k.metadata.shared}
    loops = sass_loops(k.asm["cubin"])
    print(
        f"decode_split_kernel D={a.head_dim} group={a.group} warps={a.num_warps} "
        f"stages={a.num_stages} maxnreg={a.maxnreg}: {res}"
    )
    for lp in loops:
        mix = " ".join(f"{op}:{n}" for op, n in list(lp["opcodes"].items())[: a.top])
        print(f"  loop {lp['start']}-{lp['end']}: {lp['instructions']} instructions: {mix}")
    if a.out:
        Path(a.out).write_text(json.dumps({"config": vars(a), "resources": res, "loops": loops}, indent=1))
        print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
