//go:build tools

// The servers the suite runs against, and the client it drives the emulator with, built from their
// published modules as `go install` would build them (build.sh): kube-apiserver, kube-scheduler,
// kube-controller-manager, kubectl and the kubelet from k8s.io/kubernetes, etcd from its server module at the
// version Kubernetes itself pins. KWOK has a module of its own (kwok/).
package kube

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
