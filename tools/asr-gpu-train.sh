#!/usr/bin/env bash
# `python -m edgestream.asr.gpu_recipe train` on a GPU machine without network, from the kit
# that `make asr-gpu-kit` gathers (docs/asr.md): installs the kit's wheels into /tmp/site,
# unpacks Flite into /tmp/flite, then runs the recipe on the kit's sentences with every other
# argument passed on. Run it from the repository's root.
set -euo pipefail
kit=${1:?usage: tools/asr-gpu-train.sh KIT OUT [gpu_recipe train options]}
out=${2:?usage: tools/asr-gpu-train.sh KIT OUT [gpu_recipe train options]}
shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$kit"/whl/*.whl
mkdir -p /tmp/flite
for deb in "$kit"/deb/*.deb; do dpkg -x "$deb" /tmp/flite; done
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/flite/usr/bin:$PATH"
export LD_LIBRARY_PATH="/tmp/flite/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
exec python3 -m edgestream.asr.gpu_recipe train "$kit/sentences.json.gz" "$out" "$@"
