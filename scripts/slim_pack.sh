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
tar cJf "$pack.part/tvm_py.tar.xz" -C "$work/tvm" tvm
( cd "$work/ffi" && python3 -m zipfile -e "$root"/.tvmpack/apache_tvm_ffi-*.whl . \
  && rm -rf tvm_ffi/3rdparty && find . -name '*.pyi' -delete )
tar cJf "$pack.part/ffi.tar.xz" -C "$work/ffi" .
cp .tvmpack/libtvm_compiler.so.xz .tvmpack/VERSION "$pack.part/"
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
