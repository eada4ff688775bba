package kerneltest

import "github.com/fuselm/fuselm/kernels"

// table is every op's cases, in the op table's order (kernels.AllOps), as
// ggml's test-backend-ops has one test case per op serving both its eval
// and its perf modes: an op's checks, which Run holds every set to the cpu
// set on, and its benchmark, which kbench times every set on (nil for an op
// not worth timing alone). Adding an op adds its row here, naming its
// checks (cases.go) and its benchmark (bench.go).
var table = []opCases{
	{kernels.OpEmbedding, embeddingChecks, nil},
	{kernels.OpLinear, linearChecks, linearBench},
	{kernels.OpRMSNorm, rmsNormChecks, rmsNormBench},
	{kernels.OpAddRMSNorm, addRMSNormChecks, addRMSNormBench},
	{kernels.OpAdd, addChecks, nil},
	{kernels.OpAddAddRMSNorm, addAddRMSNormChecks, addAddRMSNormBench},
	{kernels.OpRoPE, ropeChecks, ropeBench},
	{kernels.OpSwiGLU, swiGLUChecks, swiGLUBench},
	{kernels.OpLinearSwiGLU, linearSwiGLUChecks, linearSwiGLUBench},
	{kernels.OpRMSNormRoPE, rmsNormRoPEChecks, rmsNormRoPEBench},
	{kernels.OpLinearAdd, linearAddChecks, linearAddBench},
	{kernels.OpNormLinear, normLinearChecks, normLinearBench},
	// add_add_rms_norm_linear's worth is the overlap with the kernel before
	// it in a decode step (its projection's weights streamed under that
	// kernel's tail), which no benchmark of the op alone shows.
	{kernels.OpAddAddNormLinear, addAddNormLinearChecks, nil},
	{kernels.OpNormSwiGLU, normSwiGLUChecks, normSwiGLUBench},
	{kernels.OpLinearNormLinear, linearNormLinearChecks, linearNormLinearBench},
	{kernels.OpLinearNormSwiGLU, linearNormSwiGLUChecks, linearNormSwiGLUBench},
	{kernels.OpAttnPrefill, attnPrefillChecks, attnPrefillBench},
	{kernels.OpAttnDecode, attnDecodeChecks, attnDecodeBench},
	{kernels.OpRoPEAttnDecode, ropeAttnDecodeChecks, ropeAttnDecodeBench},
	{kernels.OpMLAPrefill, mlaPrefillChecks, mlaPrefillBench},
	{kernels.OpMLADecode, mlaDecodeChecks, mlaDecodeBench},
	{kernels.OpMLADecodeRoPE, mlaDecodeRoPEChecks, mlaDecodeRoPEBench},
	{kernels.OpMoERoute, moeRouteChecks, nil},
	{kernels.OpMoEExperts, moeExpertsChecks, moeExpertsBench},
	{kernels.OpMoERouted, moeRoutedChecks, moeRoutedBench},
	{kernels.OpGroupGemm, groupGemmChecks, groupGemmBench},
	{kernels.OpArgmax, argmaxChecks, nil},
	{kernels.OpDecodeAdvance, decodeAdvanceChecks, nil},
}

// opCases is one op's row of table.
type opCases struct {
	op     kernels.Op
	checks func(l *caseList) // adds the op's check cases
	bench  *Bench            // its benchmark (its Op is the row's), or nil
}

// benches is the table's benchmarks, each given its row's op.
var benches = func() []*Bench {
	var bs []*Bench
	for _, row := range table {
		if row.bench != nil {
			row.bench.Op = row.op
			bs = append(bs, row.bench)
		}
	}
	return bs
}()
