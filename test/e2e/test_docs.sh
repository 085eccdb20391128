#!/usr/bin/env bash
# The docs against the code: docs/cuda.md's table of the cuda and comm keys is exactly what build/config_table
# prints from the schema; README.md stays a page a newcomer reads (at most 170 lines); every relative Markdown link
# in README.md, docs/, test/ and dev/ names a file of the repository; and no doc points outside the repository.
set -uo pipefail
cd "$(dirname "$0")/../.."
source test/support/checks.sh
docs=(README.md $(git ls-files 'docs/*.md' 'test/*.md' 'dev/*.md' 2>/dev/null || ls docs/*.md))

if [[ -x build/config_table ]]; then
  want=$(build/config_table cuda comm)
  got=$(sed -n '/^<!-- config_table cuda comm -->$/,/^<!-- end config_table -->$/p' docs/cuda.md | sed '1d;$d')
  check "docs/cuda.md's table of the cuda and comm keys is build/config_table's output" test "$got" == "$want"
  [[ "$got" == "$want" ]] || diff <(echo "$want") <(echo "$got") | head -n 20 | sed 's/^/      /'
else
  echo "FAIL  build/config_table not built (make build/config_table)"; failures=$((failures + 1))
fi
lines=$(wc -l <README.md)
check "README.md is a short page ($lines lines, at most 170)" test "$lines" -le 170

broken=()
for doc in "${docs[@]}"; do
  dir=$(dirname "$doc")
  # [text](target) with a relative target: strip the #anchor, resolve from the doc's folder
  while IFS= read -r target; do
    path=${target%%#*}
    [[ -z $path || $path == http* || $path == mailto:* ]] && continue
    [[ -e "$dir/$path" ]] || broken+=("$doc -> $target")
  done < <(grep -o '\](\([^)]*\))' "$doc" | sed 's/^](\(.*\))$/\1/')
done
check "every relative link in the docs resolves (${#docs[@]} files)" test "${#broken[@]}" -eq 0
for b in "${broken[@]}"; do echo "      $b"; done
outside=$(grep -n '\.\./shared\|/work/' "${docs[@]}" | head -n 5)
check "no doc points outside the repository" test -z "$outside"
[[ -z $outside ]] || echo "$outside" | sed 's/^/      /'

[[ $failures -eq 0 ]] && echo "all docs checks passed" || echo "$failures check(s) failed"
[[ $failures -eq 0 ]]
