// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
)

// Config selects the libraries and the device. The zero value is ready to use.
type Config struct {
	// LibraryPath is libkvxcuda.so's path. Default "": $KVX_CUDA_LIB, else the search in the
	// package documentation.
	LibraryPath string
	// RuntimePath is libcudart's path. Default "": $KVX_CUDART, else the search in the
	// package documentation.
	RuntimePath string
	// Device is the CUDA device ordinal. Default 0. Must not be negative.
	Device int
	// Logger receives load and device events. Default zap.NewNop().
	Logger *zap.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Device < 0 {
		return c, fmt.Errorf("%w: Config.Device = %d: must be a device ordinal, 0 or more", ErrInvalidArgument, c.Device)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c, nil
}

// DeviceInfo describes the opened device and the libraries in use.
type DeviceInfo struct {
	Ordinal        int
	Name           string
	SMs            int
	ComputeMajor   int
	ComputeMinor   int
	TotalMemory    int64
	RuntimeVersion int    // cudaRuntimeGetVersion, e.g. 13020
	DriverVersion  int    // cudaDriverGetVersion, e.g. 13020
	LibraryPath    string // the libkvxcuda.so loaded
	RuntimePath    string // the libcudart loaded
}

// Runtime is one opened CUDA device with libkvxcuda's kernels. Its methods are safe for
// concurrent use.
type Runtime struct {
	cudart *cudartAPI
	kvx    *kvxAPI
	device int32
	info   DeviceInfo
	log    *zap.Logger
	closed atomic.Bool
}

// Open loads libcudart and libkvxcuda.so, checks their ABI, and opens cfg.Device. It returns
// an error matching ErrLibraryNotFound (naming every path tried) when a library is missing,
// ErrABIMismatch when the library does not match this package, and ErrNoDevice when there is
// no driver or no such device. It never panics for missing hardware.
func Open(cfg Config) (*Runtime, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rt := &Runtime{device: int32(cfg.Device), log: cfg.Logger}
	if rt.cudart, err = loadCudart(cfg.RuntimePath); err != nil {
		return nil, err
	}
	if rt.kvx, err = loadKvx(cfg.LibraryPath); err != nil {
		return nil, err
	}
	if err := checkABI(rt.kvx); err != nil {
		return nil, err
	}
	var runtimeVersion, driverVersion int32
	if code := rt.cudart.runtimeGetVersion(&runtimeVersion); code != codeSuccess {
		return nil, rt.cudaErr("cudaRuntimeGetVersion", code)
	}
	if built := rt.kvx.runtimeVersion(); built/1000 != runtimeVersion/1000 {
		return nil, fmt.Errorf("%w: %s was built for CUDA runtime %d but %s is %d", ErrABIMismatch,
			rt.kvx.path, built, rt.cudart.path, runtimeVersion)
	}
	// The driver version is 0 without a driver; that case is reported by the device count.
	_ = rt.cudart.driverGetVersion(&driverVersion)
	rt.log.Debug("cuda: libraries loaded", zap.String("libkvxcuda", rt.kvx.path),
		zap.String("libcudart", rt.cudart.path), zap.Int32("runtime_version", runtimeVersion),
		zap.Int32("driver_version", driverVersion))

	var count int32
	if code := rt.cudart.getDeviceCount(&count); code != codeSuccess {
		return nil, rt.cudaErr("cudaGetDeviceCount", code)
	}
	if count == 0 {
		return nil, fmt.Errorf("%w: the driver reports 0 devices", ErrNoDevice)
	}
	if rt.device >= count {
		return nil, fmt.Errorf("%w: Config.Device = %d but only %d device(s) present", ErrNoDevice, rt.device, count)
	}
	if code := rt.kvx.open(rt.device); code != codeSuccess {
		return nil, rt.cudaErr("kvx_cuda_open", code)
	}
	var name [256]byte
	var sms, major, minor int32
	var mem int64
	if code := rt.kvx.deviceInfo(rt.device, &name[0], int64(len(name)), &sms, &major, &minor, &mem); code != codeSuccess {
		return nil, rt.cudaErr("kvx_cuda_device_info", code)
	}
	n := 0
	for n < len(name) && name[n] != 0 {
		n++
	}
	rt.info = DeviceInfo{
		Ordinal: int(rt.device), Name: string(name[:n]), SMs: int(sms), ComputeMajor: int(major),
		ComputeMinor: int(minor), TotalMemory: mem, RuntimeVersion: int(runtimeVersion),
		DriverVersion: int(driverVersion), LibraryPath: rt.kvx.path, RuntimePath: rt.cudart.path,
	}
	rt.log.Info("cuda: device opened", zap.Int("device", rt.info.Ordinal), zap.String("name", rt.info.Name),
		zap.Int("sms", rt.info.SMs), zap.Int64("memory", rt.info.TotalMemory))
	return rt, nil
}

// Info describes the device and the libraries.
func (r *Runtime) Info() DeviceInfo { return r.info }

// Close makes every later call on the Runtime fail with ErrClosed, except the Free and Close
// of what it handed out: buffers, streams, events and plans are freed by their owners, after
// their work is known to be done, and that stays possible after Close so nothing has to leak.
// The libraries stay loaded, since the CUDA runtime does not support being unloaded.
func (r *Runtime) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	return nil
}

