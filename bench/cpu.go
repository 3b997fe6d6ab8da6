package bench

import (
	"time"

	"stockd.dev/stockd/internal/procstat"
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

// cpuMeter measures one run's CPU on both sides.
type cpuMeter struct {
	pids           []int
	client         time.Duration
	server         time.Duration
	serverReadable bool
}

func startCPUMeter(st Strategy) *cpuMeter {
	m := &cpuMeter{client: procstat.Self()}
	if p, ok := st.(serverProcs); ok {
		m.pids = p.serverPIDs()
		m.server, m.serverReadable = procstat.CPU(m.pids)
	}
	return m
}

// record sets run's CPU per request (µs) from what was used since start.
func (m *cpuMeter) record(run *Run) {
	if run.Sent == 0 {
		return
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(run.Sent) }
	run.ClientCPUus = per(procstat.Self() - m.client)
	if m.serverReadable {
		if now, ok := procstat.CPU(m.pids); ok {
			run.ServerCPUus = per(now - m.server)
		}
	}
}
