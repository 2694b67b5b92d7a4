// SPDX-License-Identifier: Apache-2.0

//go:build !(linux && cgo)

package main

import "fmt"

// Without cgo (or off Linux) the link-cut and namespace tests are not built, so nothing starts
// this binary as one of their children; if something does, it says why and fails.

func workerChild(string) int {
	fmt.Println("the link-cut test's engine needs cgo and Linux")
	return 2
}

func etcdChild(string) int {
	fmt.Println("the namespace test's etcd needs cgo and Linux")
	return 2
}
