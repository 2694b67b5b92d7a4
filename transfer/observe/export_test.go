// SPDX-License-Identifier: Apache-2.0

package observe

// Tracked is (*Metrics).trackedCount for the tests: how many live requests m remembers.
func (m *Metrics) Tracked() int { return m.trackedCount() }

// The optional methods of transfer.Observer, as this package's observers implement them, for
// the tests to call them.
type (
	StartObserver = startObserver
	PeerObserver  = peerObserver
	TrustObserver = trustObserver
)

// HelloRefusalReasons are the reasons whose series Metrics creates up front.
var HelloRefusalReasons = helloRefusalReasons
