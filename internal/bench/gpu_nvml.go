// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package bench

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kvxfer/kvxfer/cuda/gpuinfo"
)

// nvmlLib is the NVML the device choice asks; tests put go-nvml's mock machines here.
var nvmlLib = func() nvml.Interface { return nvml.New() }

// discoverGPUs reads the host's GPUs through cuda/gpuinfo. A missing driver is ErrNoNVML.
func discoverGPUs() (HostGPUs, error) {
	topo, err := gpuinfo.Discover(nvmlLib())
	switch {
	case errors.Is(err, gpuinfo.ErrNVMLNotFound):
		return HostGPUs{}, fmt.Errorf("%w (the NVIDIA driver's libnvidia-ml.so.1 is not installed: %v)", ErrNoNVML, err)
	case err != nil:
		return HostGPUs{}, err
	}
	host := HostGPUs{Driver: topo.Driver}
	for _, g := range topo.GPUs {
		host.GPUs = append(host.GPUs, GPU{Index: g.Index, Name: g.Name, UUID: g.UUID, PCIBusID: g.PCIBusID,
			Driver: topo.Driver, MemoryBytes: g.MemoryTotal, FreeBytes: g.MemoryFree,
			ComputeCapability: fmt.Sprintf("%d.%d", g.ComputeMajor, g.ComputeMinor), NVLinks: g.NVLinks})
	}
	for i := range topo.Links {
		for j := i + 1; j < len(topo.Links[i]); j++ {
			if topo.Links[i][j].NVLink {
				host.NVLinkPairs++
			}
		}
	}
	return host, nil
}
