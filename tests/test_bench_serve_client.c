// tpr bench serve's load generator (launch/bench_serve_client.c) against a
// scripted HTTP server on a thread of this process: each request's body
// names the canned answer it gets, written in small pieces (chunk and line
// boundaries fall anywhere, reads see several events or half of one). A
// correct stream (LF or CRLF lines, comments, empty-text chunks) is answered
// with its text chunks' times in order; a missing [DONE], finish_reason or
// usage, a wrong token count, a non-200 status, an error event, a connection
// cut mid-stream and bytes that are not HTTP each fail that request with a
// message saying so, and never touch the others; a server that goes silent
// fails the request after the idle timeout.
#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "launch/bench_serve_client.h"

#define EXPECT_TOKENS 3

typedef struct canned {
  const char *name;
  char *response;
  int piece;         // bytes per write (0: all at once)
  double hold_s;     // seconds to keep the connection open, silent, after the response
  const char *want;  // the error expected ("" for an answered request)
} canned;

// "data: E\n\n" for each event (line_end between the lines), as chunked
// transfer encoding in chunks of chunk bytes; cut: stop after that many
// body bytes, with no terminating chunk.
static char *sse_response(const char *const *events, int n, const char *line_end, const char *comment, size_t chunk,
                          size_t cut) {
  char body[8192] = "";
  size_t len = 0;
  if (comment) len += (size_t)snprintf(body + len, sizeof body - len, ": %s%s", comment, line_end);
  for (int i = 0; i < n; i++)
    len += (size_t)snprintf(body + len, sizeof body - len, "data:%s%s%s%s", i % 2 ? "" : " ", events[i], line_end,
                            line_end);
  if (cut && cut < len) len = cut;
  char *out = malloc(3 * len + 4096);
  size_t o = (size_t)sprintf(out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n");
  for (size_t at = 0; at < len; at += chunk) {
    size_t k = len - at < chunk ? len - at : chunk;
    o += (size_t)sprintf(out + o, "%zx\r\n", k);
    memcpy(out + o, body + at, k);
    o += k;
    o += (size_t)sprintf(out + o, "\r\n");
  }
  if (!cut) o += (size_t)sprintf(out + o, "0\r\n\r\n");
  out[o] = 0;
  return out;
}

#define TEXT(t) "{\"choices\":[{\"index\":0,\"text\":\"" t "\",\"logprobs\":null,\"finish_reason\":null}]}"
#define FINISH "{\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}]}"
#define CHAT(t) "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" t "\"},\"finish_reason\":null}]}"
#define CHAT_FINISH "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}"
#define USAGE(n) "{\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":" #n ",\"total_tokens\":7}}"

static canned cases[12];
static int n_cases;

static void add(const char *name, char *response, int piece, const char *want) {
  cases[n_cases++] = (canned){.name = name, .response = response, .piece = piece, .want = want};
}

static void make_cases(void) {
  const char *good[] = {TEXT("a"), TEXT(""), TEXT("b\\n"), TEXT("c"), FINISH, USAGE(3), "[DONE]"};
  add("good, LF", sse_response(good, 7, "\n", NULL, 7, 0), 5, "");
  add("good, CRLF and a comment", sse_response(good, 7, "\r\n", "keep-alive", 64, 0), 0, "");
  const char *no_done[] = {TEXT("a"), TEXT("b"), TEXT("c"), FINISH, USAGE(3)};
  add("no [DONE]", sse_response(no_done, 5, "\n", NULL, 1000, 0), 3, "without data: [DONE]");
  const char *wrong[] = {TEXT("a"), TEXT("b"), FINISH, USAGE(4), "[DONE]"};
  add("4 tokens", sse_response(wrong, 5, "\n", NULL, 1000, 0), 0, "completion_tokens = 4, want 3");
  const char *no_finish[] = {TEXT("a"), TEXT("b"), TEXT("c"), USAGE(3), "[DONE]"};
  add("no finish_reason", sse_response(no_finish, 5, "\n", NULL, 1000, 0), 0, "no chunk carried a finish_reason");
  const char *no_usage[] = {TEXT("a"), TEXT("b"), FINISH, "[DONE]"};
  add("no usage", sse_response(no_usage, 4, "\n", NULL, 1000, 0), 0, "no usage chunk");
  const char *error_event[] = {TEXT("a"), "{\"error\":{\"message\":\"boom\",\"code\":503}}", "[DONE]"};
  add("error event", sse_response(error_event, 3, "\n", NULL, 1000, 0), 0, "error event: boom");
  add("cut mid-stream", sse_response(good, 7, "\n", NULL, 16, 150), 9, "closed the connection before the response ended");
  const char *json503 = "{\"error\":{\"message\":\"overloaded\"}}";
  char *r503 = malloc(512);
  snprintf(r503, 512, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
           strlen(json503), json503);
  add("503", r503, 0, "HTTP 503: {\"error\":{\"message\":\"overloaded\"}}");
  add("not HTTP", strdup("SSH-2.0-OpenSSH\r\n\r\n"), 0, "malformed HTTP response");
  // Chat chunks (bench serve --json-mode): the text is the delta's content.
  const char *chat[] = {CHAT("a"), CHAT(""), CHAT("b\\n"), CHAT("c"), CHAT_FINISH, USAGE(3), "[DONE]"};
  add("chat, delta content", sse_response(chat, 7, "\n", NULL, 1000, 0), 0, "");
  const char *chat4[] = {CHAT("a"), CHAT_FINISH, USAGE(4), "[DONE]"};
  add("chat, 4 tokens", sse_response(chat4, 4, "\n", NULL, 1000, 0), 0, "completion_tokens = 4, want 3");
}

static void free_cases(void) {
  for (int i = 0; i < n_cases; i++) free(cases[i].response);
  n_cases = 0;
}

typedef struct fake_server {
  int fd, port, connections;
} fake_server;

// Reads one request (headers, then Content-Length bytes); the case number
// from its body's "case": N.
static int read_case(int fd) {
  char buf[4096];
  size_t len = 0;
  for (;;) {
    ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
    if (n <= 0) return -1;
    len += (size_t)n;
    buf[len] = 0;
    char *end = strstr(buf, "\r\n\r\n"), *cl = strstr(buf, "Content-Length: ");
    if (!end || !cl) continue;
    size_t want = (size_t)(end + 4 - buf) + (size_t)atol(cl + 16);
    if (len < want) continue;
    char *c = strstr(end, "\"case\":");
    return c ? atoi(c + 7) : -1;
  }
}

static void sleep_s(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static void *serve_connections(void *arg) {
  fake_server *s = arg;
  for (int k = 0; k < s->connections; k++) {
    int fd = accept(s->fd, NULL, NULL);
    if (fd < 0) break;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int i = read_case(fd);
    if (i >= 0 && i < n_cases) {
      const char *r = cases[i].response;
      size_t len = strlen(r), piece = cases[i].piece ? (size_t)cases[i].piece : len;
      for (size_t at = 0; at < len; at += piece) {
        if (write(fd, r + at, len - at < piece ? len - at : piece) < 0) break;
        if (cases[i].piece) sleep_s(0.0002);  // separate segments, so reads split the stream
      }
      if (cases[i].hold_s > 0) sleep_s(cases[i].hold_s);
    }
    close(fd);
  }
  return NULL;
}

static void start_server(fake_server *s, int connections) {
  s->connections = connections;
  s->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(s->fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(s->fd, 64), 0);
  socklen_t al = sizeof a;
  getsockname(s->fd, (struct sockaddr *)&a, &al);
  s->port = ntohs(a.sin_port);
}

static char **case_bodies(int n) {
  char **b = calloc((size_t)n, sizeof *b);
  for (int i = 0; i < n; i++) {
    b[i] = malloc(64);
    snprintf(b[i], 64, "{\"case\":%d,\"stream\":true}", i);
  }
  return b;
}

static void run(const fake_server *s, int clients, int per_client, double idle_s, tpr_load_request *out) {
  char **bodies = case_bodies(clients * per_client);
  tpr_load_opts o = {.host = "127.0.0.1", .port = s->port, .path = "/v1/completions", .clients = clients,
                     .requests_per_client = per_client, .bodies = bodies,
                     .expect_completion_tokens = EXPECT_TOKENS, .idle_timeout_s = idle_s};
  assert_true(tpr_load_run(&o, out));
  for (int i = 0; i < clients * per_client; i++) free(bodies[i]);
  free(bodies);
}

static void test_canned_answers(void **state) {
  (void)state;
  make_cases();
  fake_server s;
  start_server(&s, n_cases);
  pthread_t th;
  pthread_create(&th, NULL, serve_connections, &s);
  tpr_load_request out[12];
  run(&s, n_cases / 2, 2, 30, out);  // n_cases is even: each client sends two
  pthread_join(th, NULL);
  close(s.fd);
  for (int i = 0; i < n_cases; i++) {
    const tpr_load_request *r = &out[i];
    print_message("  %-26s status %d, %lld text chunks, %lld tokens, error '%s'\n", cases[i].name, r->http_status,
                  (long long)r->n_text, (long long)r->completion_tokens, r->error);
    if (!cases[i].want[0]) {
      assert_string_equal(r->error, "");
      assert_int_equal(r->http_status, 200);
      assert_int_equal(r->n_text, 3);  // a, b\n, c: the empty-text and finish chunks carry no text
      assert_int_equal(r->completion_tokens, EXPECT_TOKENS);
      assert_string_equal(r->finish_reason, "length");
      assert_true(r->done);
    } else if (!strstr(r->error, cases[i].want)) {
      fail_msg("case '%s': error '%s', want '%s'", cases[i].name, r->error, cases[i].want);
    }
    assert_true(r->t_start <= r->t_end);
    for (int64_t k = 0; k < r->n_text; k++) {
      assert_true(r->text_times[k] >= (k ? r->text_times[k - 1] : r->t_start));
      assert_true(r->text_times[k] <= r->t_end);
    }
  }
  tpr_load_requests_free(out, n_cases);
  free_cases();
}

// Headers and one chunk, then silence for longer than the idle timeout.
static void test_silent_server(void **state) {
  (void)state;
  const char *events[] = {TEXT("a")};
  cases[0] = (canned){.name = "silent", .response = sse_response(events, 1, "\n", NULL, 1000, 0), .hold_s = 2};
  char *r = cases[0].response;
  r[strlen(r) - 5] = 0;  // no terminating chunk: the answer is not over
  n_cases = 1;
  fake_server s;
  start_server(&s, 1);
  pthread_t th;
  pthread_create(&th, NULL, serve_connections, &s);
  tpr_load_request out[1];
  run(&s, 1, 1, 0.5, out);
  pthread_join(th, NULL);
  close(s.fd);
  if (!strstr(out[0].error, "nothing received for 0.5 s")) fail_msg("error '%s'", out[0].error);
  assert_int_equal(out[0].n_text, 1);
  tpr_load_requests_free(out, 1);
  free_cases();
}

// Nobody listens: every request fails to connect, and the run still ends.
static void test_refused(void **state) {
  (void)state;
  fake_server s;
  start_server(&s, 0);
  close(s.fd);  // the port is free again: connections are refused
  tpr_load_request out[4];
  run(&s, 2, 2, 5, out);
  for (int i = 0; i < 4; i++)
    if (!strstr(out[i].error, "connecting to 127.0.0.1")) fail_msg("request %d: error '%s'", i, out[i].error);
  tpr_load_requests_free(out, 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_canned_answers),
      cmocka_unit_test(test_silent_server),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
