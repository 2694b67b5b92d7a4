// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// countingUCX is a ucx.Transport that counts the two ways of reading a chunk or a pool's
// ranges: gets, and views of the peer's memory mapped here (not of its generation word).
type countingUCX struct {
	ucxImpl
	gets, maps atomic.Int64
}

func (c *countingUCX) PostGet(from Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	c.gets.Add(1)
	return c.ucxImpl.PostGet(from, tag, key, addr, dst, done)
}

func (c *countingUCX) MapRemote(from transport.Peer, key []byte, addr uint64, n int) ([]byte, func(), error) {
	v, release, err := c.ucxImpl.MapRemote(from, key, addr, n)
	if v != nil && n > 8 { // a chunk or a pool; the RMA receiver maps its 8-byte generation word too (rma_gen.go)
		c.maps.Add(1)
	}
	return v, release, err
}

func newCountingUCXEngine(t testing.TB, tls string, cfg Config) (*ucxEngine, *countingUCX) {
	t.Helper()
	cfg = cfg.withDefaults()
	cfg.Tuning.NumSlots = cfg.MaxConcurrent * cfg.Tuning.PipelineDepth
	tr, err := ucx.New(ucx.Config{TLS: tls, KeepaliveInterval: 200 * time.Millisecond,
		StagingBytes: int64(cfg.Tuning.NumSlots) * cfg.SlotBytes, CloseTimeout: 2 * time.Second, ServeEmulatedRMA: cfg.Tuning.RMAWhereEmulated})
	require.NoError(t, err)
	c := &countingUCX{ucxImpl: ucxOf(tr)}
	cfg.StagingMemory = tr.StagingMemory()
	e, err := New(c, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return &ucxEngine{tr: tr, e: e}, c
}

// Over UCX shared memory the pull wire's receiver scatters each chunk straight out of the
// sender's slot, which the transport maps into its process: no get, every byte arrives, and
// every slot of both engines goes back. DisableInPlaceReads reads each chunk with a get
// instead; over TCP (gets emulated) the chunks are messages.
func TestUCXPull_ScatterReadsTheSendersSlotInPlace(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tc := range []struct {
		name, tls       string
		gets            bool
		inPlace, pulled bool
	}{
		{name: "shm", tls: "posix,cma,self", inPlace: true, pulled: true},
		{name: "shm/gets", tls: "posix,cma,self", gets: true, pulled: true},
		{name: "tcp", tls: "tcp,self"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.Tuning.DisableDirect, cfg.Tuning.DisableInPlaceReads = true, tc.gets
			src, _ := newCountingUCXEngine(t, tc.tls, cfg)
			dst, dc := newCountingUCXEngine(t, tc.tls, cfg)
			chunks := 0
			for i := range 3 {
				s := newUCXKV(t, dims, layout.BlockMajor, seqBlocks(0, 32), uint64(i+1))
				r := newUCXKV(t, dims, layout.Order(i%3), seqBlocks(0, 32), 0)
				hs, hr := startKV(t, src, dst, RequestID(10+i), s, r)
				waitQuiesced(t, hr, 20*time.Second)
				waitQuiesced(t, hs, 20*time.Second)
				require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
				require.Equal(t, Completed, hs.Status().State, "%v", hs.Status().Err)
				require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
				require.Equal(t, PathStaging, hr.Path())
				require.Equal(t, tc.pulled, hr.Pulled())
				chunks += hr.subs[0].nChunks
			}
			switch {
			case tc.inPlace:
				require.Zero(t, dc.gets.Load(), "a chunk read with a get")
				require.GreaterOrEqual(t, dc.maps.Load(), int64(chunks), "chunks read in place")
			case tc.pulled:
				require.Zero(t, dc.maps.Load())
				require.GreaterOrEqual(t, dc.gets.Load(), int64(chunks))
			default:
				require.Zero(t, dc.maps.Load()+dc.gets.Load())
			}
			for _, u := range []*ucxEngine{src, dst} {
				st := u.e.pool.Stats()
				require.Equal(t, st.Total, st.Free, "every slot back: %+v", st)
			}
		})
	}
}

// Over UCX shared memory the RMA receiver copies the ranges out of the sender's pool, which
// the transport maps into its process, instead of posting gets; over TCP nothing is mapped and
// the ranges are gets (RMAWhereEmulated keeps the RMA mode there).
func TestUCXRMA_ReadsTheOfferedPoolInPlace(t *testing.T) {
	dims := layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: 8, HeadDim: 64, ElemSize: 2, TokensPerBlock: 16, NumBlocks: 64}
	for _, tc := range []struct{ name, tls string }{{"shm", "posix,cma,self"}, {"tcp", "tcp,self"}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ucxTestConfig()
			cfg.Tuning.RMAMinRegionBytes, cfg.Tuning.RMAWhereEmulated = 64<<10, true
			src, _ := newCountingUCXEngine(t, tc.tls, cfg)
			dst, dc := newCountingUCXEngine(t, tc.tls, cfg)
			sb, rb := make([]int32, 21), make([]int32, 21)
			for j := range sb {
				sb[j], rb[j] = int32(j*3)%64, int32(63-j)
			}
			s := mappedKV(t, src, dims, layout.BlockMajor, sb, 23)
			r := mappedKV(t, dst, dims, layout.BlockMajor, rb, 0)
			hs, hr := startKV(t, src, dst, 31, s, r)
			waitQuiesced(t, hr, 20*time.Second)
			waitQuiesced(t, hs, 20*time.Second)
			require.Equal(t, Completed, hr.Status().State, "%v", hr.Status().Err)
			require.Equal(t, PathRMA, hr.Path())
			require.True(t, bytes.Equal(s.stream(t), r.stream(t)), "every byte")
			if tc.name == "shm" {
				require.Zero(t, dc.gets.Load(), "a range read with a get")
				require.Equal(t, int64(1), dc.maps.Load(), "the offered pool mapped once")
			} else {
				require.Zero(t, dc.maps.Load())
				require.NotZero(t, dc.gets.Load())
			}
		})
	}
}
