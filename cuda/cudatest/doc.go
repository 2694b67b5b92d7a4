// SPDX-License-Identifier: Apache-2.0

// Package cudatest gives tests a *cuda.Runtime without a GPU: its CUDA calls are Go functions
// that move no bytes (device memory is addresses only) and succeed unless a Faults hook says
// otherwise, so the code above a GPU can be tested on its error paths, on any host.
package cudatest
