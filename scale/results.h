// DIR/results.jsonl of tpr scale run: one JSON object per measured point
// (schema "tpr.scale.v1", documented field by field in docs/scale.md), and
// the statistics of repeated runs.
#ifndef TPR_SCALE_RESULTS_H
#define TPR_SCALE_RESULTS_H

#include <stddef.h>

#include "scale/stepmodel.h"

struct cJSON;

#define TPR_SCALE_SCHEMA "tpr.scale.v1"

// Median, first and third quartile of x[0..n) (sorted in place; linear
// interpolation between order statistics, as numpy's default).
void tpr_scale_quartiles(double *x, size_t n, double *q1, double *median, double *q3);

// Checks one results.jsonl object against the schema: every required field
// present with its type, the mesh consistent (np = dp*tp, ep*etp | np),
// quartiles ordered (q1 <= median <= q3), times > 0; the optional
// collective_s holds only collective kinds, each a number >= 0.
// TPR_ERR_FORMAT naming the first offending field.
tpr_status tpr_scale_result_validate(const struct cJSON *j);

// A validated point, as the model needs it.
typedef struct tpr_scale_point {
  tpr_workload workload;
  tpr_scale_mesh mesh;
  tpr_scale_work work;
  double step_s, step_q1, step_q3, tokens_per_s;
  double cores, sgemm_gflops, read_gbs;  // machine
  double read_gbs_node, sgemm_gflops_busy;  // optional: every core busy (0: not measured)
  // collective_s (optional: sweeps before it lack it): measured seconds per
  // step in each collective kind on rank 0.
  bool has_coll;
  double coll_s[TPR_COLL_COUNT];
  char config[256];
} tpr_scale_point;

tpr_status tpr_scale_point_from_json(const struct cJSON *j, tpr_scale_point *out);

// Reads every line of path (validated); *points malloc'ed.
tpr_status tpr_scale_read_results(const char *path, tpr_scale_point **points, size_t *n);

#endif
