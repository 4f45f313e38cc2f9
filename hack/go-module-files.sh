#!/usr/bin/env bash
# Copies files a Go module publishes with its code (prometheus-operator's CRDs) into bin/, at the version a
# module under hack/ requires (its go.sum pins the hash): downloaded into the builds' module cache under .cache/,
# so that a second run needs no network.
#
# usage: hack/go-module-files.sh MODULE_DIR MODULE SOURCE_DIR OUTPUT...
#   each OUTPUT is a path under the checkout, a copy of the file of its name in the module's SOURCE_DIR
set -euo pipefail

source "$(dirname "$0")/go-env.sh"
module_dir=$1 module=$2 source_dir=$3
shift 3

cd "$root/$module_dir"
echo "==> $module: downloading the version $module_dir/go.mod requires (into .cache/gomod)"
"$go" mod download "$module"
dir=$("$go" list -m -f '{{.Dir}}' "$module")
for output; do
    # the module cache's files are read-only: a copy the next run can replace
    install -D -m 644 "$dir/$source_dir/$(basename "$output")" "$root/$output"
    echo "==> $output: from $(basename "$dir")/$source_dir"
done
