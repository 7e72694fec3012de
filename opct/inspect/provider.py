"""An inspect_ai model provider that samples through opct's own policy: `--model opct/local -M model_path=DIR`.

Why it exists, beside inspect's `hf/local`: it renders and samples as `opct eval` does (the tokenizer's chat template
through `HFPolicy.render`, opct's sampler: temperature sampling without top-k, stop at EOS), it loads a peft adapter
(`-M adapter=DIR`, which `hf/local` does not), and it *continues* a conversation that ends with an assistant message
(the prompt is rendered with the generation prompt, then the message's own tokens: `opct.pairs.schema.render_ids`),
where `hf/local` closes that message and starts a new turn. The last is what the `opct/prefill` task needs: a
prefill attack's prompt ends inside the assistant's turn.

Model arguments (`-M NAME=VALUE`): `model_path` (required: a `save_pretrained` directory, safetensors only),
`adapter` (a peft adapter directory), `dtype` (float32, bfloat16 or float16), `device` (cpu, cuda, ...),
`trust_remote_code` (false; true runs the directory's Python, with a warning), `seed` (0; inspect's `--seed`, when
given, takes its place), `threads` (torch's intra-op threads; by default one for a small model on the CPU, as `opct
eval`).

`batch_size` (1): how many requests are sampled together, in one batch (inspect is told to send that many at once:
`max_connections`). One request at a time is slow on a GPU, where a batch of 32 costs about what one does.

Sampling is seeded per request: each request draws from its own generator, seeded by (seed, the prompt's token ids,
how many times the same prompt was asked before: `opct.evals.generate.prompt_seed`, the seeds of `opct eval
--seed-per-prompt`; `HFPolicy.sample(row_seeds=...)`), so an eval gives the same
completions whatever order inspect's concurrency asks the samples in and whichever requests share a batch (up to
float rounding: a batch's matmuls may round differently from a single row's, which changes a token only where a
draw falls within rounding of the boundary between two tokens), and the process's RNG is left as it was.
Generation options it cannot honour are refused, not ignored: tools, `top_k`, `stop_seqs`, and `num_choices` > 1.
`max_tokens` defaults to 64 (as `opct eval`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    GenerateConfig,
    Logprob,
    Logprobs,
    ModelAPI,
    ModelOutput,
    ModelUsage,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from opct.errors import OpctError
from opct.evals.generate import Gen, PromptSeeds
from opct.inspect._args import clear_errors, flag, integer, seed as seed_value
from opct.pairs.schema import prefill_follows_user

try:  # the api key inspect passes when it makes a provider only to look up the model's name (no model arguments)
    from inspect_ai.model._model_info import MODEL_INFO_LOOKUP_API_KEY
except ImportError:  # an inspect_ai without that lookup
    MODEL_INFO_LOOKUP_API_KEY = None

DEFAULT_MAX_TOKENS = Gen.max_new_tokens  # opct eval's default
_ARGS = ("model_path", "adapter", "dtype", "device", "trust_remote_code", "seed", "threads", "batch_size")
GATHER_S = 0.02  # how long a batch waits for batch-mates (inspect's concurrent samples) before it is sampled


def messages_of(input: list[ChatMessage]) -> list[dict]:
    """inspect's messages as opct's chat messages; a last assistant message is a prefill (the turn it continues)."""
    msgs = []
    for i, m in enumerate(input):
        if m.role not in ("system", "user", "assistant"):
            raise OpctError(f"opct model: message {i} has role {m.role!r}; only system, user and assistant messages "
                            "can be rendered (no tool calls)")
        msgs.append({"role": m.role, "content": m.text})
    if msgs and msgs[-1]["role"] == "assistant":
        if not prefill_follows_user(msgs):
            raise OpctError("opct model: a conversation that ends with an assistant message (continued as its "
                            "prefill) must have a user message right before it")
        msgs[-1]["prefill"] = True
    if not msgs:
        raise OpctError("opct model: no messages to answer")
    return msgs


def check_generate_config(config: GenerateConfig) -> None:
    """The generation options opct's sampler cannot honour, refused by name."""
    for name in ("top_k", "stop_seqs"):
        if getattr(config, name) is not None:
            raise OpctError(f"opct model: {name} is not supported (opct's sampler: temperature sampling, "
                            "optionally top_p, stopping at EOS)")
    if (config.num_choices or 1) != 1:
        raise OpctError("opct model: num_choices must be 1")


@dataclass
class _Request:
    ids: list[int]
    seed: int
    key: tuple  # (max_new, temperature, top_p): requests sampled together must agree on these
    logprobs: bool
    future: asyncio.Future = field(repr=False)


