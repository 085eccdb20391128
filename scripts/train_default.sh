#!/usr/bin/env bash
# The README's main command: on a fresh Debian 12 machine, install what is missing, build the CPU trainer,
# prepare the default corpus (real public-domain prose, several million GPT-2 tokens) and train the small
# model on it, printing one progress line per step, validation loss and samples; metrics and checkpoints go to
# out/small. Extra arguments go to the trainer (e.g. --steps 50, or --optimizer demo). With NP=4 it runs
# 4 MPI ranks on this host. A rerun starts over (--overwrite: the earlier run's checkpoints in out/small are
# deleted); add --resume auto to continue that run instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
make -j2 train_gpt_cpu build/prepro_gpt2 >/dev/null
data/prepare_default.sh
if [[ -n "${NP:-}" && "${NP}" != 1 ]]; then
  export OMPI_MCA_rmaps_base_oversubscribe=1
  if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  exec mpirun -np "$NP" ./train_gpt_cpu --config configs/small.json --overwrite "$@"
fi
exec ./train_gpt_cpu --config configs/small.json --overwrite "$@"
