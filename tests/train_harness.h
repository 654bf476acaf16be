// The harness the training tests share (test_train_m2, and
// test_train_family for the other families): `tpr train` runs on a PyTorch
// training fixture (scripts/reference/train_fixture.py: tokens.npy,
// meta.json, step0_grads.safetensors, final_params.safetensors), the
// per-step JSON reports, the tensor-file comparison, and the checks every
// family makes (step 0 on a list of meshes, the AdamW steps, a resume bit
// for bit, refusals). Each family keeps its meshes and controls.
#ifndef TPR_TEST_TRAIN_HARNESS_H
#define TPR_TEST_TRAIN_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "cli_util.h"

#define TH_LOSS_BOUND 1e-5   // relative, step 0 (the bar)
#define TH_GRAD_BOUND 1e-4   // max|d| / max|g| per tensor (the bar)
#define TH_STEPS_BOUND 1e-4  // relative, losses and parameters after the AdamW steps

#define MESH(...) ((const char *const[]){__VA_ARGS__, NULL})

// The fixture under test, set by th_setup.
typedef struct th_fixture {
  char tpr[4096];     // the tpr binary
  char tmp_dir[256];  // this run's scratch directory
  const char *fix;    // the training fixture's directory
  const char *model;  // the model it trains
  cJSON *meta;        // fix/meta.json
  // Appended to every training run's arguments (th_train_n, th_resume):
  // an MRoPE family's fixture positions ("--positions-3d", FILE). NULL: none.
  const char *const *run_args;
} th_fixture;
extern th_fixture th;

// tpr found, a fresh scratch directory from `tmp_template` (mkdtemp's
// XXXXXX), meta.json read; 0 on success, -1 otherwise (cmocka setup).
int th_setup(const char *test, const char *tmp_template, const char *fix, const char *model);
// meta freed, the scratch directory removed (a cmocka group teardown).
int th_teardown(void **state);

// meta.json's number at a dotted path ("optimizer.lr_schedule.lr_max"), or
// element `index` of the array there (index < 0: the number itself).
double th_meta_at(const char *path, int index);
// Appends the fixture's hyperparameters (a `steps`-step schedule) to args.
// aux: the aux-loss weight to pass (the fixture's unless a control changes it).
void th_add_hparams(const char **args, int *n, int steps, double aux);

// One `tpr train --json` run of a `steps`-step schedule on the fixture's
// tokens in order; returns the per-step JSON reports, which must be `lines`
// (steps, unless the run stops early). The closing summary must carry the
// peak RSS. failed NULL: a failed run fails the test; otherwise *failed gets
// the run (the caller's to tt_run_done) and a failed run returns NULL.
cJSON *th_train_n(int np, const char *const *mesh, int steps, int lines, double aux, const char *const *extra,
                  run_result *failed);
// th_train_n of `steps` lines; a failed run fails the test.
cJSON *th_train(int np, const char *const *mesh, int steps, double aux, const char *const *extra);
// `tpr train --resume from --save save --json` on the fixture's tokens (the
// order from the checkpoint unless extra names one) with the hyperparameters
// of a `steps`-step schedule; the run is the caller's to check and free.
run_result th_resume(int np, const char *from, const char *save, const char *const *mesh, int steps, double aux,
                     const char *const *extra, int timeout_s);
// Step report i's number `key`.
double th_step_num(const cJSON *steps, int i, const char *key);

// Worst max|a-b|/max|b| over the tensors of `want` (every one must be in
// got, of the same shape; more than min_tensors of them); *worst_name the
// tensor it was found in.
double th_compare_files(const char *got_path, const char *want_path, int min_tensors, const char **worst_name);
// Step 0 on one mesh: the loss (relative error in *loss_err) and every
// gradient against PyTorch's (the worst returned); prints both.
double th_step0(int np, const char *const *mesh, double aux, const char *const *extra, int min_tensors,
                double *loss_err);

typedef struct th_mesh_case {
  int np;
  const char *const *mesh;
} th_mesh_case;
// th_step0 on each case within TH_LOSS_BOUND and TH_GRAD_BOUND.
void th_check_step0(const th_mesh_case *cases, size_t n, double aux, int min_tensors);
// The fixture's `total` AdamW steps (warmup, cosine decay, clipping) on one
// mesh, saved to `save`: every step's loss and the saved parameters against
// PyTorch's within TH_STEPS_BOUND; prints both.
void th_check_steps(int np, const char *const *mesh, int total, double aux, const char *save, int min_tensors);
// The same, the losses checked; returns the parameters' distance from
// PyTorch's (the worst tensor's max |difference| / max |value|).
double th_steps_distance(int np, const char *const *mesh, int total, double aux, const char *save, int min_tensors);
// A tp 2 run of `total` steps stopped after total/2 and resumed from its
// checkpoint reaches the uninterrupted run's weights and moments bit for bit.
void th_check_resume(int total, double aux);
// `tpr args...` at np ranks must fail with `expect` in its stderr; prints it.
void th_check_refusal(const char *what, int np, const char *const *args, const char *expect);

// --save writes the model as the family's transformers class saves it:
// one step at lr 1e-30 (far below an f32 weight's last bit) saves every
// tensor of th.model -- itself save_pretrained's output -- byte for byte
// under the same names (vision towers included); one at lr 1e-2 changes
// some (the control). positions_3d: the fixture's file for MRoPE families,
// or NULL. Returns the moved save's directory (static storage).
const char *th_check_save_as_saved(const char *positions_3d);

// th_check_steps over the fixture's whole schedule on each of n meshes
// (nps[i] ranks), saving to the scratch directory; each save's config.json
// names model_type (what from_pretrained picks the class by).
void th_check_steps_meshes(int n, const int *nps, const char *const *const *meshes, double aux, int min_tensors,
                           const char *model_type);

#endif
