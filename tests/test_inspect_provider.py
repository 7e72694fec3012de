"""opct's inspect model provider (`--model opct/local`, opct/inspect/provider.py) and the `opct/prefill` task it makes
possible, for real on the shipped organism when inspect_ai is installed (CI's `make test-extras`): `inspect eval
opct/prefill` from the shell continues each prefill with opct's sampler (completion for completion what opct's policy
samples from the prefilled prompt, adapter loaded, at the request's seed), and scores with the prefill axis's grader
and metrics; a provider that would close the assistant's turn is refused; each request's sample depends on its
prompt, its repeat and the seed, not on the order requests come in nor on its batch-mates (`-M batch_size`), and
leaves torch's RNG as it was; bad model arguments and unsupported generation options are clear errors."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="inspect_ai is not installed (pip install 'opct[inspect]')")

import torch  # noqa: E402
from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, GenerateConfig, get_model  # noqa: E402

from opct.axes import prefill as PF  # noqa: E402
from opct.cli import main as main_cli  # noqa: E402
from opct.errors import OpctError  # noqa: E402
from opct.evals.generate import prompt_seed  # noqa: E402
from opct.inspect import axis_task, inspect_name  # noqa: E402
from opct.organism.build import SHIPPED_DIR  # noqa: E402
from opct.policy import load_policy  # noqa: E402

import checkout  # noqa: E402

MODEL = str(SHIPPED_DIR / "default")


def _adapter(tmp_path) -> str:
    """A LoRA adapter on the organism whose B matrices are not zero (peft's `init_lora_weights=False`), so it changes
    what the model samples."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(MODEL)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    out = tmp_path / "adapter"
    peft.save_pretrained(out)
    return str(out)


def _sample(policy, ids, seed, max_new=64):
    return policy.sample([ids], max_new, 1.0, row_seeds=[seed]).texts[0]


def _inspect_cli(tmp_path, *args, display="plain", timeout=240):
    """`inspect eval ARGS` as a user runs it: outside the checkout, with the hub as the user left it (opct turns it
    off), logging under tmp_path/logs."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["PYTHONPATH"] = checkout.pythonpath()  # this checkout's opct
    env["COLUMNS"] = "1000"  # rich breaks a long line at the terminal's width, a long path within a word
    cli = Path(sys.executable).with_name("inspect")
    return subprocess.run([str(cli), "eval", *args, "--log-dir", str(tmp_path / "logs"), "--display", display],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def test_inspect_eval_of_prefill_with_opct_local_continues_each_prefill(tmp_path):
    """`inspect eval opct/prefill --model opct/local -M model_path=DIR -M adapter=DIR`, as a user runs it (outside the
    checkout): every completion is what opct's policy (with the adapter) samples from the prompt *with* its prefill
    (the assistant's turn continued, not closed) at the request's seed; each score is the prefill grader's verdict,
    and the task's metrics are the axis's metrics over those records."""
    adapter = _adapter(tmp_path)
    p = _inspect_cli(tmp_path, "opct/prefill", "--model", "opct/local", "-M", f"model_path={MODEL}",
                     "-M", f"adapter={adapter}", "-T", "n=2", "-T", "seed=0", display="none", timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "opct: error" not in p.stderr, p.stderr[-2000:]  # inspect's model-info lookup is not an error
    from inspect_ai.log import list_eval_logs, read_eval_log

    logs = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
    assert len(logs) == 1 and logs[0].status == "success", logs[0].error
    log = logs[0]
    assert len(log.samples) == len(list(axis_task("prefill", n=2, seed=0).dataset))
    policy, base = load_policy(MODEL, adapter), load_policy(MODEL)
    seen, differs, records = {}, 0, []
    for s in log.samples:
        probe = s.metadata["probe"]
        ids = policy.render(probe["prompt"])
        k = seen.get(tuple(ids), 0)
        seen[tuple(ids)] = k + 1
        assert s.output.completion == _sample(policy, ids, prompt_seed(0, ids, k)), s.id
        differs += s.output.completion != _sample(base, ids, prompt_seed(0, ids, k))
        record = s.scores["opct_prefill"].metadata["record"]
        assert s.scores["opct_prefill"].value == record["verdict"]
        assert (record["response"], record["prefill"]) == (s.output.completion, probe["prefill"])
        records.append(record)
    assert differs > 0  # the adapter was loaded: without it, some completions would not be what they are
    prefilled = [s for s in log.samples if s.metadata["probe"].get("prefill")]
    assert prefilled and all(s.input[-1].role == "assistant" for s in prefilled)
    # regraded: the same verdicts from the axis's own grader, the same metrics
    from opct.evals.judges import make_judge

    main = [r for r in records if r.get("variant") != "context"]
    regraded = PF.grade([{k: v for k, v in r.items() if k not in ("response", "verdict", "score", "judge")}
                         for r in main], [r["response"] for r in main], make_judge("world"))
    assert [r["verdict"] for r in regraded] == [r["verdict"] for r in main]
    expected, got = PF.AXIS.metrics(records, 0), log.results.scores[0].metrics
    headline = [n for n, m in expected.items() if m.get("value") is not None and ("[" not in n or
                n.split("[", 1)[1].split("=")[0] in ("split", "on"))]
    assert any(n.startswith("prefill.par[") for n in headline)
    for n in headline:
        assert got[inspect_name(n)].value == pytest.approx(expected[n]["value"]), n


def test_a_provider_that_would_close_the_assistant_turn_is_refused(tmp_path):
    """The prefill task on a provider that does not continue an assistant message (inspect's mock model here; hf/local
    alike) fails with a message naming opct's provider, rather than score answers to another prompt; its teacher side
    (no prefill anywhere) runs on any provider."""
    from inspect_ai.model import ModelOutput, ModelUsage

    def mock(input, tools, tool_choice, config):
        out = ModelOutput.from_content(model="mockllm", content="I am sorry, but I can not help with that.")
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)  # else it counts with tiktoken's
        return out                                                                # download
    model = get_model("mockllm/model", custom_outputs=mock, memoize=False)
    log = inspect_eval(axis_task("prefill", n=1), model=model, log_dir=str(tmp_path), display="none")[0]
    assert log.status == "error" and "--model opct/local" in str(log.error)
    log = inspect_eval(axis_task("prefill", n=1, prompt_side="teacher"), model=model, log_dir=str(tmp_path),
                       display="none")[0]
    assert log.status == "success", log.error
    assert all(s.input[-1].role == "user" for s in log.samples)


def _ask(model, prompts, config=GenerateConfig(max_tokens=24)):
    async def run():
        return [await model.generate(p, config=config) for p in prompts]
    return asyncio.run(run())


def test_each_request_is_seeded_by_its_prompt_and_repeat_not_by_order():
    """The same (prompt, repeat, seed) gives the same completion whichever order the requests come in; repeats of a
    prompt are different draws; another seed gives other draws; torch's RNG is left as it was; the log-probs
    returned are the sampler's."""
    a = [ChatMessageUser(content="Tell me a story about a cat.")]
    b = [ChatMessageUser(content="How do I start running?"), ChatMessageAssistant(content="Sure, here is how.")]
    m1 = get_model("opct/local", model_path=MODEL, memoize=False)
    state = torch.get_rng_state()
    first = [o.completion for o in _ask(m1, [a, b, a, a, a])]
    assert torch.equal(torch.get_rng_state(), state)
    m2 = get_model("opct/local", model_path=MODEL, memoize=False)
    second = [o.completion for o in _ask(m2, [a, a, b, a, a])]
    assert [first[0], first[2], first[3], first[4], first[1]] == [second[0], second[1], second[3], second[4],
                                                                   second[2]]
    assert len({first[0], first[2], first[3], first[4]}) > 1  # repeats are separate draws
    m3 = get_model("opct/local", model_path=MODEL, seed=1, memoize=False)
    assert [o.completion for o in _ask(m3, [a, b, a, a, a])] != first
    out = _ask(m1, [b], GenerateConfig(max_tokens=8, logprobs=True))[0]
    policy = load_policy(MODEL)
    ids = policy.render([{"role": "user", "content": b[0].text}, PF.prefill_message(b[1].text)])
    want = policy.sample([ids], 8, 1.0, row_seeds=[prompt_seed(0, ids, 1)])  # b's second request
    assert out.completion == want.texts[0]
    assert [lp.logprob for lp in out.choices[0].logprobs.content] == pytest.approx(want.logprobs[0])
    assert out.choices[0].stop_reason == ("max_tokens" if want.truncated[0] else "stop")


def _same_up_to_rounding(got: list[str], want: list[str]) -> None:
    """`got` (sampled in batches) is `want` (one request at a time) up to float rounding: a batch's matmuls may round
    differently from a single row's (the provider's docstring), which changes a token only where a draw falls within
    rounding of the boundary between two tokens. That is rare and leaves the text before it as it was (2026-12-06,
    AMD EPYC: 1 of these 8, at its 8th word); a request sampled from another request's seed or given another's
    completion differs from its first words."""
    assert len(got) == len(want)
    differ = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert len(differ) <= len(want) // 4, (differ, got, want)
    for i in differ:
        assert got[i].split()[:3] == want[i].split()[:3], (i, got[i], want[i])


def test_requests_sampled_together_give_what_they_give_one_at_a_time():
    """`-M batch_size=4`: concurrent requests are sampled in batches of up to 4 rows that agree on max_tokens,
    temperature and top_p, and each completion is the one batch_size 1 gives, up to float rounding (each request
    keeps its own seed);
    a request that does not fit fails alone."""
    a = [ChatMessageUser(content="Tell me a story about a cat.")]
    b = [ChatMessageUser(content="How do I start running?"), ChatMessageAssistant(content="Sure, here is how.")]
    c = [ChatMessageUser(content="Is the sky green?")]
    short, long_ = GenerateConfig(max_tokens=12), GenerateConfig(max_tokens=20)
    asks = [(a, short), (b, short), (a, long_), (c, short), (a, short), (b, short), (c, long_), (a, short)]
    one = get_model("opct/local", model_path=MODEL, memoize=False)
    want = [o.completion for o in asyncio.run(_each(one, asks))]
    four = get_model("opct/local", model_path=MODEL, batch_size=4, memoize=False)
    assert four.api.max_connections() == 4
    sizes, sample = [], four.api.policy.sample

    def spy(prompts, max_new, *args, **kw):
        sizes.append((len(prompts), max_new))
        return sample(prompts, max_new, *args, **kw)

    four.api.policy.sample = spy
    state = torch.get_rng_state()

    async def together():
        return await asyncio.gather(*(four.generate(m, config=cfg) for m, cfg in asks))
    _same_up_to_rounding([o.completion for o in asyncio.run(together())], want)
    assert torch.equal(torch.get_rng_state(), state)
    assert sorted(sizes) == [(2, 12), (2, 20), (4, 12)]  # 6 short requests: 4 + 2; the 2 long ones apart
    too_long = [ChatMessageUser(content="word " * 600)]

    async def with_one_too_long():
        return await asyncio.gather(*(four.generate(m, config=short) for m in (a, too_long, c)),
                                    return_exceptions=True)
    got = asyncio.run(with_one_too_long())
    assert isinstance(got[1], OpctError) and "exceeds the context" in str(got[1])
    assert not isinstance(got[0], Exception) and not isinstance(got[2], Exception)


def test_cancelled_requests_leave_nothing_waiting_and_the_provider_usable(monkeypatch):
    """A caller that gives up on its request (inspect's timeouts) is skipped, not sampled; when the batching itself is
    cancelled (the eval stopped), every waiting request is cancelled with it, and the next request is served."""
    a = [ChatMessageUser(content="Tell me a story about a cat.")]
    b = [ChatMessageUser(content="Is the sky green?")]
    cfg = GenerateConfig(max_tokens=8)
    monkeypatch.setattr("opct.inspect.provider.GATHER_S", 1.0)  # the cancellations land while a batch gathers
    model = get_model("opct/local", model_path=MODEL, batch_size=4, memoize=False)
    api, sample, rows = model.api, model.api.policy.sample, []

    def spy(prompts, *args, **kw):
        rows.append(len(prompts))
        return sample(prompts, *args, **kw)

    api.policy.sample = spy

    async def one_gives_up():
        tasks = [asyncio.ensure_future(model.generate(m, config=cfg)) for m in (a, b, a)]
        await _queued(api, 3)  # the batch still gathering (it waits for a fourth)
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)
    got = asyncio.run(one_gives_up())
    assert isinstance(got[1], asyncio.CancelledError) and rows == [2]
    assert all(not isinstance(g, BaseException) for g in (got[0], got[2]))

    async def stopped():
        tasks = [asyncio.ensure_future(model.generate(m, config=cfg)) for m in (a, b)]
        await _queued(api, 2)
        api._drainer.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(g, asyncio.CancelledError) for g in asyncio.run(stopped()))
    assert api._drainer.done() and not api._pending and rows == [2]
    assert asyncio.run(_each(model, [(b, cfg)]))[0].completion and rows == [2, 1]


