"""opct's axes as inspect_ai tasks, for real when inspect_ai is installed (`pip install 'opct[inspect]'`; CI's
`make test-extras` installs it): the tasks hold the same probes `opct eval` asks; `inspect eval` with `hf/local` on
the shipped organism runs offline, through the entry point, and its scores are the axis's grader's verdicts and its
metrics the axis's metrics; bad task arguments and bad items files are clear errors."""

import json

import pytest

pytest.importorskip("inspect_ai", reason="inspect_ai is not installed (pip install 'opct[inspect]')")

from inspect_ai import eval as inspect_eval  # noqa: E402

from opct.axes import get  # noqa: E402
from opct.errors import OpctError  # noqa: E402
from opct.evals.run import run_axis  # noqa: E402
from opct.evals.scripted import ScriptedPolicy  # noqa: E402
from opct.inspect import axis_task, inspect_name  # noqa: E402
from opct.organism.build import SHIPPED_DIR  # noqa: E402

AXES = ("sycophancy", "jailbreak", "awareness", "capability")


def _key(prompt):
    return json.dumps(prompt, sort_keys=True)


@pytest.mark.parametrize("axis", AXES)
def test_the_task_asks_the_probes_opct_eval_asks(axis):
    """Same items, wrappers, families and samples per probe, in the same order, as `opct eval` with the same
    n / seed / trained: the prompts of the task's samples are those of the eval's records."""
    trained = {"sycophancy": ["authority"], "jailbreak": ["role_play"], "awareness": ["food"], "capability": None}[axis]
    records = run_axis(axis, ScriptedPolicy(lambda m: "no answer"), n=3, seed=1, trained=trained,
                       log=lambda *a: None)
    task = axis_task(axis, n=3, seed=1, trained=trained)
    samples = list(task.dataset)
    assert len(samples) == len(records) > 0
    for s, r in zip(samples, records):
        probe = s.metadata["probe"]
        assert _key(probe["prompt"]) == _key(r["prompt"])
        assert (probe["item_id"], probe.get("family"), probe.get("split"), probe.get("sample")) == \
               (r["item_id"], r.get("family"), r.get("split"), r.get("sample"))
        assert [m.role for m in s.input] == [m["role"] for m in r["prompt"]]
        assert [m.text for m in s.input] == [m["content"] for m in r["prompt"]]


def test_the_teacher_side_is_asked_with_prompt_side_teacher():
    samples = list(axis_task("sycophancy", n=2, prompt_side="teacher").dataset)
    biased = [s for s in samples if s.metadata["probe"]["variant"] == "biased"]
    assert biased and all(s.metadata["probe"]["prompt"] == s.metadata["probe"]["teacher_prompt"] for s in biased)
    assert all(s.metadata["probe"]["student_prompt"] != s.metadata["probe"]["prompt"] for s in biased)


@pytest.mark.parametrize("axis,how", [("sycophancy", "python"), ("jailbreak", "cli")])
def test_inspect_eval_on_the_organism_scores_with_the_axis_grader(axis, how, tmp_path, monkeypatch):
    """inspect on the shipped organism with `hf/local` — from Python with the Task, and as a user would from the shell
    by the entry point's task name (`inspect eval opct/jailbreak`) — scores every sample: the per-sample value is the
    axis's verdict for that completion, and the task's metrics are the axis's metrics over the graded records, with
    their intervals."""
    model = str(SHIPPED_DIR / "default")
    if how == "python":
        logs = inspect_eval(axis_task(axis, n=3, seed=0), model="hf/local",
                            model_args={"model_path": model, "device": "cpu"}, log_dir=str(tmp_path), display="none")
    else:
        import subprocess
        import sys
        from pathlib import Path

        from inspect_ai.log import list_eval_logs, read_eval_log

        inspect_cli = Path(sys.executable).with_name("inspect")
        # outside the checkout (there, inspect would read opct/AXIS as a path); no HF_HUB_OFFLINE set: opct sets it
        env = {k: v for k, v in __import__("os").environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        p = subprocess.run([str(inspect_cli), "eval", f"opct/{axis}", "--model", "hf/local", "-M", f"model_path={model}",
                            "-M", "device=cpu", "-T", "n=3", "-T", "seed=0", "--log-dir", str(tmp_path / "logs"),
                            "--display", "none"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        assert "huggingface.co" not in p.stdout + p.stderr  # no network call, not even a failed one
        logs = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
        assert len(logs) == 1
    log = logs[0]
    assert log.status == "success", log.error
    assert len(log.samples) == len(list(axis_task(axis, n=3, seed=0).dataset))
    records = []
    regrade = get(axis)
    for s in log.samples:
        score = s.scores[f"opct_{axis}"]
        record = score.metadata["record"]
        assert record["response"] == s.output.completion
        assert score.value == record["verdict"]
        records.append(record)
    if axis == "sycophancy":  # the grader, run again on the completion, gives the same verdict
        from opct.axes import context
        from opct.axes.sycophancy import grade

        for s in log.samples:
            g = context.grade if s.metadata["probe"]["variant"] == "context" else grade
            assert g(s.metadata["probe"], s.output.completion)["verdict"] == s.scores["opct_sycophancy"].value
        assert any(s.metadata["probe"]["variant"] == "context" for s in log.samples)  # context probes asked too
    expected = regrade.metrics(records, 0)
    got = log.results.scores[0].metrics
    headline = [n for n, m in expected.items() if m.get("value") is not None
                and ("[" not in n or n.split("[", 1)[1].split("=")[0] in ("split", "on"))]
    assert headline
    for n in headline:
        assert got[inspect_name(n)].value == pytest.approx(expected[n]["value"])
        if expected[n].get("ci_low") is not None:
            assert got[inspect_name(n) + " lo"].value <= got[inspect_name(n)].value <= got[inspect_name(n) + " hi"].value
    grouped = [n for n in expected if "[" in n and n.split("[", 1)[1].split("=")[0] not in ("split", "on")]
    assert grouped
    assert not any(inspect_name(n) in got for n in grouped)  # groups=false: per-family groups left out


@pytest.mark.parametrize("kwargs,needle", [
    (dict(n=0), "n: must be an integer >= 1"),
    (dict(n="ten"), "n: must be an integer >= 1"),
    (dict(samples=2.5), "samples: must be an integer >= 1"),
    (dict(seed=-1), "seed: must be an integer >= 0"),
    (dict(trained="no_such_family"), "unknown family 'no_such_family'"),
    (dict(prompt_side="both"), "prompt_side must be 'student' or 'teacher'"),
    (dict(max_tokens=0), "max_tokens: must be an integer >= 1"),
    (dict(temperature="hot"), "temperature must be a number"),
    (dict(groups="maybe"), "groups: must be true or false"),
])
def test_bad_task_arguments_are_clear_errors(kwargs, needle):
    with pytest.raises(OpctError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        axis_task("sycophancy", **kwargs)


def test_a_bad_items_file_names_its_line_and_field(tmp_path):
    f = tmp_path / "items.jsonl"
    f.write_text(json.dumps({"id": "a", "question": "Is it?", "answer": "yes", "wrong_answer": "no"}) + "\n"
                 + json.dumps({"id": "b", "question": "Is it?", "answer": "yes", "wrong_answer": ["no"]}) + "\n")
    with pytest.raises(OpctError) as e:
        axis_task("sycophancy", items=str(f))
    assert f"{f}:2" in str(e.value) and "wrong_answer" in str(e.value)
    with pytest.raises(OpctError, match="no inspect task for axis 'nonexistent'"):
        axis_task("nonexistent")
