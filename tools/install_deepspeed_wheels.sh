#!/usr/bin/env bash
# Installs DeepSpeed 0.19.8 for tools/bench_torch.py --engine zero on a GPU host without
# internet, from the wheels in .wheels/ (DeepSpeed built as a pure-Python wheel with
# DS_BUILD_OPS=0, and its dependencies for CPython 3.12 on manylinux x86_64), into a virtualenv
# that sees the host's own torch (--system-site-packages: torch 2.11 + CUDA stays as it is).
#
#   tools/install_deepspeed_wheels.sh                 # venv in /tmp/cpptrain_ds_venv
#   VENV=/opt/ds PYTHON=python3.12 WHEELS=/path/.wheels tools/install_deepspeed_wheels.sh
#   /tmp/cpptrain_ds_venv/bin/torchrun --standalone --nproc_per_node 1 tools/bench_torch.py \
#       --engine zero --stage 2 --init_dir DIR
#
# The venv's bin/torchrun is a wrapper that puts the venv's bin (ninja) first on PATH and sets
# TORCH_CUDA_ARCH_LIST to the GPU's own architecture (9.0 on an H200) unless already set:
# DeepSpeed JIT-builds its ops at first use (FusedAdam with nvcc, from CUDA_HOME or PATH;
# DeepSpeedCPUAdam with the host's c++, both through ninja) and its builder cannot parse the
# "9.0a" of torch's default list. The first run spends about a minute compiling each op
# (cached in ~/.cache/torch_extensions). Exit 0 only when deepspeed imports in the venv.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="${WHEELS:-$root/.wheels}"
python="${PYTHON:-python3}"
venv="${VENV:-/tmp/cpptrain_ds_venv}"

fail() { echo "install_deepspeed_wheels: $*" >&2; exit 1; }

[ -d "$wheels" ] || fail "no wheel directory $wheels (set WHEELS=, or copy .wheels/ there)"
ls "$wheels"/deepspeed-0.19.8-*.whl >/dev/null 2>&1 ||
  fail "$wheels has no deepspeed-0.19.8 wheel (build it as docs/BENCHMARKS.md says)"
version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ||
  fail "$python does not run (set PYTHON=)"
[ "$version" = "3.12" ] ||
  fail "$python is Python $version; the wheels' binary parts (pydantic-core, msgpack, numpy) are for 3.12: set PYTHON= to a 3.12 interpreter"
"$python" -c 'import torch' 2>/dev/null ||
  fail "$python has no torch: DeepSpeed uses the host's torch (install torch there first)"

"$python" -m venv --system-site-packages "$venv"
# nvidia-ml-py: optional for DeepSpeed (its CUDA accelerator reads device memory through it);
# a wheel built on a CUDA host would require it.
packages=(deepspeed==0.19.8)
ls "$wheels"/nvidia_ml_py-*.whl >/dev/null 2>&1 && packages+=(nvidia-ml-py)
"$venv/bin/python" -m pip install --no-index --find-links "$wheels" "${packages[@]}"

cat > "$venv/bin/torchrun" <<WRAPPER
#!/usr/bin/env bash
# torchrun of $python with this venv's DeepSpeed and ninja (tools/install_deepspeed_wheels.sh).
export PATH="$venv/bin:\$PATH"
if [ -z "\${TORCH_CUDA_ARCH_LIST:-}" ]; then
  arch="\$("$venv/bin/python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability()) if torch.cuda.is_available() else print("")' 2>/dev/null || true)"
  [ -n "\$arch" ] && export TORCH_CUDA_ARCH_LIST="\$arch"
fi
exec "$venv/bin/python" -m torch.distributed.run "\$@"
WRAPPER
chmod +x "$venv/bin/torchrun"

PATH="$venv/bin:$PATH" "$venv/bin/python" - <<'CHECK' || fail "deepspeed does not import in $venv"
import deepspeed, torch, torch.utils.cpp_extension as ext
ext.verify_ninja_availability()
print(f"deepspeed {deepspeed.__version__} with torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}, CUDA_HOME {ext.CUDA_HOME}); ninja found")
CHECK
echo "install_deepspeed_wheels: done; run the bench with $venv/bin/torchrun"
