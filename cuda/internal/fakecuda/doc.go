// SPDX-License-Identifier: Apache-2.0

// Package fakecuda is the seam between package cuda and package cudatest: cuda fills
// NewRuntime when it is linked in, so cudatest can hand tests a *cuda.Runtime whose CUDA
// calls are Go functions, without package cuda exporting a way to build one.
package fakecuda