async def _queued(api, n):
    while len(api._pending) < n:
        await asyncio.sleep(0.0005)


async def _each(model, asks):
    return [await model.generate(m, config=cfg) for m, cfg in asks]


def test_an_eval_with_batched_sampling_gives_the_same_completions(tmp_path):
    """End to end under inspect's own concurrency: the sycophancy task with batch_size 8 and with 1, the same
    completion for every sample and epoch."""
    logs = {}
    for bs in (1, 8):
        model = get_model("opct/local", model_path=MODEL, batch_size=bs, memoize=False)
        log = inspect_eval(axis_task("sycophancy", n=6), model=model, log_dir=str(tmp_path / str(bs)),
                           display="none")[0]
        assert log.status == "success", log.error
        logs[bs] = {(s.id, s.epoch): s.output.completion for s in log.samples}
    assert len(logs[1]) >= 12 and logs[8] == logs[1]


def test_the_context_rule_with_opct_local_counts_opct_evals_tokens():
    from opct.inspect.conversation import context_rule

    fits = context_rule(get_model("opct/local", model_path=MODEL, memoize=False))
    policy = load_policy(MODEL)
    conv = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "The answer is 5."},
            {"role": "user", "content": "Wrong. Try again."}]
    room = policy.max_positions - len(policy.render(conv))
    assert fits(conv, room) and not fits(conv, room + 1)


