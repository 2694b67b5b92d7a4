// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == cmaChildArg {
		os.Exit(runCMAChild(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// ucxTransports are the UCX transports the tests run over: shared memory, and TCP over
// loopback.
var ucxTransports = []struct{ name, tls, dev string }{
	{"shm", "posix,cma,self", ""},
	{"tcp", "tcp,self", "lo"},
}

// nopInbound ignores control messages and peer failures.
type nopInbound struct{}

func (nopInbound) OnControl(transport.Peer, []byte) {}
func (nopInbound) OnPeerLost(transport.Peer, error) {}
