/* The native agent of a hermes-batch bubblewrap sandbox (hermes_core/environments/bwrap.py).
 *
 * Same protocol and behaviour as the Python agent there (its AGENT string); it only starts
 * faster. argv[1] is the number of a SOCK_SEQPACKET socket to the host; one message a datagram:
 *   agent -> host  "ready"                 once, at start
 *   host -> agent  "run <id>"  + 2 fds     a file holding "id NUL cwd NUL argc NUL argv... NUL
 *                                          KEY=VALUE..." and the write end of the output pipe
 *   host -> agent  "kill <id>"             SIGKILL the command's process group
 *   host -> agent  "open <id>" + 1 fd      a file holding "id NUL flags NUL mode NUL parents NUL path"
 *   agent -> host  "<id> <status>"         a command ended (negative: killed by that signal)
 *   agent -> host  "<id> F" + 1 fd         the opened file, or "<id> E<errno>"
 *   agent -> host  "net"                   a command asked for an internet socket (once; see below)
 *   host -> agent  "net"                   the outbound network is up: the waiting sockets go on
 * Network on demand (argv[2] "net-on-demand", given with the outbound network): before "ready" the
 * agent installs a seccomp filter, inherited by every command, that stops socket(2) of the
 * families that reach a network (AF_INET, AF_INET6, AF_NETLINK, AF_PACKET) and hands it to the
 * agent (SECCOMP_RET_USER_NOTIF). The first such call asks the host for the network; every call
 * waits until it is up, then goes on unchanged (SECCOMP_USER_NOTIF_FLAG_CONTINUE: a delay, not a
 * security decision; a program that makes its sockets another way only finds no network). A
 * sandbox whose commands never open such a socket never starts slirp4netns. The reply is
 * "ready net-on-demand" when the filter is in place, "ready" when it cannot be (then the host
 * brings the network up before the first command, as for the Python agent).
 * At EOF of the socket (the host closed it, or died) every running command's process group is
 * killed and the agent exits 0; it is the pid namespace's init, so the kernel kills the rest.
 * A request that does not parse ends the agent the same way, with exit status 1 (the Python
 * agent's exception does the same): the host then ends every pending request.
 * A request file over MAX_SPEC bytes is not read to its end: a "run" answers as a command that
 * cannot start (E2BIG, "Argument list too long", 127), an "open" with E<ENAMETOOLONG>.
 * SIGCHLD is blocked and read from a signalfd, so no exit can be missed between two polls.
 * Every length is checked: a field is only ever read up to the NUL that split_fields put there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FDS 4 /* descriptors taken from one request; more are closed */
#define CANNOT_RUN "hermes sandbox: cannot run the command: "
#define MAX_SPEC (8u << 20) /* longest request file, bytes: execve takes at most 6 MiB of arguments */

struct command {
    pid_t pid;
    long long ident;
};

/* The kernel's seccomp ABI (linux/filter.h, linux/seccomp.h), spelled out: musl-gcc has no kernel
 * headers. seccomp_data is {int nr; u32 arch; u64 ip; u64 args[6]}: args[0]'s low half at 16. */
#if defined(__x86_64__)
#define NATIVE_AUDIT_ARCH 0xC000003Eu /* AUDIT_ARCH_X86_64 */
#elif defined(__aarch64__)
#define NATIVE_AUDIT_ARCH 0xC00000B7u /* AUDIT_ARCH_AARCH64 */
#endif
struct bpf_insn {
    uint16_t code;
    uint8_t jt, jf;
    uint32_t k;
};
struct bpf_prog {
    unsigned short len;
    struct bpf_insn *filter;
};
struct notif { /* struct seccomp_notif */
    uint64_t id;
    uint32_t pid, flags;
    int32_t nr;
    uint32_t arch;
    uint64_t ip, args[6];
};
struct notif_resp { /* struct seccomp_notif_resp */
    uint64_t id;
    int64_t val;
    int32_t error;
    uint32_t flags;
};
#define LD_ABS 0x20u     /* BPF_LD | BPF_W | BPF_ABS */
#define JEQ 0x15u        /* BPF_JMP | BPF_JEQ | BPF_K */
#define RET 0x06u        /* BPF_RET | BPF_K */
#define ALLOW 0x7fff0000u /* SECCOMP_RET_ALLOW */
#define NOTIFY 0x7fc00000u /* SECCOMP_RET_USER_NOTIF */
#define NOTIF_RECV _IOWR('!', 0, struct notif)
#define NOTIF_SEND _IOWR('!', 1, struct notif_resp)

