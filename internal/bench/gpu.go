// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
)

// DeviceAuto is --device auto: the GPU with the most free memory, as NVML reports it.
const DeviceAuto = -1

// GPU is a device as NVML (package cuda/gpuinfo) describes it. A --memory device run's
// results carry the GPU they ran on in env.gpu.
type GPU struct {
	// Index is NVML's index, which is the CUDA ordinal once CUDA numbers devices by PCI bus
	// id (ChooseDevice sees to it).
	Index    int    `json:"index"`
	Name     string `json:"name"`
	UUID     string `json:"uuid,omitempty"`
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// Driver is the NVIDIA driver's version.
	Driver      string `json:"driver,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes"`
	FreeBytes   uint64 `json:"free_bytes"`
	// ComputeCapability is such as "9.0".
	ComputeCapability string `json:"compute_capability,omitempty"`
	NVLinks           int    `json:"nvlinks"`
}

// HostGPUs is what `kvxbench devices` prints: the driver and every GPU.
type HostGPUs struct {
	Driver string `json:"driver"`
	GPUs   []GPU  `json:"gpus"`
	// NVLinkPairs counts the GPU pairs joined by NVLink.
	NVLinkPairs int `json:"nvlink_pairs"`
}

// ErrNoNVML means NVML cannot be asked: the NVIDIA driver is not installed, or this build of
// kvxbench has no cgo (go-nvml needs it).
var ErrNoNVML = errors.New("no NVML on this host")

// ChooseDevice resolves --device for a --memory device run: an ordinal (0 or more) as given,
// or DeviceAuto for the GPU with the most free memory. It returns the CUDA ordinal and the GPU
// as NVML describes it. Without NVML, or where CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER
// renumber CUDA's devices so NVML's indices do not name them, it goes on without a
// description (auto takes device 0) and returns a note, one line, that says why: the caller
// prints it once the device has opened (CheckDeviceRun, CheckDeviceGather), since a host where
// CUDA fails too is better told CUDA's one line. An ordinal NVML does not list is a
// UsageError.
//
// NVML numbers GPUs by PCI bus id; so that CUDA's ordinals agree, ChooseDevice sets
// CUDA_DEVICE_ORDER=PCI_BUS_ID in this process (and so in the peers it starts) before CUDA
// is opened.
func ChooseDevice(device int) (ordinal int, gpu *GPU, note string, err error) {
	if device < DeviceAuto {
		return 0, nil, "", Usagef("--device %d: give auto or a device ordinal, 0 or more", device)
	}
	ordinal = max(device, 0)
	vis, order := os.Getenv("CUDA_VISIBLE_DEVICES"), os.Getenv("CUDA_DEVICE_ORDER")
	if vis != "" || (order != "" && order != "PCI_BUS_ID") {
		if device == DeviceAuto {
			note = fmt.Sprintf("kvxbench: note: --device auto: CUDA_VISIBLE_DEVICES=%q CUDA_DEVICE_ORDER=%q renumber the GPUs; taking CUDA device 0", vis, order)
		}
		return ordinal, nil, note, nil
	}
	host, err := discoverGPUs()
	if err != nil {
		what := "--device auto"
		if device != DeviceAuto {
			what = fmt.Sprintf("--device %d", device)
		}
		return ordinal, nil, fmt.Sprintf("kvxbench: note: %s: %v; taking device %d, not described in the report", what, oneLineErr(err), ordinal), nil
	}
	if device >= len(host.GPUs) {
		return 0, nil, "", Usagef("--device %d: this host has %d GPUs (kvxbench devices lists them)", device, len(host.GPUs))
	}
	if device == DeviceAuto {
		if len(host.GPUs) == 0 {
			return 0, nil, "kvxbench: note: --device auto: NVML lists no GPU; taking device 0", nil
		}
		for i, g := range host.GPUs {
			if g.FreeBytes > host.GPUs[ordinal].FreeBytes {
				ordinal = i
			}
		}
	}
	if err := os.Setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID"); err != nil {
		return 0, nil, "", fmt.Errorf("--device: %w", err)
	}
	g := host.GPUs[ordinal]
	return ordinal, &g, "", nil
}

// ListDevices is `kvxbench devices`: the GPUs NVML reports, as a table or as one JSON object.
func ListDevices(out *Outputs, asJSON bool) error {
	host, err := discoverGPUs()
	if err != nil {
		return fmt.Errorf("devices: %w", err)
	}
	if asJSON {
		b, err := json.Marshal(host)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out.Stdout, "%s\n", b)
		return err
	}
	tw := tabwriter.NewWriter(out.Stdout, 0, 0, 2, ' ', 0)
	for _, g := range host.GPUs {
		fmt.Fprintf(tw, "GPU %d\t%s\t%s\t%s free\tsm %s\t%s\t%d NVLinks\n", g.Index, g.Name, humanBytes(int64(g.MemoryBytes)),
			humanBytes(int64(g.FreeBytes)), g.ComputeCapability, g.PCIBusID, g.NVLinks)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out.Stdout, "driver %s; %d GPUs, %d NVLink-connected pairs\n", host.Driver, len(host.GPUs), host.NVLinkPairs)
	return err
}

// oneLineErr keeps an error on one line (a loader's message may span several).
func oneLineErr(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
