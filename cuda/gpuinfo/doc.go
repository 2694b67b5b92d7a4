// SPDX-License-Identifier: Apache-2.0

// Package gpuinfo discovers the GPUs of a host through NVML (github.com/NVIDIA/go-nvml): their
// memory, PCIe bus ids, NVLink and peer-to-peer reachability. kvxbench uses it to pick the GPU
// of a --memory device run (--device auto: the most free memory), to describe that GPU in its
// results (env.gpu), and to list the host's GPUs (kvxbench devices); Topology.StagingGPU is
// where staging slots would live when the KV's own GPU is full.
//
// Discovery takes an nvml.Interface, so tests run on go-nvml's mock machines (a DGX H100)
// without a GPU; on a host without the NVIDIA driver it returns ErrNVMLNotFound, and callers
// fall back to host memory.
package gpuinfo
