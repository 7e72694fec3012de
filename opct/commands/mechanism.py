"""`opct mechanism RUN [--arms A B ...] [--n 64]`: the mechanism probe of an experiment's run directory — per layer,
how far each trained arm moved the residual stream on the perturbed prompts, and how alike two arms' changes are
(cosine, linear CKA), over seeds; writes RUN/mechanism.json, prints its tables, and `opct report RUN` shows them."""

from __future__ import annotations


def register(sub) -> None:
    from opct.config import positive_arg
    from opct.flags import OnceList, path_arg

    p = sub.add_parser("mechanism", help="residual-stream change per layer and the similarity between methods",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("run", metavar="RUN", type=path_arg, help="run directory (runs/<name>, holding experiment.json)")
    p.add_argument("--arms", nargs="+", action=OnceList, default=None,
                   help="trained arms to probe (default: every trained arm)")
    p.add_argument("--n", type=positive_arg, default=64, help="perturbed prompts per axis and seed (default 64)")
    p.add_argument("--batch-size", type=positive_arg, default=32, help="prompts per forward pass (default 32)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_mechanism)


def _mechanism(args) -> int:
    from opct.report import mechanism as M

    result = M.compute(args.run, arms=args.arms, n=args.n, batch_size=args.batch_size,
                       progress=not args.no_progress)
    print(M.markdown(result))
    print(f"opct mechanism: {args.run}/mechanism.json (run `opct report {args.run}` to add it to the report)")
    return 0
