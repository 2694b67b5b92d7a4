// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every outcome below CancelOutcomeCount has a name of its own (the metrics label their
// series with it), and nothing at or past the count does: an outcome added without a name,
// or after the count, fails here.
func TestCancelOutcomes_EveryOneNamed(t *testing.T) {
	require.Len(t, outcomeNames, int(CancelOutcomeCount), "one name per outcome")
	seen := map[string]CancelOutcome{}
	for o := range CancelOutcomeCount {
		name := o.String()
		require.NotEqual(t, fmt.Sprintf("cancel-outcome(%d)", int(o)), name, "outcome %d has no name", int(o))
		prev, dup := seen[name]
		require.False(t, dup, "outcomes %d and %d share the name %q", int(prev), int(o), name)
		seen[name] = o
	}
	require.Equal(t, fmt.Sprintf("cancel-outcome(%d)", int(CancelOutcomeCount)), CancelOutcomeCount.String(), "the count is no outcome")
	require.False(t, CancelOutcomeCount.FreeNow())
}
