/* tools/cmd.h — the subcommands of the `epyq` program.
 * Each lives in tools/cmd_<name>.c and is `int epyq_cmd_<name>(int argc, char **argv)`,
 * with argv[0] = the subcommand name. Return value = process exit status
 * (0 ok, 1 runtime failure, 2 usage error, 130/143 signals). Every command handles --help. */
#ifndef EPYQ_TOOLS_CMD_H
#define EPYQ_TOOLS_CMD_H

int epyq_cmd_inspect(int argc, char **argv);
int epyq_cmd_synth(int argc, char **argv);
int epyq_cmd_logits(int argc, char **argv);
int epyq_cmd_tokenize(int argc, char **argv);
int epyq_cmd_detokenize(int argc, char **argv);
int epyq_cmd_template(int argc, char **argv);
int epyq_cmd_run(int argc, char **argv);
int epyq_cmd_chat(int argc, char **argv);
int epyq_cmd_batch(int argc, char **argv);
int epyq_cmd_bench(int argc, char **argv);
int epyq_cmd_ppl(int argc, char **argv);
int epyq_cmd_serve(int argc, char **argv);

#endif
