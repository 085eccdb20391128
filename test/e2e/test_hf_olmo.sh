#!/usr/bin/env bash
# A Hugging Face tokenizer.json to OLMo token files to training, sampling and evaluation (see
# test/e2e/hf_olmo_checks.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
data/prepare_default.sh >/dev/null
for target in train_gpt_cpu eval_gpt sample_gpt build/prepro_gpt2; do
  [[ -x $target ]] || make "$target" >/dev/null
done
/usr/bin/python3 -c "import numpy" 2>/dev/null || { echo "SKIP: /usr/bin/python3 cannot import numpy"; exit 77; }
exec /usr/bin/python3 test/e2e/hf_olmo_checks.py
