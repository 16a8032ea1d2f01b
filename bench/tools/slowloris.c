/* slowloris: the attacker of bench/scenarios/slowloris.py, as a process of
 * its own.
 *
 *   slowloris KIND COUNT PORT
 *
 * KIND is one of
 *   heads   COUNT connections each sending a request head a byte a second;
 *   bodies  COUNT POSTs whose head arrives whole, then a body byte a second;
 *   stream  COUNT connections pipelining GET /stream and reading nothing;
 *   idle    COUNT keep-alive connections, each served once, then silent.
 * A head, body or non-reader that is cut is reopened at once, so COUNT
 * stay open, as a real attacker keeps them; an idle one that is closed is
 * not (the bench counts what is held).
 *
 * Why C and not a thread of the Python harness: the attacker shares a CPU
 * with wrk, and every microsecond it takes is a microsecond wrk answers
 * late, which wrk then books as the server's latency. Here a send is one
 * system call, the connections are opened over the first second and each
 * keeps its own phase, so the sends fall evenly on 1 ms ticks (about one
 * byte a tick for 1,000 slow heads, as from 1,000 clients that keep no
 * common clock) and the cuts, which come a timeout after each
 * connection's first byte, are spread the same way. The tick was 10 ms:
 * ten sends at once, each running the loopback receive path on this CPU,
 * kept wrk off it for about 160 us every 10 ms, and the ordinary clients'
 * p99 went from 80 us to 170-230 us (106-134 us with 1 ms ticks), while the
 * server's CPU time per request rose by the same 3% either way.
 *
 * It prints "ready" once every connection is open (idle: served), then a
 * JSON line of its tallies on SIGUSR1 and on SIGTERM (after which it
 * exits):
 *   {"opened":N,"408":N,"closed":N,"answered":N,"sent":N,"open":N}
 * where "sent" counts the attack's bytes (stream: request bytes written).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 1
#define SLOTS (1000 / TICK_MS) /* a connection's phase within the second */

enum kind { HEADS, BODIES, STREAM, IDLE };

static const char SLOW_HEAD[] =
    "GET / HTTP/1.1\r\nHost: bench\r\nUser-Agent: slowloris\r\nX-Padding: "
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "\r\n\r\n";
static const char SLOW_BODY_HEAD[] =
    "POST /echo HTTP/1.1\r\nHost: bench\r\nContent-Length: 100000\r\n\r\n";
static const char STREAM_REQ[] = "GET /stream HTTP/1.1\r\nHost: bench\r\n\r\n";
static const char IDLE_REQ[] = "GET / HTTP/1.1\r\nHost: bench\r\n\r\n";

struct conn {
    int fd;         /* -1: free */
    size_t sent;    /* attack bytes sent on this connection */
    char got[13];   /* the first bytes of what it was answered */
    size_t got_len;
    int answered;   /* idle: its one answer has come */
};

static enum kind kind;
static int count, port, epfd;
static struct conn *conns;
static char *stream_buf;
static size_t stream_len;
static unsigned long long t_opened, t_408, t_closed, t_answered, t_sent;
static volatile sig_atomic_t want_report, want_stop;

static void on_signal(int sig) {
    if (sig == SIGUSR1)
        want_report = 1;
    else
        want_stop = 1;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int open_count(void) {
    int n = 0;
    for (int i = 0; i < count; i++)
        n += conns[i].fd >= 0;
    return n;
}

static void report(void) {
    printf("{\"opened\":%llu,\"408\":%llu,\"closed\":%llu,\"answered\":%llu,\"sent\":%llu,\"open\":%d}\n",
           t_opened, t_408, t_closed, t_answered, t_sent, open_count());
    fflush(stdout);
}

static void die(const char *what) {
    fprintf(stderr, "slowloris: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* Sends what it can without blocking; counts it. */
static void send_some(struct conn *c, const char *buf, size_t len) {
    ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
        c->sent += (size_t)n;
        t_sent += (unsigned long long)n;
    }
}

static void open_conn(struct conn *c) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* Blocking connect: on loopback it completes as soon as the kernel
     * queues the connection, whether or not the server has accepted it. */
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    memset(c, 0, sizeof *c);
    c->fd = fd;
    t_opened++;
    /* A non-reader never reads: it learns of its close from a failed send. */
    if (kind != STREAM) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
            die("epoll_ctl");
    }
    if (kind == BODIES)
        send_some(c, SLOW_BODY_HEAD, sizeof SLOW_BODY_HEAD - 1);
    else if (kind == IDLE)
        send_some(c, IDLE_REQ, sizeof IDLE_REQ - 1);
    /* The request bytes of an idle connection or a body's head are not
     * the attack's slow bytes. */
    if (kind == BODIES || kind == IDLE) {
        t_sent -= c->sent;
        c->sent = 0;
    }
}

