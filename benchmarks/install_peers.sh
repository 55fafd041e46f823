#!/usr/bin/env bash
# Install Triton's own tools as benchmark peers, apart from the project's venv
# (shared/notes/peers.md): perf_analyzer from the last tritonclient wheel that ships it, and
# Model Analyzer 1.58 in a venv of its own (it pins packages that fight the project's), and
# Open MPI: Model Analyzer's concurrent mode runs one perf_analyzer per model under mpiexec, and
# perf_analyzer --enable-mpi dlopens libmpi.so (libopenmpi-dev's link).
#   /opt/peers/bin/perf_analyzer      wrapper: LD_LIBRARY_PATH for libcudart, then the binary
#   /opt/peers/ma/bin/model-analyzer  Model Analyzer 1.58
# Usage: bash benchmarks/install_peers.sh [PREFIX]   (PREFIX defaults to /opt/peers)
set -euo pipefail
PREFIX=${1:-/opt/peers}
PYTHON=${PYTHON:-python3}
mkdir -p "$PREFIX/bin" "$PREFIX/dl"

if command -v apt-get >/dev/null 2>&1 && { ! ldconfig -p | grep -q libb64.so.0d \
  || ! ldconfig -p | grep -q 'libmpi.so ' || ! command -v unzip >/dev/null \
  || ! command -v mpiexec >/dev/null; }; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends libb64-0d unzip \
    openmpi-bin libopenmpi-dev >/dev/null
fi

if [ ! -x "$PREFIX/lib/perf_analyzer" ]; then
  "$PYTHON" -m pip download --quiet --no-deps -d "$PREFIX/dl" "tritonclient[all]==2.41.1"
  wheel=$(ls "$PREFIX"/dl/tritonclient-2.41.1-*.whl | head -1)
  mkdir -p "$PREFIX/lib"
  unzip -o -q -j "$wheel" 'tritonclient-2.41.1.data/data/bin/perf_analyzer' -d "$PREFIX/lib"
  chmod +x "$PREFIX/lib/perf_analyzer"
fi
if [ ! -d "$PREFIX/cudart/nvidia/cuda_runtime/lib" ]; then
  "$PYTHON" -m pip install --quiet --target "$PREFIX/cudart" nvidia-cuda-runtime-cu12
fi
cat > "$PREFIX/bin/perf_analyzer" <<WRAP
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$PREFIX/cudart/nvidia/cuda_runtime/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$PREFIX/lib/perf_analyzer" "\$@"
WRAP
chmod +x "$PREFIX/bin/perf_analyzer"

if [ ! -x "$PREFIX/ma/bin/model-analyzer" ]; then
  "$PYTHON" -m venv "$PREFIX/ma"
  "$PREFIX/ma/bin/pip" install --quiet --upgrade pip
  "$PREFIX/ma/bin/pip" install --quiet triton-model-analyzer==1.58.0
fi
"$PREFIX/bin/perf_analyzer" --version >/dev/null 2>&1 || { echo "perf_analyzer does not run" >&2; exit 1; }
"$PREFIX/ma/bin/model-analyzer" --help >/dev/null
echo "peers installed: $PREFIX/bin/perf_analyzer, $PREFIX/ma/bin/model-analyzer"
