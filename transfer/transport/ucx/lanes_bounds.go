// SPDX-License-Identifier: Apache-2.0

package ucx

import "github.com/kvxfer/kvxfer/native"

// Bounds and defaults of Config, here (no cgo) so that builds without cgo can name them.
const (
	// defaultLanes is Config.Lanes' default where GOMAXPROCS allows it.
	defaultLanes = 4
	// MaxLanes bounds Config.Lanes: each lane is a worker and an OS thread.
	MaxLanes = 64
	// DefaultStagingBytes is the default of Config.StagingBytes and DeviceConfig.StagingBytes:
	// room for the engine's default staging pool (transferdefaults.MaxConcurrent transfers of
	// transferdefaults.PipelineDepth slots of transferdefaults.SlotBytes; a test of package
	// transfer holds the two equal).
	DefaultStagingBytes = 64 * 2 * 4 << 20
)

// MaxTCPSegmentBytes bounds Config.TCPSegmentBytes: the receive buffer every transport of
// this package gives UCX's TCP transport (native.TCPReceiveSegmentBytes).
const MaxTCPSegmentBytes = native.TCPReceiveSegmentBytes