static int sock;
static int broken;           /* a request did not parse: end as the Python agent's exception does */
static sigset_t parent_mask; /* the signal mask to give back to commands */
static struct command *running;
static size_t nrunning, capacity;
static int notify_fd = -1;   /* the seccomp listener of network on demand, or -1 */
static int network;          /* 0: not asked for, 1: asked for, 2: up */
static uint64_t *waiting;    /* notifications (socket calls) waiting for the network */
static size_t nwaiting, waiting_capacity;

/* Write all of buf to fd (retrying on EINTR and partial writes); errors are ignored. */
static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

/* Write the strings a, b, c (any may be "") to fd. */
static void write3(int fd, const char *a, const char *b, const char *c) {
    write_all(fd, a, strlen(a));
    write_all(fd, b, strlen(b));
    write_all(fd, c, strlen(c));
}

/* Send one reply datagram (len bytes) to the host, with descriptor fd attached unless it is -1. */
static void reply(const char *text, size_t len, int fd) {
    struct iovec iov = {.iov_base = (void *)text, .iov_len = len};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    memset(&control, 0, sizeof(control));
    if (fd >= 0) {
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    }
    while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
}

/* Read fd to its end into a NUL-terminated heap buffer (length in *len), close fd.
 * NULL with *err set: ENOMEM or the read's errno, or E2BIG as soon as more than MAX_SPEC bytes
 * came (the rest is not read). The buffer never exceeds MAX_SPEC + 2 bytes. */
static char *read_all(int fd, size_t *len, int *err) {
    size_t size = 4096, used = 0;
    char *data = malloc(size);
    *err = data ? 0 : ENOMEM;
    while (data) {
        if (used + 1 == size) { /* keep room for the final NUL; here used <= MAX_SPEC */
            size_t grown = size * 2 > MAX_SPEC + 2 ? MAX_SPEC + 2 : size * 2;
            char *bigger = realloc(data, grown);
            if (!bigger) {
                *err = ENOMEM;
                free(data);
                data = NULL;
                break;
            }
            data = bigger, size = grown;
        }
        ssize_t n = read(fd, data + used, size - used - 1); /* >= 1 byte of room, see above */
        if (n > 0) {
            used += (size_t)n;
            if (used > MAX_SPEC) {
                *err = E2BIG;
                free(data);
                data = NULL;
            }
        } else if (n == 0) {
            data[used] = '\0';
            *len = used;
            break;
        } else if (errno != EINTR) {
            *err = errno ? errno : EIO;
            free(data);
            data = NULL;
        }
    }
    close(fd);
    return data;
}

/* Split data (len bytes and a NUL after them) at its NULs, as Python's bytes.split(b"\0"):
 * a heap array of the n fields (each NUL-terminated, inside data), NULL-terminated. */
static char **split_fields(char *data, size_t len, size_t *n) {
    size_t count = 1;
    for (size_t i = 0; i < len; i++)
        count += data[i] == '\0';
    if (count > SIZE_MAX / sizeof(char *) - 1)
        return NULL;
    char **fields = malloc((count + 1) * sizeof(char *));
    if (!fields)
        return NULL;
    fields[0] = data;
    for (size_t i = 0, k = 1; i < len; i++)
        if (data[i] == '\0')
            fields[k++] = data + i + 1; /* k < count: one slot per NUL counted above */
    fields[count] = NULL;
    *n = count;
    return fields;
}

/* Parse a whole decimal integer into *value within [low, high]; 0 (and broken set) when it is not one. */
static int parse_ll(const char *text, long long low, long long high, long long *value) {
    char *end;
    errno = 0;
    *value = strtoll(text, &end, 10);
    if (errno == 0 && end != text && *end == '\0' && *value >= low && *value <= high)
        return 1;
    broken = 1;
    return 0;
}

