"""The project's own OScaR cache on a GPU: fast path (CUDA kernels through quant.cache.make_cache) vs
the torch reference (KernelOptions(backend="torch")), greedy generation on a random Qwen3-8B-attention-shaped
model (32 q / 8 kv heads, head_dim 128, few layers). Prints one JSON line:

    python3 -m benchmarks.check_cache --layers 2 --prompt 300 --new 100 [--out FILE]

The prompt (> 128 tokens) is packed at prefill; with --new > 128 - (prompt % 128) a block flush also runs
during decoding. "kernel_calls" counts decode steps served by quant.kernels.decode_attention.
"""

from __future__ import annotations

import argparse
import json

import torch


def tiny_qwen3(layers: int, device: str):
    import transformers

    cfg = transformers.Qwen3Config(
        vocab_size=1024,
        hidden_size=1024,
        intermediate_size=1024,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()


def generate(layers: int, prompt_len: int, new: int, backend: str | None) -> dict:
    """Greedy tokens and per-step logits with the project's cache; backend None = the default (fast)."""
    import quant
    from quant.kernels import KernelOptions, hf_decode

    model = tiny_qwen3(layers, "cuda")
    calls = {"n": 0}
    inner = hf_decode.decode_attention

    def counted(*a, **k):
        calls["n"] += 1
        return inner(*a, **k)

    hf_decode.decode_attention = counted
    try:
        cache = quant.make_cache(quant.get_method("oscar"), model, kernels=KernelOptions(backend=backend))
        ids = torch.randint(0, 1024, (1, prompt_len), generator=torch.Generator().manual_seed(1)).cuda()
        out = model.generate(
            ids,
            past_key_values=cache,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
        )
    finally:
        hf_decode.decode_attention = inner
    return {
        "tokens": out.sequences[0, prompt_len:].tolist(),
        "logits": torch.stack(out.logits, 1)[0].float().cpu(),
        "fast": cache.state.fast_decode,
        "kernel_calls": calls["n"],
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    fast = generate(a.layers, a.prompt, a.new, None)
    ref = generate(a.layers, a.prompt, a.new, "torch")
    same = [x == y for x, y in zip(fast["tokens"], ref["tokens"])]
    first_diff = same.index(False) if False in same else None
    upto = first_diff if first_diff is not None else len(same)  # logits compare while the inputs agree
    scale = ref["logits"][: upto + 1].abs().max().item()
    diff = (fast["logits"][: upto + 1] - ref["logits"][: upto + 1]).abs().max().item()
    res = {
        "fast_path": fast["fast"],
        "kernel_calls": fast["kernel_calls"],
        "reference_fast_path": ref["fast"],
        "new_tokens": a.new,
        "tokens_equal": sum(same),
        "first_token_diff": first_diff,
        "max_logit_diff_rel": diff / max(scale, 1e-12),
        "prompt": a.prompt,
        "layers": a.layers,
    }
    print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
