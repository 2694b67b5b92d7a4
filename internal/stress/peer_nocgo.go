// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package stress

import (
	"fmt"
	"os"
)

// PeerEnv names the environment variable that turns a soak binary into a peer process of a
// --processes soak.
const PeerEnv = "KVXSTRESS_PEER"

// RunPeerFromEnv, in a build without cgo, has no UCX transport to serve a peer with: when
// PeerEnv is set it says so and returns exit code 2 and true; otherwise false at once.
func RunPeerFromEnv() (int, bool) {
	if os.Getenv(PeerEnv) == "" {
		return 0, false
	}
	fmt.Fprintln(os.Stderr, "stress peer: this binary was built without cgo, so without the UCX transport a peer needs")
	return 2, true
}
