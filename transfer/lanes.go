// SPDX-License-Identifier: Apache-2.0

package transfer

// Lanes of UCXConfig (ucx_lanes.go), here so that builds without cgo can name the bounds.
const (
	// DefaultUCXLanes is UCXConfig.Lanes' default where GOMAXPROCS allows it.
	DefaultUCXLanes = 4
	// MaxUCXLanes bounds UCXConfig.Lanes: each lane is a worker and an OS thread.
	MaxUCXLanes = 64
)
