#!/usr/bin/env bash
# DeMo paper, 1B shape: DeMo exchanging the top 1 DCT coefficient per 64x64 chunk of each rank's momentum
# (lr 4e-4, decay 0.999, weight decay 0). Cluster: HOSTFILE=hosts scripts/paper/1b_demo_k1.sh; see docs/REPRODUCING.md.
export MODEL_CONFIG="${MODEL_CONFIG:-configs/paper_1b_shape.json}" RUN_NAME="${RUN_NAME:-1b_demo_k1}" LAUNCHED_BY=scripts/paper/1b_demo_k1.sh
exec "$(dirname "$0")/../run_experiment.sh" --optimizer demo --topk 1 "$@"
