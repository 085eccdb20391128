#!/usr/bin/env bash
# DeMo paper, its 300M OLMo (configs/paper_300m.json): DeMo exchanging the top 16 DCT coefficients per 64x64 chunk of each rank's momentum
# (lr 4e-4, decay 0.999, weight decay 0). Cluster: HOSTFILE=hosts scripts/paper/300m_demo_k16.sh; see docs/REPRODUCING.md.
# Data: the paper trained on Dolma v1.5 in the gpt-neox-20b-pii-special tokenizer, OLMo's token files:
# TRAIN_DATA=paths.txt DATA_FORMAT=olmo (uint16, eos 50279: the config's); any ids below 50280 run (data/default).
export MODEL_CONFIG="${MODEL_CONFIG:-configs/paper_300m.json}" RUN_NAME="${RUN_NAME:-300m_demo_k16}" LAUNCHED_BY=scripts/paper/300m_demo_k16.sh
exec "$(dirname "$0")/../run_experiment.sh" --optimizer demo --topk 16 "$@"
