//go:build tools

// The servers the suite runs against, and the client it drives the emulator with, built from their
// published modules as `go install` would build them (build.sh): kube-apiserver and kubectl from
// k8s.io/kubernetes, etcd from its server module at the version Kubernetes itself pins.
package kube

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
