# cpu-parts.awk: sorts the samples of `perf script` (a `perf record -g`
# of one server process) into the parts of a request's cost, and prints
# each part's share of the samples: "part<TAB>share". Kernel samples go
# by what their stack was doing (a sample in the kernel's network send
# includes the receiver's side of loopback, which runs in the sender's
# system call); user samples by the function they fell in. A Go
# process's parts and a C process's (Redis) share the kernel rows.
BEGIN { RS = "" }
{
  n = split($0, line, "\n")
  stack = ""
  for (i = 2; i <= n; i++) {
    split(line[i], f, " ")
    fn = f[2]
    sub(/\+0x.*/, "", fn)
    stack = stack " " fn " "
  }
  split(line[2], f, " ")
  leaf = f[2]
  sub(/\+0x.*/, "", leaf)
  if (line[2] ~ /kernel\.kallsyms/) part = kernel_part(stack)
  else part = user_part(leaf, line[2])
  count[part]++
  total++
}
END {
  for (p in count) printf "%s\t%.4f\n", p, count[p] / total
}

function kernel_part(s) {
  if (s ~ / (__x64_sys_fdatasync|__x64_sys_fsync|__x64_sys_pwrite64) / || s ~ / ext4_| jbd2_| blk_| virtio/) return "kernel: disk (log write, fdatasync)"
  if (s ~ / (tcp_sendmsg|sock_write_iter) /) return "kernel: network send (with loopback's receive)"
  if (s ~ / (tcp_recvmsg|sock_read_iter) /) return "kernel: network receive"
  if (s ~ / __schedule /) return "kernel: context switches"
  if (s ~ / (do_epoll_wait|ep_poll|__x64_sys_epoll_pwait|__x64_sys_epoll_wait) /) return "kernel: epoll"
  if (s ~ / __x64_sys_futex /) return "kernel: futex"
  if (s ~ / (__x64_sys_nanosleep|__x64_sys_clock_nanosleep) /) return "kernel: sleeps"
  if (s ~ / do_syscall_64 /) return "kernel: system call entry and exit, other"
  return "kernel: interrupts, other"
}

function user_part(fn, raw) {
  if (raw ~ /\[vdso\]/ || fn ~ /^(time\.now|time\.Now|runtime\.nanotime1?|runtime\.walltime)$/) return "user: clock reads"
  if (fn ~ /^(internal\/runtime\/syscall\/linux\.Syscall6|syscall\.RawSyscall6|syscall\.Syscall|syscall\.Syscall6|runtime\.(entersyscall|reentersyscall|exitsyscall|exitsyscallfast))$/ ||
      fn ~ /^(read|write|__GI___libc_write|__GI___libc_read|__libc_read|__libc_write|epoll_wait|fdatasync|__GI___fdatasync)$/)
    return "user: system call wrappers"
  if (fn ~ /^runtime\.(mallocgc|newobject|makeslice|makemap|growslice|memclrNoHeapPointers|gcDrain|gcBgMarkWorker|greyobject|findObject|wbBuf|bulkBarrier|tryDeferToSpanScan|spanOf|heapSetType|deductSweepCredit|gcAssist|markroot|pageIndexOf|sweepone|nextFreeFast|typePointers)/ ||
      fn ~ /^runtime\.[A-Za-z]*[Ss]can/ || fn ~ /^runtime\.\(\*(mspan|mcache|mcentral|mheap|gcWork|spanSet|gcBits|pageAlloc|sweepLocked)\)/ || fn ~ /^gcWriteBarrier/ ||
      fn ~ /^(malloc|free|realloc|calloc|zmalloc|zfree|zrealloc|ztrymalloc|sdsnewlen|sdsfree|je_)/ || raw ~ /jemalloc/)
    return "user: allocation and GC"
  if (fn ~ /^runtime\./ || fn ~ /^internal\/runtime\// || fn ~ /\.abi0$/ || fn ~ /^(gogo|gosave|morestack)/)
    return "user: Go runtime (scheduler, channels, timers)"
  if (fn ~ /valyala\/fasthttp|stockd\/httpapi|stockd\/internal\/coarsedeadline|^bufio\.|^net\.|^internal\/poll\.|strconv/)
    return "user: HTTP (fasthttp, handlers, JSON)"
  if (fn ~ /^stockd\/engine\./) return "user: engine (admission, pending takes, committer)"
  if (fn ~ /^stockd\/raftfsm|^stockd\/internal\/(u64map|hashfilter|wire)/) return "user: ledger (apply, indexes)"
  if (fn ~ /hashicorp/) return "user: raft"
  if (fn ~ /bbolt/) return "user: bbolt"
  if (fn ~ /^(memeqbody|aeshashbody|indexbytebody|cmpbody)$/ || fn ~ /^(sync|internal\/sync)\./) return "user: Go maps, memory, locks"
  if (fn ~ /^stockd\//) return "user: stockd, other"
  if (raw ~ /redis|libc|lua/) return "user: Redis (protocol, Lua, dictionaries)"
  return "user: other"
}
