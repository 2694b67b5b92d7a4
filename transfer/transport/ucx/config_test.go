// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/native"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

func TestUCXConfig_TCPSegmentBytesBounded(t *testing.T) {
	for _, n := range []int64{-1, 4 << 10, native.TCPReceiveSegmentBytes + 1} {
		_, err := newTransport(Config{TLS: "tcp,self", StagingBytes: 1 << 20, TCPSegmentBytes: n})
		var ce *transport.ConfigError
		require.ErrorAs(t, err, &ce, "segment %d", n)
		require.Equal(t, "ucx.Config.TCPSegmentBytes", ce.Field)
	}
}

func TestUCXConfig_ShmFIFOSizeBounded(t *testing.T) {
	for _, n := range []int{-64, 32, 100, 32768} {
		_, err := newTransport(Config{TLS: "posix,self", StagingBytes: 1 << 20, ShmFIFOSize: n})
		var ce *transport.ConfigError
		require.ErrorAs(t, err, &ce, "FIFO %d", n)
		require.Equal(t, "ucx.Config.ShmFIFOSize", ce.Field)
	}
}
