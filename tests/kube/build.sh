#!/bin/sh
# Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, the kubelet and etcd
# from their published Go modules (the versions tests/kube/go.mod pins), kwok from its own (the
# version tests/kube/kwok/go.mod pins) and the real nodes' pod sandbox program (pause/), as
# `go install` would, into a per-user cache keyed by those versions, each only when it is
# missing. Prints the directory that holds the binaries. Nothing is downloaded but Go modules.
# Kueue's manager (the version tests/kube/kueue/go.mod pins) is built beside that directory, in
# kueue-<version>/ of its own (tests/support/kueue.py finds it there), so that neither the
# directory printed nor its key changes with Kueue.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
if ! command -v go >/dev/null 2>&1; then
	echo "tests/kube/build.sh: no Go toolchain on PATH (Go 1.26 or later builds kube-apiserver)" >&2
	exit 1
fi
kubernetes=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
kwok=$(cd kwok && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/rebalancer
dir="$cache/kube/kubernetes-$kubernetes-etcd-$etcd-kwok-$kwok"
kueue=$(cd kueue && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)
kueue_dir="$cache/kube/kueue-$kueue"
if [ ! -x "$kueue_dir/kueue" ]; then
	echo "building kueue $kueue into $kueue_dir (once; minutes)" >&2
	mkdir -p "$kueue_dir"
	(cd kueue && go build -buildvcs=false -trimpath -o "$kueue_dir/.kueue.build" \
		sigs.k8s.io/kueue/cmd/kueue)
	mv "$kueue_dir/.kueue.build" "$kueue_dir/kueue"
fi
# Helm (the version tests/kube/helm/go.mod pins), which installs the chart on a real plane, is
# built beside them in helm-<version>/ likewise (tests/support/helm.py finds it there).
helm=$(cd helm && go list -m -f '{{.Version}}' helm.sh/helm/v4)
helm_dir="$cache/kube/helm-$helm"
if [ ! -x "$helm_dir/helm" ]; then
	echo "building helm $helm into $helm_dir (once; minutes)" >&2
	mkdir -p "$helm_dir"
	(cd helm && go build -buildvcs=false -trimpath -o "$helm_dir/.helm.build" \
		-ldflags "-X helm.sh/helm/v4/internal/version.version=$helm" helm.sh/helm/v4/cmd/helm)
	mv "$helm_dir/.helm.build" "$helm_dir/helm"
fi
missing=""
for binary in kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet etcd kwok pause; do
	[ -x "$dir/$binary" ] || missing="$missing $binary"
done
if [ -z "$missing" ]; then
	echo "$dir"
	exit 0
fi
echo "building$missing ($kubernetes, etcd $etcd, kwok $kwok) into $dir (once; minutes)" >&2
mkdir -p "$dir"
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
for binary in $missing; do
	case $binary in
	etcd) go build -buildvcs=false -trimpath -o "$work/etcd" ./etcd ;;
	kwok) (cd kwok && go build -buildvcs=false -trimpath -o "$work/kwok" sigs.k8s.io/kwok/cmd/kwok) ;;
	pause) (cd pause && CGO_ENABLED=0 go build -buildvcs=false -trimpath -o "$work/pause" .) ;;
	*) go build -buildvcs=false -trimpath -ldflags "$stamp" -o "$work/$binary" \
		"k8s.io/kubernetes/cmd/$binary" ;;
	esac
	mv "$work/$binary" "$dir/"
done
echo "$dir"
