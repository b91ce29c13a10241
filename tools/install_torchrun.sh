#!/usr/bin/env bash
# Makes VENV (a virtualenv, created when missing) hold the current PyPI torch with a working
# `torchrun`, for tests that launch tools/train under it (tests/distributed/torchrun_test.sh).
# Quick when it is already there. The CPU-only wheels' index is not reachable from CI, and
# PyPI's torch brings about 5 GiB of CUDA libraries, most of which `import torch` does not
# need on a host with the CUDA toolkit: so torch comes without its dependencies, then the
# pure-Python ones, then (only if the import still fails) the few NVIDIA libraries its shared
# objects link that the toolkit lacks (NCCL at torch's pin, cuSPARSELt, NVSHMEM, cuFile), and
# only if that is not enough, torch with all its dependencies. Measured on a 2-core CI machine
# with the CUDA 13 toolkit: 45 s and 2.0 GiB (the first two steps), against minutes and
# 5.4 GiB for `pip install torch`.
# With a second argument `accelerate`, also Hugging Face's accelerate (its launcher), without
# letting pip bring torch's CUDA dependencies after all: accelerate alone, then its other
# dependencies (7 s more).
#   tools/install_torchrun.sh ~/.cache/cpptrain-venv [accelerate]
set -euo pipefail
venv="${1:?usage: tools/install_torchrun.sh VENV [accelerate]}"
log="$venv/install_torchrun.log"
# pip's complaints about the dependencies left out on purpose go to the log.
pip() { "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "$@" >>"$log" 2>&1 ||
  { cat "$log" >&2; return 1; }; }
works() {
  "$venv/bin/python" -c 'import torch.distributed.run' >/dev/null 2>&1 && [[ -x "$venv/bin/torchrun" ]]
}
has_accelerate() { "$venv/bin/accelerate" launch --help >/dev/null 2>&1; }
add_accelerate() {
  [[ "${1:-}" == accelerate ]] && ! has_accelerate || return 0
  echo "installing accelerate into $venv" >&2
  pip --no-deps accelerate
  pip psutil pyyaml numpy packaging safetensors huggingface_hub
  has_accelerate || { "$venv/bin/accelerate" launch --help; exit 1; }
}
if works; then add_accelerate "${2:-}"; exit 0; fi
start=$SECONDS
[[ -x "$venv/bin/pip" ]] || python3 -m venv "$venv"
echo "installing torch (without its CUDA dependencies) into $venv" >&2
pip --no-deps torch
pip filelock typing-extensions sympy networkx jinja2 fsspec
if ! works; then
  # The NVIDIA packages torch pins that a CUDA toolkit does not carry, at torch's versions.
  mapfile -t extra < <("$venv/bin/python" - <<'EOF'
import importlib.metadata as m, re
wanted = ("nvidia-nccl", "nvidia-cusparselt", "nvidia-nvshmem")
for req in m.requires("torch") or []:
    name = re.split(r"[ ;<>=~!\[]", req, maxsplit=1)[0]
    if name.startswith(wanted):
        print(req.split(";")[0].replace(" ", ""))
print("nvidia-cufile")
EOF
  )
  echo "torch did not import; adding ${extra[*]}" >&2
  pip --no-deps "${extra[@]}" || true
fi
if ! works; then
  echo "torch still did not import; installing it with all its dependencies" >&2
  pip torch
fi
works || { "$venv/bin/python" -c 'import torch'; exit 1; }
add_accelerate "${2:-}"
version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)
echo "torch $version ready in $venv after $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))" >&2
