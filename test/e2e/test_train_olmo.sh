#!/usr/bin/env bash
# The OLMo family end to end on the CPU trainer and tools (see test/e2e/olmo_cpu_checks.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
data/prepare_default.sh >/dev/null
[[ -x eval_gpt && -x sample_gpt ]] || make eval_gpt sample_gpt >/dev/null
exec /usr/bin/python3 test/e2e/olmo_cpu_checks.py
