// tpr scale run and plot (launch/cmd_scale.c dispatches the subcommands).
#ifndef TPR_LAUNCH_SCALE_RUN_H
#define TPR_LAUNCH_SCALE_RUN_H

int tpr_scale_run(int argc, char **argv);
int tpr_scale_plot(int argc, char **argv);

// Parses "1,2,4" or "8..1024" (powers of two from 8 to 1024) into out[0..max);
// returns the count, or -1 naming the flag on stderr.
int tpr_scale_int_list(const char *flag, const char *text, int *out, int max);

#endif
