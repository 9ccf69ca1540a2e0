//go:build tools

// KWOK, which plays the kubelets of fake nodes (tests/kube/stages), built from its published
// module as `go install` would (build.sh). A module of its own: KWOK pins its Kubernetes
// libraries at other versions than the servers' module does.
package kwok

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
