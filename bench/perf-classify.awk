# Buckets the samples of `perf script` (recorded with -g) by what the process was doing, and prints
# each bucket's share. Kernel stacks are whole; user stacks end at the sampled function (release
# builds keep no frame pointers), so a system call is told apart by its kernel entry point, and user
# time by the sampled function's name. The first matching rule wins.
BEGIN { RS = "" }
{
  n++
  # The first line names the thread ("tokio-rt-worker ..."): match the frames only.
  s = $0
  sub(/^[^\n]*\n/, "", s)
  if (s ~ /sqlite|pcache1|[Bb]tree|Vdbe|[Pp]ager|walIndex|pread64|pwrite64/) c["SQLite (its code, pread64 and pwrite64)"]++
  else if (s ~ /fsync|fdatasync|file_fsync|ext4_sync_file/) c["fsync and fdatasync (SQLite commits, spool)"]++
  else if (s ~ /do_renameat2|do_unlinkat|do_sys_openat2|path_openat|__x64_sys_close/) c["file open, rename, unlink, close (spool segments and progress file)"]++
  else if (s ~ /ext4_file_write_iter|ext4_buffered_write_iter|generic_perform_write/) c["file writes (spool appends)"]++
  else if (s ~ /ext4_file_read_iter|filemap_read/) c["file reads (spool segments)"]++
  else if (s ~ /tcp_|sock_|inet_|__sys_socket|__sys_connect|__sys_accept|ip_output|net_rx|do_softirq|ip_rcv|__sys_recvfrom|__sys_sendto|do_writev|do_readv|__x64_sys_readv|__x64_sys_writev/) c["sockets (kernel TCP, loopback)"]++
  else if (s ~ /futex|schedule|epoll|finish_task_switch|try_to_wake_up/) c["wake-ups and scheduling (futex, epoll)"]++
  else if (s ~ /page_fault|mprotect|mmap|munmap|clone|madvise|brk/) c["memory and threads (faults, mmap, clone)"]++
  else if (s ~ /serde_json/) c["serde_json (user)"]++
  else if (s ~ /ring_core|sha256|Sha256|GFp_sha/) c["SHA-256 (user)"]++
  else if (s ~ /entry_SYSCALL|do_syscall_64|syscall_exit|irqentry_exit/) c["system call entry and exit, other calls"]++
  else if (s ~ /malloc|free|_int_|memmove|memcpy|memset|memcmp|cfree|realloc|unlink_chunk/) c["allocator, memcpy (libc)"]++
  else if (s ~ /tokio_postgres|postgres_protocol|postgres_types|fallible_iterator/) c["PostgreSQL client: encoding, protocol (user)"]++
  else if (s ~ /hyper|httparse|http::/) c["hyper, httparse, http (user)"]++
  else if (s ~ /tokio/) c["tokio (user)"]++
  else if (s ~ /recovea/) c["other code in the recovea binary (gateway, std, bytes...)"]++
  else c["other"]++
}
END {
  for (k in c) printf "%5.1f%%  %s\n", 100 * c[k] / n, k | "sort -rn"
  close("sort -rn")
  printf "%d samples\n", n
}
