# Sourced by the scripts that run Go (go-build.sh, go-module-files.sh): one place for the toolchain check and
# the module and build caches under .cache/, so that every download and build of the project reuses them.
# Sets root (the checkout) and go (the toolchain, $GO or go on PATH).

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
go=${GO:-go}

command -v "$go" >/dev/null || {
    echo "$(basename "$0"): no Go toolchain at '$go': install Go (see go.mod for the version)" \
         "or run make GO=/path/to/go" >&2
    exit 1
}
export GOMODCACHE=$root/.cache/gomod GOCACHE=$root/.cache/gobuild GOPATH=$root/.cache/gopath
# Static binaries as in the upstream release builds; VCS stamping is off
# because the versions are stamped explicitly through LDFLAGS.
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
