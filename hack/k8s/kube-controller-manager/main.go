// Command kube-controller-manager builds the upstream kube-controller-manager from the
// k8s.io/kubernetes Go module, for catalogsync's deployment tests: its Deployment,
// ReplicaSet, HorizontalPodAutoscaler and disruption controllers act on the manifests
// under deploy/ in the test KCP.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	os.Exit(cli.Run(command))
}
