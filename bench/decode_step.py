"""How long one decode step of the sampling engine takes, for Llama models of the default organism's shape at other
widths (a script, not a test): what part of sampling is per-op overhead and what part is the matrix multiplies.

Each model has 4 layers, 3 heads and the default organism's vocabulary size (734), with random weights. A decode
step's time is (time to sample 33 tokens - time to sample 1) / 32, the median of 5 tries, at one intra-op thread.
The narrowest width shows the overhead floor: its weights are tiny, so what remains is per-op overhead.

    python bench/decode_step.py [--rows 8 32] [--widths 48 96 192]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from opct.config import positive_arg

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=positive_arg, nargs="+", default=[8, 32], help="rows sampled together")
    p.add_argument("--widths", type=positive_arg, nargs="+", default=[48, 96, 192],
                   help="hidden sizes (multiples of 3)")
    a = p.parse_args(argv)
    if any(w % 3 for w in a.widths):
        p.error(f"--widths: each must be a multiple of 3 (3 heads; got {a.widths})")

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from opct.engine import EnginePool, llama_engine

    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("hidden  rows  ms per decode step")
    for hidden in a.widths:
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=734, hidden_size=hidden, intermediate_size=round(hidden * 8 / 3), num_hidden_layers=4,
            num_attention_heads=3, num_key_value_heads=3, head_dim=hidden // 3, max_position_embeddings=512,
            tie_word_embeddings=True)).eval()
        pool = EnginePool()
        for rows in a.rows:
            prompts = [[5 + (i * 7 + j) % 600 for j in range(28)] for i in range(rows)]

            def seconds(n: int) -> float:
                times = []
                for _ in range(5):
                    engine = llama_engine(model, pool)
                    t0 = time.perf_counter()
                    engine.sample(prompts, n, 1.0, [3], 0, n)
                    times.append(time.perf_counter() - t0)
                return statistics.median(times)

            one = seconds(1)
            print(f"{hidden:>6}  {rows:>4}  {(seconds(33) - one) / 32 * 1000:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
