// SPDX-License-Identifier: Apache-2.0

// Package importcheck holds kvxfer's import rules and checks the repository against them: which
// folder may import which (imports point down the floors: layout, then cuda and native, then
// buffer, then transfer, then internal, cmd and examples), that only packages under native/
// use cgo, and that only packages under cuda/ import purego. Its test
// (TestRepository_ImportsPointDown, `make go-imports`, part of `make test`) loads the import
// graph with `go list` and fails with one line per offending import.
//
// A new top-level folder has no floor until it is added to Floors: the check names it.
package importcheck
