// SPDX-License-Identifier: Apache-2.0

// Command soak is `kvxbench stress` on its own: `go run ./internal/stress/soak --duration 60s
// --json`. See package stress for what it injects and checks.
package main
