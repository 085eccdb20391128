#!/usr/bin/env bash
# The README's test command: on a fresh Debian 12 machine, install what the tests need (scripts/install_deps.sh:
# nothing when it is all there), then build everything and run every test (make test: the CUDA programs are built
# too wherever the toolkit is, and the GPU checks run on the emulated device). Exit status 0 when every test passed.
# Extra arguments go to make (e.g. JOBS=4).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
exec make test "$@"
