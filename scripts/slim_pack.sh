#!/usr/bin/env bash
# Build .tvmpack_models/ from .tvmpack/ (../shared/tools/tvmpack.sh): the same TVM without the
# onnx/tflite/stablehlo importers (relax.frontend.torch stays, for the model benchmark) and the
# FFI wheel unpacked without its bundled sources, so the pack and the tree fit the device tool's
# 64 MiB transfer. On the GPU machine: carry [".tvmpack_models"], source .tvmpack_models/setup.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
[ -f .tvmpack/VERSION ] || { echo "slim_pack: run ../shared/tools/tvmpack.sh first (no .tvmpack/)" >&2; exit 2; }
grep -qxF '/.tvmpack_models/' .git/info/exclude || echo '/.tvmpack_models/' >> .git/info/exclude
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
pack=.tvmpack_models; rm -rf "$pack.part"; mkdir -p "$pack.part" "$work/tvm" "$work/ffi"
tar xJf .tvmpack/tvm_py.tar.xz -C "$work/tvm"
rm -rf "$work"/tvm/tvm/relax/frontend/{onnx,tflite,stablehlo}
tar cf - -C "$work/tvm" tvm | xz -9e -T1 > "$pack.part/tvm_py.tar.xz"
# the FFI's C++ sources and headers are for building extensions, not for running TVM (its core
# library links libtvm_ffi_testing.so: that one stays)
( cd "$work/ffi" && python3 -m zipfile -e "$root"/.tvmpack/apache_tvm_ffi-*.whl . \
  && rm -rf tvm_ffi/3rdparty tvm_ffi/src tvm_ffi/cython tvm_ffi/include && find . -name '*.pyi' -delete )
tar cf - -C "$work/ffi" . | xz -9e -T1 > "$pack.part/ffi.tar.xz"
# one block and a 256 MiB window: ~0.1 MB smaller than tvmpack's multi-threaded -9, which the
# 64 MiB transfer needs beside the tree (a few minutes)
xz -dc -T0 .tvmpack/libtvm_compiler.so.xz | xz -9e --lzma2=preset=9e,dict=256MiB -T1 > "$pack.part/libtvm_compiler.so.xz"
cp .tvmpack/VERSION "$pack.part/"
cat > "$pack.part/setup.sh" <<'SETUP'
# On the GPU machine: source .tvmpack_models/setup.sh   (unpacks once into /tmp/site)
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -f /tmp/site/tvm/lib/libtvm_compiler.so ]; then
  mkdir -p /tmp/site
  tar xJf "$_here/ffi.tar.xz" -C /tmp/site
  tar xJf "$_here/tvm_py.tar.xz" -C /tmp/site
  xz -dc -T0 "$_here/libtvm_compiler.so.xz" > /tmp/site/tvm/lib/libtvm_compiler.so.part
  mv /tmp/site/tvm/lib/libtvm_compiler.so.part /tmp/site/tvm/lib/libtvm_compiler.so
fi
export PYTHONPATH=/tmp/site:$(cd "$_here/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}
SETUP
rm -rf "$pack"; mv "$pack.part" "$pack"
du -sh "$pack"
