#!/usr/bin/env bash
# DeMo paper, 300M shape: DeMo exchanging the top 2 DCT coefficients per 64x64 chunk of each rank's momentum
# (lr 4e-4, decay 0.999, weight decay 0). Cluster: HOSTFILE=hosts scripts/paper/300m_demo_k2.sh; see docs/REPRODUCING.md.
export MODEL_CONFIG="${MODEL_CONFIG:-configs/paper_300m_shape.json}" RUN_NAME="${RUN_NAME:-300m_demo_k2}" LAUNCHED_BY=scripts/paper/300m_demo_k2.sh
exec "$(dirname "$0")/../run_experiment.sh" --optimizer demo --topk 2 "$@"
