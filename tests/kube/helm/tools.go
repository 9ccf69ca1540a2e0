//go:build tools

// Helm, which installs the chart on a real control plane in the suite, built from its published
// module as `go install` would (build.sh). A module of its own: Helm pins its Kubernetes
// libraries at other versions than the servers' module does.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
