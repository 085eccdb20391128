#!/usr/bin/env bash
# Checks scripts/compare_runs.py (plots, table values, torn lines, errors) on synthetic run folders; see
# test/e2e/compare_runs_checks.py. Needs Debian's /usr/bin/python3 with matplotlib.
set -euo pipefail
cd "$(dirname "$0")/../.."
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || { echo "SKIP: /usr/bin/python3 has no matplotlib"; exit 77; }
exec /usr/bin/python3 test/e2e/compare_runs_checks.py
