// The pod sandbox's process for the suite's real nodes: PID 1 of the pod, it waits for SIGINT or
// SIGTERM and reaps the children it inherits. Built by tests/kube/build.sh and imported as the
// node's pause image (tests/support/images.py): no registry is reached.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
