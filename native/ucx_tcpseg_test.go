// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tcpSegChildEnv carries, to a child test process, the ContextConfig.TCPSegmentBytes it opens
// its contexts with ("0": the default).
const tcpSegChildEnv = "KVX_TCPSEG_CHILD"

// TestUCX_TCPSegmentChild is the child side of TestUCX_TCPSegmentBytes: the TCP settings go into
// the process's environment when its first context opens, so each setting needs a process of
// its own. It moves one IOV message of 16 MiB and 5 bytes over TCP, every byte checked, and
// prints the largest eager short message of the endpoint's tagged sends, which UCX derives
// from the send segment.
func TestUCX_TCPSegmentChild(t *testing.T) {
	v, ok := os.LookupEnv(tcpSegChildEnv)
	if !ok {
		t.Skip("run by TestUCX_TCPSegmentBytes only")
	}
	seg, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err)
	p := newPairConfig(t, ContextConfig{TLS: "tcp,self", TCPSegmentBytes: seg})
	const n = 16<<20 + 5
	src := alloc(t, p.ctxA, n)
	dst := alloc(t, p.ctxB, n)
	require.NoError(t, src.FillPattern(0, n, 0, 11))
	a, b := int64(n/3), int64(n/2)
	recv := p.ba.TagRecvIOV(dst, []Segment{{0, n / 4}, {n / 4, n - n/4}}, 7, ^uint64(0))
	send := p.ab.TagSendIOV(src, []Segment{{0, a}, {a, b - a}, {b, n - b}}, 7)
	waitAll(t, 30*time.Second, recv, send)
	require.Equal(t, int64(n), recv.Length())
	bad, err := dst.CheckPattern(0, n, 0, 11)
	require.NoError(t, err)
	require.Equal(t, int64(-1), bad, "first wrong byte")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := p.ab.Info(ctx)
	require.NoError(t, err)
	m := regexp.MustCompile(`tag_send: 0\.\.<egr/short>\.\.(\d+)\.\.`).FindStringSubmatch(info)
	if m == nil {
		fmt.Println("CHILD: short=unknown")
		return
	}
	fmt.Printf("CHILD: short=%s\n", m[1])
}

// TestUCX_TCPSegmentBytes: a context sends over TCP in segments of ContextConfig.TCPSegmentBytes
// (64 KiB by default, which any peer takes; up to the 1 MiB receive buffer every context of
// this package has), and a message of many segments arrives intact both ways.
func TestUCX_TCPSegmentBytes(t *testing.T) {
	for _, tc := range []struct {
		seg  int64
		want int64 // the segment UCX should size its eager messages by
	}{
		{0, 64 << 10},
		{1 << 20, 1 << 20},
		{256 << 10, 256 << 10},
	} {
		t.Run(strconv.FormatInt(tc.seg, 10), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestUCX_TCPSegmentChild$", "-test.count=1", "-test.v")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "UCX_TCP_") { // the child must see the package's own settings
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, tcpSegChildEnv+"="+strconv.FormatInt(tc.seg, 10))
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "child:\n%s", out)
			m := regexp.MustCompile(`CHILD: short=(\w+)`).FindSubmatch(out)
			require.NotNil(t, m, "child said nothing:\n%s", out)
			if string(m[1]) == "unknown" {
				t.Skipf("this UCX prints no eager threshold to check the segment by:\n%s", out)
			}
			short, err := strconv.ParseInt(string(m[1]), 10, 64)
			require.NoError(t, err)
			require.True(t, short > tc.want-64 && short < tc.want, "eager short limit %d, want just under %d", short, tc.want)
		})
	}
}

func TestUCX_TCPSegmentBytesOutOfRange(t *testing.T) {
	for _, seg := range []int64{-1, 4 << 10, TCPReceiveSegmentBytes + 1} {
		_, err := NewContext(ContextConfig{TLS: "tcp,self", TCPSegmentBytes: seg})
		require.Error(t, err, "segment %d", seg)
		require.True(t, errors.Is(err, ErrInvalidArgument), "segment %d: %v", seg, err)
	}
}