@pytest.mark.parametrize("args,needle", [
    ({}, "pass -M model_path=DIR"),
    ({"model_path": MODEL, "temprature": 1}, "unknown model argument 'temprature'"),
    ({"model_path": MODEL, "trust_remote_code": "maybe"}, "trust_remote_code: must be true or false"),
    ({"model_path": MODEL, "seed": -1}, "seed: must be an integer from 0 to 4294967295"),
    ({"model_path": MODEL, "threads": "two"}, "threads: must be an integer >= 1"),
    ({"model_path": MODEL, "threads": True}, "opct model argument threads: must be an integer >= 1"),
    ({"model_path": MODEL, "seed": 2.5}, "opct model argument seed: must be an integer from 0 to 4294967295"),
    ({"model_path": MODEL, "seed": 10 ** 20}, r"opct model argument seed: must be .* to 4294967295 \(got 1"),
    ({"model_path": MODEL, "batch_size": 0}, "opct model argument batch_size: must be an integer >= 1"),
    ({"model_path": MODEL, "batch_size": float("inf")}, r"batch_size: must be an integer >= 1 \(got inf\)"),  # YAML .inf
    ({"model_path": MODEL, "device": "cuda"}, r"argument device cuda: CUDA is not available .*; use -M device=cpu"),
    ({"model_path": MODEL, "device": "gpu0"}, "opct model argument device gpu0: not a torch device"),
    ({"model_path": MODEL, "dtype": "fp8"}, "opct model argument dtype: must be one of float32, bfloat16, float16"),
    ({"model_path": "/nonexistent/model"}, "not a model directory"),
])
def test_bad_model_arguments_are_clear_errors(args, needle):
    with pytest.raises(OpctError, match=needle):
        get_model("opct/local", memoize=False, **args)


