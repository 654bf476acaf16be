// Levelled logging to stderr with a rank prefix: "[tpr r3 WARN] message".
// The level comes from TPR_LOG_LEVEL (error|warn|info|debug|trace or 0..4),
// default warn, read once on first use.
#ifndef TPR_LOG_H
#define TPR_LOG_H

typedef enum tpr_log_level {
  TPR_LOG_ERROR = 0,
  TPR_LOG_WARN = 1,
  TPR_LOG_INFO = 2,
  TPR_LOG_DEBUG = 3,
  TPR_LOG_TRACE = 4,
} tpr_log_level;

// Rank shown in the prefix; -1 (the default) shows no rank.
void tpr_log_set_rank(int rank);
void tpr_log_set_level(tpr_log_level level);
tpr_log_level tpr_log_get_level(void);
void tpr_log(tpr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TPR_LOG_ERR(...) tpr_log(TPR_LOG_ERROR, __VA_ARGS__)
#define TPR_LOG_WRN(...) tpr_log(TPR_LOG_WARN, __VA_ARGS__)
#define TPR_LOG_INF(...) tpr_log(TPR_LOG_INFO, __VA_ARGS__)
#define TPR_LOG_DBG(...) tpr_log(TPR_LOG_DEBUG, __VA_ARGS__)

#endif
