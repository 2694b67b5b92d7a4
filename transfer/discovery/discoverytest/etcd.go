// SPDX-License-Identifier: Apache-2.0

// Package discoverytest starts a real etcd server inside a test process, on 127.0.0.1, for
// tests of code that finds its peers through package discovery.
package discoverytest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Etcd is a one-member etcd server in this process.
type Etcd struct {
	tb                 testing.TB
	dir                string
	ClientURL, PeerURL url.URL
	e                  *embed.Etcd
}

// FreePort returns a 127.0.0.1 port that was free a moment ago, outside the ephemeral range.
func FreePort(tb testing.TB) int {
	tb.Helper()
	// Below Linux's ephemeral range (32768 and up), which ":0" listeners and outgoing
	// connections draw from: a port etcd must bind, and bind again on a restart, is then not
	// taken by another test's socket in between.
	for range 100 {
		port := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			_ = ln.Close()
			return port
		}
	}
	tb.Fatal("no free 127.0.0.1 port in 20000-31999 after 100 tries")
	return 0
}

// StartEtcd starts etcd on two free 127.0.0.1 ports with fast ticks (its minimum lease is then
// 1s) and stops it when the test ends.
func StartEtcd(tb testing.TB) *Etcd {
	tb.Helper()
	s := &Etcd{tb: tb, dir: tb.TempDir()}
	s.ClientURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", FreePort(tb))}
	s.PeerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", FreePort(tb))}
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// Start starts (or restarts, on the same ports and data) the server.
func (s *Etcd) Start() {
	s.tb.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "kvxfer-test"
	cfg.Dir = s.dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{s.ClientURL}, []url.URL{s.ClientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{s.PeerURL}, []url.URL{s.PeerURL}
	cfg.InitialCluster = cfg.Name + "=" + s.PeerURL.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.LogLevel = "fatal"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		s.tb.Fatal(err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(15 * time.Second):
		e.Close()
		s.tb.Fatal("etcd did not start within 15s")
	}
	s.e = e
}

// Stop stops the server; with clients still connected it waits for them up to etcd's
// request timeout (5s), so close them first.
func (s *Etcd) Stop() {
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// Target is the discovery target for this server under prefix: etcd://127.0.0.1:PORT/prefix.
func (s *Etcd) Target(prefix string) string { return "etcd://" + s.ClientURL.Host + "/" + prefix }
