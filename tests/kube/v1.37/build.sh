#!/bin/sh
# Builds kube-apiserver from the k8s.io/kubernetes release this module pins (the first that serves
# EvictionRequest, KEP-4563), as `go install` would, into a per-user cache keyed by that version,
# only when it is missing. Prints the directory that holds it. Nothing is downloaded but Go
# modules. Opt-in: only the tests of that API run it (tests/support/kube.py, `apiserver_137`);
# the suite's own control plane is ../build.sh's, and etcd comes from there.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
if ! command -v go >/dev/null 2>&1; then
	echo "tests/kube/v1.37/build.sh: no Go toolchain on PATH (Go 1.26 or later builds kube-apiserver)" >&2
	exit 1
fi
kubernetes=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/rebalancer
dir="$cache/kube/kube-apiserver-$kubernetes"
if [ -x "$dir/kube-apiserver" ]; then
	echo "$dir"
	exit 0
fi
echo "building kube-apiserver $kubernetes into $dir (once; minutes)" >&2
mkdir -p "$dir"
# Two test workers may ask at once: each builds into a directory of its own, the first to finish
# moves its binary in, and a move is atomic.
work=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
# What Kubernetes' own build stamps in (hack/lib/version.sh), so /version names the release.
minor=${kubernetes#v1.}
minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	stamp="$stamp -X $pkg.gitVersion=$kubernetes -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	stamp="$stamp -X $pkg.gitTreeState=clean"
done
go build -buildvcs=false -trimpath -ldflags "$stamp" -o "$work/kube-apiserver" \
	k8s.io/kubernetes/cmd/kube-apiserver
mv "$work/kube-apiserver" "$dir/"
echo "$dir"
