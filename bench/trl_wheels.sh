#!/usr/bin/env bash
# TRL for a machine without a package index (the lent GPU machines), as wheels in .whl/ of the repository root, to be
# carried there (device tool: name `.whl` in carry when it is git-ignored; an untracked, unignored .whl travels anyway)
# and installed by section 6 of bench/gpu_check.sh with `pip install --no-index --no-deps --target /tmp/trl-site`.
# Run it HERE, where pip reaches PyPI. Only what the GPU image lacks (its package list: /work/.library/device/KINDS.md)
# and TRL's SDFT path imports: TRL itself, datasets (trl.experimental.sdft imports it at module level), and datasets'
# dill and multiprocess. Everything else TRL and datasets require is in the image: accelerate, transformers,
# huggingface-hub, jinja2, numpy, packaging, pandas, psutil, pyarrow, pyyaml, filelock, tqdm, xxhash, fsspec, httpx.
# The versions are the ones bench/opct_step.py was run with here (TRL 1.16.0 and its datasets 5.2.0); datasets 5.2.0
# asks for pyarrow >= 24, which --no-deps does not check (section 6 prints the image's pyarrow).
#     bash bench/trl_wheels.sh            # PY=python3, DEST=.whl
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEST=${DEST:-.whl}
WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
mkdir -p "$DEST"
# the GPU image's Python is CPython 3.12 on x86-64 Linux; these four are pure Python (multiprocess has one wheel per
# Python version), so the platform tags only keep pip from refusing
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${WHEELS[@]}"
ls -l "$DEST"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
total=$(cat "$DEST"/*.whl | wc -c)
limit=$(( 64 * 1024 * 1024 ))
awk -v t="$total" -v d="$DEST" 'BEGIN { printf "total %.2f MiB in %s (a device call carries at most 64 MiB in all, \
the working tree included)\n", t / 1048576, d }'
if (( total >= limit )); then echo "trl_wheels: over the 64 MiB a device call may carry" >&2; exit 1; fi
for w in "$DEST"/*.whl; do  # each wheel's own requirements (extras left out), to check against the image's list
  echo "== $(basename "$w"): $(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
    | sed 's/^Requires-Dist: //' | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
done
if grep -qx '/.whl/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null; then
  echo "$DEST is in .git/info/exclude: name it in the device call's carry"
else
  echo "$DEST is not git-ignored: it travels as an untracked file; do not commit it"
fi