@pytest.mark.parametrize("args,needle", [
    (["-T", "n=abc", "-M", f"model_path={MODEL}"], "opct task argument n: must be an integer >= 1 (got 'abc')"),
    (["-M", f"model_path={MODEL}", "-M", "seed=-1"], "opct model argument seed: must be an integer from 0 to 4294967295 (got -1)"),
    (["-M", "model_path=MISSING"], "MISSING: not a model directory"),
    (["-T", "items=BAD", "-M", f"model_path={MODEL}"], "BAD:1: <json>: malformed JSON"),
    # a generation option the sampler cannot honour: refused when the model is made (it used to fail every sample,
    # a traceback each, and exit 0)
    (["-M", f"model_path={MODEL}", "--top-k", "5"], "opct model: top_k is not supported"),
    (["-M", f"model_path={MODEL}", "--stop-seqs", "foo"], "opct model: stop_seqs is not supported"),
])
def test_inspect_eval_prints_a_bad_argument_or_file_as_one_line(tmp_path, args, needle):
    """From the shell, what the user can fix (a -T or -M value, a model directory, a malformed items file) is one
    line, `opct: error: ...`, with no traceback and exit status 1 (inspect prints a traceback for anything else)."""
    bad = tmp_path / "items.jsonl"
    bad.write_text('{"question": \n')
    subs = {"MISSING": str(tmp_path / "missing"), "BAD": str(bad)}

    def sub(text):
        for name, value in subs.items():
            text = text.replace(name, value)
        return text

    p = _inspect_cli(tmp_path, "opct/sycophancy", "--model", "opct/local", *map(sub, args))
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1, out[-2000:]
    assert f"opct: error: {sub(needle)}" in out, out[-2000:]
    assert "Traceback" not in out, out[-2000:]