class OpctAPI(ModelAPI):
    """inspect's ModelAPI over `opct.policy.load_policy(model_path, adapter, dtype, device)`."""

    continues_prefill = True  # a last assistant message is continued, not closed (what opct/prefill checks for)

    @clear_errors()  # `inspect eval` prints a bad -M argument or model directory as one line
    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig = GenerateConfig(), **model_args: Any):
        super().__init__(model_name=model_name, base_url=base_url, api_key=api_key, config=config)
        if api_key is not None and api_key == MODEL_INFO_LOOKUP_API_KEY:
            # inspect (0.3.285) makes a provider without the -M arguments after each model call, for its usage
            # display's model info (only the name is read): no model loaded, and no "no model directory" error
            # (printed under `--display none` after an eval that went well)
            self.policy = None
            return
        unknown = sorted(set(model_args) - set(_ARGS))
        if unknown:
            raise OpctError(f"opct model: unknown model argument {unknown[0]!r}; known: {', '.join(_ARGS)}")
        path = model_args.get("model_path")
        if not path:
            raise OpctError("opct model: no model directory; pass -M model_path=DIR (a save_pretrained directory)")
        from opct.modeldir import check_device
        from opct.policy import check_dtype, count_parameters, load_policy

        device = str(model_args.get("device") or "cpu")
        check_device(device, "opct model argument device", "-M device=cpu")  # load_policy's would name --device
        dtype = str(model_args.get("dtype") or "float32")
        check_dtype(dtype, "opct model argument dtype")  # load_policy's own would name plain `dtype`
        trust = flag("model argument", "trust_remote_code", model_args.get("trust_remote_code", False))
        threads = integer("model argument", "threads", model_args.get("threads"), 1, allow_none=True)
        self.batch_size = integer("model argument", "batch_size", model_args.get("batch_size", 1), 1)
        self.seed = seed_value("model argument", "seed", model_args.get("seed", 0))
        if config.seed is not None:
            self.seed = seed_value("model argument", "--seed", config.seed)
        check_generate_config(config)  # `inspect eval --top-k 5`: one line now, not a traceback per sample later
        self.policy = load_policy(path, model_args.get("adapter"), dtype, device,
                                  trust_remote_code=trust)
        self._threads = (count_parameters(path), device, threads)  # set around each batch (`cpu_threads`)
        self._lock = threading.Lock()  # one batch at a time on the model (the sampler's memory is shared)
        self._seeds = PromptSeeds(self.seed)  # a request's seed: by its prompt and how often it was asked before
        self._pending: list[_Request] = []
        self._drainer: asyncio.Task | None = None  # samples what is pending, while there is any

    def max_tokens(self) -> int | None:
        return DEFAULT_MAX_TOKENS

    def max_connections(self) -> int:
        return self.batch_size  # as many requests at once as one batch samples

    def context_fits(self, messages: list[dict], max_new: int) -> bool:
        """Whether opct's rendering of `messages` plus `max_new` tokens fits the model's positions (the context rule
        of `opct.axes.frustration.rollout`)."""
        limit = self.policy.max_positions
        return limit is None or len(self.policy.render(messages)) + max_new <= limit

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice,
                       config: GenerateConfig) -> ModelOutput:
        if tools:
            raise OpctError("opct model: tools are not supported (the policy samples text only)")
        check_generate_config(config)
        request = self._request(messages_of(input), config)
        self._pending.append(request)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())  # kept: a task nobody holds may be collected
        return await request.future

    def _request(self, messages: list[dict], config: GenerateConfig) -> _Request:
        """Render and check one request, and fix its seed (here, in the order requests arrive)."""
        policy = self.policy
        max_new = config.max_tokens or DEFAULT_MAX_TOKENS
        temperature = 1.0 if config.temperature is None else float(config.temperature)
        top_p = 1.0 if config.top_p is None else float(config.top_p)
        ids = policy.render(messages)
        policy.check_fits(ids, max_new, f"opct model {self.model_name}")
        return _Request(ids, self._seeds(ids), (max_new, temperature, top_p),
                        bool(config.logprobs), asyncio.get_running_loop().create_future())

    async def _drain(self) -> None:
        """Sample the pending requests, up to `batch_size` of one (max_new, temperature, top_p) at a time, waiting up
        to GATHER_S for a batch to fill."""
        batch: list[_Request] = []
        try:
            while self._pending:
                deadline = time.monotonic() + GATHER_S
                while len(self._pending) < self.batch_size and time.monotonic() < deadline:
                    await asyncio.sleep(0.002)
                self._pending = [r for r in self._pending if not r.future.done()]  # a caller cancelled its request
                if not self._pending:
                    break
                key = self._pending[0].key
                batch = [r for r in self._pending if r.key == key][:self.batch_size]
                self._pending = [r for r in self._pending if r not in batch]
                try:
                    outputs = await asyncio.to_thread(self._sample, batch)
                except Exception as e:  # noqa: BLE001 - the batch's requests fail with it; the others go on
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(e)
                    continue
                for r, out in zip(batch, outputs):
                    if not r.future.done():
                        r.future.set_result(out)
        finally:  # normally nothing is left; cancelled (the eval stopped), no request may wait for ever
            for r in (*batch, *self._pending):
                if not r.future.done():
                    r.future.cancel()
            self._pending.clear()

    def _sample(self, batch: list[_Request]) -> list[ModelOutput]:
        policy = self.policy
        max_new, temperature, top_p = batch[0].key
        from opct.policy import cpu_threads

        with self._lock, cpu_threads(*self._threads):  # the sampling thread's count, the caller's back after
            out = policy.sample([r.ids for r in batch], max_new, temperature, top_p=top_p,
                                row_seeds=[r.seed for r in batch])
        return [self._output(r, out.response_ids[i], out.texts[i], out.truncated[i], out.logprobs[i])
                for i, r in enumerate(batch)]

    def _output(self, r: _Request, response_ids, text, truncated, token_logprobs) -> ModelOutput:
        logprobs = None
        if r.logprobs:
            tok = self.policy.tokenizer
            logprobs = Logprobs(content=[Logprob(token=tok.decode([t]), logprob=lp)
                                         for t, lp in zip(response_ids, token_logprobs)])
        choice = ChatCompletionChoice(message=ChatMessageAssistant(content=text, model=self.model_name,
                                                                   source="generate"),
                                      stop_reason="max_tokens" if truncated else "stop", logprobs=logprobs)
        return ModelOutput(model=self.model_name, choices=[choice],
                           usage=ModelUsage(input_tokens=len(r.ids), output_tokens=len(response_ids),
                                            total_tokens=len(r.ids) + len(response_ids)))
