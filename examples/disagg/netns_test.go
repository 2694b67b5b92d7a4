// SPDX-License-Identifier: Apache-2.0

//go:build linux && cgo

package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/server/v3/embed"
)

func etcdChild(spec string) int {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		fmt.Fprintln(os.Stderr, "etcd child: bad spec", spec)
		return 2
	}
	cu, pu := url.URL{Scheme: "http", Host: f[0]}, url.URL{Scheme: "http", Host: f[1]}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "disagg", f[2]
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "fatal"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd child:", err)
		return 1
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd child: not ready within 20s")
		return 1
	}
	fmt.Println("etcd ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	e.Close()
	return 0
}

// nsPair is two network namespaces joined by a veth pair, named after this process, deleted
// when the test ends.
type nsPair struct{ a, b, devA, devB string }

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

func newNSPair(t *testing.T) *nsPair {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2)")
	}
	id := strconv.Itoa(os.Getpid())
	n := &nsPair{a: "kvxd" + id + "a", b: "kvxd" + id + "b", devA: "kvxd" + id + "a0", devB: "kvxd" + id + "b0"}
	t.Cleanup(func() {
		for _, ns := range []string{n.a, n.b} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
		_ = exec.Command("ip", "link", "del", n.devA).Run() // only if it never left this namespace
	})
	ipCmd(t, "netns", "add", n.a)
	ipCmd(t, "netns", "add", n.b)
	ipCmd(t, "link", "add", n.devA, "type", "veth", "peer", "name", n.devB)
	ipCmd(t, "link", "set", n.devA, "netns", n.a)
	ipCmd(t, "link", "set", n.devB, "netns", n.b)
	ipCmd(t, "-n", n.a, "addr", "add", "10.213.9.1/30", "dev", n.devA)
	ipCmd(t, "-n", n.b, "addr", "add", "10.213.9.2/30", "dev", n.devB)
	for _, ns := range []string{n.a, n.b} {
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipCmd(t, "-n", n.a, "link", "set", n.devA, "up")
	ipCmd(t, "-n", n.b, "link", "set", n.devB, "up")
	return n
}

// inNS starts this test binary inside namespace ns with env added; it is killed and reaped
// when the test ends.
func inNS(t *testing.T, ns string, env []string, prep func(*exec.Cmd), args ...string) *exec.Cmd {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, exe}, args...)...) // ip execs: same pid
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	prep(cmd)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}

// Two "hosts": two network namespaces joined by a veth pair. etcd and the prefill worker run
// in one, the decode worker in the other; the workers find each other through etcd across
// the link and move the story's requests over UCX TCP, every byte checked by decode.
func TestDisagg_TwoNamespacesThroughEtcd(t *testing.T) {
	skipWithoutUCX(t)
	n := newNSPair(t)

	target := startEtcdIn(t, n)
	common := []string{"-transport=ucx", "-tls=tcp,self", "-timeout=60s", "-progress-deadline=1m", "-discovery=" + target}
	var prefillOut, prefillErr, decodeOut, decodeErr syncBuffer
	prefill := inNS(t, n.a, []string{envRunMain + "=1", "UCX_NET_DEVICES=" + n.devA}, func(c *exec.Cmd) { c.Stdout, c.Stderr = &prefillOut, &prefillErr },
		append([]string{"-role=prefill", "-control=10.213.9.1:0"}, common...)...)
	decode := inNS(t, n.b, []string{envRunMain + "=1", "UCX_NET_DEVICES=" + n.devB}, func(c *exec.Cmd) { c.Stdout, c.Stderr = &decodeOut, &decodeErr },
		append([]string{"-role=decode"}, common...)...)

	wait := func(name string, cmd *exec.Cmd, out, errOut *syncBuffer) {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			require.NoError(t, err, "%s stdout: %s\nstderr: %s", name, out.String(), errOut.String())
		case <-time.After(90 * time.Second):
			t.Fatalf("%s did not finish: %s", name, out.String())
		}
	}
	wait("decode", decode, &decodeOut, &decodeErr)
	wait("prefill", prefill, &prefillOut, &prefillErr)
	out := decodeOut.String()
	require.Regexp(t, regexp.MustCompile(`(?m)^registry etcd://10\.213\.9\.1:23790/disagg: prefill-0's control plane is http://10\.213\.9\.1:\d+$`), out)
	for _, want := range decodeStoryLines {
		// Over TCP the engine may take another path than the shared-memory story's RMA.
		require.Regexp(t, regexp.MustCompile(strings.ReplaceAll(want, "path rma$", `path \w+$`)), out)
	}
	require.Regexp(t, regexp.MustCompile(`(?m)^decode: request 1: all \d+ bytes verified`), out)
}