/* Child side of a run: report why the command cannot run (to its output) and exit 127. */
static void cannot_run(int err) {
    write3(2, CANNOT_RUN, strerror(err), "\n");
    _exit(127);
}

/* Child side of a run: new session, output to the pipe, stdin /dev/null, cd, exec. Never returns. */
static void run_child(char **argv, char **envp, const char *cwd, int out) {
    int null;
    /* back to the host's defaults: nothing blocked, SIGPIPE / SIGXFSZ not ignored */
    sigprocmask(SIG_SETMASK, &parent_mask, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGXFSZ, SIG_DFL);
    if (setsid() < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
        cannot_run(errno);
    if (out > 2)
        close(out);
    null = open("/dev/null", O_RDONLY);
    if (null < 0 || dup2(null, 0) < 0)
        cannot_run(errno);
    if (null > 2)
        close(null);
    for (int fd = 0; fd <= 2; fd++) /* dup2 onto itself keeps close-on-exec: clear it */
        if (fcntl(fd, F_SETFD, 0) < 0)
            cannot_run(errno);
    if (chdir(cwd) < 0) {
        const char *why = strerror(errno);
        write3(2, "cd: ", cwd, ": ");
        write3(2, why, "\n", "");
        _exit(1);
    }
    execve(argv[0], argv, envp);
    cannot_run(errno);
}

/* Send "<ident> <code>": the exit status of a command. */
static void reply_status(long long ident, int code) {
    char text[48];
    int len = snprintf(text, sizeof(text), "%lld %d", ident, code);
    if (len > 0 && (size_t)len < sizeof(text))
        reply(text, (size_t)len, -1);
}

/* Remember a running command (pid, ident); 0 when there is no memory for it. */
static int remember(pid_t pid, long long ident) {
    if (nrunning == capacity) {
        size_t bigger = capacity ? capacity * 2 : 16;
        struct command *grown = bigger <= SIZE_MAX / sizeof(*grown) ? realloc(running, bigger * sizeof(*grown)) : NULL;
        if (!grown)
            return 0;
        running = grown, capacity = bigger;
    }
    running[nrunning].pid = pid;
    running[nrunning++].ident = ident;
    return 1;
}

/* A command that cannot start (no argv, fork failed): its reason to its output, status 127. */
static void not_started(long long ident, int out, int err) {
    write3(out, CANNOT_RUN, strerror(err), "\n");
    reply_status(ident, 127);
}

/* "run <request>": fork the command of spec (a memory file) with its output to out; closes both.
 * A spec over MAX_SPEC bytes is a command that cannot start (E2BIG), answered under request. */
static void spawn(const char *request, int spec_fd, int out) {
    size_t len = 0, n = 0;
    long long ident, argc;
    int err;
    char *spec = read_all(spec_fd, &len, &err);
    if (!spec && err == E2BIG) {
        if (parse_ll(request, LLONG_MIN, LLONG_MAX, &ident))
            not_started(ident, out, E2BIG);
        close(out);
        return;
    }
    char **fields = spec ? split_fields(spec, len, &n) : NULL;
    char **argv = fields ? malloc(n * sizeof(char *)) : NULL;
    if (!argv || n < 3 || !parse_ll(fields[0], LLONG_MIN, LLONG_MAX, &ident) ||
        !parse_ll(fields[2], 0, (long long)(n - 3), &argc)) {
        broken = 1;
        goto done;
    }
    /* argv: fields 3 .. 3+argc, then NULL; right after it the environment, then NULL:
       at most n - 1 slots of the n allocated */
    size_t nargs = (size_t)argc, nenv = n - 3 - nargs;
    memcpy(argv, fields + 3, nargs * sizeof(char *));
    argv[nargs] = NULL;
    char **envp = argv + nargs + 1;
    memcpy(envp, fields + 3 + nargs, nenv * sizeof(char *));
    envp[nenv] = NULL;
    for (size_t i = 0; i < nenv; i++) {
        if (!strchr(envp[i], '=')) { /* as the Python agent's dict(entry.split(b"=", 1)) */
            broken = 1;
            goto done;
        }
    }
    if (nargs == 0) {
        not_started(ident, out, EINVAL);
        goto done;
    }
    pid_t pid = fork();
    if (pid == 0)
        run_child(argv, envp, fields[1], out);
    if (pid < 0) {
        not_started(ident, out, errno);
    } else if (!remember(pid, ident)) {
        kill(pid, SIGKILL); /* its status could not be told: report it killed now */
        reply_status(ident, -SIGKILL);
    }
done:
    free(argv);
    free(fields);
    free(spec);
    close(out);
}

/* Reap every ended child and report the status of the commands among them. */
static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) != 0) {
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            return; /* ECHILD: none left */
        }
        for (size_t i = 0; i < nrunning; i++) {
            if (running[i].pid == pid) { /* as Python's os.waitstatus_to_exitcode */
                long long ident = running[i].ident;
                running[i] = running[--nrunning];
                reply_status(ident, WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status));
                break;
            }
        }
    }
}

