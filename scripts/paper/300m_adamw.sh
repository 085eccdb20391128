#!/usr/bin/env bash
# DeMo paper, its 300M OLMo (configs/paper_300m.json): the AdamW-DDP baseline (gradients all-reduced every step; lr 4e-4, betas 0.9/0.95,
# weight decay 0.1). Cluster: HOSTFILE=hosts scripts/paper/300m_adamw.sh; more in docs/REPRODUCING.md.
# Data: the paper trained on Dolma v1.5 in the gpt-neox-20b-pii-special tokenizer, OLMo's token files:
# TRAIN_DATA=paths.txt DATA_FORMAT=olmo (uint16, eos 50279: the config's); any ids below 50280 run (data/default).
export MODEL_CONFIG="${MODEL_CONFIG:-configs/paper_300m.json}" RUN_NAME="${RUN_NAME:-300m_adamw}" LAUNCHED_BY=scripts/paper/300m_adamw.sh
exec "$(dirname "$0")/../run_experiment.sh" --optimizer adamw "$@"
