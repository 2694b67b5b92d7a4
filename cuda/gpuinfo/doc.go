// SPDX-License-Identifier: Apache-2.0

// Package gpuinfo discovers the GPUs of a host through NVML (github.com/NVIDIA/go-nvml): their
// memory, PCIe bus ids, NVLink and peer-to-peer reachability. kvxfer uses it to choose where
// staging slots live and to describe the machine in benchmark output.
//
// Discovery takes an nvml.Interface, so tests run on go-nvml's mock machines (a DGX H100)
// without a GPU; on a host without the NVIDIA driver it returns ErrNVMLNotFound, and callers
// fall back to host memory.
package gpuinfo
