"""How long an inspect eval takes through opct's model provider at different `-M batch_size` (a script, not a test),
and whether the completions are the same at every batch size.

For each batch size it runs one opct task (default `opct/sycophancy`, `-T n=40`) on a model directory (default the
shipped organism) through `opct/local`, in this process, with inspect's display off, and prints the eval's wall
time, the number of samples, how many batches the provider sampled and their mean size, and whether every
sample's completion equals that of the first batch size given. Needs inspect_ai (`pip install 'opct[inspect]'`).

    python bench/inspect_local.py [--model DIR] [--task sycophancy] [--n 40] [--batch-sizes 1 16]
                                  [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from opct.config import positive_arg

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="a model directory or an opct subject (default: the shipped default organism)")
    p.add_argument("--task", default="sycophancy", help="an opct axis with an inspect task")
    p.add_argument("--n", type=positive_arg, default=40, help="the task's -T n")
    p.add_argument("--batch-sizes", type=positive_arg, nargs="+", default=[1, 16],
                   help="-M batch_size values, in order")
    p.add_argument("--threads", type=positive_arg, default=None, help="-M threads (default: the provider's choice)")
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    try:
        from inspect_ai import eval as inspect_eval
        from inspect_ai.model import get_model
    except ImportError:
        print("inspect_ai is not installed: pip install 'opct[inspect]'", file=sys.stderr)
        return 1
    from opct.errors import OpctError
    from opct.inspect import axis_task
    from opct.subjects import resolve

    try:
        model_dir = resolve(a.model or "default")[0]
        axis_task(a.task, n=a.n)  # an unknown task is named before any model loads
    except OpctError as e:
        p.error(str(e))
    print(f"{model_dir}; task opct/{a.task} -T n={a.n}; device {a.device}")
    reference = None
    with tempfile.TemporaryDirectory() as logs:
        for bs in a.batch_sizes:
            args = {"model_path": model_dir, "batch_size": bs, "device": a.device}
            if a.threads:
                args["threads"] = a.threads
            model = get_model("opct/local", memoize=False, **args)
            sizes, sample = [], model.api.policy.sample

            def spy(prompts, *rest, _sample=sample, _sizes=sizes, **kw):
                _sizes.append(len(prompts))
                return _sample(prompts, *rest, **kw)

            model.api.policy.sample = spy
            t0 = time.perf_counter()
            log = inspect_eval(axis_task(a.task, n=a.n), model=model, log_dir=logs, display="none")[0]
            wall = time.perf_counter() - t0
            if log.status != "success":
                print(f"batch_size {bs}: the eval failed: {log.error}", file=sys.stderr)
                return 1
            completions = {(s.id, s.epoch): s.output.completion for s in log.samples}
            reference = completions if reference is None else reference
            same = sum(completions.get(k) == v for k, v in reference.items())
            print(f"batch_size {bs:>3}: {wall:7.1f} s, {len(completions)} samples, {len(sizes)} batches of "
                  f"{sum(sizes) / max(1, len(sizes)):.1f} on average; completions equal to batch_size "
                  f"{a.batch_sizes[0]}'s: {same} of {len(reference)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
