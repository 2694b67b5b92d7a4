// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"errors"
	"fmt"
)

// Errors of the package. *ConfigError maps onto ErrInvalidConfig.
var (
	// ErrInvalidConfig: a configuration field cannot work; the error is a *ConfigError
	// naming it.
	ErrInvalidConfig = errors.New("kvxfer/observe: invalid configuration")
)

// ConfigError names the configuration field that is wrong and how to fix it.
type ConfigError struct {
	// Field is the field's name, for example "MetricsConfig.Registerer".
	Field string
	// Reason says what is wrong and what to do instead.
	Reason string
	// Err is an underlying cause, such as a Prometheus registration error; may be nil.
	Err error
}

// Error names the field, the reason and the cause.
func (e *ConfigError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%v: %s: %s: %v", ErrInvalidConfig, e.Field, e.Reason, e.Err)
	}
	return fmt.Sprintf("%v: %s: %s", ErrInvalidConfig, e.Field, e.Reason)
}

// Is matches ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Unwrap returns the underlying cause, if any.
func (e *ConfigError) Unwrap() error { return e.Err }
