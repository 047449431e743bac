#!/usr/bin/env bash
# Fails when a test skipped in a ctest run that is not allowed to skip there.
#   scripts/check-skips.sh CTEST_LOG ALLOWED_FILE
# ctest lists skipped tests under "The following tests did not run:" as
# "  123 - Suite.Name (Skipped)". ALLOWED_FILE names the tests that may skip,
# one per line, each with its reason after a '#'; blank lines and lines that
# start with '#' are ignored.
set -euo pipefail
log="$1"
allowed="$2"
mapfile -t skipped < <(sed -n 's/^[[:space:]]*[0-9]\+ - \([^ ]*\) (Skipped)$/\1/p' "$log")
bad=0
for t in "${skipped[@]}"; do
  if ! grep -Eq "^${t//./\\.}[[:space:]]+#[[:space:]]*[^[:space:]]" "$allowed"; then
    echo "check-skips: $t skipped, and $allowed does not allow it (with a reason)" >&2
    bad=1
  fi
done
if [[ $bad -ne 0 ]]; then exit 1; fi
echo "check-skips: ${#skipped[@]} skipped test(s), all allowed"
