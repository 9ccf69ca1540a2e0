//go:build tools

// The servers the suite runs against, built from their published modules as `go install` would
// build them (build.sh): kube-apiserver from k8s.io/kubernetes, etcd from its server module at
// the version Kubernetes itself pins.
package kube

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
