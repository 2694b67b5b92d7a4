// SPDX-License-Identifier: Apache-2.0

//go:build !race

package transfer

// raceAllocs is what the race detector adds to a counted allocation (testing.AllocsPerRun).
const raceAllocs = 0
