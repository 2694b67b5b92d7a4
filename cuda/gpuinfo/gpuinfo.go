// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package gpuinfo

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Sentinel errors of discovery.
var (
	// ErrNVMLNotFound: the NVML library (the NVIDIA driver) is not installed on this host.
	ErrNVMLNotFound = errors.New("kvxfer: NVML not found (no NVIDIA driver)")
	// ErrNVML: an NVML call failed; the *NVMLError says which and why.
	ErrNVML = errors.New("kvxfer: NVML call failed")
)

// NVMLError carries the failing call and its nvml.Return. It matches ErrNVMLNotFound when the
// library is missing and ErrNVML otherwise.
type NVMLError struct {
	Call   string
	Return nvml.Return
}

func (e *NVMLError) Error() string {
	return fmt.Sprintf("kvxfer: %s: %s", e.Call, nvml.ErrorString(e.Return))
}

// Is maps the return code onto the package's sentinels.
func (e *NVMLError) Is(target error) bool {
	if e.Return == nvml.ERROR_LIBRARY_NOT_FOUND || e.Return == nvml.ERROR_DRIVER_NOT_LOADED {
		return target == ErrNVMLNotFound
	}
	return target == ErrNVML
}

func check(call string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Call: call, Return: ret}
}

// GPU is one device as NVML reports it.
type GPU struct {
	Index        int
	UUID         string
	Name         string
	PCIBusID     string
	MemoryTotal  uint64 // bytes
	MemoryFree   uint64 // bytes
	ComputeMajor int
	ComputeMinor int
	NVLinks      int // active NVLink links
}

// Link is how two GPUs reach each other.
type Link struct {
	P2P    bool // peer-to-peer reads and writes work (over NVLink or PCIe)
	NVLink bool // they are joined by NVLink
}

// Topology is the host's GPUs and the links between every pair.
type Topology struct {
	Driver string
	GPUs   []GPU
	// Links[i][j] is how GPU i reaches GPU j; the diagonal is the zero Link.
	Links [][]Link
}

// Discover reads the host's GPUs and their links through lib (nvml.New() on a real host, a
// go-nvml mock in tests). It initialises and shuts NVML down around the reads.
func Discover(lib nvml.Interface) (Topology, error) {
	if err := check("nvmlInit", lib.Init()); err != nil {
		return Topology{}, err
	}
	defer lib.Shutdown()

	var topo Topology
	topo.Driver, _ = lib.SystemGetDriverVersion() // informational only
	n, ret := lib.DeviceGetCount()
	if err := check("nvmlDeviceGetCount", ret); err != nil {
		return Topology{}, err
	}
	devs := make([]nvml.Device, n)
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if err := check(fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d)", i), ret); err != nil {
			return Topology{}, err
		}
		g, err := describe(i, d)
		if err != nil {
			return Topology{}, err
		}
		devs[i] = d
		topo.GPUs = append(topo.GPUs, g)
	}
	topo.Links = make([][]Link, n)
	for i := range n {
		topo.Links[i] = make([]Link, n)
		for j := range n {
			if i == j {
				continue
			}
			topo.Links[i][j] = link(devs[i], devs[j])
		}
	}
	return topo, nil
}

func describe(i int, d nvml.Device) (GPU, error) {
	g := GPU{Index: i}
	var ret nvml.Return
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, check("nvmlDeviceGetUUID", ret)
	}
	if g.Name, ret = d.GetName(); ret != nvml.SUCCESS {
		return g, check("nvmlDeviceGetName", ret)
	}
	mem, ret := d.GetMemoryInfo()
	if err := check("nvmlDeviceGetMemoryInfo", ret); err != nil {
		return g, err
	}
	g.MemoryTotal, g.MemoryFree = mem.Total, mem.Free
	pci, ret := d.GetPciInfo()
	if err := check("nvmlDeviceGetPciInfo", ret); err != nil {
		return g, err
	}
	g.PCIBusID = busID(pci)
	g.ComputeMajor, g.ComputeMinor, _ = d.GetCudaComputeCapability()
	for l := range nvml.NVLINK_MAX_LINKS {
		state, ret := d.GetNvLinkState(l)
		if ret != nvml.SUCCESS {
			break // past the device's last link, or no NVLink at all
		}
		if state == nvml.FEATURE_ENABLED {
			g.NVLinks++
		}
	}
	return g, nil
}

// link asks NVML whether a can read from and write to b, and whether over NVLink. A query that
// fails means "no": a link we cannot confirm is a link we do not use.
func link(a, b nvml.Device) Link {
	ok := func(idx nvml.GpuP2PCapsIndex) bool {
		s, ret := a.GetP2PStatus(b, idx)
		return ret == nvml.SUCCESS && s == nvml.P2P_STATUS_OK
	}
	return Link{
		P2P:    ok(nvml.P2P_CAPS_INDEX_READ) && ok(nvml.P2P_CAPS_INDEX_WRITE),
		NVLink: ok(nvml.P2P_CAPS_INDEX_NVLINK),
	}
}

func busID(p nvml.PciInfo) string {
	var sb strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	if sb.Len() > 0 {
		return sb.String()
	}
	return fmt.Sprintf("%08x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
}

// StagingGPU picks where the staging slots for a KV pool on GPU kv should live, given that
// they need `need` bytes: on kv itself when it has the memory free (the gather then runs
// where the KV is), else on the NVLink peer of kv with the most free memory, else nowhere
// (-1: stage in host memory).
func (t Topology) StagingGPU(kv int, need uint64) int {
	if kv < 0 || kv >= len(t.GPUs) {
		return -1
	}
	if t.GPUs[kv].MemoryFree >= need {
		return kv
	}
	best := -1
	for j, g := range t.GPUs {
		if j == kv || !t.Links[kv][j].NVLink || !t.Links[kv][j].P2P || g.MemoryFree < need {
			continue
		}
		if best < 0 || g.MemoryFree > t.GPUs[best].MemoryFree {
			best = j
		}
	}
	return best
}

// String is a short description for logs and benchmark headers.
func (t Topology) String() string {
	if len(t.GPUs) == 0 {
		return "no GPUs"
	}
	g := t.GPUs[0]
	nv := 0
	for i := range t.Links {
		for j := range t.Links[i] {
			if t.Links[i][j].NVLink {
				nv++
			}
		}
	}
	return fmt.Sprintf("%d x %s (%.0f GiB, sm_%d%d), %d NVLink-connected pairs, driver %s",
		len(t.GPUs), g.Name, float64(g.MemoryTotal)/(1<<30), g.ComputeMajor, g.ComputeMinor, nv/2, t.Driver)
}