/* SIGKILL the process group of the command pid (the command itself if it has no group yet). */
static void kill_group(pid_t pid) {
    if (killpg(pid, SIGKILL) < 0 && errno == ESRCH)
        kill(pid, SIGKILL); /* forked but not yet through setsid() */
}

/* "kill": SIGKILL the process group of every running command with this id. */
static void kill_command(const char *ident_text) {
    long long ident;
    if (!parse_ll(ident_text, LLONG_MIN, LLONG_MAX, &ident))
        return;
    for (size_t i = 0; i < nrunning; i++)
        if (running[i].ident == ident)
            kill_group(running[i].pid);
}

/* mkdir -p dir, as Python's os.makedirs(dir, exist_ok=True): 0 or an errno. dir is modified, restored.
 * A parent that exists (as anything, symlinks followed) is passed over, and so is EEXIST of one;
 * the last component is always attempted, and only a folder there is success. */
static int make_dirs(char *dir) {
    size_t len = strlen(dir);
    struct stat st;
    for (size_t i = 1; i <= len; i++) {
        if (i < len && (dir[i] != '/' || dir[i - 1] == '/'))
            continue; /* a prefix ends before each first slash of a run, and at the end */
        char saved = dir[i];
        int err = 0;
        dir[i] = '\0';
        if ((i == len || stat(dir, &st) < 0) && mkdir(dir, 0777) < 0) {
            err = errno;
            if ((i < len && err == EEXIST) || (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)))
                err = 0;
        }
        dir[i] = saved;
        if (err)
            return err;
    }
    return 0;
}

/* The folder part of path, as Python's os.path.dirname (trailing slashes dropped unless all
 * slashes); "" when there is none. A heap string, NULL without memory. */
static char *dir_name(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t end = slash ? (size_t)(slash - path) + 1 : 0, all = 0;
    while (all < end && path[all] == '/')
        all++;
    if (all < end)
        while (end > 0 && path[end - 1] == '/')
            end--;
    return strndup(path, end);
}

/* "open <request>": open the path of spec (a memory file) here, in the sandbox; reply the fd or
 * the errno (ENAMETOOLONG, under request, for a spec over MAX_SPEC bytes).
 * The flags are the host's, as given (O_NOFOLLOW, O_NONBLOCK ... mean what they mean to
 * open(2)), plus O_CLOEXEC as Python's os.open adds it. */
