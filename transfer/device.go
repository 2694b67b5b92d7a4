// SPDX-License-Identifier: Apache-2.0

package transfer

// Device pools (Spec.Device): KV memory on the GPU that the caller registered with the
// transport. Go never addresses it, so the engine names it by address and length only and
// moves it one of two ways, chosen when the receiver starts:
//
//   - rma: the receiver's gets read the sender's device blocks straight into its own
//     (transport.DeviceRMATransport): GPU to GPU, no staging slot, no kernel. It needs both sides'
//     pools to be reachable by gets (device pools, or a device pool on one side and a
//     registered host pool on the other), a transport with device gets, and a peer whose
//     engine offers rma.
//   - staging, through the Spec's Mover (the gather and scatter kernels of a ucx.NewDevice transport),
//     when one is given and the rma route cannot run here.
//
// Otherwise the transfer fails with an ErrDeviceRoute saying why. Once the rma route is
// chosen, a sender that declines it (no device gets on its transport, rma off there, an offer
// it could not make) answers with its decline and both sides stage instead when both specs
// have a Mover (path_device_stage.go); without one the transfer fails with that error, as it
// does for an offer whose ranges do not line up for gets (a layout conversion).

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// DevicePool names a KV pool in device memory registered with the transport: its first
// byte's device address (cuda.Buffer.Mem().Addr, or any address inside a registration) and
// its length. The plan's offsets count from Addr.
type DevicePool struct {
	Addr uint64
	Len  int64
}

func (d DevicePool) set() bool { return d.Addr != 0 || d.Len != 0 }

// ErrDeviceRoute: a device pool has no way to move here; the error says
// why.
var ErrDeviceRoute = errors.New("kvxfer: no route for device memory")

// deviceRouteError says why a transfer of a device pool (Spec.Device) cannot run: no device
// gets on this transport and no Mover to stage with, a peer without rma, or an offer whose
// ranges do not line up for gets. It matches ErrDeviceRoute.
type deviceRouteError struct {
	Reason string
}

// Error implements error.
func (e *deviceRouteError) Error() string { return fmt.Sprintf("%v: %s", ErrDeviceRoute, e.Reason) }

// Is matches ErrDeviceRoute.
func (e *deviceRouteError) Is(target error) bool { return target == ErrDeviceRoute }

// checkDevice is the part of a device spec's checks that needs no transport.
func (s Spec) checkDevice() error {
	if !s.Device.set() {
		return nil
	}
	bad := func(field, reason string, err error) error {
		return &specError{ID: s.ID, Field: field, Reason: reason, Err: err}
	}
	switch {
	case len(s.Pool) > 0:
		return bad("Device", "set either Pool (host memory) or Device (device memory), not both", nil)
	case s.Device.Addr == 0:
		return bad("Device.Addr", "zero address", nil)
	case s.Device.Len <= 0:
		return bad("Device.Len", fmt.Sprintf("%d bytes", s.Device.Len), layout.ErrBufferTooSmall)
	case s.Device.Addr+uint64(s.Device.Len) < s.Device.Addr:
		return bad("Device", fmt.Sprintf("[%#x, +%d) wraps around", s.Device.Addr, s.Device.Len), nil)
	}
	return nil
}

// deviceGets returns the engine's transport as a transport.DeviceRMATransport that can move device
// memory, or nil.
func (e *Engine) deviceGets() transport.DeviceRMATransport {
	dt, ok := e.tr.(transport.DeviceRMATransport)
	if !ok || !dt.DeviceGets() {
		return nil
	}
	return dt
}

// checkDeviceSpec is the part of a device spec's checks that asks the transport: the region
// must be registered device memory where the rma route can run, and without it there must be
// a Mover to stage with.
func (e *Engine) checkDeviceSpec(s Spec) error {
	if !s.Device.set() {
		return nil
	}
	dt := e.deviceGets()
	if dt == nil {
		if s.Mover != nil {
			return nil // staging only
		}
		return &specError{ID: s.ID, Field: "Device", Reason: "this transport cannot get device memory and the spec has no Mover to stage it",
			Err: &deviceRouteError{Reason: "no device gets on this transport (UCX without CUDA?), and no Mover (ucx.Transport.NewMover on a ucx.NewDevice transport) to stage with"}}
	}
	if err := dt.CheckDevice(s.Device.Addr, s.Device.Len); err != nil {
		return &specError{ID: s.ID, Field: "Device", Reason: "not inside one device registration of this transport (RegisterDevice)", Err: err}
	}
	return nil
}

