// Command kube-apiserver builds the upstream kube-apiserver from the
// k8s.io/kubernetes Go module, for catalogsync's test control planes.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	os.Exit(cli.Run(command))
}
