// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"errors"
	"fmt"
)

// Sentinel errors of the soak.
var (
	// ErrInvalidConfig: a Config field cannot work; the ConfigError names it.
	ErrInvalidConfig = errors.New("stress: invalid configuration")
	// ErrBreach: the soak ran and at least one invariant was broken; the Report lists them.
	ErrBreach = errors.New("stress: invariant breached")
)

// ConfigError names the Config field that cannot work and why. It matches ErrInvalidConfig.
type ConfigError struct {
	Field  string
	Value  any
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%v: %s = %v: %s", ErrInvalidConfig, e.Field, e.Value, e.Reason)
}

// Is maps the error onto ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }
