#!/usr/bin/env bash
# DeMo paper, 1B shape: the AdamW-DDP baseline (gradients all-reduced every step; lr 4e-4, betas 0.9/0.95,
# weight decay 0.1). Cluster: HOSTFILE=hosts scripts/paper/1b_adamw.sh; more in docs/REPRODUCING.md.
export MODEL_CONFIG="${MODEL_CONFIG:-configs/paper_1b_shape.json}" RUN_NAME="${RUN_NAME:-1b_adamw}" LAUNCHED_BY=scripts/paper/1b_adamw.sh
exec "$(dirname "$0")/../run_experiment.sh" --optimizer adamw "$@"
