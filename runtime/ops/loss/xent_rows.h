// The cross-entropy's per-row work on a contiguous row of logits
// (xent_cpu.c): exp(l - max) summed, and dy * exp(l - max) written, with
// exp evaluated in double by tpr__xent_exp below instead of libm's scalar
// exp, so the compiler can run eight columns at once.
//
// The same bits on every ISA level: each is plain IEEE double arithmetic
// (no fused multiply-add: contraction is off where these are compiled, see
// xent_rows.c), and the sum keeps eight lanes, column j in lane j % 8,
// added in a fixed tree at the end, whatever the vector width.
#ifndef TPR_OPS_XENT_ROWS_H
#define TPR_OPS_XENT_ROWS_H

#include <stdint.h>

// exp(x) to within a few units in the last place of a double, for the
// cross-entropy's arguments l - max: x <= 0 with real logits; below -708
// it returns 0 (libm: a subnormal, below 2.3e-308, nothing against the
// row's exp(0) = 1); above 709 +inf; NaN stays NaN. Exposed for its test.
double tpr_xent_exp(double x);

// sum over j < n of exp((double)row[j] - m), in the lane order above.
double tpr_xent_row_sumexp(const float *row, int64_t n, double m);

// out[j] = (float)(g * exp((double)row[j] - m)) for j < n.
void tpr_xent_row_grad(const float *row, int64_t n, double m, double g, float *out);

#endif
