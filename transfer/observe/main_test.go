// SPDX-License-Identifier: Apache-2.0

package observe_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: an engine not closed, a
// server not shut down, a wait that never ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
