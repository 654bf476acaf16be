#include "file_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

tpr_status tpr_file_read(const char *path, uint8_t **bytes, size_t *len) {
  *bytes = NULL;
  *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  // Read in chunks rather than trusting ftell, so pipes and /proc files work.
  size_t cap = 1 << 16, n = 0, got;
  uint8_t *buf = malloc(cap);
  while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (n + 1 == cap) {
      uint8_t *grown = realloc(buf, cap *= 2);
      if (!grown) free(buf);
      buf = grown;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (!buf) return TPR_FAIL(TPR_ERR_OOM, "reading %s: out of memory after %zu bytes", path, n);
  if (err) {
    free(buf);
    return TPR_FAIL(TPR_ERR_IO, "cannot read %s", path);
  }
  buf[n] = 0;
  *bytes = buf;
  *len = n;
  return TPR_OK;
}

tpr_status tpr_file_write(const char *path, const uint8_t *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return TPR_FAIL(TPR_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  size_t put = fwrite(bytes, 1, len, f);
  if (fclose(f) != 0 || put != len) return TPR_FAIL(TPR_ERR_IO, "cannot write %s", path);
  return TPR_OK;
}

char *tpr_path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

// Creates path (which must not exist) holding bytes, fsynced.
tpr_status tpr_file_create_synced(const char *path, const void *bytes, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return TPR_FAIL(TPR_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  const uint8_t *p = bytes;
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, p + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  int err = done < len || fsync(fd) != 0 ? errno : 0;
  if (close(fd) != 0 && !err) err = errno;
  if (err || done < len) return TPR_FAIL(TPR_ERR_IO, "cannot write %s: %s", path, strerror(err ? err : EIO));
  return TPR_OK;
}

tpr_status tpr_dir_sync(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {  // some file systems cannot fsync a directory
    int err = errno;
    if (fd >= 0) close(fd);
    return TPR_FAIL(TPR_ERR_IO, "cannot sync directory %s: %s", dir, strerror(err));
  }
  close(fd);
  return TPR_OK;
}

// Removes the files of a flat directory (those `only` accepts, if given),
// then the directory if that emptied it. True if the directory is gone.
bool tpr_dir_remove_flat(const char *dir, bool (*only)(const char *name)) {
  DIR *d = opendir(dir);
  if (!d) return false;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (only && !only(e->d_name))) continue;
    char *p = tpr_path_join(dir, e->d_name);
    if (p) unlink(p);
    free(p);
  }
  closedir(d);
  return rmdir(dir) == 0;
}

// Renames tmp to out, moving an existing out away first (force).
tpr_status tpr_dir_publish(const char *tmp, const char *out, bool force, bool (*is_ours)(const char *dir),
                           bool (*our_file)(const char *name), const char *what) {
  struct stat st;
  char *old = NULL;
  if (lstat(out, &st) == 0) {
    if (!force) return TPR_FAIL(TPR_ERR_IO, "%s exists; pass --force to replace it", out);
    size_t n = strlen(out) + 32;
    if (!(old = malloc(n))) return TPR_FAIL(TPR_ERR_OOM, "out of memory");
    snprintf(old, n, "%s.old-%ld", out, (long)getpid());
    if (rename(out, old) != 0) {
      tpr_status rc = TPR_FAIL(TPR_ERR_IO, "cannot move %s to %s: %s", out, old, strerror(errno));
      free(old);
      return rc;
    }
  }
  tpr_status rc = TPR_OK;
  if (rename(tmp, out) != 0) {
    rc = TPR_FAIL(TPR_ERR_IO, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
    if (old) (void)rename(old, out);  // put the old one back
  } else {
    char *parent = strdup(out), *slash = parent ? strrchr(parent, '/') : NULL;
    if (parent && slash) *(slash == parent ? slash + 1 : slash) = 0;
    rc = parent ? tpr_dir_sync(slash ? parent : ".") : TPR_FAIL(TPR_ERR_OOM, "out of memory");
    free(parent);
    if (old && !(is_ours(old) && tpr_dir_remove_flat(old, our_file)))  // ours goes; anything else stays
      TPR_LOG_WRN("%s: kept the previous %s as %s (it holds files that are not ours)", what, out, old);
  }
  free(old);
  return rc;
}