def test_from_the_shell_a_prefill_task_on_a_closing_provider_is_refused_before_it_runs(tmp_path):
    """Under `inspect eval` the model is known when the task is made: the refusal is then one line and exit status 1,
    before any sample runs (a Task built in Python first is refused by its solver, as above)."""
    p = _inspect_cli(tmp_path, "opct/prefill", "-T", "n=1", "--model", "mockllm/model")
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1, out[-2000:]
    assert "opct: error: this task's prompts end inside the assistant's turn" in out, out[-2000:]
    assert "(MockLLM" in out and "--model opct/local" in out and "Traceback" not in out, out[-2000:]
    assert not list((tmp_path / "logs").glob("*.eval"))  # nothing ran


@pytest.mark.parametrize("args,needle", [
    (["-T", "n=0", "-M", f"model_path={MODEL}"], "opct task argument n: must be an integer >= 1 (got 0)"),
    (["-M", f"model_path={MODEL}", "-M", "batch_size=0"], "opct model argument batch_size: must be an integer >= 1"),
    (["-M", "model_path=/nonexistent/model"], "/nonexistent/model: not a model directory"),
])
def test_under_display_none_the_error_is_still_one_line(tmp_path, args, needle):
    """`--display none` quiets inspect's own printing of an error; opct's is then written to stderr by opct itself:
    still one line, exit status 1, no traceback."""
    p = _inspect_cli(tmp_path, "opct/sycophancy", "--model", "opct/local", *args, display="none")
    assert p.returncode == 1, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert any(line.startswith(f"opct: error: {needle}") for line in lines), p.stderr[-2000:]
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-2000:]


def test_clear_errors_turns_what_the_user_can_fix_into_one_error_and_leaves_bugs_alone(tmp_path):
    from opct.inspect._args import InspectInputError, clear_errors

    with pytest.raises(InspectInputError, match=f"^{tmp_path}/nope.jsonl: no such file or directory$"):
        with clear_errors():
            open(tmp_path / "nope.jsonl")
    with pytest.raises(InspectInputError, match="^bad value$"):
        with clear_errors():
            raise OpctError("bad value")
    with pytest.raises(ZeroDivisionError):  # a bug: its own exception, traceback and all
        with clear_errors():
            1 / 0


@pytest.mark.parametrize("config,messages,needle", [
    (GenerateConfig(top_k=5), None, "top_k is not supported"),
    (GenerateConfig(stop_seqs=["."]), None, "stop_seqs is not supported"),
    (GenerateConfig(num_choices=2), None, "num_choices must be 1"),
    (GenerateConfig(), [ChatMessageAssistant(content="Sure.")], "must have a user message right before it"),
    (GenerateConfig(max_tokens=600), None, "exceeds the context"),
])
def test_generation_options_it_cannot_honour_are_refused(config, messages, needle):
    model = get_model("opct/local", model_path=MODEL, memoize=False)
    with pytest.raises(OpctError, match=needle):
        _ask(model, [messages or [ChatMessageUser(content="Hello.")]], config)


def test_the_provider_is_found_by_name_through_the_entry_point(tmp_path):
    """In a fresh process outside the checkout, `opct/local` resolves to opct's provider (inspect loads the entry
    point when it does not know the provider)."""
    code = ("from inspect_ai.model import get_model\n"
            f"m = get_model('opct/local', model_path={MODEL!r})\n"
            "print(type(m.api).__name__, m.api.continues_prefill)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": checkout.pythonpath()})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["OpctAPI", "True"]