static void open_file(const char *request, int spec_fd) {
    size_t len = 0, n = 0;
    long long flags, mode;
    int err = 0, fd = -1;
    char *spec = read_all(spec_fd, &len, &err);
    if (!spec && err == E2BIG) { /* its path is far over PATH_MAX: what open(2) would say */
        char text[64];
        int used = snprintf(text, sizeof(text), "%s E%d", request, ENAMETOOLONG);
        if (used > 0 && (size_t)used < sizeof(text))
            reply(text, (size_t)used, -1);
        else
            broken = 1;
        return;
    }
    char **fields = spec ? split_fields(spec, len, &n) : NULL;
    /* as spec.split(b"\0", 4) and int(): five fields, no NUL in the path (os.open refuses it) */
    if (!fields || n != 5 || !parse_ll(fields[1], INT_MIN, INT_MAX, &flags) ||
        !parse_ll(fields[2], INT_MIN, INT_MAX, &mode)) {
        broken = 1;
        goto done;
    }
    const char *ident = fields[0], *path = fields[4];
    if (strcmp(fields[3], "1") == 0) {
        char *head = dir_name(path);
        err = !head ? ENOMEM : head[0] ? make_dirs(head) : 0;
        free(head);
    }
    if (!err) {
        while ((fd = open(path, (int)flags | O_CLOEXEC, (mode_t)mode)) < 0 && errno == EINTR)
            ;
        err = fd < 0 ? (errno ? errno : EIO) : 0;
    }
    size_t size = strlen(ident) + 16;
    char *text = malloc(size);
    int used = !text ? -1 : fd >= 0 ? snprintf(text, size, "%s F", ident) : snprintf(text, size, "%s E%d", ident, err);
    if (used > 0 && (size_t)used < size)
        reply(text, (size_t)used, fd);
    free(text);
    if (fd >= 0)
        close(fd);
done:
    free(fields);
    free(spec);
}

/* Install the network-on-demand filter on the agent (so on every command it starts); the
 * listener's descriptor (close-on-exec), or -1 when this kernel or machine cannot. */
static int watch_sockets(void) {
#ifdef NATIVE_AUDIT_ARCH
    struct bpf_insn code[] = {
        {LD_ABS, 0, 0, 4},                  /* arch */
        {JEQ, 0, 8, NATIVE_AUDIT_ARCH},     /* another ABI (x32 numbers differ too): allow */
        {LD_ABS, 0, 0, 0},                  /* syscall number */
        {JEQ, 0, 6, SYS_socket},
        {LD_ABS, 0, 0, 16},                 /* args[0], the address family */
        {JEQ, 3, 0, AF_INET},
        {JEQ, 2, 0, AF_INET6},
        {JEQ, 1, 0, AF_NETLINK},
        {JEQ, 0, 1, AF_PACKET},
        {RET, 0, 0, NOTIFY},
        {RET, 0, 0, ALLOW},
    };
    struct bpf_prog prog = {(unsigned short)(sizeof(code) / sizeof(code[0])), code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    int fd = (int)syscall(SYS_seccomp, 1 /* SECCOMP_SET_MODE_FILTER */,
                          8 /* SECCOMP_FILTER_FLAG_NEW_LISTENER */, &prog);
    if (fd >= 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        close(fd); /* the filter stays: every socket call would wait for good, so end the agent */
        _exit(2);
    }
    return fd;
#else
    return -1;
#endif
}

/* Let a waiting socket call go on as if it had not been stopped (SECCOMP_USER_NOTIF_FLAG_CONTINUE).
 * An error (ENOENT: its process died meanwhile) needs nothing done. */
static void go_on(uint64_t id) {
    struct notif_resp resp = {.id = id, .val = 0, .error = 0, .flags = 1};
    while (ioctl(notify_fd, NOTIF_SEND, &resp) < 0 && errno == EINTR)
        ;
}

/* A command called socket() for a network family: let it go on once the network is up; the first
 * such call asks the host for it. */
static void socket_called(void) {
    struct notif req;
    memset(&req, 0, sizeof(req)); /* the kernel refuses a buffer that is not zeroed */
    if (ioctl(notify_fd, NOTIF_RECV, &req) < 0)
        return; /* ENOENT: the caller died between the poll and here */
    if (network == 2) {
        go_on(req.id);
        return;
    }
    if (nwaiting == waiting_capacity) {
        size_t bigger = waiting_capacity ? waiting_capacity * 2 : 16;
        uint64_t *grown = bigger <= SIZE_MAX / sizeof(*grown) ? realloc(waiting, bigger * sizeof(*grown)) : NULL;
        if (!grown) {
            go_on(req.id); /* no memory to hold it: it goes on now, and finds no network yet */
            return;
        }
        waiting = grown, waiting_capacity = bigger;
    }
    waiting[nwaiting++] = req.id;
    if (network == 0) {
        network = 1;
        reply("net", 3, -1);
    }
}

/* "net": the host brought the network up; every waiting socket call goes on. */
static void network_up(void) {
    network = 2;
    for (size_t i = 0; i < nwaiting; i++)
        go_on(waiting[i]);
    nwaiting = 0;
}

/* Receive and carry out one request; 0 at EOF, a broken socket or a request that does not parse. */
static int handle_request(void) {
    char buf[4097];
    int fds[MAX_FDS], nfds = 0;
    union {
        char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1}; /* 4096, as the Python agent */
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof(control.buf)};
    ssize_t len;
    while ((len = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (len < 0)
        return 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (nfds < MAX_FDS)
                fds[nfds++] = fd;
            else
                close(fd);
        }
    }
    int used = 0;
    if (len > 0) {
        /* as msg.partition(b" "): the operation up to the first space, the rest after it */
        buf[len] = '\0'; /* len <= sizeof(buf) - 1 */
        const char *space = memchr(buf, ' ', (size_t)len), *rest = space ? space + 1 : buf + len;
        size_t op = space ? (size_t)(space - buf) : (size_t)len;
        if (op == 3 && memcmp(buf, "run", 3) == 0) {
            if (nfds >= 2) {
                spawn(rest, fds[0], fds[1]);
                used = 2;
            } else {
                broken = 1;
            }
        } else if (op == 4 && memcmp(buf, "open", 4) == 0) {
            if (nfds >= 1) {
                open_file(rest, fds[0]);
                used = 1;
            } else {
                broken = 1;
            }
        } else if (op == 4 && memcmp(buf, "kill", 4) == 0) {
            if (strlen(rest) == (size_t)(buf + len - rest)) /* a NUL in it: not a number */
                kill_command(rest);
            else
                broken = 1;
        } else if (op == (size_t)len && len == 3 && memcmp(buf, "net", 3) == 0) {
            if (notify_fd >= 0)
                network_up();
        } /* anything else: ignored, as by the Python agent */
    }
    while (nfds > used)
        close(fds[--nfds]);
    return len > 0 && !broken;
}

