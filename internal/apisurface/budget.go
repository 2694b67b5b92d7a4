// SPDX-License-Identifier: Apache-2.0

package apisurface

// Budgets caps each public package's exported identifiers (Count), by folder relative to the
// module root. A package may shrink below its budget; lower the budget with it, so the surface
// never grows back unnoticed. A new public package needs an entry.
//
// The goal: the packages a serving program imports (UserPackages) list at most UserGoal in all.
var Budgets = map[string]int{
	"buffer":                           42,
	"cuda":                             68,
	"cuda/cudatest":                    5,
	"cuda/gpuinfo":                     27,
	"layout":                           59,  // -21 issue 27: the plan arithmetic (Runs, UnitOffset, Chunks, Shape, ...) in internal/kvplan
	"layout/layouttest":                9,   // +2 ReferenceGather, ReferenceScatter (from layout: test ground truth)
	"native":                           168, // +2 Worker.TagRecvBytesStanding and Request.Next (the transport's control receive, posted again by its worker as each message completes it: docs/ucx.md, "Standing receives"); +1 Endpoint.ForceCloseDeparted (the goodbye's close over shared memory, called by transfer/transport/ucx); +1 MaxLanes (ucx.Config.Lanes' bound, for kvxbench's flag check); +4: WorkerConfig.UnexpectedBytes and the WorkerStats counts of held and discarded unexpected messages; +1 Settings (kvxbench's env.ucx_settings, bench-paths' perftest baseline)
	"transfer":                         150, // +1 Transport.Close: Transport is what New takes, not the whole contract; issue 27: tuning knobs to transfer/tuning, health numbers to transfer/health; observer plumbing, transport-owned and misuse errors, HostMover, SealableParams unexported or gone (CHANGELOG)
	"transfer/discovery":               39,  // -4 issue 27: Serve and Server in internal/registryserver (kvxbench, stress, tests)
	"transfer/discovery/discoverytest": 8,
	"transfer/discovery/etcd":          0,
	"transfer/health":                  24,  // transfer.Health.Numbers (from transfer.HealthSnapshot): observe's gauges
	"transfer/observe":                 40,  // -10 issue 27: the path constants, HealthFunc, Live, LivenessTimeout, MaxTracked, DurationBuckets unexported
	"transfer/transport":               141, // +7 Params, ParamsIssuer, AuthClaimed and the exposure's transport contract; +7 Exposure and its fields (one-hop reads, docs/protocol.md)
	"transfer/transport/mem":           57,
	"transfer/transport/transporttest": 18,
	"transfer/transport/ucx":           62, // +1 Config.ServeEmulatedRMA (a transport over TCP only opens UCX without RMA unless it is set: docs/security.md), -1 SenderPeer (it was PeerFromAddress(cp.WorkerAddress)); -7: Bind, SendControl, PostSend, PostRecv, Cancel (the contract, reached through internal/transportimpl), MaxLanes and MaxTCPSegmentBytes (native); -51 issue 27: the contract's capabilities on the implementation behind Transport (internal/transportimpl), DeviceTransport folded into Transport; CMAStats in internal/cmastats; ContextParams's wire sections (Exposure, Anonymous, Seal, ParamsSeal) and Region.RemoteKey unexported; DefaultStagingBytes (from transferdefaults), ContextParamsSecretBytes and ContextParamsMaxAddress (wire)
	"transfer/tuning":                  23, // transfer.Config's knobs a serving program leaves at their defaults, and None (from transfer)
}

// UserPackages are the packages a prefill/decode program imports (examples/); UserGoal is
// what their surfaces may add up to.
var UserPackages = []string{"transfer", "transfer/transport/ucx", "transfer/discovery", "transfer/observe", "layout"}

// UserGoal is the most exported identifiers UserPackages may list in all.
const UserGoal = 350