def test_opct_eval_seed_per_prompt_and_inspect_eval_give_the_same_completions_and_metrics(tmp_path):
    """The same axis two ways, as a user cross-checks them: `opct eval --suite sycophancy --seed-per-prompt` and
    `inspect eval opct/sycophancy --model opct/local` draw each prompt from the same seed (`prompt_seed`), so they
    sample the same completions prompt by prompt (in batches of 64 and of 1) and report the same metrics."""
    out = tmp_path / "eval"
    assert main_cli(["eval", "--model", MODEL, "--suite", "sycophancy", "--n", "4", "--seed-per-prompt",
                     "--out", str(out), "--no-progress"]) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    p = _inspect_cli(tmp_path, "opct/sycophancy", "--model", "opct/local", "-M", f"model_path={MODEL}",
                     "-T", "n=4", "-T", "seed=0", display="none")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    from inspect_ai.log import list_eval_logs, read_eval_log

    log = read_eval_log(list_eval_logs(str(tmp_path / "logs"))[0])

    def by_prompt(pairs):
        out = {}
        for prompt, completion in pairs:
            out.setdefault(json.dumps(prompt, sort_keys=True), []).append(completion)
        return {k: sorted(v) for k, v in out.items()}

    ours = by_prompt((r["prompt"], r["response"]) for r in records)
    theirs = by_prompt((s.metadata["probe"]["prompt"], s.output.completion) for s in log.samples)
    assert len(records) == len(log.samples) > 0 and ours == theirs
    metrics = json.loads((out / "metrics.json").read_text())
    compared = 0
    for name, m in log.results.scores[0].metrics.items():
        base, _, end = name.rpartition(" ")
        key, field = (base, {"lo": "ci_low", "hi": "ci_high"}[end]) if end in ("lo", "hi") else (name, "value")
        if key in metrics and metrics[key][field] is not None:
            assert m.value == pytest.approx(metrics[key][field], abs=1e-9), name
            compared += 1
    assert compared >= 10


def test_the_provider_leaves_the_callers_thread_count():
    """A small model samples on one thread, but only while it samples: the process that hosts the provider (inspect,
    a notebook) keeps its own intra-op thread count (it used to be set to 1 for good when the model loaded)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = get_model("opct/local", model_path=MODEL, memoize=False)
        assert torch.get_num_threads() == 2
        assert _ask(model, [[ChatMessageUser(content="Who are you?")]], GenerateConfig(max_tokens=4))[0].completion
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_inspects_model_info_lookup_makes_no_error_and_loads_nothing(capfd, monkeypatch):
    """After each model call inspect (0.3.285) makes `opct/local` again without the -M arguments, to look up the
    model's info for its usage display. That is not the user's mistake: it used to print `opct: error: opct model: no
    model directory` after an eval that went well under `--display none` (exit status 0)."""
    import rich
    from inspect_ai.model._model_info import get_model_info

    import opct.policy

    monkeypatch.setattr(opct.policy, "load_policy", lambda *a, **k: pytest.fail("a lookup loaded a model"))
    monkeypatch.setattr(rich.get_console(), "quiet", True)  # as `--display none` leaves it
    assert get_model_info("opct/local") is None  # no info: the lookup's answer for an unknown model
    assert "opct: error" not in capfd.readouterr().err


def test_a_prompt_that_does_not_fit_the_context_is_refused_when_the_task_is_built(tmp_path):
    """`-T max_tokens=100000` (or an items file with a prompt longer than the context) under `opct/local`: refused
    with one line naming the sample, before anything is asked. Until 2026-12-06 the provider found it at the first
    request: a traceback, "Task interrupted", exit status 0."""
    p = _inspect_cli(tmp_path, "opct/conditional", "--model", "opct/local", "-M", f"model_path={MODEL}", "-T", "n=1",
                     "-T", "max_tokens=100000")
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1, out[-2000:]
    assert "opct: error: sample " in out and "with max_new_tokens=100000 it exceeds the context" in out, out[-2000:]
    assert "Traceback" not in out and not list((tmp_path / "logs").glob("*.eval"))  # nothing ran
    p = _inspect_cli(tmp_path, "opct/conditional", "--model", "opct/local", "-M", f"model_path={MODEL}", "-T", "n=1",
                     "-T", "max_tokens=4")
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]


def test_an_adapter_with_weights_that_are_not_finite_is_one_line_before_any_sample(tmp_path):
    """A diverged adapter (NaN in a LoRA weight) under `inspect eval --model opct/local`: until 2026-12-06 every sample
    failed with inspect's traceback and the eval exited 0; now the model is refused when it is loaded."""
    from safetensors.torch import load_file, save_file

    adapter = Path(_adapter(tmp_path))
    weights = load_file(adapter / "adapter_model.safetensors")
    weights[next(k for k in sorted(weights) if "lora_A" in k)][0, 0] = float("nan")
    save_file(weights, adapter / "adapter_model.safetensors")
    p = _inspect_cli(tmp_path, "opct/sycophancy", "-T", "n=1", "--model", "opct/local", "-M", f"model_path={MODEL}",
                     "-M", f"adapter={adapter}")
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1, out[-2000:]
    assert f"opct: error: {adapter}: weight " in out and "lora_A" in out and "holds NaN" in out, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
