"""Would compiling the sampling engine's decode step pay on the CPU? (a script, not a test; opct does not compile)

A decode step of the shipped default organism, written out by hand from the engine's folded weights (8 rows, a
fixed-size KV cache and full-width masked attention, so that every step has the same shapes), is timed eager and
under torch.compile (inductor, dynamic=False), and the compile time is printed. Measured 2026-12-03 (AMD EPYC, one
thread): 2.29 ms eager, 1.56-1.59 ms compiled, 25 s to compile (6 s with inductor's cache warm); the README's bench
section says what that means for an OPCT step.

    python bench/decode_compile.py [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from opct.config import positive_arg

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=positive_arg, default=1)
    a = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from opct.engine import llama_engine

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    eng = llama_engine(AutoModelForCausalLM.from_pretrained(ROOT / "opct" / "organisms" / "default").eval())
    B, S, H, D, L = 8, 96, eng.n_heads, eng.head_dim, len(eng.layers)
    weights = [w for layer in eng.layers for w in (layer.qkv_w, layer.o_w, layer.gate_up_w, layer.down_w)]
    cache = [torch.zeros(B, H, S, D) for _ in range(2 * L)]
    rot = torch.polar(torch.ones(B, S, D // 2), torch.rand(B, S, D // 2))
    bias = torch.zeros(B, 1, 1, S)
    eps = eng.layers[0].norm1  # the folded RMSNorms' epsilon

    def norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def step(tok, col, weights, cache, rot, bias):
        x = F.embedding(tok, eng.embed_w)
        r = rot.index_select(1, col)[:, :, None]
        b = bias.masked_fill(~(torch.arange(S) <= col), float("-inf"))
        for i in range(L):
            qkv_w, o_w, gu_w, down_w = weights[4 * i:4 * i + 4]
            k_cache, v_cache = cache[2 * i], cache[2 * i + 1]
            qkv = norm(x) @ qkv_w.t()
            qk = torch.view_as_complex(qkv[:, :2 * H * D].reshape(B, 1, 2 * H, D // 2, 2))
            qk = torch.view_as_real(qk * r).reshape(B, 1, 2 * H, D).transpose(1, 2)
            k_cache.index_copy_(2, col, qk[:, H:])
            v_cache.index_copy_(2, col, qkv[:, 2 * H * D:].reshape(B, 1, H, D).transpose(1, 2))
            att = F.scaled_dot_product_attention(qk[:, :H], k_cache, v_cache, attn_mask=b, scale=eng.scale)
            x = x + att.transpose(1, 2).reshape(B, H * D) @ o_w.t()
            gate, up = (norm(x) @ gu_w.t()).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ down_w.t()
        return torch.log_softmax(norm(x) @ eng.lm_head_w.t(), -1)

    tok = torch.randint(5, 600, (B,))

    def ms_per_step(fn):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for t in range(32):
                fn(tok, torch.tensor([40 + t]), weights, cache, rot, bias)
            times.append((time.perf_counter() - t0) / 32)
        return statistics.median(times) * 1000

    with torch.inference_mode():
        print(f"eager: {ms_per_step(step):.2f} ms per decode step ({a.threads} threads, {B} rows)", flush=True)
        t0 = time.perf_counter()
        compiled = torch.compile(step, dynamic=False)
        compiled(tok, torch.tensor([40]), weights, cache, rot, bias)
        print(f"compile: {time.perf_counter() - t0:.1f} s", flush=True)
        print(f"compiled: {ms_per_step(compiled):.2f} ms per decode step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
