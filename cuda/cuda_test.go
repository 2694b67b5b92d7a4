// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/layout"
)

// requireLibs loads the real libcudart and libkvxcuda.so. `make test` builds both first and
// sets KVX_REQUIRE_CUDA_LIBS, so there a missing library fails; a bare `go test` on a fresh
// checkout skips and says how to build them.
func requireLibs(t *testing.T) (*cudartAPI, *kvxAPI) {
	t.Helper()
	c, err := loadCudart("")
	if err == nil {
		var k *kvxAPI
		if k, err = loadKvx(""); err == nil {
			return c, k
		}
	}
	require.ErrorIs(t, err, ErrLibraryNotFound)
	if os.Getenv("KVX_REQUIRE_CUDA_LIBS") != "" {
		t.Fatalf("KVX_REQUIRE_CUDA_LIBS is set but a library is missing: %v", err)
	}
	t.Skipf("CUDA libraries not built (run `make cuda-check` first): %v", err)
	return nil, nil
}

func TestOpen_MissingLibraryNamesPathsTried(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "libkvxcuda.so")
	missingRT := filepath.Join(dir, "libcudart.so.13")
	tests := []struct {
		desc    string
		cfg     Config
		needRT  bool // the case needs the real libcudart to get as far as libkvxcuda.so
		library string
		tried   []string
	}{
		{desc: "explicit runtime path that does not exist", cfg: Config{RuntimePath: missingRT},
			library: "libcudart", tried: []string{missingRT}},
		{desc: "explicit library path that does not exist", cfg: Config{LibraryPath: missing}, needRT: true,
			library: "libkvxcuda.so", tried: []string{missing}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			if tc.needRT {
				requireLibs(t)
			}
			rt, err := Open(tc.cfg)
			require.Nil(t, rt)
			require.ErrorIs(t, err, ErrLibraryNotFound)
			var lerr *LibraryError
			require.ErrorAs(t, err, &lerr)
			require.Equal(t, tc.library, lerr.Library)
			require.Equal(t, tc.tried, lerr.Tried)
			require.Len(t, lerr.Reasons, len(lerr.Tried))
			for _, p := range tc.tried {
				require.Contains(t, err.Error(), p)
			}
		})
	}
}

func TestOpen_DefaultSearchListsEveryCandidate(t *testing.T) {
	// Open cannot show this reliably once an earlier test has loaded libkvxcuda.so (the loader
	// then resolves the bare soname to it), so check the search list and the error it yields.
	t.Setenv("KVX_CUDA_LIB", "")
	dir := t.TempDir()
	t.Chdir(dir)
	got := libkvxcudaCandidates("")
	exe, err := os.Executable()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(filepath.Dir(exe), "libkvxcuda.so"), got[0], "next to the executable first")
	require.Contains(t, got, filepath.Join(dir, "build", "cuda", "libkvxcuda.so"))
	require.Contains(t, got, filepath.Join(filepath.Dir(dir), "build", "cuda", "libkvxcuda.so"), "parents are searched")
	require.Equal(t, "libkvxcuda.so", got[len(got)-1], "the system loader is tried last")

	t.Setenv("KVX_CUDA_LIB", "/opt/x/libkvxcuda.so")
	require.Equal(t, []string{"/opt/x/libkvxcuda.so"}, libkvxcudaCandidates(""), "the environment override is the only candidate")
	require.Equal(t, []string{"/cfg/libkvxcuda.so"}, libkvxcudaCandidates("/cfg/libkvxcuda.so"), "the config wins over the environment")

	absent := []string{filepath.Join(dir, "a.so"), filepath.Join(dir, "b.so")}
	_, _, err = dlopen("libkvxcuda.so", absent)
	require.ErrorIs(t, err, ErrLibraryNotFound)
	var lerr *LibraryError
	require.ErrorAs(t, err, &lerr)
	require.Equal(t, absent, lerr.Tried)
	for _, p := range absent {
		require.Contains(t, err.Error(), p)
	}
}

func TestOpen_LibraryWithoutKvxSymbolsIsNotFound(t *testing.T) {
	c, _ := requireLibs(t)
	// libcudart opens fine but lacks kvx_cuda_*: Dlsym must catch it before RegisterFunc panics.
	rt, err := Open(Config{LibraryPath: c.path})
	require.Nil(t, rt)
	require.ErrorIs(t, err, ErrLibraryNotFound)
	require.Contains(t, err.Error(), "missing symbol kvx_cuda_abi_version")
}

func TestOpen_NoGPUIsErrNoDevice(t *testing.T) {
	c, _ := requireLibs(t)
	var count int32
	if c.getDeviceCount(&count) == codeSuccess && count > 0 {
		t.Skipf("this host has %d CUDA device(s); the no-device path cannot be observed here", count)
	}
	for _, device := range []int{0, 3} {
		rt, err := Open(Config{Device: device})
		require.Nil(t, rt)
		require.ErrorIs(t, err, ErrNoDevice, "device %d", device)
		require.NotErrorIs(t, err, ErrLibraryNotFound)
		var cerr *Error
		if errors.As(err, &cerr) {
			require.NotEmpty(t, cerr.Name, "the runtime names its error codes")
			require.True(t, strings.HasPrefix(cerr.Name, "cudaError"), cerr.Name)
		}
		t.Logf("device %d: %v", device, err)
	}
}

