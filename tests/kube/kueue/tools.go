//go:build tools

// Kueue's manager, built from its published module as `go install` would, for the tests that
// run Kueue against the real control plane (tests/kube/build.sh). A module of its own: Kueue
// pins its Kubernetes libraries at other versions than the servers' module does.
package kueue

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
