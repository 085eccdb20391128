#!/usr/bin/env bash
# Installs the Debian 12 packages the project needs (build, MPI, BLAS, JSON, ICU, zlib and zstd for compressed
# corpora, PyTorch for the reference tests, matplotlib for plots, KJV text for the default corpus, iproute2 for the
# bandwidth lab, xxhsum for the checkpoint checksum tests, chromium for the dashboard test) and Node.js when
# missing. Skips apt entirely when everything is already there.
# Needs root (or sudo).
set -euo pipefail
packages=(build-essential make git openmpi-bin libopenmpi-dev nlohmann-json3-dev libopenblas-dev libicu-dev
          zlib1g-dev libzstd-dev zstd
          python3-torch python3-numpy python3-matplotlib bible-kjv iproute2 xxhash chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
command -v node >/dev/null || missing+=(nodejs npm)
[[ ${#missing[@]} -eq 0 ]] && exit 0
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q "${missing[@]}" >/dev/null
