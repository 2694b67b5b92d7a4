// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"errors"

	"github.com/kvxfer/kvxfer/transfer"
)

// Sentinel errors of the soak.
var (
	// ErrInvalidConfig: a Config field cannot work; the ConfigError names it. It is the
	// engine's (transfer.ErrInvalidConfig).
	ErrInvalidConfig = transfer.ErrInvalidConfig
	// ErrBreach: the soak ran and at least one invariant was broken; the Report lists them.
	ErrBreach = errors.New("stress: invariant breached")
)

// ConfigError names the Config field that cannot work and why. It matches ErrInvalidConfig:
// it is transfer.ConfigError.
type ConfigError = transfer.ConfigError
