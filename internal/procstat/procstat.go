// Package procstat reads what processes have used from /proc: the CPU time
// (utime + stime) and the peak resident set. The harnesses measure servers
// by it; CPU a request is the figure that stays steady on a shared machine.
package procstat

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicksPerSecond is the unit of /proc/<pid>/stat's times (USER_HZ,
// 100 on Linux whatever the kernel's tick).
const clockTicksPerSecond = 100

// CPU is the CPU time pids have used together, from /proc; ok is false
// when one cannot be read (not Linux, or the process is gone).
func CPU(pids []int) (d time.Duration, ok bool) {
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, false
		}
		// The command name (field 2) may hold spaces: count fields after
		// its closing parenthesis. utime and stime are fields 14 and 15.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 13 {
			return 0, false
		}
		for _, f := range fields[11:13] {
			ticks, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return 0, false
			}
			d += time.Duration(ticks) * time.Second / clockTicksPerSecond
		}
	}
	return d, true
}

// PeakResident is the largest peak resident set (VmHWM) among pids, from
// /proc; ok is false when one cannot be read.
func PeakResident(pids []int) (bytes int64, ok bool) {
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			return 0, false
		}
		for _, line := range strings.Split(string(b), "\n") {
			if rest, found := strings.CutPrefix(line, "VmHWM:"); found {
				kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					return 0, false
				}
				bytes = max(bytes, kib<<10)
			}
		}
	}
	return bytes, len(pids) > 0
}
