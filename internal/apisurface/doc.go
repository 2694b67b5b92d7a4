// SPDX-License-Identifier: Apache-2.0

// Package apisurface counts the exported identifiers of kvxfer's public packages, as `go doc
// -all` lists them, and its test (TestRepository_APISurface, run by `make go-test` and `make
// api-surface`) fails when a package grows past its budget in Budgets.
//
// What counts, per package (its non-test files for this platform, as `go doc` reads them):
// every exported constant, variable, function and type name; every exported method and
// constructor listed under a type; every exported field of an exported struct type, and every
// method of an exported interface type (an embedded field or interface counts once, under its
// type's name when exported). Fields and interface methods count because `go doc -all` prints
// them and a user reads them; unexported names and anything in internal/ do not.
package apisurface
