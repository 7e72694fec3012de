"""STUDIES: the robustness studies by name (the keys a robustness file's `studies:` takes; see `opct.robustness`).

The registry lives here, not in the package's `__init__`, so that `python -m opct.robustness.<study>` does not import
the study before running it as `__main__` (runpy's "found in sys.modules" RuntimeWarning, and two copies of it).
"""

from opct.robustness import backdoor, reasons, replay, washout

STUDIES = {
    "replay": replay,  # on-model benign replay (replay_frac x schedule): capability and the trained behaviour
    "washout": washout,  # follow-up benign SFT at doses: the wash fraction per method and axis
    "reasons": reasons,  # training on the reason: reason / filler / masked targets, transfer to held-out families
    "backdoor": backdoor,  # poisoned pairs, a backdoored teacher, estimators, the log-ratio clip, admission
}
