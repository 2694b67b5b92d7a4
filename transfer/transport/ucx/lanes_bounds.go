// SPDX-License-Identifier: Apache-2.0

package ucx

import (
	"github.com/kvxfer/kvxfer/internal/transferdefaults"
	"github.com/kvxfer/kvxfer/native"
)

// Bounds and defaults of Config, here (no cgo) so that builds without cgo can name them.
const (
	// defaultLanes is Config.Lanes' default where GOMAXPROCS allows it.
	defaultLanes = 4
	// maxLanes bounds Config.Lanes: each lane is a worker and an OS thread.
	maxLanes = native.MaxLanes
	// defaultStagingBytes is the default of Config.StagingBytes and DeviceConfig.StagingBytes:
	// room for the engine's default staging pool (512 MiB: MaxConcurrent transfers of
	// PipelineDepth slots of SlotBytes, the engine's defaults).
	defaultStagingBytes = transferdefaults.MaxConcurrent * transferdefaults.PipelineDepth * transferdefaults.SlotBytes
)

// maxTCPSegmentBytes bounds Config.TCPSegmentBytes: the receive buffer every transport of
// this package gives UCX's TCP transport (native.TCPReceiveSegmentBytes).
const maxTCPSegmentBytes = native.TCPReceiveSegmentBytes
