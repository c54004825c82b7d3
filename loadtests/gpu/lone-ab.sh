#!/usr/bin/env bash
# An A/B of settings for a lone request on the fast engine alone (loadtests.profile through
# run.sh fast-profile), one variant after another on one machine, each with the decode batch
# capped at MAX_ROWS rows (default 16: fewer graphs to compile, and a lone request's step is
# the same). Each variant is NAME:SETTINGS, the settings space-separated NAME=VALUE pairs
# (none for the baseline); its report lands in OUT/NAME/fast-profile.json.
# Usage: OUT=results bash loadtests/gpu/lone-ab.sh base: no-pdl:HYMT_FAST_PDL=off ...
set -uo pipefail
out=${OUT:?set OUT}
for spec in "$@"; do
  name=${spec%%:*}; settings=${spec#*:}
  echo "=== lone-ab $name: ${settings:-defaults}"
  # shellcheck disable=SC2086  # the settings are meant to split into NAME=VALUE words
  env $settings HYMT_FAST_MAX_ROWS="${MAX_ROWS:-16}" REQUESTS="${REQUESTS:-16}" OUT="$out/$name" \
    bash loadtests/gpu/run.sh fast-profile
done
