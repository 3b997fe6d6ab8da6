package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"stockd.dev/stockd/bench/queuebench"
	"stockd.dev/stockd/internal/procstat"
)

// The queue scenario (bench/queuebench): -requests users join a sale of
// -units behind a waiting room that opens -duration after its creation;
// buyers follow their tickets and buy once admitted, -queue-never of them
// never do.

const queueScenario = "queue"

// callerOf lets queuebench send through the harness's clients.
type callerOf struct{ httpClients }

func (c callerOf) Do(worker int, method, path, token string, body []byte) (int, []byte, error) {
	return c.do(worker, method, path, token, body)
}

// runQueues runs the queue scenario against every target cluster and
// adds its results to the report.
func runQueues(ctx context.Context, o *Options, t targets, runID string, report *Report, stdout io.Writer) error {
	if len(t.sets) == 0 {
		return fmt.Errorf("-scenario %s needs -launch or -target", queueScenario)
	}
	cfg := queueConfig(o)
	var results []queuebench.Result
	for j, nodes := range t.sets {
		var pids []int
		if j < len(t.pids) {
			pids = t.pids[j]
		}
		c := cfg
		c.Nodes = len(nodes)
		c.ServerCPU = func() (time.Duration, bool) { return procstat.CPU(pids) }
		c.PeakRSS = func() (int64, bool) { return procstat.PeakResident(pids) }
		if len(pids) == 0 {
			c.ServerCPU, c.PeakRSS = nil, nil
		}
		r, err := queuebench.Run(ctx, c, callerOf{newHTTPClients(nodes, 2*o.Conns, o.TLS)}, lotteryLabel(nodes), runID+"-"+strconv.Itoa(j))
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	queuebench.Write(stdout, &cfg, results)
	report.Queue = append(report.Queue, results...)
	return nil
}

func queueConfig(o *Options) queuebench.Config {
	return queuebench.Config{Users: o.Requests, Units: o.Units, Conns: o.Conns, Lead: o.Duration, Never: o.QueueNever,
		AdmitTTL: o.QueueTTL, Poll: o.QueuePoll, AdminToken: o.AdminToken, ServiceToken: o.ServiceToken}
}
