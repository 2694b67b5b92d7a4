// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// shmFIFOChildEnv carries, to a child test process, the ContextConfig.ShmFIFOSize it opens its
// contexts with ("0": the default).
const shmFIFOChildEnv = "KVX_SHMFIFO_CHILD"

// TestUCX_ShmFIFOChild is the child side of TestUCX_ShmFIFOSize: the setting goes into the
// process's environment when its first context opens, so each value needs a process of its
// own. It moves one IOV message of 16 MiB and 5 bytes between two workers over shared memory
// (about two thousand FIFO pieces, so the FIFO wraps many times), every byte checked, and
// prints the UCX_MM_FIFO_SIZE its UCX read, and the FIFO size UCT's posix configuration
// reports (shmFIFOSize).
func TestUCX_ShmFIFOChild(t *testing.T) {
	v, ok := os.LookupEnv(shmFIFOChildEnv)
	if !ok {
		t.Skip("run by TestUCX_ShmFIFOSize only")
	}
	size, err := strconv.Atoi(v)
	require.NoError(t, err)
	p := newPairConfig(t, ContextConfig{TLS: "posix,self", ShmFIFOSize: size})
	const n = 16<<20 + 5
	src := alloc(t, p.ctxA, n)
	dst := alloc(t, p.ctxB, n)
	require.NoError(t, src.FillPattern(0, n, 0, 13))
	a, b := int64(n/3), int64(n/2)
	recv := p.ba.TagRecvIOV(dst, []Segment{{0, n / 4}, {n / 4, n - n/4}}, 9, ^uint64(0))
	send := p.ab.TagSendIOV(src, []Segment{{0, a}, {a, b - a}, {b, n - b}}, 9)
	waitAll(t, 60*time.Second, recv, send)
	require.Equal(t, int64(n), recv.Length())
	bad, err := dst.CheckPattern(0, n, 0, 13)
	require.NoError(t, err)
	require.Equal(t, int64(-1), bad, "first wrong byte")
	fifo, set := ProcessEnv("UCX_MM_FIFO_SIZE")
	if !set {
		fifo = "unset"
	}
	fmt.Printf("CHILD: fifo=%s uct=%d\n", fifo, shmFIFOSize())
}

// TestUCX_ShmFIFOSize: a context opened with ContextConfig.ShmFIFOSize gives UCX that receive
// FIFO (UCX_MM_FIFO_SIZE), and leaves UCX's own when it is 0; a message of many FIFO pieces
// arrives intact either way. A value the caller set in the environment wins. shmFIFOSize reads
// the size in force: the one set, else UCX's default (a power of two; 64 in 1.13, 256 in 1.22).
func TestUCX_ShmFIFOSize(t *testing.T) {
	for _, tc := range []struct {
		name, env string // env: UCX_MM_FIFO_SIZE the parent sets; "" none
		size      int
		want      string
	}{
		{"default", "", 0, "unset"},
		{"1024", "", 1024, "1024"},
		{"environment wins", "256", 1024, "256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestUCX_ShmFIFOChild$", "-test.count=1", "-test.v")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "UCX_MM_FIFO_SIZE=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			if tc.env != "" {
				cmd.Env = append(cmd.Env, "UCX_MM_FIFO_SIZE="+tc.env)
			}
			cmd.Env = append(cmd.Env, shmFIFOChildEnv+"="+strconv.Itoa(tc.size))
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "child:\n%s", out)
			m := regexp.MustCompile(`CHILD: fifo=(\w+) uct=(\d+)`).FindSubmatch(out)
			require.NotNil(t, m, "child said nothing:\n%s", out)
			require.Equal(t, tc.want, string(m[1]))
			uct, err := strconv.Atoi(string(m[2]))
			require.NoError(t, err)
			if tc.want == "unset" {
				require.True(t, uct >= 64 && uct&(uct-1) == 0, "UCX %s's default FIFO: %d", UCXVersion(), uct)
			} else {
				require.Equal(t, tc.want, strconv.Itoa(uct), "shmFIFOSize")
			}
		})
	}
}

