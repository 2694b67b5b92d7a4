// SPDX-License-Identifier: Apache-2.0

// Package transfer is kvxfer's engine: it moves one request's KV blocks from a sending
// (prefill) engine to a receiving (decode) engine through staging slots, over any Transport,
// and never wedges.
//
// A program starts with a few names: New (a Transport and a Config, whose zero value works),
// Engine.Send and Engine.Receive (a Spec: request id, peer, plan, pool), the *Handle they
// return (Status, Done, Quiesced, Release), Engine.Cancel and its CancelOutcome's FreeNow,
// Engine.Health, and RequestIDs for a serving engine's string request ids. The rest tunes,
// observes or explains those. Config holds what a serving program decides (slot size and
// memory, concurrency, deadlines, cluster keys, logger, observer); the knobs it leaves at their
// defaults (the data paths' switches and thresholds, the pipeline depth, health budgets, the
// protocol's retries) are in Config.Tuning, package transfer/tuning.
//
// # Lifecycle
//
// Send and Receive return a *Handle at once; either side may be called first. A handle moves
// through one table (state.go): queued, advertised, in flight, then completed, failed or
// cancelled; or quarantined first, when it failed while the transport could still touch its
// memory. Status never blocks. Done closes once the outcome is decided; Quiesced closes once
// the caller may free or reuse the request's KV blocks. The engine never frees caller memory
// and tells "quiescent" exactly once.
//
// Engine.Cancel returns one of six outcomes (see CancelOutcome): only NotFound,
// AlreadyComplete and CancelledBeforeAdvertise let the caller free the blocks at once; after
// the others it waits for Quiesced.
//
// # Bounded waits
//
// Every wait has a bound: the queued phase ends at the Send/Receive context's deadline or
// Config.QueueTimeout; a started transfer at its deadline (Spec.Timeout, counted from its first
// slot lease); a quarantined one at Config.Tuning.QuarantineTimeout, when the slots the transport
// never released are poisoned (taken out of circulation for good) rather than trusted. Health
// reports unhealthy, with the reason, when no byte moved and no transfer completed for
// Config.ProgressDeadline while transfers were asked for (in flight, or failing one after
// another), when quarantines exceed their budget, or when poisoned slots leave
// too few. Only Drain and Close block, and both are bounded.
//
// # Data path
//
// The receiver leases a slot, posts a tagged receive into it and sends a request-info message;
// the sender gathers chunks of the stream into its own slots (through a Mover: the engine's own for host
// pools, ucx.DeviceMover for GPU pools with ucx.NewDevice) and sends them; the receiver scatters each chunk and reposts the
// slot. A transfer holds at most Config.Tuning.PipelineDepth slots and needs only one, so a request
// of any size streams through a small pool.
//
// # The direct (one-copy) path
//
// When the transport implements transport.DirectTransport and both sides' pools are reachable in place
// (ucx.Transport.AllocatePool), the receiver asks for the direct path (FlagDirect): each chunk
// is one IOV message straight from the sender's pool into the receiver's, no slot, no gather
// or scatter. Same lifecycle; the one difference is L9 on caller memory: an operation whose
// quiescence is unknown leaves the handle Quarantined for good, Status.BlocksPoisoned set and
// Quiesced never closed. Config.Tuning.DisableDirect forces staging. When the transport also
// implements transport.RMATransport and the two layouts line up (same block-major layout, say), the
// direct path runs in its RMA mode: the sender offers its pool (RMAOffer) and the receiver
// reads it with gets, pool range to pool range; Handle.Path says which path ran, and
// Config.Tuning.DisableRMA keeps the IOV messages. See docs/onecopy.md.
//
// A KV pool in device memory the caller registered with the transport
// (ucx.Transport.RegisterDevice) goes in Spec.Device, by address and length: the RMA mode then
// reads it GPU to GPU (transport.DeviceRMATransport), with no slot and no kernel; where that cannot run,
// the engine stages it through the Spec's Mover, or fails with an ErrDeviceRoute saying why
// (device.go; docs/kvcache.md, "GPU memory").
//
// # Multi-peer requests
//
// A Receive may name several peers (Spec.Subs), each with its own plan: a TP=1 rank receiving
// the two halves of its heads from two TP=2 ranks. The handle is terminal only when every
// sub-transfer is, and a first error stops the siblings without releasing memory they may
// still write.
//
// # Streaming and partial transfers
//
// A Send with Spec.Stream may open before its KV is complete: the caller marks layers ready
// (Handle.MarkLayersReady, or Spec.Ready signals such as CUDA events, polled without blocking)
// and chunks of ready layers go at once, cut at layer boundaries when the receiver asks
// (its Spec.Stream). The deadline still counts from the first slot lease, so it covers the
// rest of prefill; a transfer waiting on the model is not counted as stalled by Health. A
// Receive names the blocks it already holds (Spec.Held); the request-info message carries
// them, and both sides drop the same positions. See docs/streaming.md.
//
// # Testing
//
// Package transport/mem's Network is an in-process transport that moves real bytes and injects
// faults (delay, hang, partial failure, dropped or duplicated control messages, late
// completion, silence about quiescence, lost peers).
//
// # Transports
//
// An engine runs over any transport.Transport (package transfer/transport: the contract, its
// optional capabilities and the errors both sides share; transfer re-exports only the errors
// and the few types a caller of the engine meets: Transport, Peer, RequestID). The UCX
// transport is package transfer/transport/ucx, the in-memory one transfer/transport/mem; a
// new transport is a new package beside them that passes the conformance suite in
// transfer/transport/transporttest.
package transfer
