// Command pause is the sandbox ("pause") container of the test node's pods: it holds the
// pod's namespaces and exits on SIGINT or SIGTERM. It is packed into an image by
// hack/image.sh and tagged as the CRI sandbox image of the test node's containerd.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
}
