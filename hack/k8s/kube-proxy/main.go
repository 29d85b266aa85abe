// Command kube-proxy builds the upstream kube-proxy from the k8s.io/kubernetes Go module, for
// catalogsync's deployment tests: in iptables mode it lets the test node's pods reach the
// apiserver through the `kubernetes` Service, as in-cluster clients do in production.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	command := app.NewProxyCommand()
	os.Exit(cli.Run(command))
}
