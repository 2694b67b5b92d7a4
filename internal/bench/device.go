// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/kvplan"
	"github.com/kvxfer/kvxfer/layout"
)

// openCUDA opens CUDA device ordinal for --memory device; tests replace it.
var openCUDA = func(ordinal int) (*cuda.Runtime, error) { return cuda.Open(cuda.Config{Device: ordinal}) }

// CheckDeviceGather opens and closes the GPU of a --memory device gather, so that a host
// without one fails at once, in one line, before anything else is printed.
func CheckDeviceGather(cfg GatherConfig) error {
	if !cfg.DeviceMemory {
		return nil
	}
	rt, err := openGatherDevice(cfg.Ordinal)
	if err != nil {
		return err
	}
	return rt.Close()
}

func openGatherDevice(ordinal int) (*cuda.Runtime, error) {
	rt, err := openCUDA(ordinal)
	switch {
	case errors.Is(err, cuda.ErrLibraryNotFound) || errors.Is(err, cuda.ErrNoDevice):
		return nil, fmt.Errorf("--memory device: device memory needs libkvxcuda.so and a GPU (%v); use --memory host", err)
	case err != nil:
		return nil, fmt.Errorf("--memory device: %w", err)
	}
	return rt, nil
}

// runDeviceGather is `kvxbench gather --memory device`: the CUDA gather and scatter kernels,
// chunk by chunk through one device staging slot, against a device-to-device copy of the same
// chunks, timed with CUDA events on one stream.
func runDeviceGather(ctx context.Context, cfg GatherConfig, out *Outputs) error {
	rt, err := openGatherDevice(cfg.Ordinal)
	if err != nil {
		return err
	}
	defer rt.Close()
	budget := time.Duration(len(cfg.Prompts))*2*(3*cfg.Out.Duration+10*time.Second) + time.Minute
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()

	span := cfg.Pool.SpanBytes()
	host := make([]byte, span) // the device pool's mirror, for the checks
	fillPattern(host, cfg.Seed)
	poolBuf, err := rt.Alloc(span)
	if err != nil {
		return fmt.Errorf("device pool of %s: %w", humanBytes(span), err)
	}
	slotBuf, err := rt.Alloc(cfg.Slot)
	if err != nil {
		_ = poolBuf.Free()
		return fmt.Errorf("device slot: %w", err)
	}
	s, err := rt.NewStream()
	if err != nil {
		_ = slotBuf.Free()
		_ = poolBuf.Free()
		return err
	}
	start, err1 := rt.NewEvent(true)
	stop, err2 := rt.NewEvent(true)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	dev := &deviceMeasure{rt: rt, s: s, start: start, stop: stop, pool: poolBuf.Mem(), slot: slotBuf.Mem(), host: host}
	defer dev.close(ctx, poolBuf, slotBuf)
	if err := rt.CopyToDevice(dev.pool, host); err != nil {
		return err
	}

	r := rand.New(rand.NewPCG(cfg.Seed, 0x6b7678))
	bar := newProgress(out.Stderr, 2*len(cfg.Prompts), 2*cfg.Out.Duration)
	defer bar.done()
	pr := NewPrinter(out.Stdout, cfg.Out.JSON)
	for _, tokens := range cfg.Prompts {
		plan, err := layout.NewPlan(cfg.Pool, cfg.Pool.All(), randomBlocks(r, cfg.Pool.NumBlocks, blocksFor(cfg.Shape, tokens)))
		if err != nil {
			return fmt.Errorf("plan for %d tokens: %w", tokens, err)
		}
		chunks, err := kvplan.Chunks(plan, cfg.Slot)
		if err != nil {
			return err
		}
		dp, err := rt.UploadPlan(plan)
		if err != nil {
			return err
		}
		for _, op := range []string{"gather", "scatter"} {
			name := fmt.Sprintf("%s %s %s device", op, cfg.Shape.Name, humanTokens(tokens))
			bar.step(name)
			res, err := dev.run(ctx, dp, chunks, op, cfg.Out, bar)
			if err != nil {
				_ = dp.Free()
				return fmt.Errorf("%s: %w", name, err)
			}
			res.Name, res.Model, res.Tokens = name, cfg.Shape.Name, tokens
			res.Env = runEnv(time.Now())
			res.Env.GPU = cfg.GPU
			if err := pr.Add(res); err != nil {
				return err
			}
		}
		if err := s.Wait(ctx); err != nil {
			return err
		}
		if err := dp.Free(); err != nil {
			return err
		}
	}
	bar.done()
	return pr.Finish(cfg.Out.Plot)
}

// deviceMeasure holds the device side of a --memory device run.
type deviceMeasure struct {
	rt          *cuda.Runtime
	s           *cuda.Stream
	start, stop *cuda.Event
	pool, slot  cuda.Mem
	host        []byte
}

