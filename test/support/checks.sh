# Helpers for the script tests that print one line per check (sourced): pass, fail and check print it and count
# the failures in $failures; expect_error runs a command that must be refused. The sourcing script sets $tmp (a
# scratch directory) before calling expect_error.
failures=0
pass() { echo "ok    $*"; }
fail() { echo "FAIL  $*"; failures=$((failures + 1)); }
# check DESCRIPTION COMMAND...: passes when the command succeeds.
check() {
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

# expect_error NEEDLE COMMAND...: the command must exit 1 with exactly one stderr line, "error: ..." naming NEEDLE.
expect_error() {
  local needle=$1
  shift
  "$@" >/dev/null 2>"$tmp/stderr"
  local rc=$?
  if [[ $rc -eq 1 && $(grep -c . "$tmp/stderr") -eq 1 ]] && grep -qF "error: " "$tmp/stderr" &&
     grep -qF -- "$needle" "$tmp/stderr"; then
    pass "rejects: $(cat "$tmp/stderr")"
  else
    fail "expected exit 1 and one error line naming '$needle' from: $* (exit $rc, stderr: $(head -c 300 "$tmp/stderr"))"
  fi
}
