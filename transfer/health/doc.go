// SPDX-License-Identifier: Apache-2.0

// Package health holds Numbers, the counts and times behind an engine's health verdict
// (transfer.Engine.Health returns them as transfer.Health.Numbers).
//
// Who imports it: package transfer/observe, which exports each number as a gauge and adds them
// up over several engines (observe.CombineHealth), and a test or tool that builds a
// transfer.Health by hand. A serving program reads the verdict (Health.Healthy, Health.Reason)
// through observe's probes and the numbers through its /metrics, and needs no import of this
// package; docs/lifecycle.md says what each number means for L12.
package health
