// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

func llamaPool(heads int64) layout.Layout {
	return layout.Packed(layout.Dims{NumLayers: 4, KVFactor: 2, NumHeads: heads, HeadDim: 128, ElemSize: 2,
		TokensPerBlock: 32, NumBlocks: 8}, layout.BlockMajor)
}

func TestCheckHello(t *testing.T) {
	decode := hello{Magic: controlMagic, Version: controlVersion, Role: roleDecode, Layout: llamaPool(8), TP: 1}
	prefill := hello{Magic: controlMagic, Version: controlVersion, Role: rolePrefill, Layout: llamaPool(8), TP: 1}
	with := func(h hello, f func(*hello)) hello { f(&h); return h }
	otherDType := llamaPool(8)
	otherDType.ElemSize = 1
	otherDType = layout.Packed(otherDType.Dims(), layout.BlockMajor)
	cases := []struct {
		desc   string
		theirs hello
		want   error
		msg    string
	}{
		{"same layout", prefill, nil, ""},
		{"same stream, other strides", with(prefill, func(h *hello) { h.Layout = layout.Packed(h.Layout.Dims(), layout.LayerMajorNHD) }), nil, ""},
		{"TP=2 rank 1 into TP=1", with(prefill, func(h *hello) { h.Layout = llamaPool(4); h.TP, h.Rank = 2, 1 }), nil, ""},
		{"not kvxbench", with(prefill, func(h *hello) { h.Magic = "HTTP/1.1" }), errPeerNotKvxbench, `magic "HTTP/1.1"`},
		{"other version", with(prefill, func(h *hello) { h.Version = controlVersion + 1 }), errPeerVersion, "it speaks version 4, this kvxbench speaks 3"},
		{"same role", with(prefill, func(h *hello) { h.Role = roleDecode }), errPeerIncompatible, "both ends are decode"},
		{"other element size", with(prefill, func(h *hello) { h.Layout = otherDType }), errPeerIncompatible, "ElemSize"},
		{"half the heads without TP", with(prefill, func(h *hello) { h.Layout = llamaPool(4) }), errPeerIncompatible, "Heads"},
		{"TP=3 does not split", with(prefill, func(h *hello) { h.Layout = llamaPool(4); h.TP = 3 }), errPeerIncompatible, "do not split over 3"},
		{"invalid layout", with(prefill, func(h *hello) { h.Layout.HeadDim = 0 }), errPeerIncompatible, "HeadDim"},
		{"a cluster key on one end only", with(prefill, func(h *hello) { h.KeyID = "0011223344556677" }), errPeerIncompatible, "only one end holds a cluster key"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			err := checkHello(decode, tc.theirs)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.msg)
		})
	}
	// TP=1->2: each decode rank holds half the heads and takes its half of the prefill pool's.
	for _, tc := range []struct {
		desc string
		ours hello
		msg  string
	}{
		{"TP=1 into a TP=2 rank", with(decode, func(h *hello) { h.Layout = llamaPool(4); h.TP, h.Rank = 2, 1 }), ""},
		{"a TP=2 rank that holds every head", with(decode, func(h *hello) { h.TP = 2 }), "Heads"},
		{"TP=3 does not split", with(decode, func(h *hello) { h.Layout = llamaPool(4); h.TP = 3 }), "do not split over 3"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := checkHello(tc.ours, prefill)
			if tc.msg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, errPeerIncompatible)
			require.ErrorContains(t, err, tc.msg)
		})
	}
	keyed := with(decode, func(h *hello) { h.KeyID = "0011223344556677" })
	for _, tc := range []struct {
		desc   string
		theirs hello
		want   error
		msg    string
	}{
		{"the same cluster key", with(prefill, func(h *hello) { h.KeyID = keyed.KeyID }), nil, ""},
		{"another cluster key", with(prefill, func(h *hello) { h.KeyID = "8899aabbccddeeff" }), errPeerIncompatible, "different cluster keys"},
		{"no cluster key", prefill, errPeerIncompatible, "only one end holds a cluster key"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := checkHello(keyed, tc.theirs)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// Both ends of a refused hello learn why.
func TestHelloRefusalReachesBothEnds(t *testing.T) {
	a, b := tcpPair(t)
	ca, cb := newControl(a, 2*time.Second), newControl(b, 2*time.Second)
	defer ca.Close()
	defer cb.Close()
	done := make(chan error, 1)
	go func() {
		_, err := cb.exchangeHello(hello{Role: rolePrefill, Layout: llamaPool(4), TP: 1})
		if err == nil {
			_, err = cb.recvMessage(0)
		}
		done <- err
	}()
	_, err := ca.exchangeHello(hello{Role: roleDecode, Layout: llamaPool(8), TP: 1})
	require.ErrorIs(t, err, errPeerIncompatible)
	select {
	case err := <-done:
		require.ErrorIs(t, err, errPeerIncompatible)
	case <-time.After(5 * time.Second):
		t.Fatal("the other end never heard of the refusal")
	}
}

// A peer that accepts the connection and says nothing is an error after the timeout; one that
// speaks another protocol is named as such.
func TestSilentOrForeignPeer(t *testing.T) {
	cases := []struct {
		desc string
		says string
		want error
	}{
		{"silent", "", errPeerUnreachable},
		{"foreign", "SSH-2.0-OpenSSH_9.2\r\n", errPeerNotKvxbench},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					close(accepted)
					return
				}
				if tc.says != "" {
					_, _ = conn.Write([]byte(tc.says))
				}
				accepted <- conn
			}()
			c, err := dialControl(ln.Addr().String(), 300*time.Millisecond)
			require.NoError(t, err)
			defer c.Close()
			start := time.Now()
			_, err = c.exchangeHello(hello{Role: roleDecode, Layout: llamaPool(8), TP: 1})
			require.ErrorIs(t, err, tc.want)
			// The peer holds the connection open until the test ends: without the 300ms bound
			// this would not return. 10s leaves room for a loaded host's stall.
			require.Less(t, time.Since(start), 10*time.Second)
			if conn, ok := <-accepted; ok {
				conn.Close()
			}
		})
	}
}

// tcpPair returns the two ends of a loopback TCP connection (net.Pipe does not buffer, and
// both ends of a hello write before they read).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- conn
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	b, ok := <-accepted
	require.True(t, ok)
	return a, b
}
