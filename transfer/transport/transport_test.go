// SPDX-License-Identifier: Apache-2.0

package transport

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A peer's short name is short, the same for the same peer, different for another, and a
// short peer id is itself.
func TestPeerShortNamesAreShortAndStable(t *testing.T) {
	long := Peer(strings.Repeat("ab", 100))
	other := Peer(strings.Repeat("ab", 99) + "ac")
	require.Len(t, long.Short(), len("peer-")+12)
	require.Equal(t, long.Short(), Peer(string(long)).Short())
	require.NotEqual(t, long.Short(), other.Short())
	require.Equal(t, "prefill", Peer("prefill").Short())
}