/* Set up the socket and the SIGCHLD signalfd, say ready, serve until EOF, then kill every command. */
int main(int argc, char **argv) {
    sigset_t chld;
    long long fd;
    int type = 0;
    socklen_t size = sizeof(type);
    if (argc < 2 || argc > 3 || !parse_ll(argv[1], 0, INT_MAX, &fd))
        return 2;
    sock = (int)fd;
    if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &size) < 0 || type != SOCK_SEQPACKET ||
        fcntl(sock, F_SETFD, FD_CLOEXEC) < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN); /* as Python: a closed output pipe is an error, not the agent's end */
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, &parent_mask) < 0)
        return 2;
    int sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0)
        return 2;
    if (argc == 3 && strcmp(argv[2], "net-on-demand") == 0)
        notify_fd = watch_sockets();
    if (notify_fd >= 0)
        reply("ready net-on-demand", 19, -1);
    else
        reply("ready", 5, -1);
    struct pollfd polls[3] = {{.fd = sock, .events = POLLIN},
                              {.fd = sigfd, .events = POLLIN},
                              {.fd = notify_fd, .events = POLLIN}}; /* -1: poll skips it */
    for (;;) {
        if (poll(polls, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (polls[1].revents) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof(info)) > 0)
                ; /* drained first: an exit after this makes the signalfd readable again */
            reap();
        }
        if (polls[2].revents)
            socket_called();
        if (polls[0].revents && !handle_request())
            break;
    }
    for (size_t i = 0; i < nrunning; i++)
        kill_group(running[i].pid);
    /* The agent is the sandbox's pid-namespace init (bubblewrap --as-pid-1): at its exit the kernel
     * kills every other process of the sandbox, a setsid'd one included. */
    if (broken) {
        const char *why = "hermes sandbox agent: a request does not parse\n";
        write_all(2, why, strlen(why));
        return 1;
    }
    return 0;
}
