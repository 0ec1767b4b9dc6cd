#!/usr/bin/env bash
# The native executor's kernel tests under AddressSanitizer and UndefinedBehaviorSanitizer.
#
# Builds the C++ core and the extension with -fsanitize=address,undefined in build/sanitize
# (its own folder: the installed module is never replaced), then runs the kernel tests of
# tests/test_native.py (the hypothesis fuzz of conv, pool, gemm and matmul on every
# instruction set, the element-wise, reduce, data-movement kernels and the malformed plans; not
# the whole models), ONNX's node tests (tests/test_native_node.py), the genai decoder's ops and
# tiny decoder (tests/test_native_decoder.py) and the fuzz of mutated
# plans (tests/fuzz/test_fuzz.py -k plan: refused, or run with no bad access), with
# ONNXLENS_NATIVE_MODULE naming the sanitized module (backends/__init__.py) and the sanitizer
# runtimes preloaded into Python. Any memory error or undefined behavior aborts the run.
# Called by .ci/run; about 5 minutes on 2 cores from a clean tree (4 of them building).
# Skipped, with one line, when the compiler has no sanitizer runtimes.
set -euo pipefail
cd "$(dirname "$0")/.."

CXX=${CXX:-c++}
BUILD=${ONNXLENS_SANITIZE_BUILD:-build/sanitize}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

asan=$("$CXX" -print-file-name=libasan.so 2>/dev/null || true)
ubsan=$("$CXX" -print-file-name=libubsan.so 2>/dev/null || true)
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int main() { return 0; }' > "$probe/p.cpp"
if [[ "$asan" != /* || ! -e "$asan" || "$ubsan" != /* || ! -e "$ubsan" ]] \
    || ! "$CXX" $SAN "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
  echo "sanitize: skipped ($CXX has no AddressSanitizer/UndefinedBehaviorSanitizer runtime)"
  exit 0
fi

start=$SECONDS
python=$(command -v python)
cmake -S . -B "$BUILD" -G Ninja -Wno-dev \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_MODULE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" \
  -DPython_EXECUTABLE="$python" >/dev/null
cmake --build "$BUILD" --target _native -j "$(nproc)" >/dev/null
module=$(ls "$PWD/$BUILD"/backends/native/_native*.so)
echo "sanitize: built $module in $((SECONDS - start)) s"

export ONNXLENS_NATIVE_MODULE=$module
export LD_PRELOAD="$asan $ubsan"
# Python's allocations are never freed at exit, by design: no leak report. Reports go to files
# (pytest captures stderr, and an aborted process never shows it), printed on failure.
report="$PWD/$BUILD/report"
export ONNXLENS_FUZZ_LAST="$PWD/$BUILD/last-input.bin"
rm -f "$report".* "$ONNXLENS_FUZZ_LAST"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0:log_path=$report
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$report
failed() {
  cat "$report".* 2>/dev/null || true
  if [[ -e "$ONNXLENS_FUZZ_LAST" ]]; then
    echo "sanitize: the last fuzz input, replayed: ONNXLENS_NATIVE_MODULE=$module" \
         "LD_PRELOAD='$LD_PRELOAD' python benchmarks/fuzz.py --replay $ONNXLENS_FUZZ_LAST"
  fi
  echo "sanitize: FAILED after $((SECONDS - start)) s"
  exit 1
}
python - <<'EOF' || failed
import os
from onnxlens.backends import _native
assert _native.__file__ == os.environ["ONNXLENS_NATIVE_MODULE"], _native.__file__
EOF
python -m pytest -q -p no:cacheprovider -m "not slow" \
  -k "not resnet18 and not mobilenet and not transformer and not profile_is_per_group" \
  tests/test_native.py tests/test_native_node.py tests/test_native_decoder.py || failed
# The mutated plans (and the plan regressions): refused, or run with no bad access.
ONNXLENS_FUZZ_EXAMPLES=${ONNXLENS_SANITIZE_PLANS:-500} \
  python -m pytest -q -p no:cacheprovider -k "plan" \
  tests/fuzz/test_fuzz.py tests/fuzz/test_regressions.py || failed
echo "sanitize: passed in $((SECONDS - start)) s"