// cudaErr turns a cudaError_t into an *Error with the runtime's name and description.
func (r *Runtime) cudaErr(op string, code int32) error {
	e := &Error{Op: op, Code: int(code)}
	if r.cudart != nil {
		e.Name = r.cudart.getErrorName(code)
		e.Message = r.cudart.getErrorString(code)
	}
	return e
}

func (r *Runtime) check(op string, code int32) error {
	if code == codeSuccess {
		return nil
	}
	return r.cudaErr(op, code)
}

func (r *Runtime) usable() error {
	if r == nil || r.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Mem is a range of device memory: a Buffer's, or one wrapped from memory allocated
// elsewhere, such as an inference engine's KV pool.
type Mem struct {
	Addr uint64 // device address of byte 0
	Size int64  // bytes
}

// Slice returns bytes [off, off+n) of m.
func (m Mem) Slice(off, n int64) (Mem, error) {
	if off < 0 || n < 0 || off > m.Size || n > m.Size-off {
		return Mem{}, fmt.Errorf("%w: slice [%d, +%d) of a %d-byte range", ErrInvalidArgument, off, n, m.Size)
	}
	return Mem{Addr: m.Addr + uint64(off), Size: n}, nil
}

// Buffer is device memory allocated by a Runtime.
type Buffer struct {
	rt    *Runtime
	mem   Mem
	freed atomic.Bool
}

// Alloc allocates n bytes of device memory (cudaMalloc: 256-byte aligned).
func (r *Runtime) Alloc(n int64) (*Buffer, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: Alloc(%d): size must be positive", ErrInvalidArgument, n)
	}
	var p uint64
	if err := r.check("kvx_cuda_malloc", r.kvx.malloc(r.device, &p, n)); err != nil {
		return nil, fmt.Errorf("alloc %d bytes: %w", n, err)
	}
	return &Buffer{rt: r, mem: Mem{Addr: p, Size: n}}, nil
}

// Mem is the buffer's whole range.
func (b *Buffer) Mem() Mem { return b.mem }

// Free releases the buffer. Call it only once an event recorded after the last work that
// touches the buffer reports done: cudaFree may wait for the device, and freeing memory a
// kernel still uses corrupts whatever is allocated there next. A second Free returns ErrClosed.
func (b *Buffer) Free() error {
	if !b.freed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	return b.rt.check("kvx_cuda_free", b.rt.kvx.free(b.rt.device, b.mem.Addr))
}

// CopyToDevice copies src into dst synchronously. It is for setup and tests (uploading data,
// reading results), not the data path: it blocks until the copy is done.
func (r *Runtime) CopyToDevice(dst Mem, src []byte) error {
	if err := r.usable(); err != nil {
		return err
	}
	if int64(len(src)) > dst.Size {
		return fmt.Errorf("%w: CopyToDevice: %d bytes into a %d-byte range", ErrInvalidArgument, len(src), dst.Size)
	}
	if len(src) == 0 {
		return nil
	}
	return r.check("kvx_cuda_copy_to_device", r.kvx.copyToDevice(r.device, dst.Addr, unsafe.Pointer(&src[0]), int64(len(src))))
}

// CopyFromDevice copies len(dst) bytes of src into dst synchronously (see CopyToDevice).
func (r *Runtime) CopyFromDevice(dst []byte, src Mem) error {
	if err := r.usable(); err != nil {
		return err
	}
	if int64(len(dst)) > src.Size {
		return fmt.Errorf("%w: CopyFromDevice: %d bytes from a %d-byte range", ErrInvalidArgument, len(dst), src.Size)
	}
	if len(dst) == 0 {
		return nil
	}
	return r.check("kvx_cuda_copy_to_host", r.kvx.copyToHost(r.device, unsafe.Pointer(&dst[0]), src.Addr, int64(len(dst))))
}

// Stream is an ordered queue of device work that does not synchronise with the legacy default
// stream, so a stuck stream elsewhere cannot hold this one.
type Stream struct {
	rt     *Runtime
	handle uint64
	closed atomic.Bool
}

