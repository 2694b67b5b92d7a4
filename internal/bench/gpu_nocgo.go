// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package bench

import "fmt"

// discoverGPUs: go-nvml needs cgo, so this build cannot ask NVML.
func discoverGPUs() (HostGPUs, error) {
	return HostGPUs{}, fmt.Errorf("%w (this kvxbench was built without cgo, which go-nvml needs)", ErrNoNVML)
}
