// SPDX-License-Identifier: Apache-2.0

package peernames

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The table holds at most maxNames labels, each at most maxNameLen long, and the latest name
// given for a peer wins.
func TestRemember_BoundedAndLatestWins(t *testing.T) {
	for i := 0; i < maxNames+100; i++ {
		Remember(fmt.Sprintf("peer%d", i), fmt.Sprintf("worker-%d", i))
	}
	table.RLock()
	n := len(table.names)
	table.RUnlock()
	require.Equal(t, maxNames, n)
	last := fmt.Sprintf("peer%d", maxNames+99)
	name, ok := Name(last)
	require.True(t, ok)
	require.Equal(t, fmt.Sprintf("worker-%d", maxNames+99), name)

	Remember(last, strings.Repeat("x", 128))
	name, _ = Name(last)
	require.Len(t, name, maxNameLen)
	Remember("", "x")
	Remember("p", "")
	_, ok = Name("p")
	require.False(t, ok)
}