func TestOpen_NegativeDeviceIsInvalidArgument(t *testing.T) {
	rt, err := Open(Config{Device: -1})
	require.Nil(t, rt)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Contains(t, err.Error(), "Config.Device")
}

func TestABI_StructsMatchLibrary(t *testing.T) {
	_, k := requireLibs(t)
	require.EqualValues(t, abiVersion, k.abiVersion())
	for _, f := range abiFields() {
		require.EqualValues(t, f.goAt, k.abiOffset(f.name), "%s: C and Go disagree", f.name)
	}
	require.EqualValues(t, -1, k.abiOffset("kvx_layout_t.no_such_field"))
	require.NoError(t, checkABI(k))
}

func TestABI_MirrorsCoverEveryFieldWithoutPadding(t *testing.T) {
	listed := map[string]int{}
	for _, f := range abiFields() {
		if i := strings.IndexByte(f.name, '.'); i >= 0 {
			listed[f.name[:i]]++
		}
	}
	tests := []struct {
		desc   string
		cName  string
		goType reflect.Type
	}{
		{"layout", "kvx_layout_t", reflect.TypeFor[layout.Layout]()},
		{"selection", "kvx_selection_t", reflect.TypeFor[layout.Selection]()},
		{"copy arguments", "kvx_cuda_copy_t", reflect.TypeFor[copyArgs]()},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			require.Equal(t, tc.goType.NumField(), listed[tc.cName], "every Go field has a C counterpart checked")
			var sum uintptr
			for i := range tc.goType.NumField() {
				sum += tc.goType.Field(i).Type.Size()
			}
			require.Equal(t, tc.goType.Size(), sum, "no padding: fixed-width fields only")
		})
	}
}

func TestError_MapsCodesOntoSentinels(t *testing.T) {
	tests := []struct {
		desc string
		code int
		want error
		not  error
	}{
		{"no driver", codeInsufficientDriver, ErrNoDevice, ErrInvalidArgument},
		{"no device", codeNoDevice, ErrNoDevice, ErrInvalidArgument},
		{"bad ordinal", codeInvalidDevice, ErrNoDevice, ErrInvalidArgument},
		{"driver mismatch", codeSystemDriverMismatch, ErrNoDevice, ErrInvalidArgument},
		{"invalid value", codeInvalidValue, ErrInvalidArgument, ErrNoDevice},
		{"illegal address is neither", 700, nil, ErrNoDevice},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			err := error(&Error{Op: "op", Code: tc.code, Name: "cudaErrorX"})
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
			}
			require.NotErrorIs(t, err, tc.not)
			require.NotErrorIs(t, err, ErrLibraryNotFound)
			require.Contains(t, err.Error(), "op")
		})
	}
}

func TestMem_Slice(t *testing.T) {
	m := Mem{Addr: 0x1000, Size: 100}
	tests := []struct {
		desc   string
		off, n int64
		want   Mem
		ok     bool
	}{
		{"whole", 0, 100, Mem{0x1000, 100}, true},
		{"middle", 10, 20, Mem{0x100a, 20}, true},
		{"empty at end", 100, 0, Mem{0x1064, 0}, true},
		{"past end", 90, 11, Mem{}, false},
		{"negative offset", -1, 1, Mem{}, false},
		{"negative length", 0, -1, Mem{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := m.Slice(tc.off, tc.n)
			if !tc.ok {
				require.ErrorIs(t, err, ErrInvalidArgument)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestL11_PollIsBoundedByContext(t *testing.T) {
	boom := errors.New("device lost")
	tests := []struct {
		desc  string
		query func() (bool, error)
		want  error
	}{
		{"never done ends with the context", func() (bool, error) { return false, nil }, context.DeadlineExceeded},
		{"query error ends the wait", func() (bool, error) { return false, boom }, boom},
		{"done returns nil", func() (bool, error) { return true, nil }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := poll(ctx, tc.query)
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			require.Less(t, time.Since(start), 2*time.Second, "poll outlived its context")
		})
	}
}

func TestClosedRuntimeRefusesCalls(t *testing.T) {
	// A Runtime that was never opened on a device still enforces Close: no library call is made
	// once it is closed, so this needs no GPU.
	rt := &Runtime{}
	require.NoError(t, rt.Close())
	require.ErrorIs(t, rt.Close(), ErrClosed)
	_, err := rt.Alloc(16)
	require.ErrorIs(t, err, ErrClosed)
	_, err = rt.NewStream()
	require.ErrorIs(t, err, ErrClosed)
	_, err = rt.NewEvent(false)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, rt.Gather(nil, nil, Mem{}, 0, Mem{}), ErrClosed)
	require.ErrorIs(t, rt.Scatter(nil, nil, Mem{}, 0, Mem{}), ErrClosed)
	require.ErrorIs(t, rt.Memcpy(nil, Mem{}, Mem{}), ErrClosed)
	require.ErrorIs(t, rt.CopyToDevice(Mem{}, nil), ErrClosed)
	_, err = rt.UploadPlan(nil)
	require.ErrorIs(t, err, ErrClosed)
}
