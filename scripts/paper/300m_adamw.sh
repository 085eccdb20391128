#!/usr/bin/env bash
# DeMo paper, 300M shape: the AdamW-DDP baseline (gradients all-reduced every step; lr 4e-4, betas 0.9/0.95,
# weight decay 0.1). Cluster: HOSTFILE=hosts scripts/paper/300m_adamw.sh; more in docs/REPRODUCING.md.
export MODEL_CONFIG="${MODEL_CONFIG:-configs/paper_300m_shape.json}" RUN_NAME="${RUN_NAME:-300m_adamw}" LAUNCHED_BY=scripts/paper/300m_adamw.sh
exec "$(dirname "$0")/../run_experiment.sh" --optimizer adamw "$@"