// holdDevice holds the registration of a device spec's pool until the handle quiesces.
func (e *Engine) holdDevice(s Spec) func() {
	if dt := e.deviceGets(); dt != nil && s.Device.set() {
		return dt.HoldDevice(s.Device.Addr, s.Device.Len)
	}
	return nil
}

// poolBytes is the length of this side's pool, host or device.
func (x *xfer) poolBytes() int64 {
	if x.dev.set() {
		return x.dev.Len
	}
	return int64(len(x.pool))
}

// deviceRMAWhyNot says why the rma route cannot move this side's device pool, or "" when it
// can (on a sender, once the receiver's request has named the peer's features).
func (x *xfer) deviceRMAWhyNot() string {
	switch {
	case x.eng.cfg.Tuning.DisableDirect:
		return "Config.Tuning.DisableDirect is set"
	case x.eng.cfg.Tuning.DisableRMA:
		return "Config.Tuning.DisableRMA is set"
	case x.eng.deviceGets() == nil:
		return "this transport cannot get device memory (a UCX without CUDA)"
	case x.rmaTransport() == nil:
		return "this transport serves no rma gets (a UCX transport over TCP only without ucx.Config.ServeEmulatedRMA)"
	case !x.peerHas(wire.FeatureDirect | wire.FeatureRMA):
		return "the peer's engine offers no rma gets"
	}
	return ""
}

// runReceiveDevice picks a device receiver's route: rma, else staging through its Mover, else
// an ErrDeviceRoute (the sender is told, so it does not wait for a request).
func (x *xfer) runReceiveDevice() {
	why := x.deviceRMAWhyNot()
	switch {
	case why == "":
		if !x.reserveTags() {
			return
		}
		x.runReceiveDirect() // path_rma.go takes the device pool
	case x.hasMover:
		x.log().Debug("device pool staged: " + why)
		if !x.reserveTags() {
			return
		}
		x.runReceiveStaging()
	default:
		cause := &requestError{ID: x.h.id, Err: &deviceRouteError{Reason: why + ", and the spec has no Mover to stage with"}}
		x.sendAbort(wire.AbortIncompatible, cause)
		x.queuedExit(cause)
	}
}

// deviceSendRefusal says why this sender's device pool cannot take the route the receiver
// asked for (direct: rma gets, else staging), or nil.
func (x *xfer) deviceSendRefusal(direct, rma bool) error {
	if !x.dev.set() {
		return nil
	}
	switch {
	case direct && !rma:
		return &deviceRouteError{Reason: "the receiver asked for direct messages, which a device pool cannot take (only rma gets)"}
	case direct:
		if why := x.deviceRMAWhyNot(); why != "" && !(rma && x.hasMover) { // else offerRMA declines; the receiver may stage
			return &deviceRouteError{Reason: why}
		}
	case !x.hasMover:
		return &deviceRouteError{Reason: "the receiver asked for staging and this sender's device pool has no Mover"}
	}
	return nil
}

// deviceNoFallback ends a device receiver whose rma route failed after it started: there is
// no IOV fallback for device memory. It reports whether it did.
func (r *rmaReceive) deviceNoFallback(why string) bool {
	x := r.x
	if !x.dev.set() {
		return false
	}
	x.abort(&requestError{ID: x.h.id, Err: &deviceRouteError{Reason: why}}, wire.AbortIncompatible, x.eng.cfg.Tuning.CancelGrace)
	return true
}

// noDeviceMover is the mover of a device spec without one: the engine never stages such a
// pool (deviceSendRefusal and runReceiveDevice refuse first), and this says so if it tried.
type noDeviceMover struct{}

func (noDeviceMover) Gather(*layout.Plan, int64, []byte) error {
	return &deviceRouteError{Reason: "a device pool without a Mover cannot be staged"}
}

func (noDeviceMover) Scatter(*layout.Plan, []byte, int64) error {
	return &deviceRouteError{Reason: "a device pool without a Mover cannot be staged"}
}

// rmaKey describes this side's pool for a peer's gets: a host pool by its slice, a device
// pool by its address.
func (x *xfer) rmaKey(rt transport.RMATransport) (uint64, []byte, error) {
	if x.dev.set() {
		dt := x.eng.deviceGets()
		if dt == nil {
			return 0, nil, &deviceRouteError{Reason: "this transport cannot get device memory"}
		}
		return dt.RMAKeyAt(x.dev.Addr, x.dev.Len)
	}
	return rt.RMAKey(x.pool)
}
