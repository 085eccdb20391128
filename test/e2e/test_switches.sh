#!/usr/bin/env bash
# The kernel and transport switches are config keys like any other: every one is in --help (the experimental ones
# marked), set from a flag or a config file, recorded in config.json, and checked across ranks. Two ranks started
# with different values of a switch (an MPMD launch) stop before any work, every rank with the one line that names
# rank 1's flag and rank 0's value: for a cuda key and a comm key on the CPU trainer, and for a DeMo kernel key on
# the CUDA trainer running on the emulated device. Skips without mpirun.
set -uo pipefail
cd "$(dirname "$0")/../.."
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
[[ -x ./train_gpt_cpu ]] || { echo "SKIP: ./train_gpt_cpu not built"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
TMP=build/test-tmp/switches
rm -rf "$TMP" && mkdir -p "$TMP"
source test/support/checks.sh
base=(--config configs/tiny.json --steps 2 --val_every 0 --val_batches 1 --checkpoint_every -1 --threads 1)

help=$(./train_gpt_cpu --help)
for key in attention flash_dq gelu_fusion bias_grad matmul_tune cuda_graph stochastic_rounding demo_dct \
           demo_momentum_domain demo_kernel_tuning transport ddp_overlap mpi_message_bytes mpi_reduce_slice \
           mpi_reduce_jobs mpi_helper_threads; do
  check "--help lists --$key" grep -q -- "^  --$key " <<<"$help"
done
for key in flash_dq bias_grad matmul_tune cuda_graph demo_kernel_tuning; do
  check "--help marks --$key experimental" grep -q -- "^  --$key .*\[experimental: " <<<"$help"
done
check "--help groups the switches under cuda: and comm:" bash -c 'grep -q "^cuda:$" <<<"$0" && grep -q "^comm:$" <<<"$0"' "$help"

# a config file sets them as any key, and config.json records them
echo '{"attention": "matmul", "mpi_message_bytes": 4096, "ddp_overlap": false}' >"$TMP/switches.json"
./train_gpt_cpu "${base[@]}" --config "$TMP/switches.json" --cuda_graph --out_dir "$TMP/recorded" >"$TMP/recorded.log" 2>&1
check "a run with switches from a file and flags succeeds" test $? -eq 0
recorded() {  # recorded <key> <JSON value>: config.json holds it
  python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))[sys.argv[2]] != json.loads(sys.argv[3]))' \
    "$TMP/recorded/config.json" "$1" "$2"
}
check "config.json records attention \"matmul\"" recorded attention '"matmul"'
check "config.json records mpi_message_bytes 4096" recorded mpi_message_bytes 4096
check "config.json records ddp_overlap false" recorded ddp_overlap false
check "config.json records cuda_graph true" recorded cuda_graph true
check "config.json records the defaults too (transport \"nccl\")" recorded transport '"nccl"'

# two ranks, two values: refused before the first step, one line per rank naming the key
mismatch() {  # mismatch <name> <trainer> <flag> <value on rank 0> <value on rank 1> <message fragment>
  local name=$1 trainer=$2 flag=$3 a=$4 b=$5 needle=$6
  timeout 120 mpirun -np 1 "$trainer" "${base[@]}" "$flag" "$a" --out_dir "$TMP/$name" : \
    -np 1 "$trainer" "${base[@]}" "$flag" "$b" --out_dir "$TMP/$name" >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$? errors lines
  errors=$(grep -c "^error (rank [01]): $needle" "$TMP/$name.err")
  lines=$(grep -c '^error' "$TMP/$name.err")  # mpirun's own banner follows them
  check "$name: 2 ranks with $flag $a / $b stop (exit $rc), each with one line naming the key" \
    test "$rc" -ne 0 -a "$errors" -ge 1 -a "$errors" -eq "$lines" -a ! -e "$TMP/$name/metrics.jsonl"
  [[ $rc -ne 0 && $errors -ge 1 && $errors -eq $lines ]] || sed 's/^/      /' "$TMP/$name.err" | head -n 8
}
mismatch cpu-attention ./train_gpt_cpu --attention flash matmul \
  'rank 1 was started with --attention="matmul" but rank 0 with "flash" (every rank needs the same flags and config files)'
mismatch cpu-transport ./train_gpt_cpu --transport nccl mpi 'rank 1 was started with --transport="mpi" but rank 0 with "nccl"'
mismatch cpu-mpi-message-bytes ./train_gpt_cpu --mpi_message_bytes 65280 100 \
  'rank 1 was started with --mpi_message_bytes=100 but rank 0 with 65280'
if [[ -x build/emu-fp32/train_gpt ]]; then
  mismatch emu-momentum-domain build/emu-fp32/train_gpt --demo_momentum_domain spatial dct \
    'rank 1 was started with --demo_momentum_domain="dct" but rank 0 with "spatial"'
else
  echo "(build/emu-fp32/train_gpt not built: the emulated CUDA trainer's check skipped)"
fi

[[ $failures -eq 0 ]] && echo "all switch checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
