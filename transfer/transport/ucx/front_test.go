// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The Transport a program holds keeps none of the contract, not even transport.Transport: what
// only the engine calls is on the implementation transfer.New resolves it to
// (internal/transportimpl), every one of them, and calls on the Transport reach that same
// implementation.
func TestTransport_ShowsAProgramOnlyWhatItCalls(t *testing.T) {
	tr, err := New(Config{StagingBytes: 1 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close(true)) }()

	impl := transportimpl.Of(tr)
	require.Same(t, tr.u, impl, "transfer.New drives the UCX transport itself")
	front := reflect.TypeFor[*Transport]()
	for _, capability := range []reflect.Type{
		reflect.TypeFor[transport.Transport](), reflect.TypeFor[transport.DirectTransport](), reflect.TypeFor[transport.RMATransport](),
		reflect.TypeFor[transport.RMAEmulation](), reflect.TypeFor[transport.RMAKeyPreparer](),
		reflect.TypeFor[transport.RMAMapper](), reflect.TypeFor[transport.RMALanes](),
		reflect.TypeFor[transport.RMAGenerations](), reflect.TypeFor[transport.GenerationWords](),
		reflect.TypeFor[transport.PoolHolder](), reflect.TypeFor[transport.TagReserver](),
		reflect.TypeFor[transport.TransportHealth](), reflect.TypeFor[transport.ControlBound](),
		reflect.TypeFor[transport.LargeSegmentSender](), reflect.TypeFor[transport.PeerCloser](),
		reflect.TypeFor[transport.ParamsIssuer](), reflect.TypeFor[transport.DeviceRMATransport](),
	} {
		require.False(t, front.Implements(capability), "*ucx.Transport shows %v", capability)
		require.True(t, reflect.TypeOf(impl).Implements(capability), "the implementation lacks %v", capability)
	}
	require.Equal(t, tr.u.Self(), tr.Self())
	require.Equal(t, tr.u.StagingMemory(), tr.StagingMemory())
	var nilFront *Transport
	require.Nil(t, transportimpl.Of(nilFront), "a nil *Transport resolves to no transport: transfer.New refuses it")

	_, err = tr.NewMover(1, cuda.Mem{Addr: 1 << 40, Size: 1 << 20})
	require.ErrorIs(t, err, ErrDeviceMemory, "a Mover needs a device transport")
}
