// Command etcd builds the upstream etcd server from its Go module, for
// catalogsync's test control planes.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
