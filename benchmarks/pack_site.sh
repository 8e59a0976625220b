#!/usr/bin/env bash
# Packs the wheels that ../shared/device/fetch-wheels.sh downloaded (into .whl/) as one xz'd site-packages folder
# under the ignored .whlx/, so that polars and nvCOMP's library travel together within a GPU call's 64 MiB
# (their wheels are 54 + 34 MB; unpacked, without nvCOMP's Python API and tools, xz -9 makes them 52 MiB).
#   ../shared/device/fetch-wheels.sh --nvcomp && bash benchmarks/pack_site.sh
# Then carry .whlx and begin the GPU command with:
#   tar -xJf .whlx/site.tar.xz -C /tmp && export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx "/.whlx/" .git/info/exclude 2>/dev/null || echo "/.whlx/" >> .git/info/exclude
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/site" .whlx
for w in .whl/*.whl; do python3 -m zipfile -e "$w" "$tmp/site"; done
# tsconv calls nvCOMP's C library through ctypes: its Python bindings (one build per Python) and tools stay behind
rm -rf "$tmp"/site/nvidia/nvcomp "$tmp"/site/nvidia_nvcomp_cu13-* "$tmp"/site/nvidia/libnvcomp/bin
tar -cf - -C "$tmp" site | xz -T0 -9 > .whlx/site.tar.xz
du -h .whlx/site.tar.xz