static void end_conn(struct conn *c) {
    if (kind == STREAM)
        t_closed++;
    else if (c->got_len >= 12 && memcmp(c->got, "HTTP/1.1 408", 12) == 0)
        t_408++;
    else if (c->got_len == 0 || (kind == IDLE && c->answered))
        t_closed++;
    else
        t_answered++;
    close(c->fd); /* also takes it out of the epoll set */
    c->fd = -1;
    if (kind != IDLE && !want_stop)
        open_conn(c);
}

/* Once a second, at its own phase (`slot`), each connection sends one
 * slow byte; a non-reader writes requests until its socket takes no more. */
static void tick(int slot) {
    for (int i = slot; i < count; i += SLOTS) {
        struct conn *c = &conns[i];
        if (c->fd < 0)
            continue;
        if (kind == STREAM) {
            for (;;) {
                ssize_t n = send(c->fd, stream_buf, stream_len, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n > 0) {
                    t_sent += (unsigned long long)n;
                    continue;
                }
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break;
                end_conn(c);
                break;
            }
            continue;
        }
        if (kind == HEADS) {
            size_t at = c->sent % (sizeof SLOW_HEAD - 1);
            send_some(c, SLOW_HEAD + at, 1);
        } else if (kind == BODIES) {
            send_some(c, "x", 1);
        }
    }
}

static void on_readable(struct conn *c) {
    char buf[4096];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            size_t room = sizeof c->got - 1 - c->got_len;
            size_t take = (size_t)n < room ? (size_t)n : room;
            memcpy(c->got + c->got_len, buf, take);
            c->got_len += take;
            if (kind == IDLE && n >= 13 && memcmp(buf + n - 13, "hello, world\n", 13) == 0)
                c->answered = 1;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        end_conn(c);
        return;
    }
}

static int all_answered(void) {
    for (int i = 0; i < count; i++)
        if (conns[i].fd >= 0 && !conns[i].answered)
            return 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: slowloris heads|bodies|stream|idle COUNT PORT\n");
        return 2;
    }
    if (!strcmp(argv[1], "heads"))
        kind = HEADS;
    else if (!strcmp(argv[1], "bodies"))
        kind = BODIES;
    else if (!strcmp(argv[1], "stream"))
        kind = STREAM;
    else if (!strcmp(argv[1], "idle"))
        kind = IDLE;
    else {
        fprintf(stderr, "slowloris: unknown kind %s\n", argv[1]);
        return 2;
    }
    count = atoi(argv[2]);
    port = atoi(argv[3]);
    if (count <= 0 || port <= 0) {
        fprintf(stderr, "slowloris: COUNT and PORT must be positive\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0)
        die("epoll_create1");
    conns = calloc((size_t)count, sizeof *conns);
    stream_len = 64 * (sizeof STREAM_REQ - 1);
    stream_buf = malloc(stream_len);
    if (!conns || !stream_buf)
        die("malloc");
    for (size_t i = 0; i < 64; i++)
        memcpy(stream_buf + i * (sizeof STREAM_REQ - 1), STREAM_REQ, sizeof STREAM_REQ - 1);
    for (int i = 0; i < count; i++)
        conns[i].fd = -1;

    struct epoll_event events[256];
    long long start = now_ms(), next = start;
    int opened = 0, ready = 0;
    long long tick_no = 0;
    while (!want_stop) {
        long long now = now_ms();
        if (now >= next) {
            /* Up to 1,000 connections are opened over the first second
             * (a tick's worth each tick); more, as fast as they connect. */
            int due = count <= 1000 ? (int)((long long)count * (tick_no + 1) / SLOTS) : count;
            if (due > count)
                due = count;
            for (; opened < due && !want_stop; opened++)
                open_conn(&conns[opened]);
            if (opened == count && !ready && (kind != IDLE || all_answered())) {
                ready = 1;
                printf("ready\n");
                fflush(stdout);
            }
            if (opened == count && kind != IDLE)
                tick((int)(tick_no % SLOTS));
            tick_no++;
            next = start + tick_no * TICK_MS;
            now = now_ms();
        }
        if (want_report) {
            want_report = 0;
            report();
        }
        int wait = next > now ? (int)(next - now) : 0;
        int n = epoll_wait(epfd, events, 256, wait);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++)
            on_readable((struct conn *)events[i].data.ptr);
    }
    report();
    return 0;
}