func (d *deviceMeasure) close(ctx context.Context, bufs ...*cuda.Buffer) {
	// Free only once the stream is idle (cudaFree of memory a kernel still uses corrupts
	// the next allocation); if the wait fails the memory goes with the process.
	if d.s.Wait(ctx) == nil {
		for _, b := range bufs {
			_ = b.Free()
		}
	}
	_ = d.start.Close()
	_ = d.stop.Close()
	_ = d.s.Close()
}

// enqueue puts one whole request's op (or its device-copy baseline) on the stream.
func (d *deviceMeasure) enqueue(dp *cuda.DevicePlan, chunks []kvplan.Chunk, op string, baseline bool) error {
	for _, c := range chunks {
		slot, err := d.slot.Slice(0, c.Length)
		if err != nil {
			return err
		}
		contiguous, err := d.pool.Slice(c.Offset, c.Length)
		if err != nil {
			return err
		}
		switch {
		case baseline && op == "gather":
			err = d.rt.Memcpy(d.s, slot, contiguous)
		case baseline:
			err = d.rt.Memcpy(d.s, contiguous, slot)
		case op == "gather":
			err = d.rt.Gather(d.s, dp, d.pool, c.Offset, slot)
		default:
			err = d.rt.Scatter(d.s, dp, slot, c.Offset, d.pool)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// timed runs enqueue between two events and returns the GPU time.
func (d *deviceMeasure) timed(ctx context.Context, f func() error) (time.Duration, error) {
	if err := d.start.Record(d.s); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := d.stop.Record(d.s); err != nil {
		return 0, err
	}
	if err := d.stop.Wait(ctx); err != nil {
		return 0, err
	}
	return d.stop.Elapsed(d.start)
}

func (d *deviceMeasure) run(ctx context.Context, dp *cuda.DevicePlan, chunks []kvplan.Chunk, op string, o Output, bar *progress) (Result, error) {
	p := dp.Plan()
	bytes := p.Bytes()
	res := Result{Op: op + " device", Concurrency: 1, Bytes: bytes, MessageBytes: min(d.slot.Size, bytes)}
	var times latencies
	var opTotal, baseTotal time.Duration
	for i := 0; i < o.MaxIters && (i < minIters+1 || opTotal < o.Duration); i++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		t, err := d.timed(ctx, func() error { return d.enqueue(dp, chunks, op, false) })
		if err != nil {
			return res, err
		}
		if i > 0 { // the first is the warm-up
			times = append(times, t)
			opTotal += t
		}
		if o.Baseline {
			b, err := d.timed(ctx, func() error { return d.enqueue(dp, chunks, op, true) })
			if err != nil {
				return res, err
			}
			if i > 0 {
				baseTotal += b
			}
		}
		bar.tick()
	}
	n := int64(len(times))
	res.Requests = len(times)
	res.GBps = gbps(bytes*n, opTotal)
	res.P50us, res.P99us = us(times.percentile(50)), us(times.percentile(99))
	if op == "gather" {
		res.GatherUs = us(times.mean())
	} else {
		res.ScatterUs = us(times.mean())
	}
	if o.Baseline {
		res.setBaseline("device copy", bytes, gbps(bytes*n, baseTotal))
	}
	// The baseline of a scatter copied the slot over the pool's contiguous range: refresh
	// the host mirror before any check reads it.
	if err := d.s.Wait(ctx); err != nil {
		return res, err
	}
	if err := d.rt.CopyFromDevice(d.host, d.pool); err != nil {
		return res, err
	}
	if !o.NoVerify {
		if err := d.verify(ctx, dp, chunks, op); err != nil {
			return res, err
		}
		res.Verified = true
	}
	return res, nil
}

// verify moves the request once more and checks every byte, as hostMeasure.verify does, with
// the device pool's host mirror.
func (d *deviceMeasure) verify(ctx context.Context, dp *cuda.DevicePlan, chunks []kvplan.Chunk, op string) error {
	p := dp.Plan()
	h := newChecksum()
	buf := make([]byte, d.slot.Size)
	for _, c := range chunks {
		b := buf[:c.Length]
		slot, err := d.slot.Slice(0, c.Length)
		if err != nil {
			return err
		}
		if op == "gather" {
			if err := d.rt.Gather(d.s, dp, d.pool, c.Offset, slot); err != nil {
				return err
			}
			if err := d.s.Wait(ctx); err != nil {
				return err
			}
			if err := d.rt.CopyFromDevice(b, slot); err != nil {
				return err
			}
		} else {
			fillPattern(b, uint64(c.Offset)*7+1)
			if err := d.rt.CopyToDevice(slot, b); err != nil {
				return err
			}
			if err := d.rt.Scatter(d.s, dp, slot, c.Offset, d.pool); err != nil {
				return err
			}
			if err := d.s.Wait(ctx); err != nil {
				return err
			}
		}
		h.Write(b)
	}
	if op == "scatter" {
		if err := d.rt.CopyFromDevice(d.host, d.pool); err != nil {
			return err
		}
	}
	if got, want := h.Sum32(), streamChecksum(p, d.host); got != want {
		return fmt.Errorf("verification failed: device %s stream checksum %08x, the pool holds %08x", op, got, want)
	}
	return nil
}
