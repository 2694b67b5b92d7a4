// SPDX-License-Identifier: Apache-2.0

package native

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Endpoint reports as UCX 1.13.1 (Debian) prints them for loopback endpoints.
const (
	infoTCP = `#
# UCP endpoint 
#
#               peer: <no debug data>
#                 lane[0]:  1:tcp/lo.0 md[1]                -> md[1]/tcp/sysdev[255] am am_bw#0 keepalive wireup
#
#                tag_send: 0..<egr/short>..8185..<egr/zcopy>..20553..<rndv>..(inf)
#            tag_send_nbr: 0..<egr/short>..8185..<egr/bcopy>..262144..<rndv>..(inf)
#           tag_send_sync: 0..<egr/short>..8185..<egr/zcopy>..20553..<rndv>..(inf)
#
#                  rma_bw: mds rndv_rkey_size 9
#
`
	infoShm = `#
# UCP endpoint 
#
#               peer: <no debug data>
#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0 keepalive
#                 lane[1]:  4:posix/memory.0 md[3]          -> md[3]/posix/sysdev[255]
#
#                tag_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)
#            tag_send_nbr: 0..<egr/short>..93..<egr/bcopy>..262144..<rndv>..(inf)
#           tag_send_sync: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)
#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)
#                  get[0]: 0..<bcopy>..(inf)
#                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)
#                  get[1]: 0..<bcopy>..(inf)
#
#                  rma_bw: mds rndv_rkey_size 9
#
`
)

func TestParseEndpointInfo(t *testing.T) {
	for _, tc := range []struct {
		desc, info string
		want       EndpointLanes
	}{
		{"tcp: gets emulated", infoTCP, EndpointLanes{Transports: []string{"tcp/lo.0"}}},
		{"shared memory: native gets", infoShm, EndpointLanes{Transports: []string{"sysv/memory.0", "posix/memory.0"}, NativeGet: true}},
		{"nothing printed", "", EndpointLanes{}},
		{"rma_bw line alone is no get lane", "# rma_bw: mds rndv_rkey_size 9\n# getter: x\n", EndpointLanes{}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			require.Equal(t, tc.want, ParseEndpointInfo(tc.info))
		})
	}
}
