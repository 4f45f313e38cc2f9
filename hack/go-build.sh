#!/usr/bin/env bash
# Builds one Go program from a module under hack/ into bin/, with the module
# and build caches under .cache/ so that later builds reuse them. A cold
# build of the control plane compiles a few thousand packages and takes many
# minutes on a small machine; this prints where it is so it never looks hung.
#
# usage: hack/go-build.sh MODULE_DIR PACKAGE OUTPUT [LDFLAGS]
set -euo pipefail

source "$(dirname "$0")/go-env.sh"
module_dir=$1 package=$2 output=$3 ldflags=${4:-}
name=$(basename "$output")

start=$SECONDS
cd "$root/$module_dir"
echo "==> $name: resolving packages (downloads missing modules into .cache/gomod)"
# Dependencies first, then the program itself; "true" marks a package that is
# not in the build cache yet (-trimpath as in the build, or none would be).
mapfile -t listed < <("$go" list -trimpath -deps -f '{{if ne .Name "main"}}{{.Stale}} {{.ImportPath}}{{end}}' \
    "$package" | grep .)
deps=("${listed[@]#* }")
total=$((${#deps[@]} + 1))
# Disk, checked before minutes of compiling rather than by the compiler's "no
# space left on device" halfway: each package compiled adds about 1.4 MiB to
# the build cache (3.5 GiB for the control plane's 2,660), and a batch's work
# folder in the temp dir takes up to about 300 MiB while it runs.
stale=$(printf '%s\n' "${listed[@]}" | grep -c '^true ' || true)
mkdir -p "$GOCACHE"
declare -A need_mib=() where=()
needs() {
    local dev; dev=$(stat -c %d "$1")
    need_mib[$dev]=$((${need_mib[$dev]:-0} + $2)) where[$dev]=${where[$dev]:-$1}
}
needs "$GOCACHE" $((stale * 14 / 10))
needs "${GOTMPDIR:-${TMPDIR:-/tmp}}" 300
for dev in "${!need_mib[@]}"; do
    free=$(df -Pm "${where[$dev]}" | awk 'NR == 2 {print $4}')
    if ((free < need_mib[$dev])); then
        echo "go-build: warning: $name needs about ${need_mib[$dev]} MiB free on the disk of ${where[$dev]}" \
             "($stale packages to compile), $free MiB are free: free some space first, or the compiler" \
             "will stop with 'no space left on device'" >&2
    fi
done
echo "==> $name: compiling with $("$go" env GOVERSION) ($total packages, cached ones are skipped)"
# One `go build` keeps a copy of every package it compiles in its work folder
# (under /tmp) until it exits: for the control plane, 2.9 GiB beside the
# build cache at the end. The dependencies are compiled in batches instead (a
# batch's work folder goes when it exits; the results stay in the cache), and
# the final build only links. `go build -v` names each package it compiles:
# that is turned into a count, and every other line (compiler errors) passes
# through unchanged.
{
    printf '%s\n' "${deps[@]}" | xargs -n 250 "$go" build -v -trimpath
    "$go" build -v -trimpath -ldflags "-s -w $ldflags" -o "$root/$output" "$package"
} 2>&1 |
    awk -v total="$total" -v name="$name" -v start="$(date +%s)" '
        /^[^ :#]+$/ { if (++n % 250 == 0) printf "    %s: %d/%d packages compiled (%ds)\n", name, n, total, systime() - start; fflush(); next }
        { print; fflush() }'
echo "==> $name: built $output ($(du -m "$root/$output" | cut -f1) MiB) in $((SECONDS - start))s"
