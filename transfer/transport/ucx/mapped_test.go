// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// A peer's key and range are data: over shared memory, where the peer's pool is mapped here,
// a view (MapRemote) or a get (PostGet) of a range outside the pool the key names is refused
// as transport.ErrProtocol wrapping native.ErrOutOfBounds, whatever the peer declared (1 TiB
// over a 1 MiB pool, an address of this process's own, a range past the pool's end), and a
// key UCX could not safely unpack as ErrProtocol wrapping native.ErrBadRemoteKey; the pool
// itself still maps and reads. Over posix (procfs segments) and sysv (UCX's default).
func TestUCXMapped_APeersRangeOutsideItsPoolIsRefused(t *testing.T) {
	const n = 1 << 20
	for _, tr := range []struct{ name, tls string }{{"posix", "posix,cma,self"}, {"sysv", "sysv,cma,self"}} {
		t.Run(tr.name, func(t *testing.T) {
			a, b, _, rb := newUCXPair(t, tr.tls, "")
			pool, err := a.AllocatePool(n)
			require.NoError(t, err)
			fill(pool, 5)
			addr, key, err := a.RMAKey(pool)
			require.NoError(t, err)
			own, err := b.AllocatePool(n)
			require.NoError(t, err)
			ownAddr := uint64(uintptr(unsafe.Pointer(&own[0])))

			view, release, err := b.MapRemote(a.Self(), key, addr, n)
			require.NoError(t, err)
			require.Equal(t, pool, view, "the pool itself maps, every byte")
			release()

			bad := append([]byte(nil), key...)
			bad[8] = 0x7f // a memory type UCX does not know
			for _, c := range []struct {
				desc string
				key  []byte
				addr uint64
				n    int
				want error
			}{
				{"1 TiB over a 1 MiB pool", key, addr, 1 << 40, native.ErrOutOfBounds},
				{"an address of the reader's own", key, ownAddr, 4096, native.ErrOutOfBounds},
				{"from the pool's last page to past its end", key, addr + n - 4096, 8192, native.ErrOutOfBounds},
				{"a key UCX could not safely unpack", bad, addr, 4096, native.ErrBadRemoteKey},
			} {
				t.Run(c.desc, func(t *testing.T) {
					view, release, err := b.MapRemote(a.Self(), c.key, c.addr, c.n)
					require.ErrorIs(t, err, transport.ErrProtocol)
					require.ErrorIs(t, err, c.want)
					require.Nil(t, view)
					require.Nil(t, release)
					if c.n > len(own) {
						return // a get that large has nowhere to land here
					}
					id, err := post(t, rb, func(d func(transport.Completion)) (transport.OpID, error) {
						return b.PostGet(a.Self(), transport.Tag{Request: 9, Seq: 1}, c.key, c.addr, own[:c.n], d)
					})
					if err == nil {
						cs := awaitCMAFinal(t, rb, id)
						require.Len(t, cs, 1)
						err = cs[0].Err
					}
					require.ErrorIs(t, err, transport.ErrProtocol)
					require.ErrorIs(t, err, c.want)
				})
			}
		})
	}
}
