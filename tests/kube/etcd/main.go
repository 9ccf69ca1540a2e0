// etcd, the server kube-apiserver stores in: go.etcd.io/etcd/server/v3's own entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
