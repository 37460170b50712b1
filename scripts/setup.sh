#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build and test train_gpt (and to plot its
# curves: python3-matplotlib for scripts/plot.py). Idempotent:
# packages already present are not reinstalled. The CUDA toolkit (nvcc, cuBLASLt, NCCL) is
# expected at $CUDA_HOME (default /usr/local/cuda); without it, `make` cannot build.
set -euo pipefail
pkgs=(openmpi-bin libopenmpi-dev nlohmann-json3-dev libxxhash-dev catch2 bible-kjv make g++ jq python3-matplotlib slurm-wlm munge clang libomp-dev libboost-context-dev libopenblas-openmp-dev)  # xxhash: the checkpoints' checksum (header only); slurm: test/e2e/test_slurm.sh; jq: test_plan.sh; matplotlib: scripts/plot.py; clang: make fuzz; boost-context: the CUDA emulator (make test-emu); openblas: dev/bench/cpu_gemm.sh
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "setup: system packages present"
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
    if [ "${CUDA:-1}" = 0 ]; then
        echo "setup: no CUDA toolkit at $CUDA_HOME: building with CUDA=0 (the CPU backend only)"
    else
        echo "setup: nvcc not found at $CUDA_HOME/bin/nvcc; install the CUDA toolkit (it provides nvcc, cuBLASLt," \
             "NCCL), or build without the CUDA backend: CUDA=0 bash scripts/setup.sh && make CUDA=0 test" >&2
        exit 2
    fi
fi
# GPT-2 tokenizer files (encoder.json, vocab.bpe) for data preparation and decoded samples
bash "$(dirname "$0")/get_tokenizer.sh"
