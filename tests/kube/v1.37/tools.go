//go:build tools

// The first release that serves EvictionRequest (KEP-4563, lifecycle.k8s.io/v1alpha1 behind the
// EvictionRequestAPI gate): kube-apiserver from k8s.io/kubernetes, built as `go install` would
// build it (build.sh). Opt-in: the suite's own control plane stays the release ../go.mod pins.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