// NewStream creates a stream.
func (r *Runtime) NewStream() (*Stream, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	var h uint64
	if err := r.check("kvx_cuda_stream_create", r.kvx.streamCreate(r.device, &h)); err != nil {
		return nil, err
	}
	return &Stream{rt: r, handle: h}, nil
}

func (s *Stream) usable() error {
	if s == nil || s.closed.Load() {
		return fmt.Errorf("stream: %w", ErrClosed)
	}
	return s.rt.usable()
}

// Query reports whether all work enqueued on the stream is done. It never blocks.
func (s *Stream) Query() (bool, error) {
	if err := s.usable(); err != nil {
		return false, err
	}
	return s.rt.done("kvx_cuda_stream_query", s.rt.kvx.streamQuery(s.rt.device, s.handle))
}

// Wait polls Query until the stream is idle or ctx ends; ctx is the bound on the wait.
func (s *Stream) Wait(ctx context.Context) error { return poll(ctx, s.Query) }

// Close destroys the stream. Work already enqueued still runs to completion.
func (s *Stream) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("stream: %w", ErrClosed)
	}
	return s.rt.check("kvx_cuda_stream_destroy", s.rt.kvx.streamDestroy(s.rt.device, s.handle))
}

// Event marks a point in a stream; querying it is how the host learns, without blocking,
// that everything enqueued before it is done.
type Event struct {
	rt     *Runtime
	handle uint64
	timing bool
	closed atomic.Bool
}

// NewEvent creates an event. timing enables Elapsed, at a small cost on every Record.
func (r *Runtime) NewEvent(timing bool) (*Event, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	var h uint64
	t := int32(0)
	if timing {
		t = 1
	}
	if err := r.check("kvx_cuda_event_create", r.kvx.eventCreate(r.device, &h, t)); err != nil {
		return nil, err
	}
	return &Event{rt: r, handle: h, timing: timing}, nil
}

func (e *Event) usable() error {
	if e == nil || e.closed.Load() {
		return fmt.Errorf("event: %w", ErrClosed)
	}
	return e.rt.usable()
}

// Record captures the work enqueued on s so far; Query reports when it is done.
func (e *Event) Record(s *Stream) error {
	if err := e.usable(); err != nil {
		return err
	}
	if err := s.usable(); err != nil {
		return err
	}
	return e.rt.check("kvx_cuda_event_record", e.rt.kvx.eventRecord(e.rt.device, e.handle, s.handle))
}

// Query reports whether the work captured by the last Record is done. It never blocks: an
// unfinished event returns false at once (cudaErrorNotReady), which is what non-blocking
// status polling relies on. An event never recorded reports done.
func (e *Event) Query() (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	return e.rt.done("kvx_cuda_event_query", e.rt.kvx.eventQuery(e.rt.device, e.handle))
}

// Wait polls Query until the event is done or ctx ends; ctx is the bound on the wait.
func (e *Event) Wait(ctx context.Context) error { return poll(ctx, e.Query) }

// Elapsed is the GPU time from start to e; both must be timing events that are done.
func (e *Event) Elapsed(start *Event) (time.Duration, error) {
	if err := e.usable(); err != nil {
		return 0, err
	}
	if err := start.usable(); err != nil {
		return 0, err
	}
	if !e.timing || !start.timing {
		return 0, fmt.Errorf("%w: Elapsed needs events created with timing", ErrInvalidArgument)
	}
	var ms float32
	if err := e.rt.check("kvx_cuda_event_elapsed", e.rt.kvx.eventElapsed(e.rt.device, &ms, start.handle, e.handle)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Close destroys the event.
func (e *Event) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("event: %w", ErrClosed)
	}
	return e.rt.check("kvx_cuda_event_destroy", e.rt.kvx.eventDestroy(e.rt.device, e.handle))
}

// done maps a query's result: success is done, cudaErrorNotReady is not yet, anything else
// (a kernel fault, a lost device) is an error.
func (r *Runtime) done(op string, code int32) (bool, error) {
	switch code {
	case codeSuccess:
		return true, nil
	case codeNotReady:
		return false, nil
	}
	return false, r.cudaErr(op, code)
}

// Poll intervals: start short because most waits are for work that is nearly done, back off
// so a long wait costs little CPU.
const (
	pollMin = time.Microsecond
	pollMax = time.Millisecond
)

// poll calls query until it reports done, fails, or ctx ends.
func poll(ctx context.Context, query func() (bool, error)) error {
	interval := pollMin
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		done, err := query()
		if err != nil || done {
			return err
		}
		timer.Reset(interval) // Go 1.23+ timers: Reset never delivers a stale tick
		select {
		case <-ctx.Done():
			return fmt.Errorf("cuda: wait: %w", ctx.Err())
		case <-timer.C:
		}
		interval = min(2*interval, pollMax)
	}
}
