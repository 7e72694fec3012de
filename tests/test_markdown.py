"""results.md never turns text from a file into markup: names, notes and failure messages that hold raw HTML, a
comment, an autolink, a link or an image render (CommonMark, markdown-it-py) as the same characters, in every report
that writes results.md (experiment, robustness, threats, audit)."""

import json

import pytest

from opct.report import markdown as md

markdown_it = pytest.importorskip("markdown_it")  # in the test extra

HOSTILE = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "<!-- hides the rest", "<http://evil.example>",
           "[click](javascript:alert(1))", "![pixel](http://evil.example/t.png)", "[ref]: http://evil.example",
           "a\\](b) and c\\\\](d)", "</div><iframe src=//x>", "<?php ?> <!DOCTYPE x>", "pipe | in | it",
           "two\nlines\r\nthree", "< 3 and <= 0.1 and [0.1, 0.2] stay as typed", "C:\\path\\x",
           "use `<b>` and `a|b` as typed", "``a`<b>`", "\\`a `<b>` x", "a`b <i>", "`<b>", "x\\`<b>`"]
MARKUP = {"html_inline", "html_block", "link_open", "image"}


def parse(text: str):
    return markdown_it.MarkdownIt("commonmark").enable("table").parse(text)


def markup(text: str) -> list[str]:
    out = []
    for t in parse(text):
        out += [t.type] if t.type in MARKUP else []
        out += [c.type for c in t.children or [] if c.type in MARKUP]
    return out


def shown(text: str) -> str:
    """What a viewer shows: the text of every inline token, joined."""
    def piece(c):
        return {"text": c.content, "code_inline": f"`{c.content}`"}.get(c.type, " ")

    return " ".join("".join(piece(c) for c in t.children or [] if c.type in ("text", "code_inline", "softbreak",
                                                                               "hardbreak"))
                    for t in parse(text) if t.type == "inline")


@pytest.mark.parametrize("s", HOSTILE)
def test_text_quote_table_and_lists_render_as_the_same_characters(s):
    one_line = " ".join(s.splitlines())
    for written in (md.text(s), "\n".join(md.facts([("key", s)])), "\n".join(md.quote(s)),
                    md.table(["name", s], [[s, "1"]]), "\n".join(md.left_out("Missing", "1 cell", [s]))):
        assert markup(written) == [], (s, written)
        assert one_line in shown(written) or s.strip() in shown(written), (s, written, shown(written))
    assert len([r for r in parse(md.table(["a", "b"], [[s, "1"]])) if r.type == "td_open"]) == 2  # no extra cell
    assert md.text("target <= 0.1, [0.1, 0.2]") == "target <= 0.1, [0.1, 0.2]"  # what a terminal shows, as typed


@pytest.mark.parametrize("key, value", [("`", "`<b>` x"), ("a `", "b` <i> `c`"), ("\\", "`<b>`")])
def test_two_pieces_on_one_line_make_no_code_span_that_reaches_over_the_escaping(key, value):
    """A backtick left in one piece (a key, a cell) and a code span in the next made a span of the renderer's own
    from the first to the second, after which the span's `<b>` (kept as typed) was raw HTML."""
    for written in ("\n".join(md.facts([(key, value)])), md.table(["k", "v"], [[key, value]])):
        assert markup(written) == [], written


def test_the_experiment_report_escapes_names_notes_and_failures(tmp_path):
    from test_report import BASE_METRICS, EXPERIMENT, make_run

    from opct.report.build import build_report

    bad = "<img src=x onerror=alert(1)> [x](javascript:alert(1))"
    run = make_run(tmp_path, dict(EXPERIMENT, name=bad, note=f"first line\n<script>x</script>\n{bad}",
                                  arms=["base", bad]), {("base", 0): BASE_METRICS, (bad, 0): BASE_METRICS})
    (run / "base" / "0" / "eval" / "run.json").write_text(json.dumps({"lm_eval_errors": {"t": f"failed {bad}"}}))
    text = build_report(run)[1].read_text()
    assert bad in text.replace("&lt;", "<").replace("\\]", "]") and markup(text) == []
    assert "<script>x</script>" in shown(text) and "first line" in shown(text)


def test_the_robustness_threats_and_audit_reports_escape_them(tmp_path):
    from test_audit import _cell_rows, _summary

    from opct.audit.render import markdown as audit_markdown
    from opct.robustness.report import build as robustness_report
    from opct.robustness.runner import write_aggregate
    from opct.threats.report import build as threats_report

    bad = "<iframe src=//evil> ![t](http://evil/t.png)"
    rob = tmp_path / "rob"
    (rob / "replay" / "seed0").mkdir(parents=True)
    (rob / "study.json").write_text(json.dumps({"name": bad, "note": bad, "seeds": [0, 1], "studies": {"replay": {}}}))
    (rob / "replay" / "seed0" / "rows.json").write_text(json.dumps({"seconds": 3.0, "rows": []}))
    write_aggregate(rob)
    thr = tmp_path / "thr"
    thr.mkdir()
    (thr / "cross_threat.json").write_text(json.dumps({
        "settings": {"name": bad, "note": bad, "model": bad, "seeds": [0], "threats": [bad], "methods": [bad]},
        "rows": [], "columns": [], "cells": [], "missing": [bad], "seconds": {bad: {"train": 1.0}}}))
    rows = _cell_rows("reward_hacking", "bct", [-0.2])
    rows[0][0]["failure"] = bad
    for text in (robustness_report(rob)[1].read_text(), threats_report(thr)[1].read_text(),
                 audit_markdown(_summary(tmp_path, [rows]))):
        assert markup(text) == [] and "<iframe src=//evil>" in shown(text), text


def test_random_text_never_becomes_markup_and_one_line_of_it_reads_as_typed():
    """3000 strings drawn from the characters that make Markdown markup, each as a heading's text, a key and value,
    a table's cells, a quote and a list item: no raw HTML, link or image; and a line without backticks (whose code
    spans are kept as typed) or block syntax at its start is shown as its very characters."""
    import random

    rng = random.Random(0)
    alphabet = list("<>`\\[]()!|:/ab &;-=?h#\n") + ["http://x", "<b>", "](", "`<i>`", "<!--", "&lt;", "&#60;",
                                                  "javascript:"]
    for _ in range(3000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        k = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
        for written in (md.text(s), md.table(["a", "b"], [[k, s]]), "\n".join(md.facts([(k, s)])),
                        "\n".join(md.quote(s)), "\n".join(md.left_out("Missing", "2", [s, k]))):
            assert markup(written) == [], (s, k, written)
        line = " ".join(s.split())
        if line and "`" not in line and line[0] not in "#=->":
            assert shown(md.text(line)) == line, (line, md.text(line))
