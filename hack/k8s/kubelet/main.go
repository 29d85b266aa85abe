// Command kubelet builds the upstream kubelet from the k8s.io/kubernetes Go module, for
// catalogsync's deployment tests: it runs the pods of deploy/ on a real node (containerd and
// runc) inside a network namespace the test creates.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	command := app.NewKubeletCommand(context.Background())
	os.Exit(cli.Run(command))
}
