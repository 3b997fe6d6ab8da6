package bench

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU per request is the stable figure on a shared machine: a neighbour's
// load moves requests per second by a fifth between runs, the CPU each
// request costs much less. The client's is this process's (for an HTTP
// strategy, its HTTP client); the server's is the launched processes'
// (stockd nodes, the no-op server), unknown for servers the harness did
// not start.

// serverProcs is a strategy whose server processes the harness started.
type serverProcs interface {
	serverPIDs() []int
}

// clockTicksPerSecond is the unit of /proc/<pid>/stat's times (USER_HZ,
// 100 on Linux whatever the kernel's tick).
const clockTicksPerSecond = 100

// processCPU is the CPU time pids have used, from /proc; ok is false when
// one cannot be read (not Linux, or the process is gone).
func processCPU(pids []int) (d time.Duration, ok bool) {
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

// cpuMeter measures one run's CPU on both sides.
type cpuMeter struct {
	pids           []int
	client         time.Duration
	server         time.Duration
	serverReadable bool
}

func startCPUMeter(st Strategy) *cpuMeter {
	m := &cpuMeter{client: selfCPU()}
	if p, ok := st.(serverProcs); ok {
		m.pids = p.serverPIDs()
		m.server, m.serverReadable = processCPU(m.pids)
	}
	return m
}

// record sets run's CPU per request (µs) from what was used since start.
func (m *cpuMeter) record(run *Run) {
	if run.Sent == 0 {
		return
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(run.Sent) }
	run.ClientCPUus = per(selfCPU() - m.client)
	if m.serverReadable {
		if now, ok := processCPU(m.pids); ok {
			run.ServerCPUus = per(now - m.server)
		}
	}
}

// peakResident is the largest peak resident set (VmHWM) among pids, from
// /proc; ok is false when one cannot be read.
func peakResident(pids []int) (bytes int64, ok bool) {
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
