package fused

import (
	"fmt"

	"github.com/fuselm/fuselm/kernels/cudaset"
)

// decodeMaxCluster is attention_cluster.cu's DC_MAX_CLUSTER: the most
// splits of a (row, kv head) that flash_decode_rope's cluster kernels merge
// in their cluster's shared memory (from 2, an instance each).
const decodeMaxCluster = 4

// decodeClusterOn is whether rope_attn_decode takes the cluster kernel where
// it can; a variable, so that a test can hold it to the kernel without.
var decodeClusterOn = true

func decodeClusterKernel(splits, d int) string {
	return fmt.Sprintf("flash_decode_rope_c%d_d%d", splits, d)
}

func decodeClusterModule() cudaset.Module {
	return module("attention_cluster.cu", cudaset.Names(flashDecodeRopeClusterInstances()))
}

// dcKit is flash_decode_rope's cluster kernel on one device.
type dcKit struct {
	err error // why it cannot run here; nil when it can
}

// newDecodeCluster compiles the cluster kernels into k where the device
// allows it (sm_90a), readies their shared memory (flash_decode_rope's) and
// launches them overlapped. It never fails: what went wrong is kept in the
// kit's err, and rope_attn_decode then merges as before.
func newDecodeCluster(k *cudaset.Kit) *dcKit {
	c := &dcKit{}
	what := "rope_attn_decode's cluster merge"
	if c.err = addHopperModule(k, what, "flash_decode_rope_c4", decodeClusterModule()); c.err != nil {
		return c
	}
	for cl := 2; cl <= decodeMaxCluster; cl++ {
		for _, d := range headDims {
			if err := k.FitShared(decodeClusterKernel(cl, d), decodeShared(d)); err != nil {
				c.err = fmt.Errorf("fused: %s: %w", what, err)
				return c
			}
		}
	}
	k.Overlap(decodeClusterModule().Funcs...)
	return c
}

// takes reports whether a cluster kernel runs flash_decode_rope's splits.
func (c *dcKit) takes(splits int) bool {
	return decodeClusterOn && c != nil && c.err == nil && splits >= 2 && splits <= decodeMaxCluster
}
