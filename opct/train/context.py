"""What a method's step function receives: the pieces the shared training loop owns (see opct/methods)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator

import torch

from opct.pairs.schema import Pair
from opct.policy import HFPolicy
from opct.train.config import TrainConfig


@dataclass
class RenderedPair:
    """A pair's two prompts as token ids (chat template applied, generation prompt added)."""

    student_ids: list[int]
    teacher_ids: list[int]


@dataclass
class StepContext:
    config: TrainConfig
    accelerator: "object"  # accelerate.Accelerator
    # the prepared student (DDP-wrapped under `accelerate launch`): forwards that need grads; inside a micro-batch
    # that does not synchronise (`grad_sync`), the module under the DDP wrapper
    model: torch.nn.Module
    policy: HFPolicy  # the same student, unwrapped: render, sample, eos and pad ids
    teacher: Callable[[], ContextManager[torch.nn.Module]]  # `with run.teacher() as t:` -> frozen starting model
    prompts: dict[str, RenderedPair]  # pair id -> rendered prompts (checked against the context length)
    pairs: dict[str, Pair] = field(default_factory=dict)  # pair id -> the pair (messages, task, meta)
    step: int = 0  # optimizer steps done before this one (in `prepare`: the step the run resumes from)
    cache: dict = field(default_factory=dict)  # scratch space for methods that precompute (e.g. offline targets)
    # what draws OPCT's rollouts when it is not the policy itself: a `VLLMSampler` kept in step with the student
    # (opct.engine.vllm_sampler; the loop calls its `begin_step` and `push_weights`); None = `policy.sample`
    sampler: object = None

    @contextmanager
    def teacher_policy(self) -> Iterator[HFPolicy]:
        """The frozen starting model behind the policy interface (to sample or decode from it): under LoRA the student
        itself with its adapters disabled, under full fine-tuning the frozen copy of the starting weights."""
        with self.teacher() as t:
            yield self.policy if t is self.policy.model else self.policy.sibling(t)

    def autocast(self) -> ContextManager:
        """bf16 autocast when `config.bf16` (done here rather than by accelerate's mixed_precision, whose process-wide
        state would pin the first run's precision for every later `train()` call in the same process)."""
        return torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16, enabled=self.config.bf16)

    @contextmanager
    def grad_sync(self, last_micro_batch: bool) -> Iterator[None]:
        """Wrap a micro-batch's forward AND backward: gradients are synchronised across processes only on the last
        micro-batch of the step (DDP decides whether to sync during the forward, so the forward must be inside).
        Under DeepSpeed ZeRO-2 the engine reduces every backward into its shards (no_sync is refused there).

        Under DDP, a micro-batch that does not synchronise runs on the module under the wrapper (`self.model` is
        swapped for the duration), not merely under `no_sync`: DDP's forward issues collectives of its own even
        under no_sync (the broadcast of the buffers from rank 0 in the first forward after a synchronised one, the
        one-time bucket rebuild), so ranks running different numbers of such micro-batches (benign replay splits a
        step's rows unevenly) would reach them at different points and wait on each other for ever. Gradients
        accumulate locally into the same parameters, as under no_sync, and the step's last micro-batch, which every
        rank runs, reduces them. So a step's collectives are the same on every rank whatever rows each holds."""
        from opct.train.sharded import is_deepspeed

        if last_micro_batch or is_deepspeed(self.accelerator):
            yield
            return
        wrapped = self.model
        with self.accelerator.no_sync(wrapped):
            self.model = self.accelerator.unwrap_model(wrapped)
            try:
                yield
            finally:
                self.model = wrapped

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's (already globally scaled) loss: `accelerator.backward`, or under DeepSpeed
        the engine's accumulate-only backward with its all-ranks NaN check (opct.train.sharded)."""
        from opct.train import sharded

        if sharded.is_deepspeed(self.accelerator):
            sharded.backward(self.accelerator, self.model, loss)
        else:
            self.accelerator.backward(loss)