func TestUCX_ShmFIFOSizeRefused(t *testing.T) {
	for _, size := range []int{-64, 32, 100, 32768} {
		_, err := NewContext(ContextConfig{TLS: "posix,self", ShmFIFOSize: size})
		require.Error(t, err, "size %d", size)
		require.True(t, errors.Is(err, ErrInvalidArgument), "size %d: %v", size, err)
	}
}

func TestParseMemUnits(t *testing.T) {
	for in, want := range map[string]int64{"65536": 65536, "64k": 64 << 10, "64K": 64 << 10, "1m": 1 << 20,
		"1MB": 1 << 20, "2g": 2 << 30, "8kb": 8 << 10, "inf": math.MaxInt64, "auto": math.MaxInt64, "": math.MaxInt64} {
		require.Equal(t, want, parseMemUnits(in), in)
	}
}

func TestWantsTCP(t *testing.T) {
	for tls, want := range map[string]bool{"": true, "all": true, "tcp,self": true, "posix,cma,self": false,
		"^tcp": false, "^posix": true, "sm,self": false} {
		require.Equal(t, want, wantsTCP(tls), tls)
	}
}

// TestUCX_SettingsAreWhatTheContextRunsWith: Settings names what the most recent context opened
// with, so a baseline given them (scripts/bench-paths.sh's ucx_perftest) runs as the engine
// does on this UCX: the rendezvous scheme the config chose (get_zcopy under protocols v1,
// am under v2, or the caller's), the threshold kvxfer sets under v2, and the transport
// settings UCX reads from the environment as they stand there.
func TestUCX_SettingsAreWhatTheContextRunsWith(t *testing.T) {
	for _, tr := range transports {
		for _, tc := range []struct {
			name, scheme string // scheme: ContextConfig.RendezvousScheme
			want         string // the UCX_RNDV_SCHEME Settings must name
		}{
			{"default", "", map[bool]string{false: "get_zcopy", true: "am"}[protocolsV2()]},
			{"get_zcopy", "get_zcopy", "get_zcopy"},
			{"am", "am", "am"},
		} {
			t.Run(tr.name+"/"+tc.name, func(t *testing.T) {
				uc, err := NewContext(ContextConfig{TLS: tr.tls, RendezvousScheme: tc.scheme, KeepaliveInterval: 300 * time.Millisecond})
				require.NoError(t, err)
				defer func() { require.NoError(t, uc.Close()) }()
				got := map[string]string{}
				for _, kv := range Settings() {
					k, v, ok := strings.Cut(kv, "=")
					require.True(t, ok, kv)
					got[k] = v
				}
				require.Equal(t, tc.want, got["UCX_RNDV_SCHEME"], "UCX %s: %v", UCXVersion(), Settings())
				require.Equal(t, "300ms", got["UCX_KEEPALIVE_INTERVAL"])
				thresh, set := ProcessEnv("UCX_RNDV_THRESH")
				if !set && protocolsV2() && tc.want != "get_zcopy" {
					thresh, set = strconv.Itoa(eagerLimitBytes), true
				}
				if set {
					require.Equal(t, thresh, got["UCX_RNDV_THRESH"], "UCX %s", UCXVersion())
				} else {
					require.NotContains(t, got, "UCX_RNDV_THRESH", "UCX %s", UCXVersion())
				}
				for _, name := range settingsFromEnv {
					v, ok := ProcessEnv(name)
					if !ok {
						require.NotContains(t, got, name)
						continue
					}
					require.Equal(t, v, got[name], name)
				}
				if tr.name == "tcp" {
					require.Equal(t, "0", got["UCX_TCP_MAX_IOV"], "no TCP zero-copy (docs/ucx.md)")
				} else {
					require.Equal(t, "y", got["UCX_MM_ERROR_HANDLING"])
				}
			})
		}
	}
}
