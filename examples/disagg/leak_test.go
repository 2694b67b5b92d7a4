// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// envRunMain makes this test binary behave as the disagg command: the UCX mode re-executes
// os.Executable() as its decode process, and under `go test` that is the test binary.
const envRunMain = "KVXFER_DISAGG_RUN_MAIN"

// TestMain fails the package if any test leaves a goroutine behind: an engine not closed, a
// server not shut down, a wait that never ended. Started as the decode process (envRunMain
// set), it runs the command instead of the tests.
func TestMain(m *testing.M) {
	if spec := os.Getenv(envWorkerChild); spec != "" {
		os.Exit(workerChild(spec)) // netcut_test.go: one engine of the link-cut test
	}
	if spec := os.Getenv(envEtcdChild); spec != "" {
		os.Exit(etcdChild(spec)) // netns_test.go: an etcd inside a network namespace
	}
	if os.Getenv(envRunMain) == "1" {
		main()
		os.Exit(0)
	}
	// Every process a test starts from this binary is the command, never the test suite again.
	if err := os.Setenv(envRunMain, "1"); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m)
}

// envWorkerChild makes this test binary one engine of the link-cut test: "ROLE,TARGET,DEV".
const envWorkerChild = "KVXFER_DISAGG_WORKER_CHILD"

// envEtcdChild makes this test binary an etcd server: "CLIENT_HOST:PORT,PEER_HOST:PORT,DIR".
// It prints "etcd ready" and serves until its stdin closes.
const envEtcdChild = "KVXFER_DISAGG_ETCD_CHILD"
