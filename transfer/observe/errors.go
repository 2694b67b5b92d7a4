// SPDX-License-Identifier: Apache-2.0

package observe

import "github.com/kvxfer/kvxfer/transfer"

// Errors of the package: the engine's, so one errors.Is matches a bad configuration of either.
var (
	// ErrInvalidConfig: a configuration field cannot work; the error is a *ConfigError
	// naming it (transfer.ErrInvalidConfig).
	ErrInvalidConfig = transfer.ErrInvalidConfig
)

// ConfigError names the configuration field that is wrong and how to fix it; Cause is an
// underlying error, such as a Prometheus registration error, or nil. It is
// transfer.ConfigError.
type ConfigError = transfer.ConfigError
