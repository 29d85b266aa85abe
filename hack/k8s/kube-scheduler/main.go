// Command kube-scheduler builds the upstream kube-scheduler from the k8s.io/kubernetes Go
// module, for catalogsync's deployment tests: it binds the pods of deploy/ to the test node.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	os.Exit(cli.Run(command))
}
