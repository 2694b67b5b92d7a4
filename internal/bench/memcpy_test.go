// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMemcpyMeasuresEveryThreadCountAndRefusesBadSizes(t *testing.T) {
	var b bytes.Buffer
	res, err := Memcpy(context.Background(), MemcpyConfig{Bytes: 8 << 20, Piece: 1 << 20, Threads: 2, Rounds: 2}, &b)
	require.NoError(t, err)
	require.Len(t, res, 4)
	for i, r := range res {
		require.Equal(t, i%2+1, r.Threads)
		require.Positive(t, r.GBps)
	}
	require.Equal(t, 4, strings.Count(b.String(), "gbps="))
	for _, bad := range []MemcpyConfig{{Bytes: 0, Piece: 1, Threads: 1, Rounds: 1}, {Bytes: 10, Piece: 3, Threads: 1, Rounds: 1},
		{Bytes: 8, Piece: 8, Threads: 0, Rounds: 1}, {Bytes: 8, Piece: 8, Threads: 1, Rounds: 0}} {
		_, err := Memcpy(context.Background(), bad, &b)
		require.Error(t, err, "%+v", bad)
	}
}
