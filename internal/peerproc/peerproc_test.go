// SPDX-License-Identifier: Apache-2.0

package peerproc

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The GPU machine has no Go (scripts/gpu-run.sh runs prebuilt test binaries from the GPU
// bundle), so a peer named by its environment variable is used as it is: with no go command on
// PATH, Build and BuildEnginePeer must still return it.
func TestBuild_PrebuiltPeerFromEnvNeedsNoGo(t *testing.T) {
	cases := []struct {
		desc  string
		env   string
		build func(testing.TB) string
	}{
		{"ucxpeer from " + UCXPeerEnv, UCXPeerEnv, Build},
		{"enginepeer from " + EnginePeerEnv, EnginePeerEnv, BuildEnginePeer},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "peer")
			require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))
			t.Setenv(c.env, bin)
			t.Setenv("PATH", t.TempDir()) // no go command: building would fail
			require.Equal(t, bin, c.build(t))
		})
	}
}

// A prebuilt peer that cannot be run is a mistake in the bundle, named with the variable that
// points at it, never a silent fallback to building one.
func TestPrebuiltPeer_RefusesWhatCannotRun(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "exe")
	require.NoError(t, os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755))
	plain := filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(plain, []byte("data"), 0o644))

	cases := []struct {
		desc    string
		value   string // "" leaves the variable unset
		want    string
		wantErr string
	}{
		{desc: "unset: build it", value: ""},
		{desc: "an executable file is used", value: exe, want: exe},
		{desc: "a missing file", value: filepath.Join(dir, "missing"), wantErr: UCXPeerEnv + "=" + filepath.Join(dir, "missing")},
		{desc: "a file that is not executable", value: plain, wantErr: UCXPeerEnv + "=" + plain + ": not an executable file"},
		{desc: "a directory", value: dir, wantErr: UCXPeerEnv + "=" + dir + ": not an executable file"},
		{desc: "a relative path", value: "exe", wantErr: UCXPeerEnv + "=exe: not an absolute path"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			t.Setenv(UCXPeerEnv, c.value)
			got, err := prebuiltPeer(UCXPeerEnv)
			if c.wantErr != "" {
				require.ErrorContains(t, err, c.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

// runFunc is a test binary's m whose Run is a function.
type runFunc func() int

func (f runFunc) Run() int { return f() }

// peerDirs lists the shared build directories in dir.
func peerDirs(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "kvxfer-peers-*"))
	require.NoError(t, err)
	return m
}

// SharedBuilds makes its directory only when a peer is built, and removes it when m.Run
// returns. A test binary that builds no peer (the child a test re-runs itself as, often
// killed or ended with os.Exit, which skips every deferred removal) leaves nothing in $TMPDIR.
func TestSharedBuilds_MakesItsDirectoryOnlyForABuild(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cases := []struct {
		desc  string
		build bool
	}{{"no peer built", false}, {"one peer built twice", true}}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var during []string
			rc := SharedBuilds(runFunc(func() int {
				if c.build {
					a := buildPeer(t, "KVX_TINYPEER_BIN_UNSET", "tinypeer", "./testdata/tinypeer")
					b := buildPeer(t, "KVX_TINYPEER_BIN_UNSET", "tinypeer", "./testdata/tinypeer")
					require.Equal(t, a, b, "built once for the binary")
					require.FileExists(t, a)
				}
				during = peerDirs(t, tmp)
				return 7
			})).Run()
			require.Equal(t, 7, rc)
			if c.build {
				require.Len(t, during, 1)
			} else {
				require.Empty(t, during, "nothing built: no directory")
			}
			require.Empty(t, peerDirs(t, tmp), "removed when m.Run returns")
		})
	}
}
