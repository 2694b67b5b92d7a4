// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// Which transport lists count as TCP only, the ones that open UCX without RMA unless
// Config.ServeEmulatedRMA says otherwise (docs/security.md).
func TestUCXConfig_TCPOnlyTransportsOpenWithoutRMA(t *testing.T) {
	cases := []struct {
		tls     string
		tcpOnly bool
	}{
		{"tcp,self", true},
		{"tcp", true},
		{" TCP , self ", true},
		{"self", false},           // no TCP: nothing reaches it from outside the process
		{"posix,cma,self", false}, // shared memory gets: the RMA mode's native route
		{"posix,cma,tcp,self", false},
		{"sm,tcp", false},
		{"tcp,cuda_copy,cuda_ipc,self", false}, // device gets
		{"rc,tcp", false},
		{"^posix", false},
		{"all", false},
		{"", false}, // UCX's choice: every transport
	}
	for _, c := range cases {
		require.Equal(t, c.tcpOnly, tlsTCPOnly(c.tls), "TLS %q", c.tls)
	}
}

// A transport over TCP only serves no RMA by default: it says so (transport.RMAServing), and
// each of its RMA calls is refused at once with a *transport.ConfigError naming
// ServeEmulatedRMA, before UCX is asked; with ServeEmulatedRMA, or over shared memory, it
// keeps RMA. Its messages work either way (the conformance suite runs over it).
func TestUCXTransport_TCPOnlyServesNoRMAUnlessAsked(t *testing.T) {
	cases := []struct {
		desc   string
		tls    string
		dev    string
		serve  bool
		serves bool
	}{
		{"tcp only", "tcp,self", "lo", false, false},
		{"tcp only, ServeEmulatedRMA", "tcp,self", "lo", true, true},
		{"shared memory", "posix,cma,self", "", false, true},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			tr, err := newTransport(Config{TLS: c.tls, NetDevices: c.dev, StagingBytes: 1 << 20, CloseTimeout: 2 * time.Second,
				ProbeInterval: -1, ServeEmulatedRMA: c.serve})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, tr.Close(true)) })
			require.NoError(t, tr.Bind(nopInbound{}))
			require.Equal(t, c.serves, tr.ServesRMA())
			pool := tr.StagingMemory()[:4096]
			_, key, err := tr.RMAKey(pool)
			_, _, _, end, gerr := tr.ExposeGeneration()
			if c.serves {
				require.NoError(t, err)
				require.NoError(t, gerr)
				end()
				return
			}
			for what, err := range map[string]error{"RMAKey": err, "ExposeGeneration": gerr} {
				var ce *transport.ConfigError
				require.ErrorAs(t, err, &ce, what)
				require.Equal(t, "ucx.Config.ServeEmulatedRMA", ce.Field, what)
				require.ErrorIs(t, err, transport.ErrInvalidConfig, what)
			}
			called := false
			_, err = tr.PostGet(tr.Self(), transport.Tag{Request: 1}, key, 0, tr.StagingMemory()[4096:8192], func(transport.Completion) { called = true })
			require.ErrorIs(t, err, transport.ErrInvalidConfig)
			_, err = tr.PostReadGeneration(tr.Self(), transport.Tag{Request: 1}, key, 0, func(transport.Completion, uint64) { called = true })
			require.ErrorIs(t, err, transport.ErrInvalidConfig)
			require.ErrorIs(t, tr.PrepareKeys(tr.Self(), key), transport.ErrInvalidConfig)
			require.False(t, tr.DeviceGets())
			require.False(t, called, "a refused call reported a completion")
		})
	}
}
