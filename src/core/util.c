/* src/core/util.c — see util.h. */
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double epyq_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t epyq_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

epyq_status epyq_file_read(const char *path, size_t max_bytes, char **out, size_t *len, epyq_err *err) {
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return epyq_err_set(err, EPYQ_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return epyq_err_set(err, EPYQ_E_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        fclose(f);
        return epyq_err_set(err, EPYQ_E_FORMAT, "%s: file is %lld bytes, limit is %zu", path,
                            (long long)sb.st_size, max_bytes);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return epyq_err_set(err, EPYQ_E_NOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    if (n && fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return epyq_err_set(err, EPYQ_E_IO, "%s: short read", path);
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return EPYQ_OK;
}

epyq_status epyq_file_write_atomic(const char *path, const void *data, size_t len, epyq_err *err) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 16);
    if (!tmp) return epyq_err_set(err, EPYQ_E_NOMEM, "%s: out of memory", path);
    snprintf(tmp, pl + 16, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        epyq_err_set(err, EPYQ_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return EPYQ_E_IO;
    }
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            epyq_err_set(err, EPYQ_E_IO, "%s: write failed: %s", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            free(tmp);
            return EPYQ_E_IO;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        epyq_err_set(err, EPYQ_E_IO, "%s: cannot finish writing: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return EPYQ_E_IO;
    }
    free(tmp);
    return EPYQ_OK;
}

char *epyq_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') s[o++] = '/';
    memcpy(s + o, name, b + 1);
    return s;
}

epyq_status epyq_mkdir_p(const char *path, epyq_err *err) {
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return epyq_err_set(err, EPYQ_E_ARG, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return epyq_err_set(err, EPYQ_E_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            buf[i] = c;
        }
    }
    return EPYQ_OK;
}

float epyq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = {.u = bits};
    return v.f;
}

uint16_t epyq_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    uint32_t x = v.u, sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow (incl. rounding) -> inf */
    if (ax < 0x38800000u) {                                    /* subnormal or zero in f16 */
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* value = m * 2^(e-150) = r * 2^-24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax - 0x38000000u) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

int epyq_parse_int_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < INT_MIN || v > INT_MAX || n >= max) return -1;
        out[n++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

/* ---- memory a load may use (issue 13) ---- */

static bool read_u64_file(const char *path, uint64_t *v, bool *is_max) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[64] = {0};
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok) return false;
    *is_max = !strncmp(buf, "max", 3);
    if (*is_max) return true;
    char *end;
    unsigned long long x = strtoull(buf, &end, 10);
    if (end == buf) return false;
    *v = x;
    return true;
}

bool epyq_mem_available(uint64_t *bytes, char *source, size_t n) {
    const char *env = getenv("EPYQ_MEM_AVAILABLE");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (end != env && !*end) {
            *bytes = v;
            snprintf(source, n, "EPYQ_MEM_AVAILABLE");
            return true;
        }
    }
    bool have = false;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                *bytes = (uint64_t)kb * 1024u;
                snprintf(source, n, "MemAvailable in /proc/meminfo");
                have = true;
                break;
            }
        fclose(f);
    }
    /* a cgroup v2 limit (containers, systemd slices) binds before the machine runs out */
    uint64_t lim = 0, cur = 0;
    bool lmax = true, cmax = false;
    if (read_u64_file("/sys/fs/cgroup/memory.max", &lim, &lmax) && !lmax &&
        read_u64_file("/sys/fs/cgroup/memory.current", &cur, &cmax) && !cmax) {
        uint64_t room = lim > cur ? lim - cur : 0;
        if (!have || room < *bytes) {
            *bytes = room;
            snprintf(source, n, "cgroup memory.max - memory.current");
            have = true;
        }
    }
    return have;
}
