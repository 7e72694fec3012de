"""Peak memory of the full-vocabulary reverse KL (a script, not a test): the fused, chunked form (`--kl-chunk`,
opct/fused_kl.py) against the unchunked one (today's `full` estimator: both models' (N, V) log-probs at once) and
TRL's SDFT full-logit loss (alpha = 1, the reverse KL), at real vocabulary sizes.

    python bench/kl_memory.py [--rows 8] [--vocab 49152 151936] [--positions 256 1024] [--chunk 256]

Each measurement runs in a fresh process: it allocates the inputs (both models' last hidden states for `rows x T`
response positions and the output layer, frozen as under LoRA), notes its resident memory, computes the loss and its
backward pass to the student's hidden states, and reports the peak resident memory above that baseline. One logits
tensor is rows x T x V float32; the target is `peak / one logits tensor <= 1.25` for the fused form. A form whose
estimated need exceeds the memory this machine has free is skipped and says so. TRL is not an opct dependency
(`pip install trl` to include it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

HIDDEN = {49152: 576, 151936: 896}  # SmolLM2-135M's and Qwen2.5-0.5B's hidden sizes at those vocabularies


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(a) -> dict:
    import torch

    torch.manual_seed(0)
    n, d = a.rows * a.positions, HIDDEN.get(a.vocab, 576)
    h_s = torch.randn(n, d, requires_grad=True)
    h_t = torch.randn(n, d)
    head = torch.nn.Linear(d, a.vocab, bias=False).requires_grad_(False)
    tokens = torch.randint(0, a.vocab, (n,))
    base = rss()
    if a.form == "fused":
        from opct.fused_kl import fused_reverse_kl

        kl, _ = fused_reverse_kl(h_s, h_t, head, head, tokens, chunk=a.chunk)
        loss = kl.sum()
    elif a.form == "unchunked":
        from opct.losses import log_probs, reverse_kl_full

        loss = reverse_kl_full(log_probs(head(h_s)), log_probs(head(h_t))).sum()
    else:
        from trl.experimental.sdft.loss_utils import compute_full_logit_self_distillation_loss

        loss = compute_full_logit_self_distillation_loss(head(h_s), head(h_t), distillation_alpha=1.0).sum()
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_extra": peak - base, "logits": n * a.vocab * 4, "loss": float(loss)}


def available() -> int:
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024


def main() -> int:
    from opct.config import positive_arg

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=positive_arg, default=8)
    p.add_argument("--vocab", type=positive_arg, nargs="+", default=[49152, 151936])
    p.add_argument("--positions", type=positive_arg, nargs="+", default=[256, 1024])
    p.add_argument("--chunk", type=positive_arg, default=256, help="positions per chunk of the fused form")
    p.add_argument("--forms", nargs="+", choices=["fused", "unchunked", "trl"], default=["fused", "unchunked", "trl"])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--form", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        a.vocab, a.positions = a.vocab[0], a.positions[0]
        print(json.dumps(worker(a)))
        return 0
    print(f"{'form':<10} {'V':>7} {'T':>5} {'one logits MB':>13} {'peak above inputs MB':>21}  peak / one logits tensor")
    for vocab in a.vocab:
        for positions in a.positions:
            logits = a.rows * positions * vocab * 4
            for form in a.forms:
                need = {"fused": 1.5, "unchunked": 7, "trl": 8}[form] * logits
                if need > 0.8 * available():
                    print(f"{form:<10} {vocab:>7} {positions:>5} {logits / 2**20:>13.0f}  skipped: needs about "
                          f"{need / 2**30:.1f} GiB, {available() / 2**30:.1f} GiB free")
                    continue
                cmd = [sys.executable, __file__, "--worker", "--form", form, "--rows", str(a.rows), "--vocab",
                       str(vocab), "--positions", str(positions), "--chunk", str(a.chunk)]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    last = (res.stderr.strip().splitlines() or ["failed"])[-1]
                    hint = " (TRL is not an opct dependency: pip install trl)" if "trl" in last else ""
                    print(f"{form:<10} {vocab:>7} {positions:>5} {logits / 2**20:>13.0f}  did not run: {last}{hint}")
                    continue
                r = json.loads(res.stdout.strip().splitlines()[-1])
                print(f"{form:<10} {vocab:>7} {positions:>5} {logits / 2**20:>13.0f} {r['peak_extra'] / 2**20:>21.0f}"
                      f"  peak / one logits tensor: {r['peak_extra'] / r['logits']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
