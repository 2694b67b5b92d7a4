// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"time"

	"github.com/kvxfer/kvxfer/transfer"
)

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

// What the tests reach of the unexported: the paths, the function adapter, the liveness rule,
// and the bounds a program keeps at their defaults.
const (
	HealthzPath = healthzPath
	LivezPath   = livezPath
	ReadyzPath  = readyzPath
	MetricsPath = metricsPath
)

// HealthFunc is healthFunc, to fake an engine's health.
type HealthFunc = healthFunc

// Live is live.
func Live(h transfer.Health) bool { return live(h) }

// WithMaxTracked is cfg remembering at most n live requests.
func WithMaxTracked(cfg MetricsConfig, n int) MetricsConfig {
	cfg.maxTracked = n
	return cfg
}

// WithLivenessTimeout is cfg whose /livez waits d for the engine's Health call.
func WithLivenessTimeout(cfg HandlerConfig, d time.Duration) HandlerConfig {
	cfg.livenessTimeout = d
	return cfg
}
