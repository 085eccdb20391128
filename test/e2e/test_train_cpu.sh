#!/usr/bin/env bash
# End-to-end trainer checks on the default corpus (see test/e2e/train_cpu_checks.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
data/prepare_default.sh >/dev/null
[[ -x eval_gpt ]] || make eval_gpt >/dev/null
exec /usr/bin/python3 test/e2e/train_cpu_checks.py
