// Model architecture from a Hugging Face config.json.
//
// One struct for every MoE family we run, so the sharding planner and the
// model builders read the same numbers whatever the checkpoint. Keys and
// defaults follow each family's Hugging Face configuration class; what
// differs between families (where QK-norm sits, how the router scores,
// shared experts) is a field here, never a check of model_type elsewhere.
//
// Not read yet: rope_scaling, quantization_config (MiniMax-M2 ships block
// FP8), the MTP modules (use_mtp, num_mtp_modules), attention biases (but
// qwen2_vl's q/k/v ones).
#ifndef TPR_MODEL_CONFIG_H
#define TPR_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/status.h"

typedef enum tpr_model_family {
  TPR_FAMILY_MINIMAX_M2 = 0,   // "minimax_m2"
  TPR_FAMILY_QWEN3_MOE = 1,    // "qwen3_moe"
  TPR_FAMILY_HUNYUAN_V1_MOE = 2,  // "hunyuan_v1_moe"
  TPR_FAMILY_QWEN3_VL_MOE = 3,  // "qwen3_vl_moe": its text decoder (Qwen3-MoE + interleaved MRoPE)
  TPR_FAMILY_QWEN2_VL = 4,  // "qwen2_vl" (and "qwen2_5_vl"): its text decoder (dense Qwen2, q/k/v biases, sectioned MRoPE)
  TPR_FAMILY_MINIMAX = 5,   // "minimax" (MiniMax-Text-01): lightning attention layers beside softmax ones, MoE
  TPR_FAMILY_MINICPM_SALA = 6,  // "minicpm_sala": lightning layers beside InfLLM-v2 sparse ones, dense MLP, muP
                                // (parsed; the engine has no family for it yet)
  TPR_FAMILY_COUNT
} tpr_model_family;

// Where the Q/K RMSNorm is applied (docs/architecture.md section 6).
typedef enum tpr_qk_norm {
  TPR_QK_NORM_NONE = 0,
  // MiniMax-M2 "per_layer": one RMS over the whole projection (nq*D for q,
  // nkv*D for k) before the reshape to heads; weight (nq*D) / (nkv*D). Under
  // tensor parallelism it needs an all-reduce of the sums of squares.
  TPR_QK_NORM_FULL = 1,
  // Qwen3 / Hunyuan: RMS over head_dim of each head after the reshape;
  // weight (D), shared by all heads, local to every rank.
  TPR_QK_NORM_PER_HEAD = 2,
} tpr_qk_norm;

typedef enum tpr_router_score {
  TPR_ROUTER_SOFTMAX = 0,  // softmax over experts, top-k
  TPR_ROUTER_SIGMOID = 1,  // sigmoid per expert; top-k of sigmoid (+ bias if routing_bias)
} tpr_router_score;

