// SPDX-License-Identifier: Apache-2.0

package native

import (
	"strings"
)

// EndpointLanes is what UCX reports about an endpoint's lanes (ucp_ep_print_info, which
// Endpoint.Info returns): the transport of each lane, and whether any lane serves RMA gets
// itself. UCX 1.13's ucp_ep_query cannot say either, so the printed report is parsed.
type EndpointLanes struct {
	// Transports names each lane's transport and device in lane order, as UCX prints it
	// ("posix/memory.0", "tcp/lo.0").
	Transports []string
	// NativeGet: at least one lane serves gets (a "get[lane]" protocol line): a get is one
	// copy by the transport (posix's attached segment, cma, RDMA). Without one UCX emulates
	// gets with active messages over the lanes it has (TCP in UCX 1.13): the peer's worker
	// answers each get, and its copies go through both processes.
	NativeGet bool
}

// ParseEndpointInfo reads Endpoint.Info's text. Lines it does not know are ignored, so a UCX
// that prints more says no less; one that prints less reports no lanes and no native get.
func ParseEndpointInfo(info string) EndpointLanes {
	var l EndpointLanes
	for _, line := range strings.Split(info, "\n") {
		f := strings.Fields(strings.TrimLeft(line, "# \t"))
		if len(f) == 0 {
			continue
		}
		switch {
		case strings.HasPrefix(f[0], "lane[") && strings.HasSuffix(f[0], "]:") && len(f) > 1:
			// lane[0]:  1:tcp/lo.0 md[1] -> md[1]/tcp/sysdev[255] am am_bw#0 keepalive wireup
			tl := f[1]
			if i := strings.IndexByte(tl, ':'); i >= 0 {
				tl = tl[i+1:]
			}
			l.Transports = append(l.Transports, tl)
		case strings.HasPrefix(f[0], "get[") && strings.HasSuffix(f[0], "]:"):
			// get[0]: 0..<bcopy>..(inf)
			l.NativeGet = true
		}
	}
	return l
}
