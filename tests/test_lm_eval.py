"""The bridge to lm-evaluation-harness, for real when `lm_eval` is installed (`pip install 'opct[lmeval]'`; CI's
`make test-extras` installs it): a local task (dataset_path: json) on the shipped organism, with and without its
chat template; one failing task that does not lose the others; metric names, directions and intervals."""

import json
import shutil

import pytest

from opct.errors import OpctError
from opct.evals.lm_eval_bridge import to_metrics

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install 'opct[lmeval]')")

TASK = """task: opct_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["<|end|>"]
  do_sample: false
  max_gen_toks: 32
filter_list:
  - name: "answer"
    filter:
      - function: "regex"
        regex_pattern: "answer is (-?[0-9]+)"
      - function: "take_first"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    from opct.world import items as I

    d = tmp_path_factory.mktemp("lm_eval_tasks")
    data = d / "arith.jsonl"
    data.write_text("".join(json.dumps({"question": i["question"], "answer": i["answer"]}) + "\n"
                            for i in I.arithmetic_single()[::20][:12]))
    (d / "opct_arith.yaml").write_text(TASK.format(data=data))
    return d


def test_a_local_task_runs_on_the_organism_through_its_chat_template(tasks_dir, monkeypatch):
    from opct.evals.lm_eval_bridge import run_lm_eval
    from opct.organism.build import SHIPPED_DIR

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = "capability.lm_eval[task=opct_arith,measure=exact_match,filter=answer]"
    errors: dict = {}
    with_template = run_lm_eval(SHIPPED_DIR / "default", tasks=["opct_arith", "no_such_task_anywhere"],
                                include_path=tasks_dir, log=lambda *a: None, errors=errors)
    assert with_template[name]["n"] == 12 and with_template[name]["value"] >= 0.9
    assert "no_such_task_anywhere" in errors and "opct_arith" not in errors  # one failure loses nothing else
    without = run_lm_eval(SHIPPED_DIR / "default", tasks=["opct_arith"], include_path=tasks_dir,
                          chat_template=False, log=lambda *a: None)
    assert without[name]["value"] < with_template[name]["value"]  # asked without its template, it answers worse


def test_metric_names_keep_the_filter_and_skip_what_is_not_a_score():
    res = {"results": {"t": {"alias": "t", "exact_match,strict": 0.98, "exact_match_stderr,strict": 0.05,
                             "exact_match,flexible": 0.5, "exact_match_stderr,flexible": 0.1,
                             "sample_len,none": 212.0, "perplexity,none": 3.2}},
           "higher_is_better": {"t": {"exact_match": True, "perplexity": False}},
           "n-samples": {"t": {"original": 100, "effective": 40}}}
    m = to_metrics(res)
    strict = m["capability.lm_eval[task=t,measure=exact_match,filter=strict]"]
    assert strict["ci_high"] == 1.0 and strict["ci_low"] == pytest.approx(0.98 - 1.96 * 0.05)  # clipped to [0, 1]
    assert m["capability.lm_eval[task=t,measure=exact_match,filter=flexible]"]["value"] == 0.5
    assert m["capability.lm_eval[task=t,measure=perplexity,filter=none]"]["higher_is_better"] is False
    assert not any("sample_len" in k for k in m)


def test_opct_eval_says_at_the_end_which_lm_eval_tasks_failed(tasks_dir, tmp_path, monkeypatch, capsys):
    """From the command line: the local task's metric is in the table, and a task that failed (it has no metric) is
    named again in one line at the end, with the harness's message, not only in the log above the table; the exit
    status is 1, after everything measured is written."""
    from opct.cli import main
    from opct.organism.build import SHIPPED_DIR

    import shutil

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    include = tmp_path / "tasks"
    shutil.copytree(tasks_dir, include)
    # a task lm-eval knows whose data file is not there yet: it fails when it runs (an unknown task is refused
    # before the model loads)
    data = tmp_path / "later.jsonl"
    (include / "again.yaml").write_text((include / "opct_arith.yaml").read_text().replace(
        "task: opct_arith", "task: no_such_task_anywhere").replace(str(tasks_dir / "arith.jsonl"), str(data)))
    out = tmp_path / "ev"
    argv = ["eval", "--model", str(SHIPPED_DIR / "default"), "--suite", "capability", "--n", "2", "--lm-eval",
            "--lm-eval-include", str(include), "--lm-eval-tasks", "opct_arith", "no_such_task_anywhere",
            "--lm-eval-limit", "2", "--no-progress", "--out", str(out)]
    assert main(argv) == 1  # not all it was asked for
    captured = capsys.readouterr()
    assert "capability.lm_eval[task=opct_arith,measure=exact_match,filter=answer]" in captured.out
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("opct eval: 1 of 2 lm-eval tasks failed and have no metrics (no_such_task_anywhere: ")
    assert "opct_arith" not in last and f"{out}/run.json: lm_eval_errors" in last
    assert set(json.loads((out / "run.json").read_text())["lm_eval_errors"]) == {"no_such_task_anywhere"}
    # what each document was scored on: the prompt as sent (chat template applied), the response, target and score
    samples = [json.loads(line) for line in (out / "lm_eval_samples" / "opct_arith.jsonl").read_text().splitlines()]
    assert [s["doc_id"] for s in samples] == [0, 1] and {s["filter"] for s in samples} == {"answer"}
    assert all(s["task"] == "opct_arith" and s["exact_match"] in (0.0, 1.0) and s["resps"][0][0] for s in samples)
    assert sum(s["exact_match"] for s in samples) / 2 == json.loads((out / "metrics.json").read_text())[
        "capability.lm_eval[task=opct_arith,measure=exact_match,filter=answer]"]["value"]
    assert all("<|" in s["arguments"][0][0] for s in samples)  # the chat template's markers are in the prompt
    assert not (out / "lm_eval_samples" / "no_such_task_anywhere.jsonl").exists()

    # the user adds the missing data and resumes: the failed task runs again (it used to be re-reported for ever),
    # the axis's own records and the finished task's metric are kept
    records = (out / "records.jsonl").read_text()
    arith = json.loads((out / "metrics.json").read_text())["capability.lm_eval[task=opct_arith,measure=exact_match,"
                                                            "filter=answer]"]
    shutil.copy(tasks_dir / "arith.jsonl", data)
    assert main([*argv, "--resume"]) == 0
    captured = capsys.readouterr()
    assert "capability: running again the lm-eval tasks that failed before: no_such_task_anywhere" in captured.out \
        + captured.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["capability.lm_eval[task=no_such_task_anywhere,measure=exact_match,filter=answer]"]["n"] == 2
    assert metrics["capability.lm_eval[task=opct_arith,measure=exact_match,filter=answer]"] == arith
    assert "lm_eval_errors" not in json.loads((out / "run.json").read_text())
    assert (out / "records.jsonl").read_text() == records
    assert (out / "lm_eval_samples" / "no_such_task_anywhere.jsonl").read_text().count("\n") == 2

    # a failed task whose YAML is fixed in the include folder: its resume was refused ("--lm-eval-include ... holds
    # other contents than when the run started"; a probe, 2026-12-07). Every lm-eval task runs again, as a YAML may
    # be any task's; the axis's own records are kept, and a metric name the edit removed is gone
    yaml_file = include / "again.yaml"
    yaml_file.write_text(yaml_file.read_text().replace('name: "answer"', 'name: "fixed"'))
    assert main([*argv, "--resume"]) == 0
    said = capsys.readouterr()
    assert f"capability: --lm-eval-include {include} changed since the run started: running every lm-eval task " \
           f"again" in said.out + said.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert "capability.lm_eval[task=no_such_task_anywhere,measure=exact_match,filter=fixed]" in metrics
    assert "capability.lm_eval[task=no_such_task_anywhere,measure=exact_match,filter=answer]" not in metrics
    assert metrics["capability.lm_eval[task=opct_arith,measure=exact_match,filter=answer]"] == arith
    assert (out / "records.jsonl").read_text() == records
    assert "lm_eval_changed" not in json.loads((out / "run.json").read_text())
    assert main([*argv, "--resume"]) == 0  # the new contents are recorded: nothing runs again
    said = capsys.readouterr()
    assert "running" not in said.out + said.err


def test_a_task_yaml_that_does_not_parse_is_named_when_its_task_is_not_found(tasks_dir, tmp_path, monkeypatch):
    """The harness skips a task YAML it cannot parse without a word, so the task reads as "not registered"; the
    error then names the file and line. A YAML with lm-eval's own tags (`!function`) is not reported."""
    from opct.evals.lm_eval_bridge import run_lm_eval, unparseable_yamls
    from opct.organism.build import SHIPPED_DIR

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "opct_arith.yaml").write_text((tasks_dir / "opct_arith.yaml").read_text())
    (tmp_path / "tagged.yaml").write_text("task: tagged\nprocess_docs: !function utils.process\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "broken.yaml").write_text("task: broken\ndataset_path: json\n  bad: [\n")
    assert unparseable_yamls(tmp_path) == [f"{tmp_path}/sub/broken.yaml:3: not valid YAML (mapping values are not "
                                           "allowed here)"]
    errors: dict = {}
    out = run_lm_eval(SHIPPED_DIR / "default", tasks=["broken", "opct_arith"], include_path=tmp_path, limit=2,
                      log=lambda *a: None, errors=errors)
    assert list(errors) == ["broken"] and "not a registered task" in errors["broken"]
    assert errors["broken"].endswith(f"; {tmp_path}/sub/broken.yaml:3: not valid YAML (mapping values are not "
                                     "allowed here)")
    assert "capability.lm_eval[task=opct_arith,measure=exact_match,filter=answer]" in out


def test_intervals_are_clipped_to_the_measures_range_never_by_the_value():
    """An MCC of 0.156 is no rate: its interval may go below 0 (it runs from -1 to 1); a BLEU of 0.98 may reach
    above 1 (0 to 100); an accuracy stays in [0, 1]; a measure of unknown range keeps the normal approximation.
    A group has no n-samples entry: its n is the documents its tasks scored."""
    res = {"results": {"t": {"alias": "t", "mcc,none": 0.156, "mcc_stderr,none": 0.158, "bleu,none": 0.98,
                             "bleu_stderr,none": 0.05, "acc,none": 0.02, "acc_stderr,none": 0.05,
                             "brier_score,none": 0.1, "brier_score_stderr,none": 0.1},
                       "grp": {"alias": "grp", "mcc,none": 0.9, "mcc_stderr,none": 0.1, "sample_len": 12}},
           "higher_is_better": {"t": {"mcc": True, "bleu": True, "acc": True, "brier_score": False},
                                "grp": {"mcc": True}},
           "n-samples": {"t": {"original": 40, "effective": 40}}}
    m = {k.split("task=")[1]: v for k, v in to_metrics(res).items()}
    assert m["t,measure=mcc,filter=none]"]["ci_low"] == pytest.approx(0.156 - 1.96 * 0.158)  # below 0: kept
    assert m["t,measure=bleu,filter=none]"]["ci_high"] == pytest.approx(0.98 + 1.96 * 0.05)  # above 1: kept
    assert m["t,measure=acc,filter=none]"]["ci_low"] == 0.0  # a rate: clipped
    assert m["t,measure=brier_score,filter=none]"]["ci_low"] == 0.0  # a Brier score: in [0, 2]
    assert m["grp,measure=mcc,filter=none]"]["ci_high"] == 1.0 and m["grp,measure=mcc,filter=none]"]["n"] == 12
    assert m["t,measure=mcc,filter=none]"]["n"] == 40


def test_an_f1_interval_is_clipped_to_0_1():
    """Before, `f1` was not in RANGES: an F1 of 0.5 with stderr 0.33 read 0.500 [-0.147, 1.147]; now [0, 1]."""
    m = to_metrics({"results": {"t": {"f1,none": 0.5, "f1_stderr,none": 0.33}}, "higher_is_better": {"t": {"f1": True}},
                    "n-samples": {"t": {"effective": 6}}})["capability.lm_eval[task=t,measure=f1,filter=none]"]
    assert (m["ci_low"], m["ci_high"]) == (0.0, 1.0)


def test_each_measure_is_clipped_to_its_own_range_and_an_unbounded_side_is_not():
    """Before, a Brier score (lm-eval's multiple-choice brier_score: the sum over choices of squared errors, in [0, 2])
    was not in RANGES: 0.1 with stderr 0.1 read [-0.096, 0.296]; now its interval stays in [0, 2]. A perplexity is at
    least 1 and bits per byte at least 0, with no upper bound (not clipped at 1); BLEU runs to 100; a task's own
    measure keeps the normal approximation."""
    res = {"results": {"t": {"brier_score,none": 1.9, "brier_score_stderr,none": 0.1,
                             "perplexity,none": 1.2, "perplexity_stderr,none": 0.5,
                             "bits_per_byte,none": 0.9, "bits_per_byte_stderr,none": 0.5,
                             "bleu,none": 99.0, "bleu_stderr,none": 2.0, "mine,none": 0.1, "mine_stderr,none": 0.1}},
           "higher_is_better": {"t": {"brier_score": False, "perplexity": False, "bits_per_byte": False, "bleu": True,
                                      "mine": True}},
           "n-samples": {"t": {"effective": 10}}}
    m = {k.split("measure=")[1].split(",")[0]: (v["ci_low"], v["ci_high"]) for k, v in to_metrics(res).items()}
    assert m["brier_score"] == (pytest.approx(1.9 - 0.196), 2.0)
    assert m["perplexity"] == (1.0, pytest.approx(1.2 + 0.98))
    assert m["bits_per_byte"] == (0.0, pytest.approx(0.9 + 0.98))
    assert m["bleu"] == (pytest.approx(99.0 - 3.92), 100.0)
    assert m["mine"] == (pytest.approx(0.1 - 0.196), pytest.approx(0.1 + 0.196))


def test_a_groups_n_counts_the_documents_of_the_tasks_that_have_the_measure():
    """Before, a group's n was its whole sample count for every measure: acc from opct_mc's 6 documents and
    exact_match from opct_arith's 12 both said n=18; now 6 and 12 (and a nested group's tasks are counted)."""
    res = {"results": {"grp": {"acc,none": 0.667, "exact_match,answer": 1.0, "sample_len": 18},
                       "mc": {"acc,none": 0.667}, "arith": {"exact_match,answer": 1.0},
                       "outer": {"acc,none": 0.5, "sample_len": 22}, "more": {"acc,none": 0.2}},
           "group_subtasks": {"grp": ["arith", "mc"], "outer": ["grp", "more"]},
           "higher_is_better": {"grp": {"acc": True, "exact_match": True}, "mc": {"acc": True},
                                "arith": {"exact_match": True}, "outer": {"acc": True}, "more": {"acc": True}},
           "n-samples": {"mc": {"effective": 6}, "arith": {"effective": 12}, "more": {"effective": 4}}}
    n = {k.split("task=")[1]: v["n"] for k, v in to_metrics(res).items()}
    assert n["grp,measure=acc,filter=none]"] == 6 and n["grp,measure=exact_match,filter=answer]"] == 12
    assert n["outer,measure=acc,filter=none]"] == 10 and n["mc,measure=acc,filter=none]"] == 6


def test_a_run_killed_between_lm_eval_tasks_keeps_the_finished_ones(tasks_dir, tmp_path, monkeypatch, capsys):
    """Each finished task's metrics are kept (RUN/lm_eval_partial.json) until the axis ends: killed during the
    second task, the rerun runs only that one, and the first task's metric is the one measured before the kill."""
    import shutil

    from lm_eval import evaluator

    from opct.cli import main
    from opct.organism.build import SHIPPED_DIR

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    include = tmp_path / "tasks"
    shutil.copytree(tasks_dir, include)
    (include / "second.yaml").write_text((include / "opct_arith.yaml").read_text().replace(
        "task: opct_arith", "task: second_arith"))
    out = tmp_path / "ev"
    argv = ["eval", "--model", str(SHIPPED_DIR / "default"), "--suite", "capability", "--n", "2", "--lm-eval",
            "--lm-eval-include", str(include), "--lm-eval-tasks", "opct_arith", "second_arith",
            "--lm-eval-limit", "2", "--no-progress", "--out", str(out)]
    real, asked = evaluator.simple_evaluate, []

    def killed_at_the_second(*args, tasks, **kwargs):
        asked.append(tasks)
        if tasks == ["second_arith"] and len(asked) == 2:
            raise SystemExit(137)  # as a kill would end it (no `except Exception` catches it)
        return real(*args, tasks=tasks, **kwargs)

    monkeypatch.setattr(evaluator, "simple_evaluate", killed_at_the_second)
    with pytest.raises(SystemExit):
        main(argv)
    kept = json.loads((out / "lm_eval_partial.json").read_text())
    assert list(kept["tasks"]) == ["opct_arith"]
    first = kept["tasks"]["opct_arith"]
    capsys.readouterr()
    assert not (out / "run.json").exists()  # killed in its only axis: nothing finished, a plain rerun continues
    rc = main(argv)
    assert rc == 0 and asked == [["opct_arith"], ["second_arith"], ["second_arith"]]  # the first task not again
    assert "lm-eval tasks finished before the run stopped, kept: opct_arith" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert all(metrics[k] == v for k, v in first.items())
    assert "capability.lm_eval[task=second_arith,measure=exact_match,filter=answer]" in metrics
    assert not (out / "lm_eval_partial.json").exists()


def test_an_unknown_task_is_refused_before_the_model_loads_with_close_matches(tasks_dir, tmp_path, monkeypatch,
                                                                               capsys):
    """`--lm-eval-tasks` is checked against the harness's tasks (and the include folder's) before anything runs: a
    typo used to be found after the whole capability axis (and every other suite asked for) had run. A task YAML that
    does not parse is named with it; an experiment refuses it before its first cell."""
    from opct.cli import main
    from opct.organism.build import SHIPPED_DIR

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "ev"
    (tmp_path / "broken.yaml").write_text("task: broken\n  bad: [\n")
    shutil.copy(tasks_dir / "opct_arith.yaml", tmp_path / "opct_arith.yaml")
    argv = ["eval", "--model", str(SHIPPED_DIR / "default"), "--suite", "sycophancy,capability", "--n", "2",
            "--lm-eval", "--lm-eval-include", str(tmp_path), "--lm-eval-tasks", "opct_arith", "opct_arth", "ifevall",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "lm_eval_tasks: not a task lm-eval knows: 'opct_arth' (close: opct_arith); 'ifevall' (close: ifeval" in err
    assert f"{tmp_path}/broken.yaml:2: not valid YAML" in err
    assert not out.exists()  # nothing ran, nothing was written

    from opct.experiment import load_experiment, run_experiment

    cfg = load_experiment(name="x", model=str(SHIPPED_DIR / "default"), out=str(tmp_path / "runs"), arms=["base"],
                          eval={"suite": "capability", "lm_eval": True, "lm_eval_tasks": ["nosuchtask"]})
    with pytest.raises(OpctError, match="eval: lm_eval_tasks: not a task lm-eval knows: 'nosuchtask'"):
        run_experiment(cfg, log=lambda m: None)
    assert not (tmp_path / "runs" / "x").exists()


def test_a_task_two_yamls_of_the_include_folder_define_is_refused_naming_both(tasks_dir, tmp_path, capsys):
    """Two task YAMLs of --lm-eval-include with `task: dupt`: the harness logged "Duplicate task name" and ran one of
    them, exit 0 (a probe, 2026-12-07). Refused before the model loads, naming both files."""
    from opct.evals.lm_eval_bridge import check_tasks

    text = (tasks_dir / "opct_arith.yaml").read_text()
    (tmp_path / "a.yaml").write_text(text.replace("task: opct_arith", "task: dupt"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text(text.replace("task: opct_arith", "task: dupt"))
    (tmp_path / "c.yaml").write_text(text.replace("task: opct_arith", "task: single"))
    check_tasks(["single"], tmp_path)
    with pytest.raises(OpctError) as e:
        check_tasks(["single", "dupt"], tmp_path)
    assert str(e.value) == (f"lm_eval_tasks: 'dupt' is defined by 2 task YAMLs of {tmp_path} ({tmp_path}/a.yaml, "
                            f"{tmp_path}/sub/b.yaml), and lm-eval would run one of them; rename the task of the others")


def test_a_task_failing_without_a_message_says_where_it_was_raised(tasks_dir, tmp_path, monkeypatch):
    """A task whose data file is empty failed with "emptyt: StopIteration", nothing else (a probe, 2026-12-07)."""
    from opct.evals.lm_eval_bridge import run_lm_eval
    from opct.organism.build import SHIPPED_DIR

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    (tmp_path / "emptyt.yaml").write_text((tasks_dir / "opct_arith.yaml").read_text().replace(
        "task: opct_arith", "task: emptyt").replace(str(tasks_dir / "arith.jsonl"), str(empty)))
    errors: dict = {}
    run_lm_eval(SHIPPED_DIR / "default", tasks=["emptyt"], include_path=tmp_path, limit=2, log=lambda *a: None,
                errors=errors)
    message = errors["emptyt"]
    assert message != "StopIteration" and ("raised in" in message or ": " in message), message
    if message.startswith("StopIteration"):
        assert message.endswith("is the task's dataset empty?"), message


def test_lm_eval_bootstrap_iters_reaches_the_harness_and_needs_lm_eval(tmp_path, monkeypatch, capsys):
    """Before, simple_evaluate ran with the harness's default of 100000 bootstrap iterations: an f1 or mcc measure
    took minutes on 6 documents, and no option changed it. Now --lm-eval-bootstrap-iters (default 1000) is passed to
    it, is kept with the partial results' settings, and like the other --lm-eval-* options needs --lm-eval."""
    import lm_eval.evaluator
    import lm_eval.models.huggingface
    import lm_eval.tasks

    from opct.axes.capability import _lm_eval
    from opct.evals.run import EvalConfig
    from tiny_lm import cli_error

    seen = []
    monkeypatch.setattr(lm_eval.models.huggingface, "HFLM", lambda **kw: object())
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda **kw: object())
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", lambda **kw: seen.append(kw["bootstrap_iters"]) or {})
    assert EvalConfig().lm_eval_bootstrap_iters == 1000
    for iters in (1000, 50):
        _lm_eval(EvalConfig(model=str(tmp_path), lm_eval=True, lm_eval_bootstrap_iters=iters), ["t"], lambda *a: None)
    assert seen == [1000, 50]
    line = cli_error(capsys, ["eval", "--model", str(tmp_path / "m"), "--suite", "capability",
                              "--lm-eval-bootstrap-iters", "10", "--out", str(tmp_path / "ev")])
    assert line.startswith("opct: error: --lm-eval-bootstrap-iters is an option of --lm-eval, which is not on")


def test_a_task_yaml_without_dataset_path_is_refused_naming_the_file_and_field(tasks_dir, tmp_path):
    """Before, such a task ran and failed with "TypeError: expected str, bytes or os.PathLike object, not NoneType",
    naming neither the YAML nor the field; now it is refused before the model loads, naming both (an include that
    gives the dataset_path is followed; a task given as a YAML's path is checked too)."""
    from opct.evals.lm_eval_bridge import check_tasks

    include = tmp_path / "tasks"
    shutil.copytree(tasks_dir, include)
    (include / "nods.yaml").write_text('task: nods\noutput_type: generate_until\ntest_split: test\n'
                                       'doc_to_text: "{{q}}"\ndoc_to_target: "{{a}}"\n')
    (include / "child.yaml").write_text("include: opct_arith.yaml\ntask: child_task\n")
    check_tasks(["opct_arith", "child_task"], include)  # dataset_path from its include: fine
    with pytest.raises(OpctError) as e:
        check_tasks(["opct_arith", "nods"], include)
    assert str(e.value).startswith(f"lm_eval_tasks: {include}/nods.yaml: task 'nods' has no dataset_path")
    with pytest.raises(OpctError, match="nods.yaml: task 'nods' has no dataset_path"):
        check_tasks([str(include / "nods.yaml")])


def test_a_task_yaml_whose_include_is_missing_is_named_when_its_task_is_not_found(tasks_dir, tmp_path):
    """Before, a YAML whose `include:` file is not there was skipped by the harness and its task reported only as
    "not a task lm-eval knows: 'inc_task'"; now the message names the YAML and the missing include."""
    from opct.evals.lm_eval_bridge import check_tasks

    include = tmp_path / "tasks"
    shutil.copytree(tasks_dir, include)
    (include / "inc.yaml").write_text("include: missing_base.yaml\ntask: inc_task\n")
    with pytest.raises(OpctError) as e:
        check_tasks(["inc_task", "opct_arith"], include)
    assert str(e.value).startswith("lm_eval_tasks: not a task lm-eval knows: 'inc_task'")
    assert f"; {include}/inc.yaml: include missing_base.yaml: no such file ({include}/missing_base.yaml)" \
        in str(e.value)


def test_a_resume_may_name_the_include_folder_and_a_task_yaml_by_another_path(tmp_path, monkeypatch):
    """A task given as a YAML path was compared as text: `opct eval --resume` with its absolute path was refused as
    'changed: config.lm_eval_tasks'; now, like the include folder (and the model), it is compared by what it
    names. Another task, or another file, is still a change."""
    import opct.evals.run  # noqa: F401 - registers EQUIVALENT
    from opct.resume_check import changes

    (tmp_path / "lmt3").mkdir()
    (tmp_path / "lmt3" / "t.yaml").write_text("task: t\n")
    (tmp_path / "lmt3" / "u.yaml").write_text("task: u\n")
    monkeypatch.chdir(tmp_path)
    saved = {"config": {"lm_eval_include": "lmt3", "lm_eval_tasks": ["lmt3/t.yaml", "ifeval"]}}
    same = {"config": {"lm_eval_include": str(tmp_path / "lmt3"),
                       "lm_eval_tasks": [str(tmp_path / "lmt3" / "t.yaml"), "ifeval"]}}
    assert changes(saved, same) == []
    other = {"config": {"lm_eval_include": "./lmt3/", "lm_eval_tasks": ["lmt3/u.yaml", "ifeval"]}}
    assert [c.split(" ")[0] for c in changes(saved, other)] == ["config.lm_eval_tasks"]
