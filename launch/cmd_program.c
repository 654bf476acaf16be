// tpr program: build the demo block program, print its listing, memory plan
// and hash, and write or read its serialized bytes ("compile once, ship the
// bytes, run on every rank").
#include <stdio.h>
#include <stdlib.h>

#include "launch/args.h"
#include "launch/commands.h"
#include "models/mlp_block.h"
#include "runtime/file_io.h"

static tpr_status describe(const tpr_program *p, const char *out_path, bool json, bool list) {
  uint8_t *bytes;
  size_t len;
  uint64_t hash;
  tpr_memory_plan plan;
  TPR_CHECK(tpr_program_serialize(p, &bytes, &len));
  tpr_status rc = tpr_program_hash(p, &hash);
  if (rc == TPR_OK) rc = tpr_program_plan_memory(p, &plan, NULL);
  if (rc == TPR_OK && out_path) rc = tpr_file_write(out_path, bytes, len);
  free(bytes);
  TPR_CHECK(rc);
  if (json) {
    printf("{\"values\":%d,\"nodes\":%d,\"bytes\":%zu,\"hash\":\"%016llx\",\"arena_bytes\":%zu,\"naive_bytes\":%zu,"
           "\"buffers\":%d}\n",
           tpr_program_num_values(p), tpr_program_num_nodes(p), len, (unsigned long long)hash, plan.arena_bytes,
           plan.naive_bytes, plan.n_buffers);
    return TPR_OK;
  }
  if (list) tpr_program_dump(p, stdout);
  printf("%d values, %d nodes, %zu bytes serialized, hash %016llx\n", tpr_program_num_values(p),
         tpr_program_num_nodes(p), len, (unsigned long long)hash);
  printf("memory plan: %d buffers, arena %zu bytes (naive %zu)\n", plan.n_buffers, plan.arena_bytes, plan.naive_bytes);
  if (out_path) printf("wrote %s\n", out_path);
  return TPR_OK;
}

int tpr_cmd_program(int argc, char **argv) {
  const char *config = NULL, *out = NULL, *in = NULL;
  int64_t tp = 1;
  bool json = false, quiet = false;
  const tpr_arg args[] = {
      {"config", TPR_ARG_STR, &config, "block config JSON (default: the embedded tiny block)"},
      {"tp", TPR_ARG_INT, &tp, "tensor-parallel degree the program is built for (default 1)"},
      {"out", TPR_ARG_STR, &out, "write the serialized program to this file"},
      {"in", TPR_ARG_STR, &in, "load a serialized program (validating it) instead of building one"},
      {"summary", TPR_ARG_FLAG, &quiet, "omit the per-value listing"},
      {"json", TPR_ARG_FLAG, &json, "print one JSON object"},
  };
  tpr_args_result ar = tpr_args_parse(argc, argv, args, sizeof args / sizeof args[0],
                                      "usage: tpr program [--config FILE] [--tp N] [--out FILE | --in FILE] [--json]");
  if (ar != TPR_ARGS_OK) return ar == TPR_ARGS_HELP ? 0 : 2;
  tpr_program *p = NULL;
  tpr_status rc;
  if (in) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    rc = tpr_file_read(in, &bytes, &len);
    if (rc == TPR_OK) rc = tpr_program_deserialize(bytes, len, &p);
    free(bytes);
  } else {
    tpr_block_config c = tpr_block_config_default();
    rc = config ? tpr_block_config_load(config, &c) : TPR_OK;
    if (rc == TPR_OK) rc = tpr_block_build(&c, tp, &p);
  }
  if (rc == TPR_OK) rc = describe(p, out, json, !quiet);
  tpr_program_free(p);
  if (rc != TPR_OK) {
    fprintf(stderr, "tpr program: error: %s\n", tpr_last_error());
    return 1;
  }
  return 0;
}