typedef struct tpr_model_config {
  tpr_model_family family;
  int64_t vocab_size;
  int64_t hidden_size;         // H
  int64_t num_layers;          // num_hidden_layers
  int64_t num_heads;           // nq: num_attention_heads
  int64_t num_kv_heads;        // nkv: num_key_value_heads (default nq)
  int64_t head_dim;            // D (default H / nq)
  int64_t rotary_dim;          // leading dims of each head that RoPE rotates (<= D, even)
  double rope_theta;
  // MRoPE (Qwen-VL text decoders): rope positions (3, T) (temporal, height,
  // width); the layout is runtime/ops/rope/rope.h's tpr_mrope_layout (0
  // plain RoPE, 1 sectioned, 2 interleaved), mrope_section [t, h, w] sums to
  // rotary_dim / 2.
  int mrope_layout;
  int64_t mrope_section[3];
  double rms_norm_eps;
  tpr_qk_norm qk_norm;
  bool qk_norm_after_rope;     // Hunyuan: q/k are roped first, then normalised (Qwen3: norm, then RoPE)
  bool tie_word_embeddings;    // lm_head shares embed_tokens (no lm_head tensor)
  bool qkv_bias;               // q/k/v projections carry a bias (Qwen2-VL); o_proj never does

  // Mixture of experts. A dense model (qwen2_vl) has num_experts 0 (and
  // experts_per_tok, moe_intermediate_size, num_moe_layers 0): every layer
  // is the dense MLP of dense_intermediate_size.
  int64_t num_experts;           // routed experts per MoE layer
  int64_t experts_per_tok;       // top-k
  int64_t moe_intermediate_size; // each routed expert's FFN width
  tpr_router_score router;
  bool routing_bias;             // e_score_correction_bias added for selection only
  bool norm_topk_prob;           // renormalise the chosen k weights to sum to 1
  double router_aux_loss_coef;   // weight of the load-balancing loss in training (default 0.001)
  int64_t shared_expert_intermediate_size;  // 0: no shared expert; else one SwiGLU MLP of this width on every token

  // Layers with a dense MLP instead of the MoE block (qwen3_moe's
  // mlp_only_layers / decoder_sparse_step); num_moe_layers + dense = num_layers.
  int64_t num_moe_layers;
  int64_t dense_intermediate_size;  // width of those dense MLPs (0 when none)
  // Which layers those are (qwen3_moe): decoder_sparse_step (0 read as 1)
  // and mlp_only_layers as a bit set (indices < 256; the parser refuses more).
  int64_t decoder_sparse_step;
  uint64_t mlp_only_mask[4];

  // Hybrid linear attention (minimax; docs/lightning-attention.md). The
  // layers whose layer_types entry is "linear_attention" run lightning
  // attention (qkv_proj, output_gate, out_proj, a norm over the whole
  // heads*D), the others softmax attention; a bit set of layer indices (< 256).
  // Zero in every other family.
  uint64_t linear_mask[4];
  int64_t num_linear_layers;
  int64_t linear_block_size;  // block_size: the lightning prefill's block (>= 1 when linear layers exist)
  // The decoder layer's weighted residuals (MiniMaxDecoderLayer):
  //   h = input_layernorm(x);         x = alpha_attn * h + beta_attn * attn(h)
  //   h = post_attention_layernorm(x); x = mlp_alpha * h + mlp_beta * mlp(h)
  // note the residual is the *normed* value. [0] softmax layers
  // (full_attn_*), [1] linear layers (linear_attn_*).
  double attn_alpha[2], attn_beta[2], mlp_alpha, mlp_beta;

  // MiniCPM-SALA (model_config_sala.c, docs/minicpm-sala.md); zero in every
  // other family. Its lightning layers are linear_mask's, the rest InfLLM-v2
  // sparse attention; the decoder layer is pre-norm with scaled residuals:
  //   x += residual_scale * attn(input_layernorm(x)); x += residual_scale * mlp(post_attention_layernorm(x)).
  int64_t linear_kv_heads;   // lightning_nkv: the lightning layers' k/v heads (q has num_heads of head_dim)
  bool linear_alibi_slopes;  // lightning decay slopes are ALiBi's in every layer (tpr_alibi_slopes), q scaled
                             // by 1/sqrt(head_dim), not MiniMax's per-layer slopes
  bool linear_rope;          // lightning_use_rope: RoPE on the lightning layers' q and k (after their norm)
  bool linear_qk_norm;       // qk_norm: RMSNorm over head_dim of each lightning q and k head
  bool linear_out_norm;      // use_output_norm: RMSNorm over all heads' outputs together (o_norm)
  bool linear_out_gate;      // use_output_gate: o * sigmoid(z_proj(x))
  bool attn_nope;            // the softmax (sparse) layers have no position encoding (attn_use_rope false)
  bool attn_out_gate;        // attn_use_output_gate: o * sigmoid(o_gate(x)) before o_proj
  // muP: embeddings times embed_scale (scale_emb), residual branches times
  // residual_scale (scale_depth / sqrt(num_hidden_layers)), the lm head reads
  // norm(h) / logit_divisor (hidden_size / dim_model_base). 0 where unused.
  double embed_scale, residual_scale, logit_divisor;
  // InfLLM-v2 sparse attention (sparse_config; tpr_pb_sparse_attention_paged's numbers).
  int64_t sparse_kernel_size, sparse_kernel_stride, sparse_block_size, sparse_topk, sparse_init_blocks,
      sparse_window_size, sparse_dense_len;
} tpr_model_config;

// MiniCPM-SALA's own keys (model_config_sala.c), after the shared ones:
// `root` a cJSON object.
tpr_status tpr__model_config_sala(const void *root, const char *origin, tpr_model_config *c);

// Whether layer l runs lightning (linear) attention (minimax's layer_types).
bool tpr_model_config_layer_is_linear(const tpr_model_config *c, int64_t l);

// A Qwen-VL text config's MRoPE keys (model_config_mrope.c) into c:
// `text_config` a cJSON object, layout 1 sectioned / 2 interleaved.
tpr_status tpr__model_config_mrope(const void *text_config, const char *origin, int layout, tpr_model_config *c);

// Whether layer l runs the MoE block (else a dense MLP): Qwen3MoeDecoderLayer's
// rule, l not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0;
// never in a model without experts.
bool tpr_model_config_layer_is_moe(const tpr_model_config *c, int64_t l);

// "minimax_m2", "qwen3_moe", "hunyuan_v1_moe", "qwen3_vl_moe", "qwen2_vl", "minimax", "minicpm_sala"; "?" if invalid.
const char *tpr_model_family_name(tpr_model_family f);

// Loads `path`: a config.json file, or a directory holding one. Unknown
// model_type, a missing required key, a value of the wrong JSON type and
// inconsistent values are TPR_ERR_FORMAT naming the key and the file; a known
// family this build cannot read yet is TPR_ERR_UNSUPPORTED.
tpr_status tpr_model_config_load(const char *path, tpr_model_config *out);

// The same from JSON text; `origin` names it in error messages.
tpr_status tpr_model_config_parse(const char *json, size_t len, const char *origin, tpr_model_config *out);

// Consistency checks shared by the loader and by callers that fill the struct
// by hand (tests, the planner): positive sizes, nq % nkv == 0, rotary_dim even
// and <= D, top-k <= experts, ... TPR_ERR_FORMAT naming the HF key and origin.
tpr_status tpr_model_config_validate(const tpr_model_config *c, const char *origin);

#endif
